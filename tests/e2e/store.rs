//! One conformance suite for every run store: SQLite (a file) and PostgreSQL (a real server,
//! `FABRIC_TEST_POSTGRES_URL`, which `.ci/postgres start` provides). Without that variable the
//! PostgreSQL half skips (`support::skip_unless`: said, and listed by `.ci/test`), except in CI
//! (`CI=true`), where a missing server fails.

use std::sync::Arc;
use std::time::Duration;

use fabric::cancel::Cancel;
use fabric::events::NullSink;
use fabric::runtime::{Runtime, StartRequest};
use fabric::store::{Holder, NewRun, RunFilter, RunStore, StoreError, StoredStatus};
use serde_json::{Value, json};

use crate::support::{fixture_env, packs_dir, repo, routes_dir, skip_unless, stub_dir};

/// A new, empty PostgreSQL database on the test server, or `None` (and why) when there is none.
pub(crate) async fn fresh_postgres() -> Option<String> {
    let base = std::env::var("FABRIC_TEST_POSTGRES_URL").ok().filter(|u| !u.trim().is_empty());
    let why = "FABRIC_TEST_POSTGRES_URL is unset (`eval \"$(.ci/postgres start)\"` sets it; .ci/run does)";
    let Some(base) = base else {
        skip_unless(false, "PostgreSQL", why);
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
pub(crate) async fn stores() -> (Vec<(&'static str, String)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut out = vec![("sqlite", format!("sqlite://{}", dir.path().join("fabric.db").display()))];
    if let Some(url) = fresh_postgres().await {
        out.push(("postgres", url));
    }
    (out, dir)
}

pub(crate) fn runtime(store: Arc<dyn RunStore>, stub: &std::path::Path) -> fabric::runtime::Durable {
    let settings = fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    fabric::runtime::Durable::new(
        Runtime::builder()
            .settings(settings)
            .catalogue_dirs(routes_dir(), packs_dir())
            .stub_dir(stub)
            .tool("add", fabric::tools::builtin_add())
            .build()
            .unwrap(),
        store,
    )
}

pub(crate) fn start(route: &str, goal: Value) -> StartRequest {
    serde_json::from_value(json!({"route_id": route, "goal": goal, "model_profile": "default"})).unwrap()
}

#[tokio::test]
async fn a_run_its_events_journal_and_reply_claim_read_back_the_same_from_every_store() {
    let (stores, _dir) = stores().await;
    let stub = tempfile::tempdir().unwrap();
    std::fs::copy(stub_dir().join("support-triage.yaml"), stub.path().join("support-triage.yaml")).unwrap();
    std::fs::copy(repo().join("examples/stub-asking/support-agent.yaml"), stub.path().join("support-agent.yaml")).unwrap();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let rt = runtime(store.clone(), stub.path());
        // A staged run: the row, every event in order, the journal, the list, a clean replay.
        let req = start("support-triage", json!({"ticket": "charged twice"}));
        let accepted = rt.accept(&req, true).await.unwrap();
        let (id, lease) = (accepted.run_id.clone(), accepted.lease.unwrap());
        assert_eq!(lease.token(), 1, "{name}");
        assert_eq!(store.get_run(&id).await.unwrap().unwrap().status, StoredStatus::Running, "{name}");
        let out = rt.execute(&lease, &req, &accepted.edition, Arc::new(NullSink), Cancel::never()).await.unwrap();
        let run = store.get_run(&id).await.unwrap().unwrap();
        assert_eq!((run.status, run.route_id.as_str()), (StoredStatus::Completed, "support-triage"), "{name}");
        assert_eq!(run.result.as_ref().unwrap().output(), out.result.output(), "{name}");
        let events = store.events_after(&id, 0).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "{name}: no gap, no duplicate");
        assert_eq!((events[0].kind.as_str(), events.last().unwrap().kind.as_str()), ("run.started", "run.completed"), "{name}");
        assert_eq!(run.next_seq, events.len() as u64 + 1, "{name}");
        assert_eq!(store.events_after(&id, 3).await.unwrap().first().map(|e| e.seq), Some(4), "{name}");
        assert!(!store.journal(&id).await.unwrap().is_empty(), "{name}");
        let report = rt.replay(&id, fabric::runtime::ReplayOn::Recorded).await.unwrap();
        assert!(report.divergences.is_empty(), "{name}: {:?}", report.divergences);
        // A run that asks: one claim wins, a second loses, a reopened one can be claimed again.
        let req = start("support-agent", json!({"question": "refund?"}));
        let accepted = rt.accept(&req, true).await.unwrap();
        let asking = accepted.run_id.clone();
        rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(NullSink), Cancel::never()).await.unwrap();
        let run = store.get_run(&asking).await.unwrap().unwrap();
        assert_eq!((run.status, run.question.as_deref()), (StoredStatus::AwaitingInput, Some("Which order number?")), "{name}");
        let holder = Holder::new(Duration::from_secs(30));
        let reply_lease = store.claim_reply(&asking, &holder).await.unwrap().unwrap_or_else(|| panic!("{name}: the first reply claims it"));
        assert_eq!(reply_lease.token(), 2, "{name}: a claim bumps the token");
        assert!(store.claim_reply(&asking, &holder).await.unwrap().is_none(), "{name}: a second reply cannot claim it");
        store.reopen_reply(&reply_lease).await.unwrap();
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

fn request() -> StartRequest {
    start("support-triage", json!({}))
}

/// Queued runs and runs whose lease expired are claimable; a live lease is not; a claim bumps
/// the token; the holder that lost a run learns it from its renewal.
#[tokio::test]
async fn claims_take_queued_and_expired_runs_and_leave_live_leases_on_every_store() {
    let (stores, _dir) = stores().await;
    let routes = ["support-triage".to_owned()];
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let a = Holder::new(Duration::from_millis(600));
        let b = Holder::new(Duration::from_secs(30));
        assert!(store.create_run(NewRun::new("q1", &request()), None).await.unwrap().is_none(), "{name}");
        store.create_run(NewRun::new("other-route", &start("support-agent", json!({}))), None).await.unwrap();
        let dying = store.create_run(NewRun::new("dying", &request()), Some(&a)).await.unwrap().unwrap();
        let alive = store.create_run(NewRun::new("alive", &request()), Some(&a)).await.unwrap().unwrap();
        assert_eq!(store.queued().await.unwrap(), 2, "{name}");
        // Only the queued run of a route this claimer serves: the leases are live.
        let first = store.claim_runs(&b, &routes, 10).await.unwrap();
        assert_eq!(first.iter().map(|c| (c.lease.run_id(), c.lease.token())).collect::<Vec<_>>(), [("q1", 1)], "{name}");
        assert_eq!(first[0].run.as_ref().unwrap().status, StoredStatus::Running, "{name}");
        // Past the lease: `alive` is renewed by its holder, `dying` is not.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(store.renew(&a, std::slice::from_ref(&alive)).await.unwrap().is_empty(), "{name}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let second = store.claim_runs(&b, &routes, 10).await.unwrap();
        assert_eq!(second.iter().map(|c| (c.lease.run_id(), c.lease.token())).collect::<Vec<_>>(), [("dying", 2)], "{name}");
        assert!(store.claim_runs(&b, &routes, 10).await.unwrap().is_empty(), "{name}: nothing claimed twice");
        // The old holder's renewal says it lost `dying`; `alive` is still its own.
        let lost = store.renew(&a, &[dying.clone(), alive.clone()]).await.unwrap();
        assert_eq!(lost, ["dying"], "{name}");
        // A lease let go is claimable at once, and its holder's token is spent.
        store.release(&second[0].lease).await.unwrap();
        let third = store.claim_runs(&a, &routes, 10).await.unwrap();
        assert_eq!(third.iter().map(|c| (c.lease.run_id(), c.lease.token())).collect::<Vec<_>>(), [("dying", 4)], "{name}");
        assert_eq!(store.queued().await.unwrap(), 1, "{name}: the other route's run still waits");
        assert!(store.claim_runs(&b, &[], 10).await.unwrap().is_empty(), "{name}: no route, no claim");
        assert!(store.claim_runs(&b, &["support-agent".to_owned()], 0).await.unwrap().is_empty(), "{name}: no room, no claim");
        // A run that ended is not renewed, and not lost either: its holder simply let it go.
        let end = {
            let mut r = fabric::exec::result_from_journal("alive", "support-triage", &[], fabric::failure::ReasonClass::Interrupted, "x");
            r.end = fabric::exec::RunEnd::Completed { output: None };
            r
        };
        store.commit(&alive, fabric::exec::JournalBatch { end: Some(end), ..Default::default() }).await.unwrap();
        assert!(store.renew(&a, std::slice::from_ref(&alive)).await.unwrap().is_empty(), "{name}");
    }
}

/// Claimers racing over one database (each with its own pool, as replicas have) never get the
/// same run, and together get every run.
#[tokio::test]
async fn concurrent_claimers_share_the_queued_runs_without_overlap_on_every_store() {
    let (stores, _dir) = stores().await;
    let routes = Arc::new(vec!["support-triage".to_owned()]);
    for (name, url) in stores {
        let setup = fabric::store::open(&url).await.unwrap();
        let ids: Vec<String> = (0..200).map(|k| format!("run-{k:03}")).collect();
        for id in &ids {
            setup.create_run(NewRun::new(id, &request()), None).await.unwrap();
        }
        let mut claimers = Vec::new();
        for _ in 0..4 {
            let (url, routes) = (url.clone(), routes.clone());
            claimers.push(tokio::spawn(async move {
                let store = fabric::store::open(&url).await.unwrap();
                let holder = Holder::new(Duration::from_secs(30));
                let mut mine = Vec::new();
                loop {
                    let got = store.claim_runs(&holder, &routes, 7).await.unwrap();
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.lease.run_id().to_owned()));
                }
            }));
        }
        let mut all: Vec<String> = Vec::new();
        for c in claimers {
            all.extend(c.await.unwrap());
        }
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!((total, all), (200, ids), "{name}: every run claimed exactly once");
    }
}

