//! Retention on SQLite and PostgreSQL: `Durable::prune` (and `fabric runs prune`) deletes only
//! ended runs past the cutoff, with their events, journal and A2A push notification configs, and
//! frees their idempotency keys; queued and awaiting runs stay; the service's sweeper (`FABRIC_RUN_RETENTION`) counts what it
//! deleted in `fabric_runs_pruned_total`; `FABRIC_AWAITING_RETENTION` cancels a run that awaited
//! too long (reason `expired`); a SQLite store under a steady load with retention stops growing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::cancel::CancelHandle;
use fabric::events::NullSink;
use fabric::store::push::PushConfig;
use fabric::store::{IdempotencyKey, Keyed, NewRun, RunFilter, RunStore};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::service::{Server, TOKEN, asking_stub, client, post};
use crate::store::{runtime, start, stores};

/// Makes every run of the store look as if it had been created and last changed in 2000.
async fn age_all(url: &str) {
    crate::store::sql(url, "UPDATE runs SET created_at = '2000-01-01T00:00:00.000Z', updated_at = '2000-01-01T00:00:00.000Z'").await;
}

async fn all_runs(store: &dyn RunStore) -> Vec<fabric::store::StoredRun> {
    store.list_runs(&RunFilter { limit: 1000, ..Default::default() }).await.unwrap()
}

#[tokio::test]
async fn prune_deletes_only_ended_runs_past_the_cutoff_with_their_record_on_every_store() {
    let (stores, _dir) = stores().await;
    let stub = asking_stub();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let rt = runtime(store.clone(), stub.path());
        let (handle, cancel) = CancelHandle::new();
        // Completed (one with an idempotency key), cancelled, awaiting input, queued.
        let done = rt.run_recorded(&start("support-triage", json!({"ticket": "a"})), Arc::new(NullSink), &handle, cancel.clone()).await.unwrap();
        let key = IdempotencyKey::parse("order-1").unwrap();
        let keyed = rt.accept_once(&start("support-triage", json!({"ticket": "b"})), false, &key).await.unwrap();
        let fabric::runtime::Started::New(keyed) = keyed else { panic!("{name}: new") };
        rt.cancel(&keyed.run_id, None, Arc::new(NullSink)).await.unwrap();
        let asking = rt.run_recorded(&start("support-agent", json!({"question": "refund?"})), Arc::new(NullSink), &handle, cancel.clone()).await.unwrap();
        assert_eq!(asking.result.status(), fabric::exec::RunStatus::AwaitingInput, "{name}");
        let queued = rt.accept(&start("support-triage", json!({"ticket": "c"})), false).await.unwrap();
        // An A2A push notification config on an ended run and on the awaiting one.
        let configs = store.push_configs().unwrap();
        for run_id in [&done.result.run_id, &asking.result.run_id] {
            let config = PushConfig {
                run_id: run_id.clone(),
                config_id: "c".into(),
                url: "https://hooks.example.com/a2a".into(),
                token: None,
                auth: None,
                legacy: false,
            };
            configs.put_push_config(&config).await.unwrap();
        }
        // Nothing is old yet.
        assert_eq!(rt.prune(Duration::from_secs(3600), true).await.unwrap(), 0, "{name}");
        assert_eq!(rt.prune(Duration::from_secs(3600), false).await.unwrap(), 0, "{name}");
        age_all(&url).await;
        assert_eq!(rt.prune(Duration::from_secs(3600), true).await.unwrap(), 2, "{name}: the dry run counts the two ended runs");
        assert_eq!(all_runs(store.as_ref()).await.len(), 4, "{name}: a dry run deletes nothing");
        assert_eq!(rt.prune(Duration::from_secs(3600), false).await.unwrap(), 2, "{name}");
        let left: Vec<String> = all_runs(store.as_ref()).await.into_iter().map(|r| r.run_id).collect();
        let mut want = vec![asking.result.run_id.clone(), queued.run_id.clone()];
        want.sort();
        let mut got = left.clone();
        got.sort();
        assert_eq!(got, want, "{name}: the awaiting and the queued run stay");
        for gone in [&done.result.run_id, &keyed.run_id] {
            assert!(store.get_run(gone).await.unwrap().is_none(), "{name}");
            assert!(store.events_after(gone, 0).await.unwrap().is_empty(), "{name}: its events went with it");
            assert!(store.journal(gone).await.unwrap().is_empty(), "{name}: its journal went with it");
            assert!(configs.list_push_configs(gone).await.unwrap().is_empty(), "{name}: its push configs went with it");
        }
        assert_eq!(configs.list_push_configs(&asking.result.run_id).await.unwrap().len(), 1, "{name}: the awaiting run keeps its config");
        assert!(!store.events_after(&asking.result.run_id, 0).await.unwrap().is_empty(), "{name}: the awaiting run keeps its events");
        // The key went with its run: it starts a new one.
        let again = store.create_keyed_run(NewRun::new(&fabric::exec::new_run_id(), &start("support-triage", json!({}))), None, &key).await.unwrap();
        assert!(matches!(again, Keyed::Created(_)), "{name}: {again:?}");
        assert_eq!(rt.prune(Duration::from_secs(3600), false).await.unwrap(), 0, "{name}: nothing more");
    }
}

