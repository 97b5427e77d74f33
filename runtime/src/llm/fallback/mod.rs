//! `FallbackLlm`: a model profile's chain of models. Each model runs with its own retries and
//! its own gate (`RetryLlm(FlowLlm(backend))`), so one model's transient failures are retried
//! there first; the chain moves on to the next model only for a [`Reason`] another model can
//! fix, says so in `run.llm.fallback`, and names the model that answered in the reply
//! ([`LlmReply::served_by`]), which the span and the journal keep.
//!
//! It sits inside `TelemetryLlm`, so one logical call (however many models it tried) is still one
//! `run.llm.started` and one `completed` or `failed`, and one span.
//!
//! Each model asks for structured output in its own provider's way (its backend's codec), from
//! the same flat schema; the reply is validated against that schema whoever answered.

use std::sync::Arc;

use super::flow::{Admit, Breaker, Gate, breaker};
use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass, Refused};
use crate::events::EventData;

/// Why a chain moved on from a model: the closed set of `run.llm.fallback`'s `reason` and of
/// `fabric_model_fallbacks_total`'s label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Its server failed or could not be reached (after its retries).
    Unavailable,
    /// It stayed rate limited past its retries, or asked for a wait longer than allowed.
    RateLimited,
    /// It did not answer in time (after its retries).
    Timeout,
    /// It refused the key (HTTP 401 or 403).
    Auth,
    /// It refused the content (a refusal, a content filter, a safety block).
    Refused,
    /// Its reply did not meet the schema (only where the profile says `fallback_on_invalid`).
    Invalid,
    /// Its breaker is open: it failed often enough in a row that it is not asked for a while.
    CircuitOpen,
    /// Its gate is paused after a 429 (only where the profile says `prefer_available`).
    Paused,
}

impl Reason {
    pub const ALL: [Reason; 8] =
        [Reason::Unavailable, Reason::RateLimited, Reason::Timeout, Reason::Auth, Reason::Refused, Reason::Invalid, Reason::CircuitOpen, Reason::Paused];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unavailable => "unavailable",
            Reason::RateLimited => "rate_limited",
            Reason::Timeout => "timeout",
            Reason::Auth => "auth",
            Reason::Refused => "refused",
            Reason::Invalid => "invalid",
            Reason::CircuitOpen => "circuit_open",
            Reason::Paused => "paused",
        }
    }

    /// Whether the failure says the model is unwell (its breaker counts it), rather than that it
    /// did not take this one request.
    fn counts_against(self) -> bool {
        matches!(self, Reason::Unavailable | Reason::RateLimited | Reason::Timeout | Reason::Auth)
    }
}

/// Why another model may answer what this one failed, or `None`: a cancelled run, a request the
/// route made invalid (any other 4xx), a reply cut at the token limit, a failure of the stub;
/// invalid output only when `on_invalid`.
pub fn reason_of(e: &LlmError, on_invalid: bool) -> Option<Reason> {
    match e.refused {
        Some(Refused::Auth) => return Some(Reason::Auth),
        Some(Refused::Content) => return Some(Reason::Refused),
        None => {}
    }
    match e.class {
        ReasonClass::ServerError | ReasonClass::Connection => Some(Reason::Unavailable),
        ReasonClass::RateLimited => Some(Reason::RateLimited),
        ReasonClass::Timeout => Some(Reason::Timeout),
        ReasonClass::InvalidJson | ReasonClass::SchemaValidation | ReasonClass::InvalidDecision | ReasonClass::UnknownTool if on_invalid => {
            Some(Reason::Invalid)
        }
        _ => None,
    }
}

/// How a chain moves on, from its profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainPolicy {
    /// A reply that fails the schema moves on too (`fallback_on_invalid`).
    pub on_invalid: bool,
    /// A model whose gate is paused is skipped instead of waited for (`prefer_available`).
    pub prefer_available: bool,
}

/// One model of a chain: its stack below telemetry, its gate, its breaker.
pub struct Member {
    /// `provider:model`, its gate's key.
    pub key: Arc<str>,
    pub llm: Arc<dyn Llm>,
    pub gate: Option<Arc<Gate>>,
    pub breaker: Arc<Breaker>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("key", &self.key).finish_non_exhaustive()
    }
}

/// A profile's models, tried in order.
#[derive(Debug)]
pub struct FallbackLlm {
    members: Vec<Member>,
    policy: ChainPolicy,
}

impl FallbackLlm {
    /// The chain of the profile's own model `first`, then its `fallbacks` in order.
    pub fn new(first: Member, fallbacks: Vec<Member>, policy: ChainPolicy) -> FallbackLlm {
        let mut members = Vec::with_capacity(1 + fallbacks.len());
        members.push(first);
        members.extend(fallbacks);
        FallbackLlm { members, policy }
    }

    /// The models' keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.members.iter().map(|m| &m.key)
    }

    /// Why `m` is skipped before it is asked: its breaker, or its pause when the profile
    /// prefers a model that is available.
    fn skip(&self, m: &Member) -> Result<Option<breaker::Probe>, (Reason, ReasonClass)> {
        if self.policy.prefer_available && m.gate.as_ref().is_some_and(|g| g.is_paused()) {
            return Err((Reason::Paused, ReasonClass::RateLimited));
        }
        match m.breaker.admit() {
            Admit::Go => Ok(None),
            Admit::Probe(p) => Ok(Some(p)),
            Admit::Skip(class) => Err((Reason::CircuitOpen, class)),
        }
    }

    async fn chain(&self, req: &LlmRequest<'_>) -> Result<LlmReply, LlmError> {
        // The model the chain moves on from, and why: said when the next one is asked.
        let mut moving: Option<(&Member, Reason, ReasonClass)> = None;
        let mut tried = false;
        let mut last_error = None;
        for (i, m) in self.members.iter().enumerate() {
            // Every model skipped: the last is asked anyway, a chain never fails unasked.
            let probe = match self.skip(m) {
                Ok(p) => p,
                Err(why) if i + 1 < self.members.len() || tried => {
                    moving = Some((m, why.0, why.1));
                    continue;
                }
                Err(_) => None,
            };
            if let Some((from, reason, class)) = moving.take() {
                req.events.emit(Some(req.stage_id), || EventData::LlmFallback {
                    from: from.key.to_string(),
                    to: m.key.to_string(),
                    reason: reason.as_str(),
                    reason_class: class,
                });
            }
            // A model after one that showed text starts the text again.
            if tried && let Some(deltas) = req.stream {
                deltas.restart();
            }
            tried = true;
            let result = m.llm.complete(req).await;
            drop(probe);
            match result {
                Ok(mut reply) => {
                    m.breaker.succeeded();
                    reply.served_by = Some(m.key.clone());
                    return Ok(reply);
                }
                Err(e) => {
                    let Some(reason) = reason_of(&e, self.policy.on_invalid) else { return Err(e) };
                    if reason.counts_against() {
                        m.breaker.failed(e.class);
                    }
                    moving = Some((m, reason, e.class));
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| LlmError::new(ReasonClass::ProviderError, "every model of the chain was skipped")))
    }
}

impl Llm for FallbackLlm {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(self.chain(req))
    }

    /// The profile's own model: what `run.llm.started` and the span's request name.
    fn info(&self) -> ModelInfo {
        self.members[0].llm.info()
    }
}

#[cfg(test)]
mod tests;
