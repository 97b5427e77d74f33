//! Real providers: one HTTP executor ([`HttpBackend`]) around per-provider codecs.
//!
//! A codec only translates: our request → the provider's URL, headers and JSON body; the
//! provider's reply → raw text and token usage. Wire types never leave their module. The
//! executor owns the shared reqwest client, the call timeout, and the mapping of transport and
//! HTTP failures to [`ReasonClass`]es (which decides what `RetryLlm` retries).

pub mod anthropic;
pub mod cohere;
pub mod compat;
pub mod gemini;
pub mod limits;
pub mod ollama;
pub mod openai;
pub mod responses;
pub mod stream_anthropic;
pub mod stream_gemini;
mod stream_json;
pub mod stream_ollama;
pub mod stream_openai;
pub mod streaming;
pub use streaming::ReplyLimits;
// Cloud providers (issue 30, parts 3 and 4).
pub mod anthropic_hosted;
pub mod bedrock;
pub mod gcp_token;
pub mod sigv4;
pub mod vertex;
pub mod watsonx;

use std::time::Duration;

use serde_json::Value;

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass, ReplyMeta, Wait, finish_reply};
use crate::failure::ClientError;
use crate::llm::OutputSpec;
use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};

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
    /// A flat stage schema, which OpenAI's strict mode can take (its optional properties sent as
    /// nullable); not the decision, whose `arguments` is a free-form object strict mode refuses.
    pub strict: bool,
}

