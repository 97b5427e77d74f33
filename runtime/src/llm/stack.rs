//! The one place the LLM stack is composed: `TelemetryLlm(RetryLlm(backend))`.
//!
//! Order matters: telemetry is outermost so that one logical call, however many attempts the
//! retry layer makes inside it, is one `run.llm.started` / `completed|failed` pair and one span.

use std::sync::Arc;

use super::Llm;
use super::model::RetryPolicy;
use super::providers::shared_client;
use super::retry::RetryLlm;
use super::telemetry::TelemetryLlm;

/// Wraps a backend in the decorators every call goes through.
pub fn build<B: Llm + 'static>(backend: B, retry: RetryPolicy) -> Arc<dyn Llm> {
    Arc::new(TelemetryLlm::new(RetryLlm::new(backend, retry)))
}

/// The client shared by every provider backend of the process.
pub fn client() -> Result<reqwest::Client, crate::failure::ClientError> {
    shared_client()
}
