//! The scenarios that need other processes: the `fabric` executable (found as
//! [`fabric_exe`] says) serves the loopback tool server (B-http, C) and the service (S, and the
//! replicas of R); their memory is read from `/proc`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::fixture::{PACK, STAGED_SCRIPT, catalogue_text, goal};
use crate::measure::{meta, proc_kib, round2, stats};
use crate::options::BenchOptions;

/// The `fabric` executable the side processes run: `FABRIC_BIN` (which `fabric bench` sets to
/// itself before it hands over), else the one beside this program (cargo and an install put
/// both in one directory), else `fabric` on PATH.
pub fn fabric_exe() -> PathBuf {
    if let Some(bin) = std::env::var_os("FABRIC_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    std::env::current_exe()
        .ok()
        .map(|me| me.with_file_name(format!("fabric{}", std::env::consts::EXE_SUFFIX)))
        .filter(|beside| beside.is_file())
        .unwrap_or_else(|| PathBuf::from("fabric"))
}

/// A `fabric` child process that prints its URL first (the tool server, the service); killed
/// when dropped.
pub struct FabricProcess {
    child: tokio::process::Child,
    pub url: String,
}

impl std::fmt::Debug for FabricProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricProcess").field("pid", &self.child.id()).field("url", &self.url).finish()
    }
}

impl FabricProcess {
    pub async fn start(exe: &Path) -> Result<FabricProcess, String> {
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["tool-server", "--listen", "127.0.0.1:0"]);
        FabricProcess::spawn(cmd, "the tool server").await
    }

    async fn spawn(mut cmd: tokio::process::Command, what: &str) -> Result<FabricProcess, String> {
        let exe = PathBuf::from(cmd.as_std().get_program());
        let mut child = match cmd.stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true).spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("cannot start {what}: no `{}` (set FABRIC_BIN, or put `fabric` beside fabric-bench or on PATH)", exe.display()));
            }
            Err(e) => return Err(format!("cannot start {what}: {e}")),
        };
        let stdout = child.stdout.take().ok_or(format!("{what} has no stdout"))?;
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(20), tokio::io::BufReader::new(stdout).read_line(&mut line))
            .await
            .map_err(|_| format!("{what} did not start in 20 s"))?
            .map_err(|e| format!("reading the address of {what}: {e}"))?;
        Ok(FabricProcess { child, url: line.trim().to_owned() })
    }
}

