//! Definitions as decoded from catalogue files, before references between them are resolved.
//!
//! The raw layer of the catalogue: each field has been type-checked and carries its position, but a
//! name may still point at nothing. [`crate::hydrate`] resolves them into runnable routes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::diag::{Diagnostic, Pos};
use crate::vocab::OutputSpec;
mod a2a;
pub use a2a::A2aInvoke;

/// How a workflow stage executes. The set is closed: an unknown role is a load error and the
/// routes using it cannot run; it never falls back to another role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlmRole {
    None,
    Classify,
    Synthesis,
    QueryFormulation,
}

impl LlmRole {
    pub fn parse(s: &str) -> Option<LlmRole> {
        match s {
            "none" => Some(LlmRole::None),
            "classify" => Some(LlmRole::Classify),
            "synthesis" => Some(LlmRole::Synthesis),
            "query_formulation" => Some(LlmRole::QueryFormulation),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LlmRole::None => "none",
            LlmRole::Classify => "classify",
            LlmRole::Synthesis => "synthesis",
            LlmRole::QueryFormulation => "query_formulation",
        }
    }

    pub fn calls_model(self) -> bool {
        self != LlmRole::None
    }
}

/// A reference by name, with where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ref {
    pub name: String,
    pub pos: Pos,
}

/// Where a definition lives, and the problems found in it while decoding.
#[derive(Debug, Clone)]
pub struct Origin {
    pub path: Arc<PathBuf>,
    pub pos: Pos,
    pub problems: Vec<Diagnostic>,
}

impl Origin {
    pub fn is_broken(&self) -> bool {
        self.problems.iter().any(Diagnostic::is_error)
    }
}

#[derive(Debug, Clone)]
pub struct ProfileDef {
    pub origin: Origin,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub fallbacks: ProfileFallbacks,
}

/// The chain of `name`: the profile itself, then each fallback's own chain, depth first, each
/// profile once. Profiles that are not defined (or broken) are left out: the loader refuses them
/// (`loader::fallbacks`).
pub fn fallback_chain<'a>(name: &'a str, profile: impl Fn(&str) -> Option<&'a ProfileDef>) -> Vec<&'a str> {
    fn walk<'a>(name: &'a str, profile: &dyn Fn(&str) -> Option<&'a ProfileDef>, out: &mut Vec<&'a str>) {
        if out.contains(&name) {
            return;
        }
        out.push(name);
        if let Some(p) = profile(name) {
            for f in &p.fallbacks.names {
                walk(&f.name, profile, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(name, &profile, &mut out);
    out
}

/// A model profile's fallbacks (`loader::fallbacks`): the profiles tried after it, in order,
/// when its model fails for a reason another model can fix (`llm::fallback`).
#[derive(Debug, Clone, Default)]
pub struct ProfileFallbacks {
    pub names: Vec<Ref>,
    /// A reply that fails the schema moves on too.
    pub on_invalid: bool,
    /// A model paused after a 429 is skipped instead of waited for.
    pub prefer_available: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
        }
    }
}

/// One piece of a URL template: literal text or `${VAR}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UrlPart {
    Lit(String),
    Var(String),
}

/// A tool URL from the catalogue. `${VAR}` parts come from the runtime's environment; when one
/// is unset or empty the URL is absent and the stage makes no HTTP call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UrlTemplate {
    pub raw: String,
    pub parts: Vec<UrlPart>,
}

impl UrlTemplate {
    pub fn resolve(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                UrlPart::Lit(s) => out.push_str(s),
                UrlPart::Var(v) => out.push_str(lookup(v).filter(|s| !s.is_empty())?.trim_end_matches('/')),
            }
        }
        Some(out)
    }

    /// The text with its variables as they are (not a URL: nothing trimmed), or the first
    /// variable that is unset or empty.
    pub fn resolve_text<'t>(&'t self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, UnsetVar<'t>> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                UrlPart::Lit(s) => out.push_str(s),
                UrlPart::Var(v) => out.push_str(&lookup(v).filter(|s| !s.is_empty()).ok_or(UnsetVar(v))?),
            }
        }
        Ok(out)
    }
}

/// A `${VAR}` of the catalogue that is unset or empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the variable `{0}` is unset or empty")]
pub struct UnsetVar<'t>(pub &'t str);

#[derive(Debug, Clone)]
pub struct Invoke {
    pub url: UrlTemplate,
    pub method: HttpMethod,
    pub timeout: Duration,
    pub max_response_bytes: usize,
    /// Name under which a `query_formulation` stage sends its query (`q` by default).
    pub query_param: String,
}

#[derive(Debug, Clone)]
pub struct CapabilityDef {
    pub origin: Origin,
    pub description: String,
    pub input_schema: Option<Value>,
    /// `input_schema` compiled once at load; tool arguments are checked with it.
    pub input_validator: Option<Arc<jsonschema::Validator>>,
    pub output: OutputSpec,
    pub invoke: Option<Invoke>,
    /// `invoke: {mcp: SERVER, tool: TOOL}`: the tool of an MCP server declared in `mcp_servers`.
    pub mcp: Option<McpInvoke>,
    pub a2a: Option<A2aInvoke>,
}

/// A capability's call of an MCP server's tool (`invoke: {mcp, tool, timeout_ms}`).
#[derive(Debug, Clone)]
pub struct McpInvoke {
    pub server: Ref,
    pub tool: Ref,
    pub timeout: Duration,
}

