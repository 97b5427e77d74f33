//! The executor: walks a hydrated route's graph, one stage at a time.
//!
//! Run state is explicit (goal, prefetch chunks, notes, slots, per-stage results) so that a
//! journal can record it stage by stage; every model call goes through the [`Llm`] port and
//! every tool call through the [`HttpPort`] or a registered [`Tool`]; the executor itself does
//! no other I/O. Pattern 1 routes are driven by [`decision_loop`] with the same stage helpers.

mod decision_loop;
mod journal;
pub mod message;
mod source;

pub use journal::{JournalBatch, JournalEntry, RunHistory, RunJournal};
use source::ReplySource;

/// The `execute_tool {tool}` span of one tool call, under its stage's span. `tool_type` is the
/// GenAI convention's: `function` for an in-process tool, `extension` for an HTTP one.
fn tool_span(cx: &Context, run_id: &str, tool: &str, tool_type: &'static str) -> Context {
    crate::otel::child(
        cx,
        || format!("execute_tool {tool}").into(),
        SpanKind::Internal,
        || {
            vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("gen_ai.tool.type", tool_type),
                KeyValue::new("fabric.run_id", run_id.to_owned()),
            ]
        },
    )
}

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use opentelemetry::trace::SpanKind;
use opentelemetry::{Context, KeyValue};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::cancel::Cancel;
use crate::catalogue::{Catalogue, DEFAULT_TOOL_TIMEOUT_MS, RouteLookupError};
use crate::defs::{CondOp, Condition, Invoke, LlmRole};
use crate::events::{EventKind, EventSink, RunEvents};
use crate::failure::{BoxFuture, ReasonClass};
use crate::fields;
use crate::hydrate::{NextStep, NodeKind, Route, RoutePath, StageNode};
use crate::llm::telemetry::round_ms;
use crate::llm::{Llm, LlmRequest, OutputSpec, ReplyValue};
use crate::tools::{HttpPort, HttpTools, Tool, ToolError, display_url};

/// Child runs nest at most this deep (a route that starts itself stops here).
pub const MAX_CHILD_DEPTH: u32 = 4;

/// The largest prefetch pack read (`fabric run --prefetch`).
pub const MAX_PREFETCH_BYTES: u64 = 16 * 1024 * 1024;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Completed,
    Failed,
    AwaitingInput,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFailure {
    pub reason_class: ReasonClass,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage_id: Option<String>,
}

/// A run's slots: stage id → value, in the order the stages completed.
pub type Slots = IndexMap<String, String, foldhash::fast::RandomState>;

/// The result printed by `fabric run` and returned to library callers.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub run_id: String,
    pub route_id: String,
    pub status: RunStatus,
    pub output: Option<String>,
    /// Each completed stage's value by stage id, in completion order (keys are catalogue names:
    /// a fast hasher, nothing a caller controls to flood it with).
    pub slots: Slots,
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunFailure>,
    /// Model calls made, per (route, stage), children included; used by the strict stub check.
    /// The ids are the route's own (shared, not copied).
    #[serde(skip)]
    pub llm_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    /// A replay's divergences from the journal (see [`Runner::replay`]).
    #[serde(skip)]
    pub divergences: Vec<String>,
}

/// What a caller asks for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub route_id: String,
    pub goal: Map<String, Value>,
    pub prefetch: Vec<String>,
}

/// Refusals before a run starts (no events, no run id): exit code 2 territory.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("unknown route `{route}`; known routes: {known}{unloaded}")]
    UnknownRoute { route: String, known: String, unloaded: String },
    #[error("route `{route}` cannot run: the catalogue has errors in it:\n{problems}")]
    BrokenRoute { route: String, problems: String },
    #[error("route `{route}` is served by fleet `{target}`, but this runtime is fleet `{fleet}`")]
    WrongFleet { route: String, target: String, fleet: String },
    #[error("route `{route}` uses tool `{tool}`, which has no `invoke` URL and no in-process implementation registered")]
    ToolNotRegistered { route: String, tool: String },
    #[error("route `{route}` cannot run: its model profile `{profile}` cannot be used here: {message}")]
    ProfileUnusable { route: String, profile: String, message: String },
    #[error("route `{route}` cannot run with the stub: its script has errors:\n{problems}")]
    StubScriptBroken { route: String, problems: String },
    #[error("route `{route}` does not run a decision loop: only a decision-loop run can ask and be continued")]
    NotResumable { route: String },
}

impl StartError {
    /// A stable name for the refusal (front ends that are not the CLI or the HTTP API use it:
    /// the Python package's `reason_class`).
    pub fn code(&self) -> &'static str {
        match self {
            StartError::UnknownRoute { .. } => "unknown_route",
            StartError::BrokenRoute { .. } => "broken_route",
            StartError::WrongFleet { .. } => "wrong_fleet",
            StartError::ToolNotRegistered { .. } => "tool_not_registered",
            StartError::ProfileUnusable { .. } => "profile_unusable",
            StartError::StubScriptBroken { .. } => "stub_script_broken",
            StartError::NotResumable { .. } => "not_resumable",
        }
    }
}

