//! IBM watsonx.ai's chat API (`POST {url}/ml/v1/text/chat?version=2026-10-14`), as langchain-ibm's
//! `ChatWatsonx` calls it through the ibm-watsonx-ai SDK (1.8.1).
//!
//! The body is OpenAI's Chat Completions with watsonx.ai's names: `model_id` for `model`, and the
//! project (`project_id`) or deployment space (`space_id`) the call runs in; structured output is
//! one forced function tool, as `ChatWatsonx.with_structured_output` asks for it, and the reply
//! is OpenAI's shape (the [`super::openai`] codec reads it). The bearer token is an IAM token
//! exchanged for the IBM Cloud API key ([`super::gcp_token`]), or `WATSONX_TOKEN` as it is.

use super::compat::{Dialect, OPENAI, Structured, TokenField};
use super::openai::OpenAi;
use super::{CallSpec, Codec, HttpBackend, WireRequest};
use crate::llm::cloud::{Cloud, WatsonxScope};
use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};
use crate::llm::{Llm, LlmError, ReplyMeta};

/// The API version ibm-watsonx-ai 1.8.1 sends (its `utils/API_VERSION_PARAM`).
pub const API_VERSION: &str = "2026-10-14";
/// IBM Cloud's IAM endpoint, where ibm-watsonx-ai exchanges an API key for the cloud's regions.
pub const IAM_URL: &str = "https://iam.cloud.ibm.com";

/// What ChatWatsonx sends beyond OpenAI's request: a forced tool without `parallel_tool_calls`,
/// `max_tokens`, no `stream` field.
const DIALECT: Dialect =
    Dialect { structured: Structured::ForcedTool { choice_any: false, parallel_false: false }, tokens: TokenField::MaxTokens, stream_field: false, ..OPENAI };

/// The watsonx.ai codec: the OpenAI codec's request renamed, its reading as is.
#[derive(Debug, Clone, Copy)]
pub struct Watsonx {
    inner: OpenAi,
}

/// The backend for an `ibm:` target, with its IAM token source when it has an API key.
pub fn backend(client: reqwest::Client, target: ProviderTarget, tuning: Tuning, max_reply_bytes: usize) -> Box<dyn Llm> {
    let tokens = match &target.cloud {
        Some(Cloud::Watsonx { iam: Some(iam), .. }) => Some(super::gcp_token::TokenSource::ibm(iam.api_key.clone(), iam.var.clone(), iam.token_url.clone())),
        _ => None,
    };
    let codec = Watsonx { inner: OpenAi::with_dialect(ProviderKind::Ibm, DIALECT) };
    let backend = HttpBackend::new(client, codec, target, tuning).with_max_reply_bytes(max_reply_bytes);
    match tokens {
        Some(tokens) => Box::new(backend.with_auth(Box::new(tokens))),
        // WATSONX_TOKEN goes as a bearer token from the codec.
        None => Box::new(backend),
    }
}

impl Codec for Watsonx {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Ibm
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut wire = self.inner.encode(call);
        if let Some(body) = wire.body.as_object_mut() {
            if let Some(model) = body.remove("model") {
                body.insert("model_id".into(), model);
            }
            match &call.target.cloud {
                Some(Cloud::Watsonx { scope: WatsonxScope::Project(id), .. }) => body.insert("project_id".into(), id.clone().into()),
                Some(Cloud::Watsonx { scope: WatsonxScope::Space(id), .. }) => body.insert("space_id".into(), id.clone().into()),
                _ => None,
            };
        }
        wire.url = format!("{}/ml/v1/text/chat?version={API_VERSION}", call.target.base_url);
        wire
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        self.inner.decode(body, call)
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        // watsonx.ai's errors: `{"errors": [{"code": "authentication_token_expired", ...}], "trace": ...}`.
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let code = v.pointer("/errors/0/code").and_then(serde_json::Value::as_str);
        code.filter(|c| super::is_code(c)).map(str::to_owned).or_else(|| self.inner.error_code(body))
    }
}
