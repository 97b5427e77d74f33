//! `fabric-bench`: the scenarios of BENCH.md, with the seeded stub and scripted replies. `fabric
//! bench ARGS...` execs this program with the same arguments, so the shipped `fabric` binary
//! carries no benchmark code; what it needs of `fabric` (the tool server, the service) it runs
//! as the `fabric` executable ([`service::fabric_exe`]).
//!
//! Each scenario prints one JSON object on stdout and a line of the human table on stderr.
//! Figures are reported, never asserted: speed targets live here and in `docs/performance.md`,
//! not in tests. Modules, in one direction (`BENCH_LAYERS` in `tests/e2e/architecture.rs`):
//! `options` (arguments, scenarios), `measure` (clocks, `/proc`, percentiles), `output` (the
//! table), `fixture` (the bench catalogue and runtime), `ceiling` (`wrk`), `inprocess` (A, A2,
//! B, B-http, C, C2, H), `service` (the `fabric` processes: S, R), `instructions` (callgrind).

mod ceiling;
mod first_text;
mod fixture;
mod inprocess;
mod instructions;
mod measure;
mod options;
mod output;
mod service;

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use serde_json::{Value, json};

use options::{BenchOptions, Cli, Mode, Scenario};

/// The allocator of the `fabric` binary, so that what is measured is what ships (glibc's
/// malloc/free was a third of a staged run's instructions: `docs/performance.md`, issue 14).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let (mode, opts) = Cli::parse().into_options();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format_args!("cannot start the async runtime: {e}")),
    };
    let outcome = runtime.block_on(async {
        match mode {
            // Under callgrind this program runs itself, `--untimed`.
            Mode::Instructions => match std::env::current_exe() {
                Ok(me) => instructions::instructions(opts, &me).await,
                Err(e) => Err(format!("cannot find this program's executable: {e}")),
            },
            Mode::Measure => run(opts, &service::fabric_exe()).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format_args!("bench: {e}")),
    }
}

/// The message as `fabric` printed it when the bench was one of its commands, and its usage
/// exit code (2).
fn fail(message: std::fmt::Arguments<'_>) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "fabric: {message}");
    ExitCode::from(2)
}

/// Runs the chosen scenarios; each result is printed as it completes. `fabric` is the executable
/// of the tool server and the services.
async fn run(opts: BenchOptions, fabric: &Path) -> Result<(), String> {
    if cfg!(debug_assertions) {
        let _ = writeln!(std::io::stderr(), "fabric bench: this is a debug build; figures are only meaningful with --release");
    }
    let needs_server = opts.scenarios.iter().any(|s| matches!(s, Scenario::BHttp | Scenario::C));
    let server = if needs_server { Some(service::FabricProcess::start(fabric).await?) } else { None };
    let url = server.as_ref().map(|s| s.url.clone());
    let latency = opts.latency_ms.unwrap_or(50);
    for scenario in &opts.scenarios {
        let results: Vec<Value> = match scenario {
            Scenario::A => vec![inprocess::sequential("A", "staged", 3.0, &opts, None).await?],
            Scenario::B => vec![inprocess::sequential("B", "loop", 5.0, &opts, None).await?],
            Scenario::BHttp => vec![inprocess::sequential("B-http", "loop-http", 5.0, &opts, url.clone()).await?],
            Scenario::C => {
                let mut out = Vec::new();
                for &c in &opts.concurrency {
                    let tool = if opts.no_tool { None } else { url.clone() };
                    let capacity = match (opts.ceiling_secs, &tool) {
                        (Some(secs), Some(url)) => Some(ceiling::tool_server_capacity(url, secs).await?),
                        _ => None,
                    };
                    let mut result = inprocess::concurrent(c, latency, tool, &opts).await?;
                    if let Some(capacity) = capacity {
                        ceiling::with_floor(&mut result, c, capacity);
                    }
                    out.push(result);
                }
                out
            }
            Scenario::H => vec![inprocess::catalogue_load(opts.routes)],
            Scenario::A2 => vec![inprocess::journalled(&opts).await?],
            Scenario::C2 => {
                let mut out = Vec::new();
                for &c in &opts.concurrency {
                    out.push(inprocess::concurrent_journalled(c, latency, &opts).await?);
                }
                out
            }
            Scenario::R if opts.journal.is_none() => {
                vec![json!({"scenario": "R", "skipped": "scenario R needs --journal URL (the database the replicas share)"})]
            }
            Scenario::R => {
                let mut out = Vec::new();
                for &n in &opts.replicas {
                    out.push(service::replicated(fabric, n, opts.runs, latency, &opts).await?);
                }
                out
            }
            Scenario::T => vec![first_text::first_text(&opts).await?],
            Scenario::S => vec![service::service(fabric, opts.clients, opts.requests, latency, opts.journal.as_deref(), opts.stream).await?],
        };
        for r in &results {
            output::emit(r)?;
        }
    }
    Ok(())
}