/// What stays fixed during one run (a child run gets its own).
#[derive(Clone, Copy)]
struct Run<'a> {
    route: &'a Route,
    goal: &'a Map<String, Value>,
    prefetch: &'a [String],
    events: &'a RunEvents,
    /// 0 for a top-level run, +1 per child run level.
    depth: u32,
    /// The step budget: the route's `max_loop_steps`, never more than its parent's budget.
    budget: u32,
    /// Fires when the run is cancelled from outside; child runs share their parent's.
    cancel: &'a Cancel,
    /// Where the run's record goes, when it is journalled (top-level runs only).
    journal: Option<&'a dyn RunJournal>,
}

/// Mutable state of one run.
#[derive(Debug, Default)]
struct RunState {
    notes: Vec<String>,
    slots: Slots,
    /// Structured outputs (compact JSON) of the stages whose fields a branch condition reads
    /// (most routes have none), read only when a condition asks.
    structured: Vec<(Arc<str>, String)>,
    /// The goal's compact JSON, made at the run's first model call, shown in every call's message.
    goal_json: Option<String>,
    /// The last model call's user message, its buffer reused by the next.
    user_buf: String,
    /// Visits per node, indexed by node index (a handful of nodes: no hashing).
    visits: Vec<u32>,
    /// Model turns of the decision loop.
    turns: u32,
    /// Stages started so far (the next `stage_idx`).
    stages_started: u32,
    /// Journal entries not yet committed (journalled runs only).
    pending: Vec<JournalEntry>,
    /// Where the run's replies and tool results come from (the model and tool ports, its journal).
    source: ReplySource,
    /// Model calls per stage of this route: (route, stage, calls), as the result reports them.
    llm_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    child_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    last_output: Option<Last>,
}

/// What a completed run returns as its output: the slot of the stage that completed last (kept
/// as its place among the slots, not a copy of each stage's value), or a decision's answer.
#[derive(Debug)]
enum Last {
    Slot(usize),
    Answer(String),
}

/// A stage between `begin_stage` and `end_stage`: its node, start time and span context.
struct OpenStage<'s> {
    stage: &'s StageNode,
    started: crate::events::Stopwatch,
    /// The stage's trace context: the parent of its model call's span.
    cx: Context,
}

/// How a walk ended when it did not fail.
enum Finish {
    Completed,
    AwaitingInput(String),
}

struct StageFailure {
    class: ReasonClass,
    message: String,
    /// Extra data for the `run.failed` event (the last decisions of a loop that ran out).
    detail: Option<Value>,
}

/// What `fabric replay` found: every divergence, and the result of the replayed run.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub divergences: Vec<String>,
    pub result: RunResult,
}

/// The events of a top-level run, numbered from `first_seq` (a run started, or continued where
/// its record stops), and kept for its journal when it has one.
fn top_events(run_id: &str, route: &Route, sink: Arc<dyn EventSink>, first_seq: u64, journal: Option<&dyn RunJournal>) -> RunEvents {
    let events = RunEvents::new(run_id, route.shared_id().clone(), None, sink);
    if journal.is_some() { events.recording(first_seq) } else { events.numbered_from(first_seq) }
}

/// The result of a run that stopped without its process: what its journal holds (slots, notes,
/// the last output), failed with `class` and `message`.
pub fn result_from_journal(run_id: &str, route_id: &str, history: &[JournalEntry], class: ReasonClass, message: &str) -> RunResult {
    let state = RunState::from_history(&Arc::from(route_id), "", history);
    RunResult {
        run_id: run_id.to_owned(),
        route_id: route_id.to_owned(),
        status: RunStatus::Failed,
        output: None,
        slots: state.slots,
        notes: state.notes,
        question: None,
        error: Some(RunFailure { reason_class: class, message: message.to_owned(), stage_id: None }),
        llm_calls: Vec::new(),
        divergences: Vec::new(),
    }
}

impl<'a> Run<'a> {
    /// A top-level run of `route` (not a child run).
    fn top(route: &'a Route, req: &'a RunRequest, events: &'a RunEvents, cancel: &'a Cancel, journal: Option<&'a dyn RunJournal>) -> Run<'a> {
        Run { route, goal: &req.goal, prefetch: &req.prefetch, events, depth: 0, budget: route.max_loop_steps(), cancel, journal }
    }
}

impl RunState {
    /// A new run's state, with room for each of the route's stages (its slots and their
    /// counters are then made once, not grown stage by stage).
    fn for_route(route: &Route) -> RunState {
        let stages = route.graph().node_count();
        RunState { slots: Slots::with_capacity_and_hasher(stages, Default::default()), visits: vec![0; stages], ..RunState::default() }
    }

    /// The state a journal describes: notes, slots and the last output in order, model calls per
    /// stage, the decision loop's turns (the calls of its `decide` node).
    fn from_history(route_id: &Arc<str>, decide_id: &str, history: &[JournalEntry]) -> RunState {
        let mut state = RunState::default();
        for entry in history {
            match entry {
                JournalEntry::ModelReply { stage_id, .. } => match state.llm_calls.iter_mut().find(|(_, id, _)| **id == **stage_id) {
                    Some(c) => c.2 += 1,
                    None => state.llm_calls.push((route_id.clone(), stage_id.as_str().into(), 1)),
                },
                JournalEntry::StageCompleted { stage_id, value, note } => {
                    state.stages_started += 1;
                    state.notes.extend(note.iter().cloned());
                    let (at, _) = state.slots.insert_full(stage_id.clone(), value.clone());
                    state.last_output = Some(Last::Slot(at));
                }
                JournalEntry::Note { note } => {
                    state.stages_started += 1;
                    state.notes.push(note.clone());
                }
                JournalEntry::UserReply { note, .. } => state.notes.push(note.clone()),
            }
        }
        state.turns = state.llm_calls.iter().find(|(_, id, _)| **id == *decide_id).map_or(0, |c| c.2);
        state
    }
}

impl StageFailure {
    fn new(class: ReasonClass, message: impl Into<String>) -> StageFailure {
        StageFailure { class, message: message.into(), detail: None }
    }

