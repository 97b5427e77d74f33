//! The executor: the [`Runner`] and its ways into a run.
//!
//! [`Runner::execute`] is the one way into a run: a [`Begin`] says whether it is new, recovered
//! after its process died, continued after the user replied, or replayed, and so where its
//! replies come from (`source`: live, journal-then-live, or journal-only); it builds the run's
//! events and state and hands them to the one walk (`walk`, or `decision_loop` for a decision-loop route). The stage handlers (`stage`)
//! call the model (`model`) and the tools (`tool`) only when that source says so. Run state is
//! explicit (`state`) so that a journal (`journal`) can record it stage by stage; every model
//! call goes through the [`Llm`] port and every tool call through the
//! [`HttpPort`](crate::tools::HttpPort) or a registered [`Tool`]; the executor itself does no
//! other I/O.

mod agent;
mod decision_loop;
mod input;
mod journal;
pub mod message;
mod model;
mod result;
mod source;
mod stage;
mod state;
mod tool;
mod walk;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use serde_json::{Map, Value};

pub use input::{GoalError, PrefetchError, parse_goal, parse_prefetch};
pub use journal::{Durable, JournalBatch, JournalEntry, JournalError, OpenCall, RunHistory, RunJournal, ToolAsk, open_call};
pub use result::{Problems, ReplayReport, RunEnd, RunFailure, RunResult, RunStatus, Slots, StartError, ended_from_journal, result_from_journal};
use source::ReplySource;
use state::{Run, RunState};

use crate::cancel::Cancel;
use crate::catalogue::{Catalogue, DEFAULT_TOOL_TIMEOUT_MS, RouteLookupError};
use crate::events::{EventData, EventSink, RunEvents};
use crate::failure::{ClientError, ReasonClass};
use crate::hydrate::Route;
use crate::llm::Llm;
use crate::tools::mcp::McpPort;
use crate::tools::{HttpPort, HttpTools, Tool};

/// Child runs nest at most this deep (a route that starts itself stops here).
pub const MAX_CHILD_DEPTH: u32 = 4;

/// The largest prefetch pack read (`fabric run --prefetch`).
pub const MAX_PREFETCH_BYTES: u64 = 16 * 1024 * 1024;

/// Where a run begins, and so where each stage's reply or tool result comes from
/// ([`source::ReplySource`]).
#[derive(Debug, Clone)]
pub enum Begin {
    /// A new run under this id (a service names a run before it starts it): every reply live.
    New { run_id: String },
    /// A run whose process died: walked again from the start taking every recorded reply and
    /// result from its journal (events muted), then live from where the journal ends; its
    /// events go on from `next_seq`.
    Recover(RunHistory),
    /// A run that asked the user. A decision loop: its state rebuilt from the journal, the reply
    /// made a note (`user: <reply>`) the next decision sees (or sent to the agent that asked),
    /// then live with the turns it had left. A workflow (its stage's agent asked): walked again
    /// from its journal (events muted) to that stage, whose agent gets the reply, then live.
    /// Events go on from `next_seq`.
    Continue { history: RunHistory, reply: String },
    /// A finished run again from its journal alone: no model and no tool call; every difference
    /// (a prompt, a user message, a result, a path the journal does not have) is one of the
    /// result's `divergences`, and a call the journal lacks fails with `replay_diverged`.
    Replay(Vec<JournalEntry>),
}

/// What a caller asks for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub route_id: String,
    pub goal: Map<String, Value>,
    pub prefetch: Vec<String>,
}

/// Refuses a goal that does not match the route's `goal_schema` (a new run's only check of
/// its goal: a run taken up again was checked when it started).
pub fn check_goal(route: &Route, goal: &Map<String, Value>) -> Result<(), StartError> {
    let problems = route.goal_problems(goal);
    if problems.is_empty() { Ok(()) } else { Err(StartError::InvalidGoal { route: route.id().to_owned(), problems }) }
}

/// The events of a top-level run, numbered from `first_seq` (a run started, or continued where
/// its record stops), and kept for its journal when it has one.
fn top_events(run_id: &str, route: &Route, sink: Arc<dyn EventSink>, first_seq: u64, journal: Option<&dyn RunJournal>) -> RunEvents {
    let events = RunEvents::new(run_id, route.shared_id().clone(), None, sink);
    if journal.is_some() { events.recording(first_seq) } else { events.numbered_from(first_seq) }
}

/// Resolves `${VAR}` in tool URLs (the process environment in the CLI, a map in tests).
pub type VarLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A model stack, or why a model profile cannot be used in this process.
pub type ProfileStack = Result<Arc<dyn Llm>, ProfileError>;