impl<'a> WireSchema<'a> {
    fn of(output: &'a OutputSpec) -> Option<WireSchema<'a>> {
        match output {
            OutputSpec::Bindable(s) => Some(WireSchema { json: s.source(), strict: true }),
            // The decision's `arguments` is a free-form object, which strict modes reject.
            OutputSpec::Decision(d) => Some(WireSchema { json: d.schema(), strict: false }),
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
    /// Reads a 2xx body: the reply text (for structured calls, the JSON text) and what the reply
    /// says about itself (usage, finish reason, model, id).
    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError>;
    /// The provider's machine-readable error code in an error body (`invalid_api_key`,
    /// `RESOURCE_EXHAUSTED`, `overloaded_error` ...), when it has one. Never its message: a
    /// provider's error text may quote a key or the prompt, and it goes nowhere.
    fn error_code(&self, body: &[u8]) -> Option<String>;
    /// The error code a provider sends in a header instead (Bedrock's `x-amzn-ErrorType`).
    fn header_error_code(&self, _headers: &reqwest::header::HeaderMap) -> Option<String> {
        None
    }
    /// Its streaming half, when the provider streams here ([`streaming`]).
    fn streaming(&self) -> Option<&dyn streaming::StreamCodec> {
        None
    }
}

/// The headers an [`Auth`] adds to one request, or why it cannot.
pub type AuthHeaders = Result<Vec<(&'static str, String)>, LlmError>;

/// Credentials a request gets once its body is final: a signature over it (Bedrock's SigV4) or
/// an access token fetched and cached (Vertex AI). The key-in-a-header providers need none: their
/// codec adds the key.
pub trait Auth: Send + Sync + std::fmt::Debug + 'static {
    /// The headers for `POST url` with `body`.
    fn headers<'a>(&'a self, client: &'a reqwest::Client, url: &'a str, body: &'a [u8]) -> BoxFuture<'a, AuthHeaders>;
    /// The provider refused the credential (HTTP 401): forget a cached one. True when one was
    /// forgotten, so that sending once more with a fresh one makes sense.
    fn refused(&self) -> bool {
        false
    }
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

/// The code of a `{"error": {"code" | "type" | "status": ...}}` body (OpenAI, Gemini and
/// Anthropic share the shape): the first of them that is a short identifier.
pub(crate) fn nested_error_code(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    ["code", "type", "status"].iter().filter_map(|k| e.get(*k)?.as_str()).find(|c| is_code(c)).map(str::to_owned)
}

/// A short identifier: what an error code looks like, and nothing a secret or a prompt is.
fn is_code(text: &str) -> bool {
    (1..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
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
    server: Option<(String, u16)>,
    timeout: Duration,
    max_reply_bytes: usize,
    /// The longest a streaming reply may send nothing.
    stream_idle: Duration,
    /// Request signing or a token source (cloud providers).
    auth: Option<Box<dyn Auth>>,
}

/// The default cap on one reply body (`FABRIC_LLM_MAX_REPLY_BYTES`): a 4,096-token answer is a
/// few tens of kilobytes, so 8 MiB leaves room for verbose envelopes and reasoning parts while
/// keeping a runaway or hostile reply from taking the process's memory.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// A `Retry-After` longer than this is read as this (the retry cap applies on top of it).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

impl<C: Codec> HttpBackend<C> {
    pub fn new(client: reqwest::Client, codec: C, target: ProviderTarget, tuning: Tuning) -> HttpBackend<C> {
        // Parsed once: every span carries it.
        let server = reqwest::Url::parse(&target.base_url).ok().and_then(|u| Some((u.host_str()?.to_owned(), u.port_or_known_default()?)));
        HttpBackend {
            client,
            codec,
            target,
            tuning,
            server,
            timeout: super::CALL_TIMEOUT,
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
            stream_idle: streaming::DEFAULT_STREAM_IDLE,
            auth: None,
        }
    }

    /// Signs or authorises every request with `auth` (cloud providers).
    pub fn with_auth(mut self, auth: Box<dyn Auth>) -> HttpBackend<C> {
        self.auth = Some(auth);
        self
    }

    /// Sends one request with the credentials of `auth`: the body as the exact bytes signed.
    async fn send_authorised(&self, auth: &dyn Auth, wire: &WireRequest) -> Result<reqwest::Response, LlmError> {
        let body = serde_json::to_vec(&wire.body).map_err(|e| LlmError::new(ReasonClass::ProviderError, format!("cannot serialise the request: {e}")))?;
        let mut builder = self.client.post(&wire.url).timeout(self.timeout).header("content-type", "application/json");
        for (k, v) in &wire.headers {
            builder = builder.header(*k, v);
        }
        for (k, v) in auth.headers(&self.client, &wire.url, &body).await? {
            builder = builder.header(k, v);
        }
        builder.body(body).send().await.map_err(|e| transport_error(e, self.timeout))
    }

    /// Overrides the per-attempt timeout (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> HttpBackend<C> {
        self.timeout = timeout;
        self
    }

    /// Caps the reply body; a longer one fails the call with `provider_error`.
    pub fn with_max_reply_bytes(mut self, max: usize) -> HttpBackend<C> {
        self.max_reply_bytes = max;
        self
    }

    /// The reply cap and, for a streaming reply, its idle timeout.
    pub fn with_limits(self, limits: ReplyLimits) -> HttpBackend<C> {
        HttpBackend { stream_idle: limits.stream_idle, ..self.with_max_reply_bytes(limits.max_bytes) }
    }
}

/// The client every backend shares: pooled, rustls, and never following a redirect. Provider
/// requests carry keys in headers (`x-api-key`, `x-goog-api-key`) that an HTTP client does not
/// strip on a redirect, and a 307 would resend the whole prompt: a redirect is an error instead.
/// The `User-Agent` of every provider request.
pub const USER_AGENT: &str = concat!("fabric-runtime/", env!("CARGO_PKG_VERSION"));

pub fn shared_client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .redirect(reqwest::redirect::Policy::none())
        // Some gateways refuse requests without one; the SDKs of the reference send theirs.
        .user_agent(USER_AGENT)
        .build()
        .map_err(|e| ClientError { of: "the model providers", message: e.to_string() })
}

fn schema_name(stage_id: &str) -> String {
    let mut name: String = stage_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).take(64).collect();
    if name.is_empty() {
        name.push_str("output");
    }
    name
}

/// Reads `retry-after-ms` or `retry-after` (seconds, possibly fractional). Any value a peer
/// sends is safe: negative, non-finite or unreadable values are ignored, and huge ones are read
/// as [`MAX_RETRY_AFTER`] (the retry layer and the flow gate cap the wait again at their own
/// maximums, which an operator sets).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Wait> {
    let seconds = |from: &'static str, scale: f64| -> Option<Wait> {
        let text = headers.get(from)?.to_str().ok()?;
        let value = text.trim().parse::<f64>().ok()?;
        if !value.is_finite() || value < 0.0 {
            return None;
        }
        let after = Duration::try_from_secs_f64(value * scale).map_or(MAX_RETRY_AFTER, |d| d.min(MAX_RETRY_AFTER));
        Some(Wait { after, from })
    };
    seconds("retry-after-ms", 0.001).or_else(|| seconds("retry-after", 1.0))
}

