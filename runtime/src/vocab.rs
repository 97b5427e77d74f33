//! The vocabulary the catalogue and the model port share, so that neither imports the other:
//! what a call must return ([`OutputSpec`]), the providers with a backend ([`ProviderKind`]),
//! model strings read as LangChain reads them, base URLs, the fixed parity constants of every
//! model call, the tool limits, and [`ConfigError`] (what a bad setting or profile value says).
//!
//! A leaf: it imports only other leaves ([`crate::structured`], [`crate::decision`],
//! [`crate::redact`]).

use std::sync::Arc;
use std::time::Duration;

use crate::structured::FlatSchema;

/// Sampling temperature of every model call (fixed, as in the Python runtime).
pub const TEMPERATURE: f64 = 0.1;
/// Output token limit of every model call (fixed).
pub const MAX_OUTPUT_TOKENS: u32 = 4096;
/// Time limit of one model-call attempt (fixed).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a tool call may take by default: an HTTP tool's `invoke.timeout_ms` and an
/// in-process tool's `FABRIC_TOOL_TIMEOUT_MS` alike, since the decision loop treats both kinds
/// of tool alike.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 10_000;
/// The longest tool timeout accepted, of either kind.
pub const MAX_TOOL_TIMEOUT_MS: u64 = 600_000;

/// A value that cannot be used: the variable (or model-profile field) it came from and what is
/// wrong with it. Configuration ([`crate::config`]) and the catalogue loader both report it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: String,
    pub message: String,
}

/// A [`ConfigError`] for `var`.
pub(crate) fn err(var: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { var: var.to_owned(), message: message.into() }
}

/// What a model-calling stage makes of its capability's `output_schema`.
#[derive(Debug, Clone)]
pub enum OutputSpec {
    /// No schema: a plain text call.
    Text,
    /// A flat schema: native structured output, validated with parity.
    Bindable(Arc<FlatSchema>),
    /// A schema that cannot be bound (nested, empty ...): a plain text call, warned at load.
    Unbindable { why: String },
    /// The decision loop's decision node: an `AgentDecision` over the route's tools.
    Decision(Arc<crate::decision::DecisionSpec>),
}

impl OutputSpec {
    /// What a stage makes of a capability's `output_schema`: native structured output when the
    /// schema is bindable, a plain text call otherwise (`fabric validate` takes the same path).
    pub fn from_schema(schema: &serde_json::Value) -> OutputSpec {
        match FlatSchema::from_json(schema) {
            Ok(flat) => OutputSpec::Bindable(Arc::new(flat)),
            Err(why) => OutputSpec::Unbindable { why: why.to_string() },
        }
    }
}

/// The providers with a backend. Others parse (as LangChain would) but are refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Ollama,
    OpenAi,
    Gemini,
    Anthropic,
    // Cloud providers (issue 30, parts 3 and 4).
    /// `bedrock:`, which LangChain serves with `ChatBedrock`; here through the Converse API.
    Bedrock,
    /// `bedrock_converse:` (`ChatBedrockConverse`).
    BedrockConverse,
    /// `google_vertexai:` (`ChatVertexAI`): Gemini on Vertex AI.
    VertexAi,
    /// A provider served by the OpenAI codec with its own package's defaults (issue #30).
    Compat(Compat),
    /// Cohere's v2 chat API.
    Cohere,
    /// Claude through a cloud's own endpoint, in Anthropic's Messages shape (the anthropic SDK's
    /// cloud clients, as LangChain's packages build them).
    HostedAnthropic(AnthropicHost),
    /// `ibm:` (langchain-ibm `ChatWatsonx`): IBM watsonx.ai's chat API with an IAM token.
    Ibm,
}

/// Where a [`ProviderKind::HostedAnthropic`] model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnthropicHost {
    /// `anthropic_bedrock:` (langchain-aws `ChatAnthropicBedrock`): Bedrock's InvokeModel.
    Bedrock,
    /// `bedrock_mantle_anthropic:` (langchain-aws `ChatAnthropicMantle`): Bedrock's Mantle endpoint.
    Mantle,
    /// `google_anthropic_vertex:` (langchain-google-vertexai `ChatAnthropicVertex`): Vertex AI's rawPredict.
    Vertex,
}

impl AnthropicHost {
    pub const ALL: [AnthropicHost; 3] = [AnthropicHost::Bedrock, AnthropicHost::Mantle, AnthropicHost::Vertex];

    pub fn key(self) -> &'static str {
        match self {
            AnthropicHost::Bedrock => "anthropic_bedrock",
            AnthropicHost::Mantle => "bedrock_mantle_anthropic",
            AnthropicHost::Vertex => "google_anthropic_vertex",
        }
    }
}

