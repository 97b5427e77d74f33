//! One conformance suite for every run store: SQLite (a file) and PostgreSQL (a real server,
//! `FABRIC_TEST_POSTGRES_URL`, which `.ci/postgres start` provides). Without that variable the
//! PostgreSQL half says it skips, except in CI (`CI=true`), where a missing server fails.

use std::sync::Arc;
use std::time::Duration;

use fabric::cancel::Cancel;
use fabric::events::NullSink;
use fabric::runtime::{Runtime, StartRequest};
use fabric::store::{RunFilter, RunStore, StoreError, StoredStatus};
use serde_json::{Value, json};

use crate::support::repo;

/// A new, empty PostgreSQL database on the test server, or `None` (and why) when there is none.
pub(crate) async fn fresh_postgres() -> Option<String> {
    let Ok(base) = std::env::var("FABRIC_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but FABRIC_TEST_POSTGRES_URL is unset: .ci/run starts a PostgreSQL server for these tests"
        );
        eprintln!("skipping the PostgreSQL store tests: FABRIC_TEST_POSTGRES_URL is unset (`eval \"$(.ci/postgres start)\"` sets it)");
        return None;
    };
    let name = format!("fabric_t_{}", uuid_like());
    let admin = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&base).await.expect("the test PostgreSQL server answers");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
    admin.close().await;
    let (head, _) = base.rsplit_once('/').unwrap();
    Some(format!("{head}/{name}"))
}

fn uuid_like() -> String {
    fabric::exec::new_run_id().replace('-', "")
}

/// Every store to test: (name, URL), and what keeps the SQLite file alive.
async fn stores() -> (Vec<(&'static str, String)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut out = vec![("sqlite", format!("sqlite://{}", dir.path().join("fabric.db").display()))];
    if let Some(url) = fresh_postgres().await {
        out.push(("postgres", url));
    }
    (out, dir)
}

fn runtime(store: Arc<dyn RunStore>, stub: &std::path::Path) -> Runtime {
    let settings = fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    Runtime::builder()
        .settings(settings)
        .catalogue_dirs(repo().join("routes"), repo().join("prompt-packs"))
        .stub_dir(stub)
        .tool("add", fabric::tools::builtin_add())
        .store(store)
        .build()
        .unwrap()
}

fn start(route: &str, goal: Value) -> StartRequest {
    serde_json::from_value(json!({"route_id": route, "goal": goal, "model_profile": "default"})).unwrap()
}

#[tokio::test]
async fn a_run_its_events_journal_and_reply_claim_read_back_the_same_from_every_store() {
    let (stores, _dir) = stores().await;
    let stub = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("stub/support-triage.yaml"), stub.path().join("support-triage.yaml")).unwrap();
    std::fs::copy(repo().join("examples/stub-asking/support-agent.yaml"), stub.path().join("support-agent.yaml")).unwrap();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let rt = runtime(store.clone(), stub.path());
        // A staged run: the row, every event in order, the journal, the list, a clean replay.
        let req = start("support-triage", json!({"ticket": "charged twice"}));
        let id = rt.accept(&req).await.unwrap();
        assert_eq!(store.get_run(&id).await.unwrap().unwrap().status, StoredStatus::Running, "{name}");
        let out = rt.execute(id.clone(), &req, Arc::new(NullSink), Cancel::never()).await.unwrap();
        let run = store.get_run(&id).await.unwrap().unwrap();
        assert_eq!((run.status, run.route_id.as_str()), (StoredStatus::Completed, "support-triage"), "{name}");
        assert_eq!(run.result.as_ref().unwrap()["output"], serde_json::to_value(&out.result).unwrap()["output"], "{name}");
        let events = store.events_after(&id, 0).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "{name}: no gap, no duplicate");
        assert_eq!((events[0].kind.as_str(), events.last().unwrap().kind.as_str()), ("run.started", "run.completed"), "{name}");
        assert_eq!(run.next_seq, events.len() as u64 + 1, "{name}");
        assert_eq!(store.events_after(&id, 3).await.unwrap().first().map(|e| e.seq), Some(4), "{name}");
        assert!(!store.journal(&id).await.unwrap().is_empty(), "{name}");
        let report = rt.replay(&id).await.unwrap();
        assert!(report.divergences.is_empty(), "{name}: {:?}", report.divergences);
        // A run that asks: one claim wins, a second loses, a reopened one can be claimed again.
        let req = start("support-agent", json!({"question": "refund?"}));
        let asking = rt.accept(&req).await.unwrap();
        rt.execute(asking.clone(), &req, Arc::new(NullSink), Cancel::never()).await.unwrap();
        let run = store.get_run(&asking).await.unwrap().unwrap();
        assert_eq!((run.status, run.question.as_deref()), (StoredStatus::AwaitingInput, Some("Which order number?")), "{name}");
        assert!(store.claim_reply(&asking).await.unwrap(), "{name}");
        assert!(!store.claim_reply(&asking).await.unwrap(), "{name}: a second reply cannot claim it");
        store.reopen_reply(&asking).await.unwrap();
        let claimed = rt.claim_reply(&asking, "order 42".into()).await.unwrap();
        let done = rt.continue_run(claimed, Arc::new(NullSink), Cancel::never()).await.unwrap();
        assert_eq!(serde_json::to_value(&done.result).unwrap()["output"], "Order 42 is refunded.", "{name}");
        let events = store.events_after(&asking, 0).await.unwrap();
        assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{name}: the resumed run's events go on without a gap");
        // Listing: newest first, filtered, paged.
        let all = store.list_runs(&RunFilter { limit: 10, ..RunFilter::default() }).await.unwrap();
        assert_eq!(all.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), [asking.as_str(), id.as_str()], "{name}");
        let triage = RunFilter { route_id: Some("support-triage".into()), status: Some(StoredStatus::Completed), limit: 10, before: None };
        assert_eq!(store.list_runs(&triage).await.unwrap().len(), 1, "{name}");
        let page = store.list_runs(&RunFilter { before: Some(asking.clone()), limit: 10, ..RunFilter::default() }).await.unwrap();
        assert_eq!(page.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), [id.as_str()], "{name}");
        assert!(store.get_run("no-such-run").await.unwrap().is_none(), "{name}");
        store.ping().await.unwrap();
    }
}

