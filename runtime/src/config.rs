//! Runtime configuration: the environment (and an optional TOML file) read once at start-up.
//!
//! Sources are merged with figment: built-in defaults < the file named by `FABRIC_CONFIG` <
//! the environment. Every value is then parsed by hand so that a bad one fails before any
//! inference with a message naming the variable. API keys live in [`ApiKey`], whose `Debug`
//! and `Display` never show the key.

use std::collections::BTreeMap;

use crate::llm::model::check_key;
pub use crate::llm::model::{
    ApiKey, DEFAULT_ANTHROPIC_URL, DEFAULT_GEMINI_URL, DEFAULT_GEMINI_VERSION, DEFAULT_MODEL, DEFAULT_OLLAMA_URL, DEFAULT_OPENAI_URL, ProviderTarget,
    RetryPolicy, Tuning, parse_ollama_host,
};
use crate::vocab::{Compat, err};
pub use crate::vocab::{
    ConfigError, DEFAULT_TOOL_TIMEOUT_MS, MAX_TOOL_TIMEOUT_MS, ModelChoice, ProviderKind, choose_model, parse_base_url, parse_model_string,
};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

mod catalogue;
mod cloud;
mod compat;
mod fallbacks;
mod flow;
mod session;
mod webhook;
pub use catalogue::{ResumeOn, WATCH_POLL};
pub use session::{INTERRUPTED_BY_SESSION, SessionPolicy};
pub use webhook::{WebhookRefused, WebhookSecret, WebhookSettings, web_url};

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

/// Every variable the runtime reads (besides `${VAR}` parts of tool URLs).
pub const VARIABLES: &[&str] = &[
    "FABRIC_LLM_STUB",
    "FABRIC_LLM_STUB_LATENCY_MS",
    "FABRIC_LLM_STUB_STRICT",
    "FABRIC_FLEET",
    "FABRIC_LLM_MODEL",
    "OLLAMA_MODEL",
    "OLLAMA_BASE_URL",
    "OLLAMA_HOST",
    "OLLAMA_API_KEY",
    "FABRIC_LLM_RETRY_MAX",
    "FABRIC_LLM_RETRY_BASE_S",
    "FABRIC_LLM_RETRY_MAX_BACKOFF_S",
    "FABRIC_HONOR_MODEL_PROFILE",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
    "GEMINI_API_VERSION",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "FABRIC_LLM_MAX_REPLY_BYTES",
    "FABRIC_LLM_STREAM_IDLE_S",
    "FABRIC_TOOL_TIMEOUT_MS",
    "FABRIC_DATABASE_URL",
    "FABRIC_API_TOKEN",
    "FABRIC_MAX_RUNS_IN_FLIGHT",
    "FABRIC_SHUTDOWN_GRACE_S",
    "FABRIC_WAIT_MAX_S",
    "FABRIC_LOG",
    "FABRIC_LOG_FORMAT",
    "FABRIC_RUN_LEASE_S",
    "FABRIC_MAX_QUEUED_RUNS",
    "FABRIC_CLAIM_POLL_MS",
    "FABRIC_BODY_TIMEOUT_S",
    "FABRIC_RUN_RETENTION",
    "FABRIC_AWAITING_RETENTION",
    "FABRIC_WEBHOOK_URL",
    "FABRIC_WEBHOOK_ALLOWED_ORIGINS",
    "FABRIC_WEBHOOK_SECRET",
    "FABRIC_WEBHOOK_MAX_ATTEMPTS",
    "FABRIC_WEBHOOK_BACKOFF_BASE_S",
    "FABRIC_WEBHOOK_BACKOFF_MAX_S",
    "FABRIC_SESSION_POLICY",
    "FABRIC_RESUME_ON",
    "FABRIC_CATALOGUE_WATCH",
    "FABRIC_LLM_MAX_CONCURRENCY",
    "FABRIC_LLM_RPM",
    "FABRIC_LLM_TPM",
    "FABRIC_LLM_MAX_PAUSE_S",
    "FABRIC_LLM_FALLBACKS",
    "FABRIC_LLM_FALLBACK_ON_INVALID",
    "FABRIC_LLM_PREFER_AVAILABLE",
    "FABRIC_LLM_BREAKER_FAILURES",
    "FABRIC_LLM_BREAKER_COOLDOWN_S",
    // Cloud providers (config/cloud.rs): Amazon Bedrock.
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_BEARER_TOKEN_BEDROCK",
    "BEDROCK_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
    "AWS_ENDPOINT_URL",
    // Vertex AI.
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "CLOUD_ML_PROJECT_ID",
    "GCLOUD_PROJECT",
    "GOOGLE_CLOUD_REGION",
    "CLOUD_ML_REGION",
    "GOOGLE_VERTEX_BASE_URL",
    // The OpenAI-compatible family, Azure OpenAI and Mistral (llm/providers/compat.rs, docs/providers.md).
    "FABRIC_LLM_BASE_URL",
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_API_BASE",
    "GROQ_API_KEY",
    "GROQ_API_BASE",
    "GROQ_BASE_URL",
    "XAI_API_KEY",
    "XAI_API_BASE",
    "FIREWORKS_API_KEY",
    "FIREWORKS_API_BASE",
    "FIREWORKS_BASE_URL",
    "TOGETHER_API_KEY",
    "TOGETHER_API_BASE",
    "OPENROUTER_API_KEY",
    "OPENROUTER_API_BASE",
    "PPLX_API_KEY",
    "PERPLEXITY_API_KEY",
    "PERPLEXITY_BASE_URL",
    "NVIDIA_API_KEY",
    "NVIDIA_BASE_URL",
    "UPSTAGE_API_KEY",
    "UPSTAGE_API_BASE",
    "BASETEN_API_KEY",
    "BASETEN_BASE_URL",
    "BASETEN_API_BASE",
    "LITELLM_PROXY_API_KEY",
    "LITELLM_API_KEY",
    "LITELLM_PROXY_API_BASE",
    "AZURE_AI_API_KEY",
    "AZURE_AI_OPENAI_ENDPOINT",
    "AZURE_OPENAI_ENDPOINT",
    "AZURE_OPENAI_API_KEY",
    "AZURE_OPENAI_AD_TOKEN",
    "OPENAI_API_VERSION",
    "MISTRAL_API_KEY",
    "MISTRAL_BASE_URL",
    // Cohere (llm/providers/cohere.rs).
    "COHERE_API_KEY",
    "CO_API_KEY",
    "CO_API_URL",
    // The rest of init_chat_model's keys (docs/providers.md): Hugging Face's router, Meta's
    // Model API, the LangSmith gateway, Claude on Bedrock, Mantle and Vertex AI.
    "HF_TOKEN",
    "HUGGINGFACEHUB_API_TOKEN",
    "MODEL_API_KEY",
    "MODEL_API_BASE",
    "LANGSMITH_GATEWAY",
    "LANGSMITH_GATEWAY_API_KEY",
    "LANGSMITH_API_KEY",
    "ANTHROPIC_BEDROCK_BASE_URL",
    "ANTHROPIC_API_URL",
    "ANTHROPIC_BEDROCK_MANTLE_BASE_URL",
    "ANTHROPIC_AWS_API_KEY",
    "ANTHROPIC_VERTEX_BASE_URL",
    // IBM watsonx.ai (config/cloud.rs).
    "WATSONX_URL",
    "WATSONX_API_KEY",
    "WATSONX_APIKEY",
    "WATSONX_TOKEN",
    "WATSONX_PROJECT_ID",
    "WATSONX_SPACE_ID",
    "FABRIC_IBM_IAM_URL",
];

