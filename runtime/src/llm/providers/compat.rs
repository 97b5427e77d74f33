//! The OpenAI-compatible family: one row per provider, the defaults of its own LangChain package.
//!
//! Every provider here is served by the OpenAI codec ([`super::openai`]); what differs between
//! them is only what their packages send, as captured by `tests/parity/gen_wire_fixtures.py`
//! (`tests/fixtures/wire/<key>.json`): where the base URL points and what path follows it, the
//! key's variables and header, extra headers and body fields, `max_tokens` or
//! `max_completion_tokens`, and how `with_structured_output` asks for structure by default
//! (most packages force a tool; a few send `response_format: json_schema`). No wire types here:
//! the codec turns a [`Dialect`] into its request.

use crate::vocab::Compat;

/// How the package's `with_structured_output` asks for a schema by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structured {
    /// `response_format: json_schema`, in OpenAI's strict form (every property required, the
    /// optional ones nullable, `additionalProperties: false`): langchain-openai's subclasses.
    StrictSchema,
    /// `response_format: json_schema` with the schema as Pydantic writes it, `strict` sent or not.
    PlainSchema { strict: Option<bool>, closed: bool },
    /// One forced function tool, `tool_choice` naming it (or `"any"`, Mistral's), the reply read
    /// from its call's arguments.
    ForcedTool { choice_any: bool, parallel_false: bool },
}

/// How the key is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    Bearer,
    /// Azure OpenAI's `api-key` header (a Microsoft Entra token goes as a bearer instead).
    ApiKeyHeader,
}

/// The output limit's field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenField {
    MaxTokens,
    MaxCompletionTokens,
}

/// What one provider's package sends, beyond OpenAI's common request.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    /// Appended to the base URL (the deployment's path for Azure OpenAI is built from the model).
    pub path: &'static str,
    pub structured: Structured,
    pub tokens: TokenField,
    pub auth: Auth,
    /// `"stream": false` in the body (litellm sends no `stream` key at all).
    pub stream_field: bool,
    /// `"n": 1` (groq, fireworks).
    pub n: bool,
    /// groq's `service_tier: "on_demand"`.
    pub service_tier: Option<&'static str>,
    /// Mistral's `top_p: 1`.
    pub top_p: bool,
    pub headers: &'static [(&'static str, &'static str)],
    /// Whether the package reads a structured reply as Markdown (its JsonOutputParser's
    /// parse_json_markdown: a fenced reply is read from inside the fence), after removing every
    /// `<think>…</think>` block (langchain-perplexity's ReasoningJsonOutputParser).
    pub reasoning_markdown: bool,
    /// Whether `<think>` blocks go from plain text replies too (the litellm library moves them
    /// into `reasoning_content` before ChatLiteLLM sees the reply).
    pub think_out_of_text: bool,
    /// OpenAI's Responses API (`POST {base}/responses`, [`super::responses`]) instead of Chat
    /// Completions: the packages that set `use_responses_api`.
    pub responses: bool,
}

const BASE: Dialect = Dialect {
    path: "/chat/completions",
    structured: Structured::ForcedTool { choice_any: false, parallel_false: true },
    tokens: TokenField::MaxTokens,
    auth: Auth::Bearer,
    stream_field: true,
    n: false,
    service_tier: None,
    top_p: false,
    headers: &[],
    reasoning_markdown: false,
    think_out_of_text: false,
    responses: false,
};

/// OpenAI itself, the reference the others are written against.
pub const OPENAI: Dialect = Dialect { structured: Structured::StrictSchema, tokens: TokenField::MaxCompletionTokens, ..BASE };

/// Where a provider's endpoint is, as its package finds it.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    /// The variables its package (or its SDK) reads for the base URL, in its order; the runtime's
    /// `FABRIC_LLM_BASE_URL` is read after them.
    pub base_url_vars: &'static [&'static str],
    /// `None`: there is no public endpoint, the base URL must be set (a proxy, a resource).
    pub default_base_url: Option<&'static str>,
    pub key_vars: &'static [&'static str],
}

pub fn dialect(c: Compat) -> Dialect {
    match c {
        // langchain-deepseek, -xai, -together, -baseten: ChatOpenAI subclasses that force a tool.
        Compat::DeepSeek | Compat::Xai | Compat::Together | Compat::Baseten => BASE,
        // langchain-groq: its own SDK, with /openai/v1 after the host, `n`, and the service tier.
        Compat::Groq => Dialect {
            path: "/openai/v1/chat/completions",
            structured: Structured::ForcedTool { choice_any: false, parallel_false: false },
            n: true,
            service_tier: Some("on_demand"),
            ..BASE
        },
        // langchain-fireworks: the fireworks SDK, /v1/chat/completions after the base.
        Compat::Fireworks => {
            Dialect { path: "/v1/chat/completions", structured: Structured::ForcedTool { choice_any: false, parallel_false: false }, n: true, ..BASE }
        }
        // langchain-openrouter: the openrouter SDK, with the app attribution headers.
        Compat::OpenRouter => Dialect {
            structured: Structured::ForcedTool { choice_any: false, parallel_false: false },
            headers: &[("http-referer", "https://docs.langchain.com"), ("x-title", "LangChain")],
            ..BASE
        },
        Compat::Upstage => {
            Dialect { structured: Structured::ForcedTool { choice_any: false, parallel_false: false }, headers: &[("x-upstage-client", "langchain")], ..BASE }
        }
        Compat::Perplexity => Dialect { structured: Structured::PlainSchema { strict: None, closed: false }, reasoning_markdown: true, ..BASE },
        Compat::Nvidia => Dialect { structured: Structured::PlainSchema { strict: Some(true), closed: false }, reasoning_markdown: true, ..BASE },
        Compat::LiteLlm => Dialect {
            structured: Structured::PlainSchema { strict: Some(true), closed: true },
            stream_field: false,
            reasoning_markdown: true,
            think_out_of_text: true,
            ..BASE
        },
        Compat::AzureAi => OPENAI,
        Compat::AzureOpenAi => Dialect { auth: Auth::ApiKeyHeader, ..OPENAI },
        Compat::Mistral => Dialect { structured: Structured::ForcedTool { choice_any: true, parallel_false: false }, top_p: true, ..BASE },
        // Hugging Face's router speaks OpenAI's Chat Completions; ChatHuggingFace itself never
        // calls it (docs/providers.md): OpenAI's own request, with `max_tokens`, which every
        // provider behind the router reads.
        Compat::HuggingFace => Dialect { tokens: TokenField::MaxTokens, ..OPENAI },
        // ChatOpenAIMantle: ChatOpenAI's request (json_schema, max_completion_tokens); OpenAI's
        // GPT models there go to the Responses API (`mantle_responses`).
        Compat::MantleOpenAi => OPENAI,
        // ChatMetaModel and the LangSmith gateway: ChatOpenAI on the Responses API.
        Compat::Meta | Compat::LangSmith => Dialect { responses: true, ..OPENAI },
    }
}

