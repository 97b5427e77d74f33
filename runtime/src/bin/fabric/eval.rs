//! `fabric eval`: experiments over datasets (issue 51), a shell over `fabric::eval`. `run` runs
//! a dataset's cases (recorded in the store, tagged with a new experiment) and grades them;
//! `regrade` grades an experiment's recorded runs again (no model call); `show`, `list` and
//! `compare` read the store. Exit codes: 0 the gate passed, 1 it did not (the route got worse),
//! 2 bad usage, a dataset refused, a store that cannot be read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use fabric::cancel::CancelHandle;
use fabric::config::Settings;
use fabric::eval::{self, Dataset, EvalError, Gate, Report};
use fabric::runtime::{BuildError, Durable};
use fabric::store::RunStore;

use crate::term::{print_out, say};

const EXIT_WORSE: u8 = 1;
const EXIT_USAGE: u8 = 2;

#[derive(Debug, clap::Subcommand)]
pub enum EvalAction {
    /// Run every case of DATASET through the runtime (recorded in the store, tagged with a new
    /// experiment), grade the runs and print the report; exits 1 when the gate refuses it.
    Run {
        dataset: PathBuf,
        /// Runs at once.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
        concurrency: u16,
        /// Runs per case (the report gives each case's spread across them).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        repeat: u32,
        /// Run each case again only from the first stage whose prompt or definition changed
        /// since its run in EXPERIMENT (the stages before it from that run's journal, no model
        /// call); the report says per case where it started.
        #[arg(long, value_name = "EXPERIMENT")]
        from: Option<String>,
        #[command(flatten)]
        out: ReportOut,
    },
    /// Grade an experiment's recorded runs again, with DATASET's evaluators when given (else the
    /// dataset it ran with): no model call.
    Regrade {
        experiment: String,
        #[arg(long)]
        dataset: Option<PathBuf>,
        #[command(flatten)]
        out: ReportOut,
    },
    /// An experiment's last report.
    Show {
        experiment: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// What changed from experiment A to B, case by case: verdicts, and where each case's runs
    /// diverge stage by stage (the prompt, the message, the value); exits 1 when a case that
    /// passed in A fails in B.
    Compare {
        a: String,
        b: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Datasets: build one from recorded runs, or convert one to another tool's format.
    Dataset {
        #[command(subcommand)]
        action: DatasetAction,
    },
    /// The newest experiments: id, name, dataset, created.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum DatasetAction {
    /// The newest runs of a route as a dataset (their goals; with --expect-output, their
    /// outputs as the expected ones), printed on stdout.
    FromRuns {
        #[arg(long)]
        route: String,
        /// Only runs of this status (the store's spelling: completed, failed, ...).
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long)]
        expect_output: bool,
        /// The dataset's name [default: the route's].
        #[arg(long)]
        name: Option<String>,
        #[arg(long, value_enum, default_value_t = DatasetFormat::Fabric)]
        to: DatasetFormat,
    },
    /// A dataset (ours, pydantic_evals' YAML or LangSmith's JSON) in another format, on stdout.
    Convert {
        dataset: PathBuf,
        #[arg(long, value_enum)]
        to: DatasetFormat,
    },
}

/// The dataset formats written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DatasetFormat {
    /// Ours (docs/evals.md).
    Fabric,
    /// pydantic_evals' dataset YAML.
    Pydantic,
    /// LangSmith's examples, as JSON.
    Langsmith,
}

/// Where a report goes, and the gate it must pass.
#[derive(Debug, clap::Args)]
pub struct ReportOut {
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Also write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Also write the report as JUnit XML to FILE.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Also write the report as an HTML page to FILE (failing cases first, runs linked to `--inspector`).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// The base URL of the `fabric serve` whose inspector the HTML report links runs to.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    inspector: String,
    /// Exit 1 when fewer cases than this share (0 to 1) pass.
    #[arg(long, value_name = "RATE", value_parser = share)]
    min_pass: Option<f64>,
    /// Exit 1 when more cases than this fail that passed in `--baseline`.
    #[arg(long, value_name = "N")]
    max_regressions: Option<usize>,
    /// The experiment regressions are counted against.
    #[arg(long, value_name = "EXPERIMENT")]
    baseline: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// A share from 0 to 1 (`--min-pass`).
fn share(s: &str) -> Result<f64, String> {
    s.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)).ok_or_else(|| format!("`{s}` is not a share from 0 to 1 (0.9 is 90%)"))
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    say(format_args!("fabric: {msg}"));
    ExitCode::from(EXIT_USAGE)
}

