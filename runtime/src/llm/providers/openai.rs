//! OpenAI Chat Completions (`POST {base}/chat/completions`), and any compatible server.
//!
//! Structured output goes as `response_format: json_schema`. Strict mode needs every property
//! required and `additionalProperties: false`; we ask for it only when the schema already
//! requires every property, and send `strict: false` otherwise (as LangChain's dict path does).

use serde_json::{Value, json};

use super::{CallSpec, Codec, WireRequest, WireSchema, retain_keywords, system_user_messages, usage};
use crate::config::ProviderKind;
use crate::llm::{LlmError, ReasonClass, Usage};

#[derive(Debug, Clone, Copy)]
pub struct OpenAi;

/// Keywords OpenAI structured outputs accept on our flat schemas.
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "enum",
    "items",
    "description",
    "additionalProperties",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "pattern",
    "format",
];

/// The schema as OpenAI is asked for it, and whether strict mode applies.
pub fn wire_schema(schema: WireSchema<'_>) -> (Value, bool) {
    let mut s = retain_keywords(schema.json, KEYWORDS);
    s["type"] = json!("object");
    let strict = schema.all_required;
    if strict {
        s["additionalProperties"] = json!(false);
    }
    (s, strict)
}

impl Codec for OpenAi {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut body = json!({
            "model": call.target.model,
            "stream": false,
            "messages": system_user_messages(call),
            "temperature": call.tuning.temperature,
            "max_completion_tokens": call.tuning.max_tokens,
        });
        if let Some(schema) = call.schema {
            let (s, strict) = wire_schema(schema);
            let mut js = json!({"name": call.schema_name, "strict": strict, "schema": s});
            if let Some(d) = schema.json.get("description") {
                js["description"] = d.clone();
            }
            body["response_format"] = json!({"type": "json_schema", "json_schema": js});
        }
        let mut headers = Vec::new();
        if let Some(key) = &call.target.api_key {
            headers.push(("authorization", format!("Bearer {}", key.expose())));
        }
        WireRequest { url: format!("{}/chat/completions", call.target.base_url), headers, body }
    }

    fn decode(&self, body: &Value, _call: &CallSpec<'_>) -> Result<(String, Option<Usage>), LlmError> {
        let choice = body.pointer("/choices/0").ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "openai reply has no choices"))?;
        if let Some(refusal) = choice.pointer("/message/refusal").and_then(Value::as_str) {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("the model refused: {refusal}")));
        }
        match choice.get("finish_reason").and_then(Value::as_str) {
            Some("length") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (finish_reason: length)")),
            Some("content_filter") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was withheld by the content filter")),
            _ => {}
        }
        let text = choice
            .pointer("/message/content")
            .and_then(Value::as_str)
            .ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "openai reply has no message content"))?;
        Ok((text.to_owned(), usage(body.pointer("/usage/prompt_tokens"), body.pointer("/usage/completion_tokens"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::FlatSchema;

    #[test]
    fn strict_only_when_every_property_is_required() {
        let all = FlatSchema::from_json(&json!({"type": "object", "properties": {"a": {"type": "string", "$comment": "x"}}, "required": ["a"], "title": "T"}))
            .unwrap();
        let (s, strict) = wire_schema(WireSchema { json: all.source(), all_required: true });
        assert!(strict);
        assert_eq!(s, json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}));
        let some = FlatSchema::from_json(&json!({"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]})).unwrap();
        let (s, strict) = wire_schema(WireSchema { json: some.source(), all_required: false });
        assert!(!strict);
        assert_eq!(s, json!({"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"], "type": "object"}));
    }
}
