//! Faults of the store under a real `fabric serve`: the SQLite file's disk full (a small tmpfs,
//! grown again), read-only for a few seconds (permissions, the server running as `nobody`), the
//! file removed or replaced under the server; PostgreSQL stopped under load. Each checks what
//! the issue promises: nothing acknowledged is lost, readiness says so while writes fail, and the
//! store heals by itself. Mounting and changing user need root: elsewhere these tests say they
//! skip, and under `CI=true` they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;

use crate::service::{Server, TOKEN, asking_stub, client, settled};

/// Whether this process may mount and change user; `false` (with a message) where it may not,
/// and a failure under `CI=true`, where `.ci/run` runs as root.
fn root_or_skip(what: &str) -> bool {
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
    if uid == "0" {
        return true;
    }
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but the {what} test needs root (mount, runuser)");
    eprintln!("skipping the {what} test: it needs root (mount, runuser)");
    false
}

/// A tmpfs of its own, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir.path()).status().unwrap();
        assert!(ok.success(), "mount -t tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(self.path()).status().unwrap();
        assert!(ok.success(), "mount -o remount");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

fn triage(k: usize, pad: usize) -> Value {
    json!({"route_id": "support-triage", "goal": {"ticket": format!("ticket {k}"), "pad": "x".repeat(pad)}, "model_profile": "default"})
}

/// A start: status, the `Retry-After` header, body.
async fn start(server: &Server, body: &Value) -> (u16, Option<String>, Value) {
    let r = client().post(format!("{}/v1/runs", server.url)).bearer_auth(TOKEN).json(body).send().await.unwrap();
    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (r.status().as_u16(), retry, r.json().await.unwrap_or(Value::Null))
}

async fn ready(server: &Server) -> (u16, Value) {
    let r = client().get(format!("{}/readyz", server.url)).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Whether another connection, opened read-only, sees the run's row: committed, not just said.
async fn committed(db_file: &Path, run_id: &str) -> bool {
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(db_file).read_only(true);
    let mut conn = sqlx::sqlite::SqliteConnection::connect_with(&options).await.unwrap();
    let row: Option<(String,)> = sqlx::query_as("SELECT run_id FROM runs WHERE run_id = ?").bind(run_id).fetch_optional(&mut conn).await.unwrap();
    row.is_some()
}

/// Waits until `/readyz` answers `want`, at most `within`; the last answer.
async fn readiness_becomes(server: &Server, want: u16, within: Duration) -> (u16, Value) {
    let deadline = Instant::now() + within;
    loop {
        let answer = ready(server).await;
        if answer.0 == want || Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The refusal a start gets while the store cannot write.
fn assert_unavailable(status: u16, retry: &Option<String>, body: &Value, what: &str) {
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("store_unavailable")), "{what}: {body}");
    assert!(retry.as_deref().and_then(|r| r.parse::<u64>().ok()).is_some_and(|s| s >= 1), "{what}: Retry-After: {retry:?}");
}

/// The SQLite file on a 2 MiB tmpfs, filled by runs with 2 KB goals, kept full for 60 s, then
/// grown: no start is acknowledged without its row committed, readiness is 503 while writes
/// fail, the service heals by itself, and every acknowledged run completes with each stage
/// once, also after a restart.
#[tokio::test]
async fn a_full_disk_acknowledges_nothing_it_cannot_keep_and_heals_when_space_returns() {
    if !root_or_skip("disk full") {
        return;
    }
    let fs = Tmpfs::mount("2m");
    let file = fs.path().join("fabric.db");
    let db = format!("sqlite://{}", file.display());
    let stub = asking_stub();
    let env = [("FABRIC_RUN_LEASE_S", "3"), ("FABRIC_CLAIM_POLL_MS", "100"), ("FABRIC_LLM_STUB_LATENCY_MS", "20"), ("FABRIC_LOG", "warn")];
    let server = Server::start(&db, stub.path(), &env);
    let mut acked: Vec<String> = Vec::new();
    let mut full = false;
    for k in 0..5000 {
        let (status, retry, body) = start(&server, &triage(k, 2000)).await;
        if status == 201 {
            let id = body["run_id"].as_str().unwrap().to_owned();
            assert!(committed(&file, &id).await, "run {id} was acknowledged (201) but its row is not committed");
            acked.push(id);
            continue;
        }
        assert_unavailable(status, &retry, &body, "the first refusal");
        full = true;
        break;
    }
    assert!(full, "2 MiB never filled up ({} runs)", acked.len());
    // Full for 60 s: every start is refused or kept, and readiness says the store cannot write.
    let until = Instant::now() + Duration::from_secs(60);
    let (mut refused, mut not_ready) = (0, 0);
    let mut k = acked.len();
    while Instant::now() < until {
        k += 1;
        let (status, retry, body) = start(&server, &triage(k, 2000)).await;
        match status {
            201 => {
                let id = body["run_id"].as_str().unwrap().to_owned();
                assert!(committed(&file, &id).await, "run {id} acknowledged while the disk is full, but not committed");
                acked.push(id);
            }
            _ => {
                assert_unavailable(status, &retry, &body, "a start while the disk is full");
                refused += 1;
            }
        }
        let (status, body) = ready(&server).await;
        if status == 503 {
            assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
            not_ready += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(refused > 0 && not_ready > 0, "refused {refused}, not ready {not_ready} while full\n{}", server.logs());
    fs.resize("50m");
    let (status, body) = readiness_becomes(&server, 200, Duration::from_secs(30)).await;
    assert_eq!(status, 200, "ready again by itself once space returned: {body}\n{}", server.logs());
    let (status, _, body) = start(&server, &triage(0, 10)).await;
    assert_eq!(status, 201, "starts are taken again: {body}");
    acked.push(body["run_id"].as_str().unwrap().to_owned());
    for id in &acked {
        let view = settled(&server, id).await;
        assert_eq!(view["status"], "completed", "run {id}: {view}\n{}", server.logs());
    }
    let logs = server.logs();
    assert!(!logs.contains("lease was lost") && !logs.contains("run lease lost"), "a store error is not a lost lease: {logs}");
    let (_, _) = server.stop();
    let store = fabric::store::open(&db).await.unwrap();
    for id in &acked {
        crate::durable::assert_executed_once(store.as_ref(), id, "disk full").await;
        let run = store.get_run(id).await.unwrap().unwrap();
        assert_eq!(run.lease_token, 1, "run {id}: never taken over");
    }
    drop(store);
    // After a restart, every acknowledged run is there.
    let again = Server::start(&db, stub.path(), &env);
    for id in &acked {
        assert_eq!(settled(&again, id).await["status"], "completed", "run {id} after a restart");
    }
}

/// `chmod` of the database's files and folder to read-only for 3 s under a server that is not
/// root, with runs in flight: writes resume by themselves, no run fails from it, and readiness
/// comes back.
#[tokio::test]
async fn a_read_only_window_heals_without_a_restart_and_fails_no_run() {
    if !root_or_skip("read-only") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("db");
    std::fs::create_dir(&folder).unwrap();
    chown_nobody(&folder);
    let file = folder.join("fabric.db");
    let db = format!("sqlite://{}", file.display());
    let stub = asking_stub();
    chmod(stub.path(), "755");
    chmod(dir.path(), "755");
    let env = [("FABRIC_RUN_LEASE_S", "3"), ("FABRIC_CLAIM_POLL_MS", "100"), ("FABRIC_LLM_STUB_LATENCY_MS", "300"), ("FABRIC_LOG", "warn")];
    let server = Server::start_as("nobody", &db, stub.path(), &env);
    let mut ids = Vec::new();
    for k in 0..10 {
        let (status, _, body) = start(&server, &triage(k, 10)).await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["run_id"].as_str().unwrap().to_owned());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let files: Vec<PathBuf> = ["fabric.db", "fabric.db-wal", "fabric.db-shm"].iter().map(|f| folder.join(f)).filter(|f| f.exists()).collect();
    for f in &files {
        chmod(f, "444");
    }
    chmod(&folder, "555");
    let window = Instant::now() + Duration::from_secs(3);
    let mut refused = 0;
    let mut k = 10;
    while Instant::now() < window {
        k += 1;
        let (status, retry, body) = start(&server, &triage(k, 10)).await;
        if status == 201 {
            ids.push(body["run_id"].as_str().unwrap().to_owned());
        } else {
            assert_unavailable(status, &retry, &body, "a start while read-only");
            refused += 1;
        }
        // Reads side by side make the pool open connections while the files are read-only
        // (SQLite then opens them read-only, for good).
        let reads = (0..8).map(|_| client().get(format!("{}/v1/runs?limit=5", server.url)).bearer_auth(TOKEN).send());
        futures_util::future::join_all(reads).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    chmod(&folder, "755");
    for f in &files {
        chmod(f, "644");
    }
    let (status, body) = readiness_becomes(&server, 200, Duration::from_secs(30)).await;
    assert_eq!(status, 200, "ready again without a restart: {body}\n{}", server.logs());
    let (status, _, body) = start(&server, &triage(0, 10)).await;
    assert_eq!(status, 201, "writes resumed: {body}\n{}", server.logs());
    ids.push(body["run_id"].as_str().unwrap().to_owned());
    for id in &ids {
        let view = settled(&server, id).await;
        assert_eq!(view["status"], "completed", "run {id} (refused {refused} while read-only): {view}\n{}", server.logs());
    }
    let store = fabric::store::open(&db).await.unwrap();
    for id in &ids {
        crate::durable::assert_executed_once(store.as_ref(), id, "read-only").await;
    }
}

/// The database file removed, and then replaced by another, under a running server: readiness
/// says so (the process writes to a file nobody else sees), starts are refused, and the log
/// names the file.
#[tokio::test]
async fn a_database_file_removed_or_replaced_under_the_server_makes_it_not_ready() {
    for replace in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fabric.db");
        let db = format!("sqlite://{}", file.display());
        let stub = asking_stub();
        let server = Server::start(&db, stub.path(), &[("FABRIC_LOG", "warn")]);
        assert_eq!(ready(&server).await.0, 200);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
        if replace {
            // Another database where the file was: a new inode.
            drop(fabric::store::open(&db).await.unwrap());
        }
        let (status, body) = readiness_becomes(&server, 503, Duration::from_secs(15)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (503, Some("store_unavailable")), "replaced {replace}: {body}");
        let (status, retry, body) = start(&server, &triage(1, 10)).await;
        assert_unavailable(status, &retry, &body, "a start after the file went");
        let logs = server.logs();
        assert!(logs.contains("fabric.db") && (logs.contains("removed") || logs.contains("replaced")), "replaced {replace}: {logs}");
    }
}

fn chmod(path: &Path, mode: &str) {
    assert!(Command::new("chmod").arg(mode).arg(path).status().unwrap().success());
}

fn chown_nobody(path: &Path) {
    assert!(Command::new("chown").arg("nobody").arg(path).status().unwrap().success());
}