    fn with_detail(mut self, detail: Value) -> StageFailure {
        self.detail = Some(detail);
        self
    }
}

/// Resolves `${VAR}` in tool URLs (the process environment in the CLI, a map in tests).
pub type VarLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A model stack, or why a model profile cannot be used in this process.
pub type ProfileStack = Result<Arc<dyn Llm>, String>;

/// The default bound of an in-process tool call: that of an HTTP tool's `invoke.timeout_ms`.
const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_millis(DEFAULT_TOOL_TIMEOUT_MS);

/// Runs routes of one catalogue with one LLM stack.
pub struct Runner {
    catalogue: Arc<Catalogue>,
    llm: Arc<dyn Llm>,
    http: Arc<dyn HttpPort>,
    vars: VarLookup,
    fleet: Option<String>,
    /// Per-profile stacks when model profiles select the model (opt-in); a profile that cannot
    /// be used here keeps the reason, and only its routes are refused.
    profile_llms: HashMap<String, ProfileStack>,
    /// In-process tools, by capability name.
    tools: HashMap<String, Arc<dyn Tool>>,
    /// How long an in-process tool call may take (an HTTP tool has its `invoke.timeout_ms`).
    tool_timeout: Duration,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("fleet", &self.fleet).field("tools", &self.tools.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl Runner {
    /// `vars` resolves `${VAR}` in tool URLs (the process environment in the CLI). Fails only
    /// when the HTTP client of the tools cannot be built.
    pub fn new(catalogue: Arc<Catalogue>, llm: Arc<dyn Llm>, vars: VarLookup) -> Result<Runner, String> {
        let http = Arc::new(HttpTools::new()?);
        Ok(Runner { catalogue, llm, http, vars, fleet: None, profile_llms: HashMap::new(), tools: HashMap::new(), tool_timeout: DEFAULT_TOOL_TIMEOUT })
    }

    /// Sends HTTP tool calls through `http` instead of the real client (tests, embedders).
    pub fn with_http(mut self, http: Arc<dyn HttpPort>) -> Runner {
        self.http = http;
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
                known: if known.is_empty() { "none".into() } else { known.join(", ") },
                unloaded: if unloaded.is_empty() {
                    String::new()
                } else {
                    let files: Vec<String> = unloaded.iter().map(|d| format!("\n  {d}")).collect();
                    format!("\n{} catalogue file(s) failed to load; a route defined there is missing:{}", unloaded.len(), files.concat())
                },
            },
            RouteLookupError::Broken(b) => {
                StartError::BrokenRoute { route: route_id.into(), problems: b.problems.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n") }
            }
        })?;
        if let (Some(fleet), Some(target)) = (&self.fleet, route.activation_target())
            && fleet != target
        {
            return Err(StartError::WrongFleet { route: route_id.into(), target: target.to_owned(), fleet: fleet.clone() });
        }
        if let Some(tool) = route.tools().find(|t| t.def.invoke.is_none() && !self.tools.contains_key(&t.name)) {
            return Err(StartError::ToolNotRegistered { route: route_id.into(), tool: tool.name.clone() });
        }
        if let Some(Err(e)) = self.profile_llms.get(route.model_profile()) {
            return Err(StartError::ProfileUnusable { route: route_id.into(), profile: route.model_profile().to_owned(), message: e.clone() });
        }
        Ok(route)
    }

    /// Runs a route to its end. Failures of the run itself are in the result, not an `Err`.
    pub async fn run(&self, req: RunRequest, sink: Arc<dyn EventSink>) -> Result<RunResult, StartError> {
        self.run_with_cancel(req, sink, Cancel::never()).await
    }

