//! `fabric-bench` run as a program. The scenarios' own tests run it through `fabric bench` (the
//! forwarder, `tests/e2e/cli.rs`); this package having an integration test is also what makes
//! `cargo test --workspace` build the `fabric-bench` executable beside `fabric` for them.

use std::process::Command;

use serde_json::Value;

#[test]
fn scenario_h_prints_its_json_line_and_its_table_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_fabric-bench")).args(["--scenario", "H", "--routes", "5"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!((lines[0]["scenario"].as_str(), lines[0]["routes_ready"].as_u64(), lines[0]["errors"].as_u64()), (Some("H"), Some(5), Some(0)));
    assert!(stderr.lines().any(|l| l.starts_with("H       routes 5  load+validate+hydrate")), "{stderr}");
}

#[test]
fn its_errors_read_as_fabric_bench_wrote_them() {
    let out = Command::new(env!("CARGO_BIN_EXE_fabric-bench")).args(["--instructions", "--runs", "1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "fabric: bench: --instructions needs --runs of at least 2\n");
}
