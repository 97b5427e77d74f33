//! Real providers: one HTTP executor ([`HttpBackend`]) around per-provider codecs.
//!
//! A codec only translates: our request → the provider's URL, headers and JSON body; the
//! provider's reply → raw text and token usage. Wire types never leave their module. The
//! executor owns the shared reqwest client, the call timeout, and the mapping of transport and
//! HTTP failures to [`ReasonClass`]es (which decides what `RetryLlm` retries).

pub mod anthropic;
pub mod gemini;
pub mod ollama;
pub mod openai;

use std::time::Duration;

use serde_json::Value;

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass, Usage, finish_reply};
use crate::catalogue::defs::OutputSpec;
use crate::config::{ProviderKind, ProviderTarget, Tuning};

/// What a codec needs to build one call.
#[derive(Debug)]
pub struct CallSpec<'a> {
    pub target: &'a ProviderTarget,
    pub tuning: Tuning,
    pub system: &'a str,
    pub user: &'a str,
    /// The schema to ask for natively, if any.
    pub schema: Option<WireSchema<'a>>,
    /// A name for the schema (OpenAI `json_schema.name`, the Anthropic tool): `[A-Za-z0-9_-]{1,64}`.
    pub schema_name: String,
}

/// A schema as a codec sends it.
#[derive(Debug, Clone, Copy)]
pub struct WireSchema<'a> {
    pub json: &'a Value,
    /// Every property is required (OpenAI strict mode is possible).
    pub all_required: bool,
}

impl<'a> WireSchema<'a> {
    fn of(output: &'a OutputSpec) -> Option<WireSchema<'a>> {
        match output {
            OutputSpec::Bindable(s) => Some(WireSchema { json: s.source(), all_required: s.fields().iter().all(|f| f.required) }),
            // The decision's `arguments` is a free-form object, which strict modes reject.
            OutputSpec::Decision(d) => Some(WireSchema { json: &d.schema, all_required: false }),
            OutputSpec::Text | OutputSpec::Unbindable { .. } => None,
        }
    }
}

/// An HTTP request as a codec describes it.
#[derive(Debug)]
pub struct WireRequest {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Value,
}

/// A provider's translation layer; its wire types stay inside its module.
pub trait Codec: Send + Sync + 'static {
    fn kind(&self) -> ProviderKind;
    fn encode(&self, call: &CallSpec<'_>) -> WireRequest;
    /// Reads a 2xx body: the reply text (for structured calls, the JSON text) and usage.
    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, Option<Usage>), LlmError>;
    /// The provider's own error message in an error body, when it has one.
    fn error_message(&self, body: &[u8]) -> Option<String>;
}

/// One chat message of the chat-style APIs (Ollama, OpenAI).
#[derive(Debug, serde::Serialize)]
pub(crate) struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

/// `Authorization: Bearer <key>` when the target has a key (Ollama, OpenAI-compatible).
pub(crate) fn bearer_headers(call: &CallSpec<'_>) -> Vec<(&'static str, String)> {
    call.target.api_key.iter().map(|key| ("authorization", format!("Bearer {}", key.expose()))).collect()
}

/// `{"error": {"message": ...}}`: the error body shape OpenAI, Gemini and Anthropic share.
#[derive(serde::Deserialize)]
struct NestedErrorBody {
    error: NestedErrorDetail,
}

#[derive(serde::Deserialize)]
struct NestedErrorDetail {
    message: String,
}

/// The message of a `{"error": {"message": ...}}` body.
pub(crate) fn nested_error_message(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<NestedErrorBody>(body).ok().map(|b| b.error.message)
}

/// Reads a provider's reply body into its wire type; a mismatch is a `provider_error` that says
/// what was missing or wrong.
pub(crate) fn parse_reply<T: serde::de::DeserializeOwned>(kind: ProviderKind, body: &[u8]) -> Result<T, LlmError> {
    serde_json::from_slice(body).map_err(|e| LlmError::new(ReasonClass::ProviderError, format!("{} reply is not what its API documents: {e}", kind.key())))
}

/// A provider backend: a codec, a target and the shared client.
#[derive(Debug)]
pub struct HttpBackend<C> {
    client: reqwest::Client,
    codec: C,
    target: ProviderTarget,
    tuning: Tuning,
    timeout: Duration,
}

impl<C: Codec> HttpBackend<C> {
    pub fn new(client: reqwest::Client, codec: C, target: ProviderTarget, tuning: Tuning) -> HttpBackend<C> {
        HttpBackend { client, codec, target, tuning, timeout: super::CALL_TIMEOUT }
    }

