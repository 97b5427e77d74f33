//! The one place the LLM stack is composed: `TelemetryLlm(RetryLlm(FlowLlm(backend)))`, or for a
//! profile with fallbacks `TelemetryLlm(FallbackLlm([RetryLlm(FlowLlm(backend)), ...]))`.
//!
//! Order matters: telemetry is outermost so that one logical call, however many attempts the
//! retry layer makes inside it, is one `run.llm.started` / `completed|failed` pair and one span.
//! Flow control is inside the retries: each attempt takes room at its model's gate, so a call
//! that waits spends no attempt, and a retried one queues again.

use std::sync::Arc;

use super::Llm;
use super::fallback::{ChainPolicy, FallbackLlm, Member};
use super::flow::{Flow, FlowLlm, Gate};
use super::model::RetryPolicy;
use super::providers::shared_client;
use super::retry::RetryLlm;
use super::telemetry::TelemetryLlm;

/// Wraps a backend in the decorators every call goes through.
pub fn build<B: Llm + 'static>(backend: B, retry: RetryPolicy) -> Arc<dyn Llm> {
    gated(backend, retry, None)
}

/// [`build`], the calls going through `gate` (the model's limits and pauses).
pub fn gated<B: Llm + 'static>(backend: B, retry: RetryPolicy, gate: Option<Arc<Gate>>) -> Arc<dyn Llm> {
    Arc::new(TelemetryLlm::new(RetryLlm::new(FlowLlm::new(backend, gate, super::CALL_TIMEOUT), retry)))
}

/// One model of a fallback chain: its backend with its own retries, through its own gate, with
/// its breaker (the process's, from `flow`).
pub fn member<B: Llm + 'static>(backend: B, retry: RetryPolicy, flow: &Flow, hosted: bool) -> Member {
    let info = backend.info();
    let key = super::flow::key_of(&info);
    let gate = flow.gate(&info, hosted);
    let breaker = flow.breaker(&key);
    let llm: Arc<dyn Llm> = Arc::new(RetryLlm::new(FlowLlm::new(backend, gate.clone(), super::CALL_TIMEOUT), retry));
    Member { key: key.into(), llm, gate, breaker }
}

/// A profile's chain: its own model `first`, then `fallbacks`, in one telemetry layer (one
/// logical call, one span, whichever model answers). Without fallbacks, the plain stack's
/// equivalent (no breaker is consulted for a model that has nothing to fall back to).
pub fn chain(first: Member, fallbacks: Vec<Member>, policy: ChainPolicy) -> Arc<dyn Llm> {
    if fallbacks.is_empty() {
        return Arc::new(TelemetryLlm::new(first.llm));
    }
    Arc::new(TelemetryLlm::new(FallbackLlm::new(first, fallbacks, policy)))
}

/// The client shared by every provider backend of the process.
pub fn client() -> Result<reqwest::Client, crate::failure::ClientError> {
    shared_client()
}