    /// As [`Runner::run`]; when `cancel` fires, the call in flight ends and the run fails with
    /// `interrupted`, keeping what it did.
    pub async fn run_with_cancel(&self, req: RunRequest, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunResult, StartError> {
        self.start(new_run_id(), req, sink, cancel, None).await
    }

    /// Runs under a given id (a service names a run before it starts it); with `journal`, the
    /// run's record is committed as it goes.
    pub async fn start(
        &self,
        run_id: String,
        req: RunRequest,
        sink: Arc<dyn EventSink>,
        cancel: Cancel,
        journal: Option<&dyn RunJournal>,
    ) -> Result<RunResult, StartError> {
        let route = self.route(&req.route_id)?.clone();
        let events = top_events(&run_id, &route, sink, 1, journal);
        let state = RunState::for_route(&route);
        Ok(self.run_route(Run::top(&route, &req, &events, &cancel, journal), &Context::current(), state, None).await)
    }

    /// Continues a decision-loop run that asked the user: its state is rebuilt from `history`,
    /// the reply becomes a note (`user: <reply>`) the next decision sees, and the loop goes on
    /// with the turns it had left. Events go on from `history.next_seq`.
    pub async fn resume(
        &self,
        req: RunRequest,
        history: RunHistory,
        reply: &str,
        sink: Arc<dyn EventSink>,
        cancel: Cancel,
        journal: Option<&dyn RunJournal>,
    ) -> Result<RunResult, StartError> {
        let route = self.route(&req.route_id)?.clone();
        if route.path() != RoutePath::Pattern1 {
            return Err(StartError::NotResumable { route: route.id().to_owned() });
        }
        let events = top_events(&history.run_id, &route, sink, history.next_seq, journal);
        let mut state = RunState::from_history(route.shared_id(), route.entry_node().id(), &history.entries);
        let note = message::compress_note(&format!("user: {reply}"));
        state.notes.push(note.clone());
        if journal.is_some() {
            state.pending.push(JournalEntry::UserReply { message: reply.to_owned(), note });
        }
        Ok(self.run_route(Run::top(&route, &req, &events, &cancel, journal), &Context::current(), state, Some(reply)).await)
    }

    /// Recovers a run whose process died: the executor walks it again from the start, taking
    /// every recorded reply and result from `history` instead of asking (events muted), then goes
    /// on live from where the journal ends; its events go on from `history.next_seq`.
    pub async fn recover(
        &self,
        req: RunRequest,
        history: RunHistory,
        sink: Arc<dyn EventSink>,
        cancel: Cancel,
        journal: Option<&dyn RunJournal>,
    ) -> Result<RunResult, StartError> {
        let RunHistory { run_id, entries, next_seq } = history;
        let route = self.route(&req.route_id)?.clone();
        let events = top_events(&run_id, &route, sink, next_seq, journal);
        let state = RunState { source: ReplySource::recovering(entries, &events), ..RunState::for_route(&route) };
        Ok(self.run_route(Run::top(&route, &req, &events, &cancel, journal), &Context::current(), state, None).await)
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
        let events = RunEvents::new(&history.run_id, route_id, None, sink).recording(history.next_seq);
        events.emit(EventKind::RunFailed, None, || fields! {"reason_class" => class.as_str(), "message" => message});
        let batch = JournalBatch { events: events.take_recorded(), entries: Vec::new(), end: Some(result.clone()) };
        if let Err(e) = journal.commit(&history.run_id, batch).await {
            let mut failed = result;
            if let Some(f) = failed.error.as_mut() {
                f.reason_class = ReasonClass::StoreError;
                f.message = format!("the run's record could not be written: {e}");
            }
            return failed;
        }
        result
    }

    /// Replays a finished run from its journal with no model and no tool call: every recorded
    /// reply and result is used in order, and every difference (a prompt, a user message, a
    /// result, a path the journal does not have) is reported.
    pub async fn replay(&self, req: RunRequest, history: Vec<JournalEntry>) -> Result<ReplayReport, StartError> {
        let route = self.route(&req.route_id)?.clone();
        let events = RunEvents::new(&new_run_id(), route.id(), None, Arc::new(crate::events::NullSink));
        let state = RunState { source: ReplySource::replaying(history), ..RunState::for_route(&route) };
        let cancel = Cancel::never();
        let mut result = self.run_route(Run::top(&route, &req, &events, &cancel, None), &Context::current(), state, None).await;
        Ok(ReplayReport { divergences: std::mem::take(&mut result.divergences), result })
    }

    fn run_route<'a>(&'a self, run: Run<'a>, parent_cx: &'a Context, mut state: RunState, resumed: Option<&'a str>) -> BoxFuture<'a, RunResult> {
        Box::pin(async move {
            let Run { route, prefetch, events, .. } = run;
            // A decision-loop run is an agent in the GenAI conventions: `invoke_agent {route}`.
            let agent = route.path() == RoutePath::Pattern1;
            let run_cx = crate::otel::child(
                parent_cx,
                || crate::otel::run_span_name(route.id(), agent),
                SpanKind::Internal,
                || {
                    let mut attributes = vec![
                        KeyValue::new("fabric.run_id", events.run_id().to_owned()),
                        KeyValue::new("fabric.route_id", route.id().to_owned()),
                        KeyValue::new("fabric.model_profile", route.model_profile().to_owned()),
                    ];
                    if agent {
                        attributes.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
                        attributes.push(KeyValue::new("gen_ai.agent.name", route.id().to_owned()));
                    }
                    attributes
                },
            );
            let started = events.stopwatch();
            if let Some(reply) = resumed {
                events.emit(EventKind::RunResumed, None, || fields! {"reply" => reply});
            } else {
                events.emit(EventKind::RunStarted, None, || {
                    let mut data = fields! {"model_profile" => route.model_profile(), "path" => route.path().as_str(), "prefetch_chunks" => prefetch.len()};
                    if let Some(source) = route.source() {
                        data.insert("source".into(), source.into());
                    }
                    if let Some(target) = route.activation_target() {
                        data.insert("activation_target".into(), target.into());
                    }
                    data
                });
            }
            let outcome = if route.path() == RoutePath::Pattern1 {
                self.decision_loop(&run, &mut state, &run_cx).await
            } else {
                self.walk(&run, &mut state, &run_cx).await
            };
            let duration_ms = round_ms(started.elapsed().as_secs_f64() * 1000.0);
            let pending = std::mem::take(&mut state.pending);
            let divergences = std::mem::take(&mut state.source).finish();
            let mut llm_calls = std::mem::take(&mut state.llm_calls);
            llm_calls.append(&mut state.child_calls);
            let mut result = RunResult {
                run_id: events.run_id().to_owned(),
                route_id: route.id().to_owned(),
                status: RunStatus::Completed,
                output: None,
                slots: state.slots,
                notes: state.notes,
                question: None,
                error: None,
                llm_calls,
                divergences,
            };
            match outcome {
                Ok(Finish::Completed) => {
                    result.output = match state.last_output {
                        Some(Last::Slot(at)) => result.slots.get_index(at).map(|(_, v)| v.clone()),
                        Some(Last::Answer(answer)) => Some(answer),
                        None => None,
                    };
                    events.emit(EventKind::RunCompleted, None, || fields! {"output" => result.output, "duration_ms" => duration_ms});
                }
                Ok(Finish::AwaitingInput(question)) => {
                    result.status = RunStatus::AwaitingInput;
                    events.emit(EventKind::RunAwaitingInput, None, || fields! {"question" => question, "duration_ms" => duration_ms});
                    result.question = Some(question);
                }
                Err((stage_id, f)) => {
                    crate::otel::fail_cx(&run_cx, f.class.as_str());
                    result.status = RunStatus::Failed;
                    let mut data = fields! {"reason_class" => f.class.as_str(), "message" => f.message, "duration_ms" => duration_ms};
                    if let Some(detail) = f.detail {
                        data.insert("decisions".into(), detail);
                    }
                    events.emit(EventKind::RunFailed, stage_id.as_deref(), move || data);
                    result.error = Some(RunFailure { reason_class: f.class, message: f.message, stage_id });
                }
            }
            crate::otel::end(&run_cx);
            if let Some(journal) = run.journal {
                let batch = JournalBatch { events: events.take_recorded(), entries: pending, end: Some(result.clone()) };
                if let Err(e) = journal.commit(events.run_id(), batch).await {
                    // The record lacks the end: the caller must not take the run as settled.
                    result.status = RunStatus::Failed;
                    let message = format!("the run's end could not be recorded: {e}");
                    result.error = Some(RunFailure { reason_class: ReasonClass::StoreError, message, stage_id: None });
                }
            }
            result
        })
    }

    /// Opens a stage: its `run.stage.started` event and span.
    fn begin_stage<'s>(&self, run: &Run<'_>, stage: &'s StageNode, state: &mut RunState, run_cx: &Context) -> OpenStage<'s> {
        let stage_idx = state.stages_started;
        state.stages_started += 1;
        run.events.emit(
            EventKind::StageStarted,
            Some(stage.id()),
            || fields! {"llm_role" => stage.role_name(), "stage_idx" => stage_idx, "kind" => kind_name(stage.kind())},
        );
        let cx = crate::otel::child(
            run_cx,
            || "stage".into(),
            SpanKind::Internal,
            || {
                vec![
                    KeyValue::new("fabric.run_id", run.events.run_id().to_owned()),
                    KeyValue::new("fabric.stage_id", stage.id().to_owned()),
                    KeyValue::new("fabric.llm_role", stage.role_name()),
                ]
            },
        );
        OpenStage { stage, started: run.events.stopwatch(), cx }
    }

    /// Closes a stage: the slot (and, if `note`, a note) on success, the event, the span.
    fn end_stage(&self, run: &Run<'_>, open: OpenStage<'_>, outcome: Result<String, &StageFailure>, state: &mut RunState, note: bool) {
        let OpenStage { stage, started, cx } = open;
        let cx = &cx;
        let duration_ms = round_ms(started.elapsed().as_secs_f64() * 1000.0);
        match outcome {
            Ok(value) => {
                let added = (note && !value.is_empty()).then(|| message::stage_note(stage.id(), &value));
                // A stage that completes its journal is taken from it after its (muted) event: the
                // event was written before, and a recovery goes on live only after it.
                let recorded_here = state.source.completed(stage.id(), &value, run.events);
                if !recorded_here && run.journal.is_some() {
                    let (stage_id, value, note) = (stage.id().to_owned(), value.clone(), added.clone());
                    state.pending.push(JournalEntry::StageCompleted { stage_id, value, note });
                }
                state.notes.extend(added);
                run.events.emit(
                    EventKind::StageCompleted,
                    Some(stage.id()),
                    || fields! {"duration_ms" => duration_ms, "output" => value, "output_chars" => value.chars().count()},
                );
                let (at, _) = state.slots.insert_full(stage.id().to_owned(), value);
                state.last_output = Some(Last::Slot(at));
                if recorded_here {
                    state.source.advance(run.events);
                }
            }
            Err(f) => {
                crate::otel::fail_cx(cx, f.class.as_str());
                run.events.emit(
                    EventKind::StageFailed,
                    Some(stage.id()),
                    || fields! {"reason_class" => f.class.as_str(), "message" => f.message, "duration_ms" => duration_ms},
                );
            }
        }
        crate::otel::end(cx);
    }

    /// Hands what the run did since the last checkpoint to the journal (journalled runs only).
    async fn checkpoint(&self, run: &Run<'_>, state: &mut RunState) -> Result<(), StageFailure> {
        let Some(journal) = run.journal else { return Ok(()) };
        let batch = JournalBatch { events: run.events.take_recorded(), entries: std::mem::take(&mut state.pending), end: None };
        journal
            .append(run.events.run_id(), batch)
            .await
            .map_err(|e| StageFailure::new(ReasonClass::StoreError, format!("the run's record could not be written: {e}")))
    }

    /// A stage refused before it started (its step budget is spent): `run.stage.failed` alone,
    /// so that every failed run still names its failed stage.
    fn refuse_stage(&self, run: &Run<'_>, stage: &StageNode, f: StageFailure) -> (Option<String>, StageFailure) {
        run.events.emit(
            EventKind::StageFailed,
            Some(stage.id()),
            || fields! {"reason_class" => f.class.as_str(), "message" => f.message, "duration_ms" => 0.0},
        );
        (Some(stage.id().to_owned()), f)
    }

    async fn walk(&self, run: &Run<'_>, state: &mut RunState, run_cx: &Context) -> Result<Finish, (Option<String>, StageFailure)> {
        let route = run.route;
        let mut node = route.entry();
        loop {
            let stage = &route.graph()[node];
            if state.visits.len() <= node.index() {
                state.visits.resize(route.graph().node_count(), 0);
            }
            let visits = &mut state.visits[node.index()];
            *visits += 1;
            // A branched workflow may loop; each stage runs at most max_loop_steps times per run.
            if *visits > run.budget {
                let why = format!("stage `{}` would run more than max_loop_steps ({}) times", stage.id(), run.budget);
                return Err(self.refuse_stage(run, stage, StageFailure::new(ReasonClass::LoopBudgetExceeded, why)));
            }
            let open = self.begin_stage(run, stage, state, run_cx);
            match self.run_stage(run, stage, state, &open.cx).await {
                Ok(value) => self.end_stage(run, open, Ok(value), state, true),
                Err(f) => {
                    self.end_stage(run, open, Err(&f), state, true);
                    return Err((Some(stage.id().to_owned()), f));
                }
            }
            // `checkpoint` checks this too; checked here, a run without a journal makes no
            // checkpoint future per stage (its state and poll showed in scenario A's count).
            if run.journal.is_some() {
                self.checkpoint(run, state).await.map_err(|f| (Some(stage.id().to_owned()), f))?;
            }
            match route.next_step(node, |c| condition_holds(c, state)) {
                NextStep::Go(next) => node = next,
                NextStep::End => return Ok(Finish::Completed),
                NextStep::NoMatch => {
                    let why = format!("no branch of stage `{}` matched and it has no branch without `when`", stage.id());
                    return Err((Some(stage.id().to_owned()), StageFailure::new(ReasonClass::NoBranchMatched, why)));
                }
            }
        }
    }

    async fn run_stage(&self, run: &Run<'_>, stage: &StageNode, state: &mut RunState, cx: &Context) -> Result<String, StageFailure> {
        let Run { goal, prefetch, .. } = *run;
        match (stage.role(), stage.kind()) {
            (LlmRole::None, NodeKind::ChildRun { route: child_id }) => {
                let call = || format!("stage `{}` starts its child run", stage.id());
                match state.source.tool_result(stage.id(), call)? {
                    Some(value) => Ok(value),
                    None => self.child_run(run, child_id, state, cx).await,
                }
            }
            (LlmRole::None, _) => {
                if let Some((invoke, url)) = self.tool_url(stage) {
                    let call = || format!("stage `{}` calls its tool", stage.id());
                    return match state.source.tool_result(stage.id(), call)? {
                        Some(value) => Ok(value),
                        None => self.call_tool(run, stage, invoke, &url, goal, cx).await,
                    };
                }
                // Prefetch passthrough: the pack goes into the slot; notes stay free of it since
                // every user message already carries it as `packed chunks`.
                Ok(state
                    .source
                    .stage_result(stage.id())
                    .unwrap_or_else(|| if prefetch.is_empty() { String::new() } else { serde_json::to_string(prefetch).unwrap_or_default() }))
            }
            (role, _) => {
                let reply = self.call_model(run, stage, state, cx).await?;
                if role != LlmRole::QueryFormulation {
                    if let ReplyValue::Structured(d) = &reply
                        && stage.fields_read()
                    {
                        match state.structured.iter_mut().find(|(id, _)| **id == *stage.id()) {
                            Some(slot) => slot.1.clone_from(&d.compact),
                            None => state.structured.push((stage.shared_id().clone(), d.compact.clone())),
                        }
                    }
                    return Ok(reply.into_slot_value());
                }
                let Some((invoke, url)) = self.tool_url(stage) else {
                    return Ok(state.source.stage_result(stage.id()).unwrap_or_else(|| reply.into_slot_value()));
                };
                let call = || format!("stage `{}` calls its tool", stage.id());
                if let Some(value) = state.source.tool_result(stage.id(), call)? {
                    return Ok(value);
                }
                // The query, read out of the reply only when a tool is there to take it.
                let query = match &reply {
                    ReplyValue::Structured(d) => serde_json::from_str::<Value>(&d.compact)
                        .ok()
                        .and_then(|v| v.get("query").and_then(Value::as_str).map(str::to_owned))
                        .unwrap_or_default(),
                    other => other.slot_value().trim().to_owned(),
                };
                let mut args = Map::new();
                args.insert(invoke.query_param.clone(), Value::String(query));
                self.call_tool(run, stage, invoke, &url, &args, cx).await
            }
        }
    }

    fn tool_url<'s>(&self, stage: &'s StageNode) -> Option<(&'s Invoke, String)> {
        let invoke = stage.capability()?.def.invoke.as_ref()?;
        let url = invoke.url.resolve(&|v| (self.vars)(v))?;
        Some((invoke, url))
    }