    /// Overrides the per-attempt timeout (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> HttpBackend<C> {
        self.timeout = timeout;
        self
    }
}

/// The client every backend shares: pooled, rustls.
pub fn shared_client() -> reqwest::Client {
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(90)).build().unwrap_or_default()
}

fn schema_name(stage_id: &str) -> String {
    let mut name: String = stage_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).take(64).collect();
    if name.is_empty() {
        name.push_str("output");
    }
    name
}

/// Reads `retry-after-ms` or `retry-after` (seconds).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).and_then(|s| s.trim().parse::<f64>().ok()).filter(|f| f.is_finite() && *f >= 0.0);
    get("retry-after-ms").map(|ms| Duration::from_secs_f64(ms / 1000.0)).or_else(|| get("retry-after").map(Duration::from_secs_f64))
}

/// The reason class of an HTTP error status.
pub fn status_class(status: u16) -> ReasonClass {
    match status {
        429 => ReasonClass::RateLimited,
        500 | 502 | 503 | 504 => ReasonClass::ServerError,
        // Anthropic's "overloaded"; transient like a 503.
        529 => ReasonClass::ServerError,
        400..=499 => ReasonClass::ClientError,
        _ => ReasonClass::ProviderError,
    }
}

fn transport_error(e: reqwest::Error, timeout: Duration) -> LlmError {
    if e.is_timeout() {
        return LlmError::new(ReasonClass::Timeout, format!("no reply within {} s", timeout.as_secs_f64()));
    }
    let (is_connect, is_request, is_body) = (e.is_connect(), e.is_request(), e.is_body());
    // The URL may carry a key in some deployments; keep it out of messages.
    let e = e.without_url();
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    if is_connect || is_request || is_body { LlmError::new(ReasonClass::Connection, message) } else { LlmError::new(ReasonClass::ProviderError, message) }
}

impl<C: Codec> Llm for HttpBackend<C> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            let schema = WireSchema::of(req.output);
            let call =
                CallSpec { target: &self.target, tuning: self.tuning, system: req.system, user: req.user, schema, schema_name: schema_name(req.stage_id) };
            let wire = self.codec.encode(&call);
            let mut builder = self.client.post(&wire.url).timeout(self.timeout).json(&wire.body);
            for (k, v) in &wire.headers {
                builder = builder.header(*k, v);
            }
            let response = builder.send().await.map_err(|e| transport_error(e, self.timeout))?;
            let status = response.status().as_u16();
            let wait = retry_after(response.headers());
            let bytes = response.bytes().await.map_err(|e| transport_error(e, self.timeout))?;
            if !(200..300).contains(&status) {
                let detail = self.codec.error_message(&bytes).unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
                let mut e = LlmError::new(status_class(status), format!("HTTP {status} from {}: {}", self.codec.kind().key(), detail.trim()));
                e.retry_after = wait;
                return Err(e);
            }
            let (text, usage) = self.codec.decode(&bytes, &call)?;
            finish_reply(req.output, text, usage)
        })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: self.codec.kind().key().to_owned(), model: self.target.model.clone() }
    }
}

/// Builds the backend for a target.
pub fn backend_for(client: reqwest::Client, target: ProviderTarget, tuning: Tuning) -> Box<dyn Llm> {
    match target.provider {
        ProviderKind::Ollama => Box::new(HttpBackend::new(client, ollama::Ollama, target, tuning)),
        ProviderKind::OpenAi => Box::new(HttpBackend::new(client, openai::OpenAi, target, tuning)),
        ProviderKind::Gemini => Box::new(HttpBackend::new(client, gemini::Gemini, target, tuning)),
        ProviderKind::Anthropic => Box::new(HttpBackend::new(client, anthropic::Anthropic, target, tuning)),
    }
}

/// The `[system, user]` message list of the chat-style APIs (Ollama, OpenAI).
pub(crate) fn system_user_messages<'a>(call: &CallSpec<'a>) -> [ChatMessage<'a>; 2] {
    [ChatMessage { role: "system", content: call.system }, ChatMessage { role: "user", content: call.user }]
}

/// Keeps only the keywords in `allowed`, recursively through `properties` and `items`.
pub fn retain_keywords(schema: &Value, allowed: &[&str]) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                if !allowed.contains(&k.as_str()) {
                    continue;
                }
                let v = match k.as_str() {
                    "properties" => match v {
                        Value::Object(props) => Value::Object(props.iter().map(|(name, p)| (name.clone(), retain_keywords(p, allowed))).collect()),
                        other => other.clone(),
                    },
                    "items" => retain_keywords(v, allowed),
                    _ => v.clone(),
                };
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}
