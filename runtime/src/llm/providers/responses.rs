//! OpenAI's Responses API (`POST {base}/responses`), as `ChatOpenAI` calls it with
//! `use_responses_api`: the packages of `meta:` (langchain-meta's `ChatMetaModel`), `langsmith:`
//! (the LangSmith gateway) and the GPT models of `bedrock_mantle_openai:`.
//!
//! The request carries the system and user texts as `input` messages, the output limit as
//! `max_output_tokens`, and structured output as `text.format: json_schema` in OpenAI's strict
//! form (the same schema the Chat Completions codec sends, [`super::openai::wire_schema`]). The
//! reply is the `output_text` parts of its `message` items; reasoning items are skipped.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::anthropic::TokenUsage;
use super::openai::wire_schema;
use super::{CallSpec, Codec, WireRequest, bearer_headers, nested_error_code, parse_reply};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

/// The Responses codec for one provider key.
#[derive(Debug, Clone, Copy)]
pub struct Responses {
    pub kind: ProviderKind,
}

#[derive(Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    stream: bool,
    input: [InputMessage<'a>; 2],
    max_output_tokens: u32,
    temperature: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextConfig<'a>>,
}

#[derive(Serialize)]
struct InputMessage<'a> {
    content: &'a str,
    role: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct TextConfig<'a> {
    format: Format<'a>,
}

#[derive(Serialize)]
struct Format<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    strict: bool,
    name: &'a str,
    schema: Value,
}

#[derive(Deserialize)]
struct ResponsesReply {
    id: Option<String>,
    model: Option<String>,
    status: Option<String>,
    incomplete_details: Option<Incomplete>,
    #[serde(default)]
    output: Vec<Item>,
    usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
struct Incomplete {
    reason: Option<String>,
}

/// An output item; only `message` items carry the answer (`reasoning` and others are skipped).
#[derive(Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    content: Vec<Part>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part {
    OutputText {
        text: String,
    },
    Refusal {
        refusal: String,
    },
    #[serde(other)]
    Other,
}

impl Codec for Responses {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let text = call.schema.map(|schema| {
            let (schema, strict) = wire_schema(schema);
            TextConfig { format: Format { kind: "json_schema", strict, name: &call.schema_name, schema } }
        });
        let body = ResponsesRequest {
            model: &call.target.model,
            stream: false,
            input: [InputMessage { content: call.system, role: "system", kind: "message" }, InputMessage { content: call.user, role: "user", kind: "message" }],
            max_output_tokens: call.tuning.max_tokens,
            temperature: call.tuning.temperature,
            text,
        };
        let url = format!("{}/responses", call.target.base_url);
        WireRequest { url, headers: bearer_headers(call), body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], _call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let key = self.kind.key();
        let reply: ResponsesReply = parse_reply(self.kind, body)?;
        if reply.status.as_deref() == Some("incomplete") {
            let reason = reply.incomplete_details.and_then(|d| d.reason).unwrap_or_else(|| "unknown".into());
            let why =
                if reason == "max_output_tokens" { "the reply was cut at the output token limit".to_owned() } else { "the reply is incomplete".to_owned() };
            // The reason is OpenAI's short code (`max_output_tokens`, `content_filter`), never text.
            let reason = if super::is_code(&reason) { reason } else { "unknown".into() };
            return Err(LlmError::new(ReasonClass::ProviderError, format!("{why} (status: incomplete, {reason})")));
        }
        let mut text = String::new();
        let mut any = false;
        for part in reply.output.into_iter().filter(|i| i.kind == "message").flat_map(|i| i.content) {
            match part {
                Part::OutputText { text: t } => {
                    any = true;
                    text.push_str(&t);
                }
                Part::Refusal { refusal } => {
                    return Err(LlmError::new(ReasonClass::ProviderError, format!("the model refused: {refusal}")).refusing(crate::llm::Refused::Content));
                }
                Part::Other => {}
            }
        }
        if !any {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("{key} reply has no output_text in a message item")));
        }
        let usage = reply.usage.map(|u| Usage { input_tokens: u.input_tokens, output_tokens: u.output_tokens });
        Ok((text, ReplyMeta::new(usage, reply.status, reply.model, reply.id)))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }
}
