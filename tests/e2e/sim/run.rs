//! One seed, end to end: the world is generated, the real store opened, and processes run one
//! after another on a paused clock, each a fresh runtime over the same store: the first starts
//! the world's runs; a crash drops the process's runtime where it stands, the clock jumps past
//! every lease, and the next process takes the runs over from their journals. Each process also
//! claims runs whose lease expired (a clock jump while runs go on: the old holder is fenced),
//! and answers the runs that ask, the way a user would, twice, late, or to the wrong run. What
//! a segment does when its record could not be written is what the service does: the lease is
//! let go, and a claim takes the run over.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabric::cancel::Cancel;
use fabric::config::Settings;
use fabric::events::{Event, EventSink};
use fabric::failure::ReasonClass;
use fabric::llm::stub::StubLlm;
use fabric::runtime::{Durable, ReplyError, Runtime, StartRequest};
use fabric::store::{RunFilter, RunStore, StoredStatus};
use rand::SeedableRng;
use tokio::task::JoinSet;

use super::faults::Faults;
use super::model::SimModel;
use super::store::{Jump, Real, Shared, SimStore};
use super::tools::{SimHttp, SimTool};
use super::trace::{Trace, normalized};
use super::world::{self, World};

/// The processes one seed may run (the first, and one per crash).
const PROCESSES: u32 = 3;
/// A process that has not settled by then (virtual time) hangs.
const DEADLINE: Duration = Duration::from_secs(6 * 3600);
/// Replies one run gets at the most (a loop that asks for ever is the world's, not a bug).
const REPLIES_PER_RUN: u32 = 3;
pub const RETRY_MAX: u32 = 3;

/// What one seed did.
pub struct Outcome {
    pub trace: Vec<String>,
    pub violations: Vec<String>,
    /// The faults that happened (`site#n kind`).
    pub injected: Vec<String>,
    /// The world's catalogue, for the report of a failing seed.
    pub files: String,
}

/// What a range of seeds exercised, counted from their traces (printed after the range, so a
/// harness that stopped injecting something shows it).
#[derive(Debug, Default)]
pub struct Stats {
    runs: u64,
    crashes: u64,
    clock_jumps: u64,
    takeovers: u64,
    fenced: u64,
    refused_writes: u64,
    lost_acks: u64,
    llm_faults: u64,
    tool_faults: u64,
    replies: u64,
    refused_replies: u64,
}