/// A holder that lost its lease (it stalled past it and another process took the run over)
/// cannot write again: its batches are refused whole, the new holder's are written, and a run
/// sharing the stalled writer's transaction is not harmed.
#[tokio::test]
async fn a_fenced_holder_writes_nothing_and_harms_no_other_run_on_every_store() {
    use fabric::exec::{JournalBatch, JournalEntry};
    let (stores, _dir) = stores().await;
    let routes = ["support-triage".to_owned()];
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let stalled_holder = Holder::new(Duration::from_millis(300));
        let stalled = store.create_run(NewRun::new("stalled", &request()), Some(&stalled_holder)).await.unwrap().unwrap();
        let healthy = store.create_run(NewRun::new("healthy", &request()), Some(&Holder::new(Duration::from_secs(30)))).await.unwrap().unwrap();
        let event = |run: &str, seq: u64, kind| fabric::events::Event {
            kind,
            run_id: run.into(),
            route_id: "support-triage".into(),
            seq,
            ts: "2026-01-01T00:00:00.000Z".into(),
            stage_id: None,
            parent_run_id: None,
            data: crate::support::bare_data(kind),
        };
        let entry = |v: &str| JournalEntry::StageCompleted { stage_id: "intake".into(), value: v.into(), note: None };
        let end = |run: &str| {
            let mut r = fabric::exec::result_from_journal(run, "support-triage", &[], fabric::failure::ReasonClass::Interrupted, "x");
            r.end = fabric::exec::RunEnd::Completed { output: Some("done".into()) };
            r
        };
        let first = JournalBatch { events: vec![event("stalled", 1, fabric::events::EventKind::RunStarted)], entries: vec![entry("first")], end: None };
        store.commit(&stalled, first).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let taker = Holder::new(Duration::from_secs(30));
        let taken = store.claim_runs(&taker, &routes, 10).await.unwrap();
        assert_eq!(taken.iter().map(|c| c.lease.run_id()).collect::<Vec<_>>(), ["stalled"], "{name}");
        let new_lease = taken[0].lease.clone();
        assert_eq!(store.next_seq("stalled").await.unwrap(), 2, "{name}");
        // The stalled holder wakes up and writes its next stage and its end, in one transaction
        // with the healthy run's end.
        let late = JournalBatch { events: vec![event("stalled", 2, fabric::events::EventKind::StageCompleted)], entries: vec![entry("late")], end: None };
        let late_end = JournalBatch { events: vec![event("stalled", 3, fabric::events::EventKind::RunCompleted)], entries: vec![], end: Some(end("stalled")) };
        let healthy_end =
            JournalBatch { events: vec![event("healthy", 1, fabric::events::EventKind::RunCompleted)], entries: vec![], end: Some(end("healthy")) };
        store.append(&stalled, late).await.unwrap();
        let (a, b) = tokio::join!(store.commit(&healthy, healthy_end), store.commit(&stalled, late_end));
        a.unwrap_or_else(|e| panic!("{name}: the healthy run's commit failed: {e}"));
        let refused = b.expect_err("the fenced holder's commit is refused");
        assert_eq!(refused, StoreError::LeaseLost("stalled".into()), "{name}");
        assert_eq!(store.get_run("healthy").await.unwrap().unwrap().status, StoredStatus::Completed, "{name}");
        let run = store.get_run("stalled").await.unwrap().unwrap();
        assert_eq!((run.status, run.lease_token), (StoredStatus::Running, 2), "{name}: not ended by the fenced holder");
        assert_eq!(store.events_after("stalled", 0).await.unwrap().len(), 1, "{name}: no late event");
        assert_eq!(store.journal("stalled").await.unwrap(), [entry("first")], "{name}: no late journal entry");
        // The new holder writes on where the journal ends.
        let resumed = JournalBatch {
            events: vec![event("stalled", 2, fabric::events::EventKind::RunCompleted)],
            entries: vec![entry("resumed")],
            end: Some(end("stalled")),
        };
        store.commit(&new_lease, resumed).await.unwrap();
        let run = store.get_run("stalled").await.unwrap().unwrap();
        assert_eq!((run.status, run.next_seq), (StoredStatus::Completed, 3), "{name}");
        assert_eq!(store.journal("stalled").await.unwrap(), [entry("first"), entry("resumed")], "{name}");
    }
}