/// Why a model profile cannot be used in this process (the runtime finds out when it builds the
/// profiles' stacks): the routes that use it are refused at start with it, and `fabric doctor`
/// names it. `profile` is the profile as a person finds it: `model profile `fast` (path:line:col)`.
/// Here, beside [`ProfileStack`], because the runner refuses with it and sits below the runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("{profile} names no model and the process has no provider configured")]
    NoProvider { profile: String },
    #[error("{profile}: routing moves as one unit; set model")]
    NoModel { profile: String },
    #[error("{profile}: provider `{provider}` is not supported")]
    UnknownProvider { profile: String, provider: String },
    /// Its model string does not read, or its provider's settings (key variable, base URL) are
    /// not usable here.
    #[error("{0}")]
    Config(#[from] crate::llm::model::ConfigError),
}

/// The default bound of an in-process tool call: that of an HTTP tool's `invoke.timeout_ms`.
const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_millis(DEFAULT_TOOL_TIMEOUT_MS);

/// Runs routes of one catalogue with one LLM stack.
pub struct Runner {
    catalogue: Arc<Catalogue>,
    llm: Arc<dyn Llm>,
    http: Arc<dyn HttpPort>,
    /// MCP tool calls, when the catalogue declares MCP servers.
    mcp: Option<Arc<dyn McpPort>>,
    /// A2A agents called as tools, when the runtime has a client for them.
    a2a: Option<Arc<dyn crate::tools::a2a::A2aPort>>,
    vars: VarLookup,
    fleet: Option<String>,
    /// Per-profile stacks when model profiles select the model (opt-in); a profile that cannot
    /// be used here keeps the reason, and only its routes are refused.
    profile_llms: HashMap<String, ProfileStack>,
    /// In-process tools, by capability name.
    tools: HashMap<String, Arc<dyn Tool>>,
    /// How long an in-process tool call may take (an HTTP tool has its `invoke.timeout_ms`).
    tool_timeout: Duration,
    /// Where new run ids come from (top-level and child runs).
    ids: RunIds,
}

