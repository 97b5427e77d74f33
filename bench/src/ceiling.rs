//! `--ceiling`: the tool server's capacity measured alone with `wrk`, and the floor it sets
//! under a level of scenario C.

use std::process::Stdio;

use serde_json::{Value, json};

use crate::measure::round2;

/// The tool server's capacity, measured alone: `wrk` (a separate load generator, one thread)
/// sends the `lookup` stage's request over as many connections as the runtime opens to one
/// origin, for `secs` seconds; requests per second.
pub async fn tool_server_capacity(url: &str, secs: u64) -> Result<Value, String> {
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
pub fn with_floor(result: &mut Value, c: usize, mut capacity: Value) {
    let rps = capacity["requests_per_s"].as_f64().unwrap_or(0.0);
    let ideal = result["ideal_ms"].as_f64().unwrap_or(0.0);
    let floor = ideal + c as f64 / rps.max(1.0) * 1e3;
    capacity["floor_ms"] = json!(round2(floor));
    result["wall_over_floor"] = json!(round2(result["wall_ms"].as_f64().unwrap_or(0.0) / floor.max(1.0)));
    result["tool_server"] = capacity;
}
