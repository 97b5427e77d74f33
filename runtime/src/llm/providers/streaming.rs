//! Streaming replies (issue 48): the executor's incremental read of a provider's streaming body.
//!
//! A codec that can stream says so with [`super::Codec::streaming`]: a [`StreamCodec`] encodes the
//! streaming request and gives one [`Fold`] per call, which reads the stream's events one by one,
//! shows the reply's text as it comes, and in the end rebuilds the reply in the shape of the
//! provider's *non-streaming* reply. The codec's own `decode` then reads that as it reads a whole
//! reply: the text, usage, finish reason, model and id (and every check on them) are the same
//! whether the reply came whole or in pieces, and so is what the journal keeps.
//!
//! This module owns what every stream shares: framing (SSE or NDJSON), the byte cap over the
//! whole stream (`FABRIC_LLM_MAX_REPLY_BYTES`), the idle timeout between two reads
//! (`FABRIC_LLM_STREAM_IDLE_S`; the call timeout applies over the whole stream too), and the
//! mapping of a broken stream to a [`ReasonClass`].
//!
//! SSE is parsed here rather than with a crate: crates.md lists none, `eventsource-stream` (the
//! common one) had its last release in February 2022 and works on a `Stream` of bytes (reqwest's
//! `stream` feature, which the workspace does not enable), and its buffer of an unfinished line
//! has no bound of its own. What the providers send is a subset of the format (`event:`,
//! `data:`, comments, blank-line dispatch) that [`Lines`] reads in a few dozen lines under the
//! same byte cap as everything else; the unit tests below cut canned streams at every byte.

use std::time::Duration;

use serde_json::Value;

use super::{CallSpec, Codec, WireRequest, transport_error};
use crate::llm::stream::Deltas;
use crate::llm::{LlmError, ReasonClass};

/// The longest a stream may send nothing before the call fails with `timeout`
/// (`FABRIC_LLM_STREAM_IDLE_S`). Generous: a reasoning model or a long prompt on a local server
/// may think for a minute before its first piece; the call timeout still bounds the whole call.
pub const DEFAULT_STREAM_IDLE: Duration = Duration::from_secs(120);

/// What a provider's reply may cost: its size (`FABRIC_LLM_MAX_REPLY_BYTES`) and, streamed, how
/// long it may send nothing (`FABRIC_LLM_STREAM_IDLE_S`). A byte count alone means the default
/// idle timeout.
#[derive(Debug, Clone, Copy)]
pub struct ReplyLimits {
    pub max_bytes: usize,
    pub stream_idle: Duration,
}

impl From<usize> for ReplyLimits {
    fn from(max_bytes: usize) -> ReplyLimits {
        ReplyLimits { max_bytes, stream_idle: DEFAULT_STREAM_IDLE }
    }
}

/// How a provider frames its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events: `event:` and `data:` lines, an event ending at a blank line.
    Sse,
    /// One JSON document a line (Ollama's `application/x-ndjson`).
    Ndjson,
}

/// A codec's streaming half.
pub trait StreamCodec: Codec {
    /// SSE, unless the provider says otherwise.
    fn framing(&self) -> Framing {
        Framing::Sse
    }
    /// The streaming request: the whole request's with the provider's streaming switches (by
    /// default `"stream": true` in the body).
    fn encode_stream(&self, call: &CallSpec<'_>) -> WireRequest {
        let mut wire = self.encode(call);
        wire.body["stream"] = Value::Bool(true);
        wire
    }
    /// The fold of one call's stream.
    fn fold(&self, call: &CallSpec<'_>) -> Box<dyn Fold>;
}

/// One call's stream, read event by event.
pub trait Fold: Send {
    /// One event: its SSE `event:` name (empty for an unnamed event or an NDJSON line) and its
    /// data. The reply's text, as it comes, goes to `show`. `Ok(true)`: the stream's last event.
    fn event(&mut self, name: &str, data: &str, show: &mut dyn FnMut(&str)) -> Result<bool, LlmError>;
    /// The reply in the shape of the provider's non-streaming reply, for the codec's `decode`;
    /// an error when the stream ended before its last event.
    fn finish(self: Box<Self>) -> Result<Value, LlmError>;
}

/// The limits of one streaming read.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    pub max_bytes: usize,
    pub idle: Duration,
    /// The call timeout (for its message: reqwest enforces it over the whole body).
    pub timeout: Duration,
}

/// A chunk's JSON that does not parse: the same class and wording as a whole reply that does not.
pub(crate) fn parse_chunk<T: serde::de::DeserializeOwned>(key: &str, data: &str) -> Result<T, LlmError> {
    serde_json::from_str(data).map_err(|e| LlmError::new(ReasonClass::ProviderError, format!("{key} stream chunk is not what its API documents: {e}")))
}

/// A stream that stopped before its last event: as a body cut by the connection (retryable).
pub(crate) fn cut_short(key: &str) -> LlmError {
    LlmError::new(ReasonClass::Connection, format!("the {key} stream ended before its last event"))
}

