//! What a run gives back: [`RunResult`] (its status, output, slots, notes, question or failure),
//! [`StartError`] (a refusal before it starts), [`ReplayReport`], and the result of a run rebuilt
//! from its journal alone.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Serialize;

use super::JournalEntry;
use super::state::RunState;
use crate::diag::Diagnostic;
use crate::failure::ReasonClass;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Completed,
    Failed,
    AwaitingInput,
    /// Cancelled on request: terminal, never resumed or taken over.
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct RunFailure {
    pub reason_class: ReasonClass,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_id: Option<String>,
}

/// A run's slots: stage id → value, in the order the stages completed.
pub type Slots = IndexMap<String, String, foldhash::fast::RandomState>;

/// How a run ended, with what only that end has: a completed run's output (absent when its last
/// stage gave none), a failed run's failure, the question of a run that asked, a cancelled run's
/// reason (a failure of the class `cancelled` whose message is the reason).
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    Completed { output: Option<String> },
    Failed(RunFailure),
    AwaitingInput { question: String },
    Cancelled(RunFailure),
}

impl RunEnd {
    pub fn status(&self) -> RunStatus {
        match self {
            RunEnd::Completed { .. } => RunStatus::Completed,
            RunEnd::Failed(_) => RunStatus::Failed,
            RunEnd::AwaitingInput { .. } => RunStatus::AwaitingInput,
            RunEnd::Cancelled(_) => RunStatus::Cancelled,
        }
    }

    /// A cancelled end with the request's `reason`.
    pub fn cancelled(reason: &str) -> RunEnd {
        RunEnd::Cancelled(RunFailure { reason_class: ReasonClass::Cancelled, message: reason.to_owned(), stage_id: None })
    }
}

/// The result printed by `fabric run` and returned to library callers.
///
/// On the wire (`fabric run`, the store, the API) it is one object: `run_id`, `route_id`,
/// `status`, `output` (null unless completed with one), `slots`, `notes`, then `question` or
/// `error` where the end has one.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub run_id: String,
    pub route_id: String,
    pub end: RunEnd,
    /// Each completed stage's value by stage id, in completion order (keys are catalogue names:
    /// a fast hasher, nothing a caller controls to flood it with).
    pub slots: Slots,
    pub notes: Vec<String>,
    /// Model calls made, per (route, stage), children included; used by the strict stub check.
    /// The ids are the route's own (shared, not copied).
    pub llm_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    /// A replay's divergences from the journal (see [`super::Begin::Replay`]).
    pub divergences: Vec<String>,
}

impl RunResult {
    pub fn status(&self) -> RunStatus {
        self.end.status()
    }

    /// A completed run's output.
    pub fn output(&self) -> Option<&str> {
        match &self.end {
            RunEnd::Completed { output } => output.as_deref(),
            _ => None,
        }
    }

    /// The question of a run that asked.
    pub fn question(&self) -> Option<&str> {
        match &self.end {
            RunEnd::AwaitingInput { question } => Some(question),
            _ => None,
        }
    }

    /// A failed run's failure; a cancelled run's reason (class `cancelled`).
    pub fn error(&self) -> Option<&RunFailure> {
        match &self.end {
            RunEnd::Failed(f) | RunEnd::Cancelled(f) => Some(f),
            _ => None,
        }
    }

    /// Ends the run as failed with `class` and `message` (its end could not be recorded).
    pub fn fail(&mut self, class: ReasonClass, message: String) {
        self.end = RunEnd::Failed(RunFailure { reason_class: class, message, stage_id: None });
    }
}

impl Serialize for RunResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let extra = usize::from(!matches!(self.end, RunEnd::Completed { .. }));
        let mut m = s.serialize_map(Some(6 + extra))?;
        m.serialize_entry("run_id", &self.run_id)?;
        m.serialize_entry("route_id", &self.route_id)?;
        m.serialize_entry("status", &self.status())?;
        m.serialize_entry("output", &self.output())?;
        m.serialize_entry("slots", &self.slots)?;
        m.serialize_entry("notes", &self.notes)?;
        match &self.end {
            RunEnd::Completed { .. } => {}
            RunEnd::AwaitingInput { question } => m.serialize_entry("question", question)?,
            RunEnd::Failed(f) | RunEnd::Cancelled(f) => m.serialize_entry("error", f)?,
        }
        m.end()
    }
}

