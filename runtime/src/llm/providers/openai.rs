//! OpenAI Chat Completions (`POST {base}/chat/completions`), and any compatible server.
//!
//! Structured output goes as `response_format: json_schema` in strict mode, as LangChain asks
//! for a stage's Pydantic model: every property required, an optional one as
//! `anyOf: [its schema, {"type": "null"}]` (the model answers `null` where it has nothing, which
//! validation reads as absent), and `additionalProperties: false`. The decision goes with
//! `strict: false`: its free-form `arguments` object is what strict mode cannot take.
//!
//! The OpenAI-compatible family ([`super::compat`]) goes through the same codec, each provider
//! with its package's [`Dialect`]: a forced function tool instead of `response_format` for most
//! of them, `max_tokens`, extra headers and fields, Azure's deployment URL and `api-key`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::compat::{self, Auth, Dialect, Structured, TokenField};
use super::{CallSpec, ChatMessage, Codec, WireRequest, WireSchema, nested_error_code, parse_reply, retain_keywords, system_user_messages};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

/// OpenAI, or one of the compatible family with its package's dialect.
#[derive(Debug, Clone, Copy)]
pub struct OpenAi {
    kind: ProviderKind,
    dialect: Dialect,
}

impl OpenAi {
    /// The codec for `kind`: OpenAI's own dialect, or the family member's.
    pub fn new(kind: ProviderKind) -> OpenAi {
        let dialect = match kind {
            ProviderKind::Compat(c) => compat::dialect(c),
            _ => compat::OPENAI,
        };
        OpenAi { kind, dialect }
    }

    /// The codec for `kind` in `dialect` (a provider that wraps this codec: watsonx.ai).
    pub fn with_dialect(kind: ProviderKind, dialect: Dialect) -> OpenAi {
        OpenAi { kind, dialect }
    }

    pub(super) fn dialect(&self) -> Dialect {
        self.dialect
    }
}

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
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    messages: [ChatMessage<'a>; 2],
    temperature: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    n: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<[Tool<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: String,
    parameters: Value,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
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
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
}

#[derive(Deserialize)]
struct ToolCall {
    function: CalledFunction,
}

#[derive(Deserialize)]
struct CalledFunction {
    arguments: String,
}

#[derive(Deserialize)]
struct TokenUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl OpenAi {
    /// The structured part of the request: `response_format`, or a forced tool and its choice.
    fn structured<'a>(&self, call: &'a CallSpec<'a>, schema: WireSchema<'a>) -> (Option<ResponseFormat<'a>>, Option<[Tool<'a>; 1]>, Option<Value>) {
        let description = schema.json.get("description");
        match self.dialect.structured {
            Structured::StrictSchema => {
                let (s, strict) = wire_schema(schema);
                let format = JsonSchemaFormat { name: Some(&call.schema_name), strict: Some(strict), schema: s, description };
                (Some(ResponseFormat { kind: "json_schema", json_schema: format }), None, None)
            }
            Structured::PlainSchema { strict, closed } => {
                let mut s = wire_schema(WireSchema { strict: false, ..schema }).0;
                if closed {
                    s["additionalProperties"] = json!(false);
                }
                // Perplexity's package sends the schema alone, unnamed.
                let name = strict.map(|_| call.schema_name.as_str());
                let format = JsonSchemaFormat { name, strict, schema: s, description: None };
                (Some(ResponseFormat { kind: "json_schema", json_schema: format }), None, None)
            }
            Structured::ForcedTool { choice_any, .. } => {
                let mut parameters = wire_schema(WireSchema { strict: false, ..schema }).0;
                // The description goes on the function, as LangChain's convert_to_openai_tool puts it.
                let description = parameters.as_object_mut().and_then(|o| o.remove("description"));
                let description = description.as_ref().and_then(Value::as_str).map_or(String::new(), str::to_owned);
                let choice = if choice_any { json!("any") } else { json!({"type": "function", "function": {"name": call.schema_name}}) };
                let tool = Tool { kind: "function", function: Function { name: &call.schema_name, description, parameters } };
                (None, Some([tool]), Some(choice))
            }
        }
    }
}