/// An error event in the middle of a stream (after a 2xx status): its class from the provider's
/// code, as the same error would have had as a status (overloaded: `server_error`, rate limit:
/// `rate_limited`); of its body only that code is kept, as of an error body.
pub(crate) fn stream_error(key: &str, code: Option<String>) -> LlmError {
    let class = match code.as_deref() {
        Some(c) if c.contains("rate_limit") || c == "RESOURCE_EXHAUSTED" => ReasonClass::RateLimited,
        Some("overloaded_error" | "api_error" | "server_error" | "internal_server_error" | "UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED") => {
            ReasonClass::ServerError
        }
        _ => ReasonClass::ProviderError,
    };
    let code = code.map_or(String::new(), |c| format!(" ({c})"));
    LlmError::new(class, format!("the {key} stream ended with an error{code}"))
}

/// Reads a 2xx streaming body to its end: each event to the fold, the text it shows to
/// `deltas`. Returns the reply rebuilt whole (see [`Fold::finish`]).
pub(super) async fn read(
    response: &mut reqwest::Response,
    fold: Box<dyn Fold>,
    framing: Framing,
    limits: StreamLimits,
    deltas: &Deltas<'_>,
) -> Result<Value, LlmError> {
    let mut fold = fold;
    let mut lines = Lines::default();
    let mut event = Event::default();
    let mut read = 0usize;
    let mut show = |text: &str| deltas.push(text);
    loop {
        let chunk = next_chunk(response, &limits, deltas).await?;
        let Some(chunk) = chunk else { break };
        read += chunk.len();
        if read > limits.max_bytes {
            let why = format!("the reply is larger than the {}-byte limit (FABRIC_LLM_MAX_REPLY_BYTES); nothing past the limit was read", limits.max_bytes);
            return Err(LlmError::new(ReasonClass::ProviderError, why));
        }
        lines.feed(&chunk);
        while let Some(line) = lines.next_line()? {
            if let Some((name, data)) = event.line(framing, &line)
                && fold.event(&name, &data, &mut show)?
            {
                return fold.finish();
            }
        }
    }
    // The end of the body: a last line without its newline, an event without its blank line.
    if let Some(line) = lines.rest()?
        && let Some((name, data)) = event.line(framing, &line)
        && fold.event(&name, &data, &mut show)?
    {
        return fold.finish();
    }
    if let Some((name, data)) = event.take()
        && fold.event(&name, &data, &mut show)?
    {
        return fold.finish();
    }
    fold.finish()
}