    async fn call_tool(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        invoke: &Invoke,
        url: &str,
        args: &Map<String, Value>,
        cx: &Context,
    ) -> Result<String, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let tool = stage.capability().map_or("", |c| c.name.as_str());
        events.emit(EventKind::ToolStarted, Some(stage.id()), || fields! {"tool" => tool, "method" => invoke.method.as_str(), "url" => display_url(url)});
        // An HTTP tool runs here and calls out: an `extension` in the GenAI conventions.
        let span = tool_span(cx, events.run_id(), tool, "extension");
        let outcome = match cancel.race(self.http.call(invoke, url, args)).await {
            Ok(r) => r,
            Err(why) => Err(ToolError { class: ReasonClass::Interrupted, message: format!("the run was interrupted ({why})") }),
        };
        if let Err(e) = &outcome {
            crate::otel::fail_cx(&span, e.class.as_str());
        }
        crate::otel::end(&span);
        match outcome {
            Ok(out) => {
                events.emit(
                    EventKind::ToolCompleted,
                    Some(stage.id()),
                    || fields! {"tool" => tool, "status" => out.status, "bytes" => out.bytes, "duration_ms" => round_ms(out.duration.as_secs_f64() * 1000.0)},
                );
                Ok(out.text)
            }
            Err(e) => {
                events.emit(EventKind::ToolFailed, Some(stage.id()), || fields! {"tool" => tool, "reason_class" => e.class.as_str(), "message" => e.message});
                Err(StageFailure::new(e.class, format!("tool `{tool}`: {}", e.message)))
            }
        }
    }