impl ProviderKind {
    pub fn key(self) -> &'static str {
        match self {
            ProviderKind::Ollama => "ollama",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Gemini => "google_genai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Bedrock => "bedrock",
            ProviderKind::BedrockConverse => "bedrock_converse",
            ProviderKind::VertexAi => "google_vertexai",
            ProviderKind::Compat(c) => c.key(),
            ProviderKind::Cohere => "cohere",
            ProviderKind::HostedAnthropic(h) => h.key(),
            ProviderKind::Ibm => "ibm",
        }
    }

    pub fn from_key(key: &str) -> Option<ProviderKind> {
        match key {
            "ollama" => Some(ProviderKind::Ollama),
            "openai" => Some(ProviderKind::OpenAi),
            "google_genai" => Some(ProviderKind::Gemini),
            "anthropic" => Some(ProviderKind::Anthropic),
            "bedrock" => Some(ProviderKind::Bedrock),
            "bedrock_converse" => Some(ProviderKind::BedrockConverse),
            "google_vertexai" => Some(ProviderKind::VertexAi),
            "cohere" => Some(ProviderKind::Cohere),
            "ibm" => Some(ProviderKind::Ibm),
            other => Compat::ALL
                .iter()
                .find(|c| c.key() == other)
                .map(|c| ProviderKind::Compat(*c))
                .or_else(|| AnthropicHost::ALL.iter().find(|h| h.key() == other).map(|h| ProviderKind::HostedAnthropic(*h))),
        }
    }

    /// The OpenTelemetry `gen_ai.provider.name` value.
    pub fn otel_name(self) -> &'static str {
        match self {
            ProviderKind::Ollama => "ollama",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Gemini => "gcp.gemini",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Bedrock | ProviderKind::BedrockConverse => "aws.bedrock",
            ProviderKind::VertexAi => "gcp.vertex_ai",
            ProviderKind::Compat(c) => c.otel_name(),
            ProviderKind::Cohere => "cohere",
            ProviderKind::HostedAnthropic(AnthropicHost::Vertex) => "gcp.vertex_ai",
            ProviderKind::HostedAnthropic(_) => "aws.bedrock",
            ProviderKind::Ibm => "ibm.watsonx.ai",
        }
    }
}

/// The providers whose LangChain package speaks OpenAI's Chat Completions (or, for Mistral, its
/// near-copy), each with that package's own defaults (`crate::llm::providers::compat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compat {
    DeepSeek,
    Groq,
    Xai,
    Fireworks,
    Together,
    OpenRouter,
    Perplexity,
    Nvidia,
    Upstage,
    Baseten,
    LiteLlm,
    AzureAi,
    AzureOpenAi,
    Mistral,
    /// Hugging Face's OpenAI-compatible router.
    HuggingFace,
    /// Bedrock's OpenAI-compatible Mantle endpoint (langchain-aws `ChatOpenAIMantle`).
    MantleOpenAi,
    /// Meta's Model API (langchain-meta `ChatMetaModel`), on OpenAI's Responses API.
    Meta,
    /// The LangSmith LLM gateway (`ChatOpenAI` on the Responses API).
    LangSmith,
}

impl Compat {
    pub const ALL: [Compat; 18] = [
        Compat::DeepSeek,
        Compat::Groq,
        Compat::Xai,
        Compat::Fireworks,
        Compat::Together,
        Compat::OpenRouter,
        Compat::Perplexity,
        Compat::Nvidia,
        Compat::Upstage,
        Compat::Baseten,
        Compat::LiteLlm,
        Compat::AzureAi,
        Compat::AzureOpenAi,
        Compat::Mistral,
        Compat::HuggingFace,
        Compat::MantleOpenAi,
        Compat::Meta,
        Compat::LangSmith,
    ];

    /// The `init_chat_model` key.
    pub fn key(self) -> &'static str {
        match self {
            Compat::DeepSeek => "deepseek",
            Compat::Groq => "groq",
            Compat::Xai => "xai",
            Compat::Fireworks => "fireworks",
            Compat::Together => "together",
            Compat::OpenRouter => "openrouter",
            Compat::Perplexity => "perplexity",
            Compat::Nvidia => "nvidia",
            Compat::Upstage => "upstage",
            Compat::Baseten => "baseten",
            Compat::LiteLlm => "litellm",
            Compat::AzureAi => "azure_ai",
            Compat::AzureOpenAi => "azure_openai",
            Compat::Mistral => "mistralai",
            Compat::HuggingFace => "huggingface",
            Compat::MantleOpenAi => "bedrock_mantle_openai",
            Compat::Meta => "meta",
            Compat::LangSmith => "langsmith",
        }
    }

    /// `gen_ai.provider.name`: the OTel GenAI registry's value where it lists the provider
    /// (`deepseek`, `groq`, `x_ai`, `perplexity`, `azure.ai.openai`, `azure.ai.inference`,
    /// `mistral_ai`), else the LangChain key, as the convention asks for a provider it does not list.
    pub fn otel_name(self) -> &'static str {
        match self {
            Compat::Xai => "x_ai",
            Compat::AzureAi => "azure.ai.inference",
            Compat::AzureOpenAi => "azure.ai.openai",
            Compat::Mistral => "mistral_ai",
            Compat::MantleOpenAi => "aws.bedrock",
            other => other.key(),
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
    // Every key of LANGCHAIN_PROVIDERS has a backend; a key LangChain adds later parses (as there)
    // and is refused here by name.
    let kind = ProviderKind::from_key(&provider).ok_or_else(|| {
        err(
            var,
            format!("provider `{provider}` (from `{value}`) is not supported: no backend for it in this runtime; see docs/providers.md for the supported keys"),
        )
    })?;
    Ok(ModelChoice { provider: kind, model })
}

/// A provider-facing URL from configuration: absolute http(s), stored without a trailing `/`.
pub fn parse_base_url(var: &str, value: &str) -> Result<String, ConfigError> {
    let v = value.trim().trim_end_matches('/');
    match reqwest::Url::parse(v) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(v.to_owned()),
        _ => Err(err(var, format!("`{}` is not an http(s) URL", crate::redact::redact_url(value)))),
    }
}
