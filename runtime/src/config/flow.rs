//! The limits on model calls: `FABRIC_LLM_MAX_CONCURRENCY`, `FABRIC_LLM_RPM`, `FABRIC_LLM_TPM`,
//! and per `provider:model` the config file's `[llm_limits."provider:model"]` table; and
//! `FABRIC_LLM_MAX_PAUSE_S`, the longest pause a provider's 429 may put on a model.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::time::Duration;

use figment::value::Value;

use crate::llm::flow::{BreakerPolicy, DEFAULT_MAX_PAUSE, FlowPlan, Limits, MAX_PAUSE};
use crate::vocab::{ConfigError, choose_model, err};

/// The largest limit of each kind accepted: far past any provider's quota, small enough that a
/// typo of many digits is refused rather than read as "no limit".
const MAX_CONCURRENCY: u64 = 100_000;
const MAX_RPM: u64 = 100_000_000;
const MAX_TPM: u64 = 1_000_000_000_000;

/// One limit: a whole number from 1 to `max`; a zero, a negative number or anything else is
/// refused, naming `what`.
fn limit(what: &str, value: Option<&str>, max: u64) -> Result<Option<u64>, ConfigError> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(None) };
    match v.parse::<u64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(err(what, format!("`{v}` must be a whole number from 1 to {max} (unset: no limit)"))),
    }
}

/// The defaults, from the variables.
pub(super) fn defaults(get: &dyn Fn(&str) -> Option<String>) -> Result<Limits, ConfigError> {
    Ok(Limits {
        max_concurrency: limit("FABRIC_LLM_MAX_CONCURRENCY", get("FABRIC_LLM_MAX_CONCURRENCY").as_deref(), MAX_CONCURRENCY)?.map(|n| n as u32),
        rpm: limit("FABRIC_LLM_RPM", get("FABRIC_LLM_RPM").as_deref(), MAX_RPM)?.map(|n| n as u32),
        tpm: limit("FABRIC_LLM_TPM", get("FABRIC_LLM_TPM").as_deref(), MAX_TPM)?,
    })
}

/// The file's `[llm_limits]`: a table per `provider:model` (as `FABRIC_LLM_MODEL` spells it) of
/// `max_concurrency`, `rpm` and `tpm`. Every error names `FABRIC_CONFIG` and the key.
pub(super) fn models(value: &Value) -> Result<BTreeMap<String, Limits>, ConfigError> {
    let bad = |m: String| err("FABRIC_CONFIG", m);
    let Value::Dict(_, dict) = value else { return Err(bad("`llm_limits` must be a table of `[llm_limits.\"provider:model\"]` tables".into())) };
    let mut out = BTreeMap::new();
    // Each key's spelling in the file, for the message of a second one.
    let mut spelled: BTreeMap<String, String> = BTreeMap::new();
    for (model, table) in dict {
        let choice = choose_model("FABRIC_CONFIG", model).map_err(|e| bad(format!("`llm_limits.\"{model}\"`: {}", e.message)))?;
        let key = format!("{}:{}", choice.provider.key(), choice.model);
        // Two spellings of one model (`gpt-4o-mini` beside `openai:gpt-4o-mini`, or a space
        // more) would otherwise have one silently win.
        let slot = match out.entry(key) {
            Entry::Vacant(slot) => slot,
            Entry::Occupied(taken) => {
                let first = spelled.get(taken.key()).map_or(String::new(), |k| format!(" by `llm_limits.\"{k}\"`"));
                return Err(bad(format!("`llm_limits.\"{model}\"` names the model `{}`, already limited{first}; keep one table per model", taken.key())));
            }
        };
        spelled.insert(slot.key().clone(), model.clone());
        let Value::Dict(_, fields) = table else { return Err(bad(format!("`llm_limits.\"{model}\"` must be a table of max_concurrency, rpm, tpm"))) };
        let mut limits = Limits::default();
        for (field, v) in fields {
            let what = format!("FABRIC_CONFIG `llm_limits.\"{model}\".{field}`");
            let text = super::value_to_string(v);
            let max = match field.as_str() {
                "max_concurrency" => MAX_CONCURRENCY,
                "rpm" => MAX_RPM,
                "tpm" => MAX_TPM,
                other => return Err(bad(format!("`llm_limits.\"{model}\"`: unknown limit `{other}`; known: max_concurrency, rpm, tpm"))),
            };
            let n = limit(&what, Some(text.as_deref().unwrap_or("?")), max)?;
            match field.as_str() {
                "max_concurrency" => limits.max_concurrency = n.map(|n| n as u32),
                "rpm" => limits.rpm = n.map(|n| n as u32),
                _ => limits.tpm = n,
            }
        }
        slot.insert(limits);
    }
    Ok(out)
}