/// The body's next chunk (`None` at its end), within the idle timeout; while it waits, the text
/// that waits in `deltas` is sent once it is due (a model that pauses mid-sentence still shows
/// what it wrote).
async fn next_chunk(
    response: &mut reqwest::Response,
    limits: &StreamLimits,
    deltas: &Deltas<'_>,
) -> Result<Option<impl std::ops::Deref<Target = [u8]> + use<>>, LlmError> {
    let mut next = std::pin::pin!(response.chunk());
    let mut stalled = std::pin::pin!(tokio::time::sleep(limits.idle));
    loop {
        let due = deltas.due_in();
        let flush = async {
            match due {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            chunk = &mut next => return chunk.map_err(|e| transport_error(e, limits.timeout)),
            () = &mut stalled => {
                let why = format!("the stream stalled: nothing for {} s (FABRIC_LLM_STREAM_IDLE_S)", limits.idle.as_secs_f64());
                return Err(LlmError::new(ReasonClass::Timeout, why));
            }
            () = flush => deltas.flush_due(),
        }
    }
}

/// Complete lines out of a body's chunks (`\n`, `\r\n` or `\r` ends a line).
#[derive(Debug, Default)]
struct Lines {
    buf: Vec<u8>,
    /// Where the next line starts in `buf` (what is before it is dropped at the next chunk).
    start: usize,
    /// The last line ended with `\r`: a `\n` first in the next chunk belongs to it.
    after_cr: bool,
}

impl Lines {
    fn feed(&mut self, chunk: &[u8]) {
        self.buf.drain(..self.start);
        self.start = 0;
        let chunk = if self.after_cr && chunk.first() == Some(&b'\n') { &chunk[1..] } else { chunk };
        self.after_cr = false;
        self.buf.extend_from_slice(chunk);
    }

    fn next_line(&mut self) -> Result<Option<String>, LlmError> {
        let Some(len) = memchr::memchr2(b'\n', b'\r', &self.buf[self.start..]) else { return Ok(None) };
        let (from, end) = (self.start, self.start + len);
        self.start = end + 1;
        if self.buf[end] == b'\r' {
            match self.buf.get(end + 1) {
                Some(b'\n') => self.start += 1,
                Some(_) => {}
                None => self.after_cr = true,
            }
        }
        text(self.buf[from..end].to_vec()).map(Some)
    }

    fn rest(&mut self) -> Result<Option<String>, LlmError> {
        let rest = self.buf.split_off(self.start);
        self.start = 0;
        if rest.is_empty() {
            return Ok(None);
        }
        text(rest).map(Some)
    }
}

fn text(line: Vec<u8>) -> Result<String, LlmError> {
    String::from_utf8(line).map_err(|_| LlmError::new(ReasonClass::ProviderError, "the reply stream is not UTF-8"))
}

/// The SSE event being read: its name and data lines so far.
#[derive(Debug, Default)]
struct Event {
    name: String,
    data: Option<String>,
}

impl Event {
    /// One line; an event (its name and data) when the line completes one.
    fn line(&mut self, framing: Framing, line: &str) -> Option<(String, String)> {
        if framing == Framing::Ndjson {
            return (!line.trim().is_empty()).then(|| (String::new(), line.to_owned()));
        }
        if line.is_empty() {
            return self.take();
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.name),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            // Comments (`: ping`), `id:`, `retry:` and unknown fields: nothing to read.
            _ => {}
        }
        None
    }

    /// The event read so far, if it has data (an event without data is dispatched as none).
    fn take(&mut self) -> Option<(String, String)> {
        let name = std::mem::take(&mut self.name);
        self.data.take().map(|data| (name, data))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::llm::ReplyMeta;
    use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};

    /// The events of `body` fed in chunks of `size` bytes.
    pub(crate) fn events(framing: Framing, body: &[u8], size: usize) -> Vec<(String, String)> {
        let (mut lines, mut event, mut out) = (Lines::default(), Event::default(), Vec::new());
        for chunk in body.chunks(size.max(1)) {
            lines.feed(chunk);
            while let Some(line) = lines.next_line().unwrap() {
                out.extend(event.line(framing, &line));
            }
        }
        if let Some(line) = lines.rest().unwrap() {
            out.extend(event.line(framing, &line));
        }
        out.extend(event.take());
        out
    }

    /// Folds `body` cut in chunks of `size` bytes, as [`read`] does, and decodes the reply
    /// rebuilt as the codec decodes a whole one: the text shown and the reply (or the error).
    pub(crate) fn fold_decode<C: StreamCodec>(codec: &C, call: &CallSpec<'_>, body: &str, size: usize) -> (String, Result<(String, ReplyMeta), LlmError>) {
        let mut fold = codec.fold(call);
        let mut shown = String::new();
        let mut whole = None;
        for (name, data) in events(codec.framing(), body.as_bytes(), size) {
            match fold.event(&name, &data, &mut |t: &str| shown.push_str(t)) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => whole = Some(Err(e)),
            }
            if whole.is_some() {
                break;
            }
        }
        let whole = whole.unwrap_or_else(|| fold.finish());
        (shown, whole.and_then(|w| codec.decode(&serde_json::to_vec(&w).unwrap_or_default(), call)))
    }

    /// A target of `kind` for the codecs' tests (no key, a base URL that is never called).
    pub(crate) fn test_target(kind: ProviderKind) -> ProviderTarget {
        ProviderTarget {
            provider: kind,
            model: "m".into(),
            base_url: "http://x".into(),
            api_key: None,
            api_key_var: None,
            api_version: "v1".into(),
            cloud: None,
        }
    }

    /// A call on `target`, plain text or with `schema` (its forced tool named `x`).
    pub(crate) fn test_call<'a>(target: &'a ProviderTarget, schema: Option<&'a Value>) -> CallSpec<'a> {
        let schema = schema.map(|json| super::super::WireSchema { json, strict: false });
        CallSpec { target, tuning: Tuning::default(), system: "s", user: "u", schema, schema_name: "x".into() }
    }

    #[test]
    fn sse_events_are_the_same_however_the_body_is_cut() {
        let body = "event: a\r\ndata: 1\r\n\r\n: ping\n\ndata: é\ndata:two\n\nid: 3\rdata: x\r\revent: nodata\n\ndata: last";
        let want = [("a", "1"), ("", "é\ntwo"), ("", "x"), ("", "last")].map(|(n, d)| (n.to_owned(), d.to_owned()));
        for size in 1..body.len() + 1 {
            assert_eq!(events(Framing::Sse, body.as_bytes(), size), want, "chunks of {size}");
        }
    }

    #[test]
    fn ndjson_lines_are_events_blank_lines_are_not() {
        let body = b"{\"a\":1}\n\n{\"b\":2}\r\n{\"c\":3}";
        for size in 1..body.len() + 1 {
            let got: Vec<String> = events(Framing::Ndjson, body, size).into_iter().map(|(_, d)| d).collect();
            assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"], "chunks of {size}");
        }
    }

    #[test]
    fn a_line_that_is_not_utf8_is_a_provider_error() {
        let mut lines = Lines::default();
        lines.feed(b"data: \xff\xfe\n");
        assert_eq!(lines.next_line().unwrap_err().class, ReasonClass::ProviderError);
    }

    /// The measured reason for a parser of our own: it frames a 1 MiB stream, cut in 1 KiB
    /// chunks, fast enough to never matter beside the network (well under a second even in a
    /// debug build).
    #[test]
    fn framing_a_megabyte_takes_milliseconds() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"word \"}}]}\n\n".repeat(1 << 14);
        let started = std::time::Instant::now();
        assert_eq!(events(Framing::Sse, body.as_bytes(), 1024).len(), 1 << 14);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