/// A retention (`30d`, `12h`, `90m`, `1w`; humantime's units): at least a second, at most
/// 100 years as humantime counts them (`100y`: a year is 365.25 days). Unset (or empty) is keep
/// forever. Also `fabric runs prune --older-than`'s reading.
pub fn parse_retention(var: &str, value: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(None) };
    let bad = |why: &str| err(var, format!("`{v}` {why}"));
    let d = humantime::parse_duration(v).map_err(|_| bad("is not a duration such as 30d, 12h or 90m"))?;
    // humantime's `y` is 365.25 days, so the bound is `100y` itself.
    if d < Duration::from_secs(1) || d > Duration::from_secs(100 * 31_557_600) {
        return Err(bad("must be from 1s to 100y (humantime's year: 365.25 days)"));
    }
    Ok(Some(d))
}

/// The largest `FABRIC_CONFIG` file read; a bigger one (or a special file) is refused.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;
/// The longest stub latency accepted: ten minutes per call is far past any real provider.
pub const MAX_STUB_LATENCY_MS: u64 = 600_000;

/// How settings read variables that are not in [`VARIABLES`]: the key variable a model profile
/// names in `api_key_env`. The process environment in the CLI, the same map as the rest in tests.
#[derive(Clone)]
pub struct EnvLookup(std::sync::Arc<LookupFn>);

/// Reads one variable by name.
pub type LookupFn = dyn Fn(&str) -> Option<String> + Send + Sync;

impl fmt::Debug for EnvLookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EnvLookup")
    }
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub stub: bool,
    pub stub_latency: Duration,
    pub stub_strict: bool,
    pub fleet: Option<String>,
    pub retry: RetryPolicy,
    pub honor_model_profile: bool,
    /// The model string and the variable it came from (or would have: see `model_default`).
    pub model_string: (String, &'static str),
    /// Whether no variable named a model and the default (`ollama:qwen3:14b`) is used: front
    /// ends say so, and suggest the stub, when that default provider cannot be reached.
    pub model_default: bool,
    /// The default provider target; `None` with the stub (no provider is needed then).
    pub target: Option<ProviderTarget>,
    /// The cap on one provider reply body (`FABRIC_LLM_MAX_REPLY_BYTES`).
    pub max_reply_bytes: usize,
    /// How long a streaming provider reply may send nothing before the call fails with `timeout`
    /// (`FABRIC_LLM_STREAM_IDLE_S`, default 120).
    pub stream_idle: Duration,
    /// How long an in-process tool may take before the call fails with `tool_timeout`
    /// (`FABRIC_TOOL_TIMEOUT_MS`, default 10000).
    pub tool_timeout: Duration,
    /// Problems that do not stop start-up (shown by the CLI on stderr, logged by the service).
    pub warnings: Vec<String>,
    /// The run store and the service (`fabric serve`).
    pub service: ServiceSettings,
    /// The limits on model calls (`FABRIC_LLM_MAX_CONCURRENCY`, `_RPM`, `_TPM`, the file's
    /// `[llm_limits]`).
    pub flow: crate::llm::flow::FlowPlan,
    /// The default model's fallbacks, in order (`FABRIC_LLM_FALLBACKS`); empty without the
    /// stub's provider, or with the stub.
    pub fallbacks: Vec<ProviderTarget>,
    /// How the default model's chain moves on (`FABRIC_LLM_FALLBACK_ON_INVALID`,
    /// `FABRIC_LLM_PREFER_AVAILABLE`).
    pub fallback_policy: crate::llm::fallback::ChainPolicy,
    raw: RawVars,
    origins: BTreeMap<String, String>,
    env: EnvLookup,
}

