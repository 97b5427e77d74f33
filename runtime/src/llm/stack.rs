//! The one place the LLM stack is composed: `TelemetryLlm(RetryLlm(FlowLlm(backend)))`.
//!
//! Order matters: telemetry is outermost so that one logical call, however many attempts the
//! retry layer makes inside it, is one `run.llm.started` / `completed|failed` pair and one span.
//! Flow control is inside the retries: each attempt takes room at its model's gate, so a call
//! that waits spends no attempt, and a retried one queues again.

use std::sync::Arc;

use super::Llm;
use super::flow::{FlowLlm, Gate};
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

/// The client shared by every provider backend of the process.
pub fn client() -> Result<reqwest::Client, crate::failure::ClientError> {
    shared_client()
}
