//! Ollama streaming (`/api/chat` with `"stream": true`): one JSON object a line
//! (`application/x-ndjson`), each with the next piece of `message.content`; the last has
//! `done: true`, the done reason and the token counts. A failure mid-stream is a last line
//! `{"error": "..."}` (its text may quote the prompt: it goes nowhere).
//!
//! Shown as it comes: `message.content` (a thinking model's `message.thinking` is not the reply).

use serde::Deserialize;
use serde_json::{Value, json};

use super::CallSpec;
use super::ollama::Ollama;
use super::streaming::{Fold, Framing, StreamCodec, cut_short, parse_chunk};
use crate::llm::{LlmError, ReasonClass};

#[derive(Deserialize)]
struct Line {
    model: Option<String>,
    message: Option<Message>,
    error: Option<Value>,
    #[serde(default)]
    done: bool,
    done_reason: Option<String>,
    prompt_eval_count: Option<u64>,
    eval_count: Option<u64>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: String,
}

#[derive(Debug, Default)]
struct ChatFold {
    model: Option<String>,
    content: Option<String>,
    done: Option<Value>,
}

impl StreamCodec for Ollama {
    fn framing(&self) -> Framing {
        Framing::Ndjson
    }

    fn fold(&self, _call: &CallSpec<'_>) -> Box<dyn Fold> {
        Box::new(ChatFold::default())
    }
}

impl Fold for ChatFold {
    fn event(&mut self, _name: &str, data: &str, show: &mut dyn FnMut(&str)) -> Result<bool, LlmError> {
        let line: Line = parse_chunk(crate::vocab::ProviderKind::Ollama.key(), data)?;
        if line.error.is_some() {
            return Err(LlmError::new(ReasonClass::ProviderError, "ollama's stream ended with an error instead of the rest of the reply"));
        }
        self.model = self.model.take().or(line.model);
        if let Some(m) = line.message {
            show(&m.content);
            self.content.get_or_insert_default().push_str(&m.content);
        }
        if line.done {
            self.done = Some(json!({"done_reason": line.done_reason, "prompt_eval_count": line.prompt_eval_count, "eval_count": line.eval_count}));
        }
        Ok(line.done)
    }

    fn finish(self: Box<Self>) -> Result<Value, LlmError> {
        let Some(mut whole) = self.done else { return Err(cut_short(crate::vocab::ProviderKind::Ollama.key())) };
        whole["model"] = json!(self.model);
        whole["message"] = match self.content {
            Some(content) => json!({"role": "assistant", "content": content}),
            None => Value::Null,
        };
        Ok(whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::model::ProviderKind;
    use crate::llm::providers::Codec;
    use crate::llm::providers::streaming::tests::{fold_decode, test_call, test_target};

    fn run(body: &str, size: usize) -> (String, Result<(String, crate::llm::ReplyMeta), LlmError>) {
        let t = test_target(ProviderKind::Ollama);
        let call = test_call(&t, None);
        assert_eq!(Ollama.encode_stream(&call).body["stream"], json!(true));
        fold_decode(&Ollama, &call, body, size)
    }

    const STREAM: &str = concat!(
        "{\"model\":\"q\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"done\":false}\n",
        "{\"model\":\"q\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"lo é\"},\"done\":false}\n",
        "{\"model\":\"q\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":4,\"eval_count\":2}\n",
    );

    #[test]
    fn a_stream_decodes_as_the_same_reply_whole() {
        let t = test_target(ProviderKind::Ollama);
        let call = test_call(&t, None);
        let whole = json!({"model": "q", "message": {"role": "assistant", "content": "Hello é"}, "done": true, "done_reason": "stop", "prompt_eval_count": 4, "eval_count": 2});
        let want = Ollama.decode(&serde_json::to_vec(&whole).unwrap(), &call).unwrap();
        for size in [1, 11, STREAM.len()] {
            let (shown, got) = run(STREAM, size);
            assert_eq!((shown.as_str(), got.unwrap()), ("Hello é", want.clone()));
        }
    }

    #[test]
    fn hostile_streams_are_clear_errors() {
        let two = &STREAM[..STREAM.rfind("{\"model").unwrap()];
        assert_eq!(run(two, 5).1.unwrap_err().class, ReasonClass::Connection, "no done line");
        let error = run(&format!("{two}{{\"error\":\"out of memory near the prompt text\"}}\n"), 5).1.unwrap_err();
        assert_eq!(error.class, ReasonClass::ProviderError);
        assert!(!error.message.contains("prompt text"), "{error}");
        assert_eq!(run(&format!("{two}{{not json\n"), 5).1.unwrap_err().class, ReasonClass::ProviderError);
        let cut = run(&STREAM.replace("\"stop\"", "\"length\""), 5).1.unwrap_err();
        assert!(cut.message.contains("output token limit"), "{cut}");
    }
}
