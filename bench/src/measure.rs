//! The figures' raw material: the process's CPU clock, `/proc` memory fields, percentiles, and
//! the `meta` object every result carries.

use serde_json::{Value, json};

/// The CPU time the process has used, in ns: every thread's, those that ended included (a sum over
/// the live threads went backwards when a previous scenario's store threads ended mid-measurement).
pub fn cpu_ns() -> u64 {
    let Ok(t) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID) else { return 0 };
    u64::try_from(t.tv_sec()).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
}

/// A field of this process's `/proc/self/status`, in KiB.
pub fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A field of another process's `/proc/PID/status`, in KiB.
pub fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Mean, median and 99th percentile of the samples.
pub fn stats(mut samples: Vec<f64>) -> Value {
    samples.sort_by(|a, b| a.total_cmp(b));
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    json!({"mean": round2(mean), "p50": round2(percentile(&samples, 0.5)), "p99": round2(percentile(&samples, 0.99))})
}

/// What was measured: the version (this crate shares the workspace's), the build, the machine.
pub fn meta() -> Value {
    json!({
        "fabric_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "date": &fabric::events::rfc3339_now()[..10],
    })
}
