//! The parts of a stage the diff compares, as it shows them: hydrate's types made plain values
//! that serialise (a node's kind, its output, an edge, an HTTP call), and the catalogue's names
//! of roles, prompt sources and methods in JSON.

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::defs::{HttpMethod, LlmRole};
use crate::hydrate::NodeKind;
use crate::prompt::PromptSource;
use crate::vocab::OutputSpec;

/// A graph node's kind as the diff names it (`child_run` with the route it starts): hydrate's
/// `NodeKind` without the end marker, which is no stage, and with names that are the JSON's
/// contract, so that hydrate's type can change without changing what a diff consumer reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    Stage,
    QueryFormulation,
    ChildRun { route: String },
    AppendedSynthesis,
    Decision,
    Tool,
}

impl StageKind {
    pub(super) fn of(kind: &NodeKind) -> StageKind {
        match kind {
            // The end marker is not a stage; the diff leaves it out before it asks.
            NodeKind::Stage | NodeKind::End => StageKind::Stage,
            NodeKind::QueryFormulation => StageKind::QueryFormulation,
            NodeKind::ChildRun { route } => StageKind::ChildRun { route: route.clone() },
            NodeKind::AppendedSynthesis => StageKind::AppendedSynthesis,
            NodeKind::Decision => StageKind::Decision,
            NodeKind::Tool => StageKind::Tool,
        }
    }
}

/// What a model call of the stage must return.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    Text,
    /// A bindable schema, as written.
    Structured(Value),
    /// A schema that cannot be bound: the call is plain text, for this reason. (Hydration keeps
    /// only the reason, so two such schemas differ here only when their reasons do.)
    Unbindable(String),
    /// The decision loop's decision, over these tools.
    Decision(Vec<String>),
}

impl Output {
    pub(super) fn of(spec: &OutputSpec) -> Output {
        match spec {
            OutputSpec::Text => Output::Text,
            OutputSpec::Bindable(flat) => Output::Structured(flat.source().clone()),
            OutputSpec::Unbindable { why } => Output::Unbindable(why.clone()),
            OutputSpec::Decision(spec) => Output::Decision(spec.tools().to_vec()),
        }
    }
}

/// An edge: the stage it leads to (`end` for the end) and its condition, if it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EdgeView {
    pub to: String,
    pub when: Option<String>,
}

/// An HTTP call as the catalogue writes it: the URL template with its `${VAR}`s unresolved, and
/// through `redact` (a literal secret in it is not shown; a change there is still reported).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvokeView {
    #[serde(serialize_with = "method_name")]
    pub method: HttpMethod,
    pub url: String,
    pub timeout_ms: u64,
}

/// An A2A agent as the catalogue writes it: its endpoint through `redact`, the skill, the token's
/// variable (never a token), the wait and the answer's cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentView {
    pub url: String,
    pub skill: String,
    pub token_env: Option<String>,
    pub timeout_ms: u64,
    pub max_response_bytes: usize,
}

impl AgentView {
    pub(super) fn of(a: crate::defs::A2aInvoke) -> AgentView {
        let timeout_ms = a.timeout.as_millis() as u64;
        AgentView { url: crate::redact::redact_url(&a.url.raw), skill: a.skill, token_env: a.token_env, timeout_ms, max_response_bytes: a.max_response_bytes }
    }
}

pub(super) fn role_name<S: Serializer>(role: &LlmRole, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(role.as_str())
}

pub(super) fn source_name<S: Serializer>(source: &PromptSource, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(source.as_str())
}

pub(super) fn method_name<S: Serializer>(method: &HttpMethod, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(method.as_str())
}
