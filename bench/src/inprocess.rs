//! The scenarios that run in this process, on the library facade: A, B and B-http (one run after
//! the other), C (runs at once), A2 and C2 (the same, recorded in a run store), H (catalogue load).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use fabric::cancel::Cancel;
use fabric::catalogue;
use fabric::config::Settings;
use fabric::events::EventSink;
use fabric::exec::{RunRequest, RunStatus};
use fabric::runtime::{Durable, Runtime, StartRequest};

use crate::fixture::{bench_catalogue, generate_catalogue, goal, runner, sink, stub};
use crate::measure::{cpu_ns, meta, round2, stats, status_kib};
use crate::options::BenchOptions;

pub async fn sequential(name: &str, route: &str, stages: f64, opts: &BenchOptions, tool_url: Option<String>) -> Result<Value, String> {
    let runner = runner(Duration::from_millis(opts.latency_ms.unwrap_or(0)), tool_url, opts.stream)?;
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
        "scenario": name, "route": route, "runs": opts.runs, "failed_runs": failed, "stub_latency_ms": opts.latency_ms.unwrap_or(0), "events": opts.events_name(), "stream": opts.stream,
        "runs_per_s": round2(opts.runs as f64 / wall), "run_us": stats(samples), "stages_per_run": stages, "stages_us": stats(per_stage),
        "cpu_us_per_run": round2(cpu_us), "meta": meta(),
    }))
}

pub async fn concurrent(c: usize, latency_ms: u64, tool_url: Option<String>, opts: &BenchOptions) -> Result<Value, String> {
    let tool = tool_url.is_some();
    let runner = Arc::new(runner(Duration::from_millis(latency_ms), tool_url, opts.stream)?);
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
        "scenario": "C", "route": "staged", "runs": c, "concurrency": c, "failed_runs": failed, "stub_latency_ms": latency_ms, "tool_url": tool, "events": opts.events_name(), "stream": opts.stream,
        "wall_ms": round2(wall * 1e3), "ideal_ms": ideal_ms, "wall_over_ideal": round2(wall * 1e3 / ideal_ms.max(1.0)),
        "runs_per_s": round2(c as f64 / wall), "peak_rss_mib": round2(peak as f64 / 1024.0),
        "rss_kib_per_inflight_run": round2(peak.saturating_sub(rss0) as f64 / c as f64),
        "cpu_us_per_run": round2(cpu_ns().saturating_sub(cpu0) as f64 / 1e3 / c as f64), "meta": meta(),
    }))
}

/// The runtime of a journalled scenario: the bench catalogue and stub over a run store
/// (`--journal URL`, or a fresh SQLite file `file` in `dir`), and how the results name the store.
async fn journalled_runtime(opts: &BenchOptions, dir: &Path, file: &str, latency_ms: u64) -> Result<(Durable, &'static str), String> {
    let url = opts.journal.clone().unwrap_or_else(|| format!("sqlite://{}/{file}", dir.display()));
    let kind = if url.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    let store = fabric::store::open(&url).await.map_err(|e| e.to_string())?;
    let settings = Settings::load(|_| None).map_err(|e| e.to_string())?;
    let runtime = Runtime::builder()
        .settings(settings)
        .catalogue(bench_catalogue(opts.stream))
        .stub(stub(Duration::from_millis(latency_ms)))
        .build()
        .map_err(|e| e.to_string())?;
    Ok((Durable::new(runtime, store), kind))
}

/// A fresh scratch directory of this process for scenario `name`.
fn scratch(name: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("fabric-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// One run as the service records it: accepted and claimed (a row), journalled at every stage,
/// its end committed.
async fn recorded_run(runtime: &Durable, req: &StartRequest, sink: Arc<dyn EventSink>) -> Result<fabric::runtime::RunOutcome, String> {
    let accepted = runtime.accept(req, true).await.map_err(|e| e.to_string())?;
    let lease = accepted.lease.ok_or("the run was not claimed")?;
    runtime.execute(&lease, req, &accepted.edition, sink, Cancel::never()).await.map_err(|e| e.to_string())
}

fn staged_start() -> StartRequest {
    StartRequest { route_id: "staged".into(), goal: goal(), ..StartRequest::default() }
}

/// A2: scenario A with every run recorded in a run store (a fresh SQLite file, or `--journal URL`), as the service
/// records them: accepted (a row), then journalled at every stage and at the end.
pub async fn journalled(opts: &BenchOptions) -> Result<Value, String> {
    let dir = scratch("a2")?;
    let (runtime, kind) = journalled_runtime(opts, &dir, "a2.db", opts.latency_ms.unwrap_or(0)).await?;
    let sink = sink(opts);
    let req = staged_start();
    for _ in 0..opts.warmup {
        recorded_run(&runtime, &req, sink.clone()).await?;
    }
    let mut samples = Vec::with_capacity(opts.runs);
    let mut failed = 0;
    let cpu0 = cpu_ns();
    let wall0 = Instant::now();
    for _ in 0..opts.runs {
        let t = (!opts.untimed).then(Instant::now);
        let r = recorded_run(&runtime, &req, sink.clone()).await?;
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
        "scenario": "A2", "route": "staged", "runs": opts.runs, "failed_runs": failed, "journal": kind, "events": opts.events_name(), "stream": opts.stream,
        "runs_per_s": round2(opts.runs as f64 / wall), "run_us": stats(samples), "stages_per_run": 3, "stages_us": stats(per_stage),
        "cpu_us_per_run": round2(cpu_us), "meta": meta(),
    }))
}

/// C2: scenario C (no tool) with every run recorded as the service records it: accepted and
/// claimed (a row), journalled at every stage, its end committed; `c` runs at once.
pub async fn concurrent_journalled(c: usize, latency_ms: u64, opts: &BenchOptions) -> Result<Value, String> {
    let dir = scratch("c2")?;
    let (runtime, kind) = journalled_runtime(opts, &dir, "bench.db", latency_ms).await?;
    let runtime = Arc::new(runtime);
    let sink = sink(opts);
    let req = Arc::new(staged_start());
    for _ in 0..10 {
        recorded_run(&runtime, &req, sink.clone()).await?;
    }
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let handles: Vec<_> = (0..c)
        .map(|_| {
            let (runtime, req, sink) = (runtime.clone(), req.clone(), sink.clone());
            tokio::spawn(async move { recorded_run(&runtime, &req, sink).await })
        })
        .collect();
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
        "events": opts.events_name(), "stream": opts.stream,
        "wall_ms": round2(wall * 1e3), "ideal_ms": ideal_ms, "wall_over_ideal": round2(wall * 1e3 / ideal_ms.max(1.0)),
        "runs_per_s": round2(c as f64 / wall), "cpu_us_per_run": round2(cpu_ns().saturating_sub(cpu0) as f64 / 1e3 / c as f64), "meta": meta(),
    }))
}

/// H: `n` generated routes loaded, validated and hydrated, five times.
pub fn catalogue_load(n: usize) -> Value {
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
