//! The fleet's fallback chain of its default model: `FABRIC_LLM_FALLBACKS`
//! (`provider:model,provider:model`, each resolved as `FABRIC_LLM_MODEL` is, with the provider's
//! own variables for its URL and key), `FABRIC_LLM_FALLBACK_ON_INVALID` and
//! `FABRIC_LLM_PREFER_AVAILABLE` (a catalogue profile's `fallback_on_invalid` and
//! `prefer_available`).

use super::{ProviderTarget, Settings, parse_flag};
use crate::llm::fallback::ChainPolicy;
use crate::vocab::{ConfigError, choose_model, err};

const VAR: &str = "FABRIC_LLM_FALLBACKS";

/// The fallbacks' targets in order; an empty entry, a model named twice or the default model
/// itself is refused, naming the entry.
pub(super) fn targets(settings: &Settings, value: Option<&str>) -> Result<Vec<ProviderTarget>, ConfigError> {
    let Some(list) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(Vec::new()) };
    let mut keys: Vec<String> = settings.target.iter().map(|t| format!("{}:{}", t.provider.key(), t.model)).collect();
    let mut out = Vec::new();
    for (i, entry) in list.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            return Err(err(VAR, format!("entry {} is empty; write `provider:model,provider:model`", i + 1)));
        }
        let choice = choose_model(VAR, entry).map_err(|e| err(VAR, format!("`{entry}`: {}", e.message)))?;
        let key = format!("{}:{}", choice.provider.key(), choice.model);
        if keys.contains(&key) {
            let what = if settings.target.as_ref().is_some_and(|t| format!("{}:{}", t.provider.key(), t.model) == key) {
                "the default model itself"
            } else {
                "already in the chain"
            };
            return Err(err(VAR, format!("`{entry}` names `{key}`, {what}")));
        }
        keys.push(key);
        out.push(settings.resolve_target(choice.provider, choice.model, None, None).map_err(|e| err(VAR, format!("`{entry}`: {}: {}", e.var, e.message)))?);
    }
    Ok(out)
}

/// The chain's policy from its two flags.
pub(super) fn policy(get: &dyn Fn(&str) -> Option<String>) -> Result<ChainPolicy, ConfigError> {
    Ok(ChainPolicy {
        on_invalid: parse_flag("FABRIC_LLM_FALLBACK_ON_INVALID", get("FABRIC_LLM_FALLBACK_ON_INVALID").as_deref())?,
        prefer_available: parse_flag("FABRIC_LLM_PREFER_AVAILABLE", get("FABRIC_LLM_PREFER_AVAILABLE").as_deref())?,
    })
}
