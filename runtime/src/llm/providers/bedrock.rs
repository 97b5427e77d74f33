//! Amazon Bedrock Converse (`POST {base}/model/{modelId}/converse`), for `bedrock_converse:` and
//! `bedrock:` alike.
//!
//! Structured output is one forced tool, as `ChatBedrockConverse` does it: the stage's schema as
//! the tool's `inputSchema.json`, `toolChoice: {tool: {name}}`; the answer is that tool's `input`.
//! Requests are signed with SigV4 ([`super::sigv4`]) or carry the Bedrock API key as a bearer
//! token. Errors name their code in the `x-amzn-ErrorType` header, not in the body.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallSpec, Codec, HttpBackend, WireRequest, bearer_headers, parse_reply};
use crate::llm::cloud::Cloud;
use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};
use crate::llm::{Llm, LlmError, ReasonClass, ReplyMeta, Usage};

/// The Converse codec; `kind` says which of the two keys it serves.
#[derive(Debug, Clone, Copy)]
pub struct Converse {
    pub kind: ProviderKind,
}

/// The backend for a Bedrock target: signed with its keys, or with the API key as a bearer token.
pub fn backend(client: reqwest::Client, target: ProviderTarget, tuning: Tuning, max_reply_bytes: usize) -> Box<dyn Llm> {
    let signer = match &target.cloud {
        Some(Cloud::Bedrock { region, keys: Some(keys), .. }) => Some(super::sigv4::SigV4::new(keys.clone(), region.clone())),
        _ => None,
    };
    let backend = HttpBackend::new(client, Converse { kind: target.provider }, target, tuning).with_max_reply_bytes(max_reply_bytes);
    match signer {
        Some(signer) => Box::new(backend.with_auth(Box::new(signer))),
        None => Box::new(backend),
    }
}

/// A model id in the URL path as botocore puts it there: every byte but the unreserved ones
/// percent-encoded (`anthropic.claude-v2:1` → `anthropic.claude-v2%3A1`; an ARN's `/` too).
pub fn path_segment(model: &str) -> String {
    let mut out = String::with_capacity(model.len());
    for b in model.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConverseRequest<'a> {
    messages: [Message<'a>; 1],
    system: [Text<'a>; 1],
    inference_config: InferenceConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: [Text<'a>; 1],
}

#[derive(Serialize)]
struct Text<'a> {
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig {
    max_tokens: u32,
    temperature: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    tools: [Tool<'a>; 1],
    tool_choice: ToolChoice<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tool<'a> {
    tool_spec: ToolSpec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolSpec<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: InputSchema<'a>,
}

#[derive(Serialize)]
struct InputSchema<'a> {
    json: &'a Value,
}

#[derive(Serialize)]
struct ToolChoice<'a> {
    tool: Named<'a>,
}

#[derive(Serialize)]
struct Named<'a> {
    name: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConverseResponse {
    output: Option<Output>,
    stop_reason: Option<String>,
    usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
struct Output {
    message: Option<ReplyMessage>,
}

#[derive(Deserialize)]
struct ReplyMessage {
    #[serde(default)]
    content: Vec<Block>,
}

/// A content block is an object with one key naming its kind; reasoning and other kinds are
/// skipped (their keys are not read).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Block {
    text: Option<String>,
    tool_use: Option<ToolUse>,
}

#[derive(Deserialize)]
struct ToolUse {
    name: String,
    input: Value,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct TokenUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_read_input_tokens: u64,
    cache_write_input_tokens: u64,
}

/// A schema's own description, or the reference's fixed text for one without.
fn description(schema: &Value) -> &str {
    schema.get("description").and_then(Value::as_str).unwrap_or("Reply with the result in this shape.")
}

impl Codec for Converse {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let tool_config = call.schema.map(|schema| ToolConfig {
            tools: [Tool {
                tool_spec: ToolSpec { name: &call.schema_name, description: description(schema.json), input_schema: InputSchema { json: schema.json } },
            }],
            tool_choice: ToolChoice { tool: Named { name: &call.schema_name } },
        });
        let body = ConverseRequest {
            messages: [Message { role: "user", content: [Text { text: call.user }] }],
            system: [Text { text: call.system }],
            inference_config: InferenceConfig { max_tokens: call.tuning.max_tokens, temperature: call.tuning.temperature },
            tool_config,
        };
        // With keys the request is signed later (the signature covers the final body); without,
        // the Bedrock API key goes as a bearer token.
        let signed = matches!(call.target.cloud, Some(Cloud::Bedrock { keys: Some(_), .. }));
        let headers = if signed { Vec::new() } else { bearer_headers(call) };
        let url = format!("{}/model/{}/converse", call.target.base_url, path_segment(&call.target.model));
        WireRequest { url, headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let reply: ConverseResponse = parse_reply(self.kind, body)?;
        let usage = reply.usage.map(|u| Usage {
            // Converse counts cached prompt tokens apart; they are prompt tokens all the same.
            input_tokens: u.input_tokens.saturating_add(u.cache_read_input_tokens).saturating_add(u.cache_write_input_tokens),
            output_tokens: u.output_tokens,
        });
        match reply.stop_reason.as_deref() {
            Some("max_tokens") => {
                return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (stopReason: max_tokens)"));
            }
            Some(r @ ("guardrail_intervened" | "content_filtered")) => {
                return Err(LlmError::new(ReasonClass::ProviderError, format!("bedrock withheld the reply ({r})")));
            }
            _ => {}
        }
        let meta = ReplyMeta::new(usage, reply.stop_reason, None, None);
        let blocks = reply.output.and_then(|o| o.message).map(|m| m.content).unwrap_or_default();
        if call.schema.is_some() {
            let input = blocks.into_iter().find_map(|b| b.tool_use.filter(|t| t.name == call.schema_name).map(|t| t.input));
            return match input {
                Some(input) => Ok((input.to_string(), meta)),
                None => Err(LlmError::new(ReasonClass::ProviderError, format!("bedrock reply has no `{}` toolUse block", call.schema_name))),
            };
        }
        Ok((blocks.into_iter().filter_map(|b| b.text).collect(), meta))
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        // Some gateways put it in the body as `__type` (the restJson1 protocol allows both).
        let v: Value = serde_json::from_slice(body).ok()?;
        v.get("__type").and_then(Value::as_str).and_then(error_type)
    }

    fn header_error_code(&self, headers: &reqwest::header::HeaderMap) -> Option<String> {
        headers.get("x-amzn-errortype").and_then(|v| v.to_str().ok()).and_then(error_type)
    }
}

/// `ThrottlingException:http://internal.amazon.com/coral/...` or `com.amazon...#ThrottlingException`:
/// `ThrottlingException`, when it is a short identifier.
pub(crate) fn error_type(raw: &str) -> Option<String> {
    let name = raw.split(':').next()?;
    let name = name.rsplit('#').next()?;
    ((1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_encoded_as_botocore_encodes_them() {
        assert_eq!(path_segment("anthropic.claude-3-5-haiku-20241022-v1:0"), "anthropic.claude-3-5-haiku-20241022-v1%3A0");
        assert_eq!(
            path_segment("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.x"),
            "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.x"
        );
    }

    #[test]
    fn the_error_type_is_read_from_either_form() {
        assert_eq!(error_type("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/").as_deref(), Some("ThrottlingException"));
        assert_eq!(error_type("com.amazon.coral.validate#ValidationException").as_deref(), Some("ValidationException"));
        assert_eq!(error_type("a message with the key AKIA in it"), None);
    }
}
