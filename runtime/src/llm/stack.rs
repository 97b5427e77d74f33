//! The one place the LLM stack is composed.

use std::sync::Arc;

use super::Llm;
use super::telemetry::TelemetryLlm;

/// Wraps a backend in the decorators every run goes through.
///
/// Order matters: telemetry is outermost so that one logical call (however many attempts a
/// retry layer makes inside it) is one `run.llm.started` / `completed|failed` pair.
pub fn build<B: Llm + 'static>(backend: B) -> Arc<dyn Llm> {
    Arc::new(TelemetryLlm::new(backend))
}
