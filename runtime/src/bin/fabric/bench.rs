//! `fabric bench`: the scenarios of BENCH.md, with the seeded stub and scripted replies.
//!
//! Each scenario prints one JSON object on stdout and a line of the human table on stderr.
//! Figures are reported, never asserted: speed targets live here and in `docs/performance.md`,
//! not in tests. The loopback tool server runs as its own process (`fabric tool-server`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::io::AsyncBufReadExt;

use fabric::cancel::Cancel;
use fabric::catalogue::{self, Catalogue, SourceFile};
use fabric::config::Settings;
use fabric::events::NullSink;
use fabric::exec::{RunRequest, RunStatus};
use fabric::llm::stub::StubLlm;
use fabric::runtime::{Runtime, StartRequest};

/// The BENCH.md routes: `staged` (three structured stages) and `loop` / `loop-http` (the decision loop
/// with the `add` tool in process, or over HTTP on loopback).
const CATALOGUE: &str = r#"
profiles:
  bench: {}
capabilities:
  classify_ticket:
    output_schema:
      type: object
      properties:
        category: {type: string, enum: [billing, technical, other]}
        urgency: {type: string, enum: [low, high]}
      required: [category, urgency]
  kb_search:
    output_schema: {type: object, properties: {query: {type: string}}, required: [query]}
    invoke: {url: "${BENCH_TOOL_URL}/search", timeout_ms: 30000}
  answer_text:
    output_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  add:
    description: Add two numbers.
    input_schema: {type: object, properties: {a: {type: number}, b: {type: number}}, required: [a, b]}
  add_http:
    description: Add two numbers.
    input_schema: {type: object, properties: {a: {type: number}, b: {type: number}}, required: [a, b]}
    invoke: {url: "${BENCH_TOOL_URL}/add", timeout_ms: 30000}
workflows:
  staged:
    stages:
      - {id: intake, llm_role: classify, capability: classify_ticket}
      - {id: lookup, llm_role: query_formulation, capability: kb_search}
      - {id: answer, llm_role: synthesis, capability: answer_text}
routes:
  staged: {model_profile: bench, prompt_pack: bench, workflow: staged}
  loop: {model_profile: bench, prompt_pack: bench, decision_loop: {tools: [add]}}
  loop-http: {model_profile: bench, prompt_pack: bench, decision_loop: {tools: [add_http]}}
"#;

const PACK: &str = "host: You are the support desk assistant. Be accurate and brief.\nroles:\n  classify: \"{{host}} Classify the ticket.\"\n";

/// The staged route's script as a stub file (scenario S runs it in the service process).
const STAGED_SCRIPT: &str = "stages:\n  intake: ['{\"category\":\"billing\",\"urgency\":\"high\"}']\n  lookup: ['{\"query\":\"duplicate subscription charge refund\"}']\n  answer: ['{\"text\":\"You were charged twice; the duplicate charge has been refunded.\"}']\n";

