//! What a result looks like to a person: one line of the human table (stderr) per JSON result
//! (stdout), and the printing of both.

use std::io::Write;

use serde_json::Value;

/// Prints a result: its JSON line on stdout, its table line on stderr. A closed stdout ends the
/// benchmark with an error, never a panic.
pub fn emit(result: &Value) -> Result<(), String> {
    writeln!(std::io::stdout(), "{result}").map_err(|e| format!("cannot write the results: {e}"))?;
    let _ = writeln!(std::io::stderr(), "{}", table_line(result));
    Ok(())
}

/// The human table's line of a result.
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
            "S       runs {:>6}  ({} clients)  {:>8.0} runs/s  latency p50 {:.1} ms  p99 {:.1} ms  errors {}  server RSS idle {:.1} MiB, peak {:.1} MiB: {:.1} KiB/in-flight run  stored {}  ({} journal)",
            v["runs"].as_u64().unwrap_or(0),
            v["clients"].as_u64().unwrap_or(0),
            v["runs_per_s"].as_f64().unwrap_or(0.0),
            v["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            v["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
            v["errors"].as_u64().unwrap_or(0),
            v["server_idle_rss_mib"].as_f64().unwrap_or(0.0),
            v["server_peak_rss_mib"].as_f64().unwrap_or(0.0),
            v["server_rss_kib_per_inflight_run"].as_f64().unwrap_or(0.0),
            v["stored_bytes_per_run"].as_f64().map_or("n/a".to_owned(), |b| format!("{b:.0} B/run")),
            v["journal"].as_str().unwrap_or("?")
        ),
        "H" => format!(
            "H       routes {:>5}  load+validate+hydrate {:.1} ms  {:.1} µs/route",
            v["routes"],
            v["ms_total"].as_f64().unwrap_or(0.0),
            v["us_per_route"].as_f64().unwrap_or(0.0)
        ),
        "T" => format!(
            "T       runs {:>6}  first delta after the provider's first text: p50 {:.0} µs  p99 {:.0} µs  (bare client: p50 {:.0} µs)  (a chunk every {} ms)  failed {}",
            v["runs"].as_u64().unwrap_or(0),
            v["first_delta_after_first_text_us"]["p50"].as_f64().unwrap_or(0.0),
            v["first_delta_after_first_text_us"]["p99"].as_f64().unwrap_or(0.0),
            v["bare_client_after_first_text_us"]["p50"].as_f64().unwrap_or(0.0),
            v["chunk_every_ms"].as_u64().unwrap_or(0),
            v["failed_runs"].as_u64().unwrap_or(0)
        ),
        _ => format!("{s:<7} {}", v.get("skipped").or(v.get("error")).and_then(Value::as_str).unwrap_or("")),
    }
}