/// A write with a lost lease is `StoreError::LeaseLost`, a type and not a message: at the commit
/// that finds it, at every write of that lease after it (the queued failure is kept as it was),
/// and through the executor's port as `JournalError::LeaseLost`, in the store's words.
#[tokio::test]
async fn a_write_with_a_lost_lease_is_lease_lost_on_every_store() {
    use fabric::exec::{JournalBatch, JournalError, RunJournal};
    let (stores, _dir) = stores().await;
    let routes = ["support-triage".to_owned()];
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let old = store.create_run(NewRun::new("lost", &request()), Some(&Holder::new(Duration::from_millis(300)))).await.unwrap().unwrap();
        store.commit(&old, JournalBatch::default()).await.unwrap();
        // Its holder stalls past the lease; another process takes the run over.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let taken = store.claim_runs(&Holder::new(Duration::from_secs(30)), &routes, 10).await.unwrap();
        assert_eq!(taken.len(), 1, "{name}");
        let lost = StoreError::LeaseLost("lost".into());
        assert_eq!(store.commit(&old, JournalBatch::default()).await, Err(lost.clone()), "{name}: the commit that finds it");
        assert_eq!(store.append(&old, JournalBatch::default()).await, Err(lost.clone()), "{name}: an append after it");
        let end = {
            let mut r = fabric::exec::result_from_journal("lost", "support-triage", &[], fabric::failure::ReasonClass::Interrupted, "x");
            r.end = fabric::exec::RunEnd::Completed { output: None };
            r
        };
        let last = JournalBatch { end: Some(end), ..Default::default() };
        assert_eq!(store.commit(&old, last.clone()).await, Err(lost.clone()), "{name}: its end");
        let journal = fabric::store::Fenced { store: store.as_ref(), lease: &old };
        assert_eq!(journal.commit("lost", last).await, Err(JournalError::LeaseLost(lost.to_string())), "{name}: the executor's port");
        let run = store.get_run("lost").await.unwrap().unwrap();
        assert_eq!((run.status, run.lease_token), (StoredStatus::Running, 2), "{name}: nothing of the old holder written");
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
        assert!(matches!(err, StoreError::TooNew { found: 999, known: 17 }), "{name}: {err}");
    }
}

