//! The `fabric` command line: parses arguments, prints, picks exit codes; every decision about
//! runs is the library's ([`Runtime`]). Exit codes: 0 completed / ok, 1 run failed (or a reply
//! refused by `validate`), 2 bad usage, configuration or catalogue, 3 the run awaits the user,
//! 4 output could not be written, 128 + N a signal ended the run; `routes diff` exits as diff(1)
//! does: 0 no difference, 1 differences, 2 trouble.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use fabric::cancel::CancelHandle;
use fabric::catalogue::{self, Catalogue, DirKind, Layers, MissingDir, RouteEntry};
use fabric::config::{ConfigError, ProviderKind, Settings};
use fabric::events::{EventSink, FanOut, JsonLinesSink, NullSink};
use fabric::exec::{self, RunRequest, RunStatus};
use fabric::failure::ReasonClass;
use fabric::hydrate;
use fabric::runtime::{Durable, Runtime, StartRequest, Validation};
use fabric::store::{RunFilter, RunId, RunStore, StoredStatus};

use crate::progress::Progress;
use crate::streamed::Streamed;
use crate::term::{print_out, say};

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_AWAITING: u8 = 3;
/// The run was cancelled on request (`fabric runs cancel`, the service's cancel).
const EXIT_CANCELLED: u8 = 5;