/// A result as the store keeps it (what [`RunResult`]'s `Serialize` wrote), read back once: its
/// end from `status` with the field that end has. Calls, divergences: none (they are not kept).
impl<'de> serde::Deserialize<'de> for RunResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wire {
            run_id: String,
            route_id: String,
            status: RunStatus,
            #[serde(default)]
            output: Option<String>,
            #[serde(default)]
            slots: Slots,
            #[serde(default)]
            notes: Vec<String>,
            #[serde(default)]
            question: Option<String>,
            #[serde(default)]
            error: Option<RunFailure>,
        }
        let w = Wire::deserialize(d)?;
        let missing = |field: &str| serde::de::Error::custom(format_args!("a result of status {:?} without its `{field}`", w.status));
        let end = match w.status {
            RunStatus::Completed => RunEnd::Completed { output: w.output },
            RunStatus::AwaitingInput => RunEnd::AwaitingInput { question: w.question.ok_or_else(|| missing("question"))? },
            RunStatus::Failed => RunEnd::Failed(w.error.ok_or_else(|| missing("error"))?),
            RunStatus::Cancelled => RunEnd::Cancelled(w.error.ok_or_else(|| missing("error"))?),
        };
        Ok(RunResult { run_id: w.run_id, route_id: w.route_id, end, slots: w.slots, notes: w.notes, llm_calls: Vec::new(), divergences: Vec::new() })
    }
}

/// Refusals before a run starts (no events, no run id): exit code 2 territory.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("unknown route `{route}`; known routes: {known}{unloaded}")]
    UnknownRoute { route: String, known: String, unloaded: String },
    #[error("route `{route}` cannot run: the catalogue has errors in it:\n{problems}")]
    BrokenRoute { route: String, problems: Problems },
    #[error("route `{route}` is served by fleet `{target}`, but this runtime is fleet `{fleet}`")]
    WrongFleet { route: String, target: String, fleet: String },
    #[error("route `{route}` uses tool `{tool}`, which has no `invoke` URL and no in-process implementation registered")]
    ToolNotRegistered { route: String, tool: String },
    #[error("route `{route}` cannot run: its model profile `{profile}` cannot be used here: {problem}")]
    ProfileUnusable { route: String, profile: String, problem: super::ProfileError },
    #[error("route `{route}` cannot run with the stub: its script has errors:\n{problems}")]
    StubScriptBroken { route: String, problems: Problems },
    #[error("route `{route}` never asks: only a decision loop, or a workflow stage calling an A2A agent, can ask and be continued")]
    NotResumable { route: String },
    /// The goal does not match the route's `goal_schema`: each problem `PATH: message`.
    #[error("the goal does not match the `goal_schema` of route `{route}`: {}", problems.join("; "))]
    InvalidGoal { route: String, problems: Vec<String> },
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
            StartError::InvalidGoal { .. } => "invalid_goal",
        }
    }
}

/// The located problems that keep a route from starting, each `path:line:col: message`; shown
/// one per line, indented, under the refusal's first line.
#[derive(Debug, Clone, PartialEq)]
pub struct Problems(pub Vec<Diagnostic>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "\n" };
            write!(f, "{sep}  {d}")?;
        }
        Ok(())
    }
}

/// What `fabric replay` found: every divergence, and the result of the replayed run.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub divergences: Vec<String>,
    pub result: RunResult,
}

impl From<RunResult> for ReplayReport {
    /// The report of a replayed run: its divergences taken out of its result.
    fn from(mut result: RunResult) -> ReplayReport {
        ReplayReport { divergences: std::mem::take(&mut result.divergences), result }
    }
}

/// The result of a run that stopped without its process: what its journal holds (slots, notes,
/// the last output), failed with `class` and `message`.
pub fn result_from_journal(run_id: &str, route_id: &str, history: &[JournalEntry], class: ReasonClass, message: &str) -> RunResult {
    let end = RunEnd::Failed(RunFailure { reason_class: class, message: message.to_owned(), stage_id: None });
    ended_from_journal(run_id, route_id, history, end)
}

