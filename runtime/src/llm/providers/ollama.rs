//! Ollama's native `POST /api/chat`, non-streaming.
//!
//! The schema goes as `format` unchanged (Ollama turns it into a grammar); the output limit as
//! `options.num_predict`, the temperature as `options.temperature`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallSpec, ChatMessage, Codec, WireRequest, bearer_headers, parse_reply, system_user_messages};
use crate::llm::model::ProviderKind;
use crate::llm::{LlmError, ReasonClass, ReplyMeta, Usage};

#[derive(Debug, Clone, Copy)]
pub struct Ollama;

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    stream: bool,
    messages: [ChatMessage<'a>; 2],
    options: Options,
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<&'a Value>,
}

#[derive(Serialize)]
struct Options {
    temperature: f64,
    num_predict: u32,
}

#[derive(Deserialize)]
struct ChatResponse {
    model: Option<String>,
    message: Option<ReplyMessage>,
    error: Option<String>,
    done_reason: Option<String>,
    prompt_eval_count: Option<u64>,
    eval_count: Option<u64>,
}

#[derive(Deserialize)]
struct ReplyMessage {
    content: String,
}

impl Codec for Ollama {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Ollama
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let body = ChatRequest {
            model: &call.target.model,
            stream: false,
            messages: system_user_messages(call),
            options: Options { temperature: call.tuning.temperature, num_predict: call.tuning.max_tokens },
            format: call.schema.map(|s| s.json),
        };
        let headers = bearer_headers(call);
        WireRequest { url: format!("{}/api/chat", call.target.base_url), headers, body: serde_json::to_value(body).unwrap_or_default() }
    }

    fn decode(&self, body: &[u8], _call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        let reply: ChatResponse = parse_reply(self.kind(), body)?;
        if let Some(e) = reply.error {
            // Its text may quote the prompt: say only that it came.
            let _ = e;
            return Err(LlmError::new(ReasonClass::ProviderError, "ollama answered with an error instead of a reply"));
        }
        if reply.done_reason.as_deref() == Some("length") {
            return Err(LlmError::new(ReasonClass::ProviderError, "the reply was cut at the output token limit (done_reason: length)"));
        }
        let text = reply.message.ok_or_else(|| LlmError::new(ReasonClass::ProviderError, "ollama reply has no message"))?.content;
        let usage = reply.prompt_eval_count.zip(reply.eval_count).map(|(input_tokens, output_tokens)| Usage { input_tokens, output_tokens });
        // Ollama has no response id.
        Ok((text, ReplyMeta::new(usage, reply.done_reason, reply.model, None)))
    }

    fn error_code(&self, _body: &[u8]) -> Option<String> {
        // Ollama's errors are free text (`{"error": "model 'x' not found"}`): nothing to keep.
        None
    }
    fn streaming(&self) -> Option<&dyn super::streaming::StreamCodec> {
        Some(self)
    }
}