/// `fabric eval ACTION`; `build` makes the runtime over the store that `run` records in.
pub async fn eval_cmd(
    action: &EvalAction,
    store: Option<&str>,
    settings: Settings,
    handle: CancelHandle,
    build: impl FnOnce(Settings, Arc<dyn RunStore>) -> Result<Durable, BuildError>,
) -> std::io::Result<ExitCode> {
    let url = store.map_or_else(|| settings.service.database_url.clone(), str::to_owned);
    match action {
        EvalAction::Run { dataset, concurrency, repeat, from, out } => {
            let (dataset, text) = match read(dataset) {
                Ok(both) => both,
                Err(code) => return Ok(code),
            };
            let store = match fabric::store::open(&url).await {
                Ok(s) => s,
                Err(e) => return Ok(usage(format_args!("--store: {e}"))),
            };
            let durable = match build(settings.clone(), store) {
                Ok(d) => d,
                Err(e) => return Ok(usage(e)),
            };
            for w in durable.runtime().warnings() {
                say(format_args!("fabric: warning: {w}"));
            }
            let options = eval::RunOptions { concurrency: usize::from(*concurrency), repeat: *repeat };
            let report = match from {
                None => eval::run(&durable, &dataset, &text, &options, &handle).await,
                Some(base) => eval::rerun(&durable, base, &dataset, &text, &options, &handle).await,
            };
            match report {
                Ok(report) => finish(durable.store().as_ref(), &report, out).await,
                Err(e) => Ok(refused(e)),
            }
        }
        EvalAction::Regrade { experiment, dataset, out } => {
            let store = match fabric::store::open_existing(&url).await {
                Ok(s) => s,
                Err(e) => return Ok(usage(format_args!("run store: {e}"))),
            };
            let dataset = match dataset.as_deref().map(read).transpose() {
                Ok(d) => d.map(|(d, _)| d),
                Err(code) => return Ok(code),
            };
            match eval::regrade(store.as_ref(), experiment, dataset.as_ref()).await {
                Ok(report) => finish(store.as_ref(), &report, out).await,
                Err(e) => Ok(refused(e)),
            }
        }
        EvalAction::Dataset { action: DatasetAction::Convert { dataset, to } } => match read(dataset) {
            Ok((dataset, _)) => write_dataset(&dataset, *to),
            Err(code) => Ok(code),
        },
        EvalAction::Show { .. } | EvalAction::List { .. } | EvalAction::Compare { .. } | EvalAction::Dataset { .. } => {
            let store = match fabric::store::open_existing(&url).await {
                Ok(s) => s,
                Err(e) => return Ok(usage(format_args!("run store: {e}"))),
            };
            read_only(action, store.as_ref()).await
        }
    }
}