#[derive(Debug, Parser)]
#[command(name = "fabric", version, about = "Run staged LLM routes from a route catalogue")]
pub struct Cli {
    /// Route catalogue directories, `a:b`: later ones add routes (and profiles, ...) to earlier ones.
    #[arg(long, global = true, env = "FABRIC_CATALOGUE_DIR", default_value = "routes", value_name = "DIR[:DIR...]", value_parser = Layers::parse)]
    catalogue: Layers,
    /// Prompt pack directories, `a:b`: later ones add packs to earlier ones.
    #[arg(long, global = true, env = "FABRIC_PROMPT_PACKS_DIR", default_value = "prompt-packs", value_name = "DIR[:DIR...]", value_parser = Layers::parse)]
    prompt_packs: Layers,
    /// Seed data of the seeded stub [default: stub, when it exists].
    #[arg(long, global = true, env = "FABRIC_LLM_STUB_DIR")]
    stub_dir: Option<PathBuf>,
    /// Whether `--catalogue` or `--prompt-packs` was given on the command line (not by a variable
    /// or the default): `fabric replay` then compares a run with that catalogue instead of the
    /// version it ran on.
    #[arg(skip)]
    catalogue_named: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where a run's events and text go (`fabric run`, `fabric runs reply`).
#[derive(Debug, clap::Args)]
struct RunOutput {
    /// Write events as JSON lines to FILE (`-` for stderr).
    #[arg(long, value_name = "FILE|-")]
    events_out: Option<String>,
    /// Print the text of the stages that stream on stdout as the model writes it (each call's
    /// text followed by a newline) instead of the result JSON; a header per stage and restarts
    /// on stderr, and the run's id and status at its end.
    #[arg(long)]
    stream: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one route and print its result as JSON (with `--stream`, the text its stages stream).
    Run {
        route: String,
        /// The goal, a JSON object; `@FILE` reads it from a file, `-` from standard input (for
        /// goals past the kernel's argument limit).
        #[arg(long, value_name = "JSON|@FILE|-")]
        goal: String,
        /// A prefetch pack: a JSON array of strings (or {"chunks": [...]}).
        #[arg(long)]
        prefetch: Option<PathBuf>,
        #[command(flatten)]
        output: RunOutput,
        /// Record the run in a run store, as the service does: `--store` alone uses the same
        /// store as `fabric runs` (FABRIC_DATABASE_URL, else sqlite://fabric.db); `--store URL`
        /// names one.
        #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
        store: Option<String>,
    },
    /// Serve the HTTP API (start contract, runs, events, replies, metrics).
    Serve {
        /// Address to listen on [default: 0.0.0.0:8080; 127.0.0.1:8080 with --no-auth].
        #[arg(long)]
        listen: Option<String>,
        /// Serve without a bearer token (loopback addresses only).
        #[arg(long)]
        no_auth: bool,
    },
    /// Re-execute a finished run from the store with no model call; report every divergence.
    Replay {
        run_id: String,
        /// The run store [default: FABRIC_DATABASE_URL, else sqlite://fabric.db].
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Evaluations over datasets: run a dataset as an experiment, regrade one, show, list.
    Eval {
        /// The run store [default: FABRIC_DATABASE_URL, else sqlite://fabric.db].
        #[arg(long, global = true, value_name = "URL")]
        store: Option<String>,
        #[command(subcommand)]
        action: crate::eval::EvalAction,
    },
    /// Read the run store: list runs, or show one.
    Runs {
        /// The run store [default: FABRIC_DATABASE_URL, else sqlite://fabric.db].
        #[arg(long, global = true, value_name = "URL")]
        store: Option<String>,
        #[command(subcommand)]
        action: RunsAction,
    },
    /// Scheduled runs on the run store: create, list, show, pause, resume, delete, trigger.
    ///
    /// A replica of `fabric serve` on the same store fires them (docs/operations.md, "Scheduled runs").
    Schedules {
        /// The run store [default: FABRIC_DATABASE_URL, else sqlite://fabric.db].
        #[arg(long, global = true, value_name = "URL")]
        store: Option<String>,
        #[command(subcommand)]
        action: SchedulesAction,
    },
    /// List or check the routes of the catalogue, or compare two catalogues.
    Routes {
        #[command(subcommand)]
        action: RoutesAction,
    },
    /// Show a route's hydrated graph: roles, resolved prompts, edges.
    Hydrate {
        route: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// The resolved configuration (keys redacted); `--probe` makes one tiny structured call.
    Doctor {
        #[arg(long)]
        probe: bool,
    },
    /// Run the BENCH.md scenarios with the seeded stub; JSON lines on stdout, a table on stderr.
    ///
    /// The program `fabric-bench`, run with the same arguments: `fabric bench --help` is its help.
    #[command(disable_help_flag = true)]
    Bench {
        /// The arguments of `fabric-bench` (`fabric bench --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<std::ffi::OsString>,
    },
    /// Print a shell's completion script (`fabric completions bash > /etc/bash_completion.d/fabric`).
    Completions { shell: clap_complete::Shell },
    /// Serve the demo HTTP tools (`/search`, `/add`) on ADDR; prints its URL.
    ToolServer {
        #[arg(long, default_value = "127.0.0.1:8089")]
        listen: String,
    },
    /// What a stage would make of a raw model reply against an output schema.
    Validate {
        #[arg(long)]
        schema: PathBuf,
        /// The raw reply (a file, or `-`/absent for stdin).
        reply: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum RunsAction {
    /// The newest runs, one line each: id, route, status, created, reason class.
    List {
        #[arg(long)]
        route: Option<String>,
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run as JSON (the result object); `--events` adds its events as JSON lines.
    Show {
        run_id: String,
        #[arg(long)]
        events: bool,
    },
    /// Answers a run that asked (it exited 3) and continues it here, on the same store: prints
    /// its result and exits like `fabric run` (0 completed, 1 failed, 3 it asks again).
    Reply {
        run_id: String,
        /// The answer; `@FILE` reads it from a file, `-` from standard input.
        #[arg(long, value_name = "TEXT|@FILE|-")]
        message: String,
        #[command(flatten)]
        output: RunOutput,
    },
    /// Deletes the ended runs (completed, failed, cancelled) whose last change is older than
    /// DUR, with their events, journal and webhook deliveries, as the service's sweeper does with
    /// FABRIC_RUN_RETENTION; prints how many. Runs queued, running or awaiting stay.
    Prune {
        /// A duration: `30d`, `12h`, `90m`.
        #[arg(long, value_name = "DUR")]
        older_than: String,
        /// Count them, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Cancels a run: queued or awaiting the user, it ends now; running (under `fabric serve` or
    /// `fabric run --store`), the process that executes it ends it within about a second. Prints
    /// the run as `runs show` does; exits 0, or 1 when the run completed or failed already.
    Cancel {
        run_id: String,
        /// Why (at most 1,024 bytes); default `cancelled by request`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum SchedulesAction {
    /// Stores a schedule, checked like a start of its route (goal, profile) and its cron
    /// expression parsed; prints it as JSON.
    Create {
        #[arg(long)]
        route: String,
        /// The goal, a JSON object; `@FILE` reads it from a file, `-` from standard input.
        #[arg(long, value_name = "JSON|@FILE|-")]
        goal: String,
        /// 5 fields (minute hour day-of-month month day-of-week) or 6 (a second first).
        #[arg(long)]
        cron: String,
        /// An IANA time zone [default: UTC].
        #[arg(long)]
        timezone: Option<String>,
        /// skip, buffer_one, allow_all or cancel_other [default: skip].
        #[arg(long)]
        overlap: Option<String>,
        /// none, latest or all [default: none].
        #[arg(long)]
        catchup: Option<String>,
        /// How old a missed fire may be and still run (`6h`, `2d`) [default: 1d].
        #[arg(long, value_name = "DUR")]
        catchup_window: Option<String>,
        /// With `--catchup all`: the most missed fires that run (1 to 100) [default: 1].
        #[arg(long, value_name = "N")]
        max_catchup_runs: Option<u32>,
        #[arg(long, value_name = "NAME")]
        model_profile: Option<String>,
        /// Stored paused (`fabric schedules resume ID` starts it).
        #[arg(long)]
        paused: bool,
    },
    /// One line per schedule: id, route, cron, time zone, state, next fire.
    List,
    /// One schedule as JSON; `--fires N` adds its N newest fire records as JSON lines.
    Show {
        id: String,
        #[arg(long, value_name = "N")]
        fires: Option<usize>,
    },
    /// Pauses a schedule: it fires no more until resumed.
    Pause { id: String },
    /// Resumes a schedule: it fires from now on (the fires of the pause are not caught up).
    Resume { id: String },
    /// Deletes a schedule and its fire records (its runs stay).
    Delete { id: String },
    /// Fires a schedule now: a replica of `fabric serve` on the store starts its run within a second.
    Trigger { id: String },
}

/// A run status as `runs list --status` takes it (the store's spelling).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusArg {
    Queued,
    Running,
    Completed,
    Failed,
    #[value(name = "awaiting_input")]
    AwaitingInput,
    Cancelled,
}

impl From<StatusArg> for StoredStatus {
    fn from(status: StatusArg) -> StoredStatus {
        match status {
            StatusArg::Queued => StoredStatus::Queued,
            StatusArg::Running => StoredStatus::Running,
            StatusArg::Completed => StoredStatus::Completed,
            StatusArg::Failed => StoredStatus::Failed,
            StatusArg::AwaitingInput => StoredStatus::AwaitingInput,
            StatusArg::Cancelled => StoredStatus::Cancelled,
        }
    }
}

#[derive(Debug, Subcommand)]
enum RoutesAction {
    /// One line per route: id, path, status.
    List,
    /// Every problem as `path:line:col: message`; exit 2 when there are errors.
    Check {
        /// Connect to the catalogue's MCP servers: list their tools, and report a tool a route
        /// names that its server does not have.
        #[arg(long)]
        connect: bool,
    },
    /// What changed from OLD to NEW, per route and stage: prompts, roles, schemas, edges, tools.
    ///
    /// Each is a project directory (its `routes/`, and its `prompt-packs/` if it has one) or,
    /// without a `routes/` in it, a catalogue directory with the packs of --prompt-packs; or,
    /// when no directory has that name, a catalogue version kept in the run store, by its first
    /// 8 to 64 hex digits (`fabric runs show ID` prints a run's `catalogue_version`). Exits 0
    /// when nothing differs, 1 when something does, 2 when a side cannot be read.
    Diff {
        old: String,
        new: String,
        #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
        format: DiffFormat,
        /// The run store that keeps the versions named [default: FABRIC_DATABASE_URL, else
        /// sqlite://fabric.db]; opened only when a side is a version.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
}

/// How `routes diff` prints: one line per change, or the `CatalogueDiff` as JSON.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum DiffFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Dot,
    Mermaid,
    Svg,
}

/// Results or events could not be written (closed pipe, full disk): the record is incomplete.
const EXIT_IO: u8 = 4;

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    say(format_args!("fabric: {msg}"));
    ExitCode::from(EXIT_USAGE)
}

fn output_failed(e: std::io::Error) -> ExitCode {
    say(format_args!("fabric: cannot write the output: {e}"));
    ExitCode::from(EXIT_IO)
}

pub fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // A global argument given after the subcommand is the subcommand's.
    let named = |m: &clap::ArgMatches| ["catalogue", "prompt_packs"].iter().any(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine));
    cli.catalogue_named = named(&matches) || matches.subcommand().is_some_and(|(_, m)| named(m));
    // The tool server is a side process (benchmarks, demos): one thread keeps it from competing
    // with the runtime it serves for both cores.
    let mut builder = match cli.command {
        Command::ToolServer { .. } => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return usage(format_args!("cannot start the async runtime: {e}")),
    };
    // Export spans only when the standard OTLP variables ask for it; the guard flushes at exit,
    // within its deadline. The first export failure is told once: in the service's log, or on
    // stderr for one-shot commands (whose exit code it never changes).
    let serve = matches!(cli.command, Command::Serve { .. });
    let report = fabric::otel::Reporter::new(move |message| {
        if serve {
            tracing::warn!(target: "fabric::otel", "{message}");
        } else {
            eprintln!("fabric: {message}");
        }
    });
    let _otel = match fabric::otel::init_from_env(report) {
        Ok(guard) => guard,
        Err(e) => return usage(e),
    };
    runtime.block_on(dispatch(cli))
}

fn load(cli: &Cli) -> Catalogue {
    catalogue::load_layers(&cli.catalogue, &cli.prompt_packs)
}

/// A directory that does not exist, with the option and variable that named it: the library
/// knows the directory, only the command line knows where it came from.
fn missing_dir(m: &MissingDir) -> String {
    let (option, var, default) = match m.kind {
        DirKind::Catalogue => ("--catalogue", "FABRIC_CATALOGUE_DIR", "routes"),
        DirKind::PromptPacks => ("--prompt-packs", "FABRIC_PROMPT_PACKS_DIR", "prompt-packs"),
    };
    format!("{m} (set by {option} or {var}; default `{default}`)")
}

/// Refuses a command that reads the catalogue when one of its directories is missing: loading
/// would find no routes and call every one of them unknown.
fn dirs_exist(cli: &Cli) -> Result<(), ExitCode> {
    let missing = catalogue::missing_dirs(&cli.catalogue, &cli.prompt_packs);
    if missing.is_empty() {
        return Ok(());
    }
    for m in &missing {
        say(format_args!("fabric: {}", missing_dir(m)));
    }
    Err(ExitCode::from(EXIT_USAGE))
}

async fn dispatch(cli: Cli) -> ExitCode {
    // `routes diff` reads the two catalogues its arguments name, not the configured one.
    let reads_catalogue = matches!(
        cli.command,
        Command::Routes { action: RoutesAction::List | RoutesAction::Check { .. } }
            | Command::Hydrate { .. }
            | Command::Run { .. }
            | Command::Serve { .. }
            | Command::Replay { .. }
            | Command::Eval { action: crate::eval::EvalAction::Run { .. }, .. }
    );
    if reads_catalogue && let Err(code) = dirs_exist(&cli) {
        return code;
    }
    let printed = match &cli.command {
        Command::Routes { action: RoutesAction::List } => routes_list(&cli, &load(&cli)),
        Command::Routes { action: RoutesAction::Check { connect: false } } => routes_check(&load(&cli)),
        Command::Routes { action: RoutesAction::Check { connect: true } } => routes_check_connected(&cli).await,
        Command::Routes { action: RoutesAction::Diff { old, new, format, store } } => routes_diff(&cli, [old, new], *format, store.as_deref()).await,
        Command::Hydrate { route, format } => hydrate_cmd(&load(&cli), route, *format),
        Command::Validate { schema, reply } => validate_cmd(schema, reply.as_deref()),
        Command::Doctor { probe } => doctor_cmd(&cli, *probe).await,
        Command::Bench { args } => Ok(crate::forward::bench(args)),
        Command::ToolServer { listen } => match crate::toolserver::serve(listen).await {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => Ok(usage(format_args!("tool-server: {e}"))),
        },
        Command::Run { route, goal, prefetch, output, store } => run_cmd(&cli, route, goal, prefetch.as_deref(), output, store.as_deref()).await,
        Command::Serve { listen, no_auth } => crate::serve::serve(listen.as_deref(), *no_auth, |settings, store| build_durable(&cli, settings, store)).await,
        Command::Runs { store, action } => runs_cmd(&cli, store.as_deref(), action).await,
        Command::Schedules { store, action } => schedules_cmd(&cli, store.as_deref(), action).await,
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut <Cli as clap::CommandFactory>::command(), "fabric", &mut out);
            print_out(&String::from_utf8_lossy(&out)).map(|()| ExitCode::SUCCESS)
        }
        Command::Replay { run_id, store } => replay_cmd(&cli, run_id, store.as_deref()).await,
        Command::Eval { store, action } => eval_cmd(&cli, store.as_deref(), action).await,
    };
    printed.unwrap_or_else(output_failed)
}

/// The catalogue version `fabric serve` would run with these directories and settings: the
/// routes and packs, and the stub's scripts when the stub answers.
fn version_here(cli: &Cli, cat: &Catalogue) -> fabric::version::CatalogueVersion {
    let stub_on = fabric::config::Settings::from_env().is_ok_and(|s| s.stub);
    let stub = stub_on.then(|| fabric::runtime::stub_scripts_on_disk(cli.stub_dir.as_deref()));
    fabric::version::Sources { routes: cat.texts().routes.clone(), packs: cat.texts().packs.clone(), stub }.version()
}

fn routes_list(cli: &Cli, cat: &Catalogue) -> std::io::Result<ExitCode> {
    // On stderr with the other notes: stdout stays one line per route.
    say(format_args!("catalogue version {}", version_here(cli, cat)));
    let mut text = String::new();
    for entry in cat.routes() {
        match entry {
            RouteEntry::Ready(r) => text.push_str(&format!("{}\t{}\t{}\tok\n", r.id(), r.path().as_str(), r.activation_target().unwrap_or("-"))),
            RouteEntry::Broken(b) => {
                let n = b.problems.len();
                text.push_str(&format!("{}\t-\t-\tbroken ({n} {})\n", b.id, if n == 1 { "problem" } else { "problems" }));
            }
        }
    }
    // A file that did not load may have held routes: say so rather than list fewer routes.
    for d in cat.unloaded() {
        text.push_str(&format!("?\t-\t-\tnot loaded: {d}\n"));
    }
    print_out(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// `routes check --connect`: the catalogue loaded with its MCP servers' tool lists, each server's
/// tools listed (`mcp SERVER: TOOL, ...`, or why it could not be listed), then as `routes check`.
async fn routes_check_connected(cli: &Cli) -> std::io::Result<ExitCode> {
    let cat = load(cli);
    if cat.mcp_servers().is_empty() {
        say(format_args!("the catalogue declares no MCP server"));
        return routes_check(&cat);
    }
    let mcp = fabric::tools::mcp::McpServers::new(|k| std::env::var(k).ok());
    let servers = cat.mcp_servers().clone();
    let listings = {
        let mcp = mcp.clone();
        tokio::task::spawn_blocking(move || mcp.prepare(&servers)).await.unwrap_or_default()
    };
    let mut text = String::new();
    for (server, listing) in &listings {
        match listing {
            fabric::defs::McpListing::Tools(tools) => {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                text.push_str(&format!("mcp {server}: {} tool(s): {}\n", names.len(), names.join(", ")));
            }
            fabric::defs::McpListing::Unavailable(why) => text.push_str(&format!("mcp {server}: unavailable: {why}\n")),
        }
    }
    print_out(&text)?;
    let cat = catalogue::load_layers_listed(&cli.catalogue, &cli.prompt_packs, Some(&listings));
    mcp.stop().await;
    routes_check(&cat)
}

fn routes_check(cat: &Catalogue) -> std::io::Result<ExitCode> {
    let text: String = cat.diagnostics().iter().map(|d| format!("{d}\n")).collect();
    print_out(&text)?;
    let ready = cat.routes().filter(|r| matches!(r, RouteEntry::Ready(_))).count();
    let total = cat.routes().count();
    let warnings = cat.diagnostics().len() - cat.error_count();
    let unloaded = match cat.unloaded().len() {
        0 => String::new(),
        n => format!("; {n} file(s) could not be loaded, so routes may be missing"),
    };
    say(format_args!("{ready} of {total} routes ready{unloaded}; {} errors, {warnings} warnings", cat.error_count()));
    Ok(if cat.error_count() > 0 { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS })
}

/// One side of `routes diff`: a project directory (its `routes/`, and its `prompt-packs/` when it
/// has one: without, the routes that name a pack are broken, and the diff says so), or else a
/// catalogue directory itself, with the packs of `--prompt-packs`; or, with `store` (opened
/// because this side names no directory but a version, [`version_prefix`]), a catalogue version
/// the run store keeps, rebuilt from its sources.
async fn diff_side(arg: &str, cli: &Cli, store: Option<&dyn RunStore>) -> Result<Catalogue, String> {
    if let (Some(prefix), Some(store)) = (version_prefix(arg), store) {
        return stored_catalogue(store, prefix).await;
    }
    let dir = Path::new(arg);
    if !dir.is_dir() {
        return Err(format!(
            "`{arg}` is not a directory (give a project directory, a catalogue directory, or the first 8 to 64 hex digits of a catalogue version in the run store)"
        ));
    }
    let routes = dir.join("routes");
    if routes.is_dir() {
        return Ok(catalogue::load(&routes, &dir.join("prompt-packs")));
    }
    let catalogue = Layers::one(dir);
    match catalogue::missing_dirs(&catalogue, &cli.prompt_packs).first() {
        Some(missing) => {
            Err(format!("`{arg}` has no `routes/`, so it is read as a catalogue directory with the packs of --prompt-packs: {}", missing_dir(missing)))
        }
        None => Ok(catalogue::load_layers(&catalogue, &cli.prompt_packs)),
    }
}

/// A side of `routes diff` that names a catalogue version, not a directory: no directory has
/// that name, and it is 8 to 64 lowercase hex digits (a version's first digits, or all 64).
fn version_prefix(arg: &str) -> Option<&str> {
    let hex = (8..=64).contains(&arg.len()) && arg.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && !Path::new(arg).is_dir()).then_some(arg)
}

/// The catalogue of the one version the store keeps whose digest starts with `prefix`, rebuilt
/// from its sources as a replica rebuilds a run's version.
async fn stored_catalogue(store: &dyn RunStore, prefix: &str) -> Result<Catalogue, String> {
    let found = store.catalogue_versions(prefix, 2).await.map_err(|e| format!("run store: {e}"))?;
    let version = match found.as_slice() {
        [] => return Err(format!("no catalogue version starting with `{prefix}` in the store")),
        [one] => one,
        [a, b, ..] => return Err(format!("`{prefix}` is ambiguous: catalogue versions {a} and {b} start with it (give more digits)")),
    };
    match store.catalogue(version).await {
        Ok(Some(sources)) => Ok(Catalogue::rebuild(&catalogue::Texts { routes: sources.routes, packs: sources.packs })),
        Ok(None) => Err(format!("catalogue version {version} is no longer in the store")),
        Err(e) => Err(format!("run store: catalogue version {version}: {e}")),
    }
}

/// `fabric routes diff OLD NEW`: the run store is opened only when a side names a version.
async fn routes_diff(cli: &Cli, sides: [&str; 2], format: DiffFormat, store: Option<&str>) -> std::io::Result<ExitCode> {
    let store = if sides.iter().any(|side| version_prefix(side).is_some()) {
        match settings_and_store(store).await {
            Ok((_, store)) => Some(store),
            Err(code) => return Ok(code),
        }
    } else {
        None
    };
    let [old, new] = sides;
    let (old_cat, new_cat) = match (diff_side(old, cli, store.as_deref()).await, diff_side(new, cli, store.as_deref()).await) {
        (Ok(old_cat), Ok(new_cat)) => (old_cat, new_cat),
        (old_side, new_side) => {
            for problem in [old_side.err(), new_side.err()].into_iter().flatten() {
                say(format_args!("fabric: routes diff: {problem}"));
            }
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    // A file that did not load may have held routes, which then look removed or added.
    for (side, cat) in [(old, &old_cat), (new, &new_cat)] {
        for d in cat.unloaded() {
            say(format_args!("fabric: routes diff: {side}: not loaded, the routes in it are missing: {d}"));
        }
    }
    let changes = fabric::diff::diff(&old_cat, &new_cat);
    let text = match format {
        DiffFormat::Text if changes.is_empty() => "no differences\n".to_owned(),
        DiffFormat::Text => changes.to_string(),
        DiffFormat::Json => format!("{}\n", serde_json::to_string(&changes).map_err(std::io::Error::other)?),
    };
    print_out(&text)?;
    Ok(if changes.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}

fn hydrate_cmd(cat: &Catalogue, route_id: &str, format: Format) -> std::io::Result<ExitCode> {
    match cat.route(route_id) {
        Ok(r) => {
            let text = match format {
                Format::Text => hydrate::render_text(r),
                Format::Dot => hydrate::render_dot(r),
                Format::Mermaid => hydrate::render_mermaid(r),
                Format::Svg => fabric::svg::render_svg(r),
            };
            print_out(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(catalogue::RouteLookupError::Broken(b)) => {
            say(format_args!("fabric: route `{route_id}` cannot be hydrated:"));
            for d in &b.problems {
                say(format_args!("  {d}"));
            }
            Ok(ExitCode::from(EXIT_USAGE))
        }
        Err(catalogue::RouteLookupError::Unknown { unloaded, .. }) => {
            say(format_args!("fabric: unknown route `{route_id}`"));
            for d in unloaded {
                say(format_args!("  not loaded, it may be defined there: {d}"));
            }
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// The largest schema file `fabric validate` reads.
const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;

fn read_input(arg: Option<&str>, limit: u64) -> Result<String, String> {
    match arg {
        None | Some("-") => fabric::textfile::read_bounded_from(std::io::stdin().lock(), limit).map_err(|e| format!("standard input {e}")),
        Some(path) => fabric::textfile::read_bounded(Path::new(path), limit).map_err(|e| format!("{path} {e}")),
    }
}

fn validate_cmd(schema_path: &Path, reply: Option<&str>) -> std::io::Result<ExitCode> {
    let schema = fabric::textfile::read_bounded(schema_path, MAX_SCHEMA_BYTES)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| format!("is not valid JSON: {e}")));
    let schema = match schema {
        Ok(s) => s,
        Err(e) => return Ok(usage(format_args!("schema {}: {e}", schema_path.display()))),
    };
    let raw = match read_input(reply, fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES as u64) {
        Ok(r) => r,
        Err(e) => return Ok(usage(format_args!("cannot read the reply: {e}"))),
    };
    match fabric::runtime::validate(&schema, &raw) {
        Validation::Accepted(value) => {
            print_out(&format!("{value}\n"))?;
            Ok(ExitCode::SUCCESS)
        }
        Validation::PlainText { why, text } => {
            say(format_args!(
                "fabric: schema {} is not bindable ({why}); a stage with it runs as a plain text call and keeps the reply as text",
                schema_path.display()
            ));
            print_out(&format!("{text}\n"))?;
            Ok(ExitCode::SUCCESS)
        }
        Validation::Refused { class, detail } => {
            print_out(&format!("{class}\n"))?;
            say(format_args!("fabric: {detail}"));
            Ok(ExitCode::from(EXIT_FAILED))
        }
    }
}

/// The runtime of `run`, `doctor` and `serve`: the CLI's directories and the built-in `add` tool.
fn build_runtime(cli: &Cli, settings: Settings) -> Result<Runtime, fabric::runtime::BuildError> {
    let mut builder = Runtime::builder().settings(settings).catalogue_dirs(&cli.catalogue, &cli.prompt_packs).tool("add", fabric::tools::builtin_add());
    if let Some(dir) = &cli.stub_dir {
        builder = builder.stub_dir(dir);
    }
    builder.build()
}

/// That runtime with its run store: what `serve` and the commands on stored runs use.
fn build_durable(cli: &Cli, settings: Settings, store: Arc<dyn RunStore>) -> Result<Durable, fabric::runtime::BuildError> {
    Ok(Durable::new(build_runtime(cli, settings)?, store))
}

/// The settings, and the store `--store` names (else `FABRIC_DATABASE_URL`), which must exist:
/// a reader of the store creates none.
async fn settings_and_store(store: Option<&str>) -> Result<(Settings, Arc<dyn RunStore>), ExitCode> {
    let settings = settings_or_exit()?;
    let url = store.map_or(settings.service.database_url.clone(), str::to_owned);
    match fabric::store::open_existing(&url).await {
        Ok(s) => Ok((settings, s)),
        Err(e) => Err(usage(format_args!("run store: {e}"))),
    }
}

/// A text argument given as itself, as `@FILE` (read from the file) or as `-` (standard
/// input), each read with the bound `limit`.
fn text_arg(flag: &str, value: &str, limit: u64) -> Result<String, String> {
    if value == "-" {
        return fabric::textfile::read_bounded_from(std::io::stdin().lock(), limit).map_err(|e| format!("{flag} -: standard input {e}"));
    }
    match value.strip_prefix('@') {
        Some(path) => fabric::textfile::read_bounded(Path::new(path), limit).map_err(|e| format!("{flag} @{path}: {e}")),
        None => Ok(value.to_owned()),
    }
}

/// The largest goal or reply message read from a file or standard input.
const MAX_TEXT_ARG_BYTES: u64 = 16 * 1024 * 1024;

/// `fabric replay`: the run's journal through its own catalogue version (rebuilt from the store),
/// or through the catalogue `--catalogue` names on the command line. The backend is never asked:
/// a strict replay takes every reply from the journal, or reports that it has none.
async fn replay_cmd(cli: &Cli, run_id: &str, store: Option<&str>) -> std::io::Result<ExitCode> {
    let Some(run_id) = RunId::parse(run_id) else { return Ok(no_run(run_id)) };
    let run_id = run_id.as_str();
    let (settings, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let runtime = Runtime::builder()
        .settings(settings)
        .catalogue_dirs(&cli.catalogue, &cli.prompt_packs)
        .backend(Arc::new(fabric::llm::stub::StubLlm::default()))
        .tool("add", fabric::tools::builtin_add())
        .build();
    let runtime = match runtime {
        Ok(r) => Durable::new(r, store),
        Err(e) => return Ok(usage(e)),
    };
    // Its own version, unless a catalogue was named to compare it with.
    let on = if cli.catalogue_named { fabric::runtime::ReplayOn::Loaded } else { fabric::runtime::ReplayOn::Recorded };
    let report = match runtime.replay(run_id, on).await {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    let mut text = String::new();
    for d in &report.divergences {
        text.push_str(&format!("divergence: {d}\n"));
    }
    let status = serde_json::to_value(report.result.status()).unwrap_or_default();
    text.push_str(&format!("replayed run {run_id}: {} divergence(s); status {}\n", report.divergences.len(), status.as_str().unwrap_or("?")));
    print_out(&text)?;
    Ok(if report.divergences.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}

/// `fabric eval`: its settings, the signals that stop its runs, the CLI's runtime.
async fn eval_cmd(cli: &Cli, store: Option<&str>, action: &crate::eval::EvalAction) -> std::io::Result<ExitCode> {
    let settings = match settings_or_exit() {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let (handle, _) = CancelHandle::new();
    if let Err(e) = on_signals(handle.clone()) {
        return Ok(usage(e));
    }
    crate::eval::eval_cmd(action, store, settings, handle, |settings, store| build_durable(cli, settings, store)).await
}

/// An id that cannot be a run id names no run: said before the store is opened or asked.
fn no_run(run_id: &str) -> ExitCode {
    usage(format_args!("no run `{run_id}`"))
}

async fn runs_cmd(cli: &Cli, store: Option<&str>, action: &RunsAction) -> std::io::Result<ExitCode> {
    match action {
        RunsAction::Reply { run_id, message, output } => match RunId::parse(run_id) {
            Some(run_id) => runs_reply(cli, store, &run_id, message, output).await,
            None => Ok(no_run(run_id)),
        },
        RunsAction::Prune { older_than, dry_run } => runs_prune(cli, store, older_than, *dry_run).await,
        RunsAction::Cancel { run_id, reason } => match RunId::parse(run_id) {
            Some(run_id) => runs_cancel(cli, store, &run_id, reason.as_deref()).await,
            None => Ok(no_run(run_id)),
        },
        RunsAction::List { route, status, limit } => runs_list(store, route.clone(), *status, *limit).await,
        RunsAction::Show { run_id, events } => match RunId::parse(run_id) {
            Some(run_id) => runs_show(store, &run_id, *events).await,
            // Before the store is opened: an id that cannot be a run id needs no database.
            None => Ok(no_run(run_id)),
        },
    }
}

async fn runs_list(store: Option<&str>, route: Option<String>, status: Option<StatusArg>, limit: u32) -> std::io::Result<ExitCode> {
    let (_, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let filter = RunFilter { route_id: route, status: status.map(StoredStatus::from), before: None, limit };
    let runs = match store.list_runs(&filter).await {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    let text: String = runs
        .iter()
        .map(|r| format!("{}\t{}\t{}\t{}\t{}\n", r.run_id, r.route_id, r.status.as_str(), r.created_at, r.reason_class.map_or("-", |c| c.as_str())))
        .collect();
    print_out(&text)?;
    Ok(ExitCode::SUCCESS)
}

async fn runs_show(store: Option<&str>, run_id: &RunId, events: bool) -> std::io::Result<ExitCode> {
    let (_, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let run_id = run_id.as_str();
    let run = match store.get_run(run_id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(usage(format_args!("no run `{run_id}` in the store"))),
        Err(e) => return Ok(usage(e)),
    };
    let mut text = format!("{}\n", serde_json::to_string(&fabric::api::RunView::of(run)).unwrap_or_default());
    if events {
        match store.events_after(run_id, 0).await {
            Ok(list) => list.iter().for_each(|e| text.push_str(&format!("{}\n", e.body))),
            Err(e) => return Ok(usage(e)),
        }
    }
    print_out(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// `fabric runs prune`: ended runs past the age deleted (or counted) on the store.
async fn runs_prune(cli: &Cli, store: Option<&str>, older_than: &str, dry_run: bool) -> std::io::Result<ExitCode> {
    let age = match fabric::config::parse_retention("--older-than", Some(older_than)) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(usage("--older-than: the duration is empty; give one such as 30d, 12h or 90m")),
        Err(e) => return Ok(usage(e)),
    };
    let (settings, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let runtime = match build_durable(cli, settings, store) {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    match runtime.prune(age, dry_run).await {
        Ok(n) if dry_run => print_out(&format!("would prune {n} runs\n"))?,
        Ok(n) => print_out(&format!("pruned {n} runs\n"))?,
        Err(e) => return Ok(usage(e)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `fabric runs cancel`: the request recorded in the store (a queued or awaiting run ended here).
async fn runs_cancel(cli: &Cli, store: Option<&str>, run_id: &RunId, reason: Option<&str>) -> std::io::Result<ExitCode> {
    let (settings, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let runtime = match build_durable(cli, settings, store.clone()) {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    let said = match runtime.cancel(run_id.as_str(), reason, Arc::new(fabric::events::NullSink)).await {
        Ok(fabric::runtime::Cancelling::Ended(_)) => "cancelled",
        Ok(fabric::runtime::Cancelling::Requested { .. }) => "cancel requested: the process that executes it ends it within about a second",
        Ok(fabric::runtime::Cancelling::Already) => "cancelled already",
        Err(e @ fabric::runtime::CancelError::NotCancellable { .. }) => {
            say(format_args!("fabric: {e}"));
            return Ok(ExitCode::from(EXIT_FAILED));
        }
        Err(e) => return Ok(usage(e)),
    };
    say(format_args!("fabric: run {run_id}: {said}"));
    match store.get_run(run_id.as_str()).await {
        Ok(Some(run)) => print_out(&format!("{}\n", serde_json::to_string(&fabric::api::RunView::of(run)).unwrap_or_default()))?,
        Ok(None) => return Ok(no_run(run_id.as_str())),
        Err(e) => return Ok(usage(e)),
    }
    Ok(ExitCode::SUCCESS)
}

/// Signals that end a run cleanly: the run fails with `interrupted`, its result is printed, and
/// the exit code is 128 + the signal's number.
const SIGNALS: [(tokio::signal::unix::SignalKind, &str, u8); 3] = [
    (tokio::signal::unix::SignalKind::interrupt(), "SIGINT", 2),
    (tokio::signal::unix::SignalKind::terminate(), "SIGTERM", 15),
    (tokio::signal::unix::SignalKind::hangup(), "SIGHUP", 1),
];

/// Installs the handlers; the returned cell holds the number of the first signal received.
/// A second signal ends the process at once.
fn on_signals(handle: CancelHandle) -> Result<Arc<std::sync::atomic::AtomicU8>, String> {
    let got = Arc::new(std::sync::atomic::AtomicU8::new(0));
    for (kind, name, number) in SIGNALS {
        let mut stream = tokio::signal::unix::signal(kind).map_err(|e| format!("cannot install the {name} handler: {e}"))?;
        let (got, handle) = (got.clone(), handle.clone());
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if got.compare_exchange(0, number, std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst).is_err() {
                    std::process::exit(128 + i32::from(number));
                }
                handle.cancel(name);
            }
        });
    }
    Ok(got)
}

fn settings_or_exit() -> Result<Settings, ExitCode> {
    Settings::from_env().map_err(|e: ConfigError| usage(format_args!("bad configuration: {e}")))
}

async fn run_cmd(cli: &Cli, route_id: &str, goal: &str, prefetch: Option<&Path>, output: &RunOutput, store: Option<&str>) -> std::io::Result<ExitCode> {
    let settings = match settings_or_exit() {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let goal = match text_arg("--goal", goal, MAX_TEXT_ARG_BYTES).and_then(|g| exec::parse_goal(&g).map_err(|e| format!("--goal: {e}"))) {
        Ok(g) => g,
        Err(e) => return Ok(usage(e)),
    };
    let prefetch = match prefetch {
        None => Vec::new(),
        Some(p) => match fabric::textfile::read_bounded(p, exec::MAX_PREFETCH_BYTES)
            .map_err(|e| e.to_string())
            .and_then(|t| exec::parse_prefetch(&t).map_err(|e| e.to_string()))
        {
            Ok(chunks) => chunks,
            Err(e) => return Ok(usage(format_args!("--prefetch {}: {e}", p.display()))),
        },
    };
    // `--store` alone: the store `fabric runs` reads (recording may create it).
    let store = match store.map(|url| if url.is_empty() { settings.service.database_url.clone() } else { url.to_owned() }) {
        None => None,
        Some(url) => match fabric::store::open(&url).await {
            Ok(s) => Some(s),
            Err(e) => return Ok(usage(format_args!("--store: {e}"))),
        },
    };
    let hint = first_run_hint(&settings);
    let runtime = match build_runtime(cli, settings) {
        Ok(r) => Arc::new(r),
        Err(e) => return Ok(usage(e)),
    };
    for w in runtime.warnings() {
        say(format_args!("fabric: warning: {w}"));
    }
    // Every refusal comes before the events file is opened: a run that cannot start leaves an
    // existing file as it was.
    if let Err(e) = runtime.check_route(route_id) {
        return Ok(usage(e));
    }
    let RunIo { sink, outs, handle: lost_handle, cancel, signal } = match run_io(output) {
        Ok(io) => io,
        Err(code) => return Ok(code),
    };
    let outcome = if let Some(store) = store {
        // Recorded as the service records a run: accepted (a row), then journalled as it goes.
        let req = StartRequest { route_id: route_id.to_owned(), goal, prefetch, ..StartRequest::default() };
        match Durable::new(runtime, store).run_recorded(&req, sink, &lost_handle, cancel).await {
            Ok(outcome) => Ok(outcome),
            Err(fabric::runtime::AcceptError::Start(e)) => Err(e),
            Err(e) => return Ok(usage(e)),
        }
    } else {
        runtime.run(RunRequest { route_id: route_id.to_owned(), goal, prefetch }, sink, cancel).await
    };
    match outcome {
        Ok(outcome) => finish_run(&outcome, &outs, &signal, hint.as_deref()),
        Err(e) => Ok(usage(e)),
    }
}

/// What to add when the default provider cannot be reached and nothing chose it: a first run
/// without a model or the stub fails to connect to a local Ollama, and should say why.
fn first_run_hint(settings: &Settings) -> Option<String> {
    (!settings.stub && settings.model_default).then(|| {
        format!(
            "no model is configured, so the default `{}` was used (set FABRIC_LLM_MODEL=provider:model, or OLLAMA_MODEL); \
             to run offline with the seeded stub, set FABRIC_LLM_STUB=1",
            settings.model_string.0
        )
    })
}

/// What a run of the CLI is wired to: its events' sinks, the handle that cancels it (a signal, a
/// lost lease) and the signal that did.
struct RunIo {
    sink: Arc<dyn EventSink>,
    outs: Outs,
    handle: CancelHandle,
    cancel: fabric::cancel::Cancel,
    signal: Arc<std::sync::atomic::AtomicU8>,
}

/// The events' sinks and the signal handlers of a run (`fabric run`, `fabric runs reply`).
fn run_io(output: &RunOutput) -> Result<RunIo, ExitCode> {
    let (sink, outs) = event_sink(output)?;
    let (handle, cancel) = CancelHandle::new();
    let signal = on_signals(handle.clone()).map_err(usage)?;
    Ok(RunIo { sink, outs, handle, cancel, signal })
}

/// The sinks among a run's whose failure to write is reported: the JSON-lines file, the
/// streamed text (which also takes stdout from the result).
struct Outs {
    json: Option<Arc<JsonLinesSink>>,
    streamed: Option<Arc<Streamed>>,
    /// `--events-out -`: stderr carries JSON lines.
    events_on_stderr: bool,
}

/// The events' destinations: `--events-out FILE|-`, the streamed text (`--stream`), and the
/// progress view on a terminal.
fn event_sink(output: &RunOutput) -> Result<(Arc<dyn EventSink>, Outs), ExitCode> {
    let events_out = output.events_out.as_deref();
    let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
    let mut json_sink = None;
    if let Some(target) = events_out {
        let writer: Box<dyn Write + Send> = if target == "-" {
            Box::new(std::io::stderr())
        } else {
            match std::fs::File::create(target) {
                Ok(f) => Box::new(std::io::BufWriter::new(f)),
                Err(e) => return Err(usage(format_args!("--events-out {target}: {e}"))),
            }
        };
        let sink = Arc::new(JsonLinesSink::new(writer));
        json_sink = Some(sink.clone());
        sinks.push(sink);
    }
    let streamed = output.stream.then(|| Arc::new(Streamed::new(events_out != Some("-"))));
    if let Some(s) = &streamed {
        sinks.push(s.clone());
    }
    if events_out != Some("-") && std::io::stderr().is_terminal() {
        sinks.push(Arc::new(Progress::default()));
    }
    let sink: Arc<dyn EventSink> = match sinks.len() {
        0 => Arc::new(NullSink),
        1 => sinks.pop().unwrap_or_else(|| Arc::new(NullSink)),
        _ => Arc::new(FanOut(sinks)),
    };
    Ok((sink, Outs { json: json_sink, streamed, events_on_stderr: events_out == Some("-") }))
}

/// Prints a run's result and picks the exit code: 0 completed, 1 failed, 3 awaiting the user,
/// 4 the output or the events could not be written, 128 + N a signal interrupted it.
fn finish_run(outcome: &fabric::runtime::RunOutcome, outs: &Outs, signal: &std::sync::atomic::AtomicU8, hint: Option<&str>) -> std::io::Result<ExitCode> {
    let result = &outcome.result;
    // With `--stream`, stdout is the streamed text alone; the run's id and end go to stderr.
    let printed = match &outs.streamed {
        None => print_out(&format!("{}\n", serde_json::to_string(result).unwrap_or_default())),
        Some(streamed) => {
            if !outs.events_on_stderr {
                let status = serde_json::to_value(result.status()).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
                let why = match (result.error(), result.question()) {
                    (Some(e), _) => format!(": {} — {}", e.reason_class, e.message),
                    (None, Some(question)) => format!(": {question}"),
                    (None, None) => String::new(),
                };
                say(format_args!("fabric: run {} {status}{why}", result.run_id));
            }
            streamed.failure().map_or(Ok(()), |why| Err(std::io::Error::other(why)))
        }
    };
    let events_failed = outs.json.as_ref().and_then(|s| s.failure());
    if let Some(why) = &events_failed {
        say(format_args!("fabric: the events of run {} are incomplete: {why}", result.run_id));
    }
    if let Err(e) = &printed {
        say(format_args!("fabric: cannot write the output: {e}"));
    }
    if let Some(hint) = hint
        && result.error().is_some_and(|e| e.reason_class == ReasonClass::Connection)
    {
        say(format_args!("fabric: hint: {hint}"));
    }
    // A signal that interrupted the run names the exit code; one that came after the run had
    // ended changes nothing.
    let signal = signal.load(std::sync::atomic::Ordering::SeqCst);
    if signal != 0 && result.error().is_some_and(|e| e.reason_class == ReasonClass::Interrupted) {
        return Ok(ExitCode::from(128 + signal));
    }
    if printed.is_err() || events_failed.is_some() {
        return Ok(ExitCode::from(EXIT_IO));
    }
    if !outcome.unused_script_lines.is_empty() {
        for u in &outcome.unused_script_lines {
            say(format_args!("fabric: strict stub: {u}"));
        }
        return Ok(ExitCode::from(EXIT_FAILED));
    }
    Ok(match result.status() {
        RunStatus::Completed => ExitCode::SUCCESS,
        RunStatus::Failed => ExitCode::from(EXIT_FAILED),
        RunStatus::AwaitingInput => ExitCode::from(EXIT_AWAITING),
        RunStatus::Cancelled => ExitCode::from(EXIT_CANCELLED),
    })
}

/// `fabric runs reply`: the run that asked continues here with the answer, recorded in the
/// same store, and ends like `fabric run`.
async fn runs_reply(cli: &Cli, store: Option<&str>, run_id: &RunId, message: &str, output: &RunOutput) -> std::io::Result<ExitCode> {
    let message = match text_arg("--message", message, MAX_TEXT_ARG_BYTES) {
        Ok(m) => m,
        Err(e) => return Ok(usage(e)),
    };
    if message.trim().is_empty() {
        return Ok(usage("--message: the answer is empty"));
    }
    let (settings, store) = match settings_and_store(store).await {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let hint = first_run_hint(&settings);
    let runtime = match build_durable(cli, settings, store) {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    for w in runtime.runtime().warnings() {
        say(format_args!("fabric: warning: {w}"));
    }
    let RunIo { sink, outs, handle: lost_handle, cancel, signal } = match run_io(output) {
        Ok(io) => io,
        Err(code) => return Ok(code),
    };
    match runtime.reply_recorded(run_id.as_str(), message, sink, &lost_handle, cancel).await {
        Ok(outcome) => finish_run(&outcome, &outs, &signal, hint.as_deref()),
        Err(e) => Ok(usage(e)),
    }
}

/// The limits on model calls `doctor` shows: the defaults and each model's table, and how a
/// fleet shares them.
fn flow_lines(settings: &Settings) -> String {
    let plan = &settings.flow;
    let show = |l: &fabric::llm::flow::Limits| {
        let part = |name: &str, v: Option<u64>| v.map(|v| format!("{name} {v}"));
        let parts: Vec<String> =
            [part("max concurrency", l.max_concurrency.map(u64::from)), part("rpm", l.rpm.map(u64::from)), part("tpm", l.tpm)].into_iter().flatten().collect();
        if parts.is_empty() { "none".to_owned() } else { parts.join(", ") }
    };
    let mut out = format!("model limits: {} (FABRIC_LLM_MAX_CONCURRENCY, FABRIC_LLM_RPM, FABRIC_LLM_TPM)\n", show(&plan.default));
    for (model, limits) in &plan.models {
        out.push_str(&format!("  {model}: {} (FABRIC_CONFIG [llm_limits])\n", show(&limits.over(plan.default))));
    }
    out.push_str(&format!(
        "longest pause after a provider's 429: {} s (FABRIC_LLM_MAX_PAUSE_S; a longer stated wait fails its call)\n",
        plan.max_pause.as_secs_f64()
    ));
    let chain: Vec<String> = settings.fallbacks.iter().map(|t| format!("{}:{}", t.provider.key(), t.model)).collect();
    let policy = settings.fallback_policy;
    out.push_str(&format!(
        "fallbacks of the default model: {} (FABRIC_LLM_FALLBACKS); on invalid output: {} (FABRIC_LLM_FALLBACK_ON_INVALID); skip a paused model: {} (FABRIC_LLM_PREFER_AVAILABLE)\n",
        if chain.is_empty() { "none".to_owned() } else { chain.join(" -> ") },
        if policy.on_invalid { "yes" } else { "no" },
        if policy.prefer_available { "yes" } else { "no" },
    ));
    out.push_str(&format!(
        "breakers of chained models: open after {} failures in a row (FABRIC_LLM_BREAKER_FAILURES), for {} s (FABRIC_LLM_BREAKER_COOLDOWN_S)\n",
        plan.breaker.failures,
        plan.breaker.cooldown.as_secs_f64()
    ));
    if plan.any() {
        let pg = settings.service.database_url.starts_with("postgres");
        out.push_str(if pg {
            "  shared by the fleet's replicas through the store (fabric serve on PostgreSQL)\n"
        } else {
            "  held per process (the store is not PostgreSQL)\n"
        });
    }
    out
}

/// Where a cloud provider's calls go and where its credentials came from (never what they are).
fn cloud_lines(cloud: &fabric::llm::cloud::Cloud, bearer_var: Option<&str>, provider: ProviderKind) -> String {
    use fabric::llm::cloud::Cloud;
    match cloud {
        Cloud::Bedrock { region, region_var, keys } => {
            let auth = match (keys, bearer_var) {
                // ChatOpenAIMantle's way without a Bedrock API key.
                (Some(keys), _) if provider.key() == "bedrock_mantle_openai" => {
                    format!("short-term Bedrock API keys (bearer, 12 h) made from the keys of {}", keys.source())
                }
                (Some(keys), _) => format!("AWS Signature Version 4 with keys from {}", keys.source()),
                (None, Some(var)) => format!("Bedrock API key (bearer) from {var}"),
                (None, None) => "none".to_owned(),
            };
            format!("  region: {region} (from {region_var})\n  credentials: {auth}\n")
        }
        Cloud::Vertex { project, project_from, location, location_from, account } => format!(
            "  project: {project} (from {project_from})  location: {location} ({location_from})\n  credentials: service account {} from GOOGLE_APPLICATION_CREDENTIALS={}; token endpoint {}\n",
            account.client_email,
            account.path,
            fabric::redact::origin_and_path(&account.token_uri)
        ),
        Cloud::Watsonx { scope, scope_var, iam } => {
            let scope = match scope {
                fabric::llm::cloud::WatsonxScope::Project(id) => format!("project {id}"),
                fabric::llm::cloud::WatsonxScope::Space(id) => format!("space {id}"),
            };
            let auth = match (iam, bearer_var) {
                (Some(iam), _) => {
                    format!("IBM Cloud IAM tokens for the API key from {}; token endpoint {}", iam.var, fabric::redact::origin_and_path(&iam.token_url))
                }
                (None, Some(var)) => format!("token (bearer) from {var}"),
                (None, None) => "none".to_owned(),
            };
            format!("  scope: {scope} (from {scope_var})\n  credentials: {auth}\n")
        }
    }
}

/// `doctor`'s lines of the catalogue's MCP servers: how each is reached (a URL redacted) and
/// whether each `${VAR}` it names is set (never its value).
fn mcp_lines(cat: &Catalogue) -> String {
    use fabric::defs::{McpTransportDef, UrlPart, UrlTemplate};
    let mut out = String::new();
    for (name, server) in cat.mcp_servers() {
        let (how, templates): (String, Vec<&UrlTemplate>) = match &server.transport {
            McpTransportDef::Stdio { command, env } => {
                let words: Vec<&str> = command.iter().map(|w| w.raw.as_str()).collect();
                (format!("stdio `{}`", words.join(" ")), command.iter().chain(env.iter().map(|(_, v)| v)).collect())
            }
            McpTransportDef::Http { url, headers } => {
                (format!("Streamable HTTP {}", fabric::redact::redact_url(&url.raw)), std::iter::once(url).chain(headers.iter().map(|(_, v)| v)).collect())
            }
        };
        let mut vars: Vec<String> = Vec::new();
        for t in templates {
            for part in &t.parts {
                if let UrlPart::Var(v) = part
                    && !vars.iter().any(|seen| seen.starts_with(&format!("{v} ")))
                {
                    let set = std::env::var(v).is_ok_and(|x| !x.is_empty());
                    vars.push(format!("{v} {}", if set { "set" } else { "UNSET" }));
                }
            }
        }
        let vars = if vars.is_empty() { String::new() } else { format!("; variables: {}", vars.join(", ")) };
        out.push_str(&format!("  mcp server {name}: {how}{vars}\n"));
    }
    out
}

/// `doctor`'s lines of the A2A agents the ready routes call as tools: the endpoint (redacted),
/// the skill, and whether each variable it names (the URL's, the token's) is set (never a value).
fn a2a_lines(cat: &Catalogue) -> String {
    use fabric::catalogue::RouteEntry;
    use fabric::defs::UrlPart;
    let mut seen = std::collections::BTreeMap::new();
    for entry in cat.routes() {
        let RouteEntry::Ready(route) = entry else { continue };
        let caps = route.tools().chain(route.nodes().filter_map(|(_, n)| n.capability()));
        for cap in caps {
            let Some(a2a) = &cap.def.a2a else { continue };
            let set = |v: &str| format!("{v} {}", if std::env::var(v).is_ok_and(|x| !x.is_empty()) { "set" } else { "UNSET" });
            let mut vars: Vec<String> = a2a.url.parts.iter().filter_map(|p| if let UrlPart::Var(v) = p { Some(set(v)) } else { None }).collect();
            let token = a2a.token_env.as_deref().map_or("token: none".to_owned(), |v| format!("token: {}", set(v)));
            vars.dedup();
            let vars = if vars.is_empty() { String::new() } else { format!("; variables: {}", vars.join(", ")) };
            let line = format!("  a2a agent {}: {} skill {}; {token}{vars}\n", cap.name, fabric::redact::redact_url(&a2a.url.raw), a2a.skill);
            seen.entry(cap.name.clone()).or_insert(line);
        }
    }
    seen.into_values().collect()
}

async fn doctor_cmd(cli: &Cli, probe: bool) -> std::io::Result<ExitCode> {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            print_out(&format!("configuration: ERROR {e}\n"))?;
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let mut out = String::from("configuration: ok\n");
    for (var, value, origin) in settings.describe() {
        out.push_str(&format!("  {var}={value}  ({origin})\n"));
    }
    out.push_str(&format!("backend: {}\n", if settings.stub { "seeded stub (FABRIC_LLM_STUB)" } else { "provider" }));
    let origin =
        if settings.model_default { "default; FABRIC_LLM_MODEL or OLLAMA_MODEL changes it".to_owned() } else { format!("from {}", settings.model_string.1) };
    out.push_str(&format!("model: {} ({origin})\n", settings.model_string.0));
    match &settings.target {
        Some(t) => {
            let base_url = fabric::redact::redact_url(&t.base_url);
            out.push_str(&format!("  provider: {}  model: {}  base_url: {base_url}\n", t.provider.key(), t.model));
            if t.provider == ProviderKind::Gemini {
                out.push_str(&format!("  api_version: {}\n", t.api_version));
            }
            match &t.cloud {
                None => {
                    // Azure OpenAI: the deployment URL its calls go to, and its API version (OPENAI_API_VERSION).
                    if t.provider.key() == "azure_openai" {
                        out.push_str(&format!("  endpoint: {base_url}/openai/deployments/{}/chat/completions?api-version={}\n", t.model, t.api_version));
                    }
                    out.push_str(&format!("  api key: {}\n", t.api_key_var.as_deref().map_or("none".to_owned(), |v| format!("set (from {v})"))));
                }
                Some(cloud) => out.push_str(&cloud_lines(cloud, t.api_key_var.as_deref(), t.provider)),
            }
        }
        None => out.push_str("  provider: not resolvable (not needed with the stub)\n"),
    }
    let r = settings.retry;
    out.push_str(&format!("retry: {} attempts, base {:?}, cap {:?}\n", r.max_attempts, r.base, r.max_backoff));
    out.push_str(&format!(
        "fixed: temperature {}, max tokens {}, timeout {:?}; reply cap {} bytes; stream idle {:?} (FABRIC_LLM_STREAM_IDLE_S)\n",
        fabric::llm::TEMPERATURE,
        fabric::llm::MAX_OUTPUT_TOKENS,
        fabric::llm::CALL_TIMEOUT,
        settings.max_reply_bytes,
        settings.stream_idle
    ));
    out.push_str(&format!(
        "model profiles: {}\n",
        if settings.honor_model_profile { "select the model (FABRIC_HONOR_MODEL_PROFILE)" } else { "metadata only" }
    ));
    out.push_str(&format!("fleet: {}\n", settings.fleet.as_deref().unwrap_or("(none: serves every route)")));
    // What `fabric serve` would run with, defaults included (the list above shows only what is set).
    let svc = &settings.service;
    out.push_str(&format!("store: {}\n", fabric::redact::redact_url(&svc.database_url)));
    out.push_str(&format!(
        "serve: token {}; {} runs in flight, {} queued; lease {} s, claim poll {} ms; wait max {} s; body timeout {} s; shutdown grace {} s\n",
        if svc.api_token.is_some() { "set" } else { "not set" },
        svc.max_runs_in_flight,
        svc.max_queued_runs,
        svc.run_lease.as_secs(),
        svc.claim_poll.as_millis(),
        svc.wait_max.as_secs(),
        svc.body_timeout.as_secs(),
        svc.shutdown_grace.as_secs()
    ));
    let kept = |d: Option<std::time::Duration>| d.map_or("forever".to_owned(), |d| humantime::format_duration(d).to_string());
    out.push_str(&format!(
        "retention: ended runs kept {} (FABRIC_RUN_RETENTION); awaiting runs kept {} (FABRIC_AWAITING_RETENTION)\n",
        kept(svc.run_retention),
        kept(svc.awaiting_retention)
    ));
    out.push_str(&format!("sessions: {} (FABRIC_SESSION_POLICY; a start contract's `multitask` overrides it)\n", svc.session_policy.as_str()));
    out.push_str(&format!(
        "catalogue versions: runs taken up again go on on the {} version (FABRIC_RESUME_ON); reload on SIGHUP and POST /v1/catalogue/reload{}\n",
        svc.resume_on.as_str(),
        if svc.catalogue_watch { ", and on a change on disk (FABRIC_CATALOGUE_WATCH)" } else { "; files on disk not watched (FABRIC_CATALOGUE_WATCH unset)" }
    ));
    let hooks = &svc.webhooks;
    out.push_str(&match &hooks.secret {
        None => "webhooks: off (FABRIC_WEBHOOK_URL and FABRIC_WEBHOOK_ALLOWED_ORIGINS unset)\n".to_owned(),
        Some(_) => format!(
            "webhooks: signed (secret set); fleet URL {}; contract URLs from {}; {} attempts, backoff {} s doubling to {} s\n",
            hooks.url.as_ref().map_or("(none)".to_owned(), |u| fabric::redact::redact_url(u.as_str())),
            if hooks.allowed_origins.is_empty() {
                "no origin (FABRIC_WEBHOOK_ALLOWED_ORIGINS unset: webhook_url refused)".to_owned()
            } else {
                hooks.allowed_origins.iter().map(|o| o.ascii_serialization()).collect::<Vec<_>>().join(", ")
            },
            hooks.max_attempts,
            hooks.backoff_base.as_secs(),
            hooks.backoff_max.as_secs()
        ),
    });
    out.push_str(&flow_lines(&settings));
    let hint = first_run_hint(&settings);
    // Each directory of each layered setting, in the order they are read, before the build
    // (which stops at a missing one): which one is missing, and where its setting came from.
    let missing = catalogue::missing_dirs(&cli.catalogue, &cli.prompt_packs);
    for (what, kind, layers) in [("catalogue", DirKind::Catalogue, &cli.catalogue), ("prompt packs", DirKind::PromptPacks, &cli.prompt_packs)] {
        out.push_str(&format!("{what} directories:\n"));
        for dir in layers.dirs() {
            match missing.iter().find(|m| m.kind == kind && &m.dir == dir) {
                Some(m) => out.push_str(&format!("  {}: MISSING: {}\n", dir.display(), missing_dir(m))),
                None => out.push_str(&format!("  {}\n", dir.display())),
            }
        }
    }
    let runtime = match build_runtime(cli, settings) {
        Ok(r) => r,
        Err(e) => {
            let e = match e {
                fabric::runtime::BuildError::MissingDirs(m) => m.iter().map(missing_dir).collect::<Vec<_>>().join("; "),
                e => e.to_string(),
            };
            out.push_str(&format!("runtime: ERROR {e}\n"));
            print_out(&out)?;
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    for w in runtime.warnings() {
        out.push_str(&format!("  warning: {w}\n"));
    }
    let cat = runtime.catalogue();
    out.push_str(&format!(
        "catalogue: {} ({} routes, {} errors, {} files not loaded); version {}\n",
        cli.catalogue,
        cat.routes().count(),
        cat.error_count(),
        cat.unloaded().len(),
        runtime.version()
    ));
    let defs: std::collections::HashMap<&str, &fabric::defs::ProfileDef> = cat.profiles().map(|(n, d)| (n.as_str(), d)).collect();
    for p in runtime.profiles() {
        let fallbacks = fabric::defs::fallback_chain(&p.name, |n| defs.get(n).copied());
        let then = if fallbacks.len() > 1 { format!(", then profiles {}", fallbacks[1..].join(", ")) } else { String::new() };
        match p.model {
            Ok(m) => out.push_str(&format!("  profile {}: {} {}{then}\n", p.name, m.provider, m.model)),
            Err(e) => out.push_str(&format!("  profile {}: UNUSABLE ({e}); its routes are refused\n", p.name)),
        }
    }
    out.push_str(&mcp_lines(&cat));
    out.push_str(&a2a_lines(&cat));
    let declared: Vec<String> = cat
        .routes()
        .filter_map(|r| if let fabric::catalogue::RouteEntry::Ready(r) = r { Some(r) } else { None })
        .flat_map(|r| r.schedules().iter().map(move |s| format!("{}/{}", r.id(), s.name)))
        .collect();
    out.push_str(&format!(
        "scheduled runs: fired by fabric serve from the run store (once per fire time across the fleet); declared by the catalogue: {}\n",
        if declared.is_empty() { "none".to_owned() } else { declared.join(", ") }
    ));
    print_out(&out)?;
    if !probe {
        return Ok(ExitCode::SUCCESS);
    }
    match runtime.probe().await {
        Ok(p) => {
            print_out(&format!("probe: ok in {:.0} ms: {}\n", p.elapsed.as_secs_f64() * 1000.0, p.reply))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            print_out(&format!("probe: FAILED ({}) {}\n", e.class.as_str(), e.message))?;
            if let Some(hint) = hint.filter(|_| e.class == ReasonClass::Connection) {
                say(format_args!("fabric: hint: {hint}"));
            }
            Ok(ExitCode::from(EXIT_FAILED))
        }
    }
}

/// `fabric schedules`: the store's schedules, through the same facade as the service's
/// `/v1/schedules` (a new or changed one checked against this catalogue).
async fn schedules_cmd(cli: &Cli, store: Option<&str>, action: &SchedulesAction) -> std::io::Result<ExitCode> {
    // `create` makes the store if there is none yet (as `fabric run --store` does); the others read one.
    let opened = match (action, settings_or_exit()) {
        (_, Err(code)) => return Ok(code),
        (SchedulesAction::Create { .. }, Ok(settings)) => {
            let url = store.map_or(settings.service.database_url.clone(), str::to_owned);
            fabric::store::open(&url).await.map(|s| (settings, s)).map_err(|e| usage(format_args!("run store: {e}")))
        }
        _ => settings_and_store(store).await,
    };
    let (settings, store) = match opened {
        Ok(both) => both,
        Err(code) => return Ok(code),
    };
    let durable = match build_durable(cli, settings, store) {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    let now = fabric::schedule::Clock::now(&fabric::schedule::SystemClock);
    let paused = |p: bool| serde_json::Map::from_iter([("paused".to_owned(), serde_json::Value::Bool(p))]);
    let done = match action {
        SchedulesAction::Create { route, goal, cron, timezone, overlap, catchup, catchup_window, max_catchup_runs, model_profile, paused } => {
            let goal = match text_arg("--goal", goal, MAX_TEXT_ARG_BYTES).and_then(|g| exec::parse_goal(&g).map_err(|e| format!("--goal: {e}"))) {
                Ok(g) => g,
                Err(e) => return Ok(usage(e)),
            };
            let mut def = serde_json::json!({"route_id": route, "goal": goal, "cron": cron});
            let fields =
                [("timezone", timezone), ("overlap", overlap), ("catchup", catchup), ("catchup_window", catchup_window), ("model_profile", model_profile)];
            for (k, v) in fields.into_iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v))) {
                def[k] = serde_json::Value::String(v.clone());
            }
            if let Some(n) = max_catchup_runs {
                def["max_catchup_runs"] = serde_json::json!(n);
            }
            match serde_json::from_value::<fabric::runtime::ScheduleDef>(def) {
                Ok(def) => durable.create_schedule(None, &def, *paused, "api", now).await.map(|v| json_line(&v)),
                Err(e) => return Ok(usage(format_args!("the schedule: {e}"))),
            }
        }
        SchedulesAction::List => durable.schedules(10_000).await.map(|list| {
            list.iter()
                .map(|s| {
                    let state = if s.paused { s.paused_reason.as_deref().map_or("paused".to_owned(), |r| format!("paused: {r}")) } else { "active".to_owned() };
                    format!("{}\t{}\t{}\t{}\t{state}\t{}\n", s.id, s.def.route_id, s.def.cron, s.def.timezone, s.next_fires.first().map_or("-", String::as_str))
                })
                .collect()
        }),
        SchedulesAction::Show { id, fires } => match durable.schedule(id).await {
            Ok(view) => {
                let mut text = json_line(&view);
                match durable.schedule_fires(id, fires.unwrap_or(0).min(10_000)).await {
                    Ok(list) if fires.is_some() => list.iter().for_each(|f| text.push_str(&json_line(f))),
                    Ok(_) => {}
                    Err(e) => return Ok(usage(e)),
                }
                Ok(text)
            }
            Err(e) => Err(e),
        },
        SchedulesAction::Pause { id } => durable.patch_schedule(id, &paused(true), now).await.map(|v| json_line(&v)),
        SchedulesAction::Resume { id } => durable.patch_schedule(id, &paused(false), now).await.map(|v| json_line(&v)),
        SchedulesAction::Delete { id } => durable.delete_schedule(id).await.map(|()| String::new()),
        SchedulesAction::Trigger { id } => durable.trigger_schedule(id, now).await.map(|f| {
            say(format_args!("fabric: schedule {id}: fired; a replica of `fabric serve` on this store starts its run within a second"));
            json_line(&f)
        }),
    };
    match done {
        Ok(text) => print_out(&text).map(|()| ExitCode::SUCCESS),
        Err(e) => Ok(usage(e)),
    }
}

/// One value as a JSON line.
fn json_line<T: serde::Serialize>(v: &T) -> String {
    format!("{}\n", serde_json::to_string(v).unwrap_or_default())
}
