//! Gemini on Vertex AI (`POST {base}/v1beta1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent`),
//! as `ChatVertexAI` (langchain-google-vertexai 3.2, REST) calls it.
//!
//! The body is the Gemini API's ([`super::gemini`]), but structured output is a forced function
//! call, as `ChatVertexAI.with_structured_output` asks for it: the stage's schema as the one
//! function's `parameters` (Vertex's OpenAPI subset, types upper-case), `mode: ANY` with only
//! that function allowed; the answer is that call's `args`. The bearer token comes from the
//! service account ([`super::gcp_token`]).

use serde::Serialize;
use serde_json::Value;

use super::gemini::{Content, TextPart, read_reply};
use super::{CallSpec, Codec, HttpBackend, WireRequest, nested_error_code, retain_keywords};
use crate::llm::cloud::Cloud;
use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};
use crate::llm::{Llm, LlmError, ReasonClass, ReplyMeta};

/// ChatVertexAI's default `endpoint_version`.
pub const API_VERSION: &str = "v1beta1";

#[derive(Debug, Clone, Copy)]
pub struct Vertex;

/// The backend for a Vertex AI target, with its service account's token source.
pub fn backend(client: reqwest::Client, target: ProviderTarget, tuning: Tuning, max_reply_bytes: usize) -> Box<dyn Llm> {
    let tokens = match &target.cloud {
        Some(Cloud::Vertex { account, .. }) => Some(super::gcp_token::TokenSource::new(account.clone())),
        _ => None,
    };
    let backend = HttpBackend::new(client, Vertex, target, tuning).with_max_reply_bytes(max_reply_bytes);
    match tokens {
        Some(tokens) => Box::new(backend.with_auth(Box::new(tokens))),
        // Without an account (a target built by hand): no credential, as a custom endpoint may need none.
        None => Box::new(backend),
    }
}

/// The keywords Vertex's `Schema` (an OpenAPI 3.0 subset) takes.
const KEYWORDS: &[&str] =
    &["type", "format", "description", "enum", "items", "minItems", "maxItems", "minimum", "maximum", "properties", "required", "nullable"];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateRequest<'a> {
    contents: [Content<'a>; 1],
    generation_config: GenerationConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<[Tools<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    system_instruction: Content<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    temperature: f64,
    candidate_count: u32,
    max_output_tokens: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tools<'a> {
    function_declarations: [Function<'a>; 1],
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    function_calling_config: FunctionCalling<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FunctionCalling<'a> {
    mode: &'static str,
    allowed_function_names: [&'a str; 1],
}

/// A JSON schema as Vertex's `Schema`: the supported keywords, `type` upper-case (`OBJECT`), a
/// `["T", "null"]` type as `T` with `nullable: true`.
pub fn vertex_schema(schema: &Value) -> Value {
    let mut out = retain_keywords(schema, KEYWORDS);
    upper_types(&mut out);
    out
}

fn upper_types(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else { return };
    let types: Vec<String> = match map.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    if let Some(t) = types.iter().find(|t| *t != "null") {
        map.insert("type".into(), Value::String(t.to_ascii_uppercase()));
        if types.iter().any(|t| t == "null") {
            map.insert("nullable".into(), Value::Bool(true));
        }
    }
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        props.values_mut().for_each(upper_types);
    }
    if let Some(items) = map.get_mut("items") {
        upper_types(items);
    }
}

impl Codec for Vertex {
    fn kind(&self) -> ProviderKind {
        ProviderKind::VertexAi
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let tools = call.schema.map(|schema| {
            let description = schema.json.get("description").and_then(Value::as_str);
            [Tools { function_declarations: [Function { name: &call.schema_name, description, parameters: vertex_schema(schema.json) }] }]
        });
        let body = GenerateRequest {
            contents: [Content { role: "user", parts: [TextPart { text: call.user }] }],
            generation_config: GenerationConfig { temperature: call.tuning.temperature, candidate_count: 1, max_output_tokens: call.tuning.max_tokens },
            tool_config: tools
                .as_ref()
                .map(|_| ToolConfig { function_calling_config: FunctionCalling { mode: "ANY", allowed_function_names: [&call.schema_name] } }),
            tools,
            system_instruction: Content { role: "system", parts: [TextPart { text: call.system }] },
        };
        let (project, location) = match &call.target.cloud {
            Some(Cloud::Vertex { project, location, .. }) => (project.as_str(), location.as_str()),
            _ => ("-", "-"),
        };
        let url = format!(
            "{}/{API_VERSION}/projects/{project}/locations/{location}/publishers/google/models/{}:generateContent",
            call.target.base_url, call.target.model
        );
        WireRequest { url, headers: Vec::new(), body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let (parts, meta) = read_reply(self.kind(), body)?;
        let parts = parts.into_iter().filter(|p| !p.thought);
        if call.schema.is_some() {
            let args = parts.filter_map(|p| p.function_call).find(|f| f.name == call.schema_name).map(|f| f.args);
            return match args {
                Some(args) => Ok((args.to_string(), meta)),
                None => Err(LlmError::new(ReasonClass::ProviderError, format!("vertex reply has no `{}` functionCall part", call.schema_name))),
            };
        }
        Ok((parts.filter_map(|p| p.text).collect(), meta))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_goes_in_vertex_terms() {
        let schema = json!({"type": "object", "additionalProperties": false, "properties": {
            "a": {"type": ["string", "null"], "enum": ["x"], "title": "A"}, "b": {"type": "array", "items": {"type": "integer"}}}, "required": ["b"]});
        assert_eq!(
            vertex_schema(&schema),
            json!({"type": "OBJECT", "properties": {"a": {"type": "STRING", "nullable": true, "enum": ["x"]}, "b": {"type": "ARRAY", "items": {"type": "INTEGER"}}}, "required": ["b"]})
        );
    }
}
