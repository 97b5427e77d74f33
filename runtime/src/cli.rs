//! The `fabric` command line. Exit codes: 0 completed / ok, 1 run failed (or a reply refused by
//! `validate`), 2 bad usage, configuration or catalogue, 3 the run awaits the user.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};

use crate::catalogue::{self, Catalogue, RouteEntry};
use crate::config::Settings;
use crate::events::{Event, EventSink, FanOut, JsonLinesSink, NullSink};
use crate::exec::{self, RunRequest, RunStatus, Runner};
use crate::hydrate;
use crate::llm::stub::StubLlm;
use crate::structured::{self, FlatSchema};

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_AWAITING: u8 = 3;

#[derive(Debug, Parser)]
#[command(name = "fabric", version, about = "Run staged LLM routes from a route catalogue")]
pub struct Cli {
    /// Route catalogue directory.
    #[arg(long, global = true, env = "FABRIC_CATALOGUE_DIR", default_value = "routes")]
    catalogue: PathBuf,
    /// Prompt pack directory.
    #[arg(long, global = true, env = "FABRIC_PROMPT_PACKS_DIR", default_value = "prompt-packs")]
    prompt_packs: PathBuf,
    /// Seed data of the seeded stub.
    #[arg(long, global = true, env = "FABRIC_LLM_STUB_DIR", default_value = "stub")]
    stub_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one route and print its result as JSON.
    Run {
        route: String,
        /// The goal, a JSON object.
        #[arg(long)]
        goal: String,
        /// A prefetch pack: a JSON array of strings (or {"chunks": [...]}).
        #[arg(long)]
        prefetch: Option<PathBuf>,
        /// Write events as JSON lines to FILE (`-` for stderr).
        #[arg(long, value_name = "FILE|-")]
        events_out: Option<String>,
    },
    /// List or check the routes of the catalogue.
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
    Bench {
        /// Scenarios: A, A2, B, B-http, C, H (repeat or comma-separate); all when absent.
        #[arg(long, value_delimiter = ',')]
        scenario: Vec<String>,
        /// Runs of the sequential scenarios (A, B, B-http).
        #[arg(long, default_value_t = 20_000)]
        runs: usize,
        /// Warm-up runs before measuring.
        #[arg(long, default_value_t = 1_000)]
        warmup: usize,
        /// Concurrency levels of scenario C.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        concurrency: Vec<usize>,
        /// Stub latency per model call in ms (scenario C default 50, others 0).
        #[arg(long)]
        latency_ms: Option<u64>,
        /// Generated routes of scenario H.
        #[arg(long, default_value_t = 1_000)]
        routes: usize,
        /// Scenario C without its tool call (diagnostic).
        #[arg(long)]
        no_tool: bool,
        /// Serialise every event as JSON (to a discarding writer); default: no event consumer.
        #[arg(long)]
        events: bool,
    },
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
enum RoutesAction {
    /// One line per route: id, path, status.
    List,
    /// Every problem as `path:line:col: message`; exit 2 when there are errors.
    Check,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Dot,
    Mermaid,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The tool server is a side process (benchmarks, demos): one thread keeps it from competing
    // with the runtime it serves for both cores.
    let mut builder = match cli.command {
        Command::ToolServer { .. } => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fabric: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Export spans only when the standard OTLP variables ask for it; the guard flushes at exit.
    let _otel = match crate::otel::init_from_env() {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("fabric: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    runtime.block_on(dispatch(cli))
}

fn load(cli: &Cli) -> Catalogue {
    catalogue::load(&cli.catalogue, &cli.prompt_packs)
}

async fn dispatch(cli: Cli) -> ExitCode {
    match &cli.command {
        Command::Routes { action: RoutesAction::List } => routes_list(&load(&cli)),
        Command::Routes { action: RoutesAction::Check } => routes_check(&load(&cli)),
        Command::Hydrate { route, format } => hydrate_cmd(&load(&cli), route, *format),
        Command::Validate { schema, reply } => validate_cmd(schema, reply.as_deref()),
        Command::Doctor { probe } => doctor_cmd(&cli, *probe).await,
        Command::Bench { scenario, runs, warmup, concurrency, latency_ms, routes, no_tool, events } => {
            let scenarios = if scenario.is_empty() { crate::bench::SCENARIOS.iter().map(|s| s.to_string()).collect() } else { scenario.clone() };
            let opts = crate::bench::BenchOptions {
                scenarios,
                runs: *runs,
                warmup: *warmup,
                concurrency: concurrency.clone(),
                latency_ms: *latency_ms,
                routes: *routes,
                no_tool: *no_tool,
                events: *events,
            };
            let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("fabric"));
            match crate::bench::run(opts, &exe).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fabric bench: {e}");
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::ToolServer { listen } => match crate::toolserver::serve(listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fabric tool-server: {e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Command::Run { route, goal, prefetch, events_out } => run_cmd(&cli, route, goal, prefetch.as_deref(), events_out.as_deref()).await,
    }
}

fn routes_list(cat: &Catalogue) -> ExitCode {
    let mut out = std::io::stdout().lock();
    for entry in cat.routes() {
        let _ = match entry {
            RouteEntry::Ready(r) => writeln!(out, "{}\t{}\t{}\tok", r.id, r.path.as_str(), r.activation_target.as_deref().unwrap_or("-")),
            RouteEntry::Broken(b) => writeln!(out, "{}\t-\t-\tbroken ({} errors)", b.id, b.problems.len()),
        };
    }
    ExitCode::SUCCESS
}

fn routes_check(cat: &Catalogue) -> ExitCode {
    for d in cat.diagnostics() {
        println!("{d}");
    }
    let ready = cat.routes().filter(|r| matches!(r, RouteEntry::Ready(_))).count();
    let total = cat.routes().count();
    let warnings = cat.diagnostics().len() - cat.error_count();
    eprintln!("{ready} of {total} routes ready; {} errors, {warnings} warnings", cat.error_count());
    if cat.error_count() > 0 { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS }
}

fn hydrate_cmd(cat: &Catalogue, route_id: &str, format: Format) -> ExitCode {
    match cat.get(route_id) {
        Some(RouteEntry::Ready(r)) => {
            let text = match format {
                Format::Text => hydrate::render_text(r),
                Format::Dot => hydrate::render_dot(r),
                Format::Mermaid => hydrate::render_mermaid(r),
            };
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(RouteEntry::Broken(b)) => {
            eprintln!("fabric: route `{route_id}` cannot be hydrated:");
            for d in &b.problems {
                eprintln!("  {d}");
            }
            ExitCode::from(EXIT_USAGE)
        }
        None => {
            eprintln!("fabric: unknown route `{route_id}`");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn read_input(arg: Option<&str>) -> std::io::Result<String> {
    match arg {
        None | Some("-") => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            Ok(s)
        }
        Some(path) => std::fs::read_to_string(path),
    }
}

fn validate_cmd(schema_path: &Path, reply: Option<&str>) -> ExitCode {
    let schema: serde_json::Value =
        match std::fs::read_to_string(schema_path).map_err(|e| e.to_string()).and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string())) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fabric: cannot read schema {}: {e}", schema_path.display());
                return ExitCode::from(EXIT_USAGE);
            }
        };
    let raw = match read_input(reply) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fabric: cannot read the reply: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let flat = match FlatSchema::from_json(&schema) {
        Ok(f) => f,
        Err(why) => {
            // What the stage would do: a plain text call whose reply is the slot value as is.
            eprintln!(
                "fabric: schema {} is not bindable ({why}); a stage with it runs as a plain text call and keeps the reply as text",
                schema_path.display()
            );
            println!("{raw}");
            return ExitCode::SUCCESS;
        }
    };
    match structured::decode_reply(&flat, &raw) {
        Ok(d) => {
            println!("{}", d.slot_value());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", e.reason_class());
            eprintln!("fabric: {}", e.detail());
            ExitCode::from(EXIT_FAILED)
        }
    }
}

async fn run_cmd(cli: &Cli, route_id: &str, goal: &str, prefetch: Option<&Path>, events_out: Option<&str>) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("fabric: {msg}");
        ExitCode::from(EXIT_USAGE)
    };
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => return usage(format!("bad configuration: {e}")),
    };
    let goal = match exec::parse_goal(goal) {
        Ok(g) => g,
        Err(e) => return usage(format!("--goal: {e}")),
    };
    let prefetch = match prefetch {
        None => Vec::new(),
        Some(p) => match std::fs::read_to_string(p).map_err(|e| e.to_string()).and_then(|t| exec::parse_prefetch(&t)) {
            Ok(chunks) => chunks,
            Err(e) => return usage(format!("--prefetch {}: {e}", p.display())),
        },
    };
    let catalogue = Arc::new(load(cli));
    let mut stub = None;
    let mut profile_llms = std::collections::HashMap::new();
    let llm = if settings.stub {
        match StubLlm::load(&cli.stub_dir) {
            Ok(s) => {
                let s = s.with_latency(settings.stub_latency).strict(settings.stub_strict);
                stub = Some(s.clone());
                crate::llm::stack::build(s, settings.retry)
            }
            Err(problems) => {
                for d in problems {
                    eprintln!("{d}");
                }
                return usage(format!("stub scripts in {} have errors", cli.stub_dir.display()));
            }
        }
    } else {
        // Every stack is built before the run starts, so a missing key stops us before inference.
        let client = crate::llm::stack::client();
        if settings.honor_model_profile {
            match crate::llm::stack::profile_stacks(&settings, &client, catalogue.profiles()) {
                Ok(stacks) => profile_llms = stacks,
                Err(e) => return usage(format!("bad configuration: {e}")),
            }
        }
        match crate::llm::stack::provider_stack(&settings, &client) {
            Ok(l) => l,
            Err(e) => return usage(format!("bad configuration: {e}")),
        }
    };
    let runner = Runner::new(catalogue, llm, Arc::new(|k: &str| std::env::var(k).ok()))
        .with_fleet(settings.fleet.clone())
        .with_profile_llms(profile_llms)
        // The binary's built-in in-process tools (library users register their own).
        .with_tool("add", crate::tools::builtin_add());
    let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
    match events_out {
        None => {}
        Some("-") => sinks.push(Arc::new(JsonLinesSink::new(Box::new(std::io::stderr())))),
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => sinks.push(Arc::new(JsonLinesSink::new(Box::new(std::io::BufWriter::new(f))))),
            Err(e) => return usage(format!("--events-out {path}: {e}")),
        },
    }
    if events_out != Some("-") && std::io::stderr().is_terminal() {
        sinks.push(Arc::new(Progress::default()));
    }
    let sink: Arc<dyn EventSink> = match sinks.len() {
        0 => Arc::new(NullSink),
        1 => sinks.pop().unwrap_or_else(|| Arc::new(NullSink)),
        _ => Arc::new(FanOut(sinks)),
    };
    let result = match runner.run(RunRequest { route_id: route_id.to_owned(), goal, prefetch }, sink).await {
        Ok(r) => r,
        Err(e) => return usage(e.to_string()),
    };
    println!("{}", serde_json::to_string(&result).unwrap_or_default());
    if let Some(stub) = stub.as_ref().filter(|s| s.is_strict()) {
        let unused = stub.unconsumed(&result.llm_calls);
        if !unused.is_empty() {
            for u in &unused {
                eprintln!("fabric: strict stub: {u}");
            }
            return ExitCode::from(EXIT_FAILED);
        }
    }
    match result.status {
        RunStatus::Completed => ExitCode::SUCCESS,
        RunStatus::Failed => ExitCode::from(EXIT_FAILED),
        RunStatus::AwaitingInput => ExitCode::from(EXIT_AWAITING),
    }
}

async fn doctor_cmd(cli: &Cli, probe: bool) -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            println!("configuration: ERROR {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    println!("configuration: ok");
    for (var, value, origin) in settings.describe() {
        println!("  {var}={value}  ({origin})");
    }
    println!("backend: {}", if settings.stub { "seeded stub (FABRIC_LLM_STUB)" } else { "provider" });
    println!("model: {} (from {})", settings.model_string.0, settings.model_string.1);
    match &settings.target {
        Some(t) => {
            println!("  provider: {}  model: {}  base_url: {}", t.provider.key(), t.model, t.base_url);
            if t.provider == crate::config::ProviderKind::Gemini {
                println!("  api_version: {}", t.api_version);
            }
            println!("  api key: {}", t.api_key_var.as_deref().map_or("none".to_owned(), |v| format!("set (from {v})")));
        }
        None => println!("  provider: not resolvable (not needed with the stub)"),
    }
    let r = settings.retry;
    println!("retry: {} attempts, base {:?}, cap {:?}", r.max_attempts, r.base, r.max_backoff);
    println!("fixed: temperature {}, max tokens {}, timeout {:?}", crate::llm::TEMPERATURE, crate::llm::MAX_OUTPUT_TOKENS, crate::llm::CALL_TIMEOUT);
    println!("model profiles: {}", if settings.honor_model_profile { "select the model (FABRIC_HONOR_MODEL_PROFILE)" } else { "metadata only" });
    println!("fleet: {}", settings.fleet.as_deref().unwrap_or("(none: serves every route)"));
    let cat = load(cli);
    println!("catalogue: {} ({} routes, {} errors)", cli.catalogue.display(), cat.routes().count(), cat.error_count());
    if !probe {
        return ExitCode::SUCCESS;
    }
    let llm = if settings.stub {
        crate::llm::stack::build(StubLlm::default(), settings.retry)
    } else {
        match crate::llm::stack::provider_stack(&settings, &crate::llm::stack::client()) {
            Ok(l) => l,
            Err(e) => {
                println!("probe: ERROR {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    };
    let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let output = crate::catalogue::defs::OutputSpec::Bindable(Arc::new(FlatSchema::from_json(&schema).unwrap_or_else(|_| unreachable!("a flat schema"))));
    let events = crate::events::RunEvents::new("doctor", "doctor", None, Arc::new(NullSink));
    let req = crate::llm::LlmRequest {
        events: &events,
        route_id: "doctor",
        stage_id: "probe",
        turn: 0,
        system: "Reply with JSON only.",
        user: "Reply with {\"ok\": true}.",
        output: &output,
        cx: &opentelemetry::Context::current(),
    };
    let started = Instant::now();
    match llm.complete(&req).await {
        Ok(reply) => {
            println!("probe: ok in {:.0} ms: {}", started.elapsed().as_secs_f64() * 1000.0, reply.value.slot_value());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("probe: FAILED ({}) {}", e.class.as_str(), e.message);
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Live progress on a terminal: one line per stage, with model-call timings.
#[derive(Default)]
struct Progress {
    started: Mutex<Option<Instant>>,
}

impl EventSink for Progress {
    fn emit(&self, e: &Event) {
        let get = |k: &str| match e.data.get(k) {
            None => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) if n.is_f64() => format!("{:.1}", n.as_f64().unwrap_or_default()),
            Some(v) => v.to_string(),
        };
        let stage = e.stage_id.as_deref().unwrap_or("");
        let indent = if e.parent_run_id.is_some() { "    " } else { "" };
        let line = match e.kind {
            "run.started" => {
                if let Ok(mut s) = self.started.lock() {
                    s.get_or_insert_with(Instant::now);
                }
                format!("{indent}▶ {} ({} path)", e.route_id, get("path"))
            }
            "run.stage.started" => format!("{indent}  • {stage} [{}] …", get("llm_role")),
            "run.llm.completed" => format!("{indent}      model {} ms, {} → {} tokens", get("duration_ms"), get("input_tokens"), get("output_tokens")),
            "run.llm.failed" => format!("{indent}      model failed: {} ({})", get("reason_class"), get("message")),
            "run.tool.completed" => format!("{indent}      tool {} HTTP {} in {} ms", get("tool"), get("status"), get("duration_ms")),
            "run.tool.failed" => format!("{indent}      tool {} failed: {}", get("tool"), get("reason_class")),
            "run.stage.completed" => format!("{indent}  ✓ {stage} {} ms", get("duration_ms")),
            "run.stage.failed" => format!("{indent}  ✗ {stage}: {}", get("reason_class")),
            "run.completed" => format!("{indent}✔ completed in {} ms", get("duration_ms")),
            "run.failed" => format!("{indent}✘ failed: {} — {}", get("reason_class"), get("message")),
            _ => return,
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}