/// Reads a reply body up to `limit` bytes. `Ok(None)` when it is longer: nothing past the
/// limit is read, and the caller says so with the status it got.
async fn read_body(response: &mut reqwest::Response, limit: usize, timeout: Duration) -> Result<Option<Vec<u8>>, LlmError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(e, timeout))? {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
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
    // Which endpoint could not be reached: its origin only (scheme, host, port), as the URL's
    // path, query or credentials may carry a key in some deployments.
    let origin = e.url().filter(|_| is_connect).map(|u| u.origin().ascii_serialization()).filter(|o| o != "null");
    let e = e.without_url();
    let mut message = origin.map(|o| format!("cannot connect to {o}: ")).unwrap_or_default();
    message.push_str(&e.to_string());
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
        Box::pin(self.call(req))
    }

    async fn call<'a>(&'a self, req: &'a LlmRequest<'a>) -> Result<LlmReply, LlmError> {
        let schema = WireSchema::of(req.output);
        let call = CallSpec { target: &self.target, tuning: self.tuning, system: req.system, user: req.user, schema, schema_name: schema_name(req.stage_id) };
        // A stage that streams, on a provider that can: the streaming request.
        let streaming = req.stream.zip(self.codec.streaming());
        let wire = streaming.map_or_else(|| self.codec.encode(&call), |(_, s)| s.encode_stream(&call));
        let mut response = match &self.auth {
            None => {
                let mut builder = self.client.post(&wire.url).timeout(self.timeout).json(&wire.body);
                for (k, v) in &wire.headers {
                    builder = builder.header(*k, v);
                }
                builder.send().await.map_err(|e| transport_error(e, self.timeout))?
            }
            Some(auth) => {
                let first = self.send_authorised(auth.as_ref(), &wire).await?;
                // A token the provider no longer takes (revoked, or expired early): once more
                // with a fresh one.
                if first.status() == reqwest::StatusCode::UNAUTHORIZED && auth.refused() { self.send_authorised(auth.as_ref(), &wire).await? } else { first }
            }
        };
        let status = response.status().as_u16();
        let provider = self.codec.kind().key();
        if (300..400).contains(&status) {
            // Never followed (see `shared_client`); say where it pointed, by origin only.
            let to = response.headers().get("location").and_then(|v| v.to_str().ok()).map(crate::redact::origin_and_path);
            let to = to.map_or(String::new(), |t| format!(" to {t}"));
            return Err(LlmError::new(
                ReasonClass::ProviderError,
                format!("HTTP {status} from {provider}: a redirect{to}; provider calls never follow redirects (set the base URL to the final address)"),
            ));
        }
        let wait = retry_after(response.headers());
        let limit = self.max_reply_bytes;
        // A server that answers a streaming request with a whole JSON body (one that ignores
        // `stream`) is read as a whole reply.
        let whole = response.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("application/json"));
        if let Some((deltas, stream)) = streaming.filter(|_| (200..300).contains(&status) && !whole) {
            let limits = streaming::StreamLimits { max_bytes: limit, idle: self.stream_idle, timeout: self.timeout };
            let whole = streaming::read(&mut response, stream.fold(&call), stream.framing(), limits, deltas).await?;
            let (text, meta) = self.codec.decode(&serde_json::to_vec(&whole).unwrap_or_default(), &call)?;
            return finish_provider_reply(self.codec.kind(), req.output, text, meta);
        }
        let body = read_body(&mut response, limit, self.timeout).await?;
        if !(200..300).contains(&status) {
            // The status decides the class (and so the retry); of the body only the provider's
            // error code is kept (its text may quote a key or the prompt).
            let code = body.as_deref().and_then(|b| self.codec.error_code(b)).or_else(|| self.codec.header_error_code(response.headers()));
            let code = code.map_or(String::new(), |c| format!(" ({c})"));
            let mut e = LlmError::new(status_class(status), format!("HTTP {status} from {provider}{code}"));
            if matches!(status, 401 | 403) {
                e = e.refusing(crate::llm::Refused::Auth);
            }
            e.retry_after = if status == 429 { limits::rate_limit_hint(response.headers(), body.as_deref(), std::time::SystemTime::now()) } else { wait };
            return Err(e);
        }
        let Some(bytes) = body else {
            let why = format!("the reply is larger than the {limit}-byte limit (FABRIC_LLM_MAX_REPLY_BYTES); nothing past the limit was read");
            return Err(LlmError::new(ReasonClass::ProviderError, why));
        };
        let (text, meta) = self.codec.decode(&bytes, &call)?;
        finish_provider_reply(self.codec.kind(), req.output, text, meta)
    }

    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: self.codec.kind().key().to_owned(),
            model: self.target.model.clone(),
            temperature: Some(self.tuning.temperature),
            max_tokens: Some(self.tuning.max_tokens),
            server: self.server.clone(),
        }
    }
}