async fn read_only(action: &EvalAction, store: &dyn RunStore) -> std::io::Result<ExitCode> {
    match action {
        EvalAction::Show { experiment, format } => match eval::last_report(store, experiment).await {
            Ok(report) => print_report(&report, *format).map(|()| ExitCode::SUCCESS),
            Err(e) => Ok(refused(e)),
        },
        EvalAction::List { limit } => {
            let listed = match eval::experiments(store) {
                Ok(x) => x.list_experiments(*limit).await.map_err(EvalError::from),
                Err(e) => Err(e),
            };
            match listed {
                Ok(rows) => {
                    let lines: String = rows.iter().map(|e| format!("{}  {}  {}  {}\n", e.experiment_id, e.name, e.dataset, e.created_at)).collect();
                    print_out(&lines).map(|()| ExitCode::SUCCESS)
                }
                Err(e) => Ok(refused(e)),
            }
        }
        EvalAction::Compare { a, b, format } => match eval::compare(store, a, b).await {
            Ok(c) => {
                print_comparison(&c, *format)?;
                Ok(if c.regressions().next().is_some() { ExitCode::from(EXIT_WORSE) } else { ExitCode::SUCCESS })
            }
            Err(e) => Ok(refused(e)),
        },
        EvalAction::Dataset { action: DatasetAction::FromRuns { route, status, limit, expect_output, name, to } } => {
            let status = match status.as_deref().map(|s| fabric::store::StoredStatus::parse(s).ok_or(s)).transpose() {
                Ok(s) => s,
                Err(bad) => {
                    return Ok(usage(format_args!("--status: `{bad}` is not a run status (queued, running, completed, failed, awaiting_input, cancelled)")));
                }
            };
            match eval::from_runs(store, route, status, *limit, *expect_output, name.as_deref().unwrap_or(route)).await {
                Ok(dataset) if dataset.cases.is_empty() => Ok(usage(format_args!("no run of route `{route}` matches"))),
                Ok(dataset) => write_dataset(&dataset, *to),
                Err(e) => Ok(usage(e)),
            }
        }
        _ => Ok(usage("not a reading command")),
    }
}

/// A dataset file, decoded, and its text as read.
fn read(path: &Path) -> Result<(Dataset, String), ExitCode> {
    let text = fabric::textfile::read_bounded(path, eval::MAX_DATASET_BYTES).map_err(|e| usage(format_args!("{}: {e}", path.display())))?;
    match Dataset::parse(path, &text) {
        Ok(d) => Ok((d, text)),
        Err(e) => Err(refused(e.into())),
    }
}

/// An error, each located problem on a line of its own.
fn refused(e: EvalError) -> ExitCode {
    match e {
        EvalError::Refused(problems) | EvalError::Dataset(eval::DatasetError::Invalid(problems)) => {
            for p in &problems {
                say(format_args!("fabric: {p}"));
            }
            say(format_args!("fabric: {} problem(s); nothing was run", problems.len()));
            ExitCode::from(EXIT_USAGE)
        }
        other => usage(other),
    }
}

/// Prints `report`, writes its files, and applies the gate.
async fn finish(store: &dyn RunStore, report: &Report, out: &ReportOut) -> std::io::Result<ExitCode> {
    let baseline = match &out.baseline {
        None => None,
        Some(id) => match eval::last_report(store, id).await {
            Ok(r) => Some(r),
            Err(e) => return Ok(usage(format_args!("--baseline: {e}"))),
        },
    };
    if let Some(path) = &out.report
        && let Err(e) = std::fs::write(path, serde_json::to_string_pretty(report).unwrap_or_default())
    {
        return Ok(usage(format_args!("--report {}: {e}", path.display())));
    }
    if let Some(path) = &out.junit
        && let Err(e) = std::fs::write(path, eval::junit(report))
    {
        return Ok(usage(format_args!("--junit {}: {e}", path.display())));
    }
    if let Some(path) = &out.html
        && let Err(e) = std::fs::write(path, eval::html(report, &out.inspector))
    {
        return Ok(usage(format_args!("--html {}: {e}", path.display())));
    }
    print_report(report, out.format)?;
    let gate = Gate { min_pass: out.min_pass, max_regressions: out.max_regressions.or(out.baseline.as_ref().map(|_| 0)) };
    let findings = gate.check(report, baseline.as_ref());
    if let Some((rate, min)) = findings.pass_rate_below {
        say(format_args!("fabric: gate: {:.1}% of the cases passed, under --min-pass {:.1}%", rate * 100.0, min * 100.0));
        for case in report.cases.iter().filter(|c| !c.passed) {
            say(format_args!("fabric: gate: failed: {}", case.case_id));
        }
    }
    if findings.too_many_regressions {
        let base = out.baseline.as_deref().unwrap_or_default();
        say(format_args!("fabric: gate: {} case(s) passed in {base} and fail now: {}", findings.regressions.len(), findings.regressions.join(", ")));
    }
    Ok(if findings.failed() { ExitCode::from(EXIT_WORSE) } else { ExitCode::SUCCESS })
}

