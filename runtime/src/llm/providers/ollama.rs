//! Ollama's native `POST /api/chat`, non-streaming.
//!
//! The schema goes as `format` unchanged (Ollama turns it into a grammar); the output limit as
//! `options.num_predict`, the temperature as `options.temperature`.

use serde_json::{Value, json};

use super::{CallSpec, Codec, WireRequest, system_user_messages, usage};
use crate::config::ProviderKind;
use crate::llm::{LlmError, ReasonClass, Usage};

#[derive(Debug, Clone, Copy)]
pub struct Ollama;

impl Codec for Ollama {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Ollama
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut body = json!({
            "model": call.target.model,
            "stream": false,
            "messages": system_user_messages(call),
            "options": {"temperature": call.tuning.temperature, "num_predict": call.tuning.max_tokens},
        });
        if let Some(schema) = call.schema {
            body["format"] = schema.json.clone();
        }
        let mut headers = Vec::new();
        if let Some(key) = &call.target.api_key {
            headers.push(("authorization", format!("Bearer {}", key.expose())));
        }
        WireRequest { url: format!("{}/api/chat", call.target.base_url), headers, body }
    }

    fn decode(&self, body: &Value, _call: &CallSpec<'_>) -> Result<(String, Option<Usage>), LlmError> {
        if let Some(e) = body.get("error").and_then(Value::as_str) {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("ollama: {e}")));
        }
        let text = body
            .pointer("/message/content")
            .and_then(Value::as_str)
            .ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "ollama reply has no message.content"))?;
        Ok((text.to_owned(), usage(body.get("prompt_eval_count"), body.get("eval_count"))))
    }
}
