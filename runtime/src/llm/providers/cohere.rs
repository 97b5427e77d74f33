//! Cohere's v2 chat API (`POST {base}/v2/chat`), as langchain-cohere's ChatCohere sends it.
//!
//! Structured output goes as `response_format: {"type": "json_object", "schema": …}` (the
//! package's default), the reply's text parts joined. Errors are `{"message": …}` bodies with no
//! code, so only the status speaks for them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallSpec, ChatMessage, Codec, WireRequest, bearer_headers, parse_reply, retain_keywords, system_user_messages};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

/// The default base URL (the cohere SDK's; `CO_API_URL` overrides it).
pub const DEFAULT_URL: &str = "https://api.cohere.com";

#[derive(Debug, Clone, Copy)]
pub struct Cohere;

/// Keywords of JSON Schema that Cohere's structured outputs take on our flat schemas.
const KEYWORDS: &[&str] =
    &["type", "properties", "required", "enum", "items", "description", "minimum", "maximum", "minItems", "maxItems", "pattern", "format"];

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [ChatMessage<'a>; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat>,
    temperature: f64,
    max_tokens: u32,
    stream: bool,
}

#[derive(Serialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: &'static str,
    schema: Value,
}

#[derive(Deserialize)]
struct ChatResponse {
    id: Option<String>,
    finish_reason: Option<String>,
    message: Option<ReplyMessage>,
    usage: Option<ReplyUsage>,
}

#[derive(Deserialize)]
struct ReplyMessage {
    #[serde(default)]
    content: Vec<ContentPart>,
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: String,
}

#[derive(Deserialize)]
struct ReplyUsage {
    /// What was billed: the prompt as sent and the answer (`tokens` counts the template too).
    billed_units: Option<Units>,
}

#[derive(Deserialize)]
struct Units {
    #[serde(default)]
    input_tokens: f64,
    #[serde(default)]
    output_tokens: f64,
}

impl Codec for Cohere {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Cohere
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let response_format = call.schema.map(|s| ResponseFormat { kind: "json_object", schema: retain_keywords(s.json, KEYWORDS) });
        let body = ChatRequest {
            model: &call.target.model,
            messages: system_user_messages(call),
            response_format,
            temperature: call.tuning.temperature,
            max_tokens: call.tuning.max_tokens,
            stream: false,
        };
        let mut headers = bearer_headers(call);
        // What langchain-cohere sends to say who calls.
        headers.push(("x-client-name", "langchain:partner".to_owned()));
        WireRequest { url: format!("{}/v2/chat", call.target.base_url), headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], _call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let reply: ChatResponse = parse_reply(self.kind(), body)?;
        match reply.finish_reason.as_deref() {
            Some("MAX_TOKENS") => {
                return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (finish_reason: MAX_TOKENS)"));
            }
            Some("ERROR") => return Err(LlmError::new(ReasonClass::ProviderError, "cohere reports an error generating the reply (finish_reason: ERROR)")),
            _ => {}
        }
        let message = reply.message.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "cohere reply has no message"))?;
        let text: String = message.content.iter().filter(|p| p.kind == "text").map(|p| p.text.as_str()).collect();
        // Counts arrive as JSON numbers that may be floats; a negative or odd one reads as 0.
        let count = |n: f64| if n.is_finite() && n > 0.0 { n as u64 } else { 0 };
        let usage = reply.usage.and_then(|u| u.billed_units).map(|b| Usage { input_tokens: count(b.input_tokens), output_tokens: count(b.output_tokens) });
        Ok((text, ReplyMeta::new(usage, reply.finish_reason, None, reply.id)))
    }

    fn error_code(&self, _body: &[u8]) -> Option<String> {
        // `{"message": "..."}` only: free text, which may quote the request; nothing is kept.
        None
    }
}
