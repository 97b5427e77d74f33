//! Gemini `POST {base}/{version}/models/{model}:generateContent` (default version `v1beta`).
//!
//! Structured output: `responseMimeType: application/json` plus `responseJsonSchema`, reduced to
//! the keywords Gemini documents for it. The key goes in `x-goog-api-key`.

use serde_json::{Value, json};

use super::{CallSpec, Codec, WireRequest, retain_keywords};
use crate::config::ProviderKind;
use crate::llm::{LlmError, ReasonClass, Usage};

#[derive(Debug, Clone, Copy)]
pub struct Gemini;

/// The subset of JSON Schema `responseJsonSchema` supports.
const KEYWORDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "enum",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "properties",
    "additionalProperties",
    "required",
];

impl Codec for Gemini {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut generation = json!({
            "temperature": call.tuning.temperature,
            "maxOutputTokens": call.tuning.max_tokens,
            "candidateCount": 1,
        });
        if let Some(schema) = call.schema {
            generation["responseMimeType"] = json!("application/json");
            generation["responseJsonSchema"] = retain_keywords(schema.json, KEYWORDS);
        }
        let body = json!({
            "contents": [{"role": "user", "parts": [{"text": call.user}]}],
            "systemInstruction": {"parts": [{"text": call.system}]},
            "generationConfig": generation,
        });
        let mut headers = Vec::new();
        if let Some(key) = &call.target.api_key {
            headers.push(("x-goog-api-key", key.expose().to_owned()));
        }
        WireRequest { url: format!("{}/{}/models/{}:generateContent", call.target.base_url, call.target.api_version, call.target.model), headers, body }
    }

    fn decode(&self, body: &Value, _call: &CallSpec<'_>) -> Result<(String, Option<Usage>), LlmError> {
        let candidate = body.pointer("/candidates/0").ok_or_else(|| {
            let why = body.pointer("/promptFeedback/blockReason").and_then(Value::as_str).unwrap_or("no candidates");
            LlmError::new(ReasonClass::ProviderError, format!("gemini returned no answer ({why})"))
        })?;
        match candidate.get("finishReason").and_then(Value::as_str) {
            Some("MAX_TOKENS") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (MAX_TOKENS)")),
            Some(r @ ("SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT")) => {
                return Err(LlmError::new(ReasonClass::ProviderError, format!("gemini withheld the reply ({r})")));
            }
            _ => {}
        }
        // Thought parts are the model's reasoning, not its answer.
        let parts = candidate
            .pointer("/content/parts")
            .and_then(Value::as_array)
            .ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "gemini reply has no content parts"))?;
        let text: String =
            parts.iter().filter(|p| p.get("thought") != Some(&Value::Bool(true))).filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
        let meta = body.get("usageMetadata");
        let n = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_u64).unwrap_or(0);
        let usage = meta.map(|_| Usage {
            input_tokens: n("promptTokenCount") + n("toolUsePromptTokenCount"),
            output_tokens: n("candidatesTokenCount") + n("thoughtsTokenCount"),
        });
        Ok((text, usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::FlatSchema;

    #[test]
    fn response_json_schema_keeps_the_supported_subset() {
        let schema = json!({"type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"n": {"type": "integer", "minimum": 0, "multipleOf": 2, "examples": [2]}, "tags": {"type": "array", "items": {"type": "string", "pattern": "^a"}, "uniqueItems": true}}, "required": ["n"]});
        let flat = FlatSchema::from_json(&schema).unwrap();
        assert_eq!(
            retain_keywords(flat.source(), KEYWORDS),
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["n"]})
        );
    }
}