/// The stage value of a provider's reply text, streamed or whole.
fn finish_provider_reply(kind: ProviderKind, output: &OutputSpec, text: String, meta: ReplyMeta) -> Result<LlmReply, LlmError> {
    // LangChain reads Ollama's and Gemini's structured replies (stage models and the
    // decision alike) as Markdown: a reply in a code fence is accepted there, so it is
    // here (on those two only, as there).
    if matches!(output, OutputSpec::Bindable(_) | OutputSpec::Decision(_))
        && reads_markdown(kind)
        && let Some(inner) = unfence(&text)
    {
        return match finish_reply(output, inner, meta) {
            Ok(mut reply) => {
                reply.raw = Some(text.into());
                Ok(reply)
            }
            Err(mut e) => {
                // As received: the fence included.
                e.raw_reply = Some(text);
                Err(e)
            }
        };
    }
    finish_reply(output, text, meta)
}

/// Whether LangChain reads this provider's structured replies as Markdown (Ollama, Gemini, and
/// the family members whose package does, see `compat::Dialect`).
fn reads_markdown(kind: ProviderKind) -> bool {
    match kind {
        ProviderKind::Ollama | ProviderKind::Gemini | ProviderKind::Cohere => true,
        ProviderKind::Compat(c) => compat::dialect(c).reasoning_markdown,
        _ => false,
    }
}

/// The JSON inside a Markdown code fence, read as LangChain's `parse_json_markdown` reads it:
/// only when the reply (without surrounding whitespace and backticks) is not JSON itself; then
/// what follows the first ```` ``` ```` (and an optional `json`) to the end, without surrounding
/// whitespace and backticks. `None`: no fence, or JSON with nothing around it.
pub fn unfence(text: &str) -> Option<String> {
    const STRIP: &[char] = &[' ', '\n', '\r', '\t', '`'];
    let stripped = text.trim_matches(STRIP);
    if crate::structured::pyjson::parse(stripped).is_ok() {
        // JSON once the backticks and blanks around it are gone (```` ``` ```` with no `json`
        // tag, or `` `{…}` ``): that JSON, as LangChain reads it.
        return (stripped.len() != text.len()).then(|| stripped.to_owned());
    }
    let (_, after) = text.split_once("```")?;
    let inner = after.strip_prefix("json").unwrap_or(after);
    Some(inner.trim_matches(STRIP).to_owned())
}

/// Builds the backend for a target.
pub fn backend_for(client: reqwest::Client, target: ProviderTarget, tuning: Tuning, limits: impl Into<ReplyLimits>) -> Box<dyn Llm> {
    let limits = limits.into();
    let max_reply_bytes = limits.max_bytes;
    match target.provider {
        ProviderKind::Ollama => Box::new(HttpBackend::new(client, ollama::Ollama, target, tuning).with_limits(limits)),
        ProviderKind::OpenAi => Box::new(HttpBackend::new(client, openai::OpenAi::new(target.provider), target, tuning).with_limits(limits)),
        ProviderKind::Gemini => Box::new(HttpBackend::new(client, gemini::Gemini, target, tuning).with_limits(limits)),
        ProviderKind::Anthropic => Box::new(HttpBackend::new(client, anthropic::Anthropic, target, tuning).with_limits(limits)),
        ProviderKind::Bedrock | ProviderKind::BedrockConverse => bedrock::backend(client, target, tuning, max_reply_bytes),
        ProviderKind::VertexAi => vertex::backend(client, target, tuning, max_reply_bytes),
        // The OpenAI-compatible family: the OpenAI codec in each package's dialect, or the
        // Responses API where the package calls it.
        ProviderKind::Compat(c) if compat::dialect(c).responses || (c == crate::vocab::Compat::MantleOpenAi && compat::mantle_responses(&target.model)) => {
            let keys = mantle_keys(&target);
            let backend = HttpBackend::new(client, responses::Responses { kind: target.provider }, target, tuning).with_max_reply_bytes(max_reply_bytes);
            match keys {
                Some(keys) => Box::new(backend.with_auth(Box::new(keys))),
                None => Box::new(backend),
            }
        }
        ProviderKind::Compat(_) => {
            let keys = mantle_keys(&target);
            let backend = HttpBackend::new(client, openai::OpenAi::new(target.provider), target, tuning).with_limits(limits);
            match keys {
                Some(keys) => Box::new(backend.with_auth(Box::new(keys))),
                None => Box::new(backend),
            }
        }
        ProviderKind::HostedAnthropic(_) => anthropic_hosted::backend(client, target, tuning, max_reply_bytes),
        ProviderKind::Ibm => watsonx::backend(client, target, tuning, max_reply_bytes),
        ProviderKind::Cohere => Box::new(HttpBackend::new(client, cohere::Cohere, target, tuning).with_max_reply_bytes(max_reply_bytes)),
    }
}

