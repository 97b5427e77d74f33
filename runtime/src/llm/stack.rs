//! The one place the LLM stack is composed: `TelemetryLlm(RetryLlm(backend))`.
//!
//! Order matters: telemetry is outermost so that one logical call, however many attempts the
//! retry layer makes inside it, is one `run.llm.started` / `completed|failed` pair and one span.

use std::collections::HashMap;
use std::sync::Arc;

use super::Llm;
use super::providers::{backend_for, shared_client};
use super::retry::RetryLlm;
use super::telemetry::TelemetryLlm;
use crate::catalogue::defs::ProfileDef;
use crate::config::{ConfigError, ProviderKind, ProviderTarget, RetryPolicy, Settings, Tuning, choose_model};

/// Wraps a backend in the decorators every call goes through.
pub fn build<B: Llm + 'static>(backend: B, retry: RetryPolicy) -> Arc<dyn Llm> {
    Arc::new(TelemetryLlm::new(RetryLlm::new(backend, retry)))
}

/// The default provider stack of the configuration (`FABRIC_LLM_MODEL` / `OLLAMA_MODEL`).
pub fn provider_stack(settings: &Settings, client: &reqwest::Client) -> Result<Arc<dyn Llm>, ConfigError> {
    let target = settings.target.clone().ok_or_else(|| ConfigError { var: settings.model_string.1.to_owned(), message: "no provider is configured".into() })?;
    Ok(build(backend_for(client.clone(), target, Tuning::default(), settings.max_reply_bytes), settings.retry))
}

/// Where a model profile sends its calls when profiles are honoured
/// (`FABRIC_HONOR_MODEL_PROFILE=1`): routing (provider, model, base URL, key variable) is taken
/// from the profile as one unit, or entirely from the process configuration when the profile
/// names no routing; tuning (temperature, max tokens) merges field by field over the defaults.
pub fn profile_target(settings: &Settings, name: &str, profile: &ProfileDef) -> Result<(ProviderTarget, Tuning), ConfigError> {
    let what = format!("model profile `{name}` ({}:{}:{})", profile.origin.path.display(), profile.origin.pos.line, profile.origin.pos.col);
    let fail = |message: String| ConfigError { var: what.clone(), message };
    let has_routing = profile.provider.is_some() || profile.model.is_some() || profile.base_url.is_some() || profile.api_key_env.is_some();
    let target = if !has_routing {
        settings.target.clone().ok_or_else(|| fail("names no model and the process has no provider configured".into()))?
    } else {
        let model = profile
            .model
            .as_deref()
            .ok_or_else(|| fail("routing moves as one unit: a profile that sets provider, base_url or api_key_env must also set model".into()))?;
        let (kind, model) = match &profile.provider {
            Some(p) => (
                ProviderKind::from_key(p)
                    .ok_or_else(|| fail(format!("provider `{p}` is not supported; supported: ollama, openai, google_genai, anthropic")))?,
                model.to_owned(),
            ),
            None => {
                let c = choose_model(&what, model)?;
                (c.provider, c.model)
            }
        };
        settings
            .resolve_target(kind, model, profile.base_url.as_deref(), profile.api_key_env.as_deref())
            .map_err(|e| fail(format!("{}: {}", e.var, e.message)))?
    };
    let defaults = Tuning::default();
    let tuning = Tuning { temperature: profile.temperature.unwrap_or(defaults.temperature), max_tokens: profile.max_tokens.unwrap_or(defaults.max_tokens) };
    Ok((target, tuning))
}

/// One stack per model profile, all built before any inference. A profile that cannot be used
/// here (its key variable is unset, say) keeps its error: runs of the routes that use it are
/// refused at start, every other route runs.
pub fn profile_stacks<'a>(
    settings: &Settings,
    client: &reqwest::Client,
    profiles: impl Iterator<Item = (&'a String, &'a ProfileDef)>,
) -> HashMap<String, Result<Arc<dyn Llm>, ConfigError>> {
    profiles
        .map(|(name, profile)| {
            let stack = profile_target(settings, name, profile)
                .map(|(target, tuning)| build(backend_for(client.clone(), target, tuning, settings.max_reply_bytes), settings.retry));
            (name.clone(), stack)
        })
        .collect()
}

/// The client shared by every provider backend of the process.
pub fn client() -> Result<reqwest::Client, String> {
    shared_client()
}