/// How an MCP server of `mcp_servers` is reached. Every string may hold `${VAR}`s from the
/// environment, resolved when the server is started (so no secret sits in a file).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum McpTransportDef {
    /// A child process speaking MCP on its stdin and stdout: the program and its arguments,
    /// and the variables added to its environment.
    Stdio { command: Vec<UrlTemplate>, env: Vec<(String, UrlTemplate)> },
    /// Streamable HTTP at `url`, with these headers on every request.
    Http { url: UrlTemplate, headers: Vec<(String, UrlTemplate)> },
}

/// An MCP server declared in a catalogue file (`mcp_servers: {NAME: ...}`).
#[derive(Debug, Clone)]
pub struct McpServerDef {
    pub origin: Origin,
    pub transport: McpTransportDef,
}

/// One tool as an MCP server's `tools/list` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// What an MCP server's `tools/list` gave, or why it could not be asked.
#[derive(Debug, Clone, PartialEq)]
pub enum McpListing {
    Tools(Vec<McpToolDef>),
    Unavailable(String),
}

/// Each declared MCP server's listing, by server name: what hydration takes the tools of
/// `tools_from` and the schemas of `invoke.mcp` from. A catalogue loaded without them (no
/// connection, `fabric routes check` without `--connect`) checks only what the files say.
pub type McpListings = std::collections::BTreeMap<String, McpListing>;

/// `tools_from: SERVER` (with `only: [...]`) of a decision loop: a server's tools as the route's.
#[derive(Debug, Clone)]
pub struct ToolsFrom {
    pub server: Ref,
    pub only: Option<Vec<Ref>>,
}

/// Where control goes after a stage.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Stage(Ref),
    End,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CondOp {
    Equals(Value),
    NotEquals(Value),
    In(Vec<Value>),
    Exists(bool),
    Contains(String),
}

/// A branch condition on a slot value: `slot` is a stage id, `field` a property of its output.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub slot: Ref,
    pub field: Option<String>,
    pub op: CondOp,
}

#[derive(Debug, Clone)]
pub struct BranchDef {
    pub pos: Pos,
    pub when: Option<Condition>,
    pub goto: Target,
}

#[derive(Debug, Clone)]
pub enum Flow {
    /// Continue with the next listed stage (or end after the last).
    FallThrough,
    Next(Target),
    Branches(Vec<BranchDef>),
}

#[derive(Debug, Clone)]
pub enum StageKindDef {
    Task,
    /// Starts a child run of another route and waits for it (`kind: child_run`).
    ChildRun {
        route: Ref,
    },
}

#[derive(Debug, Clone)]
pub struct StageDef {
    pub id: String,
    pub pos: Pos,
    pub role: Option<LlmRole>,
    pub kind: StageKindDef,
    pub capability: Option<Ref>,
    pub flow: Flow,
    /// `stream: true|false`: whether its model calls stream their text (`run.llm.delta`);
    /// unset, a `synthesis` stage streams and the others do not.
    pub stream: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct WorkflowDef {
    pub origin: Origin,
    pub stages: Vec<StageDef>,
    /// True when any stage uses `next` or `branches`.
    pub branched: bool,
}

#[derive(Debug, Clone)]
pub struct ManifestDef {
    pub origin: Origin,
    pub workflow: Ref,
    pub synthesis_stage_id: String,
    pub synthesis_capability: Option<Ref>,
}

#[derive(Debug, Clone)]
pub enum RouteBodyDef {
    Workflow(Ref),
    Manifest(Ref),
    /// The decision loop over these tools.
    DecisionLoop {
        tools: Vec<Ref>,
        /// `tools_from`: an MCP server's tools too.
        tools_from: Option<ToolsFrom>,
        /// `stream: true|false`: whether its decisions stream their question or answer; unset,
        /// they do.
        stream: Option<bool>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation {
    None,
    /// Accepted for parity; adds no transcript.
    Session,
}

#[derive(Debug, Clone)]
pub struct RouteDef {
    pub origin: Origin,
    pub description: String,
    pub model_profile: Option<Ref>,
    pub prompt_pack: Option<Ref>,
    pub activation_target: Option<String>,
    pub max_loop_steps: u32,
    /// At a model's gate, 0 to 9, higher first (with a floor: lower ones still advance).
    pub priority: u8,
    pub conversation: Conversation,
    /// The JSON Schema a start's goal must match (`goal_schema`); none: any object.
    pub goal_schema: Option<GoalSchema>,
    pub body: Option<RouteBodyDef>,
    /// The route's declared schedules (`schedules:`), checked at load.
    pub schedules: Vec<DeclaredSchedule>,
}

/// A schedule a route declares: its name (the stored schedule is `{route}/{name}`), where, and
/// the fields of its definition as JSON (`cron`, `goal`, `timezone` ...; `paused`), each checked
/// by the loader (`loader::schedules`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredSchedule {
    pub name: String,
    pub pos: Pos,
    pub fields: serde_json::Map<String, Value>,
}

/// A JSON Schema compiled once at load: a route's `goal_schema` (what a start's goal must be;
/// the input schema of the route's MCP tool).
#[derive(Debug, Clone)]
pub struct GoalSchema {
    pub schema: Value,
    pub validator: Arc<jsonschema::Validator>,
}

/// What is wrong with `instance` under `validator`: the first five problems, each `PATH: message`
/// (the JSON Pointer of the value at fault; no path for the whole instance). Empty: it matches.
pub fn schema_problems(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .take(5)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
        })
        .collect()
}