fn print_report(report: &Report, format: Format) -> std::io::Result<()> {
    if let Format::Json = format {
        return print_out(&format!("{}\n", serde_json::to_string_pretty(report).unwrap_or_default()));
    }
    let mut text = format!(
        "experiment {} ({}, {}): {}/{} cases passed ({:.1}%); {} runs, {} model calls, {} tokens{}\n",
        report.experiment_id,
        report.name,
        report.dataset,
        report.cases_passed,
        report.cases_total,
        report.pass_rate * 100.0,
        report.runs,
        report.llm_calls,
        report.tokens,
        report.mean_duration_ms.map(|d| format!(", mean {d:.1} ms")).unwrap_or_default()
    );
    if report.judge_calls > 0 {
        text.push_str(&format!("  judges asked: {} ({} tokens)\n", report.judge_calls, report.judge_tokens));
    }
    for e in &report.evaluators {
        text.push_str(&format!("  {:<32} {:>5}/{:<5} {:>6.1}%  score {:.2}\n", e.name, e.passed, e.graded, e.pass_rate * 100.0, e.mean_score));
    }
    for case in &report.cases {
        let mark = if case.passed { "pass" } else { "FAIL" };
        let flaky = if case.flaky.is_empty() { String::new() } else { format!(" (flaky: {})", case.flaky.join(", ")) };
        text.push_str(&format!("{mark} {} ({}) {:.0}%{flaky}\n", case.case_id, case.route_id, case.pass_rate * 100.0));
        for run in case.runs.iter().filter(|r| !r.passed || r.started_from.is_some()) {
            let from = run.started_from.as_deref().map(|s| format!(" started from stage `{s}`")).unwrap_or_default();
            text.push_str(&format!("  run {} #{} {}{from}\n", run.run_id, run.repeat, run.status));
            for v in run.verdicts.iter().filter(|v| !v.pass) {
                text.push_str(&format!("    {}: {}\n", v.evaluator, v.reason));
            }
        }
    }
    print_out(&text)
}

fn print_comparison(c: &eval::Comparison, format: Format) -> std::io::Result<()> {
    if let Format::Json = format {
        return print_out(&format!("{}\n", serde_json::to_string_pretty(c).unwrap_or_default()));
    }
    let mut text = format!("{} → {}: pass rate {:.1}% → {:.1}%\n", c.a, c.b, c.pass_rate_a * 100.0, c.pass_rate_b * 100.0);
    for case in &c.cases {
        let change = serde_json::to_value(case.change).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        let from = case.first_stage.as_deref().map(|s| format!(" (first divergence: stage `{s}`)")).unwrap_or_default();
        text.push_str(&format!("{change} {}{from}\n", case.case_id));
        for line in case.verdicts.iter().chain(&case.divergence) {
            text.push_str(&format!("  {line}\n"));
        }
    }
    print_out(&text)
}

/// A dataset printed in `format`; what another tool's format cannot hold is said on stderr.
fn write_dataset(dataset: &Dataset, format: DatasetFormat) -> std::io::Result<ExitCode> {
    let text = match format {
        DatasetFormat::Fabric => eval::to_fabric_yaml(dataset),
        DatasetFormat::Langsmith => format!("{}\n", eval::to_langsmith_json(dataset)),
        DatasetFormat::Pydantic => {
            let (text, left_out) = eval::to_pydantic_yaml(dataset);
            for name in left_out {
                say(format_args!("fabric: warning: evaluator `{name}` has no pydantic_evals equivalent; left out"));
            }
            text
        }
    };
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    print_out(&format!("{text}{newline}")).map(|()| ExitCode::SUCCESS)
}
