//! The facade: one embeddable runtime that `fabric`, `fabric serve` and the Python package are
//! thin shells over.
//!
//! A [`Runtime`] is built once ([`Runtime::builder`]) from settings (the environment by
//! default), a catalogue and the stub scripts; it owns the loaded catalogue, the model stacks
//! (the seeded stub, or the configured provider and, when opted in, one stack per model
//! profile), the in-process tools and the tool client. It starts runs, checks routes, validates
//! replies the way stages do and probes the provider. Everything it decides (stub or provider,
//! strict-stub checks, which profile may run) is here, not in a front end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::cancel::Cancel;
use crate::catalogue::Catalogue;
use crate::config::Settings;
use crate::events::{EventSink, NullSink, RunEvents};
use crate::exec::{Begin, Problems, ProfileError, RunRequest, RunResult, StartError};
use crate::hydrate::Route;
use crate::llm::flow::Flow;
use crate::llm::{Llm, LlmError, LlmRequest, ModelInfo, OutputSpec, ReplyValue, stack};
use building::profile_stacks;

/// A finished run as a front end reports it.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub result: RunResult,
    /// Strict stub only: script lines the run left unused (a test expected calls that did not
    /// happen); front ends treat a non-empty list as a failure.
    pub unused_script_lines: Vec<String>,
}

/// What a stage makes of a raw reply against an output schema ([`validate`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// The slot value: compact JSON, or the unwrapped string of a text envelope.
    Accepted(String),
    /// The schema is not bindable: a stage with it runs as a plain text call and keeps the
    /// reply as it is.
    PlainText { why: String, text: String },
    /// Refused with `invalid_json` or `schema_validation`.
    Refused { class: crate::failure::ReasonClass, detail: String },
}

/// What a stage with `schema` makes of `raw`: the same decision (bindable or plain text) and the
/// same reading as a model call's ([`OutputSpec::from_schema`], [`crate::llm::finish_reply`]).
pub fn validate(schema: &Value, raw: &str) -> Validation {
    let output = OutputSpec::from_schema(schema);
    match crate::llm::finish_reply(&output, raw.to_owned(), crate::llm::ReplyMeta::default()) {
        Ok(reply) => match (&output, reply.value) {
            (OutputSpec::Unbindable { why }, ReplyValue::Text(text)) => Validation::PlainText { why: why.clone(), text },
            (_, value) => Validation::Accepted(value.slot_value()),
        },
        Err(e) => Validation::Refused { class: e.class, detail: e.message },
    }
}

/// A model profile as this process would use it ([`Runtime::profiles`]).
#[derive(Debug, Clone)]
pub struct ProfileStatus {
    pub name: String,
    /// Where its calls go, or why it cannot be used here.
    pub model: Result<ModelInfo, ProfileError>,
}

/// The result of [`Runtime::probe`].
#[derive(Debug, Clone)]
pub struct Probe {
    pub provider: String,
    pub model: String,
    pub reply: String,
    pub elapsed: Duration,
}

/// The embeddable runtime (see the module docs).
mod accepting;
mod asking;
mod building;
mod cancelling;
mod durable;
mod edition;
mod flow;
mod on_version;
mod reload;
mod replying;
mod retention;
mod scheduling;
mod seeding;
pub use crate::llm::flow::{BreakerState, BreakerStatus, GateStatus};
pub use crate::store::StartRequest;
pub use asking::{Ask, AskError};
pub use building::{BuildError, DEFAULT_STUB_DIR, RuntimeBuilder};
pub use cancelling::{CancelError, Cancelling, DEFAULT_CANCEL_REASON, MAX_CANCEL_REASON};
pub use durable::{AcceptError, AcceptedRun, ClaimedRun, Durable, MAX_TAKEOVERS, RecordedOnce, Started};
pub use edition::{Edition, KEPT_EDITIONS, stub_scripts_on_disk};
pub use reload::{ReloadError, Reloaded};
pub use replying::{ClaimedReply, ReplayOn, ReplyError};
pub use retention::{EXPIRED_REASON, PRUNE_BATCH};
pub use scheduling::{ScheduleDef, ScheduleError, ScheduleView};

pub struct Runtime {
    settings: Settings,
    warnings: Vec<String>,
    /// The gates of the models this process calls.
    flow: Arc<Flow>,
    /// What every edition shares.
    parts: edition::Parts,
    /// The edition new runs start on: replaced whole by a reload, never changed in place (a run
    /// holds the edition it runs on).
    current: std::sync::RwLock<Arc<Edition>>,
    /// Other editions built: replaced by a reload, or rebuilt for runs recorded on them.
    others: std::sync::Mutex<Vec<Arc<Edition>>>,
    /// The directories the catalogue was loaded from, which a reload reads again (none for a
    /// catalogue given as texts or loaded by the embedder).
    dirs: Option<(crate::catalogue::Layers, crate::catalogue::Layers)>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("current", &self.current()).finish_non_exhaustive()
    }
}

impl Runtime {
    /// The catalogue new runs start on (the current edition's).
    pub fn catalogue(&self) -> Arc<Catalogue> {
        self.current().catalogue().clone()
    }

    /// The catalogue version new runs start on.
    pub fn version(&self) -> crate::version::CatalogueVersion {
        self.current().version().clone()
    }