    /// Calls a registered in-process tool, with the same events as an HTTP tool.
    async fn call_in_process_tool(&self, run: &Run<'_>, stage: &StageNode, args: &Map<String, Value>, cx: &Context) -> Result<String, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let name = stage.capability().map_or(stage.id(), |c| c.name.as_str());
        let Some(tool) = self.tools.get(name) else {
            return Err(StageFailure::new(ReasonClass::ToolFailed, format!("tool `{name}` has no in-process implementation registered")));
        };
        events.emit(EventKind::ToolStarted, Some(stage.id()), || fields! {"tool" => name, "method" => "in_process"});
        let span = tool_span(cx, events.run_id(), name, "function");
        let started = events.stopwatch();
        let outcome = match cancel.race(tokio::time::timeout(self.tool_timeout, tool.call(args))).await {
            Ok(Ok(r)) => r.map_err(|message| (ReasonClass::ToolFailed, message)),
            Ok(Err(_)) => Err((ReasonClass::ToolTimeout, format!("no result within {} ms", self.tool_timeout.as_millis()))),
            Err(why) => Err((ReasonClass::Interrupted, format!("the run was interrupted ({why})"))),
        };
        if let Err((class, _)) = &outcome {
            crate::otel::fail_cx(&span, class.as_str());
        }
        crate::otel::end(&span);
        match outcome {
            Ok(value) => {
                let text = match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                events.emit(
                    EventKind::ToolCompleted,
                    Some(stage.id()),
                    || fields! {"tool" => name, "status" => "ok", "bytes" => text.len(), "duration_ms" => round_ms(started.elapsed().as_secs_f64() * 1000.0)},
                );
                Ok(text)
            }
            Err((class, message)) => {
                events.emit(EventKind::ToolFailed, Some(stage.id()), || fields! {"tool" => name, "reason_class" => class.as_str(), "message" => message});
                Err(StageFailure::new(class, format!("tool `{name}`: {message}")))
            }
        }
    }

