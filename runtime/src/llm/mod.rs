//! The LLM port: one small object-safe trait, and the decorators around it.
//!
//! Contract of [`Llm::complete`]: given the system text, the user message and what the output
//! must look like, return the stage's value, already validated (structured replies go through
//! [`crate::structured::decode_reply`]), or an [`LlmError`] whose [`ReasonClass`] says whether a
//! retry could help. Implementations never emit run/stage events; decorators emit `run.llm.*`.
//!
//! The stack is built in one place, [`stack`]: `TelemetryLlm(RetryLlm(backend))`, where the
//! backend is the seeded stub or a real provider ([`providers`]).

pub mod providers;
pub mod retry;
pub mod stack;
pub mod stub;
pub mod telemetry;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::catalogue::defs::OutputSpec;
use crate::events::RunEvents;
use crate::structured::{self, Decoded};

/// Sampling temperature of every model call (fixed, as in the Python runtime).
pub const TEMPERATURE: f64 = 0.1;
/// Output token limit of every model call (fixed).
pub const MAX_OUTPUT_TOKENS: u32 = 4096;
/// Time limit of one model-call attempt (fixed).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One logical model call (all of its attempts).
#[derive(Debug)]
pub struct LlmRequest<'a> {
    pub events: &'a RunEvents,
    pub route_id: &'a str,
    pub stage_id: &'a str,
    /// How many calls this stage already made in this run (0 for the first).
    pub turn: u32,
    pub system: &'a str,
    pub user: &'a str,
    pub output: &'a OutputSpec,
    /// The stage's trace context: the parent of the call's `llm.complete` span.
    pub cx: &'a opentelemetry::Context,
    /// Fires when the run is cancelled; the call then ends with `interrupted`.
    pub cancel: &'a crate::cancel::Cancel,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReplyValue {
    Text(String),
    Structured(Decoded),
    /// A Mode 1 decision, already checked against the route's tool list.
    Decision(crate::agent::decision::AgentDecision),
}

impl ReplyValue {
    /// The slot value: unwrapped text or compact JSON for structured replies, the text otherwise.
    pub fn slot_value(&self) -> String {
        match self {
            ReplyValue::Text(t) => t.clone(),
            ReplyValue::Structured(d) => d.slot_value().to_owned(),
            ReplyValue::Decision(d) => d.to_json().to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LlmReply {
    pub value: ReplyValue,
    pub usage: Option<Usage>,
}

/// The closed set of failure classes (docs/events.md). Runs, stages, model calls and tools all
/// report one of these as `reason_class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonClass {
    /// The reply is not JSON where a structured reply was asked for.
    InvalidJson,
    /// The reply is JSON but does not satisfy the output schema.
    SchemaValidation,
    Timeout,
    Connection,
    RateLimited,
    ServerError,
    /// Any other 4xx from a provider.
    ClientError,
    /// A provider reply we could not read (wrong shape, refusal, empty).
    ProviderError,
    /// The seeded stub was asked more often than its script allows (strict mode).
    StubScriptExhausted,
    /// A text-protocol decision (`CALL`/`ASK`/`DONE`) that does not parse.
    InvalidDecision,
    UnknownTool,
    /// Mode 1: the model's tool arguments do not match the tool's input schema (noted; the loop goes on).
    InvalidToolArguments,
    LoopBudgetExceeded,
    ToolTimeout,
    ToolConnection,
    ToolHttpStatus,
    /// An in-process tool returned an error.
    ToolFailed,
    ToolResponseTooLarge,
    NoBranchMatched,
    ChildRunFailed,
    /// The run was cancelled from outside (a signal, a service shutdown).
    Interrupted,
}

impl ReasonClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonClass::InvalidJson => "invalid_json",
            ReasonClass::SchemaValidation => "schema_validation",
            ReasonClass::Timeout => "timeout",
            ReasonClass::Connection => "connection",
            ReasonClass::RateLimited => "rate_limited",
            ReasonClass::ServerError => "server_error",
            ReasonClass::ClientError => "client_error",
            ReasonClass::ProviderError => "provider_error",
            ReasonClass::StubScriptExhausted => "stub_script_exhausted",
            ReasonClass::InvalidDecision => "invalid_decision",
            ReasonClass::UnknownTool => "unknown_tool",
            ReasonClass::InvalidToolArguments => "invalid_tool_arguments",
            ReasonClass::LoopBudgetExceeded => "loop_budget_exceeded",
            ReasonClass::ToolTimeout => "tool_timeout",
            ReasonClass::ToolConnection => "tool_connection",
            ReasonClass::ToolHttpStatus => "tool_http_status",
            ReasonClass::ToolFailed => "tool_failed",
            ReasonClass::ToolResponseTooLarge => "tool_response_too_large",
            ReasonClass::NoBranchMatched => "no_branch_matched",
            ReasonClass::ChildRunFailed => "child_run_failed",
            ReasonClass::Interrupted => "interrupted",
        }
    }

    /// Transient failures a retry may fix; everything else fails at once.
    pub fn is_retryable(self) -> bool {
        matches!(self, ReasonClass::Timeout | ReasonClass::Connection | ReasonClass::RateLimited | ReasonClass::ServerError)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {message}", class.as_str())]
pub struct LlmError {
    pub class: ReasonClass,
    pub message: String,
    /// A provider's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
}

impl LlmError {
    pub fn new(class: ReasonClass, message: impl Into<String>) -> LlmError {
        LlmError { class, message: message.into(), retry_after: None }
    }
}

/// What a backend says about itself (events, spans, `fabric doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub provider: String,
    pub model: String,
}

/// The port. Object-safe so the stack can be `Arc<dyn Llm>`.
pub trait Llm: Send + Sync {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>>;
    fn info(&self) -> ModelInfo;
}

impl<L: Llm + ?Sized> Llm for Box<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        (**self).complete(req)
    }

    fn info(&self) -> ModelInfo {
        (**self).info()
    }
}

impl<L: Llm + ?Sized> Llm for std::sync::Arc<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        (**self).complete(req)
    }

    fn info(&self) -> ModelInfo {
        (**self).info()
    }
}

/// Turns a backend's raw reply text into the stage value: validated structured output for a
/// bindable schema, the text itself otherwise. Every backend ends with this call.
pub fn finish_reply(output: &OutputSpec, raw: String, usage: Option<Usage>) -> Result<LlmReply, LlmError> {
    let value = match output {
        OutputSpec::Bindable(schema) => match structured::decode_reply(schema, &raw) {
            Ok(decoded) => ReplyValue::Structured(decoded),
            Err(e) => {
                let class = match e {
                    structured::DecodeError::InvalidJson(_) => ReasonClass::InvalidJson,
                    structured::DecodeError::SchemaValidation(_) => ReasonClass::SchemaValidation,
                };
                return Err(LlmError::new(class, e.detail().to_owned()));
            }
        },
        OutputSpec::Decision(spec) => ReplyValue::Decision(spec.parse_json(&raw)?),
        OutputSpec::Text | OutputSpec::Unbindable { .. } => ReplyValue::Text(raw),
    };
    Ok(LlmReply { value, usage })
}