#[tokio::test]
async fn only_runs_nobody_heartbeats_are_failed_as_orphans_on_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        for id in ["orphan", "alive"] {
            store.create_run(id, "support-triage", &json!({"route_id": "support-triage", "goal": {}})).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        store.heartbeat(&["alive".to_owned()]).await.unwrap();
        assert_eq!(store.fail_orphans(Duration::from_secs(1)).await.unwrap(), 1, "{name}");
        let orphan = store.get_run("orphan").await.unwrap().unwrap();
        assert_eq!((orphan.status, orphan.reason_class.as_deref()), (StoredStatus::Failed, Some("interrupted")), "{name}");
        assert_eq!(orphan.result.unwrap()["status"], "failed", "{name}");
        let events = store.events_after("orphan", 0).await.unwrap();
        assert_eq!(events.iter().map(|e| (e.seq, e.kind.as_str())).collect::<Vec<_>>(), [(1, "run.failed")], "{name}");
        assert_eq!(store.get_run("alive").await.unwrap().unwrap().status, StoredStatus::Running, "{name}");
        assert_eq!(store.fail_orphans(Duration::from_secs(1)).await.unwrap(), 0, "{name}: a failed run is not failed twice");
    }
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_runtime_is_refused_by_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        drop(fabric::store::open(&url).await.unwrap());
        let bump = "INSERT INTO fabric_schema (version, applied_at) VALUES (999, 'later')";
        if name == "sqlite" {
            let pool = sqlx::sqlite::SqlitePoolOptions::new().connect(&url).await.unwrap();
            sqlx::query(bump).execute(&pool).await.unwrap();
            pool.close().await;
        } else {
            let pool = sqlx::postgres::PgPoolOptions::new().connect(&url).await.unwrap();
            sqlx::query(bump).execute(&pool).await.unwrap();
            pool.close().await;
        }
        let err = fabric::store::open(&url).await.unwrap_err();
        assert!(matches!(err, StoreError::TooNew { found: 999, known: 1 }), "{name}: {err}");
    }
}