    async fn call_model(&self, run: &Run<'_>, stage: &StageNode, state: &mut RunState, cx: &Context) -> Result<ReplyValue, StageFailure> {
        let Run { route, goal, prefetch, events, cancel, .. } = *run;
        let goal_json = state.goal_json.get_or_insert_with(|| message::goal_json(goal));
        // One buffer for the run's user messages (a journalled run keeps each in its entry).
        let mut user = std::mem::take(&mut state.user_buf);
        message::write_user_message(&mut user, goal_json, prefetch, &state.notes);
        let idx = match state.llm_calls.iter().position(|(_, id, _)| **id == *stage.id()) {
            Some(i) => i,
            None => {
                state.llm_calls.push((route.shared_id().clone(), stage.shared_id().clone(), 0));
                state.llm_calls.len() - 1
            }
        };
        let turn = &mut state.llm_calls[idx].2;
        let req = LlmRequest {
            events,
            route_id: route.id(),
            stage_id: stage.id(),
            turn: *turn,
            system: stage.prompt().system_text(),
            user: &user,
            output: stage.output(),
            cx,
            cancel,
        };
        *turn += 1;
        if let Some(value) = state.source.model_reply(stage.id(), req.turn, req.system, &user, events)? {
            return recorded_reply(stage, &value);
        }
        let llm = match self.profile_llms.get(route.model_profile()) {
            Some(Ok(l)) => l,
            // Refused at start (`route`); never reached.
            Some(Err(e)) => return Err(StageFailure::new(ReasonClass::ProviderError, e.clone())),
            None => &self.llm,
        };
        let reply = llm.complete(&req).await.map_err(|e| StageFailure::new(e.class, e.message))?;
        if run.journal.is_some() {
            let (stage_id, system, raw, value) = (stage.id().to_owned(), req.system.to_owned(), reply.raw_text(), reply.value.recorded());
            state.pending.push(JournalEntry::ModelReply { stage_id, turn: req.turn, system, user, raw, value });
            // Recorded at once: a run recovered after a crash does not ask the model again.
            self.checkpoint(run, state).await?;
        } else {
            state.user_buf = user;
        }
        Ok(reply.value)
    }