    /// The process's MCP servers (one client each, shared by every edition's runs); a serving
    /// replica stops them at its end ([`crate::replica::Replica::stop`]).
    pub fn mcp(&self) -> &crate::tools::mcp::McpServers {
        &self.parts.mcp
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Problems that did not stop the build (a model string ignored with the stub, a missing
    /// stub directory); front ends show them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Checks that `route_id` can start here: it exists and is not broken, this fleet serves it,
    /// its in-process tools are registered, its model profile is usable, its stub script loaded.
    /// On the current edition ([`Edition::check_route`]).
    pub fn check_route(&self, route_id: &str) -> Result<Arc<Route>, StartError> {
        self.current().check_route(route_id).cloned()
    }

    /// Runs a route to its end; `cancel` interrupts it (a signal, a shutdown). Failures of the
    /// run itself are in the result; an `Err` means it could not start (nothing ran).
    pub async fn run(&self, req: RunRequest, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunOutcome, StartError> {
        let edition = self.current();
        // The runner checks the rest of `check_route` itself.
        if let Some(problems) = edition.stub().and_then(|s| s.problems(&req.route_id)) {
            return Err(StartError::StubScriptBroken { route: req.route_id.clone(), problems: Problems(problems.to_vec()) });
        }
        let runner = edition.runner();
        let result = runner.execute(req, Begin::New { run_id: runner.new_id() }, sink, cancel, None).await?;
        let unused_script_lines = edition.stub().filter(|s| s.is_strict()).map(|s| s.unconsumed(&result.llm_calls)).unwrap_or_default();
        Ok(RunOutcome { result, unused_script_lines })
    }

    /// The gates of the models this process calls: their limits, waiters and pauses.
    pub fn flow(&self) -> &Arc<Flow> {
        &self.flow
    }

    /// Each gate as it is now (metrics, `fabric doctor`).
    pub fn flow_status(&self) -> Vec<GateStatus> {
        self.flow.gates().iter().map(|g| g.status()).collect()
    }

    /// The breaker of each model of a fallback chain, as it is now (metrics, `fabric doctor`).
    pub fn breaker_status(&self) -> Vec<BreakerStatus> {
        self.flow.breakers().iter().map(|b| b.status()).collect()
    }

    /// The routes whose runs this process may claim: those [`Runtime::check_route`] accepts.
    pub fn claimable_routes(&self) -> Vec<String> {
        self.current().claimable_routes().map(str::to_owned).collect()
    }
    /// A run with a goal and nothing else: no events, no cancellation.
    pub async fn run_goal(&self, route_id: &str, goal: Map<String, Value>) -> Result<RunOutcome, StartError> {
        self.run(RunRequest { route_id: route_id.to_owned(), goal, prefetch: Vec::new() }, Arc::new(NullSink), Cancel::never()).await
    }

    /// The model profiles' stacks when profiles are honoured: each profile's provider and
    /// model, or why it cannot be used. Empty when profiles are metadata only.
    pub fn profiles(&self) -> Vec<ProfileStatus> {
        if !self.settings.honor_model_profile || self.parts.llm.is_none() {
            return Vec::new();
        }
        let Ok(client) = stack::client() else { return Vec::new() };
        let mut out: Vec<ProfileStatus> = profile_stacks(&self.settings, &client, self.catalogue().profiles(), &self.flow)
            .into_iter()
            .map(|(name, stack)| ProfileStatus { name, model: stack.map(|l| l.info()) })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One tiny structured call to the configured backend (`fabric doctor --probe`).
    pub async fn probe(&self) -> Result<Probe, LlmError> {
        let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
        let output = OutputSpec::from_schema(&schema);
        let events = RunEvents::new("probe", "doctor", None, Arc::new(NullSink));
        let never = Cancel::never();
        let cx = opentelemetry::Context::current();
        let req = LlmRequest {
            events: &events,
            route_id: "doctor",
            stage_id: "probe",
            turn: 0,
            priority: 0,
            system: "Reply with JSON only.",
            user: "Reply with {\"ok\": true}.",
            output: &output,
            cx: &cx,
            cancel: &never,
            stream: None,
        };
        let edition = self.current();
        let llm = edition.runner().llm();
        let info = llm.info();
        let started = Instant::now();
        let reply = llm.complete(&req).await?;
        Ok(Probe { provider: info.provider, model: info.model, reply: reply.value.slot_value(), elapsed: started.elapsed() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_takes_the_stage_path() {
        let schema = serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}});
        assert_eq!(validate(&schema, r#"{"text": "hi", "x": 1}"#), Validation::Accepted("hi".into()));
        let refused = validate(&schema, "not json");
        assert!(matches!(refused, Validation::Refused { class: crate::failure::ReasonClass::InvalidJson, .. }), "{refused:?}");
        let nested = serde_json::json!({"type": "object", "properties": {"a": {"type": "object"}}});
        assert!(matches!(validate(&nested, "anything"), Validation::PlainText { ref text, .. } if text == "anything"));
    }

    #[test]
    fn the_tool_timeouts_are_the_documented_ones() {
        // Defined once (`vocab`), for in-process and HTTP tools alike.
        assert_eq!(crate::config::DEFAULT_TOOL_TIMEOUT_MS, 10_000);
        assert_eq!(crate::catalogue::DEFAULT_TOOL_TIMEOUT_MS, 10_000);
        assert_eq!(crate::config::MAX_TOOL_TIMEOUT_MS, 600_000);
    }
}