impl Codec for OpenAi {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let d = self.dialect;
        let (response_format, tools, tool_choice) = call.schema.map_or((None, None, None), |schema| self.structured(call, schema));
        let parallel_tool_calls = matches!(d.structured, Structured::ForcedTool { parallel_false: true, .. }).then_some(false).filter(|_| tools.is_some());
        let limit = call.tuning.max_tokens;
        let body = ChatRequest {
            model: &call.target.model,
            stream: d.stream_field.then_some(false),
            messages: system_user_messages(call),
            temperature: call.tuning.temperature,
            max_completion_tokens: (d.tokens == TokenField::MaxCompletionTokens).then_some(limit),
            max_tokens: (d.tokens == TokenField::MaxTokens).then_some(limit),
            n: d.n.then_some(1),
            service_tier: d.service_tier,
            top_p: d.top_p.then_some(1),
            response_format,
            tools,
            tool_choice,
            parallel_tool_calls,
        };
        let mut headers: Vec<(&'static str, String)> = d.headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        if let Some(key) = &call.target.api_key {
            // Azure OpenAI takes its key as `api-key`, a Microsoft Entra token as a bearer.
            let entra = call.target.api_key_var.as_deref() == Some("AZURE_OPENAI_AD_TOKEN");
            match d.auth {
                Auth::ApiKeyHeader if !entra => headers.push(("api-key", key.expose().to_owned())),
                _ => headers.push(("authorization", format!("Bearer {}", key.expose()))),
            }
        }
        let base = &call.target.base_url;
        let url = match self.kind {
            // AzureChatOpenAI's URL: the deployment (the model string's name) and the API version.
            ProviderKind::Compat(crate::vocab::Compat::AzureOpenAi) => {
                format!("{base}/openai/deployments/{}/chat/completions?api-version={}", call.target.model, call.target.api_version)
            }
            _ => format!("{base}{}", d.path),
        };
        WireRequest { url, headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let key = self.kind.key();
        let reply: ChatResponse = parse_reply(self.kind, body)?;
        let choice = reply.choices.into_iter().next().ok_or_else(|| LlmError::new(ReasonClass::ProviderError, format!("{key} reply has no choices")))?;
        let message = choice.message.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, format!("{key} reply has no message")))?;
        if let Some(refusal) = message.refusal {
            return Err(LlmError::new(ReasonClass::ProviderError, format!("the model refused: {refusal}")).refusing(crate::llm::Refused::Content));
        }
        match choice.finish_reason.as_deref() {
            Some("length") => return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (finish_reason: length)")),
            Some("content_filter") => {
                return Err(LlmError::new(ReasonClass::ProviderError, "the reply was withheld by the content filter").refusing(crate::llm::Refused::Content));
            }
            _ => {}
        }
        let text = if matches!(self.dialect.structured, Structured::ForcedTool { .. }) && call.schema.is_some() {
            // The forced tool's arguments are the answer; without a call the model ignored the
            // tool (LangChain returns None then, a stage never goes on with nothing).
            let first = message.tool_calls.into_iter().next();
            first
                .map(|c| c.function.arguments)
                .ok_or_else(|| LlmError::new(ReasonClass::ProviderError, format!("{key} reply has no call of the forced tool")))?
        } else {
            let text = message.content.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, format!("{key} reply has no message content")))?;
            let structured = call.schema.is_some();
            if (self.dialect.reasoning_markdown && structured) || self.dialect.think_out_of_text { strip_think(&text) } else { text }
        };
        let usage = reply.usage.map(|u| Usage { input_tokens: u.prompt_tokens, output_tokens: u.completion_tokens });
        Ok((text, ReplyMeta::new(usage, choice.finish_reason, reply.model, reply.id)))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }

    fn streaming(&self) -> Option<&dyn super::streaming::StreamCodec> {
        Some(self)
    }
}

/// The text without its `<think>…</think>` blocks, as langchain-perplexity's `strip_think_tags`
/// removes them (each from an opening tag to the next closing one; an unclosed one stays).
fn strip_think(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<think>") {
        let Some(len) = rest[start..].find("</think>") else { break };
        out.push_str(&rest[..start]);
        rest = &rest[start + len + "</think>".len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::FlatSchema;

    #[test]
    fn think_blocks_go_as_perplexitys_parser_removes_them() {
        assert_eq!(strip_think("<think>\nhm\n</think>\n\n{\"a\": 1}"), "\n\n{\"a\": 1}");
        assert_eq!(strip_think("a<think>x</think>b<think>y</think>c"), "abc");
        assert_eq!(strip_think("a<think>never closed"), "a<think>never closed");
        assert_eq!(strip_think("no tags"), "no tags");
    }

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