impl Stats {
    pub fn add(&mut self, trace: &[String]) {
        for l in trace {
            let n = |on: bool| u64::from(on);
            self.runs += n(l.starts_with("start "));
            self.crashes += n(l.contains(" crash at "));
            self.clock_jumps += n(l.contains("clock jump"));
            self.takeovers += n(l.contains(" claimed ") && !l.ends_with(" token 1"));
            self.fenced += n(l.contains(": lease lost"));
            self.refused_writes += n(l.ends_with("refused (fault)"));
            self.lost_acks += n(l.contains("acknowledgement is lost"));
            self.llm_faults += n(l.starts_with("llm ") && !l.ends_with(": ok"));
            self.tool_faults += n((l.starts_with("tool ") || l.starts_with("http ")) && !l.ends_with(": None"));
            self.replies += n(l.starts_with("reply to ") && !l.contains("refused"));
            self.refused_replies += n(l.contains("refused ("));
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Everything a process's sink sees.
struct Sink {
    trace: Arc<Trace>,
    events: Arc<Mutex<Vec<String>>>,
}

impl EventSink for Sink {
    fn emit(&self, e: &Event) {
        let json = e.to_json();
        let line = json.to_string();
        self.trace.log(format!("event {}", normalized(json)));
        self.events.lock().unwrap().push(line);
    }
}

/// The seed's run ids: UUIDv7s whose time is a counter and whose random bits come from the seed.
fn run_ids(seed: u64) -> impl Fn() -> String + Send + Sync + 'static {
    let n = std::sync::atomic::AtomicU64::new(0);
    move || {
        let k = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let bits = super::faults::mix(seed ^ super::faults::mix(k)).to_le_bytes();
        let mut random = [0u8; 10];
        random[..8].copy_from_slice(&bits);
        random[8..].copy_from_slice(&(k as u16).to_le_bytes());
        uuid::Builder::from_unix_timestamp_millis(1_700_000_000_000 + k, &random).into_uuid().to_string()
    }
}

/// Where the real store is.
#[derive(Debug, Clone)]
pub enum Db {
    Sqlite,
    /// A PostgreSQL server (`FABRIC_TEST_POSTGRES_URL`): a new database per seed.
    Postgres(String),
}

pub struct Seed<'a> {
    pub seed: u64,
    pub disabled: &'a BTreeSet<String>,
    pub db: &'a Db,
}

/// Opens the real store of one seed: a SQLite file in `dir`, or a new PostgreSQL database.
fn open(db: &Db, seed: u64, dir: &std::path::Path) -> Arc<Real> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (url, jump) = match db {
        Db::Sqlite => {
            let url = format!("sqlite://{}", dir.join("sim.db").display());
            let store = rt.block_on(fabric::store::open(&url)).expect("the simulation's SQLite store opens");
            let pool = rt.block_on(sqlx::SqlitePool::connect(&url)).expect("a second connection to the store");
            return Arc::new(Real { store, rt, jump: Jump::Sqlite(pool) });
        }
        Db::Postgres(base) => {
            // A database of its own, named after the seed and this process's run of it.
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let name = format!("fabric_sim_{seed}_{}_{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
            let (head, _) = base.rsplit_once('/').expect("FABRIC_TEST_POSTGRES_URL ends with /DATABASE");
            let url = format!("{head}/{name}");
            rt.block_on(async {
                let admin = sqlx::PgPool::connect(base).await.expect("the test PostgreSQL server answers");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.expect("a database per seed");
                admin.close().await;
            });
            let pool = rt.block_on(sqlx::PgPool::connect(&url)).expect("a second connection to the store");
            (url, Jump::Postgres(pool))
        }
    };
    let store = rt.block_on(fabric::store::open(&url)).expect("the simulation's PostgreSQL store opens");
    Arc::new(Real { store, rt, jump })
}

pub fn run(s: &Seed<'_>) -> Outcome {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s.seed);
    let world = world::generate(&mut rng);
    let dir = tempfile::tempdir().unwrap();
    let real = open(s.db, s.seed, dir.path());
    let faults = Arc::new(Faults::new(s.seed, s.disabled.clone()));
    let trace = Arc::new(Trace::default());
    let shared = Arc::new(Shared::default());
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut violations = Vec::new();
    trace.log(format!("seed {} rates {:?}", s.seed, faults.rates));
    if faults.fault("crash", if faults.rates.crash { 1.0 } else { 0.0 }, &["crash"]).is_some() {
        let at = faults.pick("crash:at", 8 * world.starts.len().max(1)) as u64;
        let after = faults.pick("crash:after", 2) == 1;
        *shared.crash_at.lock().unwrap() = Some((at, after));
        trace.log(format!("crash planned at store call {at} (after it: {after})"));
    }
    let ids: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(run_ids(s.seed));
    let mut replies: HashMap<String, u32> = HashMap::new();
    for process in 0..PROCESSES {
        let store = Arc::new(SimStore::new(real.clone(), faults.clone(), trace.clone(), shared.clone(), process));
        let model = sim_model(&world, &faults, &trace, &shared);
        let runtime = Arc::new(build(&world, s.seed, store, model, &faults, &trace, ids.clone()));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        let p = Process {
            runtime,
            trace_events: (trace.clone(), events.clone()),
            shared: shared.clone(),
            world: &world,
            faults: &faults,
            trace: &trace,
            first: process == 0,
        };
        let settled = rt.block_on(async {
            tokio::select! {
                biased;
                _ = shared.crash_signal.notified() => Ok(false),
                done = tokio::time::timeout(DEADLINE, p.work(&mut replies)) => done.map(|v| { violations.extend(v); true }),
            }
        });
        // Whatever the process still had going dies with its runtime.
        drop(rt);
        match settled {
            Ok(true) => break,
            Ok(false) => {
                trace.log(format!("p{process} crashed; the clock jumps past every lease"));
                real.jump_clock();
                shared.crashed.store(false, std::sync::atomic::Ordering::SeqCst);
            }
            Err(_) => {
                violations.push(format!("process {process} had not settled after {} h of virtual time (a hang)", DEADLINE.as_secs() / 3600));
                break;
            }
        }
    }
    violations.append(&mut shared.violations.lock().unwrap());
    let replay = build(&world, s.seed, real.store.clone(), sim_model(&world, &faults, &trace, &shared), &faults, &trace, ids);
    violations.extend(super::check::after(&real, replay, &world, &events.lock().unwrap()));
    Outcome { trace: trace.lines(), violations, injected: faults.injected(), files: world.files() }
}

/// The model port of one process: the world's scripts in the stub, the faults on top.
fn sim_model(world: &World, faults: &Arc<Faults>, trace: &Arc<Trace>, shared: &Arc<Shared>) -> SimModel {
    let mut stub = StubLlm::default();
    for s in &world.scripts {
        let lines: Vec<&str> = s.replies.iter().map(String::as_str).collect();
        stub = stub.script(&s.route_id, &s.stage_id, &lines);
    }
    let scripted = world.scripts.iter().map(|s| (s.route_id.clone(), s.stage_id.clone())).collect();
    SimModel { stub, scripted, faults: faults.clone(), trace: trace.clone(), shared: shared.clone() }
}

fn build(
    world: &World,
    seed: u64,
    store: Arc<dyn RunStore>,
    model: SimModel,
    faults: &Arc<Faults>,
    trace: &Arc<Trace>,
    ids: Arc<dyn Fn() -> String + Send + Sync>,
) -> Durable {
    let env: HashMap<String, String> = [
        ("FABRIC_LLM_STUB", "1".to_owned()),
        ("FABRIC_LLM_RETRY_MAX", RETRY_MAX.to_string()),
        ("FABRIC_LLM_RETRY_BASE_S", "0.5".to_owned()),
        ("FABRIC_TOOL_TIMEOUT_MS", "5000".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut settings = Settings::load(move |k| env.get(k).cloned()).expect("the simulation's settings");
    settings.retry.jitter_seed = Some(seed);
    let vars: HashMap<String, String> = world.vars.iter().cloned().collect();
    let mut builder = Runtime::builder()
        .settings(settings)
        .catalogue_texts(world.routes.clone(), world.packs.clone())
        .backend(Arc::new(model))
        .http(Arc::new(SimHttp { faults: faults.clone(), trace: trace.clone() }))
        .vars(move |k| vars.get(k).cloned())
        .run_ids(move || ids());
    for t in world.tools.iter().filter(|t| !t.http) {
        builder = builder.tool(&t.name, Arc::new(SimTool { name: t.name.clone(), faults: faults.clone(), trace: trace.clone() }));
    }
    Durable::new(builder.build().expect("the simulated world builds"), store)
}

struct Process<'a> {
    runtime: Arc<Durable>,
    /// What each segment's sink writes to.
    trace_events: (Arc<Trace>, Arc<Mutex<Vec<String>>>),
    shared: Arc<Shared>,
    world: &'a World,
    faults: &'a Arc<Faults>,
    trace: &'a Arc<Trace>,
    first: bool,
}

/// How a segment ended, for the service's rule: a run whose record could not be written is let go.
type Segment = (fabric::store::Lease, Option<ReasonClass>);

impl Process<'_> {
    /// A sink of its own for one segment (a run executed under one lease), so that a model call
    /// says which segment made it (`RunEvents::sink` is this one): see `Shared::check_going_on`.
    fn segment_sink(&self, lease: &fabric::store::Lease) -> Arc<dyn EventSink> {
        let (trace, events) = self.trace_events.clone();
        let sink: Arc<dyn EventSink> = Arc::new(Sink { trace, events });
        self.shared.segments.lock().unwrap().insert(super::store::sink_key(&sink), lease.clone());
        sink
    }

    /// Runs until nothing is left to do here; returns the violations it saw.
    async fn work(&self, replies: &mut HashMap<String, u32>) -> Vec<String> {
        let mut violations = Vec::new();
        let mut segments: JoinSet<Segment> = JoinSet::new();
        let mut live: HashMap<String, u32> = HashMap::new();
        if self.first {
            for (i, start) in self.world.starts.iter().enumerate() {
                let req =
                    StartRequest { route_id: start.route_id.clone(), goal: start.goal.clone(), prefetch: start.prefetch.clone(), ..StartRequest::default() };
                match self.runtime.accept(&req, true).await {
                    Ok(accepted) => {
                        let Some(lease) = accepted.lease else { continue };
                        self.trace.log(format!("start {i} {} = {}", start.route_id, lease.run_id()));
                        *live.entry(lease.run_id().to_owned()).or_default() += 1;
                        let (rt, sink) = (self.runtime.clone(), self.segment_sink(&lease));
                        segments.spawn(async move {
                            let class = match rt.execute(&lease, &req, &accepted.edition, sink, Cancel::never()).await {
                                Ok(o) => o.result.error().map(|e| e.reason_class),
                                Err(e) => panic!("an accepted run did not start: {e}"),
                            };
                            (lease, class)
                        });
                    }
                    Err(e) => self.trace.log(format!("start {i} {} refused: {e}", start.route_id)),
                }
                tokio::time::sleep(Duration::from_millis(self.faults.pick("start:gap", 2000) as u64)).await;
            }
        }
        loop {
            tokio::select! {
                joined = segments.join_next(), if !segments.is_empty() => {
                    match joined {
                        Some(Ok((lease, class))) => {
                            if let Some(n) = live.get_mut(lease.run_id()) { *n -= 1; }
                            if class == Some(ReasonClass::StoreError) {
                                let _ = self.runtime.release(&lease).await;
                            }
                        }
                        Some(Err(e)) => violations.push(format!("a run's task panicked: {e}")),
                        None => {}
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    let found = self.claim(&mut segments, &mut live).await;
                    if segments.is_empty() && !found && !self.reply(replies, &mut segments, &mut live).await {
                        return violations;
                    }
                }
            }
        }
    }

    /// Claims what may be claimed and resumes it; whether anything was.
    async fn claim(&self, segments: &mut JoinSet<Segment>, live: &mut HashMap<String, u32>) -> bool {
        let claimed = match self.runtime.claim_runs(8).await {
            Ok(c) => c,
            Err(e) => {
                self.trace.log(format!("claim failed: {e}"));
                return false;
            }
        };
        let any = !claimed.is_empty();
        for c in claimed {
            let lease = c.lease().clone();
            let older = live.get(lease.run_id()).copied().unwrap_or(0) > 0;
            self.note_recorded(lease.run_id(), older).await;
            *live.entry(lease.run_id().to_owned()).or_default() += 1;
            let (rt, sink) = (self.runtime.clone(), self.segment_sink(&lease));
            segments.spawn(async move {
                let outcome = rt.resume(c, sink, Cancel::never()).await;
                (lease, outcome.result.error().map(|e| e.reason_class))
            });
        }
        any
    }

    /// What a run's journal holds as it is taken over or continued: the model may not be
    /// asked for it again. Not while an older segment of the run still goes on (it is fenced at
    /// its next write, but may ask the model before that).
    async fn note_recorded(&self, run_id: &str, older_segment: bool) {
        self.shared.recorded.lock().unwrap().remove(run_id);
        if older_segment {
            return;
        }
        let store = self.runtime.store();
        let Ok(journal) = store.journal(run_id).await else { return };
        let replies = journal
            .into_iter()
            .filter_map(|e| match e {
                fabric::exec::JournalEntry::ModelReply { stage_id, turn, .. } => Some((stage_id, turn)),
                _ => None,
            })
            .collect();
        self.shared.recorded.lock().unwrap().insert(run_id.to_owned(), replies);
    }

    /// Answers the runs that ask (with the user's faults); whether a reply continued one.
    async fn reply(&self, replies: &mut HashMap<String, u32>, segments: &mut JoinSet<Segment>, live: &mut HashMap<String, u32>) -> bool {
        let store = self.runtime.store();
        let filter = RunFilter { status: Some(StoredStatus::AwaitingInput), limit: 1000, ..Default::default() };
        let Ok(mut waiting) = store.list_runs(&filter).await else { return false };
        waiting.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let mut any = false;
        for run in waiting {
            let n = replies.entry(run.run_id.clone()).or_default();
            if *n >= REPLIES_PER_RUN {
                continue;
            }
            *n += 1;
            let site = format!("user:{}", run.run_id);
            if self.faults.fault(&format!("{site}:late"), 0.3, &["late"]).is_some() {
                tokio::time::sleep(Duration::from_secs(60 + self.faults.pick(&site, 3600) as u64)).await;
            }
            if self.faults.fault("user:wrong", self.faults.rates.reply_wrong_run, &["wrong run"]).is_some() {
                self.wrong_reply(store.as_ref()).await;
            }
            let message = format!("sim reply {n}");
            let claimed = match self.runtime.claim_reply(&run.run_id, message.clone()).await {
                Ok(c) => c,
                Err(e) => {
                    self.trace.log(format!("reply to {} refused: {e}", run.run_id));
                    continue;
                }
            };
            self.trace.log(format!("reply to {}: {message}", run.run_id));
            if self.faults.fault("user:twice", self.faults.rates.reply_twice, &["twice"]).is_some() {
                match self.runtime.claim_reply(&run.run_id, message.clone()).await {
                    Ok(_) => self.shared.violation(format!("run {}: a second reply claimed a run that a first reply had", run.run_id)),
                    Err(e) => self.trace.log(format!("the same reply again to {}: {}", run.run_id, kind(&e))),
                }
            }
            let lease = claimed.lease().clone();
            self.note_recorded(lease.run_id(), false).await;
            *live.entry(lease.run_id().to_owned()).or_default() += 1;
            let (rt, sink) = (self.runtime.clone(), self.segment_sink(&lease));
            segments.spawn(async move {
                let class = match rt.continue_run(claimed, sink, Cancel::never()).await {
                    Ok(o) => o.result.error().map(|e| e.reason_class),
                    Err(e) => panic!("a claimed reply did not continue its run: {e}"),
                };
                (lease, class)
            });
            any = true;
        }
        any
    }

    /// A reply sent to a run that does not wait for one: refused, and it changes nothing.
    async fn wrong_reply(&self, store: &dyn RunStore) {
        let filter = RunFilter { limit: 1000, ..Default::default() };
        let Ok(mut runs) = store.list_runs(&filter).await else { return };
        runs.retain(|r| r.status != StoredStatus::AwaitingInput);
        runs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let Some(run) = runs.get(self.faults.pick("user:wrong:which", runs.len().max(1))) else { return };
        match self.runtime.claim_reply(&run.run_id, "sim reply to the wrong run".into()).await {
            Ok(_) => self.shared.violation(format!("run {} ({:?}) took a reply it did not ask for", run.run_id, run.status)),
            Err(e) => self.trace.log(format!("a reply to the wrong run {}: {}", run.run_id, kind(&e))),
        }
    }
}

fn kind(e: &ReplyError) -> String {
    match e {
        ReplyError::NotWaiting { status, .. } => format!("refused ({status})"),
        other => format!("refused: {other}"),
    }
}
