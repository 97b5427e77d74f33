//! The LLM port: one small object-safe trait, and the decorators around it.
//!
//! Contract of [`Llm::complete`]: given the system text, the user message and what the output
//! must look like, return the stage's value, already validated (structured replies go through
//! [`crate::structured::decode_reply`]), or an [`LlmError`] whose [`ReasonClass`] says whether a
//! retry could help. Implementations never emit run/stage events; decorators emit `run.llm.*`.
//!
//! The stack is built in one place, [`stack`]: `TelemetryLlm(RetryLlm(FlowLlm(backend)))`, where the
//! backend is the seeded stub or a real provider ([`providers`]).

pub mod cloud;
pub mod decision_text;
pub mod fallback;
pub mod flow;
pub mod model;
pub mod providers;
pub mod retry;
pub mod stack;
pub mod stream;
pub mod stub;
pub mod telemetry;

use std::sync::Arc;
use std::time::Duration;

pub use crate::failure::{BoxFuture, ReasonClass};
pub use crate::vocab::{CALL_TIMEOUT, MAX_OUTPUT_TOKENS, OutputSpec, TEMPERATURE};

use crate::decision::{DecisionError, DecisionErrorKind};
use crate::events::RunEvents;
use crate::structured::{self, Decoded};

/// One logical model call (all of its attempts).
#[derive(Debug)]
pub struct LlmRequest<'a> {
    pub events: &'a RunEvents,
    pub route_id: &'a str,
    pub stage_id: &'a str,
    /// How many calls this stage already made in this run (0 for the first).
    pub turn: u32,
    /// The route's catalogue `priority` (0 to 9, higher first) at a model's gate.
    pub priority: u8,
    pub system: &'a str,
    pub user: &'a str,
    pub output: &'a OutputSpec,
    /// The stage's trace context: the parent of the call's `llm.complete` span.
    pub cx: &'a opentelemetry::Context,
    /// Fires when the run is cancelled; the call then ends with `interrupted`.
    pub cancel: &'a crate::cancel::Cancel,
    /// Where a backend that streams writes the reply's text as it comes (a stage that streams,
    /// in a run someone may watch); `None`: the reply comes whole.
    pub stream: Option<&'a stream::Deltas<'a>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// Both counts; saturating, since they are what a provider says (a proxy may report garbage).
    pub fn total(self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// A wait a provider named in its answer: how long (read up to a day) and where it said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub after: Duration,
    /// The header or body field it came from (`retry-after`, `x-ratelimit-reset-tokens`, ...).
    pub from: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReplyValue {
    Text(String),
    Structured(Decoded),
    /// A decision of the decision loop, already checked against the route's tool list.
    Decision(crate::decision::AgentDecision),
}

impl ReplyValue {
    /// The value as a journal records it, from which it is read again: the compact JSON of a
    /// structured reply (before any unwrapping), a decision's JSON, the text otherwise.
    pub fn recorded(&self) -> String {
        match self {
            ReplyValue::Text(t) => t.clone(),
            ReplyValue::Structured(d) => d.compact.clone(),
            ReplyValue::Decision(d) => d.to_json().to_string(),
        }
    }

    /// [`ReplyValue::slot_value`], without a copy.
    pub fn into_slot_value(self) -> String {
        match self {
            ReplyValue::Text(t) => t,
            ReplyValue::Structured(d) => d.unwrapped.unwrap_or(d.compact),
            ReplyValue::Decision(d) => d.to_json().to_string(),
        }
    }

    /// The slot value: unwrapped text or compact JSON for structured replies, the text otherwise.
    pub fn slot_value(&self) -> String {
        match self {
            ReplyValue::Text(t) => t.clone(),
            ReplyValue::Structured(d) => d.slot_value().to_owned(),
            ReplyValue::Decision(d) => d.to_json().to_string(),
        }
    }
}

/// What a provider's reply says about itself besides its content: for spans (the GenAI
/// `gen_ai.response.*` and `gen_ai.usage.*` attributes) and events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyMeta {
    pub usage: Option<Usage>,
    /// What else the reply named, boxed: a reply moves through every layer of the stack, and
    /// kept small it moves without a call to `memcpy` (the stub names none of it).
    pub about: Option<Box<ReplyAbout>>,
}

/// What a provider's reply names of itself besides its token counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyAbout {
    /// Why generation stopped, in the provider's own word (`stop`, `end_turn`, `STOP` ...).
    pub finish_reason: Option<String>,
    /// The model that answered, when the provider names it (it may differ from the one asked).
    pub model: Option<String>,
    /// The provider's id of the response.
    pub id: Option<String>,
}