/// A run ended without a walk with `end`, keeping what its journal holds (slots, notes).
pub fn ended_from_journal(run_id: &str, route_id: &str, history: &[JournalEntry], end: RunEnd) -> RunResult {
    let state = RunState::from_history(&Arc::from(route_id), "", history);
    RunResult {
        run_id: run_id.to_owned(),
        route_id: route_id.to_owned(),
        end,
        slots: state.slots,
        notes: state.notes,
        llm_calls: Vec::new(),
        divergences: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(end: RunEnd) -> RunResult {
        let mut slots = Slots::default();
        slots.insert("intake".into(), "a".into());
        RunResult { run_id: "r".into(), route_id: "x".into(), end, slots, notes: vec!["n".into()], llm_calls: Vec::new(), divergences: Vec::new() }
    }

    /// The object `fabric run` prints, the store keeps and the API shows, one per end: the same
    /// keys in the same order as when the end was five public fields.
    #[test]
    fn each_end_has_the_wire_form_it_always_had() {
        let head = r#"{"run_id":"r","route_id":"x","status":"#;
        let failure = RunFailure { reason_class: ReasonClass::ToolTimeout, message: "m".into(), stage_id: Some("s".into()) };
        let cases = [
            (RunEnd::Completed { output: Some("o".into()) }, r#""completed","output":"o","slots":{"intake":"a"},"notes":["n"]}"#),
            (RunEnd::Completed { output: None }, r#""completed","output":null,"slots":{"intake":"a"},"notes":["n"]}"#),
            (RunEnd::AwaitingInput { question: "q?".into() }, r#""awaiting_input","output":null,"slots":{"intake":"a"},"notes":["n"],"question":"q?"}"#),
            (
                RunEnd::Failed(failure),
                r#""failed","output":null,"slots":{"intake":"a"},"notes":["n"],"error":{"reason_class":"tool_timeout","message":"m","stage_id":"s"}}"#,
            ),
            (
                RunEnd::cancelled("the user left"),
                r#""cancelled","output":null,"slots":{"intake":"a"},"notes":["n"],"error":{"reason_class":"cancelled","message":"the user left"}}"#,
            ),
        ];
        for (end, tail) in cases {
            let wire = format!("{head}{tail}");
            assert_eq!(serde_json::to_string(&result(end.clone())).unwrap(), wire);
            // The store reads it back into the same end, which writes the same object again.
            let back: RunResult = serde_json::from_str(&wire).unwrap();
            assert_eq!((&back.end, serde_json::to_string(&back).unwrap()), (&end, wire));
        }
        for broken in [
            r#"{"run_id":"r","route_id":"x","status":"failed"}"#,
            r#"{"run_id":"r","route_id":"x","status":"awaiting_input"}"#,
            r#"{"run_id":"r","status":"completed"}"#,
            r#"{"run_id":"r","route_id":"x","status":"done"}"#,
        ] {
            assert!(serde_json::from_str::<RunResult>(broken).is_err(), "{broken}");
        }
    }

    #[test]
    fn a_failed_end_replaces_any_other() {
        let mut r = result(RunEnd::Completed { output: Some("o".into()) });
        r.fail(ReasonClass::StoreError, "lost".into());
        assert_eq!((r.status(), r.output(), r.error().map(|e| e.message.as_str())), (RunStatus::Failed, None, Some("lost")));
    }

    #[test]
    fn problems_show_one_per_line_indented() {
        let d = |m: &str| Diagnostic {
            path: "routes/a.yaml".into(),
            pos: crate::diag::Pos { line: 1, col: 2 },
            severity: crate::diag::Severity::Error,
            message: m.into(),
        };
        let e = StartError::BrokenRoute { route: "a".into(), problems: Problems(vec![d("one"), d("two")]) };
        assert_eq!(e.to_string(), "route `a` cannot run: the catalogue has errors in it:\n  routes/a.yaml:1:2: one\n  routes/a.yaml:1:2: two");
    }
}