impl FabricProcess {
    /// Kills the process and waits until it is gone (its files closed).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

impl Drop for FabricProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// R: `replicas` `fabric serve` processes on one database (`--journal URL`) sharing `runs`
/// queued runs (stub at `latency_ms`, 64 run slots each): runs/s from the moment the runs are
/// queued to the moment the last one completed.
pub async fn replicated(exe: &Path, replicas: usize, runs: usize, latency_ms: u64, opts: &BenchOptions) -> Result<Value, String> {
    let Some(url) = opts.journal.clone() else {
        return Ok(json!({"scenario": "R", "skipped": "scenario R needs --journal URL (the database the replicas share)"}));
    };
    let dir = std::env::temp_dir().join(format!("fabric-bench-r-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = fabric::store::open(&url).await.map_err(|e| e.to_string())?;
    let mut servers = Vec::new();
    for _ in 0..replicas {
        let mut cmd = serve_command(exe, &dir, latency_ms, &url, opts.stream)?;
        cmd.env("FABRIC_MAX_RUNS_IN_FLIGHT", "64").env("FABRIC_CLAIM_POLL_MS", "20");
        servers.push(FabricProcess::spawn(cmd, "a replica").await?);
    }
    let request = fabric::store::StartRequest { route_id: "staged".into(), goal: goal(), model_profile: Some("bench".into()), ..Default::default() };
    let start = Instant::now();
    let ids: Vec<String> = (0..runs).map(|_| fabric::exec::new_run_id()).collect();
    let creates = ids.iter().map(|id| store.create_run(fabric::store::NewRun::new(id, &request), None));
    for r in futures_util::future::join_all(creates).await {
        r.map_err(|e| e.to_string())?;
    }
    let queued_ms = start.elapsed().as_secs_f64() * 1e3;
    let deadline = Instant::now() + Duration::from_secs(600);
    let open = |status| fabric::store::RunFilter { status: Some(status), limit: 1, ..Default::default() };
    loop {
        let waiting = store.list_runs(&open(fabric::store::StoredStatus::Queued)).await.map_err(|e| e.to_string())?.len()
            + store.list_runs(&open(fabric::store::StoredStatus::Running)).await.map_err(|e| e.to_string())?.len();
        if waiting == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = start.elapsed().as_secs_f64();
    let mut completed = 0;
    for id in &ids {
        if store.get_run(id).await.map_err(|e| e.to_string())?.is_some_and(|r| r.status == fabric::store::StoredStatus::Completed) {
            completed += 1;
        }
    }
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "scenario": "R", "replicas": replicas, "runs": runs, "completed": completed, "stub_latency_ms": latency_ms, "slots_per_replica": 64,
        "journal": if url.starts_with("sqlite:") { "sqlite" } else { "postgres" },
        "queued_ms": round2(queued_ms), "wall_ms": round2(wall * 1e3), "runs_per_s": round2(completed as f64 / wall),
        "ideal_runs_per_s": round2((replicas * 64) as f64 / (3.0 * latency_ms as f64 / 1e3)), "meta": meta(),
    }))
}

/// The bearer token of the services the benchmarks start.
const BENCH_TOKEN: &str = "bench-token";

/// The bench route's catalogue, prompt pack and stub script written under `dir`, and
/// the `fabric serve` command over them: the stub at `latency_ms`, [`BENCH_TOKEN`], quiet logs,
/// the store at `database_url`, any free port on loopback (printed on its stdout).
fn serve_command(exe: &Path, dir: &Path, latency_ms: u64, database_url: &str, stream: bool) -> Result<tokio::process::Command, String> {
    let (catalogue, packs, stub_dir) = (dir.join("routes"), dir.join("packs"), dir.join("stub"));
    for d in [&catalogue, &packs, &stub_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::write(catalogue.join("bench.yaml"), catalogue_text(stream))
        .and_then(|_| std::fs::write(packs.join("bench.yaml"), PACK))
        .and_then(|_| std::fs::write(stub_dir.join("staged.yaml"), STAGED_SCRIPT))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--catalogue", &catalogue.to_string_lossy(), "--prompt-packs", &packs.to_string_lossy(), "--stub-dir", &stub_dir.to_string_lossy()])
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("FABRIC_LLM_STUB", "1")
        .env("FABRIC_LLM_STUB_LATENCY_MS", latency_ms.to_string())
        .env("FABRIC_API_TOKEN", BENCH_TOKEN)
        .env("FABRIC_DATABASE_URL", database_url)
        .env("FABRIC_LOG", "warn");
    Ok(cmd)
}

/// S: `fabric serve` (stub at 50 ms) in its own process over `journal` (`--journal URL`; a fresh
/// SQLite file when absent), loaded from this one: `clients` connections each posting
/// `POST /v1/runs?wait=true` `requests` times. Besides speed, what the runs cost the store
/// ([`stored_bytes`] before the service starts and after it stopped, per run it completed) and
/// the service's memory (its peak RSS over its idle one, per client: one run in flight each).
pub async fn service(exe: &Path, clients: usize, requests: usize, latency_ms: u64, journal: Option<&str>, stream: bool) -> Result<Value, String> {
    let dir = std::env::temp_dir().join(format!("fabric-bench-s-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let token = BENCH_TOKEN;
    let url = journal.map_or_else(|| format!("sqlite://{}/s.db", dir.display()), |u| u.trim().to_owned());
    let kind = match url.split_once(':').map(|(scheme, _)| scheme) {
        Some("sqlite") => "sqlite",
        Some("postgres" | "postgresql") => "postgres",
        _ => return Err(format!("--journal `{}` is not a store URL; use sqlite://PATH or postgres://…", fabric::redact::redact_url(&url))),
    };
    let stored_before = stored_bytes(&url).await?;
    let mut cmd = serve_command(exe, &dir, latency_ms, &url, stream)?;
    cmd.env("FABRIC_MAX_RUNS_IN_FLIGHT", (clients * 2).to_string());
    let server = FabricProcess::spawn(cmd, "the service").await?;
    let pid = server.child.id().unwrap_or(0);
    let client = reqwest::Client::builder().pool_max_idle_per_host(clients).build().map_err(|e| e.to_string())?;
    let runs_url = format!("{}/v1/runs?wait=true", server.url);
    let body = json!({"route_id": "staged", "goal": goal(), "model_profile": "bench"});
    // Warm the server's connections and the store.
    let mut warm = 0;
    for _ in 0..5 {
        if let Ok(r) = client.post(&runs_url).bearer_auth(token).json(&body).send().await
            && r.json::<Value>().await.is_ok_and(|v| v["status"] == "completed")
        {
            warm += 1;
        }
    }
    let rss_before = proc_kib(pid, "VmRSS:").unwrap_or(0);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), runs_url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(requests);
            let mut errors = 0;
            for _ in 0..requests {
                let t = Instant::now();
                match client.post(&url).bearer_auth(token).json(&body).send().await {
                    Ok(r) if r.status().is_success() => match r.json::<Value>().await {
                        Ok(v) if v["status"] == "completed" => latencies.push(t.elapsed().as_secs_f64() * 1e3),
                        _ => errors += 1,
                    },
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            latencies.extend(l);
            errors += e;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let peak = proc_kib(pid, "VmHWM:").unwrap_or(0);
    server.stop().await;
    let stored_after = stored_bytes(&url).await;
    let _ = std::fs::remove_dir_all(&dir);
    let done = latencies.len();
    // The runs the store holds from this scenario: the warm-up's and the measured ones.
    let stored_runs = done + warm;
    let stored = match (stored_before, stored_after?) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok(json!({
        "scenario": "S", "clients": clients, "requests_per_client": requests, "runs": done, "errors": errors, "stub_latency_ms": latency_ms, "journal": kind, "stream": stream,
        "wall_ms": round2(wall * 1e3), "runs_per_s": round2(done as f64 / wall), "latency_ms": stats(latencies),
        "server_idle_rss_mib": round2(rss_before as f64 / 1024.0), "server_peak_rss_mib": round2(peak as f64 / 1024.0),
        "server_rss_kib_per_inflight_run": round2(peak.saturating_sub(rss_before) as f64 / clients as f64),
        "stored_runs": stored_runs, "stored_bytes": stored,
        "stored_bytes_per_run": stored.map(|b| round2(b as f64 / stored_runs.max(1) as f64)),
        "meta": meta(),
    }))
}

/// What the store at `url` holds, in bytes: a SQLite file with its `-wal` once the WAL is
/// checkpointed into it (`PRAGMA wal_checkpoint(TRUNCATE)`; 0 when there is no file yet; run
/// it only while no service has the file open), a PostgreSQL database's
/// `pg_database_size(current_database())`; `None` for an in-memory SQLite store, which lives
/// and dies in the service's process. Errors name the store without its credentials.
async fn stored_bytes(url: &str) -> Result<Option<u64>, String> {
    use sqlx::{ConnectOptions, Connection};
    let here = fabric::redact::redact_url(url);
    if url.starts_with("sqlite:") {
        if url.contains(":memory:") {
            return Ok(None);
        }
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).map_err(|e| format!("`{here}`: {e}"))?;
        let file = options.get_filename().to_owned();
        if !file.exists() {
            return Ok(Some(0));
        }
        let mut conn = options.create_if_missing(false).connect().await.map_err(|e| format!("cannot open {}: {e}", file.display()))?;
        // A process that just let go of the file (a killed replica of R) may hold it a moment.
        let mut tries = 0;
        loop {
            let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| format!("checkpointing the WAL of {}: {e}", file.display()))?;
            if busy == 0 {
                break;
            }
            tries += 1;
            if tries == 50 {
                return Err(format!("the WAL checkpoint of {} was blocked for 5 s (is a service still using the file?)", file.display()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        conn.close().await.map_err(|e| format!("closing {}: {e}", file.display()))?;
        let mut wal = file.clone().into_os_string();
        wal.push("-wal");
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len());
        let db = size(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let wal = size(Path::new(&wal)).unwrap_or(0);
        return Ok(Some(db + wal));
    }
    let mut conn = sqlx::PgConnection::connect(url).await.map_err(|e| format!("cannot connect to {here}: {e}"))?;
    let size: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("the size of the database at {here}: {e}"))?;
    let _ = conn.close().await;
    Ok(Some(u64::try_from(size).unwrap_or(0)))
}
