//! What `fabric bench` takes: its arguments (clap), the scenarios of BENCH.md, and the options
//! the scenarios read, parsed once.

use clap::Parser;

/// The command line. Its usage names it `fabric bench`: that is how the documentation runs it
/// (`fabric bench` execs this program with the same arguments), and its help stays the one the
/// subcommand had.
#[derive(Debug, Parser)]
#[command(name = "fabric-bench", bin_name = "fabric bench", version)]
#[command(about = "Run the BENCH.md scenarios with the seeded stub; JSON lines on stdout, a table on stderr.")]
pub struct Cli {
    /// Scenarios (repeat or comma-separate); all when absent.
    #[arg(long, value_delimiter = ',', value_enum)]
    scenario: Vec<Scenario>,
    /// Runs of the sequential scenarios (A, B, B-http); default 20000, 2000 with --instructions.
    #[arg(long)]
    runs: Option<usize>,
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
    /// Scenario C: before each level, load the same tool server alone with `wrk` (64
    /// connections, as the runtime opens at most) for SECS seconds, and report the level
    /// against the floor that capacity sets (needs `wrk` on PATH).
    #[arg(long, value_name = "SECS")]
    ceiling: Option<u64>,
    /// Serialise every event as JSON (to a discarding writer); default: no event consumer.
    #[arg(long)]
    events: bool,
    /// The bench routes without streaming (`stream: false` on the synthesis stage and the
    /// decision loop): what streaming costs is the difference (it streams only where events are
    /// watched: with --events, and always in S).
    #[arg(long)]
    no_stream: bool,
    /// Scenario S: concurrent clients of the service.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Scenario S: requests each client makes, one after the other.
    #[arg(long, default_value_t = 3)]
    requests: usize,
    /// The run store of scenarios A2, C2 and S (default a fresh SQLite file) and R (needed): a
    /// store URL (e.g. postgres://…, whose runs it adds to).
    #[arg(long)]
    journal: Option<String>,
    /// Scenario R: how many replicas share the database (runs: --runs).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    replicas: Vec<usize>,
    /// Instructions per run of A, A2, B and B-http, counted by valgrind's callgrind (machine
    /// independent): each scenario at --runs/2 and --runs runs, the difference per run
    /// (warm-up at most 100 runs; --events, --journal and --latency-ms apply).
    #[arg(long)]
    instructions: bool,
    /// The sequential scenarios without their per-run clock reads and percentiles (what
    /// --instructions runs under callgrind: it counts the runs, not the bench's own timing).
    #[arg(long, hide = true)]
    untimed: bool,
}

/// What to do: measure the scenarios, or count their instructions under callgrind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Measure,
    Instructions,
}

impl Cli {
    /// The mode and the options, the defaults that depend on the mode filled in.
    pub fn into_options(self) -> (Mode, BenchOptions) {
        let mode = if self.instructions { Mode::Instructions } else { Mode::Measure };
        let all = match mode {
            Mode::Measure => SCENARIOS,
            Mode::Instructions => INSTRUCTION_SCENARIOS,
        };
        let opts = BenchOptions {
            scenarios: if self.scenario.is_empty() { all.to_vec() } else { self.scenario },
            runs: self.runs.unwrap_or(if mode == Mode::Instructions { 2_000 } else { 20_000 }),
            warmup: self.warmup,
            concurrency: self.concurrency,
            latency_ms: self.latency_ms,
            routes: self.routes,
            no_tool: self.no_tool,
            ceiling_secs: self.ceiling,
            events: self.events,
            stream: !self.no_stream,
            clients: self.clients,
            requests: self.requests,
            journal: self.journal,
            replicas: self.replicas,
            untimed: self.untimed,
        };
        (mode, opts)
    }
}

/// Options of `fabric bench`.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub scenarios: Vec<Scenario>,
    /// Runs of the sequential scenarios (A, B, B-http).
    pub runs: usize,
    pub warmup: usize,
    /// Concurrency levels of scenario C.
    pub concurrency: Vec<usize>,
    /// Stub latency of scenario C (the sequential ones use 0 unless given).
    pub latency_ms: Option<u64>,
    /// Routes of scenario H.
    pub routes: usize,
    /// Scenario C without the tool call (diagnostic: the runtime's own cost under concurrency).
    pub no_tool: bool,
    /// Scenario C: seconds of `wrk` against the tool server alone before each level (the
    /// tool server's capacity, and the floor it sets).
    pub ceiling_secs: Option<u64>,
    /// Serialise every event as a JSON line (to a discarding writer) instead of having no consumer.
    pub events: bool,
    /// Whether the bench routes stream their model text (`--no-stream`: not).
    pub stream: bool,
    /// Scenario S: concurrent clients, and requests each makes.
    pub clients: usize,
    pub requests: usize,
    /// The store URL of scenarios A2, C2 and S (`None`: a fresh SQLite file) and R (required:
    /// replicas share one database).
    pub journal: Option<String>,
    /// Scenario R: replica counts, and the runs they share.
    pub replicas: Vec<usize>,
    /// The sequential scenarios skip their per-run timings (`--instructions` counts the runs,
    /// not the bench's clock reads and percentile sort).
    pub untimed: bool,
}

impl BenchOptions {
    /// How the results name the event consumer.
    pub fn events_name(&self) -> &'static str {
        if self.events { "json" } else { "none" }
    }
}

/// Every scenario, in the order a bare `fabric bench` runs them.
pub const SCENARIOS: &[Scenario] =
    &[Scenario::A, Scenario::A2, Scenario::B, Scenario::BHttp, Scenario::C, Scenario::C2, Scenario::H, Scenario::R, Scenario::S, Scenario::T];

/// The scenarios `--instructions` counts by default.
pub const INSTRUCTION_SCENARIOS: &[Scenario] = &[Scenario::A, Scenario::B, Scenario::BHttp];

/// A scenario of BENCH.md, spelled as `--scenario` takes it and as the JSON results name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    #[value(name = "A")]
    A,
    #[value(name = "A2")]
    A2,
    #[value(name = "B")]
    B,
    #[value(name = "B-http")]
    BHttp,
    #[value(name = "C")]
    C,
    #[value(name = "C2")]
    C2,
    #[value(name = "H")]
    H,
    #[value(name = "R")]
    R,
    #[value(name = "S")]
    S,
    /// The first text's latency behind a streaming provider's first byte.
    #[value(name = "T")]
    T,
}

impl Scenario {
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::A => "A",
            Scenario::A2 => "A2",
            Scenario::B => "B",
            Scenario::BHttp => "B-http",
            Scenario::C => "C",
            Scenario::C2 => "C2",
            Scenario::H => "H",
            Scenario::R => "R",
            Scenario::S => "S",
            Scenario::T => "T",
        }
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}
