//! Where model calls go: provider kinds, model strings, targets, tuning, the retry policy, keys.
//!
//! The model port's side of configuration. [`crate::config`] reads the environment into these
//! types; the backends use them. What the catalogue shares with them (provider kinds, the
//! model-string parser, [`ConfigError`]) is in the leaf [`crate::vocab`], re-exported here.

use std::fmt;
use std::time::Duration;

use crate::vocab::err;
pub use crate::vocab::{ConfigError, ModelChoice, ProviderKind, choose_model, parse_base_url, parse_model_string};

pub const DEFAULT_MODEL: &str = "ollama:qwen3:14b";
pub const DEFAULT_OLLAMA_URL: &str = "http://127.0.0.1:11434";
pub const DEFAULT_OPENAI_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_GEMINI_URL: &str = "https://generativelanguage.googleapis.com";
pub const DEFAULT_GEMINI_VERSION: &str = "v1";
pub const DEFAULT_ANTHROPIC_URL: &str = "https://api.anthropic.com";

/// An API key. It is sent to its provider and nowhere else: never printed, logged or put in
/// events.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: String) -> ApiKey {
        ApiKey(key)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where one provider call goes.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderTarget {
    pub provider: ProviderKind,
    pub model: String,
    /// Without a trailing `/`.
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    /// The variable the key came from (for messages; never the key).
    pub api_key_var: Option<String>,
    /// Gemini only.
    pub api_version: String,
    /// Bedrock's region and keys, Vertex AI's project, location and service account.
    pub cloud: Option<crate::llm::cloud::Cloud>,
}

/// Per-call tuning; the fixed parity defaults unless a model profile overrides them (opt-in).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    pub temperature: f64,
    pub max_tokens: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { temperature: crate::vocab::TEMPERATURE, max_tokens: crate::vocab::MAX_OUTPUT_TOKENS }
    }
}

/// The retry schedule of `RetryLlm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per call, the first included.
    pub max_attempts: u32,
    pub base: Duration,
    pub max_backoff: Duration,
    /// The seed of the delays' jitter; `None` (the default, and every front end) seeds it from
    /// the OS, so replicas retrying together spread out. A simulation fixes it, so that one seed
    /// gives one schedule (`tests/e2e/sim`).
    pub jitter_seed: Option<u64>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 3, base: Duration::from_secs(1), max_backoff: Duration::from_secs(30), jitter_seed: None }
    }
}

/// `OLLAMA_HOST` as the Ollama client reads it: scheme defaults to http, port to 11434 (80/443
/// when a scheme is given), a bare `:PORT` means 127.0.0.1.
pub fn parse_ollama_host(value: &str) -> Result<String, ConfigError> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(DEFAULT_OLLAMA_URL.to_owned());
    }
    let (scheme, rest, default_port) = match v.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest, if s == "https" { 443 } else { 80 }),
        Some(_) => return Err(err("OLLAMA_HOST", format!("`{}` has an unsupported scheme", crate::redact::redact_url(v)))),
        None => ("http", v, 11434),
    };
    let (hostport, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{}", p.trim_end_matches('/'))),
        None => (rest, String::new()),
    };
    let (host, port) = if hostport.starts_with('[') {
        match hostport.rsplit_once("]:") {
            Some((h, p)) => (format!("{h}]"), p.parse::<u16>().ok()),
            None => (hostport.to_owned(), Some(default_port)),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse::<u16>().ok()),
            None => (hostport.to_owned(), Some(default_port)),
        }
    };
    let port = port.ok_or_else(|| err("OLLAMA_HOST", format!("`{}` has an invalid port", crate::redact::redact_url(v))))?;
    let host = if host.is_empty() { "127.0.0.1".to_owned() } else { host };
    let path = if path == "/" { String::new() } else { path };
    parse_base_url("OLLAMA_HOST", &format!("{scheme}://{host}:{port}{path}"))
}

/// An API key must fit in an HTTP header: no line breaks or other control characters.
pub(crate) fn check_key(var: &str, key: &str) -> Result<(), ConfigError> {
    if key.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        Ok(())
    } else {
        Err(err(var, "contains a space, a line break or another character that cannot be sent in an HTTP header; check how the key was pasted"))
    }
}
