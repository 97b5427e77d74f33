//! Gemini `POST {base}/{version}/models/{model}:generateContent` (default version `v1`, as google-genai 3.6).
//!
//! Structured output: `responseMimeType: application/json` plus `responseJsonSchema`, reduced to
//! the keywords Gemini documents for it. The key goes in `x-goog-api-key`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallSpec, Codec, WireRequest, nested_error_code, parse_reply, retain_keywords};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateRequest<'a> {
    contents: [Content<'a>; 1],
    system_instruction: SystemInstruction<'a>,
    generation_config: GenerationConfig,
}

#[derive(Serialize)]
pub(super) struct Content<'a> {
    pub(super) role: &'static str,
    pub(super) parts: [TextPart<'a>; 1],
}

#[derive(Serialize)]
struct SystemInstruction<'a> {
    parts: [TextPart<'a>; 1],
}

#[derive(Serialize)]
pub(super) struct TextPart<'a> {
    pub(super) text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    temperature: f64,
    max_output_tokens: u32,
    candidate_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse {
    #[serde(default)]
    candidates: Vec<Candidate>,
    prompt_feedback: Option<PromptFeedback>,
    usage_metadata: Option<UsageMetadata>,
    model_version: Option<String>,
    response_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<CandidateContent>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct CandidateContent {
    #[serde(default)]
    parts: Vec<ReplyPart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReplyPart {
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) thought: bool,
    /// Vertex AI's structured answers (a forced function call); the Gemini API codec asks for none.
    pub(super) function_call: Option<FunctionCall>,
}

#[derive(Deserialize)]
pub(super) struct FunctionCall {
    pub(super) name: String,
    #[serde(default)]
    pub(super) args: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    block_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct UsageMetadata {
    prompt_token_count: u64,
    tool_use_prompt_token_count: u64,
    candidates_token_count: u64,
    thoughts_token_count: u64,
}

impl Codec for Gemini {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let body = GenerateRequest {
            contents: [Content { role: "user", parts: [TextPart { text: call.user }] }],
            system_instruction: SystemInstruction { parts: [TextPart { text: call.system }] },
            generation_config: GenerationConfig {
                temperature: call.tuning.temperature,
                max_output_tokens: call.tuning.max_tokens,
                candidate_count: 1,
                response_mime_type: call.schema.map(|_| "application/json"),
                response_json_schema: call.schema.map(|s| retain_keywords(s.json, KEYWORDS)),
            },
        };
        let mut headers = Vec::new();
        if let Some(key) = &call.target.api_key {
            headers.push(("x-goog-api-key", key.expose().to_owned()));
        }
        let url = format!("{}/{}/models/{}:generateContent", call.target.base_url, call.target.api_version, call.target.model);
        WireRequest { url, headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], _call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let (parts, meta) = read_reply(self.kind(), body)?;
        // Thought parts are the model's reasoning, not its answer.
        let text: String = parts.into_iter().filter(|p| !p.thought).filter_map(|p| p.text).collect();
        Ok((text, meta))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }
    fn streaming(&self) -> Option<&dyn super::streaming::StreamCodec> {
        Some(self)
    }
}

/// A `generateContent` reply (the Gemini API's and Vertex AI's alike): the first candidate's
/// parts and what the reply says of itself; no candidate, a cut or a withheld reply is an error.
pub(super) fn read_reply(kind: ProviderKind, body: &[u8]) -> Result<(Vec<ReplyPart>, ReplyMeta), LlmError> {
    let reply: GenerateResponse = parse_reply(kind, body)?;
    let Some(candidate) = reply.candidates.into_iter().next() else {
        let blocked = reply.prompt_feedback.and_then(|f| f.block_reason);
        let e = LlmError::new(ReasonClass::ProviderError, format!("gemini returned no answer ({})", blocked.as_deref().unwrap_or("no candidates")));
        return Err(if blocked.is_some() { e.refusing(crate::llm::Refused::Content) } else { e });
    };
    match candidate.finish_reason.as_deref() {
        Some("MAX_TOKENS") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (MAX_TOKENS)")),
        Some(r @ ("SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT")) => {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("gemini withheld the reply ({r})")).refusing(crate::llm::Refused::Content));
        }
        _ => {}
    }
    let parts = candidate.content.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "gemini reply has no content parts"))?.parts;
    let usage = reply.usage_metadata.map(|m| Usage {
        input_tokens: m.prompt_token_count.saturating_add(m.tool_use_prompt_token_count),
        output_tokens: m.candidates_token_count.saturating_add(m.thoughts_token_count),
    });
    Ok((parts, ReplyMeta::new(usage, candidate.finish_reason, reply.model_version, reply.response_id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::FlatSchema;
    use serde_json::json;

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
