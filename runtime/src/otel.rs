//! OpenTelemetry: spans for runs, stages and model calls, exported over OTLP when configured.
//!
//! Spans are made through the global tracer provider. Until [`init_from_env`] installs an
//! exporter (only when a standard `OTEL_EXPORTER_OTLP_*` endpoint variable is set) that provider
//! is OpenTelemetry's no-op one, so nothing is recorded or sent. Every model call, retries
//! included, is one `llm.complete` span with the GenAI semantic-convention attributes.

use opentelemetry::{Context, KeyValue};
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::global::{self, BoxedTracer};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

pub const TRACER_NAME: &str = "fabric-runtime";

pub fn tracer() -> BoxedTracer {
    global::tracer(TRACER_NAME)
}

/// Whether spans are made at all. Off until a tracer provider is installed, so that a runtime
/// without an exporter does not build span attributes it would throw away.
static SPANS: AtomicBool = AtomicBool::new(false);

pub fn spans_enabled() -> bool {
    SPANS.load(Ordering::Relaxed)
}

/// Turns spans on: for programs that install their own global tracer provider (and tests).
pub fn enable_spans() {
    SPANS.store(true, Ordering::Relaxed);
}

/// Starts a span under `parent` and returns its context; the parent itself when spans are off.
pub fn child(parent: &Context, name: &'static str, kind: SpanKind, attributes: impl FnOnce() -> Vec<KeyValue>) -> Context {
    if !spans_enabled() {
        return parent.clone();
    }
    let tracer = tracer();
    let span = tracer.span_builder(name).with_kind(kind).with_attributes(attributes()).start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// Sets an attribute on the span of a context made by [`child`].
pub fn set(cx: &Context, kv: KeyValue) {
    if spans_enabled() {
        cx.span().set_attribute(kv);
    }
}

/// Ends the span of a context made by [`child`].
pub fn end(cx: &Context) {
    if spans_enabled() {
        cx.span().end();
    }
}

/// The `gen_ai.provider.name` of a backend's provider key.
pub fn provider_name(key: &str) -> &str {
    match key {
        "google_genai" => "gcp.gemini",
        other => other,
    }
}

/// Marks the span of a context made by [`child`] failed, with its reason class (`error.type`).
pub fn fail_cx(cx: &Context, reason_class: &'static str, message: &str) {
    if !spans_enabled() {
        return;
    }
    let span = cx.span();
    span.set_attribute(KeyValue::new("error.type", reason_class));
    span.set_status(Status::error(message.to_owned()));
}

/// Flushes and stops the exporter when dropped (end of the process).
#[derive(Debug)]
pub struct OtelGuard(Option<SdkTracerProvider>);

impl Drop for OtelGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
    }
}

/// Installs the OTLP exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`). The
/// exporter reads the other standard `OTEL_*` variables itself (headers, timeout, protocol).
pub fn init_from_env() -> Result<OtelGuard, String> {
    let set = |k: &str| std::env::var(k).ok().is_some_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    // `OTEL_TRACES_EXPORTER=none`: no exporter, whatever the endpoint says (the standard way to
    // switch tracing off where the endpoint is set for other signals).
    let no_exporter = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case("none")));
    if disabled || no_exporter || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
        return Ok(OtelGuard(None));
    }
    use opentelemetry_otlp::WithHttpConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(exporter_client()?)
        .build()
        // The crate's message may quote the endpoint, credentials and all: name the variables only.
        .map_err(|_| {
            "OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: not a valid http(s) endpoint URL; the OTLP exporter cannot start".to_owned()
        })?;
    // The SDK's resource reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (which wins
    // in that order); `fabric-runtime` only where neither names the service.
    let named = set("OTEL_SERVICE_NAME")
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.split(',').any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.trim() == "service.name")));
    let resource = if named { Resource::builder().build() } else { Resource::builder().with_service_name("fabric-runtime").build() };
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    global::set_tracer_provider(provider.clone());
    enable_spans();
    Ok(OtelGuard(Some(provider)))
}

/// The exporter's HTTP client: the one the OTLP crate would build (its timeout from
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms, default 10 s), but
/// following no redirect: `OTEL_EXPORTER_OTLP_HEADERS` often carries a collector's API key, and
/// an HTTP client strips only `Authorization` when a redirect leaves the origin.
fn exporter_client() -> Result<reqwest::blocking::Client, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT")) {
        None => std::time::Duration::from_secs(10),
        Some(ms) => std::time::Duration::from_millis(
            ms.trim().parse().map_err(|_| format!("OTEL_EXPORTER_OTLP_TIMEOUT: `{ms}` is not a whole number of milliseconds"))?,
        ),
    };
    // A blocking client owns a runtime of its own: build it off any async context.
    std::thread::spawn(move || reqwest::blocking::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build())
        .join()
        .map_err(|_| "the OTLP exporter's HTTP client could not be built".to_owned())?
        .map_err(|e| format!("the OTLP exporter's HTTP client could not be built: {e}"))
}
