//! Anthropic Messages (`POST {base}/v1/messages`).
//!
//! Structured output goes through one forced tool whose `input_schema` is the stage's schema;
//! the answer is that tool's `input`. Replies may start with a stray text block (real models do
//! that): we take the first `tool_use` block of the forced tool.

use serde_json::{Value, json};

use super::{CallSpec, Codec, WireRequest, usage};
use crate::config::ProviderKind;
use crate::llm::{LlmError, ReasonClass, Usage};

pub const API_VERSION: &str = "2023-06-01";

#[derive(Debug, Clone, Copy)]
pub struct Anthropic;

impl Codec for Anthropic {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut body = json!({
            "model": call.target.model,
            "max_tokens": call.tuning.max_tokens,
            "system": call.system,
            "messages": [{"role": "user", "content": call.user}],
            "temperature": call.tuning.temperature,
        });
        if let Some(schema) = call.schema {
            let description = schema.json.get("description").and_then(Value::as_str).unwrap_or("Reply with the result in this shape.");
            body["tools"] = json!([{"name": call.schema_name, "description": description, "input_schema": schema.json}]);
            body["tool_choice"] = json!({"type": "tool", "name": call.schema_name});
        }
        let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
        if let Some(key) = &call.target.api_key {
            headers.push(("x-api-key", key.expose().to_owned()));
        }
        WireRequest { url: format!("{}/v1/messages", call.target.base_url), headers, body }
    }

    fn decode(&self, body: &Value, call: &CallSpec<'_>) -> Result<(String, Option<Usage>), LlmError> {
        let blocks =
            body.get("content").and_then(Value::as_array).ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "anthropic reply has no content"))?;
        let usage = usage(body.pointer("/usage/input_tokens"), body.pointer("/usage/output_tokens"));
        if call.schema.is_some() {
            let tool = blocks.iter().find(|b| {
                b.get("type").and_then(Value::as_str) == Some("tool_use") && b.get("name").and_then(Value::as_str) == Some(call.schema_name.as_str())
            });
            return match tool.and_then(|b| b.get("input")) {
                Some(input) => Ok((input.to_string(), usage)),
                None if body.get("stop_reason").and_then(Value::as_str) == Some("max_tokens") => {
                    Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (max_tokens)"))
                }
                None => Err(LlmError::new(ReasonClass::ProviderError, format!("anthropic reply has no `{}` tool_use block", call.schema_name))),
            };
        }
        let text: String =
            blocks.iter().filter(|b| b.get("type").and_then(Value::as_str) == Some("text")).filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
        Ok((text, usage))
    }
}
