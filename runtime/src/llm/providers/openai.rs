//! OpenAI Chat Completions (`POST {base}/chat/completions`), and any compatible server.
//!
//! Structured output goes as `response_format: json_schema` in strict mode, as LangChain asks
//! for a stage's Pydantic model: every property required, an optional one as
//! `anyOf: [its schema, {"type": "null"}]` (the model answers `null` where it has nothing, which
//! validation reads as absent), and `additionalProperties: false`. The decision goes with
//! `strict: false`: its free-form `arguments` object is what strict mode cannot take.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{CallSpec, ChatMessage, Codec, WireRequest, WireSchema, bearer_headers, nested_error_code, parse_reply, retain_keywords, system_user_messages};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

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
    if !schema.strict {
        return (s, false);
    }
    let required: Vec<String> = s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
    let mut all = Vec::new();
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        // Properties the stage ignores (`_private`, as Pydantic does) are not asked for.
        props.retain(|name, _| !name.starts_with('_'));
        for (name, prop) in props.iter_mut() {
            all.push(Value::String(name.clone()));
            strict_keywords(prop);
            if required.contains(name) {
                continue;
            }
            // Nullable, the way Pydantic writes `Optional[T]`: the description stays outside.
            let mut inner = std::mem::take(prop);
            let description = inner.as_object_mut().and_then(|o| o.remove("description"));
            let mut nullable = serde_json::Map::new();
            nullable.insert("anyOf".into(), json!([inner, {"type": "null"}]));
            if let Some(d) = description {
                nullable.insert("description".into(), d);
            }
            *prop = Value::Object(nullable);
        }
    }
    s["required"] = Value::Array(all);
    s["additionalProperties"] = json!(false);
    (s, true)
}

/// The string formats strict mode accepts; another `format` would have the request refused.
const STRICT_FORMATS: &[&str] = &["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"];

/// One property made fit for strict mode: a format it does not know is dropped (the stage's own
/// validation ignores formats, as the reference does), and an array without `items` gets the
/// strings the reference reads it as (strict mode needs `items`).
fn strict_keywords(prop: &mut Value) {
    let Some(p) = prop.as_object_mut() else { return };
    if p.get("format").and_then(Value::as_str).is_some_and(|f| !STRICT_FORMATS.contains(&f)) {
        p.remove("format");
    }
    if p.get("type").and_then(Value::as_str) == Some("array") {
        let items = p.entry("items").or_insert_with(|| json!({"type": "string"}));
        if items.get("format").and_then(Value::as_str).is_some_and(|f| !STRICT_FORMATS.contains(&f)) {
            items.as_object_mut().map(|o| o.remove("format"));
        }
    }
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    stream: bool,
    messages: [ChatMessage<'a>; 2],
    temperature: f64,
    max_completion_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'a str,
    strict: bool,
    schema: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a Value>,
}

#[derive(Deserialize)]
struct ChatResponse {
    id: Option<String>,
    model: Option<String>,
    choices: Vec<Choice>,
    usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Option<ReplyMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ReplyMessage {
    content: Option<String>,
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct TokenUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl Codec for OpenAi {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let response_format = call.schema.map(|schema| {
            let (s, strict) = wire_schema(schema);
            ResponseFormat {
                kind: "json_schema",
                json_schema: JsonSchemaFormat { name: &call.schema_name, strict, schema: s, description: schema.json.get("description") },
            }
        });
        let body = ChatRequest {
            model: &call.target.model,
            stream: false,
            messages: system_user_messages(call),
            temperature: call.tuning.temperature,
            max_completion_tokens: call.tuning.max_tokens,
            response_format,
        };
        let headers = bearer_headers(call);
        WireRequest { url: format!("{}/chat/completions", call.target.base_url), headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], _call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let reply: ChatResponse = parse_reply(self.kind(), body)?;
        let choice = reply.choices.into_iter().next().ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "openai reply has no choices"))?;
        let message = choice.message.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "openai reply has no message"))?;
        if let Some(refusal) = message.refusal {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("the model refused: {refusal}")));
        }
        match choice.finish_reason.as_deref() {
            Some("length") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (finish_reason: length)")),
            Some("content_filter") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was withheld by the content filter")),
            _ => {}
        }
        let text = message.content.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "openai reply has no message content"))?;
        let usage = reply.usage.map(|u| Usage { input_tokens: u.prompt_tokens, output_tokens: u.completion_tokens });
        Ok((text, ReplyMeta::new(usage, choice.finish_reason, reply.model, reply.id)))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::FlatSchema;

    #[test]
    fn strict_with_optional_properties_as_nullable() {
        let all = FlatSchema::from_json(&json!({"type": "object", "properties": {"a": {"type": "string", "$comment": "x"}}, "required": ["a"], "title": "T"}))
            .unwrap();
        let (s, strict) = wire_schema(WireSchema { json: all.source(), strict: true });
        assert!(strict);
        assert_eq!(s, json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}));
        let some = FlatSchema::from_json(&json!({"properties": {"a": {"type": "string"}, "b": {"type": "integer", "description": "n", "minimum": 1}, "c": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]})).unwrap();
        let (s, strict) = wire_schema(WireSchema { json: some.source(), strict: true });
        assert!(strict);
        assert_eq!(
            s,
            json!({"properties": {"a": {"type": "string"},
                                  "b": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "description": "n"},
                                  "c": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]}},
                   "required": ["a", "b", "c"], "type": "object", "additionalProperties": false})
        );
        // Formats strict mode refuses go, arrays get their items, `_private` properties go.
        let odd = FlatSchema::from_json(&json!({"properties": {"u": {"type": "string", "format": "uri"}, "d": {"type": "string", "format": "date"},
            "l": {"type": "array"}, "_x": {"type": "string"}}, "required": ["u", "d", "l"]}))
        .unwrap();
        let (s, _) = wire_schema(WireSchema { json: odd.source(), strict: true });
        assert_eq!(
            s["properties"],
            json!({"u": {"type": "string"}, "d": {"type": "string", "format": "date"}, "l": {"type": "array", "items": {"type": "string"}}})
        );
        assert_eq!(s["required"], json!(["u", "d", "l"]));
        // The decision's free-form `arguments` keeps it out of strict mode.
        let decision = crate::decision::DecisionSpec::new(vec!["kb".into()]);
        let (s, strict) = wire_schema(WireSchema { json: decision.schema(), strict: false });
        assert!(!strict);
        assert_eq!(s["required"], json!(["action"]));
        assert!(s.get("additionalProperties").is_none());
    }
}