/// The one migration runner on both databases: a database of a runtime from before checksums
/// (no `checksum` column) gets the column and every checksum filled in at its next open, and one
/// whose recorded checksum says a migration was edited since it was applied is refused.
#[tokio::test]
async fn an_older_database_gets_its_checksums_and_an_edited_migration_is_refused_by_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        drop(fabric::store::open(&url).await.unwrap());
        // The same statements on either database's pool: the column dropped (as an older runtime
        // left it), the store opened again, the checksums counted, one of them edited.
        macro_rules! older_then_edited {
            ($options:ty) => {{
                let pool = <$options>::new().connect(&url).await.unwrap();
                sqlx::query("ALTER TABLE fabric_schema DROP COLUMN checksum").execute(&pool).await.unwrap();
                drop(fabric::store::open(&url).await.unwrap());
                let filled: i64 = sqlx::query_scalar("SELECT COUNT(checksum) FROM fabric_schema").fetch_one(&pool).await.unwrap();
                sqlx::query("UPDATE fabric_schema SET checksum = 'edited' WHERE version = 3").execute(&pool).await.unwrap();
                pool.close().await;
                filled
            }};
        }
        let filled = if name == "sqlite" { older_then_edited!(sqlx::sqlite::SqlitePoolOptions) } else { older_then_edited!(sqlx::postgres::PgPoolOptions) };
        assert_eq!(filled, 17, "{name}: every applied migration's checksum filled in");
        let err = fabric::store::open(&url).await.unwrap_err();
        assert!(err.to_string().contains("migration 3 was changed after it was applied"), "{name}: {err}");
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
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]);
}