#[tokio::test]
async fn replicas_opening_one_new_postgres_database_together_migrate_it_once() {
    let Some(url) = fresh_postgres().await else { return };
    let opens = (0..4).map(|_| fabric::store::open(&url));
    for store in futures_util::future::join_all(opens).await {
        store.unwrap();
    }
    let pool = sqlx::postgres::PgPoolOptions::new().connect(&url).await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM fabric_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [1]);
}

#[test]
fn the_cli_records_lists_shows_and_replays_a_run_on_every_store() {
    let urls = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(stores());
    for (name, url) in urls.0 {
        let fabric = |args: &[&str]| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
                .current_dir(repo())
                .args(args)
                .env("FABRIC_LLM_STUB", "1")
                .env("FABRIC_DATABASE_URL", &url)
                .output()
                .unwrap();
            assert!(out.status.success(), "{name}: fabric {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let result: Value = serde_json::from_str(&fabric(&["run", "--store", &url, "ticket-router", "--goal", r#"{"ticket":"invoice wrong"}"#])).unwrap();
        let id = result["run_id"].as_str().unwrap();
        assert!(fabric(&["runs", "list"]).contains(id), "{name}");
        let shown: Value = serde_json::from_str(&fabric(&["runs", "show", id])).unwrap();
        assert_eq!(shown["output"], result["output"], "{name}");
        fabric(&["replay", id]);
    }
}

#[tokio::test]
async fn an_unreachable_postgres_is_named_without_its_password() {
    let err = fabric::store::open("postgres://fabric:s3cret-pw@127.0.0.1:1/fabric?sslpassword=k3y").await.unwrap_err().to_string();
    assert!(err.contains("cannot connect to postgres://") && err.contains("127.0.0.1:1/fabric"), "{err}");
    assert!(!err.contains("s3cret-pw") && !err.contains("k3y"), "{err}");
}

/// A process that stalled past the lease writes on as if nothing happened: its run stays failed,
/// and the runs that share its transaction are not harmed.
#[tokio::test]
async fn a_stalled_process_late_writes_neither_revive_its_run_nor_fail_others_on_every_store() {
    use fabric::exec::{JournalBatch, RunStatus};
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        for id in ["stalled", "healthy"] {
            store.create_run(id, "support-triage", &json!({"route_id": "support-triage", "goal": {}})).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        store.heartbeat(&["healthy".to_owned()]).await.unwrap();
        assert_eq!(store.fail_orphans(Duration::from_secs(1)).await.unwrap(), 1, "{name}");
        let event = |run: &str, seq: u64, kind| fabric::events::Event {
            kind,
            run_id: run.into(),
            route_id: "support-triage".into(),
            seq,
            ts: "2026-01-01T00:00:00.000Z".into(),
            stage_id: None,
            parent_run_id: None,
            data: Default::default(),
        };
        let end = |run: &str| {
            let mut r = fabric::exec::result_from_journal(run, "support-triage", &[], fabric::failure::ReasonClass::Interrupted, "x");
            r.status = RunStatus::Completed;
            r.error = None;
            r.output = Some("done".into());
            r
        };
        // The stalled process's next stage and end, queued together with the healthy run's end.
        let stalled = JournalBatch { events: vec![event("stalled", 1, fabric::events::EventKind::RunStarted)], entries: vec![], end: None };
        let stalled_end =
            JournalBatch { events: vec![event("stalled", 2, fabric::events::EventKind::RunCompleted)], entries: vec![], end: Some(end("stalled")) };
        let healthy = JournalBatch { events: vec![event("healthy", 1, fabric::events::EventKind::RunCompleted)], entries: vec![], end: Some(end("healthy")) };
        store.append("stalled", stalled).await.unwrap();
        let (a, b) = tokio::join!(store.commit("healthy", healthy), store.commit("stalled", stalled_end));
        a.unwrap_or_else(|e| panic!("{name}: the healthy run's commit failed: {e}"));
        let _ = b;
        assert_eq!(store.get_run("healthy").await.unwrap().unwrap().status, StoredStatus::Completed, "{name}");
        let stalled = store.get_run("stalled").await.unwrap().unwrap();
        assert_eq!((stalled.status, stalled.reason_class.as_deref()), (StoredStatus::Failed, Some("interrupted")), "{name}: not revived");
        let kinds: Vec<String> = store.events_after("stalled", 0).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds[0], "run.failed", "{name}: the failure keeps its place: {kinds:?}");
    }
}
