//! `RetryLlm`: retries transient failures of the backend it wraps.
//!
//! The decision "retry or not" is [`ReasonClass::is_retryable`]: timeouts, connection errors,
//! 429 and 500/502/503/504 only; never invalid JSON, schema violations or other 4xx. The
//! schedule is jittered exponential backoff (backon) from `FABRIC_LLM_RETRY_BASE_S`, capped at
//! `FABRIC_LLM_RETRY_MAX_BACKOFF_S`; a provider's `Retry-After` replaces the computed delay, up
//! to the same cap. Each retry emits `run.llm.retrying` with the attempt number and the delay.

use backon::{BackoffBuilder, ExponentialBuilder};

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo};
use crate::events::EventData;
use crate::llm::model::RetryPolicy;

#[derive(Debug)]
pub struct RetryLlm<L> {
    inner: L,
    policy: RetryPolicy,
}

impl<L: Llm> RetryLlm<L> {
    pub fn new(inner: L, policy: RetryPolicy) -> RetryLlm<L> {
        RetryLlm { inner, policy }
    }

    /// The attempts after a first one failed with the retryable `error`.
    async fn retry(&self, req: &LlmRequest<'_>, mut error: LlmError) -> Result<LlmReply, LlmError> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.policy.base)
            .with_max_delay(self.policy.max_backoff)
            .with_max_times(self.policy.max_attempts.saturating_sub(1) as usize)
            .with_jitter();
        if let Some(seed) = self.policy.jitter_seed {
            delays = delays.with_jitter_seed(seed);
        }
        let mut delays = delays.build();
        let mut attempt: u32 = 1;
        loop {
            let Some(computed) = delays.next() else { return Err(error) };
            let delay = error.retry_after.map_or(computed, |w| w.after).min(self.policy.max_backoff);
            req.events.emit(Some(req.stage_id), || EventData::LlmRetrying {
                attempt: attempt + 1,
                delay_ms: delay.as_millis() as u64,
                reason_class: error.class,
                message: error.message.clone(),
            });
            tokio::time::sleep(delay).await;
            attempt += 1;
            // The new attempt's text starts again; watchers drop what the last one showed.
            if let Some(deltas) = req.stream {
                deltas.restart();
            }
            error = match self.inner.call(req).await {
                Ok(reply) => return Ok(reply),
                Err(e) => e,
            };
            if !error.class.is_retryable() || error.give_up || attempt >= self.policy.max_attempts {
                return Err(error);
            }
        }
    }
}

impl<L: Llm> Llm for RetryLlm<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(self.call(req))
    }

    async fn call<'a>(&'a self, req: &'a LlmRequest<'a>) -> Result<LlmReply, LlmError> {
        // Most calls succeed at once: the retries (their schedule, timer and state) live in a
        // future of their own, made at the first failure, so the first attempt's is small.
        match self.inner.call(req).await {
            Ok(reply) => Ok(reply),
            Err(error) if !error.class.is_retryable() || error.give_up || self.policy.max_attempts <= 1 => Err(error),
            Err(error) => Box::pin(self.retry(req, error)).await,
        }
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}
