//! Gemini streaming (`:streamGenerateContent?alt=sse`): each SSE `data:` a `GenerateContentResponse`
//! with the next parts of the first candidate; the last names the finish reason and carries
//! `usageMetadata`. The stream has no end marker of its own: it ends with its body, and one that
//! ends before a finish reason (or a blocked prompt's feedback) was cut short.
//!
//! Shown as it comes: the text of the parts that are not thoughts (the reply's text, as read whole).

use serde::Deserialize;
use serde_json::{Value, json};

use super::gemini::Gemini;
use super::streaming::{Fold, StreamCodec, cut_short, parse_chunk, stream_error};
use super::{CallSpec, Codec, WireRequest, nested_error_code};
use crate::llm::LlmError;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    #[serde(default)]
    candidates: Vec<Candidate>,
    prompt_feedback: Option<Value>,
    usage_metadata: Option<Value>,
    model_version: Option<String>,
    response_id: Option<String>,
    error: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Value>,
}

#[derive(Debug, Default)]
struct GenerateFold {
    candidate: bool,
    parts: Option<Vec<Value>>,
    finish_reason: Option<String>,
    prompt_feedback: Option<Value>,
    usage: Option<Value>,
    model: Option<String>,
    id: Option<String>,
}

impl StreamCodec for Gemini {
    fn encode_stream(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut wire = self.encode(call);
        wire.url = wire.url.replacen(":generateContent", ":streamGenerateContent?alt=sse", 1);
        wire
    }

    fn fold(&self, _call: &CallSpec<'_>) -> Box<dyn Fold> {
        Box::new(GenerateFold::default())
    }
}

impl Fold for GenerateFold {
    fn event(&mut self, _name: &str, data: &str, show: &mut dyn FnMut(&str)) -> Result<bool, LlmError> {
        let key = crate::vocab::ProviderKind::Gemini.key();
        let chunk: Chunk = parse_chunk(key, data)?;
        if chunk.error.is_some() {
            return Err(stream_error(key, nested_error_code(data.as_bytes())));
        }
        self.prompt_feedback = chunk.prompt_feedback.or(self.prompt_feedback.take());
        self.usage = chunk.usage_metadata.or(self.usage.take());
        self.model = self.model.take().or(chunk.model_version);
        self.id = self.id.take().or(chunk.response_id);
        if let Some(candidate) = chunk.candidates.into_iter().next() {
            self.candidate = true;
            self.finish_reason = candidate.finish_reason.or(self.finish_reason.take());
            if let Some(content) = candidate.content {
                for part in &content.parts {
                    if part.get("thought").and_then(Value::as_bool) != Some(true)
                        && let Some(text) = part.get("text").and_then(Value::as_str)
                    {
                        show(text);
                    }
                }
                self.parts.get_or_insert_default().extend(content.parts);
            }
        }
        Ok(false)
    }

    fn finish(self: Box<Self>) -> Result<Value, LlmError> {
        let blocked = self.prompt_feedback.as_ref().is_some_and(|f| f.get("blockReason").is_some());
        if self.finish_reason.is_none() && !blocked {
            return Err(cut_short(crate::vocab::ProviderKind::Gemini.key()));
        }
        let content = self.parts.map(|parts| json!({"role": "model", "parts": parts}));
        let candidates = if self.candidate { vec![json!({"content": content, "finishReason": self.finish_reason})] } else { vec![] };
        Ok(
            json!({"candidates": candidates, "promptFeedback": self.prompt_feedback, "usageMetadata": self.usage, "modelVersion": self.model, "responseId": self.id}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ReasonClass;
    use crate::llm::model::ProviderKind;
    use crate::llm::providers::streaming::tests::{fold_decode, test_call, test_target};

    fn run(body: &str, size: usize) -> (String, Result<(String, crate::llm::ReplyMeta), LlmError>) {
        let t = test_target(ProviderKind::Gemini);
        let call = test_call(&t, None);
        assert!(Gemini.encode_stream(&call).url.ends_with("/v1/models/m:streamGenerateContent?alt=sse"));
        fold_decode(&Gemini, &call, body, size)
    }

    fn chunk(parts: Value, finish: Option<&str>) -> String {
        let mut c = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], "modelVersion": "gemini-x", "responseId": "r1"});
        if let Some(f) = finish {
            c["candidates"][0]["finishReason"] = json!(f);
            c["usageMetadata"] = json!({"promptTokenCount": 4, "candidatesTokenCount": 3, "thoughtsTokenCount": 2, "totalTokenCount": 9});
        }
        format!("data: {c}\r\n\r\n")
    }

    #[test]
    fn a_stream_decodes_as_the_same_reply_whole() {
        let body =
            [chunk(json!([{"text": "hm", "thought": true}]), None), chunk(json!([{"text": "Hel"}]), None), chunk(json!([{"text": "lo é"}]), Some("STOP"))]
                .concat();
        let whole = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "hm", "thought": true}, {"text": "Hello é"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 3, "thoughtsTokenCount": 2}, "modelVersion": "gemini-x", "responseId": "r1"});
        let t = test_target(ProviderKind::Gemini);
        let call = test_call(&t, None);
        let want = Gemini.decode(&serde_json::to_vec(&whole).unwrap(), &call).unwrap();
        for size in [1, 9, body.len()] {
            let (shown, got) = run(&body, size);
            assert_eq!((shown.as_str(), got.unwrap()), ("Hello é", want.clone()));
        }
    }

    #[test]
    fn hostile_streams_are_clear_errors() {
        let first = chunk(json!([{"text": "a"}]), None);
        assert_eq!(run(&first, 4).1.unwrap_err().class, ReasonClass::Connection, "no finish reason: cut");
        let mid = format!("{first}data: {{\"error\": {{\"code\": 503, \"message\": \"x\", \"status\": \"UNAVAILABLE\"}}}}\n\n");
        assert_eq!(run(&mid, 4).1.unwrap_err().class, ReasonClass::ServerError);
        assert_eq!(run(&format!("{first}data: {{\"candidates\": 7}}\n\n"), 4).1.unwrap_err().class, ReasonClass::ProviderError);
        assert!(run(&chunk(json!([{"text": "a"}]), Some("SAFETY")), 4).1.unwrap_err().message.contains("withheld"));
        let blocked = run("data: {\"promptFeedback\": {\"blockReason\": \"SAFETY\"}}\n\n", 4).1.unwrap_err();
        assert!(blocked.message.contains("no answer (SAFETY)"), "{blocked}");
    }
}