/// A source of new run ids: [`new_run_id`] (time-ordered UUIDv7s) unless an embedder gives its
/// own. A simulation gives a seeded one, so that one seed names its runs the same every time
/// (and claims, which take the oldest id first, come in the same order). Each id must be a
/// canonical lowercase UUID, ordered by start as UUIDv7s are: the store and the API parse them.
pub type RunIds = Arc<dyn Fn() -> String + Send + Sync>;

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("fleet", &self.fleet).field("tools", &self.tools.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl Runner {
    /// `vars` resolves `${VAR}` in tool URLs (the process environment in the CLI). Fails only
    /// when the HTTP client of the tools cannot be built.
    pub fn new(catalogue: Arc<Catalogue>, llm: Arc<dyn Llm>, vars: VarLookup) -> Result<Runner, ClientError> {
        Ok(Runner::with_port(catalogue, llm, vars, Arc::new(HttpTools::new()?)))
    }

    /// [`Runner::new`] with HTTP tool calls through `http` from the start: no HTTP client is
    /// built (reqwest's takes about 18 ms, most of a test runtime's start; the simulation
    /// builds three runtimes per seed).
    pub fn with_port(catalogue: Arc<Catalogue>, llm: Arc<dyn Llm>, vars: VarLookup, http: Arc<dyn HttpPort>) -> Runner {
        Runner {
            catalogue,
            llm,
            http,
            mcp: None,
            a2a: None,
            vars,
            fleet: None,
            profile_llms: HashMap::new(),
            tools: HashMap::new(),
            tool_timeout: DEFAULT_TOOL_TIMEOUT,
            ids: Arc::new(new_run_id),
        }
    }

    /// Sends HTTP tool calls through `http` instead of the real client (tests, embedders).
    pub fn with_http(mut self, http: Arc<dyn HttpPort>) -> Runner {
        self.http = http;
        self
    }

    /// Sends MCP tool calls through `mcp` (the process's [`crate::tools::mcp::McpServers`]).
    pub fn with_mcp(mut self, mcp: Option<Arc<dyn McpPort>>) -> Runner {
        self.mcp = mcp;
        self
    }

    /// Sends each route's model calls to the stack of its `model_profile`, where one is given.
    pub fn with_profile_llms(mut self, stacks: HashMap<String, ProfileStack>) -> Runner {
        self.profile_llms = stacks;
        self
    }

    /// The catalogue this runner runs routes of.
    pub fn catalogue(&self) -> &Arc<Catalogue> {
        &self.catalogue
    }

    /// The default model stack.
    pub fn llm(&self) -> &Arc<dyn Llm> {
        &self.llm
    }

    /// The model stack calls of `profile` go through: its own when profiles select the model,
    /// else the default; or why it cannot be used here.
    pub fn profile_llm(&self, profile: &str) -> Result<&Arc<dyn Llm>, ProfileError> {
        match self.profile_llms.get(profile) {
            Some(Ok(llm)) => Ok(llm),
            Some(Err(e)) => Err(e.clone()),
            None => Ok(&self.llm),
        }
    }

    /// Makes this runtime fleet `fleet`: routes targeted at another fleet are refused.
    pub fn with_fleet(mut self, fleet: Option<String>) -> Runner {
        self.fleet = fleet;
        self
    }

    /// Bounds every in-process tool call by `timeout` (default 10 s, as an HTTP tool's
    /// `invoke.timeout_ms`): past it the call fails with `tool_timeout` and the run goes on
    /// without waiting for the tool: its future is dropped. A tool that cannot be cancelled that
    /// way (a Python function on a thread) keeps its thread until it returns; its result is
    /// dropped.
    pub fn with_tool_timeout(mut self, timeout: Duration) -> Runner {
        self.tool_timeout = timeout;
        self
    }

    /// Takes new run ids from `ids` instead of [`new_run_id`] (see [`RunIds`]).
    pub fn with_run_ids(mut self, ids: RunIds) -> Runner {
        self.ids = ids;
        self
    }

    /// A new run id, from this runner's source.
    pub fn new_id(&self) -> String {
        (self.ids)()
    }

    /// Registers an in-process tool for the catalogue capability `name` (one without `invoke`).
    pub fn with_tool(mut self, name: &str, tool: Arc<dyn Tool>) -> Runner {
        self.tools.insert(name.to_owned(), tool);
        self
    }

    /// Checks that the route can start here.
    pub fn route(&self, route_id: &str) -> Result<&Arc<Route>, StartError> {
        let route = self.catalogue.route(route_id).map_err(|e| match e {
            RouteLookupError::Unknown { known, unloaded } => StartError::UnknownRoute {
                route: route_id.into(),
                known: crate::catalogue::name_list(&known),
                unloaded: if unloaded.is_empty() {
                    String::new()
                } else {
                    let files: Vec<String> = unloaded.iter().map(|d| format!("\n  {d}")).collect();
                    format!("\n{} catalogue file(s) failed to load; a route defined there is missing:{}", unloaded.len(), files.concat())
                },
            },
            RouteLookupError::Broken(b) => StartError::BrokenRoute { route: route_id.into(), problems: Problems(b.problems.clone()) },
        })?;
        if let (Some(fleet), Some(target)) = (&self.fleet, route.activation_target())
            && fleet != target
        {
            return Err(StartError::WrongFleet { route: route_id.into(), target: target.to_owned(), fleet: fleet.clone() });
        }
        if let Some(tool) = route.tools().find(|t| t.def.invoke.is_none() && t.def.mcp.is_none() && t.def.a2a.is_none() && !self.tools.contains_key(&t.name)) {
            return Err(StartError::ToolNotRegistered { route: route_id.into(), tool: tool.name.clone() });
        }
        if let Some(Err(e)) = self.profile_llms.get(route.model_profile()) {
            return Err(StartError::ProfileUnusable { route: route_id.into(), profile: route.model_profile().to_owned(), problem: e.clone() });
        }
        Ok(route)
    }

    /// Runs a route to its end under a new id, with no journal and no way to cancel it (a library
    /// caller's shortest way in). Failures of the run itself are in the result, not an `Err`.
    pub async fn run(&self, req: RunRequest, sink: Arc<dyn EventSink>) -> Result<RunResult, StartError> {
        self.execute(req, Begin::New { run_id: self.new_id() }, sink, Cancel::never(), None).await
    }

    /// Runs `req` from where `begin` says, to its end or its question: the one way into the walk.
    /// With `journal`, the run's record is committed as it goes; when `cancel` fires, the call in
    /// flight ends and the run fails with `interrupted` (stopped) or ends `cancelled` (cancelled
    /// on request), keeping what it did. A replay neither
    /// records nor emits (its `journal` and `sink` are not used).
    pub async fn execute(
        &self,
        req: RunRequest,
        begin: Begin,
        sink: Arc<dyn EventSink>,
        cancel: Cancel,
        journal: Option<&dyn RunJournal>,
    ) -> Result<RunResult, StartError> {
        let route = self.route(&req.route_id)?.clone();
        if matches!(begin, Begin::New { .. }) {
            check_goal(&route, &req.goal)?;
        }
        let fresh = RunState::for_route(&route);
        let journal = journal.filter(|_| !matches!(begin, Begin::Replay(_)));
        let (events, state, reply) = match begin {
            Begin::New { run_id } => (top_events(&run_id, &route, sink, 1, journal), fresh, None),
            Begin::Recover(RunHistory { run_id, entries, next_seq, open }) => {
                let events = top_events(&run_id, &route, sink, next_seq, journal);
                if let Some(call) = &open {
                    let restarted = EventData::LlmRestarted { turn: call.turn, attempt: call.attempt + 1 };
                    events.continue_call(&call.stage_id, call.shown.then_some(restarted));
                }
                let state = RunState { source: ReplySource::recovering(entries, &events), open, ..fresh };
                (events, state, None)
            }
            Begin::Continue { history, reply } => {
                let events = top_events(&history.run_id, &route, sink, history.next_seq, journal);
                let note = message::compress_note(&format!("user: {reply}"));
                let mut state = RunState::continued(&route, history.entries, &reply, &note, &events)
                    .ok_or_else(|| StartError::NotResumable { route: route.id().to_owned() })?;
                if journal.is_some() {
                    state.pending.push(JournalEntry::UserReply { message: reply.clone(), note });
                }
                (events, state, Some(reply))
            }
            Begin::Replay(entries) => {
                let events = RunEvents::new(&self.new_id(), route.id(), None, Arc::new(crate::events::NullSink));
                (events, RunState { source: ReplySource::replaying(entries), ..fresh }, None)
            }
        };
        let run = Run::top(&route, &req, &events, &cancel, journal);
        Ok(self.run_route(run, &Context::current(), state, reply.as_deref()).await)
    }

    /// Ends a recovered run that cannot go on here (its route is gone from the catalogue, its
    /// start contract does not read): failed with `class`, keeping what its journal holds, with a
    /// last `run.failed` event, committed to `journal`.
    pub async fn abandon(
        &self,
        route_id: &str,
        history: RunHistory,
        class: ReasonClass,
        message: &str,
        sink: Arc<dyn EventSink>,
        journal: &dyn RunJournal,
    ) -> RunResult {
        let result = result_from_journal(&history.run_id, route_id, &history.entries, class, message);
        let last = EventData::RunFailed { reason_class: class, message: message.to_owned(), duration_ms: None, decisions: None };
        end_without_walk(result, last, history.next_seq, sink, journal).await
    }

    /// Ends a run cancelled on request that is not walking (it was queued, awaiting input, or
    /// its process died before it saw the request): `cancelled` with `reason`, keeping what its
    /// journal holds, with a last `run.cancelled` event, committed to `journal`.
    pub async fn end_cancelled(&self, route_id: &str, history: RunHistory, reason: &str, sink: Arc<dyn EventSink>, journal: &dyn RunJournal) -> RunResult {
        self.cancel_asked_agent(route_id, &history.entries).await;
        let result = ended_from_journal(&history.run_id, route_id, &history.entries, RunEnd::cancelled(reason));
        let last = EventData::RunCancelled { reason: reason.to_owned(), duration_ms: None };
        end_without_walk(result, last, history.next_seq, sink, journal).await
    }
}

/// Commits `result` with `last` as its only event (numbered `next_seq`).
async fn end_without_walk(result: RunResult, last: EventData, next_seq: u64, sink: Arc<dyn EventSink>, journal: &dyn RunJournal) -> RunResult {
    let events = RunEvents::new(&result.run_id, result.route_id.as_str(), None, sink).recording(next_seq);
    events.emit(None, || last);
    let taken = events.take_recorded();
    let durable = events.on_durable(&taken);
    let batch = JournalBatch { events: taken, entries: Vec::new(), end: Some(result.clone()) };
    if let Err(e) = journal.commit(&result.run_id, batch).await {
        let mut failed = result;
        failed.fail(ReasonClass::StoreError, format!("the run's record could not be written: {e}"));
        return failed;
    }
    if let Some(d) = durable {
        d();
    }
    result
}

/// Time-ordered run ids (UUIDv7), so ids sort by start time.
pub fn new_run_id() -> String {
    // Encoded straight into a buffer (the `Display` path goes through the formatter).
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf).to_owned()
}