/// Several processes opening one new SQLite file at once migrate it once: the version is read
/// and every migration applied under the write lock, taken first (issue 47: read outside it,
/// two processes both applied the first migration, and one failed to open).
#[test]
fn processes_opening_one_new_sqlite_file_together_migrate_it_once() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
        let children: Vec<_> = (0..8)
            .map(|_| {
                std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
                    .current_dir(repo())
                    .envs(fixture_env())
                    .env("FABRIC_LLM_STUB", "1")
                    .env("FABRIC_DATABASE_URL", &url)
                    .args(["run", "support-triage", "--store", "--goal", r#"{"ticket": "x"}"#])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let o = child.wait_with_output().unwrap();
            assert!(o.status.success(), "round {round}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        }
        let versions: Vec<i64> = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            let pool = sqlx::sqlite::SqlitePoolOptions::new().connect(&url).await.unwrap();
            sqlx::query_scalar("SELECT version FROM fabric_schema").fetch_all(&pool).await.unwrap()
        });
        assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "round {round}");
    }
}

#[test]
fn the_cli_records_lists_shows_and_replays_a_run_on_every_store() {
    let urls = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(stores());
    for (name, url) in urls.0 {
        let fabric = |args: &[&str]| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
                .current_dir(repo())
                .envs(fixture_env())
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
    // The cause, not the pool's "timed out" after retrying it.
    assert!(err.to_lowercase().contains("refused") && !err.contains("timed out"), "{err}");
}

/// `Durable::run_recorded` (what `fabric run --store` does) holds its run's lease while it runs:
/// a run longer than the lease still completes, and one whose lease another process took stops,
/// told so at the next renewal (not only at its next write).
#[tokio::test]
async fn a_recorded_run_keeps_its_lease_and_stops_when_another_process_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let vars = [("FABRIC_LLM_STUB", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "1500"), ("FABRIC_RUN_LEASE_S", "1")];
    let settings = fabric::config::Settings::load(move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())).unwrap();
    let rt = fabric::runtime::Durable::new(
        Runtime::builder().settings(settings).catalogue_dirs(routes_dir(), packs_dir()).stub_dir(stub_dir()).build().unwrap(),
        fabric::store::open(&url).await.unwrap(),
    );
    let req = start("support-triage", json!({"ticket": "charged twice"}));
    // Three calls of 1.5 s: longer than the 1 s lease, kept by renewals (every third of it).
    let (handle, cancel) = fabric::cancel::CancelHandle::new();
    let done = rt.run_recorded(&req, Arc::new(NullSink), &handle, cancel).await.unwrap();
    assert_eq!(done.result.status(), fabric::exec::RunStatus::Completed, "{:?}", done.result);
    // Another process takes the run over while it runs: the fencing token moves on.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let thief = async {
        loop {
            let taken = sqlx::query("UPDATE runs SET lease_owner = 'another-process', lease_token = lease_token + 1 WHERE status = 'running'")
                .execute(&pool)
                .await
                .unwrap();
            if taken.rows_affected() > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (handle, cancel) = fabric::cancel::CancelHandle::new();
    let (stopped, ()) = tokio::join!(rt.run_recorded(&req, Arc::new(NullSink), &handle, cancel), thief);
    let stopped = stopped.unwrap().result;
    let error = stopped.error().unwrap_or_else(|| panic!("{stopped:?}"));
    assert_eq!(stopped.status(), fabric::exec::RunStatus::Failed, "{stopped:?}");
    assert!(error.message.contains("lease lost") || error.message.contains("lease was lost"), "{}", error.message);
    // Stopped by a renewal during the first model call, not at the first stage's write 1.5 s in.
    assert!(stopped.slots.is_empty(), "{stopped:?}");
    // Without a store there is nothing to hold: `run_recorded` is a method of `Durable` only,
    // which cannot be built without one.
}

