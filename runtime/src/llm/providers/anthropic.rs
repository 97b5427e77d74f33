//! Anthropic Messages (`POST {base}/v1/messages`).
//!
//! Structured output goes through one forced tool whose `input_schema` is the stage's schema;
//! the answer is that tool's `input`. Replies may start with a stray text block (real models do
//! that): we take the first `tool_use` block of the forced tool.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallSpec, Codec, WireRequest, nested_error_code, parse_reply};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

/// The `anthropic-version` header the runtime sends, with `x-api-key`: the Messages API version
/// the request and reply shapes here follow. The reference's SDK (langchain-anthropic 1.7.10)
/// sends a bearer token and a newer version; both are accepted by the API, and this one is kept
/// on purpose (docs/providers.md).
pub const API_VERSION: &str = "2023-06-01";

#[derive(Debug, Clone, Copy)]
pub struct Anthropic;

#[derive(Serialize)]
struct MessagesRequest<'a> {
    /// In the path instead on Bedrock's InvokeModel and Vertex AI's rawPredict.
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    max_tokens: u32,
    system: &'a str,
    messages: [UserMessage<'a>; 1],
    temperature: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<[Tool<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice<'a>>,
    /// The API version in the body, where the cloud takes it there (Bedrock, Vertex AI).
    #[serde(skip_serializing_if = "Option::is_none")]
    anthropic_version: Option<&'static str>,
}

#[derive(Serialize)]
struct UserMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Tool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

#[derive(Serialize)]
struct ToolChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
}

#[derive(Deserialize)]
struct MessagesResponse {
    id: Option<String>,
    model: Option<String>,
    content: Vec<Block>,
    stop_reason: Option<String>,
    usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        name: String,
        input: Value,
    },
    #[serde(other)]
    Other,
}

/// `usage` as Anthropic's Messages API and OpenAI's Responses API both write it.
#[derive(Deserialize)]
pub(crate) struct TokenUsage {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
}

impl Codec for Anthropic {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
        if let Some(key) = &call.target.api_key {
            headers.push(("x-api-key", key.expose().to_owned()));
        }
        WireRequest { url: format!("{}/v1/messages", call.target.base_url), headers, body: messages_body(call, true, None) }
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        read_messages(self.kind(), body, call)
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }
    fn streaming(&self) -> Option<&dyn super::streaming::StreamCodec> {
        Some(self)
    }
}

/// The Messages API body: the model in it or not (`with_model`), the API version in it where the
/// cloud takes it there. Structured output is one forced tool.
pub(crate) fn messages_body(call: &CallSpec<'_>, with_model: bool, anthropic_version: Option<&'static str>) -> Value {
    let tools = call.schema.map(|schema| {
        let description = schema.json.get("description").and_then(Value::as_str).unwrap_or("Reply with the result in this shape.");
        [Tool { name: &call.schema_name, description, input_schema: schema.json }]
    });
    let body = MessagesRequest {
        model: with_model.then_some(call.target.model.as_str()),
        max_tokens: call.tuning.max_tokens,
        system: call.system,
        messages: [UserMessage { role: "user", content: call.user }],
        temperature: call.tuning.temperature,
        tool_choice: tools.as_ref().map(|_| ToolChoice { kind: "tool", name: &call.schema_name }),
        tools,
        anthropic_version,
    };
    serde_json::to_value(body).unwrap_or_default()
}

/// Reads a Messages API reply: the forced tool's `input` for a structured call, else the text
/// blocks joined; `stop_reason: max_tokens` is a cut reply.
pub(crate) fn read_messages(kind: ProviderKind, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
    let reply: MessagesResponse = parse_reply(kind, body)?;
    let usage = reply.usage.map(|u| Usage { input_tokens: u.input_tokens, output_tokens: u.output_tokens });
    // A reply cut at the token limit is incomplete, text and tool input alike.
    if reply.stop_reason.as_deref() == Some("max_tokens") {
        return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (stop_reason: max_tokens)"));
    }
    // A refusal's text is still the reply of a text call, as LangChain reads it; a structured
    // call gets no tool input from it, and says why.
    let refused = reply.stop_reason.as_deref() == Some("refusal");
    let meta = ReplyMeta::new(usage, reply.stop_reason, reply.model, reply.id);
    if call.schema.is_some() {
        let input = reply.content.into_iter().find_map(|b| match b {
            Block::ToolUse { name, input } if name == call.schema_name => Some(input),
            _ => None,
        });
        return match input {
            Some(input) => Ok((input.to_string(), meta)),
            None if refused => {
                Err(LlmError::new(ReasonClass::ProviderError, "the model refused (stop_reason: refusal)").refusing(crate::llm::Refused::Content))
            }
            None => Err(LlmError::new(ReasonClass::ProviderError, format!("{} reply has no `{}` tool_use block", kind.key(), call.schema_name))),
        };
    }
    let text: String = reply
        .content
        .into_iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text),
            _ => None,
        })
        .collect();
    Ok((text, meta))
}
