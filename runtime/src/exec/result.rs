//! What a run gives back: [`RunResult`] (its status, output, slots, notes, question or failure),
//! [`StartError`] (a refusal before it starts), [`ReplayReport`], and the result of a run rebuilt
//! from its journal alone.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Serialize;

use super::JournalEntry;
use super::state::RunState;
use crate::failure::ReasonClass;

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

/// What `fabric replay` found: every divergence, and the result of the replayed run.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub divergences: Vec<String>,
    pub result: RunResult,
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
