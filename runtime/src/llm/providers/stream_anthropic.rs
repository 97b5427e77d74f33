//! Anthropic Messages streaming (`"stream": true`): SSE `message_start`, then per content block
//! `content_block_start`, `content_block_delta`s (`text_delta`, or `input_json_delta` for a tool's
//! input) and `content_block_stop`, then `message_delta` (stop reason, output tokens) and
//! `message_stop`; `ping`s between, and an `error` event instead of the rest when it fails.
//!
//! Shown as it comes: the text of a plain text call; for a structured call (the forced tool),
//! the tool's input, re-written as it comes into the compact JSON the reply is read as whole
//! ([`CompactJson`]), so that the pieces join into the reply as journalled. A text block before
//! the tool call is not the answer: it is not shown.

use serde::Deserialize;
use serde_json::{Value, json};

use super::anthropic::Anthropic;
use super::stream_json::CompactJson;
use super::streaming::{Fold, StreamCodec, cut_short, parse_chunk, stream_error};
use super::{CallSpec, Codec, nested_error_code};
use crate::llm::{LlmError, ReasonClass};

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: Start,
    },
    ContentBlockStart {
        index: usize,
        content_block: BlockStart,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Option<DeltaUsage>,
    },
    MessageStop {},
    Error {},
    /// `ping`, and what a newer API version adds.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Start {
    id: Option<String>,
    model: Option<String>,
    usage: Option<DeltaUsage>,
}

#[derive(Deserialize)]
struct BlockStart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: String,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// One content block as it is read: its type, its text (a tool's input: its JSON text).
#[derive(Debug)]
struct Block {
    kind: String,
    name: Option<String>,
    text: String,
}

#[derive(Debug)]
struct MessagesFold {
    key: &'static str,
    show_text: bool,
    /// The forced tool's name, for a structured call.
    tool: Option<String>,
    /// The block of the forced tool's call being shown, and its input re-written.
    shown_tool: Option<(usize, CompactJson)>,
    id: Option<String>,
    model: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    stop_reason: Option<String>,
    blocks: Vec<Block>,
    done: bool,
}

impl StreamCodec for Anthropic {
    fn fold(&self, call: &CallSpec<'_>) -> Box<dyn Fold> {
        Box::new(MessagesFold {
            key: self.kind().key(),
            show_text: call.schema.is_none(),
            tool: call.schema.map(|_| call.schema_name.clone()),
            shown_tool: None,
            id: None,
            model: None,
            input_tokens: None,
            output_tokens: None,
            stop_reason: None,
            blocks: Vec::new(),
            done: false,
        })
    }
}

fn never_started(key: &str, index: usize) -> LlmError {
    LlmError::new(ReasonClass::ProviderError, format!("{key} stream: a delta of content block {index}, never started"))
}

impl Fold for MessagesFold {
    fn event(&mut self, _name: &str, data: &str, show: &mut dyn FnMut(&str)) -> Result<bool, LlmError> {
        match parse_chunk::<Event>(self.key, data)? {
            Event::MessageStart { message } => {
                (self.id, self.model) = (message.id, message.model);
                if let Some(u) = message.usage {
                    (self.input_tokens, self.output_tokens) = (u.input_tokens, u.output_tokens);
                }
            }
            Event::ContentBlockStart { index, content_block: b } => {
                if index != self.blocks.len() {
                    return Err(LlmError::new(ReasonClass::ProviderError, format!("{} stream: content block {index} out of order", self.key)));
                }
                if self.show_text && b.kind == "text" {
                    show(&b.text);
                }
                // The first call of the forced tool is the answer, as read whole.
                if b.kind == "tool_use" && self.shown_tool.is_none() && self.tool.is_some() && b.name == self.tool {
                    self.shown_tool = Some((index, CompactJson::default()));
                }
                self.blocks.push(Block { kind: b.kind, name: b.name, text: b.text });
            }
            Event::ContentBlockDelta { index, delta } => {
                let show_text = self.show_text;
                let block = self.blocks.get_mut(index).ok_or_else(|| never_started(self.key, index))?;
                match delta {
                    BlockDelta::TextDelta { text } => {
                        if show_text && block.kind == "text" {
                            show(&text);
                        }
                        block.text.push_str(&text);
                    }
                    BlockDelta::InputJsonDelta { partial_json } => {
                        if let Some((_, json)) = self.shown_tool.as_mut().filter(|(i, _)| *i == index) {
                            show(&json.feed(&partial_json));
                        }
                        block.text.push_str(&partial_json);
                    }
                    BlockDelta::Other => {}
                }
            }
            Event::ContentBlockStop { index } => {
                if let Some((_, json)) = self.shown_tool.as_mut().filter(|(i, _)| *i == index) {
                    show(&json.end());
                }
            }
            Event::MessageDelta { delta, usage } => {
                self.stop_reason = delta.stop_reason.or(self.stop_reason.take());
                if let Some(u) = usage {
                    self.input_tokens = u.input_tokens.or(self.input_tokens);
                    self.output_tokens = u.output_tokens.or(self.output_tokens);
                }
            }
            Event::MessageStop {} => {
                self.done = true;
                return Ok(true);
            }
            Event::Error {} => return Err(stream_error(self.key, nested_error_code(data.as_bytes()))),
            Event::Other => {}
        }
        Ok(false)
    }

