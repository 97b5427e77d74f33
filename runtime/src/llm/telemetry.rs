//! `TelemetryLlm`: the outermost decorator. One `run.llm.started` per logical call, then
//! exactly one of `run.llm.completed` or `run.llm.failed` (with its `reason_class`), and one
//! `chat {model}` span (`llm.complete` with legacy names) around all of its attempts.

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass, ReplyMeta};
use crate::events::{EventData, Tokens};
use crate::llm::OutputSpec;

#[derive(Debug)]
pub struct TelemetryLlm<L> {
    inner: L,
    /// The backend's description, asked once: every call's events and span name it.
    info: ModelInfo,
}

impl<L: Llm> TelemetryLlm<L> {
    pub fn new(inner: L) -> TelemetryLlm<L> {
        let info = inner.info();
        TelemetryLlm { inner, info }
    }
}

impl<L: Llm> Llm for TelemetryLlm<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            let info = &self.info;
            let structured = matches!(req.output, OutputSpec::Bindable(_) | OutputSpec::Decision(_));
            req.events.emit(Some(req.stage_id), || EventData::LlmStarted {
                provider: info.provider.clone(),
                model: info.model.clone(),
                turn: req.turn,
                structured,
            });
            let cx = crate::otel::child(
                req.cx,
                || crate::otel::chat_span_name(&info.model),
                SpanKind::Client,
                || {
                    let mut attributes = vec![
                        KeyValue::new("gen_ai.operation.name", "chat"),
                        KeyValue::new("gen_ai.provider.name", otel_provider(&info.provider)),
                        KeyValue::new("gen_ai.request.model", info.model.clone()),
                        KeyValue::new("gen_ai.output.type", if structured { "json" } else { "text" }),
                        KeyValue::new("fabric.run_id", req.events.run_id().to_owned()),
                        KeyValue::new("fabric.route_id", req.route_id.to_owned()),
                        KeyValue::new("fabric.stage_id", req.stage_id.to_owned()),
                    ];
                    if let Some(t) = info.temperature {
                        attributes.push(KeyValue::new("gen_ai.request.temperature", t));
                    }
                    if let Some(n) = info.max_tokens {
                        attributes.push(KeyValue::new("gen_ai.request.max_tokens", i64::from(n)));
                    }
                    if let Some((host, port)) = &info.server {
                        attributes.push(KeyValue::new("server.address", host.clone()));
                        attributes.push(KeyValue::new("server.port", i64::from(*port)));
                    }
                    attributes
                },
            );
            let started = req.events.stopwatch();
            // A cancelled run ends its call here, so the call still gets its one `failed` event.
            let result = match req.cancel.race(self.inner.call(req)).await {
                Ok(r) => r,
                Err(why) => Err(LlmError::new(ReasonClass::Interrupted, format!("the run was interrupted ({why})"))),
            };
            let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
            // The text shown comes before the call's end: what waits is sent, and a backend that
            // does not stream shows its whole reply as one delta.
            if let Some(deltas) = req.stream {
                if let Ok(reply) = &result
                    && !deltas.sent()
                {
                    deltas.push(&reply.raw_text());
                }
                deltas.flush();
            }
            match &result {
                Ok(reply) => {
                    set_response(&cx, &reply.meta);
                    // A fallback chain's reply: which of its models answered.
                    if let Some(by) = &reply.served_by {
                        crate::otel::set(&cx, KeyValue::new("fabric.llm.served_by", by.to_string()));
                    }
                    // Built only when a consumer is attached, like every event.
                    req.events.emit(Some(req.stage_id), || EventData::LlmCompleted {
                        duration_ms: round_ms(duration_ms),
                        tokens: reply.meta.usage.map(|u| Tokens { input: u.input_tokens, output: u.output_tokens }),
                    });
                }
                Err(e) => {
                    // A reply that came but failed validation still used tokens.
                    if let Some(meta) = &e.reply {
                        set_response(&cx, meta);
                    }
                    crate::otel::fail_cx(&cx, e.class.as_str());
                    req.events.emit(Some(req.stage_id), || EventData::LlmFailed {
                        reason_class: e.class,
                        message: e.message.clone(),
                        duration_ms: round_ms(duration_ms),
                        reply: e.raw_reply.as_deref().map(capped_reply),
                    });
                }
            }
            crate::otel::end(&cx);
            result
        })
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

/// The most of a failed reply's text an event carries (a provider reply may be megabytes).
pub const MAX_EVENT_REPLY_BYTES: usize = 64 * 1024;

/// `raw`, or its first [`MAX_EVENT_REPLY_BYTES`] (cut at a character boundary) followed by `…`.
fn capped_reply(raw: &str) -> String {
    if raw.len() <= MAX_EVENT_REPLY_BYTES {
        return raw.to_owned();
    }
    let mut end = MAX_EVENT_REPLY_BYTES;
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &raw[..end])
}

/// The `gen_ai.response.*` and `gen_ai.usage.*` attributes of a reply.
fn set_response(cx: &opentelemetry::Context, meta: &ReplyMeta) {
    if !crate::otel::spans_enabled() {
        return;
    }
    if let Some(u) = meta.usage {
        // A provider's count past i64 (a hostile reply) is shown as the largest, not wrapped.
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        crate::otel::set(cx, KeyValue::new("gen_ai.usage.input_tokens", count(u.input_tokens)));
        crate::otel::set(cx, KeyValue::new("gen_ai.usage.output_tokens", count(u.output_tokens)));
    }
    let Some(about) = &meta.about else { return };
    if let Some(reason) = &about.finish_reason {
        let reasons = opentelemetry::Array::String(vec![reason.clone().into()]);
        crate::otel::set(cx, KeyValue::new("gen_ai.response.finish_reasons", opentelemetry::Value::Array(reasons)));
    }
    if let Some(model) = &about.model {
        crate::otel::set(cx, KeyValue::new("gen_ai.response.model", model.clone()));
    }
    if let Some(id) = &about.id {
        crate::otel::set(cx, KeyValue::new("gen_ai.response.id", id.clone()));
    }
}

/// Milliseconds with microsecond resolution, for events.
pub fn round_ms(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// `gen_ai.provider.name`: the registry's name of a provider key (`x_ai`, `azure.ai.openai`,
/// `mistral_ai`, ...), the key itself for one it does not list (the stub's).
fn otel_provider(key: &str) -> String {
    crate::vocab::ProviderKind::from_key(key).map_or_else(|| crate::otel::provider_name(key), |k| k.otel_name()).to_owned()
}
