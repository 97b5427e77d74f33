//! A replica frozen (SIGSTOP) in the middle of a PostgreSQL transaction: its locks stay with it,
//! so without a bound its runs could never be taken over while it stays frozen, whatever its
//! lease. The store sets `idle_in_transaction_session_timeout` (10 s) on its connections; the
//! server ends the frozen transaction and another replica takes the run over.

use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::durable::{store_url, triage};
use crate::service::{Server, asking_stub, get, post};

/// The first column of `statement`'s rows, as text, on a connection of the test's own.
async fn rows(conn: &mut sqlx::PgConnection, statement: &'static str, run_id: Option<&str>) -> Vec<String> {
    let mut q = sqlx::query_scalar::<_, String>(statement);
    if let Some(id) = run_id {
        q = q.bind(id.to_owned());
    }
    q.fetch_all(conn).await.unwrap()
}

/// The backend of a writer transaction of the replica (its batch's first statement locks its
/// runs' rows) waiting on a row lock: `pid` as text.
const WAITING_WRITER: &str = "SELECT pid::text FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
     AND wait_event_type = 'Lock' AND query LIKE 'SELECT run_id FROM runs WHERE run_id IN%'";

#[tokio::test]
async fn a_replica_frozen_inside_a_transaction_is_taken_over_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url("postgres", &dir).await else { return };
    let stub = asking_stub();
    let frozen = Server::start(&db, stub.path(), &[("FABRIC_RUN_LEASE_S", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "300")]);
    let (status, run) = post(&frozen, "/v1/runs", triage(1)).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();

    // Hold the run's row, so the replica's next write batch waits for it inside its transaction.
    let mut holder = sqlx::PgConnection::connect(&db).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    rows(&mut holder, "SELECT run_id FROM runs WHERE run_id = $1 FOR UPDATE", Some(&id)).await;
    let mut watch = sqlx::PgConnection::connect(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let writer = loop {
        if let Some(pid) = rows(&mut watch, WAITING_WRITER, None).await.pop() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the replica's writer never waited for the run's row: {}", frozen.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Freeze it there, then let the row go: its statement ends, and its transaction stays open
    // with the row locked, waiting for a client that cannot answer.
    frozen.signal("STOP");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let idle = "SELECT state FROM pg_stat_activity WHERE pid = CAST($1 AS INTEGER)";
    let deadline = Instant::now() + Duration::from_secs(5);
    while rows(&mut watch, idle, Some(&writer)).await != ["idle in transaction"] {
        assert!(Instant::now() < deadline, "the frozen writer's transaction is left idle with the row");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Another replica: the run's lease is long gone, but its row stays locked until the server
    // ends the frozen transaction (10 s); then it is claimed and completes, the replica frozen.
    let other = Server::start(&db, stub.path(), &[("FABRIC_RUN_LEASE_S", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "10"), ("FABRIC_CLAIM_POLL_MS", "100")]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let view = loop {
        let view = get(&other, &format!("/v1/runs/{id}")).await;
        if view["status"] != "running" || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(view["status"], "completed", "{view}\nthe other replica: {}", other.logs());
    assert!(rows(&mut watch, idle, Some(&writer)).await.is_empty(), "the server ended the frozen transaction's session");

    // Thawed, the frozen replica learns its session is gone and its lease lost; it writes nothing
    // more to the run, which the other completed with each stage once.
    frozen.signal("CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let store = fabric::store::open(&db).await.unwrap();
    crate::durable::assert_executed_once(store.as_ref(), &id, "postgres frozen").await;
    assert_eq!(get(&frozen, &format!("/v1/runs/{id}")).await["status"], "completed", "{}", frozen.logs());
}
