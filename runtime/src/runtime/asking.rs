//! One structured model call outside any run, through a model profile's stack
//! ([`Runtime::ask`]): what an evaluation's judge is (`llm_judge`, issue 51). The call goes
//! through the same `TelemetryLlm(RetryLlm(backend))` stack as a stage of a route of that
//! profile, so its retries, limits and spans are a stage's; its events go nowhere.

use std::sync::Arc;

use serde_json::Value;

use super::Runtime;
use crate::cancel::Cancel;
use crate::events::{NullSink, RunEvents};
use crate::exec::ProfileError;
use crate::llm::{LlmError, LlmRequest, OutputSpec};

/// Why an [`Runtime::ask`] gave no value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AskError {
    #[error("model profile `{profile}` cannot be used here: {problem}")]
    Profile { profile: String, problem: ProfileError },
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// What an [`Runtime::ask`] asks: the names its call is known by (the stub's script is looked up
/// by them), the texts, and the flat output schema of its reply.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub profile: &'a str,
    pub route_id: &'a str,
    pub stage_id: &'a str,
    pub system: &'a str,
    pub user: &'a str,
    pub schema: &'a Value,
}

impl Runtime {
    /// Calls the model of `ask.profile` once for a reply of `ask.schema`; returns the value as a
    /// stage would take it (the compact JSON of a structured reply) and the tokens it cost.
    pub async fn ask(&self, ask: Ask<'_>) -> Result<(String, u64), AskError> {
        let edition = self.current();
        let llm = edition.runner().profile_llm(ask.profile).map_err(|problem| AskError::Profile { profile: ask.profile.to_owned(), problem })?;
        let output = OutputSpec::from_schema(ask.schema);
        let events = RunEvents::new("ask", ask.route_id, None, Arc::new(NullSink));
        let (never, cx) = (Cancel::never(), opentelemetry::Context::current());
        let req = LlmRequest {
            events: &events,
            route_id: ask.route_id,
            stage_id: ask.stage_id,
            turn: 0,
            priority: 0,
            system: ask.system,
            user: ask.user,
            output: &output,
            cx: &cx,
            cancel: &never,
            stream: None,
        };
        let reply = llm.complete(&req).await?;
        let tokens = reply.meta.usage.map_or(0, |u| u.input_tokens + u.output_tokens);
        Ok((reply.value.recorded(), tokens))
    }
}