    fn finish(self: Box<Self>) -> Result<Value, LlmError> {
        if !self.done {
            return Err(cut_short(self.key));
        }
        let key = self.key;
        let mut content = Vec::with_capacity(self.blocks.len());
        for b in self.blocks {
            content.push(match b.kind.as_str() {
                "text" => json!({"type": "text", "text": b.text}),
                "tool_use" => {
                    // No delta: an empty input, as the API's own accumulation reads it.
                    let input: Value = if b.text.trim().is_empty() { json!({}) } else { parse_chunk(key, &b.text)? };
                    json!({"type": "tool_use", "name": b.name, "input": input})
                }
                other => json!({"type": other}),
            });
        }
        let usage = self.input_tokens.zip(self.output_tokens).map(|(i, o)| json!({"input_tokens": i, "output_tokens": o}));
        Ok(json!({"id": self.id, "model": self.model, "content": content, "stop_reason": self.stop_reason, "usage": usage}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::model::ProviderKind;
    use crate::llm::providers::streaming::tests::{fold_decode, test_call, test_target};

    fn sse(events: &[Value]) -> String {
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect()
    }

    fn start() -> Value {
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null, "usage": {"input_tokens": 12, "output_tokens": 1}}})
    }

    fn end(stop: &str) -> [Value; 2] {
        [
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 7}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn text_streams_and_decodes_as_the_same_reply_whole() {
        let t = test_target(ProviderKind::Anthropic);
        let call = test_call(&t, None);
        let mut events =
            vec![start(), json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}), json!({"type": "ping"})];
        for piece in ["Hel", "lo ", "é"] {
            events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}));
        }
        events.push(json!({"type": "content_block_stop", "index": 0}));
        events.extend(end("end_turn"));
        let whole = json!({"id": "msg_1", "model": "claude-x", "content": [{"type": "text", "text": "Hello é"}], "stop_reason": "end_turn", "usage": {"input_tokens": 12, "output_tokens": 7}});
        let want = Anthropic.decode(&serde_json::to_vec(&whole).unwrap(), &call).unwrap();
        for size in [1, 10, 4096] {
            let (shown, got) = fold_decode(&Anthropic, &call, &sse(&events), size);
            assert_eq!((shown.as_str(), got.unwrap()), ("Hello é", want.clone()));
        }
        assert_eq!(Anthropic.encode_stream(&call).body["stream"], json!(true));
    }

    #[test]
    fn a_tool_input_is_shown_as_the_compact_json_read_whole() {
        let t = test_target(ProviderKind::Anthropic);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let call = test_call(&t, Some(&schema));
        let mut events = vec![
            start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Let me"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " answer."}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "x", "input": {}}}),
        ];
        for piece in ["{\"a\"", ": 1", "0 }"] {
            events.push(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": piece}}));
        }
        events.push(json!({"type": "content_block_stop", "index": 1}));
        events.extend(end("tool_use"));
        let (shown, got) = fold_decode(&Anthropic, &call, &sse(&events), 7);
        assert_eq!((shown.as_str(), got.unwrap().0.as_str()), ("{\"a\":10}", "{\"a\":10}"));
    }

    #[test]
    fn hostile_streams_are_clear_errors() {
        let t = test_target(ProviderKind::Anthropic);
        let call = test_call(&t, None);
        let text = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "a"}});
        let err = |events: &[Value]| fold_decode(&Anthropic, &call, &sse(events), 5).1.unwrap_err();
        let overloaded = err(&[start(), text.clone(), json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded sk-ant-secret"}})]);
        assert_eq!(overloaded.class, ReasonClass::ServerError);
        assert!(overloaded.message.contains("overloaded_error") && !overloaded.message.contains("sk-ant"), "{overloaded}");
        assert_eq!(err(&[start(), text.clone()]).class, ReasonClass::Connection, "no message_stop");
        let [delta, stop] = end("max_tokens");
        assert!(err(&[start(), text.clone(), delta, stop]).message.contains("output token limit"));
        let stray = json!({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}});
        assert_eq!(err(&[start(), stray]).class, ReasonClass::ProviderError);
        let (_, bad) = fold_decode(&Anthropic, &call, "event: message_start\ndata: {\"type\": \"message_start\", \"message\": [}\n\n", 4);
        assert_eq!(bad.unwrap_err().class, ReasonClass::ProviderError);
    }
}