/// The default run store (`FABRIC_DATABASE_URL`).
pub const DEFAULT_DATABASE_URL: &str = "sqlite://fabric.db";

/// Where runs are recorded, and the service's access and limits.
#[derive(Clone, PartialEq)]
pub struct ServiceSettings {
    /// `FABRIC_DATABASE_URL` (default `sqlite://fabric.db`).
    pub database_url: String,
    /// `FABRIC_API_TOKEN`: the bearer token of the API. Never printed.
    pub api_token: Option<String>,
    pub max_runs_in_flight: usize,
    pub shutdown_grace: Duration,
    pub wait_max: Duration,
    /// `FABRIC_RUN_LEASE_S` (default 30): how long a process holds a run it claimed without
    /// renewing the claim (it renews every third of it); past it, another process takes the run
    /// over from its journal.
    pub run_lease: Duration,
    /// `FABRIC_MAX_QUEUED_RUNS` (default 10000): runs a busy service queues in the store for any
    /// replica with room; past it, 429. 0: a busy service refuses rather than queues.
    pub max_queued_runs: u64,
    /// `FABRIC_CLAIM_POLL_MS` (default 1000): how often a service looks for runs to claim.
    pub claim_poll: Duration,
    /// `FABRIC_BODY_TIMEOUT_S` (default 10): how long a request's body may take to arrive once
    /// its headers have; past it, 408 and the connection closed.
    pub body_timeout: Duration,
    /// `FABRIC_RUN_RETENTION` (`30d`, `12h`; unset: forever): how long ended runs are kept
    /// after their end; the service's sweeper deletes older ones.
    pub run_retention: Option<Duration>,
    /// `FABRIC_AWAITING_RETENTION` (unset: forever): how long a run may await the user; the
    /// sweeper cancels older ones with the reason `expired`.
    pub awaiting_retention: Option<Duration>,
    /// `FABRIC_WEBHOOK_*`: the completion webhooks.
    pub webhooks: WebhookSettings,
    /// `FABRIC_SESSION_POLICY` (default `allow`): what a start with a `session_id` does while
    /// another run of that session is live, unless its contract says (`multitask`).
    pub session_policy: SessionPolicy,
    /// `FABRIC_RESUME_ON` (default `recorded`): the catalogue version a run taken up again goes
    /// on on.
    pub resume_on: ResumeOn,
    /// `FABRIC_CATALOGUE_WATCH` (default off): a change of the catalogue's files on disk
    /// reloads it (polled every [`WATCH_POLL`], loaded once two polls agree).
    pub catalogue_watch: bool,
    /// `FABRIC_LOG`: a `tracing` filter (default `info`).
    pub log_filter: String,
    /// `FABRIC_LOG_FORMAT`: `json` lines or `text`.
    pub log_json: bool,
}

impl fmt::Debug for ServiceSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceSettings")
            .field("database_url", &crate::redact::redact_url(&self.database_url))
            .field("api_token", &self.api_token.as_ref().map(|_| "<redacted>"))
            .field("max_runs_in_flight", &self.max_runs_in_flight)
            .finish_non_exhaustive()
    }
}

/// The merged variables as text. Its `Debug` redacts keys.
#[derive(Clone)]
struct RawVars(BTreeMap<String, String>);

impl fmt::Debug for RawVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |k: &str, v: &str| if k.ends_with("_KEY") || k.ends_with("_TOKEN") { "<redacted>".to_owned() } else { crate::redact::redact_url(v) };
        f.debug_map().entries(self.0.iter().map(|(k, v)| (k, shown(k, v)))).finish()
    }
}

/// `1/true/yes/on` and `0/false/no/off` (any case); empty means unset.
pub fn parse_flag(var: &str, value: Option<&str>) -> Result<bool, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(err(var, format!("`{v}` is not a boolean; use 1/true/yes/on or 0/false/no/off"))),
        },
    }
}

fn parse_seconds(var: &str, value: Option<&str>, default: f64) -> Result<Duration, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(Duration::from_secs_f64(default)),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
            Ok(_) => Err(err(var, format!("`{v}` must be a positive number of seconds (at most 86400)"))),
            Err(_) => Err(err(var, format!("`{v}` is not a number of seconds"))),
        },
    }
}

/// A figment provider of plain strings (figment's own `Env` would parse `1` into a number).
struct Strings {
    name: &'static str,
    values: Vec<(String, String)>,
}

impl Provider for Strings {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let dict: Dict = self.values.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect();
        Ok(Profile::Default.collect(dict))
    }
}

fn value_to_string(v: &Value) -> Option<String> {
    match v {
        Value::String(_, s) => Some(s.clone()),
        Value::Char(_, c) => Some(c.to_string()),
        Value::Bool(_, b) => Some(b.to_string()),
        // TOML integers are figment's integer kinds, floats its float kinds.
        Value::Num(_, n) => n.to_i128().map(|i| i.to_string()).or_else(|| n.to_u128().map(|u| u.to_string())).or_else(|| n.to_f64().map(|f| f.to_string())),
        _ => None,
    }
}