/// Runs one SQL statement on the store at `url` as an outsider would (a pool of its own: a hand
/// edit, a corrupted row) and returns the first column of its rows as text.
pub(crate) async fn sql(url: &str, statement: &str) -> Vec<String> {
    let statement = sqlx::AssertSqlSafe(statement.to_owned());
    if url.starts_with("sqlite:") {
        let pool = sqlx::sqlite::SqlitePoolOptions::new().connect(url).await.unwrap();
        let out = sqlx::query_scalar::<_, String>(statement).fetch_all(&pool).await.unwrap();
        pool.close().await;
        out
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new().connect(url).await.unwrap();
        let out = sqlx::query_scalar::<_, String>(statement).fetch_all(&pool).await.unwrap();
        pool.close().await;
        out
    }
}

/// A row whose start contract or result does not read is an error that names its run, never a
/// default (issue 47); a claim that takes it with readable runs ends it, failed with why, and
/// goes on with the others; a list leaves it out (the log names it); its webhook is given up
/// with why and holds back no other delivery.
#[tokio::test]
async fn a_row_that_does_not_read_names_its_run_and_holds_up_no_claim_on_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let rt = runtime(store.clone(), &stub_dir());
        let (good, bad) = (fabric::exec::new_run_id(), fabric::exec::new_run_id());
        for (id, ticket) in [(&good, "a"), (&bad, "b")] {
            let req = start("support-triage", json!({"ticket": ticket}));
            store.create_run(NewRun { webhook: Some("http://127.0.0.1:9/hook"), ..NewRun::new(id, &req) }, None).await.unwrap();
        }
        sql(&url, &format!("UPDATE runs SET request = '{{\"route_id\": 7}}' WHERE run_id = '{bad}'")).await;
        let e = store.get_run(&bad).await.unwrap_err().to_string();
        assert!(e.contains(&bad) && e.contains("start contract does not read"), "{name}: {e}");
        let claimed = rt.claim_runs(10).await.unwrap();
        assert_eq!(claimed.len(), 2, "{name}: both claimed, the bad row holds up nothing");
        for c in claimed {
            rt.resume(c, Arc::new(NullSink), Cancel::never()).await;
        }
        assert_eq!(store.get_run(&good).await.unwrap().unwrap().status, StoredStatus::Completed, "{name}");
        let ended = sql(&url, &format!("SELECT status || ' ' || COALESCE(reason_class, '-') FROM runs WHERE run_id = '{bad}'")).await;
        assert_eq!(ended, ["failed interrupted"], "{name}");
        let events = store.events_after(&bad, 0).await.unwrap();
        assert!(events.last().is_some_and(|e| e.body.contains("its record does not read") && e.body.contains(&bad)), "{name}: {events:?}");
        let listed: Vec<String> = store.list_runs(&RunFilter { limit: 100, ..Default::default() }).await.unwrap().into_iter().map(|r| r.run_id).collect();
        assert_eq!(listed, [good.as_str()], "{name}: the list leaves the row that does not read out");
        let sender = Holder::new(Duration::from_secs(30));
        let due = store.webhooks().claim_deliveries(&sender, 10, &[]).await.unwrap();
        assert_eq!(due.iter().map(|d| d.run.run_id.as_str()).collect::<Vec<_>>(), [good.as_str()], "{name}");
        let given_up = store.webhooks().deliveries(&bad).await.unwrap();
        assert!(
            given_up.len() == 1
                && given_up[0].state == fabric::store::DeliveryState::Failed
                && given_up[0].last_error.as_deref().is_some_and(|e| e.contains(&bad) && e.contains("does not read")),
            "{name}: {given_up:?}"
        );
        // A result that does not read is no empty view either.
        sql(&url, &format!("UPDATE runs SET result = '{{\"status\": \"done\"}}' WHERE run_id = '{good}'")).await;
        let e = store.get_run(&good).await.unwrap_err().to_string();
        assert!(e.contains(&good) && e.contains("stored result does not read"), "{name}: {e}");
    }
}