/// Short-term Bedrock API keys for a Mantle target with AWS keys (`bedrock_mantle_openai:`
/// without `AWS_BEARER_TOKEN_BEDROCK`).
fn mantle_keys(target: &ProviderTarget) -> Option<sigv4::BedrockKeys> {
    match &target.cloud {
        Some(crate::llm::cloud::Cloud::Bedrock { region, keys: Some(keys), .. }) => Some(sigv4::BedrockKeys::new(keys.clone(), region.clone())),
        _ => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(name: &'static str, value: &str) -> reqwest::header::HeaderMap {
        let mut h = reqwest::header::HeaderMap::new();
        if let Ok(v) = reqwest::header::HeaderValue::from_str(value) {
            h.insert(name, v);
        }
        h
    }

    #[test]
    fn retry_after_values() {
        let after = |name, value| retry_after(&headers(name, value)).map(|w| (w.after, w.from));
        assert_eq!(after("retry-after", "2"), Some((Duration::from_secs(2), "retry-after")));
        assert_eq!(after("retry-after", " 0.25 "), Some((Duration::from_millis(250), "retry-after")));
        assert_eq!(after("retry-after-ms", "1500"), Some((Duration::from_millis(1500), "retry-after-ms")));
        assert_eq!(after("retry-after", "1e308"), Some((MAX_RETRY_AFTER, "retry-after")));
        assert_eq!(after("retry-after-ms", "1e30"), Some((MAX_RETRY_AFTER, "retry-after-ms")));
        assert_eq!(after("retry-after", "18446744073709551616"), Some((MAX_RETRY_AFTER, "retry-after")));
        for bad in ["-1", "NaN", "inf", "-inf", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", ""] {
            assert_eq!(retry_after(&headers("retry-after", bad)), None, "{bad}");
        }
    }

    #[test]
    fn only_an_error_code_is_kept_from_an_error_body() {
        assert_eq!(
            nested_error_code(br#"{"error": {"message": "Incorrect API key sk-abc", "type": "invalid_request_error", "code": "invalid_api_key"}}"#).as_deref(),
            Some("invalid_api_key")
        );
        assert_eq!(nested_error_code(br#"{"error": {"code": 429, "message": "m", "status": "RESOURCE_EXHAUSTED"}}"#).as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(nested_error_code(br#"{"error": {"type": "a type with the key sk-abc in it"}}"#), None);
        assert_eq!(nested_error_code(b"not json"), None);
    }

    proptest! {
        /// Whatever a peer sends, reading it never panics and never waits past the cap.
        #[test]
        fn any_retry_after_is_safe(value in "\\PC{0,40}", number in proptest::num::f64::ANY, ms in any::<bool>()) {
            let name = if ms { "retry-after-ms" } else { "retry-after" };
            for text in [value, number.to_string(), format!("{number:e}")] {
                if let Some(w) = retry_after(&headers(name, &text)) {
                    prop_assert!(w.after <= MAX_RETRY_AFTER);
                }
            }
        }
    }
}

#[cfg(test)]
mod unfence_tests {
    use super::unfence;

    #[test]
    fn a_fenced_reply_is_read_as_langchain_reads_it() {
        assert_eq!(unfence("```json\n{\"a\": 1}\n```").as_deref(), Some("{\"a\": 1}"));
        assert_eq!(unfence("Here it is:\n```\n{\"a\": 1}\n```\nDone.").as_deref(), Some("{\"a\": 1}\n```\nDone."));
        assert_eq!(unfence("{\"a\": 1}"), None, "plain JSON is left alone");
        assert_eq!(unfence("`{\"a\": 1}`").as_deref(), Some("{\"a\": 1}"), "JSON in backticks");
        assert_eq!(unfence("```\n{\"a\": 1}\n```").as_deref(), Some("{\"a\": 1}"), "a fence without the json tag");
        assert_eq!(unfence(" {\"a\": NaN}\n").as_deref(), Some("{\"a\": NaN}"), "Python's JSON, blanks around");
        assert_eq!(unfence("no fence at all"), None);
    }
}