/// ChatOpenAIMantle sends OpenAI's GPT models (not the open-weight `openai.gpt-oss-…`) to the
/// Responses API under `/openai/v1`.
pub fn mantle_responses(model: &str) -> bool {
    model.starts_with("openai.gpt-") && !model.starts_with("openai.gpt-oss")
}

pub fn endpoint(c: Compat) -> Endpoint {
    let (base_url_vars, default_base_url, key_vars): (&'static [&'static str], Option<&'static str>, &'static [&'static str]) = match c {
        Compat::DeepSeek => (&["DEEPSEEK_API_BASE"], Some("https://api.deepseek.com/v1"), &["DEEPSEEK_API_KEY"]),
        // GROQ_API_BASE is langchain-groq's, GROQ_BASE_URL the groq SDK's.
        Compat::Groq => (&["GROQ_API_BASE", "GROQ_BASE_URL"], Some("https://api.groq.com"), &["GROQ_API_KEY"]),
        Compat::Xai => (&["XAI_API_BASE"], Some("https://api.x.ai/v1"), &["XAI_API_KEY"]),
        Compat::Fireworks => (&["FIREWORKS_API_BASE", "FIREWORKS_BASE_URL"], Some("https://api.fireworks.ai/inference"), &["FIREWORKS_API_KEY"]),
        Compat::Together => (&["TOGETHER_API_BASE"], Some("https://api.together.xyz/v1"), &["TOGETHER_API_KEY"]),
        Compat::OpenRouter => (&["OPENROUTER_API_BASE"], Some("https://openrouter.ai/api/v1"), &["OPENROUTER_API_KEY"]),
        Compat::Perplexity => (&["PERPLEXITY_BASE_URL"], Some("https://api.perplexity.ai"), &["PPLX_API_KEY", "PERPLEXITY_API_KEY"]),
        Compat::Nvidia => (&["NVIDIA_BASE_URL"], Some("https://integrate.api.nvidia.com/v1"), &["NVIDIA_API_KEY"]),
        Compat::Upstage => (&["UPSTAGE_API_BASE"], Some("https://api.upstage.ai/v1/solar"), &["UPSTAGE_API_KEY"]),
        Compat::Baseten => (&["BASETEN_BASE_URL", "BASETEN_API_BASE"], Some("https://inference.baseten.co/v1"), &["BASETEN_API_KEY"]),
        // A LiteLLM proxy has no public address; its key is the proxy's.
        Compat::LiteLlm => (&["LITELLM_PROXY_API_BASE"], None, &["LITELLM_PROXY_API_KEY", "LITELLM_API_KEY"]),
        // Foundry: AZURE_AI_OPENAI_ENDPOINT verbatim (…/openai/v1); AZURE_OPENAI_ENDPOINT gets
        // /openai/v1 appended (config does that).
        Compat::AzureAi => (&["AZURE_AI_OPENAI_ENDPOINT", "AZURE_OPENAI_ENDPOINT"], None, &["AZURE_AI_API_KEY"]),
        Compat::AzureOpenAi => (&["AZURE_OPENAI_ENDPOINT"], None, &["AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN"]),
        Compat::Mistral => (&["MISTRAL_BASE_URL"], Some("https://api.mistral.ai/v1"), &["MISTRAL_API_KEY"]),
        // huggingface_hub's token variables, HF_TOKEN first.
        Compat::HuggingFace => (&[], Some("https://router.huggingface.co/v1"), &["HF_TOKEN", "HUGGINGFACEHUB_API_TOKEN"]),
        // The endpoint is per region (config builds it from AWS_REGION); the Bedrock API key.
        Compat::MantleOpenAi => (&[], None, &["AWS_BEARER_TOKEN_BEDROCK"]),
        Compat::Meta => (&["MODEL_API_BASE"], Some("https://api.meta.ai/v1"), &["MODEL_API_KEY"]),
        // LANGSMITH_GATEWAY (a host, or `true` for LangChain's) is read by config.
        Compat::LangSmith => (&[], Some("https://gateway.smith.langchain.com/v1"), &["LANGSMITH_GATEWAY_API_KEY", "LANGSMITH_API_KEY"]),
    };
    Endpoint { base_url_vars, default_base_url, key_vars }
}