/// Reads the `FABRIC_CONFIG` file: a regular file of at most [`MAX_CONFIG_FILE_BYTES`], valid
/// TOML. A syntax error is reported by line and column only: the offending line may hold a
/// secret, so it is never echoed.
fn read_config_file(path: &std::path::Path) -> Result<String, ConfigError> {
    let shown = path.display();
    let text = crate::textfile::read_bounded(path, MAX_CONFIG_FILE_BYTES).map_err(|e| err("FABRIC_CONFIG", format!("`{shown}`: {e}")))?;
    let table = match text.parse::<toml::Table>() {
        Ok(table) => table,
        Err(e) => {
            let at = e.span().map_or(String::new(), |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(":{line}:{col}")
            });
            let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
            return Err(err("FABRIC_CONFIG", format!("`{shown}{at}` is not valid TOML: {message}")));
        }
    };
    // Keys are case-insensitive: two spellings of one key would let one win silently.
    let mut seen = std::collections::BTreeSet::new();
    if let Some(key) = table.keys().find(|k| !seen.insert(k.to_ascii_uppercase())) {
        return Err(err("FABRIC_CONFIG", format!("`{shown}` sets `{}` twice (keys are case-insensitive; `{key}` is the second)", key.to_ascii_uppercase())));
    }
    Ok(text)
}

impl Settings {
    /// What a provider's reply may cost (`FABRIC_LLM_MAX_REPLY_BYTES`, `FABRIC_LLM_STREAM_IDLE_S`).
    pub fn reply_limits(&self) -> crate::llm::providers::ReplyLimits {
        crate::llm::providers::ReplyLimits { max_bytes: self.max_reply_bytes, stream_idle: self.stream_idle }
    }

    /// Reads the process environment (and the `FABRIC_CONFIG` file, if set).
    pub fn from_env() -> Result<Settings, ConfigError> {
        Settings::load(|k| std::env::var(k).ok())
    }

