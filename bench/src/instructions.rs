//! `fabric bench --instructions`: the sequential scenarios counted by valgrind's callgrind, this
//! program running itself under it.

use std::io::Write;
use std::path::Path;

use serde_json::json;

use crate::measure::meta;
use crate::options::{BenchOptions, Scenario};

/// Each scenario under `valgrind --tool=callgrind` at `runs / 2` and `runs` runs (same warm-up);
/// the difference in instructions divided by the difference in runs is the marginal cost of one
/// run, start-up and warm-up excluded. Instruction counts do not depend on the machine's speed
/// or load, so these figures compare across machines. Only the runtime's process is counted (the
/// tool server of B-http is a process of its own). With both B and B-http, one HTTP tool call is
/// (B-http − B) / 2: the loop route makes two. `exe` is this program.
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
            "events": opts.events_name(), "stream": opts.stream, "meta": meta(),
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

/// The instructions `fabric-bench --scenario S --runs N` executes under callgrind.
async fn callgrind(exe: &Path, scenario: Scenario, runs: usize, opts: &BenchOptions) -> Result<u64, String> {
    let out_file = std::env::temp_dir().join(format!("fabric-callgrind-{}-{scenario}-{runs}.out", std::process::id()));
    let mut cmd = tokio::process::Command::new("valgrind");
    cmd.arg("--tool=callgrind").arg(format!("--callgrind-out-file={}", out_file.display())).arg(exe);
    cmd.args(["--untimed", "--scenario", scenario.as_str(), "--runs", &runs.to_string(), "--warmup", &opts.warmup.min(100).to_string()]);
    if opts.events {
        cmd.arg("--events");
    }
    if !opts.stream {
        cmd.arg("--no-stream");
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