/// `FABRIC_LLM_MAX_PAUSE_S`: seconds, from 0 (a 429 that names a wait fails its call at once)
/// to [`MAX_PAUSE`]; unset, [`DEFAULT_MAX_PAUSE`].
pub(super) fn max_pause(value: Option<&str>) -> Result<Duration, ConfigError> {
    const VAR: &str = "FABRIC_LLM_MAX_PAUSE_S";
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(DEFAULT_MAX_PAUSE) };
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=MAX_PAUSE.as_secs_f64()).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(err(VAR, format!("`{v}` must be a number of seconds from 0 to {} (unset: {})", MAX_PAUSE.as_secs(), DEFAULT_MAX_PAUSE.as_secs()))),
    }
}

/// The breakers of fallback chains' models: `FABRIC_LLM_BREAKER_FAILURES` (failures in a row
/// that open one, 1 to 1,000) and `FABRIC_LLM_BREAKER_COOLDOWN_S` (seconds it stays open, 0.1
/// to 3,600).
pub(super) fn breaker(get: &dyn Fn(&str) -> Option<String>) -> Result<BreakerPolicy, ConfigError> {
    let mut policy = BreakerPolicy::default();
    if let Some(n) = limit("FABRIC_LLM_BREAKER_FAILURES", get("FABRIC_LLM_BREAKER_FAILURES").as_deref(), 1_000)? {
        policy.failures = n as u32;
    }
    const COOLDOWN: &str = "FABRIC_LLM_BREAKER_COOLDOWN_S";
    if let Some(v) = get(COOLDOWN).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
        policy.cooldown = match v.parse::<f64>() {
            Ok(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            _ => return Err(err(COOLDOWN, format!("`{v}` must be a number of seconds from 0.1 to 3600 (unset: {})", policy.cooldown.as_secs()))),
        };
    }
    Ok(policy)
}