#[test]
fn fabric_runs_prune_counts_and_deletes_what_a_dry_run_said() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let fabric = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
            .current_dir(crate::support::repo())
            .envs(crate::support::fixture_env())
            .env("FABRIC_LLM_STUB", "1")
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    for k in 0..3 {
        let (code, _, err) = fabric(&["run", "support-triage", "--goal", &format!("{{\"ticket\":\"{k}\"}}"), "--store", &db]);
        assert_eq!(code, Some(0), "{err}");
    }
    tokio.block_on(age_all(&db));
    assert_eq!(fabric(&["runs", "prune", "--older-than", "30d", "--dry-run", "--store", &db]).1, "would prune 3 runs\n");
    assert_eq!(fabric(&["runs", "prune", "--older-than", "30d", "--store", &db]).1, "pruned 3 runs\n");
    assert_eq!(fabric(&["runs", "prune", "--older-than", "30d", "--store", &db]).1, "pruned 0 runs\n");
    let (code, _, err) = fabric(&["runs", "prune", "--older-than", "soon", "--store", &db]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--older-than: `soon` is not a duration"), "{err}");
}

async fn pruned_total(s: &Server) -> u64 {
    let text = client().get(format!("{}/metrics", s.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix("fabric_runs_pruned_total ")).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn the_sweeper_deletes_ended_runs_and_expires_awaiting_ones_on_sqlite() {
    sweeper("sqlite").await;
}

#[tokio::test]
async fn the_sweeper_deletes_ended_runs_and_expires_awaiting_ones_on_postgres() {
    sweeper("postgres").await;
}

async fn sweeper(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = crate::durable::store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let a = Server::start(&db, stub.path(), &[("FABRIC_RUN_RETENTION", "2s"), ("FABRIC_LOG", "warn")]);
    let (_, asking) = post(&a, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!(asking["status"], "awaiting_input", "{kind}: {asking}");
    let asking = asking["run_id"].as_str().unwrap().to_owned();
    for k in 0..5 {
        let (_, done) = post(&a, "/v1/runs?wait=true", crate::durable::triage(k)).await;
        assert_eq!(done["status"], "completed", "{kind}: {done}");
    }
    // Two seconds after their end, the next sweep (every second) deletes them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pruned_total(&a).await < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(pruned_total(&a).await, 5, "{kind}");
    let store = fabric::store::open(&db).await.unwrap();
    let left: Vec<String> = all_runs(store.as_ref()).await.into_iter().map(|r| r.run_id).collect();
    assert_eq!(left, std::slice::from_ref(&asking), "{kind}: the awaiting run is never swept");
    drop(a);

    // Awaiting past FABRIC_AWAITING_RETENTION: cancelled, reason `expired`; then kept for the
    // (longer) run retention.
    let b = Server::start(&db, stub.path(), &[("FABRIC_AWAITING_RETENTION", "1s"), ("FABRIC_RUN_RETENTION", "1h"), ("FABRIC_LOG", "warn")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let view = loop {
        let v: Value = client().get(format!("{}/v1/runs/{asking}", b.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
        // `running` for the moment the expiry holds it to end it.
        if !matches!(v["status"].as_str(), Some("awaiting_input" | "running")) || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((view["status"].as_str(), view["error"]["message"].as_str()), (Some("cancelled"), Some("expired")), "{kind}: {view}");
    assert_eq!(pruned_total(&b).await, 0, "{kind}");
    let (status, refused) = post(&b, &format!("/v1/runs/{asking}/reply"), json!({"message": "order 42"})).await;
    assert_eq!(status, 409, "{kind}: {refused}");
}

/// A file that keeps growing under retention would fill the disk anyway: after the first rounds
/// (the free pages of the rounds deleted are reused), 20,000 runs later the file is no bigger.
#[tokio::test]
async fn a_sqlite_store_under_steady_load_with_retention_stops_growing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fabric.db");
    let url = format!("sqlite://{}", path.display());
    let store = fabric::store::open(&url).await.unwrap();
    let stub = asking_stub();
    let rt = Arc::new(runtime(store.clone(), stub.path()));
    let size = || {
        let wal = std::fs::metadata(dir.path().join("fabric.db-wal")).map_or(0, |m| m.len());
        std::fs::metadata(&path).unwrap().len() + wal
    };
    let mut sizes = Vec::new();
    for round in 0..8 {
        let runs = (0..2500).map(|k| {
            let rt = rt.clone();
            async move {
                let accepted = rt.accept(&start("support-triage", json!({"ticket": format!("ticket {round} {k}")})), true).await.unwrap();
                let req = start("support-triage", json!({"ticket": format!("ticket {round} {k}")}));
                rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(NullSink), fabric::cancel::Cancel::never()).await.unwrap();
            }
        });
        futures_util::stream::iter(runs).buffer_unordered(64).collect::<Vec<()>>().await;
        age_all(&url).await;
        assert_eq!(rt.prune(Duration::from_secs(3600), false).await.unwrap(), 2500, "round {round}");
        sizes.push(size());
    }
    eprintln!("store size after each round of 2,500 runs, pruned: {sizes:?}");
    assert!(sizes[7] <= sizes[1] + sizes[1] / 10, "the file grew under retention: {sizes:?}");
}

/// A run whose webhook delivery is still being retried is kept past `FABRIC_RUN_RETENTION`
/// until the delivery ends (issue 46: a retention of 3 s dropped a pending delivery after 2 of
/// its 8 attempts, and no log said so); then it goes.
#[tokio::test]
async fn a_run_with_a_pending_webhook_stays_until_its_delivery_ends() {
    let attempts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = attempts.clone();
    let receiver = crate::support::serve(axum::Router::new().fallback(move || {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let hook = format!("{receiver}/hook");
    let env = [
        ("FABRIC_RUN_RETENTION", "2s"),
        ("FABRIC_WEBHOOK_URL", hook.as_str()),
        ("FABRIC_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ("FABRIC_WEBHOOK_MAX_ATTEMPTS", "6"),
        ("FABRIC_WEBHOOK_BACKOFF_BASE_S", "1"),
        ("FABRIC_WEBHOOK_BACKOFF_MAX_S", "2"),
        ("FABRIC_LOG", "warn"),
    ];
    let server = Server::start(&db, stub.path(), &env);
    let (status, run) = post(&server, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "x"}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let view = |id: String| {
        let url = format!("{}/v1/runs/{id}", server.url);
        async move { client().get(url).bearer_auth(TOKEN).send().await.unwrap().status().as_u16() }
    };
    let started = Instant::now();
    // Past the retention, while attempts go on: the run and its delivery are kept.
    while attempts.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        assert!(started.elapsed() < Duration::from_secs(30), "attempts: {attempts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() > Duration::from_secs(2));
    assert_eq!(view(id.clone()).await, 200, "kept while its delivery is pending\n{}", server.logs());
    // Every attempt made and recorded, then the run goes with the next sweep.
    loop {
        if view(id.clone()).await == 404 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never pruned\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 6, "all six attempts were made before the run went");
    assert!(!server.logs().contains("deleted meanwhile"), "{}", server.logs());
}