fn stub(latency: Duration) -> StubLlm {
    StubLlm::default()
        .with_latency(latency)
        .script("staged", "intake", &[r#"{"category":"billing","urgency":"high"}"#])
        .script("staged", "lookup", &[r#"{"query":"duplicate subscription charge refund"}"#])
        .script("staged", "answer", &[r#"{"text":"You were charged twice; the duplicate charge has been refunded."}"#])
        .script("loop", "decide", &[r#"CALL add {"a":2,"b":3}"#, r#"CALL add {"a":5,"b":7}"#, "DONE 12"])
        .script("loop-http", "decide", &[r#"CALL add_http {"a":2,"b":3}"#, r#"CALL add_http {"a":5,"b":7}"#, "DONE 12"])
}

fn bench_catalogue() -> Arc<Catalogue> {
    let files = [SourceFile { path: PathBuf::from("bench/catalogue.yaml"), text: CATALOGUE.to_owned() }];
    let packs = [SourceFile { path: PathBuf::from("bench/bench.yaml"), text: PACK.to_owned() }];
    Arc::new(catalogue::load_from_texts(&files, &packs))
}

/// The runtime every scenario drives: the library facade, as `fabric run` and the service use it.
fn runner(latency: Duration, tool_url: Option<String>) -> Result<Runtime, String> {
    // Default settings, whatever the environment says: the figures must not depend on it.
    let settings = Settings::load(|_| None).map_err(|e| e.to_string())?;
    Runtime::builder()
        .settings(settings)
        .catalogue(bench_catalogue())
        .stub(stub(latency))
        .vars(move |k: &str| if k == "BENCH_TOOL_URL" { tool_url.clone() } else { None })
        .tool("add", fabric::tools::builtin_add())
        .build()
        .map_err(|e| e.to_string())
}

/// Options of `fabric bench`.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub scenarios: Vec<Scenario>,
    /// Runs of the sequential scenarios (A, B, B-http).
    pub runs: usize,
    pub warmup: usize,
    /// Concurrency levels of scenario C.
    pub concurrency: Vec<usize>,
    /// Stub latency of scenario C (the sequential ones use 0 unless given).
    pub latency_ms: Option<u64>,
    /// Routes of scenario H.
    pub routes: usize,
    /// Scenario C without the tool call (diagnostic: the runtime's own cost under concurrency).
    pub no_tool: bool,
    /// Scenario C: seconds of `wrk` against the tool server alone before each level (the
    /// tool server's capacity, and the floor it sets).
    pub ceiling_secs: Option<u64>,
    /// Serialise every event as a JSON line (to a discarding writer) instead of having no consumer.
    pub events: bool,
    /// Scenario S: concurrent clients, and requests each makes.
    pub clients: usize,
    pub requests: usize,
    /// The store URL of scenarios A2 and C2 (`None`: a fresh SQLite file) and R (required:
    /// replicas share one database).
    pub journal: Option<String>,
    /// Scenario R: replica counts, and the runs they share.
    pub replicas: Vec<usize>,
    /// The sequential scenarios skip their per-run timings (`--instructions` counts the runs,
    /// not the bench's clock reads and percentile sort).
    pub untimed: bool,
}

fn sink(opts: &BenchOptions) -> Arc<dyn fabric::events::EventSink> {
    if opts.events { Arc::new(fabric::events::JsonLinesSink::new(Box::new(std::io::sink()))) } else { Arc::new(NullSink) }
}

pub const SCENARIOS: &[Scenario] = &[Scenario::A, Scenario::A2, Scenario::B, Scenario::BHttp, Scenario::C, Scenario::C2, Scenario::H, Scenario::R, Scenario::S];

/// A scenario of BENCH.md, spelled as `--scenario` takes it and as the JSON results name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    #[value(name = "A")]
    A,
    #[value(name = "A2")]
    A2,
    #[value(name = "B")]
    B,
    #[value(name = "B-http")]
    BHttp,
    #[value(name = "C")]
    C,
    #[value(name = "C2")]
    C2,
    #[value(name = "H")]
    H,
    #[value(name = "R")]
    R,
    #[value(name = "S")]
    S,
}

impl Scenario {
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::A => "A",
            Scenario::A2 => "A2",
            Scenario::B => "B",
            Scenario::BHttp => "B-http",
            Scenario::C => "C",
            Scenario::C2 => "C2",
            Scenario::H => "H",
            Scenario::R => "R",
            Scenario::S => "S",
        }
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The CPU time the process has used, in ns: every thread's, those that ended included (a sum over
/// the live threads went backwards when a previous scenario's store threads ended mid-measurement).
fn cpu_ns() -> u64 {
    let Ok(t) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID) else { return 0 };
    u64::try_from(t.tv_sec()).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn stats(mut samples: Vec<f64>) -> Value {
    samples.sort_by(|a, b| a.total_cmp(b));
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    json!({"mean": round2(mean), "p50": round2(percentile(&samples, 0.5)), "p99": round2(percentile(&samples, 0.99))})
}

fn meta() -> Value {
    json!({
        "fabric_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "date": &fabric::events::rfc3339_now()[..10],
    })
}

fn goal() -> Map<String, Value> {
    json!({"ticket": "I was charged twice for my subscription"}).as_object().cloned().unwrap_or_default()
}

/// A `fabric` child process that prints its URL first (the tool server, the service); killed
/// when dropped.
struct ToolServer {
    child: tokio::process::Child,
    url: String,
}

impl ToolServer {
    async fn start(exe: &Path) -> Result<ToolServer, String> {
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["tool-server", "--listen", "127.0.0.1:0"]);
        ToolServer::spawn(cmd, "the tool server").await
    }

    async fn spawn(mut cmd: tokio::process::Command, what: &str) -> Result<ToolServer, String> {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true).spawn().map_err(|e| format!("cannot start {what}: {e}"))?;
        let stdout = child.stdout.take().ok_or(format!("{what} has no stdout"))?;
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(20), tokio::io::BufReader::new(stdout).read_line(&mut line))
            .await
            .map_err(|_| format!("{what} did not start in 20 s"))?
            .map_err(|e| format!("reading the address of {what}: {e}"))?;
        Ok(ToolServer { child, url: line.trim().to_owned() })
    }
}

/// A2: scenario A with every run recorded in a run store (a fresh SQLite file, or `--journal URL`), as the service
/// records them: accepted (a row), then journalled at every stage and at the end.
async fn journalled(opts: &BenchOptions) -> Result<Value, String> {
    let dir = std::env::temp_dir().join(format!("fabric-bench-a2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let url = opts.journal.clone().unwrap_or_else(|| format!("sqlite://{}/a2.db", dir.display()));
    let kind = if url.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    let store = fabric::store::open(&url).await.map_err(|e| e.to_string())?;
    let settings = Settings::load(|_| None).map_err(|e| e.to_string())?;
    let runtime = Runtime::builder()
        .settings(settings)
        .catalogue(bench_catalogue())
        .stub(stub(Duration::from_millis(opts.latency_ms.unwrap_or(0))))
        .store(store)
        .build()
        .map_err(|e| e.to_string())?;
    let sink = sink(opts);
    let req = StartRequest { route_id: "staged".into(), goal: goal(), model_profile: None, prefetch: vec![], session_id: None };
    let once = || async {
        let lease = runtime.accept(&req, true).await.map_err(|e| e.to_string())?.lease.ok_or("the run was not claimed")?;
        runtime.execute(&lease, &req, sink.clone(), Cancel::never()).await.map_err(|e| e.to_string())
    };
    for _ in 0..opts.warmup {
        once().await?;
    }
    let mut samples = Vec::with_capacity(opts.runs);
    let mut failed = 0;
    let cpu0 = cpu_ns();
    let wall0 = Instant::now();
    for _ in 0..opts.runs {
        let t = (!opts.untimed).then(Instant::now);
        let r = once().await?;
        if let Some(t) = t {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        if r.result.status() != RunStatus::Completed {
            failed += 1;
        }
    }
    let wall = wall0.elapsed().as_secs_f64();
    let cpu_us = cpu_ns().saturating_sub(cpu0) as f64 / 1e3 / opts.runs.max(1) as f64;
    let per_stage: Vec<f64> = samples.iter().map(|s| s / 3.0).collect();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "scenario": "A2", "route": "staged", "runs": opts.runs, "failed_runs": failed, "journal": kind, "events": if opts.events { "json" } else { "none" },
        "runs_per_s": round2(opts.runs as f64 / wall), "run_us": stats(samples), "stages_per_run": 3, "stages_us": stats(per_stage),
        "cpu_us_per_run": round2(cpu_us), "meta": meta(),
    }))
}

/// A store for a journalled scenario: `--journal URL`, or a fresh SQLite file in `dir`.
async fn bench_store(opts: &BenchOptions, dir: &Path) -> Result<(Arc<dyn fabric::store::RunStore>, &'static str), String> {
    let url = opts.journal.clone().unwrap_or_else(|| format!("sqlite://{}/bench.db", dir.display()));
    let kind = if url.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    Ok((fabric::store::open(&url).await.map_err(|e| e.to_string())?, kind))
}

/// C2: scenario C (no tool) with every run recorded as the service records it: accepted and
/// claimed (a row), journalled at every stage, its end committed; `c` runs at once.
async fn concurrent_journalled(c: usize, latency_ms: u64, opts: &BenchOptions) -> Result<Value, String> {
    let dir = std::env::temp_dir().join(format!("fabric-bench-c2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (store, kind) = bench_store(opts, &dir).await?;
    let settings = Settings::load(|_| None).map_err(|e| e.to_string())?;
    let runtime = Arc::new(
        Runtime::builder()
            .settings(settings)
            .catalogue(bench_catalogue())
            .stub(stub(Duration::from_millis(latency_ms)))
            .store(store)
            .build()
            .map_err(|e| e.to_string())?,
    );
    let sink = sink(opts);
    let req = Arc::new(StartRequest { route_id: "staged".into(), goal: goal(), model_profile: None, prefetch: vec![], session_id: None });
    let once = |runtime: Arc<Runtime>, req: Arc<StartRequest>, sink: Arc<dyn fabric::events::EventSink>| async move {
        let lease = runtime.accept(&req, true).await.map_err(|e| e.to_string())?.lease.ok_or("the run was not claimed")?;
        runtime.execute(&lease, &req, sink, Cancel::never()).await.map_err(|e| e.to_string())
    };
    for _ in 0..10 {
        once(runtime.clone(), req.clone(), sink.clone()).await?;
    }
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let handles: Vec<_> = (0..c).map(|_| tokio::spawn(once(runtime.clone(), req.clone(), sink.clone()))).collect();
    let mut failed = 0;
    for h in handles {
        if !matches!(h.await, Ok(Ok(ref r)) if r.result.status() == RunStatus::Completed) {
            failed += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let ideal_ms = 3.0 * latency_ms as f64;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "scenario": "C2", "route": "staged", "runs": c, "concurrency": c, "failed_runs": failed, "stub_latency_ms": latency_ms, "journal": kind,
        "events": if opts.events { "json" } else { "none" },
        "wall_ms": round2(wall * 1e3), "ideal_ms": ideal_ms, "wall_over_ideal": round2(wall * 1e3 / ideal_ms.max(1.0)),
        "runs_per_s": round2(c as f64 / wall), "cpu_us_per_run": round2(cpu_ns().saturating_sub(cpu0) as f64 / 1e3 / c as f64), "meta": meta(),
    }))
}

/// R: `replicas` `fabric serve` processes on one database (`--journal URL`) sharing `runs`
/// queued runs (stub at `latency_ms`, 64 run slots each): runs/s from the moment the runs are
/// queued to the moment the last one completed.
async fn replicated(exe: &Path, replicas: usize, runs: usize, latency_ms: u64, opts: &BenchOptions) -> Result<Value, String> {
    let Some(url) = opts.journal.clone() else {
        return Ok(json!({"scenario": "R", "skipped": "scenario R needs --journal URL (the database the replicas share)"}));
    };
    let dir = std::env::temp_dir().join(format!("fabric-bench-r-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = fabric::store::open(&url).await.map_err(|e| e.to_string())?;
    let mut servers = Vec::new();
    for _ in 0..replicas {
        let mut cmd = serve_command(exe, &dir, latency_ms, &url)?;
        cmd.env("FABRIC_MAX_RUNS_IN_FLIGHT", "64").env("FABRIC_CLAIM_POLL_MS", "20");
        servers.push(ToolServer::spawn(cmd, "a replica").await?);
    }
    let request = json!({"route_id": "staged", "goal": goal(), "model_profile": "bench"});
    let start = Instant::now();
    let ids: Vec<String> = (0..runs).map(|_| fabric::exec::new_run_id()).collect();
    let creates = ids.iter().map(|id| store.create_run(id, "staged", &request, None));
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
fn serve_command(exe: &Path, dir: &Path, latency_ms: u64, database_url: &str) -> Result<tokio::process::Command, String> {
    let (catalogue, packs, stub_dir) = (dir.join("routes"), dir.join("packs"), dir.join("stub"));
    for d in [&catalogue, &packs, &stub_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::write(catalogue.join("bench.yaml"), CATALOGUE)
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

/// S: `fabric serve` (stub at 50 ms, SQLite journal) in its own process, loaded from this one:
/// `clients` connections each posting `POST /v1/runs?wait=true` `requests` times.
async fn service(exe: &Path, clients: usize, requests: usize, latency_ms: u64) -> Result<Value, String> {
    let dir = std::env::temp_dir().join(format!("fabric-bench-s-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let token = BENCH_TOKEN;
    let mut cmd = serve_command(exe, &dir, latency_ms, &format!("sqlite://{}/s.db", dir.display()))?;
    cmd.env("FABRIC_MAX_RUNS_IN_FLIGHT", (clients * 2).to_string());
    let server = ToolServer::spawn(cmd, "the service").await?;
    let pid = server.child.id().unwrap_or(0);
    let client = reqwest::Client::builder().pool_max_idle_per_host(clients).build().map_err(|e| e.to_string())?;
    let url = format!("{}/v1/runs?wait=true", server.url);
    let body = json!({"route_id": "staged", "goal": goal(), "model_profile": "bench"});
    // Warm the server's connections and the store.
    for _ in 0..5 {
        let _ = client.post(&url).bearer_auth(token).json(&body).send().await;
    }
    let rss_before = proc_kib(pid, "VmRSS:").unwrap_or(0);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
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
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let done = latencies.len();
    Ok(json!({
        "scenario": "S", "clients": clients, "requests_per_client": requests, "runs": done, "errors": errors, "stub_latency_ms": latency_ms, "journal": "sqlite",
        "wall_ms": round2(wall * 1e3), "runs_per_s": round2(done as f64 / wall), "latency_ms": stats(latencies),
        "server_peak_rss_mib": round2(peak as f64 / 1024.0), "server_rss_kib_per_inflight_run": round2(peak.saturating_sub(rss_before) as f64 / clients as f64),
        "meta": meta(),
    }))
}

/// A field of another process's `/proc/PID/status`, in KiB.
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn sequential(name: &str, route: &str, stages: f64, opts: &BenchOptions, tool_url: Option<String>) -> Result<Value, String> {
    let runner = runner(Duration::from_millis(opts.latency_ms.unwrap_or(0)), tool_url)?;
    let sink = sink(opts);
    let req = RunRequest { route_id: route.into(), goal: goal(), prefetch: vec![] };
    let (runs, warmup, timed) = (opts.runs, opts.warmup, !opts.untimed);
    // The runs execute in a task on the runtime's workers, as the service executes them (and as
    // `fabric run` does): not on the thread blocked in `block_on`, from which every wake-up of
    // the HTTP client's connection task would cross threads.
    let measured = tokio::spawn(async move {
        for _ in 0..warmup {
            let _ = runner.run(req.clone(), sink.clone(), Cancel::never()).await;
        }
        let mut samples = Vec::with_capacity(runs);
        let mut failed = 0;
        let cpu0 = cpu_ns();
        let wall0 = Instant::now();
        for _ in 0..runs {
            let t = timed.then(Instant::now);
            let r = runner.run(req.clone(), sink.clone(), Cancel::never()).await;
            if let Some(t) = t {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
            if !matches!(r, Ok(ref r) if r.result.status() == RunStatus::Completed) {
                failed += 1;
            }
        }
        (samples, failed, wall0.elapsed().as_secs_f64(), cpu_ns().saturating_sub(cpu0))
    });
    let (samples, failed, wall, cpu_ns_total) = measured.await.map_err(|e| format!("the measured runs stopped: {e}"))?;
    let cpu_us = cpu_ns_total as f64 / 1e3 / opts.runs.max(1) as f64;
    let per_stage: Vec<f64> = samples.iter().map(|s| s / stages).collect();
    Ok(json!({
        "scenario": name, "route": route, "runs": opts.runs, "failed_runs": failed, "stub_latency_ms": opts.latency_ms.unwrap_or(0), "events": if opts.events { "json" } else { "none" },
        "runs_per_s": round2(opts.runs as f64 / wall), "run_us": stats(samples), "stages_per_run": stages, "stages_us": stats(per_stage),
        "cpu_us_per_run": round2(cpu_us), "meta": meta(),
    }))
}

async fn concurrent(c: usize, latency_ms: u64, tool_url: Option<String>, opts: &BenchOptions) -> Result<Value, String> {
    let tool = tool_url.is_some();
    let runner = Arc::new(runner(Duration::from_millis(latency_ms), tool_url)?);
    let sink = sink(opts);
    // Warm the connection pool and the allocator a little.
    for _ in 0..10 {
        let _ = runner.run(RunRequest { route_id: "staged".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await;
    }
    // Reset the peak RSS so VmHWM reflects this scenario only.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss0 = status_kib("VmRSS:").unwrap_or(0);
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(c);
    for _ in 0..c {
        let runner = runner.clone();
        let sink = sink.clone();
        handles.push(tokio::spawn(
            async move { runner.run(RunRequest { route_id: "staged".into(), goal: goal(), prefetch: vec![] }, sink, Cancel::never()).await },
        ));
    }
    let mut failed = 0;
    for h in handles {
        if !matches!(h.await, Ok(Ok(ref r)) if r.result.status() == RunStatus::Completed) {
            failed += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:").unwrap_or(0);
    let ideal_ms = 3.0 * latency_ms as f64;
    Ok(json!({
        "scenario": "C", "route": "staged", "runs": c, "concurrency": c, "failed_runs": failed, "stub_latency_ms": latency_ms, "tool_url": tool, "events": if opts.events { "json" } else { "none" },
        "wall_ms": round2(wall * 1e3), "ideal_ms": ideal_ms, "wall_over_ideal": round2(wall * 1e3 / ideal_ms.max(1.0)),
        "runs_per_s": round2(c as f64 / wall), "peak_rss_mib": round2(peak as f64 / 1024.0),
        "rss_kib_per_inflight_run": round2(peak.saturating_sub(rss0) as f64 / c as f64),
        "cpu_us_per_run": round2(cpu_ns().saturating_sub(cpu0) as f64 / 1e3 / c as f64), "meta": meta(),
    }))
}

/// The tool server's capacity, measured alone: `wrk` (a separate load generator, one thread)
/// sends the `lookup` stage's request over as many connections as the runtime opens to one
/// origin, for `secs` seconds; requests per second.
async fn tool_server_capacity(url: &str, secs: u64) -> Result<Value, String> {
    let connections = fabric::tools::MAX_IN_FLIGHT_PER_ORIGIN;
    let target = format!("{url}/search?q=duplicate+subscription+charge+refund");
    let args = ["-t1".to_owned(), format!("-c{connections}"), format!("-d{}s", secs.max(1)), target];
    let out = tokio::process::Command::new("wrk")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("--ceiling needs wrk (the load generator) on PATH: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| text.lines().find_map(|l| l.trim().strip_prefix(name)).map(str::trim);
    let rps = field("Requests/sec:").and_then(|v| v.parse::<f64>().ok());
    let errors = field("Non-2xx or 3xx responses:").or_else(|| text.lines().find(|l| l.contains("Socket errors:")).map(str::trim));
    match rps {
        Some(rps) if out.status.success() && rps > 0.0 && errors.is_none() => Ok(json!({
            "load_generator": format!("wrk {}", args[..3].join(" ")), "requests_per_s": round2(rps),
        })),
        _ => Err(format!(
            "wrk against the tool server gave no clean figure (exit {:?}{}); its output: {}",
            out.status.code(),
            errors.map(|e| format!(", {e}")).unwrap_or_default(),
            text.trim()
        )),
    }
}

/// Adds the floor the tool server's capacity sets to a level of scenario C: the ideal plus the
/// time the server alone needs for the level's tool calls (one per run, all between the second
/// and the third model call), and the wall time against it.
fn with_floor(result: &mut Value, c: usize, mut capacity: Value) {
    let rps = capacity["requests_per_s"].as_f64().unwrap_or(0.0);
    let ideal = result["ideal_ms"].as_f64().unwrap_or(0.0);
    let floor = ideal + c as f64 / rps.max(1.0) * 1e3;
    capacity["floor_ms"] = json!(round2(floor));
    result["wall_over_floor"] = json!(round2(result["wall_ms"].as_f64().unwrap_or(0.0) / floor.max(1.0)));
    result["tool_server"] = capacity;
}

/// Writes `n` generated routes (one file each, with their own workflow) plus shared capabilities.
fn generate_catalogue(dir: &Path, n: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("routes"))?;
    std::fs::create_dir_all(dir.join("packs"))?;
    std::fs::write(dir.join("packs/bench.yaml"), PACK)?;
    let shared = CATALOGUE.split("workflows:").next().unwrap_or_default();
    std::fs::write(dir.join("routes/shared.yaml"), shared)?;
    for i in 0..n {
        let text = format!(
            "workflows:\n  wf-{i}:\n    stages:\n      - {{id: intake, llm_role: classify, capability: classify_ticket, branches: [{{when: {{slot: intake.urgency, equals: high}}, goto: answer}}, {{goto: lookup}}]}}\n      - {{id: lookup, llm_role: query_formulation, capability: kb_search}}\n      - {{id: answer, llm_role: synthesis, capability: answer_text}}\nroutes:\n  route-{i}:\n    description: Generated route {i}.\n    model_profile: bench\n    prompt_pack: bench\n    workflow: wf-{i}\n    activation_target: fleet-{}\n",
            i % 4
        );
        std::fs::write(dir.join(format!("routes/route-{i:05}.yaml")), text)?;
    }
    Ok(())
}

fn catalogue_load(n: usize) -> Value {
    let dir = std::env::temp_dir().join(format!("fabric-bench-h-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = generate_catalogue(&dir, n) {
        return json!({"scenario": "H", "error": format!("cannot write the generated catalogue: {e}")});
    }
    let mut samples = Vec::new();
    let mut routes = 0;
    let mut errors = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let cat = catalogue::load(&dir.join("routes"), &dir.join("packs"));
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        routes = cat.routes().filter(|r| matches!(r, catalogue::RouteEntry::Ready(_))).count();
        errors = cat.error_count();
    }
    let _ = std::fs::remove_dir_all(&dir);
    samples.sort_by(|a, b| a.total_cmp(b));
    // The best of five: the file cache is warm after the first, as on a running fleet.
    let best = samples[0];
    json!({
        "scenario": "H", "routes": n, "routes_ready": routes, "errors": errors, "ms_total": round2(best),
        "ms_total_first": round2(samples.iter().copied().fold(f64::NAN, f64::max)), "us_per_route": round2(best * 1e3 / n as f64), "meta": meta(),
    })
}

fn table_line(v: &Value) -> String {
    let s = v["scenario"].as_str().unwrap_or("?");
    // A skipped or failed scenario says why, whatever its kind (not a row of zeros).
    if let Some(why) = v.get("skipped").or(v.get("error")).and_then(Value::as_str) {
        return format!("{s:<7} {why}");
    }
    match s {
        "A" | "A2" | "B" | "B-http" => format!(
            "{s:<7} runs {:>6}  {:>9.0} runs/s  run mean {:>8.1} µs  p50 {:>8.1}  p99 {:>8.1}  stage mean {:>7.1} µs  cpu {:>8.1} µs/run{}",
            v["runs"].as_u64().unwrap_or(0),
            v["runs_per_s"].as_f64().unwrap_or(0.0),
            v["run_us"]["mean"].as_f64().unwrap_or(0.0),
            v["run_us"]["p50"].as_f64().unwrap_or(0.0),
            v["run_us"]["p99"].as_f64().unwrap_or(0.0),
            v["stages_us"]["mean"].as_f64().unwrap_or(0.0),
            v["cpu_us_per_run"].as_f64().unwrap_or(0.0),
            v["journal"].as_str().map(|j| format!(" ({j} journal)")).unwrap_or_default()
        ),
        "C2" => format!(
            "C2      runs {:>6}  wall {:>8.1} ms (ideal {:.0}, x{:.2})  {:>8.0} runs/s  cpu {:.1} µs/run ({} journal)",
            v["runs"].as_u64().unwrap_or(0),
            v["wall_ms"].as_f64().unwrap_or(0.0),
            v["ideal_ms"].as_f64().unwrap_or(0.0),
            v["wall_over_ideal"].as_f64().unwrap_or(0.0),
            v["runs_per_s"].as_f64().unwrap_or(0.0),
            v["cpu_us_per_run"].as_f64().unwrap_or(0.0),
            v["journal"].as_str().unwrap_or("?")
        ),
        "R" => format!(
            "R       replicas {}  runs {:>6}  completed {}  {:>8.0} runs/s (slots allow {:.0})  wall {:.1} ms  ({} store)",
            v["replicas"].as_u64().unwrap_or(0),
            v["runs"].as_u64().unwrap_or(0),
            v["completed"].as_u64().unwrap_or(0),
            v["runs_per_s"].as_f64().unwrap_or(0.0),
            v["ideal_runs_per_s"].as_f64().unwrap_or(0.0),
            v["wall_ms"].as_f64().unwrap_or(0.0),
            v["journal"].as_str().unwrap_or("?")
        ),
        "C" => {
            format!(
                "C       runs {:>6}  wall {:>8.1} ms (ideal {:.0}, x{:.2})  {:>8.0} runs/s  peak RSS {:.1} MiB  {:.1} KiB/run  cpu {:.1} µs/run",
                v["runs"].as_u64().unwrap_or(0),
                v["wall_ms"].as_f64().unwrap_or(0.0),
                v["ideal_ms"].as_f64().unwrap_or(0.0),
                v["wall_over_ideal"].as_f64().unwrap_or(0.0),
                v["runs_per_s"].as_f64().unwrap_or(0.0),
                v["peak_rss_mib"].as_f64().unwrap_or(0.0),
                v["rss_kib_per_inflight_run"].as_f64().unwrap_or(0.0),
                v["cpu_us_per_run"].as_f64().unwrap_or(0.0)
            ) + &v["tool_server"]["floor_ms"]
                .as_f64()
                .map(|floor| {
                    format!(
                        "  tool server alone {:.0} req/s: floor {floor:.1} ms, x{:.2} of it",
                        v["tool_server"]["requests_per_s"].as_f64().unwrap_or(0.0),
                        v["wall_over_floor"].as_f64().unwrap_or(0.0)
                    )
                })
                .unwrap_or_default()
        }
        "S" => format!(
            "S       runs {:>6}  ({} clients)  {:>8.0} runs/s  latency p50 {:.1} ms  p99 {:.1} ms  errors {}  server peak RSS {:.1} MiB  {:.1} KiB/in-flight run",
            v["runs"].as_u64().unwrap_or(0),
            v["clients"].as_u64().unwrap_or(0),
            v["runs_per_s"].as_f64().unwrap_or(0.0),
            v["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            v["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            v["errors"].as_u64().unwrap_or(0),
            v["server_peak_rss_mib"].as_f64().unwrap_or(0.0),
            v["server_rss_kib_per_inflight_run"].as_f64().unwrap_or(0.0)
        ),
        "H" => format!(
            "H       routes {:>5}  load+validate+hydrate {:.1} ms  {:.1} µs/route",
            v["routes"],
            v["ms_total"].as_f64().unwrap_or(0.0),
            v["us_per_route"].as_f64().unwrap_or(0.0)
        ),
        _ => format!("{s:<7} {}", v.get("skipped").or(v.get("error")).and_then(Value::as_str).unwrap_or("")),
    }
}

/// Runs the chosen scenarios; each result is printed as it completes.
/// The scenarios `--instructions` counts by default.
pub const INSTRUCTION_SCENARIOS: &[Scenario] = &[Scenario::A, Scenario::B, Scenario::BHttp];

/// `fabric bench --instructions`: each scenario under `valgrind --tool=callgrind` at `runs / 2`
/// and `runs` runs (same warm-up); the difference in instructions divided by the difference in
/// runs is the marginal cost of one run, start-up and warm-up excluded. Instruction counts do
/// not depend on the machine's speed or load, so these figures compare across machines. Only
/// the runtime's process is counted (the tool server of B-http is a process of its own). With
/// both B and B-http, one HTTP tool call is (B-http − B) / 2: the loop route makes two.
pub async fn instructions(opts: BenchOptions, exe: &Path) -> Result<(), String> {
    if opts.runs < 2 {
        return Err("--instructions needs --runs of at least 2".into());
    }
    let (low, high) = (opts.runs / 2, opts.runs);
    let mut per_run: Vec<(&str, f64)> = Vec::new();
    for &scenario in &opts.scenarios {
        if !matches!(scenario, Scenario::A | Scenario::A2 | Scenario::B | Scenario::BHttp) {
            return Err(format!("--instructions counts the sequential scenarios A, A2, B and B-http, not `{scenario}`"));
        }
        let mut counts = Vec::new();
        for runs in [low, high] {
            counts.push(callgrind(exe, scenario, runs, &opts).await?);
        }
        let marginal = (counts[1] as f64 - counts[0] as f64) / (high - low) as f64;
        per_run.push((scenario.as_str(), marginal));
        let r = json!({
            "scenario": scenario.as_str(), "measure": "instructions", "tool": "valgrind --tool=callgrind",
            "runs": [low, high], "instructions": counts, "instructions_per_run": marginal.round(),
            "events": if opts.events { "json" } else { "none" }, "meta": meta(),
        });
        writeln!(std::io::stdout(), "{r}").map_err(|e| format!("cannot write the results: {e}"))?;
        let _ = writeln!(std::io::stderr(), "{scenario:<8} {:>10.0} instructions per run ({low} → {high} runs)", marginal);
    }
    let find = |name: &str| per_run.iter().find(|(s, _)| *s == name).map(|(_, v)| *v);
    if let (Some(b), Some(http)) = (find("B"), find("B-http")) {
        let call = (http - b) / 2.0;
        let r = json!({"scenario": "B-http-call", "measure": "instructions", "instructions_per_call": call.round(), "meta": meta()});
        writeln!(std::io::stdout(), "{r}").map_err(|e| format!("cannot write the results: {e}"))?;
        let _ = writeln!(std::io::stderr(), "{:<8} {call:>10.0} instructions per HTTP tool call ((B-http − B) / 2)", "call");
    }
    Ok(())
}

/// The instructions `fabric bench --scenario S --runs N` executes under callgrind.
async fn callgrind(exe: &Path, scenario: Scenario, runs: usize, opts: &BenchOptions) -> Result<u64, String> {
    let out_file = std::env::temp_dir().join(format!("fabric-callgrind-{}-{scenario}-{runs}.out", std::process::id()));
    let mut cmd = tokio::process::Command::new("valgrind");
    cmd.arg("--tool=callgrind").arg(format!("--callgrind-out-file={}", out_file.display())).arg(exe);
    cmd.args(["bench", "--untimed", "--scenario", scenario.as_str(), "--runs", &runs.to_string(), "--warmup", &opts.warmup.min(100).to_string()]);
    if opts.events {
        cmd.arg("--events");
    }
    if let Some(j) = &opts.journal {
        cmd.args(["--journal", j]);
    }
    if let Some(ms) = opts.latency_ms {
        cmd.args(["--latency-ms", &ms.to_string()]);
    }
    cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
    let output = match cmd.output().await {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("valgrind is not installed (Debian: apt-get install valgrind)".into());
        }
        Err(e) => return Err(format!("cannot start valgrind: {e}")),
    };
    let _ = std::fs::remove_file(&out_file);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!("scenario {scenario} under callgrind failed: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | ")));
    }
    // `==PID== Collected : 123,456,789`
    stderr
        .lines()
        .find_map(|l| l.split_once("Collected :").map(|(_, n)| n.trim().replace(',', "")))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("callgrind printed no instruction count for scenario {scenario}"))
}

pub async fn run(opts: BenchOptions, exe: &Path) -> Result<(), String> {
    if cfg!(debug_assertions) {
        let _ = writeln!(std::io::stderr(), "fabric bench: this is a debug build; figures are only meaningful with --release");
    }
    let needs_server = opts.scenarios.iter().any(|s| matches!(s, Scenario::BHttp | Scenario::C));
    let server = if needs_server { Some(ToolServer::start(exe).await?) } else { None };
    let url = server.as_ref().map(|s| s.url.clone());
    for scenario in &opts.scenarios {
        let results: Vec<Value> = match scenario {
            Scenario::A => vec![sequential("A", "staged", 3.0, &opts, None).await?],
            Scenario::B => vec![sequential("B", "loop", 5.0, &opts, None).await?],
            Scenario::BHttp => vec![sequential("B-http", "loop-http", 5.0, &opts, url.clone()).await?],
            Scenario::C => {
                let mut out = Vec::new();
                for &c in &opts.concurrency {
                    let tool = if opts.no_tool { None } else { url.clone() };
                    let capacity = match (opts.ceiling_secs, &tool) {
                        (Some(secs), Some(url)) => Some(tool_server_capacity(url, secs).await?),
                        _ => None,
                    };
                    let mut result = concurrent(c, opts.latency_ms.unwrap_or(50), tool, &opts).await?;
                    if let Some(capacity) = capacity {
                        with_floor(&mut result, c, capacity);
                    }
                    out.push(result);
                }
                out
            }
            Scenario::H => vec![catalogue_load(opts.routes)],
            Scenario::A2 => vec![journalled(&opts).await?],
            Scenario::C2 => {
                let mut out = Vec::new();
                for &c in &opts.concurrency {
                    out.push(concurrent_journalled(c, opts.latency_ms.unwrap_or(50), &opts).await?);
                }
                out
            }
            Scenario::R if opts.journal.is_none() => {
                vec![json!({"scenario": "R", "skipped": "scenario R needs --journal URL (the database the replicas share)"})]
            }
            Scenario::R => {
                let mut out = Vec::new();
                for &n in &opts.replicas {
                    out.push(replicated(exe, n, opts.runs, opts.latency_ms.unwrap_or(50), &opts).await?);
                }
                out
            }
            Scenario::S => vec![service(exe, opts.clients, opts.requests, opts.latency_ms.unwrap_or(50)).await?],
        };
        for r in results {
            // A closed stdout ends the benchmark with an error, never a panic.
            writeln!(std::io::stdout(), "{r}").map_err(|e| format!("cannot write the results: {e}"))?;
            let _ = writeln!(std::io::stderr(), "{}", table_line(&r));
        }
    }
    Ok(())
}