impl ReplyMeta {
    /// The meta of a provider's reply; `about` is boxed only when the reply names something.
    pub fn new(usage: Option<Usage>, finish_reason: Option<String>, model: Option<String>, id: Option<String>) -> ReplyMeta {
        let named = finish_reason.is_some() || model.is_some() || id.is_some();
        ReplyMeta { usage, about: named.then(|| Box::new(ReplyAbout { finish_reason, model, id })) }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LlmReply {
    pub value: ReplyValue,
    pub meta: ReplyMeta,
    /// The reply text as received, when the value is not that text itself (structured replies
    /// and decisions): what a run journal records so the reply can be read again. Shared, not
    /// copied, when the backend keeps the text (the stub's scripts).
    pub raw: Option<Arc<str>>,
    /// The model of a fallback chain that answered (`provider:model`), set by the chain
    /// ([`fallback::FallbackLlm`]): the span and the journal name it. `None` outside a chain.
    pub served_by: Option<Arc<str>>,
}

impl LlmReply {
    /// The reply as the backend received it.
    pub fn raw_text(&self) -> String {
        match (&self.raw, &self.value) {
            (Some(raw), _) => raw.to_string(),
            (None, value) => value.slot_value(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {message}", class.as_str())]
pub struct LlmError {
    pub class: ReasonClass,
    pub message: String,
    /// The wait a provider's answer named (`Retry-After`, or a 429's rate-limit headers).
    pub retry_after: Option<Wait>,
    /// Retrying cannot help within the operator's bounds (a provider asked for a pause longer
    /// than `FABRIC_LLM_MAX_PAUSE_S`): the retry layer gives up at once, whatever the class.
    pub give_up: bool,
    /// What the reply said about itself, when one came but could not be used (a validation
    /// failure still used tokens).
    pub reply: Option<Box<ReplyMeta>>,
    /// The reply text as received, when one came but could not be used (invalid JSON, a schema
    /// or decision it does not meet): `run.llm.failed` shows it, so a failed stage can be read.
    pub raw_reply: Option<String>,
    /// What the provider refused, when it did (its key, or the content): the class says
    /// `client_error` or `provider_error`, this says whether another model may answer.
    pub refused: Option<Refused>,
}

/// What a provider refused: not the request itself, which another provider would refuse too,
/// but what is this provider's own (a model fallback chain moves on for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// HTTP 401 or 403: this provider does not take the key (another has a key of its own).
    Auth,
    /// The content: an explicit refusal, a content filter, a safety block.
    Content,
}

impl LlmError {
    pub fn new(class: ReasonClass, message: impl Into<String>) -> LlmError {
        LlmError { class, message: message.into(), retry_after: None, give_up: false, reply: None, raw_reply: None, refused: None }
    }

    /// The same error, saying what the provider refused.
    pub fn refusing(mut self, what: Refused) -> LlmError {
        self.refused = Some(what);
        self
    }

    /// The same error, of a reply that came but could not be used: what it said about itself and
    /// its text as received.
    pub fn with_reply(mut self, meta: ReplyMeta, raw: String) -> LlmError {
        self.reply = Some(Box::new(meta));
        self.raw_reply = Some(raw);
        self
    }
}

/// A reply that is not a usable decision fails the model call with the matching class.
impl From<DecisionError> for LlmError {
    fn from(e: DecisionError) -> LlmError {
        let class = match e.kind {
            DecisionErrorKind::InvalidJson => ReasonClass::InvalidJson,
            DecisionErrorKind::Shape => ReasonClass::SchemaValidation,
            DecisionErrorKind::Malformed => ReasonClass::InvalidDecision,
            DecisionErrorKind::UnknownTool => ReasonClass::UnknownTool,
        };
        LlmError::new(class, e.message)
    }
}

/// What a backend says about itself (events, spans, `fabric doctor`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelInfo {
    pub provider: String,
    pub model: String,
    /// The sampling settings sent, where the backend sends them (not the stub).
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// Host and port of the provider's endpoint (`server.address`, `server.port`).
    pub server: Option<(String, u16)>,
}

/// The port. Object-safe so the stack can be `Arc<dyn Llm>`.
pub trait Llm: Send + Sync {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>>;
    fn info(&self) -> ModelInfo;

    /// The same call without its box, for a decorator that wraps a known backend (the stack is
    /// composed statically: only its outermost layer is boxed, once per call). By default the
    /// boxed call; the stub, the provider backends and the retry layer implement it unboxed (a
    /// backend behind a `Box<dyn Llm>`, as providers chosen at run time are, takes the default).
    fn call<'a>(&'a self, req: &'a LlmRequest<'a>) -> impl Future<Output = Result<LlmReply, LlmError>> + Send + 'a
    where
        Self: Sized,
    {
        self.complete(req)
    }
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
/// A failure keeps the reply's [`ReplyMeta`].
pub fn finish_reply(output: &OutputSpec, raw: String, meta: ReplyMeta) -> Result<LlmReply, LlmError> {
    match read_reply(output, &raw) {
        None => Ok(LlmReply { value: ReplyValue::Text(raw), meta, raw: None, served_by: None }),
        Some(Ok(value)) => Ok(LlmReply { value, meta, raw: Some(raw.into()), served_by: None }),
        Some(Err(e)) => Err(e.with_reply(meta, raw)),
    }
}

/// [`finish_reply`] of a text the backend keeps (the stub's scripted replies): shared with the
/// reply, not copied into it.
pub fn finish_shared_reply(output: &OutputSpec, raw: &Arc<str>, meta: ReplyMeta) -> Result<LlmReply, LlmError> {
    match read_reply(output, raw) {
        None => Ok(LlmReply { value: ReplyValue::Text(raw.to_string()), meta, raw: None, served_by: None }),
        Some(Ok(value)) => Ok(LlmReply { value, meta, raw: Some(raw.clone()), served_by: None }),
        Some(Err(e)) => Err(e.with_reply(meta, raw.to_string())),
    }
}

/// The value `output` makes of a reply's text; `None` for a plain text call (the text itself).
fn read_reply(output: &OutputSpec, raw: &str) -> Option<Result<ReplyValue, LlmError>> {
    Some(match output {
        OutputSpec::Bindable(schema) => match structured::decode_reply(schema, raw) {
            Ok(decoded) => Ok(ReplyValue::Structured(decoded)),
            Err(e) => {
                let class = match e {
                    structured::DecodeError::InvalidJson(_) => ReasonClass::InvalidJson,
                    structured::DecodeError::SchemaValidation(_) => ReasonClass::SchemaValidation,
                };
                Err(LlmError::new(class, e.detail().to_owned()))
            }
        },
        OutputSpec::Decision(spec) => spec.parse_json(raw).map(ReplyValue::Decision).map_err(LlmError::from),
        OutputSpec::Text | OutputSpec::Unbindable { .. } => return None,
    })
}
