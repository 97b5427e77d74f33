//! Where model calls go: provider kinds, model strings, targets, tuning, the retry policy, keys.
//!
//! The vocabulary of the model port's configuration. [`crate::config`] reads the environment
//! into these types; the catalogue loader checks model profiles with them; the backends use them.

use std::fmt;
use std::time::Duration;

/// The default run store (`FABRIC_DATABASE_URL`).
pub const DEFAULT_DATABASE_URL: &str = "sqlite://fabric.db";
pub const DEFAULT_MODEL: &str = "ollama:qwen3:14b";
pub const DEFAULT_OLLAMA_URL: &str = "http://127.0.0.1:11434";
pub const DEFAULT_OPENAI_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_GEMINI_URL: &str = "https://generativelanguage.googleapis.com";
pub const DEFAULT_GEMINI_VERSION: &str = "v1";
pub const DEFAULT_ANTHROPIC_URL: &str = "https://api.anthropic.com";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: String,
    pub message: String,
}

pub(crate) fn err(var: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { var: var.to_owned(), message: message.into() }
}

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

/// The providers with a backend. Others parse (as LangChain would) but are refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Ollama,
    OpenAi,
    Gemini,
    Anthropic,
}

impl ProviderKind {
    pub fn key(self) -> &'static str {
        match self {
            ProviderKind::Ollama => "ollama",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Gemini => "google_genai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    pub fn from_key(key: &str) -> Option<ProviderKind> {
        match key {
            "ollama" => Some(ProviderKind::Ollama),
            "openai" => Some(ProviderKind::OpenAi),
            "google_genai" => Some(ProviderKind::Gemini),
            "anthropic" => Some(ProviderKind::Anthropic),
            _ => None,
        }
    }

    /// The OpenTelemetry `gen_ai.provider.name` value.
    pub fn otel_name(self) -> &'static str {
        match self {
            ProviderKind::Ollama => "ollama",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Gemini => "gcp.gemini",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// LangChain's provider keys (`init_chat_model`), used to decide whether a prefix is a provider.
const LANGCHAIN_PROVIDERS: &[&str] = &[
    "anthropic",
    "anthropic_bedrock",
    "azure_ai",
    "azure_openai",
    "baseten",
    "bedrock",
    "bedrock_converse",
    "bedrock_mantle_anthropic",
    "bedrock_mantle_openai",
    "cohere",
    "deepseek",
    "fireworks",
    "google_anthropic_vertex",
    "google_genai",
    "google_vertexai",
    "groq",
    "huggingface",
    "ibm",
    "langsmith",
    "litellm",
    "meta",
    "mistralai",
    "nvidia",
    "ollama",
    "openai",
    "openrouter",
    "perplexity",
    "together",
    "upstage",
    "xai",
];

/// LangChain's provider inference from a bare model name: the first row whose prefix the
/// lower-cased name starts with wins.
const INFERENCE: &[(&[&str], &str)] = &[
    (&["gpt-", "o1", "o3", "chatgpt", "text-davinci"], "openai"),
    (&["claude"], "anthropic"),
    (&["command"], "cohere"),
    (&["accounts/fireworks"], "fireworks"),
    (&["gemini"], "google_vertexai"),
    (&["amazon.", "anthropic.", "meta."], "bedrock"),
    (&["mistral", "mixtral"], "mistralai"),
    (&["deepseek"], "deepseek"),
    (&["grok"], "xai"),
    (&["sonar"], "perplexity"),
    (&["solar"], "upstage"),
];

/// Parses a model string exactly as LangChain's `init_chat_model` does: split at the first `:`
/// only when the prefix is a provider key, else infer the provider from the model name.
/// Returns `(provider, model)`, or `None` when no provider can be inferred.
pub fn parse_model_string(s: &str) -> Option<(String, String)> {
    if let Some((prefix, rest)) = s.split_once(':')
        && LANGCHAIN_PROVIDERS.contains(&prefix)
    {
        return Some((prefix.to_owned(), rest.to_owned()));
    }
    let lower = s.to_lowercase();
    let (_, provider) = INFERENCE.iter().find(|(prefixes, _)| prefixes.iter().any(|p| lower.starts_with(p)))?;
    Some(((*provider).to_owned(), s.to_owned()))
}

/// Where the model comes from, and the provider it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    pub provider: ProviderKind,
    pub model: String,
}

/// Resolves `OLLAMA_MODEL` (bare names mean Ollama) or `FABRIC_LLM_MODEL`.
pub fn choose_model(var: &str, value: &str) -> Result<ModelChoice, ConfigError> {
    let value = value.trim();
    let parsed = if var == "OLLAMA_MODEL" {
        match value.split_once(':') {
            Some((prefix, _)) if LANGCHAIN_PROVIDERS.contains(&prefix) => parse_model_string(value),
            _ => Some(("ollama".to_owned(), value.to_owned())),
        }
    } else {
        parse_model_string(value)
    };
    let (provider, model) =
        parsed.ok_or_else(|| err(var, format!("cannot tell the provider of `{value}`; write it as PROVIDER:MODEL, e.g. ollama:{value}")))?;
    if model.is_empty() {
        return Err(err(var, format!("`{value}` names no model")));
    }
    let kind = ProviderKind::from_key(&provider)
        .ok_or_else(|| err(var, format!("provider `{provider}` (from `{value}`) is not supported; supported: ollama, openai, google_genai, anthropic")))?;
    Ok(ModelChoice { provider: kind, model })
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
}

/// Per-call tuning; the fixed parity defaults unless a model profile overrides them (opt-in).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    pub temperature: f64,
    pub max_tokens: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { temperature: crate::llm::TEMPERATURE, max_tokens: crate::llm::MAX_OUTPUT_TOKENS }
    }
}

/// The retry schedule of `RetryLlm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per call, the first included.
    pub max_attempts: u32,
    pub base: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 3, base: Duration::from_secs(1), max_backoff: Duration::from_secs(30) }
    }
}

/// A provider-facing URL from configuration: absolute http(s), stored without a trailing `/`.
pub fn parse_base_url(var: &str, value: &str) -> Result<String, ConfigError> {
    let v = value.trim().trim_end_matches('/');
    match reqwest::Url::parse(v) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(v.to_owned()),
        _ => Err(err(var, format!("`{}` is not an http(s) URL", crate::redact::redact_url(value)))),
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
