//! Durable runs across processes, each against SQLite (processes on one machine) and a real
//! PostgreSQL: a replica killed in the middle of a run, replicas racing over one queue, a
//! replica paused past its lease, and the database restarted under load. Every process is a
//! real `fabric serve` with the stub; what a run did is read back from the store and from each
//! process's metrics (its model calls).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fabric::store::{RunStore, StoredStatus};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::service::{Server, asking_stub, get, post, settled, sse};

/// A SQLite file in `dir`, or a fresh PostgreSQL database (`None` when there is no server: the
/// PostgreSQL half skips, as `store::fresh_postgres` says).
pub(crate) async fn store_url(kind: &str, dir: &tempfile::TempDir) -> Option<String> {
    match kind {
        "sqlite" => Some(format!("sqlite://{}", dir.path().join("fabric.db").display())),
        _ => crate::store::fresh_postgres().await,
    }
}

pub(crate) fn triage(k: usize) -> Value {
    json!({"route_id": "support-triage", "goal": {"ticket": format!("ticket {k}")}, "model_profile": "default"})
}

async fn metrics_text(server: &Server) -> String {
    crate::service::client().get(format!("{}/metrics", server.url)).bearer_auth(crate::service::TOKEN).send().await.unwrap().text().await.unwrap()
}

/// The model calls a process made for support-triage (its metrics).
async fn model_calls(server: &Server) -> u64 {
    let text = metrics_text(server).await;
    text.lines().find_map(|l| l.strip_prefix("fabric_model_call_duration_seconds_count{route=\"support-triage\"} ")).map_or(0, |v| v.trim().parse().unwrap())
}

/// Every event of a stored run: numbered 1.. without a gap or a duplicate, started once, ended
/// once, and each of the route's stages started, called and completed exactly once.
pub(crate) async fn assert_executed_once(store: &dyn RunStore, run_id: &str, what: &str) {
    let events = store.events_after(run_id, 0).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "{what}: run {run_id}: no gap, no duplicate");
    let mut counts: HashMap<(String, String), usize> = HashMap::new();
    for e in &events {
        let body: Value = serde_json::from_str(&e.body).unwrap();
        let stage = body["stage_id"].as_str().unwrap_or("").to_owned();
        *counts.entry((e.kind.clone(), stage)).or_default() += 1;
    }
    let count = |kind: &str, stage: &str| counts.get(&(kind.to_owned(), stage.to_owned())).copied().unwrap_or(0);
    assert_eq!((count("run.started", ""), count("run.completed", "")), (1, 1), "{what}: run {run_id}: {counts:?}");
    for stage in ["intake", "lookup", "answer"] {
        for kind in ["run.stage.started", "run.llm.completed", "run.stage.completed"] {
            assert_eq!(count(kind, stage), 1, "{what}: run {run_id}: {kind} of `{stage}`: {counts:?}");
        }
    }
}

#[tokio::test]
async fn a_replica_killed_mid_run_is_taken_over_and_each_stage_runs_once_on_sqlite() {
    killed_mid_run("sqlite").await;
}

#[tokio::test]
async fn a_replica_killed_mid_run_is_taken_over_and_each_stage_runs_once_on_postgres() {
    killed_mid_run("postgres").await;
}

