//! Runtime configuration from the environment. Bad values fail at start-up, naming the variable.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: &'static str,
    pub message: String,
}

/// Reads `FABRIC_*` settings through a lookup (the process environment, or a map in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub stub: bool,
    pub stub_latency: Duration,
    pub stub_strict: bool,
    pub fleet: Option<String>,
}

/// `1/true/yes/on` and `0/false/no/off` (any case); empty means unset.
pub fn parse_flag(var: &'static str, value: Option<&str>) -> Result<bool, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(ConfigError { var, message: format!("`{v}` is not a boolean; use 1/true/yes/on or 0/false/no/off") }),
        },
    }
}

impl Settings {
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
        let stub = parse_flag("FABRIC_LLM_STUB", get("FABRIC_LLM_STUB").as_deref())?;
        let stub_strict = parse_flag("FABRIC_LLM_STUB_STRICT", get("FABRIC_LLM_STUB_STRICT").as_deref())?;
        let stub_latency = match get("FABRIC_LLM_STUB_LATENCY_MS").as_deref().map(str::trim) {
            None | Some("") => Duration::ZERO,
            Some(v) => v
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| ConfigError { var: "FABRIC_LLM_STUB_LATENCY_MS", message: format!("`{v}` is not a whole number of milliseconds") })?,
        };
        let fleet = match get("FABRIC_FLEET").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()) {
            None => None,
            Some(f) if crate::catalogue::yaml::is_ident(&f) => Some(f),
            Some(f) => return Err(ConfigError { var: "FABRIC_FLEET", message: format!("`{f}` is not a fleet name (letters, digits, `_`, `-`, `.`)") }),
        };
        Ok(Settings { stub, stub_latency, stub_strict, fleet })
    }

    pub fn from_env() -> Result<Settings, ConfigError> {
        Settings::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_bad_values() {
        for v in ["1", "TRUE", "Yes", "on"] {
            assert_eq!(parse_flag("X", Some(v)), Ok(true));
        }
        for v in ["0", "false", "NO", "off", ""] {
            assert_eq!(parse_flag("X", Some(v)), Ok(false));
        }
        assert!(parse_flag("FABRIC_LLM_STUB", Some("maybe")).unwrap_err().to_string().starts_with("FABRIC_LLM_STUB:"));
        let bad = Settings::from_lookup(|k| (k == "FABRIC_LLM_STUB_LATENCY_MS").then(|| "fast".to_owned())).unwrap_err();
        assert_eq!(bad.var, "FABRIC_LLM_STUB_LATENCY_MS");
    }
}