    /// Reads settings through `get` (the environment, or a map in tests); every variable,
    /// including a key variable a model profile names, is read through it.
    pub fn load(get: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Result<Settings, ConfigError> {
        let mut figment = Figment::new();
        let mut file_label = None;
        if let Some(path) = get("FABRIC_CONFIG").filter(|p| !p.trim().is_empty()) {
            let path = PathBuf::from(path.trim());
            let text = read_config_file(&path)?;
            file_label = Some(format!("FABRIC_CONFIG file {}", path.display()));
            figment = figment.merge(Toml::string(&text));
        }
        let env_values: Vec<(String, String)> = VARIABLES.iter().filter_map(|v| get(v).map(|val| (v.to_string(), val))).collect();
        figment = figment.merge(Strings { name: "environment", values: env_values });
        let dict: BTreeMap<String, Value> = figment.extract().map_err(|e| err("FABRIC_CONFIG", e.to_string()))?;
        let mut raw = BTreeMap::new();
        let mut origins = BTreeMap::new();
        let mut llm_limits = None;
        for (key, value) in &dict {
            let upper = key.to_ascii_uppercase();
            // The one table of the file: limits per model, which no single variable can say.
            if upper == "LLM_LIMITS" {
                llm_limits = Some(value);
                continue;
            }
            if !VARIABLES.contains(&upper.as_str()) {
                return Err(err("FABRIC_CONFIG", format!("unknown setting `{key}`; known: {}", VARIABLES.join(", "))));
            }
            let s = value_to_string(value).ok_or_else(|| err(&upper, "must be a string, number or boolean"))?;
            let from_env = figment.get_metadata(value.tag()).is_none_or(|m| m.name == "environment");
            let source = if from_env { "environment".to_owned() } else { file_label.clone().unwrap_or_default() };
            // Keys come only from the environment: a file is too easily committed or shared.
            if (upper.ends_with("_API_KEY") || upper.ends_with("_TOKEN") || cloud::SECRETS.contains(&upper.as_str())) && source != "environment" {
                return Err(err("FABRIC_CONFIG", format!("`{upper}` is an API key; keys are read only from the environment, never from files")));
            }
            // The file may spell a key in lower case; the environment's value still wins.
            if raw.contains_key(&upper) && source != "environment" {
                continue;
            }
            origins.insert(upper.clone(), source);
            raw.insert(upper, s);
        }
        let mut settings = Settings::from_raw(raw, origins, EnvLookup(std::sync::Arc::new(get)))?;
        if let Some(v) = llm_limits {
            settings.flow.models = flow::models(v)?;
        }
        Ok(settings)
    }

    fn from_raw(raw: BTreeMap<String, String>, origins: BTreeMap<String, String>, env: EnvLookup) -> Result<Settings, ConfigError> {
        let get = |k: &str| raw.get(k).map(String::as_str).filter(|v| !v.trim().is_empty());
        let stub = parse_flag("FABRIC_LLM_STUB", get("FABRIC_LLM_STUB"))?;
        let stub_strict = parse_flag("FABRIC_LLM_STUB_STRICT", get("FABRIC_LLM_STUB_STRICT"))?;
        let honor_model_profile = parse_flag("FABRIC_HONOR_MODEL_PROFILE", get("FABRIC_HONOR_MODEL_PROFILE"))?;
        let stub_latency = match get("FABRIC_LLM_STUB_LATENCY_MS").map(str::trim) {
            None => Duration::ZERO,
            Some(v) => match v.parse::<u64>() {
                Ok(ms) if ms <= MAX_STUB_LATENCY_MS => Duration::from_millis(ms),
                _ => {
                    return Err(err("FABRIC_LLM_STUB_LATENCY_MS", format!("`{v}` must be a whole number of milliseconds from 0 to {MAX_STUB_LATENCY_MS}")));
                }
            },
        };
        let max_reply_bytes = match get("FABRIC_LLM_MAX_REPLY_BYTES").map(str::trim) {
            None => crate::llm::providers::DEFAULT_MAX_REPLY_BYTES,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1024..=1 << 30).contains(&n) => n,
                _ => return Err(err("FABRIC_LLM_MAX_REPLY_BYTES", format!("`{v}` must be a whole number of bytes from 1024 to 1073741824"))),
            },
        };
        let default_idle = crate::llm::providers::streaming::DEFAULT_STREAM_IDLE.as_secs_f64();
        let stream_idle = parse_seconds("FABRIC_LLM_STREAM_IDLE_S", get("FABRIC_LLM_STREAM_IDLE_S"), default_idle)?;
        let tool_timeout = match get("FABRIC_TOOL_TIMEOUT_MS").map(str::trim) {
            None => Duration::from_millis(DEFAULT_TOOL_TIMEOUT_MS),
            Some(v) => match v.parse::<u64>() {
                Ok(ms) if (1..=MAX_TOOL_TIMEOUT_MS).contains(&ms) => Duration::from_millis(ms),
                _ => {
                    return Err(err("FABRIC_TOOL_TIMEOUT_MS", format!("`{v}` must be a whole number of milliseconds from 1 to {MAX_TOOL_TIMEOUT_MS}")));
                }
            },
        };
        let fleet = match get("FABRIC_FLEET").map(str::trim) {
            None => None,
            Some(f) if crate::yaml::is_ident(f) => Some(f.to_owned()),
            Some(f) => return Err(err("FABRIC_FLEET", format!("`{f}` is not a fleet name (letters, digits, `_`, `-`, `.`)"))),
        };
        let max_attempts = match get("FABRIC_LLM_RETRY_MAX").map(str::trim) {
            None => 3,
            Some(v) => match v.parse::<u32>() {
                Ok(n) if (1..=100).contains(&n) => n,
                _ => return Err(err("FABRIC_LLM_RETRY_MAX", format!("`{v}` must be a whole number of attempts from 1 to 100"))),
            },
        };
        let retry = RetryPolicy {
            max_attempts,
            base: parse_seconds("FABRIC_LLM_RETRY_BASE_S", get("FABRIC_LLM_RETRY_BASE_S"), 1.0)?,
            max_backoff: parse_seconds("FABRIC_LLM_RETRY_MAX_BACKOFF_S", get("FABRIC_LLM_RETRY_MAX_BACKOFF_S"), 30.0)?,
            jitter_seed: None,
        };
        let model_string = match (get("OLLAMA_MODEL"), get("FABRIC_LLM_MODEL")) {
            (Some(m), _) => (m.trim().to_owned(), "OLLAMA_MODEL"),
            (None, Some(m)) => (m.trim().to_owned(), "FABRIC_LLM_MODEL"),
            (None, None) => (DEFAULT_MODEL.to_owned(), "FABRIC_LLM_MODEL"),
        };
        let model_default = get("OLLAMA_MODEL").is_none() && get("FABRIC_LLM_MODEL").is_none();
        let whole = |var: &str, default: u64, max: u64| -> Result<u64, ConfigError> {
            match get(var).map(str::trim) {
                None => Ok(default),
                Some(v) => {
                    v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| err(var, format!("`{v}` must be a whole number from 1 to {max}")))
                }
            }
        };
        let api_token = get("FABRIC_API_TOKEN").map(|t| t.trim().to_owned());
        if let Some(t) = &api_token {
            check_key("FABRIC_API_TOKEN", t)?;
        }
        let log_json = match get("FABRIC_LOG_FORMAT").map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("json") => true,
            Some("text") => false,
            Some(other) => return Err(err("FABRIC_LOG_FORMAT", format!("`{other}` is not a log format; use json or text"))),
        };
        let service = ServiceSettings {
            database_url: get("FABRIC_DATABASE_URL").map_or_else(|| DEFAULT_DATABASE_URL.to_owned(), |u| u.trim().to_owned()),
            api_token,
            max_runs_in_flight: whole("FABRIC_MAX_RUNS_IN_FLIGHT", 1024, 1_000_000)? as usize,
            shutdown_grace: Duration::from_secs(whole("FABRIC_SHUTDOWN_GRACE_S", 30, 86_400)?),
            wait_max: Duration::from_secs(whole("FABRIC_WAIT_MAX_S", 60, 86_400)?),
            run_lease: Duration::from_secs(whole("FABRIC_RUN_LEASE_S", 30, 86_400)?),
            max_queued_runs: match get("FABRIC_MAX_QUEUED_RUNS").map(str::trim) {
                None => 10_000,
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= 10_000_000)
                    .ok_or_else(|| err("FABRIC_MAX_QUEUED_RUNS", format!("`{v}` must be a whole number from 0 to 10000000")))?,
            },
            claim_poll: Duration::from_millis(whole("FABRIC_CLAIM_POLL_MS", 1000, 60_000)?.max(10)),
            body_timeout: Duration::from_secs(whole("FABRIC_BODY_TIMEOUT_S", 10, 3600)?),
            run_retention: parse_retention("FABRIC_RUN_RETENTION", get("FABRIC_RUN_RETENTION"))?,
            awaiting_retention: parse_retention("FABRIC_AWAITING_RETENTION", get("FABRIC_AWAITING_RETENTION"))?,
            webhooks: WebhookSettings::load(&|k: &str| get(k).map(str::to_owned))?,
            session_policy: SessionPolicy::load(get("FABRIC_SESSION_POLICY"))?,
            resume_on: ResumeOn::load(get("FABRIC_RESUME_ON"))?,
            catalogue_watch: parse_flag("FABRIC_CATALOGUE_WATCH", get("FABRIC_CATALOGUE_WATCH"))?,
            log_filter: get("FABRIC_LOG").map_or_else(|| "info".to_owned(), |f| f.trim().to_owned()),
            log_json,
        };
        let flow = flow::plan(&|k: &str| get(k).map(str::to_owned), None)?;
        let fallback_policy = fallbacks::policy(&|k: &str| get(k).map(str::to_owned))?;
        let mut settings = Settings {
            flow,
            fallbacks: Vec::new(),
            fallback_policy,
            stub,
            stub_latency,
            stub_strict,
            fleet,
            retry,
            honor_model_profile,
            model_string,
            model_default,
            target: None,
            max_reply_bytes,
            stream_idle,
            tool_timeout,
            warnings: Vec::new(),
            service,
            raw: RawVars(raw.clone()),
            origins,
            env,
        };
        // With the stub no provider is contacted, so none has to be configured. As in the
        // Python runtime, the model string is not even looked at then: a bad one is a warning.
        let target = choose_model(settings.model_string.1, &settings.model_string.0)
            .and_then(|choice| settings.resolve_target(choice.provider, choice.model, None, None));
        match target {
            Ok(t) => settings.target = Some(t),
            Err(e) if stub => settings.warnings.push(format!("{e} (ignored: the seeded stub answers every call)")),
            Err(e) => return Err(e),
        }
        match fallbacks::targets(&settings, get("FABRIC_LLM_FALLBACKS")) {
            Ok(t) if !stub => settings.fallbacks = t,
            Ok(_) => {}
            Err(e) if stub => settings.warnings.push(format!("{e} (ignored: the seeded stub answers every call)")),
            Err(e) => return Err(e),
        }
        Ok(settings)
    }

    fn var(&self, k: &str) -> Option<&str> {
        self.raw.0.get(k).map(String::as_str).filter(|v| !v.trim().is_empty())
    }

    /// Builds a provider target: base URL and key from the provider's usual variables, unless
    /// given (a model profile's `base_url` and `api_key_env`).
    pub fn resolve_target(&self, provider: ProviderKind, model: String, base_url: Option<&str>, key_var: Option<&str>) -> Result<ProviderTarget, ConfigError> {
        let (url, default_url, key_vars): (Result<String, ConfigError>, bool, Vec<&str>) = match provider {
            ProviderKind::Ollama => match (base_url, self.var("OLLAMA_BASE_URL"), self.var("OLLAMA_HOST")) {
                (Some(u), _, _) => (parse_base_url("model profile base_url", u), false, vec!["OLLAMA_API_KEY"]),
                (None, Some(u), _) => (parse_base_url("OLLAMA_BASE_URL", u), false, vec!["OLLAMA_API_KEY"]),
                (None, None, Some(h)) => (parse_ollama_host(h), false, vec!["OLLAMA_API_KEY"]),
                (None, None, None) => (Ok(DEFAULT_OLLAMA_URL.to_owned()), false, vec!["OLLAMA_API_KEY"]),
            },
            ProviderKind::OpenAi => {
                let (u, default) = match (base_url, self.var("OPENAI_BASE_URL"), self.var("OPENAI_API_BASE")) {
                    (Some(u), _, _) => (parse_base_url("model profile base_url", u), false),
                    (None, Some(u), _) => (parse_base_url("OPENAI_BASE_URL", u), false),
                    (None, None, Some(u)) => (parse_base_url("OPENAI_API_BASE", u), false),
                    (None, None, None) => (Ok(DEFAULT_OPENAI_URL.to_owned()), true),
                };
                (u, default, vec!["OPENAI_API_KEY"])
            }
            ProviderKind::Gemini => {
                let (u, default) = match (base_url, self.var("GOOGLE_GEMINI_BASE_URL")) {
                    (Some(u), _) => (parse_base_url("model profile base_url", u), false),
                    (None, Some(u)) => (parse_base_url("GOOGLE_GEMINI_BASE_URL", u), false),
                    (None, None) => (Ok(DEFAULT_GEMINI_URL.to_owned()), true),
                };
                (u, default, vec!["GOOGLE_API_KEY", "GEMINI_API_KEY"])
            }
            ProviderKind::Bedrock | ProviderKind::BedrockConverse | ProviderKind::VertexAi | ProviderKind::HostedAnthropic(_) | ProviderKind::Ibm => {
                let lookup = |v: &str| self.var(v).map(str::to_owned).or_else(|| (self.env.0)(v).filter(|s| !s.trim().is_empty()));
                return cloud::target(&lookup, provider, model, base_url, key_var);
            }
            ProviderKind::Anthropic => {
                let (u, default) = match (base_url, self.var("ANTHROPIC_BASE_URL")) {
                    (Some(u), _) => (parse_base_url("model profile base_url", u), false),
                    (None, Some(u)) => (parse_base_url("ANTHROPIC_BASE_URL", u), false),
                    (None, None) => (Ok(DEFAULT_ANTHROPIC_URL.to_owned()), true),
                };
                (u, default, vec!["ANTHROPIC_API_KEY"])
            }
            ProviderKind::Compat(c) => {
                let (u, default) = self.compat_base_url(c, &model, base_url)?;
                (Ok(u), default, crate::llm::providers::compat::endpoint(c).key_vars.to_vec())
            }
            ProviderKind::Cohere => {
                // langchain-cohere's COHERE_API_KEY, the cohere SDK's CO_API_KEY and CO_API_URL.
                let (u, default) = match (base_url, self.var("CO_API_URL")) {
                    (Some(u), _) => (parse_base_url("model profile base_url", u), false),
                    (None, Some(u)) => (parse_base_url("CO_API_URL", u), false),
                    (None, None) => (Ok(crate::llm::providers::cohere::DEFAULT_URL.to_owned()), true),
                };
                (u, default, vec!["COHERE_API_KEY", "CO_API_KEY"])
            }
        };
        let base_url = url?;
        let key_vars: Vec<String> = match key_var {
            Some(v) => vec![v.to_owned()],
            None => key_vars.into_iter().map(str::to_owned).collect(),
        };
        // A profile may name any variable for its key: read it through the same lookup.
        let lookup = |v: &str| self.var(v).map(str::to_owned).or_else(|| (self.env.0)(v).filter(|s| !s.trim().is_empty()));
        let found = key_vars.iter().find_map(|v| lookup(v).map(|k| (v.clone(), k.trim().to_owned())));
        if let Some((var, key)) = &found {
            check_key(var, key)?;
        }
        // The hosted APIs need a key; a custom base URL (a proxy, an OpenAI-compatible server) may not.
        if found.is_none() && provider == ProviderKind::Compat(Compat::MantleOpenAi) && key_var.is_none() {
            // ChatOpenAIMantle without a Bedrock API key: short-term ones made from the AWS keys.
            return self.mantle_with_aws_keys(model, base_url, &lookup);
        }
        if found.is_none() && default_url && provider != ProviderKind::Ollama {
            return Err(err(&key_vars.join(" or "), format!("is required for provider {} (model `{model}`) and is not set", provider.key())));
        }
        let api_version = match (provider, self.var("GEMINI_API_VERSION")) {
            (ProviderKind::Compat(Compat::AzureOpenAi), _) => self.azure_api_version(&model)?,
            (_, None) => DEFAULT_GEMINI_VERSION.to_owned(),
            (_, Some(v)) if v.chars().all(|c| c.is_ascii_alphanumeric()) => v.trim().to_owned(),
            (_, Some(v)) => return Err(err("GEMINI_API_VERSION", format!("`{v}` is not an API version such as v1beta or v1"))),
        };
        Ok(ProviderTarget {
            provider,
            model,
            base_url,
            api_key_var: found.as_ref().map(|(v, _)| v.clone()),
            api_key: found.map(|(_, k)| ApiKey::new(k)),
            api_version,
            cloud: None,
        })
    }

    /// The resolved settings for `fabric doctor`: each known variable's effective value (keys
    /// redacted, URLs without credentials or query values) and where it came from.
    pub fn describe(&self) -> Vec<(String, String, String)> {
        VARIABLES
            .iter()
            .filter_map(|v| {
                let value = self.raw.0.get(*v)?;
                let shown = if v.ends_with("_KEY") || v.ends_with("_TOKEN") || v.ends_with("_SECRET") || cloud::SECRETS.contains(v) {
                    "<redacted>".to_owned()
                } else if v.ends_with("_URL")
                    || v.ends_with("_BASE")
                    || v.ends_with("_ENDPOINT")
                    || *v == "OLLAMA_HOST"
                    || *v == "LANGSMITH_GATEWAY"
                    || *v == "WATSONX_URL"
                {
                    crate::redact::redact_url(value)
                } else {
                    value.clone()
                };
                Some((v.to_string(), shown, self.origins.get(*v).cloned().unwrap_or_default()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_of_100y_is_taken_as_its_bound_says() {
        let y100 = parse_retention("FABRIC_RUN_RETENTION", Some("100y")).unwrap().unwrap();
        assert_eq!(y100, Duration::from_secs(100 * 31_557_600), "humantime's year: 365.25 days");
        assert!(parse_retention("FABRIC_RUN_RETENTION", Some("36500d")).unwrap().is_some());
        let e = parse_retention("FABRIC_RUN_RETENTION", Some("101y")).unwrap_err();
        assert!(e.message.contains("from 1s to 100y"), "{e}");
        assert!(parse_retention("FABRIC_RUN_RETENTION", Some("0s")).is_err());
    }

    fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::load(move |k| map.get(k).cloned())
    }

    #[test]
    fn flags_and_bad_values() {
        for v in ["1", "TRUE", "Yes", "on"] {
            assert_eq!(parse_flag("X", Some(v)), Ok(true));
        }
        for v in ["0", "false", "NO", "off", ""] {
            assert_eq!(parse_flag("X", Some(v)), Ok(false));
        }
        assert!(parse_flag("FABRIC_LLM_STUB", Some("maybe")).unwrap_err().to_string().starts_with("FABRIC_LLM_STUB:"));
        assert_eq!(load(&[("FABRIC_LLM_STUB", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "fast")]).unwrap_err().var, "FABRIC_LLM_STUB_LATENCY_MS");
        for (var, value) in [
            ("FABRIC_LLM_RETRY_MAX", "0"),
            ("FABRIC_LLM_RETRY_MAX", "x"),
            ("FABRIC_LLM_RETRY_BASE_S", "-1"),
            ("FABRIC_LLM_RETRY_MAX_BACKOFF_S", "0"),
            ("FABRIC_LLM_RETRY_BASE_S", "NaN"),
            ("FABRIC_TOOL_TIMEOUT_MS", "0"),
            ("FABRIC_TOOL_TIMEOUT_MS", "600001"),
            ("FABRIC_TOOL_TIMEOUT_MS", "1s"),
            ("FABRIC_LLM_STREAM_IDLE_S", "0"),
            ("FABRIC_LLM_STREAM_IDLE_S", "soon"),
        ] {
            assert_eq!(load(&[("FABRIC_LLM_STUB", "1"), (var, value)]).unwrap_err().var, var, "{var}={value}");
        }
    }

    #[test]
    fn the_stream_idle_timeout_defaults_to_two_minutes() {
        assert_eq!(load(&[("FABRIC_LLM_STUB", "1")]).unwrap().stream_idle, Duration::from_secs(120));
        assert_eq!(load(&[("FABRIC_LLM_STUB", "1"), ("FABRIC_LLM_STREAM_IDLE_S", "2.5")]).unwrap().reply_limits().stream_idle, Duration::from_millis(2500));
    }

    #[test]
    fn the_in_process_tool_timeout_defaults_to_that_of_http_tools() {
        assert_eq!(load(&[("FABRIC_LLM_STUB", "1")]).unwrap().tool_timeout, Duration::from_millis(DEFAULT_TOOL_TIMEOUT_MS));
        assert_eq!(load(&[("FABRIC_LLM_STUB", "1"), ("FABRIC_TOOL_TIMEOUT_MS", " 250 ")]).unwrap().tool_timeout, Duration::from_millis(250));
    }

    #[test]
    fn model_precedence_and_bare_names() {
        let s = load(&[("OLLAMA_MODEL", "qwen3:8b"), ("FABRIC_LLM_MODEL", "openai:gpt-4o")]).unwrap();
        let t = s.target.unwrap();
        assert_eq!((t.provider, t.model.as_str(), t.base_url.as_str()), (ProviderKind::Ollama, "qwen3:8b", DEFAULT_OLLAMA_URL));
        let s = load(&[]).unwrap();
        assert_eq!(s.target.unwrap().model, "qwen3:14b");
        // Mistral is served (issue #30): the model name infers it, its key is required.
        let e = load(&[("FABRIC_LLM_MODEL", "mistral-large")]).unwrap_err();
        assert_eq!(e.to_string(), "MISTRAL_API_KEY: is required for provider mistralai (model `mistral-large`) and is not set");
        // So is every other key of LangChain's (IBM watsonx.ai the last), its settings named.
        let e = load(&[("FABRIC_LLM_MODEL", "ibm:granite")]).unwrap_err();
        assert!(e.to_string().starts_with("WATSONX_URL: is required for provider ibm (model `granite`)"), "{e}");
        let e = load(&[("FABRIC_LLM_MODEL", "qwen3:14b")]).unwrap_err();
        assert!(e.message.contains("cannot tell the provider"), "{e}");
    }

    #[test]
    fn missing_keys_fail_naming_the_variable_and_keys_never_show() {
        let e = load(&[("FABRIC_LLM_MODEL", "openai:gpt-4o-mini")]).unwrap_err();
        assert_eq!(e.var, "OPENAI_API_KEY");
        let e = load(&[("FABRIC_LLM_MODEL", "google_genai:gemini-2.5-flash")]).unwrap_err();
        assert_eq!(e.var, "GOOGLE_API_KEY or GEMINI_API_KEY");
        let s = load(&[("FABRIC_LLM_MODEL", "anthropic:claude-sonnet-4-5"), ("ANTHROPIC_API_KEY", "sk-secret-123")]).unwrap();
        assert!(!format!("{s:?}").contains("sk-secret-123"));
        assert!(!format!("{:?}", s.describe()).contains("sk-secret-123"));
        // A custom base URL (an OpenAI-compatible server) does not need a key.
        let s = load(&[("FABRIC_LLM_MODEL", "openai:tiny"), ("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/")]).unwrap();
        assert_eq!(s.target.unwrap().base_url, "http://127.0.0.1:8080/v1");
    }

    #[test]
    fn ollama_host_like_the_client() {
        for (host, want) in [
            ("", "http://127.0.0.1:11434"),
            ("1.2.3.4", "http://1.2.3.4:11434"),
            (":56789", "http://127.0.0.1:56789"),
            ("http://1.2.3.4", "http://1.2.3.4:80"),
            ("https://example.com", "https://example.com:443"),
            ("example.com/path/", "http://example.com:11434/path"),
            ("0.0.0.0:9999", "http://0.0.0.0:9999"),
        ] {
            assert_eq!(parse_ollama_host(host).unwrap(), want, "{host}");
        }
        let s = load(&[("OLLAMA_HOST", "10.0.0.5:1234"), ("OLLAMA_BASE_URL", "http://ollama:11434")]).unwrap();
        assert_eq!(s.target.unwrap().base_url, "http://ollama:11434", "OLLAMA_BASE_URL wins");
    }
}