async fn killed_mid_run(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_LLM_STUB_LATENCY_MS", "700"), ("FABRIC_CLAIM_POLL_MS", "100")];
    let mut first = Server::start(&db, stub.path(), &env);
    let (_, run) = post(&first, "/v1/runs", triage(1)).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    // Killed once the first stage (700 ms) is recorded: the second is then in its model call.
    let store = fabric::store::open(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.events_after(&id, 0).await.unwrap().iter().any(|e| e.kind == "run.stage.completed") {
        assert!(Instant::now() < deadline, "{kind}: the first stage was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    let before = store.events_after(&id, 0).await.unwrap();
    assert!(before.iter().any(|e| e.kind == "run.stage.completed"), "{kind}: the first stage was recorded before the kill: {before:?}");
    assert!(before.iter().all(|e| e.kind != "run.completed"), "{kind}: killed mid-run");
    // Another replica takes the run over once its lease expires, and finishes it.
    let second = Server::start(&db, stub.path(), &env);
    let view = settled(&second, &id).await;
    assert_eq!(view["status"], "completed", "{kind}: {view}\n{}", second.logs());
    assert_executed_once(store.as_ref(), &id, kind).await;
    // The recorded model reply was not asked again: the second replica made the other two calls.
    assert_eq!(model_calls(&second).await, 2, "{kind}: {}", second.logs());
    let metrics = metrics_text(&second).await;
    assert!(metrics.contains("fabric_runs_taken_over_total{route=\"support-triage\"} 1"), "{kind}: {metrics}");
    assert!(metrics.contains("fabric_runs_in_flight 0"), "{kind}: {metrics}");
    assert_eq!(store.get_run(&id).await.unwrap().unwrap().lease_token, 2, "{kind}: claimed twice: accepted, taken over");
    assert!(second.logs().contains("taking over a run whose process stopped"), "{kind}: the takeover is logged");
    // The stream a client reads from the new replica is the whole run, in order.
    let streamed: Vec<u64> = sse(&second, &id, None).await.iter().map(|e| e.0).collect();
    assert_eq!(streamed, (1..=streamed.len() as u64).collect::<Vec<_>>(), "{kind}");
}

#[tokio::test]
async fn replicas_racing_over_500_runs_execute_each_exactly_once_on_sqlite() {
    for replicas in [2, 4] {
        race(replicas, "sqlite").await;
    }
}

#[tokio::test]
async fn replicas_racing_over_500_runs_execute_each_exactly_once_on_postgres() {
    for replicas in [2, 4] {
        race(replicas, "postgres").await;
    }
}

/// `replicas` processes with 4 run slots each; 500 runs posted round-robin to them, so most
/// are queued in the store and claimed by whichever replica has room first.
async fn race(replicas: usize, kind: &str) {
    const RUNS: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_MAX_RUNS_IN_FLIGHT", "4"), ("FABRIC_CLAIM_POLL_MS", "20"), ("FABRIC_LLM_STUB_LATENCY_MS", "2"), ("FABRIC_LOG", "warn")];
    let servers: Vec<Server> = (0..replicas).map(|_| Server::start(&db, stub.path(), &env)).collect();
    let posts = (0..RUNS).map(|k| {
        let server = &servers[k % replicas];
        async move {
            let (status, body) = post(server, "/v1/runs", triage(k)).await;
            assert_eq!(status, 201, "{body}");
            body["run_id"].as_str().unwrap().to_owned()
        }
    });
    let ids: Vec<String> = futures_util::stream::iter(posts).buffer_unordered(32).collect().await;
    let store = fabric::store::open(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let open = store.list_runs(&fabric::store::RunFilter { status: Some(StoredStatus::Queued), limit: 1, ..Default::default() }).await.unwrap().len()
            + store.list_runs(&fabric::store::RunFilter { status: Some(StoredStatus::Running), limit: 1, ..Default::default() }).await.unwrap().len();
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{kind}, {replicas} replicas: runs still open after 240 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let what = format!("{kind}, {replicas} replicas");
    for id in &ids {
        let run = store.get_run(id).await.unwrap().unwrap();
        // Claimed once, mostly; a replica whose slots a request took between its claim and the
        // run's start lets the run go unstarted, and it is claimed again.
        assert_eq!(run.status, StoredStatus::Completed, "{what}: run {id}");
        assert_executed_once(store.as_ref(), id, &what).await;
    }
    // Each run's three model calls, made once: nothing executed twice anywhere.
    let mut calls = 0;
    let mut busy = 0;
    for s in &servers {
        let n = model_calls(s).await;
        busy += usize::from(n > 0);
        calls += n;
    }
    let logs: String = servers.iter().map(Server::logs).collect();
    assert_eq!(calls, 3 * RUNS as u64, "{what}: {logs}");
    assert!(!logs.contains("lease lost") && !logs.contains("run record"), "{what}: no run lost its lease or its record: {logs}");
    assert_eq!(busy, replicas, "{what}: every replica took a share");
}

#[tokio::test]
async fn a_replica_paused_past_its_lease_is_fenced_on_sqlite() {
    paused("sqlite").await;
}

#[tokio::test]
async fn a_replica_paused_past_its_lease_is_fenced_on_postgres() {
    paused("postgres").await;
}

/// SIGSTOP a replica in the middle of a model call for longer than its lease: another replica
/// takes the run over and completes it; after SIGCONT the paused one's late write is refused
/// by the fence, it stops the run and says so, and the record holds each stage once.
async fn paused(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let slow = Server::start(&db, stub.path(), &[("FABRIC_RUN_LEASE_S", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "1500")]);
    let (_, run) = post(&slow, "/v1/runs", triage(1)).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_outside_a_write(&slow, &db).await;
    let other = Server::start(&db, stub.path(), &[("FABRIC_RUN_LEASE_S", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "10"), ("FABRIC_CLAIM_POLL_MS", "100")]);
    let view = settled(&other, &id).await;
    assert_eq!(view["status"], "completed", "{kind}: {view}\nthe other replica: {}", other.logs());
    slow.signal("CONT");
    // The paused replica wakes up inside its model call, finishes it and tries to write.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !slow.logs().contains("lease was lost") && !slow.logs().contains("run lease lost") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = slow.logs();
    assert!(
        logs.contains(&id) && (logs.contains("lease was lost") || logs.contains("run lease lost")),
        "{kind}: the fenced replica says it stopped the run: {logs}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let store = fabric::store::open(&db).await.unwrap();
    assert_executed_once(store.as_ref(), &id, kind).await;
    let run = store.get_run(&id).await.unwrap().unwrap();
    // Claimed by the paused replica (1), then by the other (2); a 1 s lease may also have been
    // taken over once more by the other from itself under a loaded machine, fenced the same way.
    assert_eq!(run.status, StoredStatus::Completed, "{kind}");
    assert!(run.lease_token >= 2, "{kind}: the paused replica's claim was superseded: {}", run.lease_token);
    assert_eq!(get(&other, &format!("/v1/runs/{id}")).await["status"], "completed");
}

/// SIGSTOP `server` at a moment it is not inside a write of the SQLite file. A process frozen
/// while it holds SQLite's write lock holds every writer of the file with it until it resumes
/// or dies (docs/operations.md, "Leases and fencing"): that is SQLite's lock, not a lease this
/// test is about. On PostgreSQL the server ends such a transaction (the store's
/// `idle_in_transaction_session_timeout`), so any moment will do.
async fn stop_outside_a_write(server: &Server, db: &str) {
    use sqlx::{ConnectOptions, Connection};
    use std::str::FromStr;
    for _ in 0..50 {
        server.signal("STOP");
        if !db.starts_with("sqlite:") {
            return;
        }
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(db).unwrap().busy_timeout(Duration::from_millis(500));
        let mut probe = options.connect().await.unwrap();
        let free = sqlx::query("BEGIN IMMEDIATE").execute(&mut probe).await.is_ok();
        if free {
            sqlx::query("ROLLBACK").execute(&mut probe).await.unwrap();
        }
        probe.close().await.unwrap();
        if free {
            return;
        }
        server.signal("CONT");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the replica was inside a write of {db} at each of 50 tries");
}

/// The database restarted while runs execute: the writes wait for it, and every run completes
/// with its record whole. A cluster of its own, so other tests do not see the restart.
#[tokio::test]
async fn the_database_restarted_under_load_loses_nothing() {
    let Some((url, data)) = private_postgres() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stub = asking_stub();
    let server = Server::start(&url, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "300"), ("FABRIC_RUN_LEASE_S", "3"), ("FABRIC_CLAIM_POLL_MS", "100")]);
    let mut ids = Vec::new();
    for k in 0..40 {
        let (status, body) = post(&server, "/v1/runs", triage(k)).await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["run_id"].as_str().unwrap().to_owned());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stopped = stop_private(&url, &data).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stopped.start();
    for id in &ids {
        let view = settled(&server, id).await;
        assert_eq!(view["status"], "completed", "{view}\n{}", server.logs());
    }
    let store = fabric::store::open(&url).await.unwrap();
    for id in &ids {
        let events = store.events_after(id, 0).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "run {id}: no gap, no duplicate");
        let completed = events.iter().filter(|e| e.kind == "run.stage.completed").count();
        assert_eq!(completed, 3, "run {id}: every stage recorded once");
    }
    drop(server);
    drop(dir);
    let _ = std::process::Command::new(crate::support::repo().join(".ci/postgres")).args(["stop", &data]).status();
}

/// SQLite's counterpart of a database restart: another process holds the file's write lock for
/// longer than the store's busy timeout (10 s) while runs execute. Their writes wait it out and
/// every run completes, its record whole, each stage once.
#[tokio::test]
async fn the_sqlite_file_locked_under_load_loses_nothing() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "300")]);
    let mut ids = Vec::new();
    for k in 0..20 {
        let (status, body) = post(&server, "/v1/runs", triage(k)).await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["run_id"].as_str().unwrap().to_owned());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut locker = sqlx::sqlite::SqliteConnection::connect(&db).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    drop(locker);
    for id in &ids {
        let view = settled(&server, id).await;
        assert_eq!(view["status"], "completed", "{view}\n{}", server.logs());
    }
    assert!(server.logs().contains("run store unavailable; the writes wait"), "{}", server.logs());
    let store = fabric::store::open(&db).await.unwrap();
    for id in &ids {
        assert_executed_once(store.as_ref(), id, "sqlite locked").await;
    }
}