/// The plan of the variables and the file's tables.
pub(super) fn plan(get: &dyn Fn(&str) -> Option<String>, file: Option<&Value>) -> Result<FlowPlan, ConfigError> {
    Ok(FlowPlan {
        default: defaults(get)?,
        models: file.map(models).transpose()?.unwrap_or_default(),
        max_pause: max_pause(get("FABRIC_LLM_MAX_PAUSE_S").as_deref())?,
        breaker: breaker(get)?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_longest_pause_is_bounded_and_zero_is_allowed() {
        assert_eq!(super::max_pause(None).unwrap(), super::DEFAULT_MAX_PAUSE);
        assert_eq!(super::max_pause(Some(" 0 ")).unwrap(), super::Duration::ZERO);
        assert_eq!(super::max_pause(Some("2.5")).unwrap(), super::Duration::from_millis(2500));
        for bad in ["-1", "601", "NaN", "inf", "soon", "1e308"] {
            let e = super::max_pause(Some(bad)).unwrap_err();
            assert!(e.var == "FABRIC_LLM_MAX_PAUSE_S" && e.message.contains(bad), "{bad}: {e:?}");
        }
    }

    use super::*;
    use figment::providers::Format;

    fn get(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_breaker_is_bounded() {
        assert_eq!(breaker(&get(&[])).unwrap(), BreakerPolicy::default());
        let p = breaker(&get(&[("FABRIC_LLM_BREAKER_FAILURES", "5"), ("FABRIC_LLM_BREAKER_COOLDOWN_S", "2.5")])).unwrap();
        assert_eq!(p, BreakerPolicy { failures: 5, cooldown: Duration::from_millis(2500) });
        assert_eq!(breaker(&get(&[("FABRIC_LLM_BREAKER_FAILURES", "0")])).unwrap_err().var, "FABRIC_LLM_BREAKER_FAILURES");
        for bad in ["0", "-1", "3601", "NaN", "soon"] {
            let vars: &'static [(&str, &str)] = Box::leak(Box::new([("FABRIC_LLM_BREAKER_COOLDOWN_S", bad)]));
            let e = breaker(&get(vars)).unwrap_err();
            assert!(e.var == "FABRIC_LLM_BREAKER_COOLDOWN_S" && e.message.contains(bad), "{bad}: {e:?}");
        }
    }

    #[test]
    fn zero_negative_and_words_are_refused_naming_the_variable() {
        for bad in ["0", "-3", "ten", "1.5", "100001"] {
            let vars: &'static [(&str, &str)] = Box::leak(Box::new([("FABRIC_LLM_MAX_CONCURRENCY", bad)]));
            let e = defaults(&get(vars)).unwrap_err();
            assert_eq!(e.var, "FABRIC_LLM_MAX_CONCURRENCY", "{bad}");
            assert!(e.message.contains(bad), "{e:?}");
        }
        assert_eq!(defaults(&get(&[("FABRIC_LLM_RPM", "0")])).unwrap_err().var, "FABRIC_LLM_RPM");
        assert_eq!(defaults(&get(&[("FABRIC_LLM_TPM", "-1")])).unwrap_err().var, "FABRIC_LLM_TPM");
        let l = defaults(&get(&[("FABRIC_LLM_MAX_CONCURRENCY", " 8 "), ("FABRIC_LLM_RPM", "600"), ("FABRIC_LLM_TPM", "")])).unwrap();
        assert_eq!(l, Limits { max_concurrency: Some(8), rpm: Some(600), tpm: None });
    }

    #[test]
    fn file_tables_are_per_model_over_the_defaults() {
        let toml = "[llm_limits.\"openai:gpt-4o\"]\nrpm = 500\n[llm_limits.\"google_genai:gemini-2.5-flash\"]\nmax_concurrency = 4\ntpm = 100000\n";
        let dict: BTreeMap<String, Value> = figment::Figment::from(figment::providers::Toml::string(toml)).extract().unwrap();
        let p = plan(&get(&[("FABRIC_LLM_MAX_CONCURRENCY", "16")]), dict.get("llm_limits")).unwrap();
        assert_eq!(p.limits("openai:gpt-4o"), Limits { max_concurrency: Some(16), rpm: Some(500), tpm: None });
        assert_eq!(p.limits("google_genai:gemini-2.5-flash"), Limits { max_concurrency: Some(4), rpm: None, tpm: Some(100_000) });
        assert_eq!(p.limits("anthropic:claude"), Limits { max_concurrency: Some(16), rpm: None, tpm: None });
        for (toml, needle) in [
            ("[llm_limits.\"openai:x\"]\nrpm = 0\n", "rpm"),
            ("[llm_limits.\"openai:x\"]\nburst = 3\n", "unknown limit `burst`"),
            ("[llm_limits.\"openai:x\"]\ntpm = \"lots\"\n", "lots"),
            ("llm_limits = 3\n", "must be a table"),
            ("[llm_limits.\"gpt-4o-mini\"]\nrpm = 1\n[llm_limits.\"openai:gpt-4o-mini\"]\nrpm = 2\n", "already limited"),
            ("[llm_limits.\"openai:x\"]\nrpm = 1\n[llm_limits.\" openai:x \"]\nrpm = 2\n", "`openai:x`, already limited by `llm_limits.\" openai:x \"`"),
        ] {
            let dict: BTreeMap<String, Value> = figment::Figment::from(figment::providers::Toml::string(toml)).extract().unwrap();
            let e = plan(&get(&[]), dict.get("llm_limits")).unwrap_err();
            assert!(e.var.starts_with("FABRIC_CONFIG") && (e.message.contains(needle) || e.var.contains(needle)), "{toml}: {e:?}");
        }
    }
}