    async fn child_run(&self, run: &Run<'_>, child_id: &str, state: &mut RunState, cx: &Context) -> Result<String, StageFailure> {
        let Run { goal, prefetch, events, depth, budget, cancel, .. } = *run;
        if depth + 1 > MAX_CHILD_DEPTH {
            return Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child runs nest deeper than {MAX_CHILD_DEPTH}")));
        }
        let route = self.route(child_id).map_err(|e| StageFailure::new(ReasonClass::ChildRunFailed, e.to_string()))?.clone();
        let child_events = RunEvents::new(&new_run_id(), route.shared_id().clone(), Some(events.run_id()), events.sink().clone());
        // The step budget is carried into the child: it never gets more than its parent has.
        // A child run is recorded in its parent's journal through the stage's result.
        let child =
            Run { route: &route, goal, prefetch, events: &child_events, depth: depth + 1, budget: budget.min(route.max_loop_steps()), cancel, journal: None };
        let result = self.run_route(child, cx, RunState::for_route(&route), None).await;
        state.child_calls.extend(result.llm_calls.iter().cloned());
        match result.status {
            RunStatus::Completed => Ok(result.output.unwrap_or_default()),
            // The parent was interrupted with its child: say so, not "the child failed".
            RunStatus::Failed if cancel.reason().is_some() => {
                Err(StageFailure::new(ReasonClass::Interrupted, format!("the run was interrupted in child run {} of route `{}`", result.run_id, route.id())))
            }
            RunStatus::Failed => {
                let why = result.error.map(|e| format!("{}: {}", e.reason_class, e.message)).unwrap_or_default();
                Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child run {} of route `{}` failed: {why}", result.run_id, route.id())))
            }
            RunStatus::AwaitingInput => {
                Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child run {} of route `{}` is awaiting user input", result.run_id, route.id())))
            }
        }
    }
}

/// The stage value of a recorded reply, read the way the reply was read when it came.
fn recorded_reply(stage: &StageNode, value: &str) -> Result<ReplyValue, StageFailure> {
    let bad = |why: String| StageFailure::new(ReasonClass::StoreError, format!("the recorded reply of stage `{}` does not read: {why}", stage.id()));
    Ok(match stage.output() {
        OutputSpec::Bindable(schema) => ReplyValue::Structured(crate::structured::decode_reply(schema, value).map_err(|e| bad(e.to_string()))?),
        OutputSpec::Decision(spec) => ReplyValue::Decision(spec.parse_json(value).map_err(|e| bad(e.to_string()))?),
        OutputSpec::Text | OutputSpec::Unbindable { .. } => ReplyValue::Text(value.to_owned()),
    })
}

/// The `kind` of a stage in events.
fn kind_name(kind: &NodeKind) -> &'static str {
    match kind {
        NodeKind::Stage => "task",
        NodeKind::ChildRun { .. } => "child_run",
        NodeKind::AppendedSynthesis => "appended_synthesis",
        NodeKind::Decision => "decision",
        NodeKind::Tool => "tool",
        NodeKind::End => "end",
    }
}

/// Time-ordered run ids (UUIDv7), so ids sort by start time.
pub fn new_run_id() -> String {
    // Encoded straight into a buffer (the `Display` path goes through the formatter).
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf).to_owned()
}

/// Evaluates a branch condition against the run's slots.
fn condition_holds(c: &Condition, state: &RunState) -> bool {
    let value: Option<Value> = match &c.field {
        Some(field) => state
            .structured
            .iter()
            .find(|(id, _)| **id == *c.slot.name)
            .and_then(|(_, compact)| serde_json::from_str::<Value>(compact).ok())
            .and_then(|mut v| v.get_mut(field).map(Value::take))
            .filter(|v| !v.is_null()),
        None => state.slots.get(&c.slot.name).map(|s| Value::String(s.clone())),
    };
    match &c.op {
        CondOp::Exists(want) => value.is_some() == *want,
        CondOp::Equals(want) => value.as_ref().is_some_and(|v| loosely_equal(v, want)),
        CondOp::NotEquals(want) => !value.as_ref().is_some_and(|v| loosely_equal(v, want)),
        CondOp::In(options) => value.as_ref().is_some_and(|v| options.iter().any(|o| loosely_equal(v, o))),
        CondOp::Contains(needle) => match &value {
            Some(Value::String(s)) => s.contains(needle.as_str()),
            Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(needle)),
            _ => false,
        },
    }
}

/// Numbers compare by value (`3` equals `3.0`); everything else exactly.
fn loosely_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Checks a `--goal` value: the goal of a run must be a JSON object.
pub fn parse_goal(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!(
            "the goal must be a JSON object, got {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        )),
        Err(e) => Err(format!("the goal is not valid JSON: {e}")),
    }
}

/// Reads a prefetch pack: a JSON array of strings, or `{"chunks": [...]}`.
pub fn parse_prefetch(text: &str) -> Result<Vec<String>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let items = match &v {
        Value::Array(items) => items,
        Value::Object(m) => m.get("chunks").and_then(Value::as_array).ok_or("an object pack needs a `chunks` array")?,
        _ => return Err("a prefetch pack is a JSON array of strings or {\"chunks\": [...]}".into()),
    };
    items.iter().enumerate().map(|(i, c)| c.as_str().map(str::to_owned).ok_or(format!("chunk {i} is not a string"))).collect()
}