/// A PostgreSQL cluster of this test's own (`.ci/postgres start`), or `None` where there is no
/// PostgreSQL (skipped, except in CI).
pub(crate) fn private_postgres() -> Option<(String, String)> {
    let present = std::env::var("FABRIC_TEST_POSTGRES_URL").is_ok_and(|u| !u.trim().is_empty());
    if crate::support::skip_unless(present, "PostgreSQL", "FABRIC_TEST_POSTGRES_URL is unset (`eval \"$(.ci/postgres start)\"` sets it; .ci/run does)") {
        return None;
    }
    let out = std::process::Command::new(crate::support::repo().join(".ci/postgres")).arg("start").env_remove("FABRIC_TEST_PG_PORT").output().unwrap();
    assert!(out.status.success(), "a private PostgreSQL cluster starts: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let var = |name: &str| text.lines().find_map(|l| l.strip_prefix(&format!("export {name}="))).unwrap().to_owned();
    Some((var("FABRIC_TEST_POSTGRES_URL"), var("FABRIC_TEST_PGDATA")))
}

/// A private cluster stopped, to be started again on its port. Stopped must mean down: the
/// port refuses connections. (`.ci/postgres start` does not hand a stopped cluster's port to
/// another cluster: the service, reconnecting to the same URL, would write to that one and
/// acknowledge starts while its own database is down, as a test run once saw.)
pub(crate) struct Stopped {
    data: String,
}

/// Stops the private cluster in `data` whose URL is `url` (`pg_ctl -m fast stop`: every
/// connection cut; it returns once the postmaster is gone), and returns once a new connection
/// to `url` is refused.
pub(crate) async fn stop_private(url: &str, data: &str) -> Stopped {
    as_postgres(&[&pg_bin("pg_ctl"), "-D", data, "-m", "fast", "stop"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match <sqlx::postgres::PgConnection as sqlx::Connection>::connect(url).await {
            Err(sqlx::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            other => assert!(Instant::now() < deadline, "{url} still answers 10 s after its cluster {data} stopped: {:?}", other.map(|_| "connected")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Stopped { data: data.to_owned() }
}

impl Stopped {
    /// Starts the cluster again, as it was (`fabric-opts`: its port).
    pub(crate) fn start(self) {
        let data = self.data;
        let opts = std::fs::read_to_string(std::path::Path::new(&data).join("fabric-opts")).unwrap();
        let log = format!("{data}/log");
        as_postgres(&[&pg_bin("pg_ctl"), "-D", &data, "-l", &log, "-w", "-o", opts.trim(), "start"]);
    }
}

/// The newest installed PostgreSQL's `tool`, as `.ci/postgres` finds it.
fn pg_bin(tool: &str) -> String {
    let out = std::process::Command::new("sh").arg("-c").arg(format!("ls -d /usr/lib/postgresql/*/bin/{tool} | sort -V | tail -1")).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs `args` as the cluster's owner when root (`pg_ctl` refuses to run as root), as
/// `.ci/postgres` does, from a folder that user may enter.
fn as_postgres(args: &[&str]) {
    let script = r#"if [ "$(id -u)" = 0 ]; then exec runuser -u postgres -- "$@"; else exec "$@"; fi"#;
    let ok = std::process::Command::new("sh").args(["-c", script, "sh"]).args(args).current_dir("/tmp").status().unwrap();
    assert!(ok.success(), "{args:?}");
}
