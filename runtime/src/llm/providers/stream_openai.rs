//! Chat Completions streaming (`"stream": true, "stream_options": {"include_usage": true}`), for
//! OpenAI and every member of the compatible family on the OpenAI codec: SSE `data:` chunks with
//! `choices[0].delta`, the usage in a last chunk without choices, then `data: [DONE]`.
//!
//! Shown as it comes: the message's `content`, or for a dialect that answers a schema through a
//! forced tool, that tool call's `arguments` (the text the stage's value is read from). Not shown:
//! a refusal, and the text of a dialect whose reply loses its `<think>` blocks before it is
//! read (the pieces would not join into the reply as journalled; it comes whole at the end).

use serde::Deserialize;
use serde_json::{Value, json};

use super::compat::Structured;
use super::openai::OpenAi;
use super::streaming::{Fold, StreamCodec, cut_short, parse_chunk, stream_error};
use super::{CallSpec, Codec, WireRequest, nested_error_code};
use crate::llm::LlmError;

#[derive(Deserialize)]
struct Chunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    usage: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u32,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolDelta>,
}

#[derive(Deserialize)]
struct ToolDelta {
    #[serde(default)]
    index: u32,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    arguments: Option<String>,
}

/// What is shown as it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Show {
    Content,
    ToolArguments,
    Nothing,
}

#[derive(Debug)]
struct ChatFold {
    key: &'static str,
    show: Show,
    id: Option<String>,
    model: Option<String>,
    /// Whether any chunk had a choice (a reply without one is an error, as whole).
    choice: bool,
    content: Option<String>,
    refusal: Option<String>,
    arguments: Option<String>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// `data: [DONE]` came.
    done: bool,
}

impl StreamCodec for OpenAi {
    fn encode_stream(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut wire = self.encode(call);
        wire.body["stream"] = json!(true);
        wire.body["stream_options"] = json!({"include_usage": true});
        wire
    }

    fn fold(&self, call: &CallSpec<'_>) -> Box<dyn Fold> {
        let d = self.dialect();
        let structured = call.schema.is_some();
        let show = if structured && matches!(d.structured, Structured::ForcedTool { .. }) {
            Show::ToolArguments
        } else if (d.reasoning_markdown && structured) || d.think_out_of_text {
            Show::Nothing
        } else {
            Show::Content
        };
        Box::new(ChatFold {
            key: self.kind().key(),
            show,
            id: None,
            model: None,
            choice: false,
            content: None,
            refusal: None,
            arguments: None,
            finish_reason: None,
            usage: None,
            done: false,
        })
    }
}

/// Appends a piece to an accumulated text.
fn append(to: &mut Option<String>, piece: &str) {
    to.get_or_insert_with(String::new).push_str(piece);
}

impl Fold for ChatFold {
    fn event(&mut self, _name: &str, data: &str, show: &mut dyn FnMut(&str)) -> Result<bool, LlmError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        let chunk: Chunk = parse_chunk(self.key, data)?;
        if chunk.error.is_some() {
            return Err(stream_error(self.key, nested_error_code(data.as_bytes())));
        }
        self.id = self.id.take().or(chunk.id);
        self.model = self.model.take().or(chunk.model);
        if let Some(usage) = chunk.usage.filter(|u| !u.is_null()) {
            self.usage = Some(usage);
        }
        // One answer is asked for (`n` is 1): the first choice.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            self.choice = true;
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(text) = delta.content {
                if self.show == Show::Content {
                    show(&text);
                }
                append(&mut self.content, &text);
            }
            if let Some(text) = delta.refusal {
                append(&mut self.refusal, &text);
            }
            for call in delta.tool_calls.into_iter().filter(|t| t.index == 0) {
                let text = call.function.and_then(|f| f.arguments).unwrap_or_default();
                if self.show == Show::ToolArguments {
                    show(&text);
                }
                append(&mut self.arguments, &text);
            }
        }
        Ok(false)
    }

    fn finish(self: Box<Self>) -> Result<Value, LlmError> {
        if !self.done {
            return Err(cut_short(self.key));
        }
        let finish_reason = self.finish_reason;
        let tool_calls: Vec<Value> = self.arguments.into_iter().map(|a| json!({"function": {"arguments": a}})).collect();
        let message = json!({"content": self.content, "refusal": self.refusal, "tool_calls": tool_calls});
        let choices = if self.choice { vec![json!({"message": message, "finish_reason": finish_reason})] } else { vec![] };
        Ok(json!({"id": self.id, "model": self.model, "choices": choices, "usage": self.usage}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ReasonClass;
    use crate::llm::model::ProviderKind;
    use crate::llm::providers::streaming::tests::{fold_decode, test_call, test_target};

    const STREAM: &str = concat!(
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo é\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn a_stream_decodes_as_the_same_reply_whole() {
        let t = test_target(ProviderKind::OpenAi);
        let codec = OpenAi::new(ProviderKind::OpenAi);
        let call = test_call(&t, None);
        let whole = json!({"id": "c1", "model": "gpt-x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello é"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}});
        let want = codec.decode(&serde_json::to_vec(&whole).unwrap(), &call).unwrap();
        for size in [1, 7, STREAM.len()] {
            let (shown, got) = fold_decode(&codec, &call, STREAM, size);
            assert_eq!(got.unwrap(), want);
            assert_eq!(shown, "Hello é");
        }
        let wire = codec.encode_stream(&call);
        assert_eq!((wire.body["stream"].clone(), wire.body["stream_options"].clone()), (json!(true), json!({"include_usage": true})));
    }

    #[test]
    fn a_forced_tool_shows_its_arguments() {
        let kind = ProviderKind::Compat(crate::vocab::Compat::Groq);
        let t = test_target(kind);
        let codec = OpenAi::new(kind);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let call = test_call(&t, Some(&schema));
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"t\",\"function\":{\"name\":\"x\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\": \"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
        );
        let (shown, got) = fold_decode(&codec, &call, body, 5);
        assert_eq!((shown.as_str(), got.unwrap().0.as_str()), ("{\"a\": 1}", "{\"a\": 1}"));
    }

    #[test]
    fn hostile_streams_are_clear_errors() {
        let t = test_target(ProviderKind::OpenAi);
        let codec = OpenAi::new(ProviderKind::OpenAi);
        let call = test_call(&t, None);
        let class = |body: &str| fold_decode(&codec, &call, body, 3).1.unwrap_err();
        let cut = class(&STREAM[..STREAM.find("data: [DONE]").unwrap()]);
        assert_eq!(cut.class, ReasonClass::Connection, "{cut}");
        assert!(cut.message.contains("ended before its last event"), "{cut}");
        let bad = class("data: {\"choices\": [oops\n\n");
        assert_eq!(bad.class, ReasonClass::ProviderError);
        let mid = class(&format!(
            "{}data: {{\"error\": {{\"message\": \"key sk-secret\", \"type\": \"server_error\"}}}}\n\n",
            &STREAM[..STREAM.find("\n\n").unwrap() + 2]
        ));
        assert_eq!(mid.class, ReasonClass::ServerError);
        assert!(!mid.message.contains("sk-secret"), "{mid}");
        let cut_at_length = class("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n");
        assert!(cut_at_length.message.contains("output token limit"), "{cut_at_length}");
        let refused = class("data: {\"choices\":[{\"index\":0,\"delta\":{\"refusal\":\"no\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        assert!(refused.message.contains("refused"), "{refused}");
    }
}
