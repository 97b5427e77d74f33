//! OpenTelemetry: spans for runs, stages, model calls and tool calls, exported over OTLP when
//! configured.
//!
//! Spans are made through the global tracer provider. Until [`init_from_env`] installs an
//! exporter (only when a standard `OTEL_EXPORTER_OTLP_*` endpoint variable is set) that provider
//! is OpenTelemetry's no-op one, so nothing is recorded or sent. Names and attributes follow the
//! GenAI semantic conventions: every model call, retries included, is one `chat {model}` span,
//! every tool call an `execute_tool {tool}` span, and a decision-loop run an
//! `invoke_agent {route}` span; staged runs and stages are `run` and `stage` spans.
//! `FABRIC_OTEL_SPAN_NAMES=legacy` names model calls `llm.complete` and every run `run` instead,
//! the names of the Python runtime's contract (dashboards built on them keep working).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::global::{self, BoxedTracer};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

/// The instrumentation scope's name; its version is the crate's.
pub const TRACER_NAME: &str = "fabric-runtime";

/// How long the end of a process waits for its last spans to reach the collector, unless
/// `FABRIC_OTEL_FLUSH_MS` says otherwise: long enough for a collector on the same network, short
/// enough that an unreachable one does not hold a CLI run (its exit code is already decided).
pub const DEFAULT_FLUSH: Duration = Duration::from_millis(2000);
/// The longest flush deadline accepted.
pub const MAX_FLUSH: Duration = Duration::from_secs(60);

pub fn tracer() -> BoxedTracer {
    let scope = InstrumentationScope::builder(TRACER_NAME).with_version(env!("CARGO_PKG_VERSION")).build();
    global::tracer_with_scope(scope)
}

/// Whether spans are made at all. Off until a tracer provider is installed, so that a runtime
/// without an exporter does not build span attributes it would throw away.
static SPANS: AtomicBool = AtomicBool::new(false);
/// `FABRIC_OTEL_SPAN_NAMES=legacy`: the contract's names (`llm.complete`, `run`).
static LEGACY_NAMES: AtomicBool = AtomicBool::new(false);

pub fn spans_enabled() -> bool {
    SPANS.load(Ordering::Relaxed)
}

/// Turns spans on: for programs that install their own global tracer provider (and tests).
pub fn enable_spans() {
    SPANS.store(true, Ordering::Relaxed);
}

/// Which span names are used (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanNames {
    /// `chat {model}`, `execute_tool {tool}`, `invoke_agent {route}` (the default).
    GenAi,
    /// `llm.complete` for model calls and `run` for every run; tool spans as in `GenAi`.
    Legacy,
}

impl SpanNames {
    /// Reads `FABRIC_OTEL_SPAN_NAMES` (`genai`, the default, or `legacy`).
    pub fn parse(raw: Option<&str>) -> Result<SpanNames, String> {
        match raw.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(SpanNames::GenAi),
            Some(v) if v.eq_ignore_ascii_case("genai") => Ok(SpanNames::GenAi),
            Some(v) if v.eq_ignore_ascii_case("legacy") => Ok(SpanNames::Legacy),
            Some(v) => Err(format!("FABRIC_OTEL_SPAN_NAMES: `{v:.40}` is neither `genai` nor `legacy`")),
        }
    }
}

/// Chooses the span names (programs that install their own provider; [`init_from_env`] does it
/// from the environment).
pub fn use_span_names(names: SpanNames) {
    LEGACY_NAMES.store(names == SpanNames::Legacy, Ordering::Relaxed);
}

/// The span name of a model call.
pub fn chat_span_name(model: &str) -> Cow<'static, str> {
    if LEGACY_NAMES.load(Ordering::Relaxed) { Cow::Borrowed("llm.complete") } else { Cow::Owned(format!("chat {model}")) }
}

/// The span name of a run: `invoke_agent {route}` for a decision-loop run, else `run`.
pub fn run_span_name(route_id: &str, agent: bool) -> Cow<'static, str> {
    if agent && !LEGACY_NAMES.load(Ordering::Relaxed) { Cow::Owned(format!("invoke_agent {route_id}")) } else { Cow::Borrowed("run") }
}

/// Starts a span under `parent` and returns its context; the parent itself when spans are off.
pub fn child(parent: &Context, name: impl FnOnce() -> Cow<'static, str>, kind: SpanKind, attributes: impl FnOnce() -> Vec<KeyValue>) -> Context {
    if !spans_enabled() {
        return parent.clone();
    }
    let tracer = tracer();
    let span = tracer.span_builder(name()).with_kind(kind).with_attributes(attributes()).start_with_context(&tracer, parent);
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

/// Where export problems are told: once per process, so a collector that is down does not flood
/// stderr or the log with one line per batch. The library never prints: the program says how.
pub struct Reporter {
    told: AtomicBool,
    sink: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter").field("told", &self.told).finish_non_exhaustive()
    }
}

impl Reporter {
    pub fn new(sink: impl Fn(&str) + Send + Sync + 'static) -> Arc<Reporter> {
        Arc::new(Reporter { told: AtomicBool::new(false), sink: Box::new(sink) })
    }

    /// Tells `message` unless something was told before.
    pub fn once(&self, message: &str) {
        if !self.told.swap(true, Ordering::Relaxed) {
            (self.sink)(message);
        }
    }
}

/// The exporter, telling its first failure to the [`Reporter`]. The exporter's own messages name
/// no endpoint or header ("network error", "status code: 503"); the origin is added here.
#[derive(Debug)]
struct Reported<E> {
    inner: E,
    origin: String,
    report: Arc<Reporter>,
}

impl<E: SpanExporter> SpanExporter for Reported<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            self.report.once(&format!(
                "OpenTelemetry: {spans} spans could not be exported to {} ({e}); runs go on, and later export \
                 failures are not reported again",
                self.origin
            ));
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Flushes and stops the exporter when dropped (end of the process), waiting at most the flush
/// deadline: past it the process ends without the spans still queued, and says so once.
#[derive(Debug)]
pub struct OtelGuard {
    provider: Option<SdkTracerProvider>,
    flush: Duration,
    report: Option<Arc<Reporter>>,
}

impl OtelGuard {
    fn off() -> OtelGuard {
        OtelGuard { provider: None, flush: DEFAULT_FLUSH, report: None }
    }

    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else { return };
        let flush = self.flush;
        let (done, finished) = std::sync::mpsc::channel();
        // The flush blocks on the exporter's HTTP call (up to its own timeout, 10 s by default):
        // on a thread of its own, so that the deadline holds whatever the collector does.
        let flusher = std::thread::Builder::new().name("otel-flush".into()).spawn(move || {
            let _ = provider.force_flush();
            let _ = provider.shutdown_with_timeout(flush);
            let _ = done.send(());
        });
        if flusher.is_ok()
            && finished.recv_timeout(flush).is_err()
            && let Some(report) = &self.report
        {
            report.once(&format!(
                "OpenTelemetry: the last spans were not delivered within the {} ms flush deadline \
                 (FABRIC_OTEL_FLUSH_MS); exiting without them",
                flush.as_millis()
            ));
        }
    }
}

/// One variable, signal-specific first: `(name, value)` of the first that is set and not blank.
fn first_set(names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()).map(|v| (*n, v.trim().to_owned())))
}

/// `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: OTLP over HTTP, protobuf (the default) or JSON. gRPC
/// is refused at start-up rather than ignored: this build has no gRPC exporter.
fn protocol() -> Result<opentelemetry_otlp::Protocol, String> {
    use opentelemetry_otlp::Protocol;
    match first_set(&["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]) {
        None => Ok(Protocol::HttpBinary),
        Some((_, v)) if v == "http/protobuf" => Ok(Protocol::HttpBinary),
        Some((_, v)) if v == "http/json" => Ok(Protocol::HttpJson),
        Some((var, v)) if v == "grpc" => Err(format!(
            "{var}=grpc: this build exports OTLP over HTTP only; use http/protobuf or http/json with the \
             collector's OTLP/HTTP endpoint (port 4318 by default)"
        )),
        Some((var, v)) => Err(format!("{var}: `{v:.40}` is not one of http/protobuf, http/json")),
    }
}

/// `OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION`: `gzip` or `none` (the default).
fn compression() -> Result<Option<opentelemetry_otlp::Compression>, String> {
    match first_set(&["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"]) {
        None => Ok(None),
        Some((_, v)) if v == "none" => Ok(None),
        Some((_, v)) if v == "gzip" => Ok(Some(opentelemetry_otlp::Compression::Gzip)),
        Some((var, v)) => Err(format!("{var}: `{v:.40}` is not one of gzip, none")),
    }
}

/// `FABRIC_OTEL_FLUSH_MS`: the flush deadline at exit.
fn flush_deadline() -> Result<Duration, String> {
    match first_set(&["FABRIC_OTEL_FLUSH_MS"]) {
        None => Ok(DEFAULT_FLUSH),
        Some((var, v)) => match v.parse::<u64>() {
            Ok(ms) if Duration::from_millis(ms) <= MAX_FLUSH => Ok(Duration::from_millis(ms)),
            _ => Err(format!("{var}: `{v:.40}` must be a whole number of milliseconds from 0 to {}", MAX_FLUSH.as_millis())),
        },
    }
}

/// Installs the OTLP exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` says otherwise). Headers and timeout are read by the exporter
/// from the standard variables; protocol, compression and the Fabric variables are checked here,
/// and a value this build cannot honour is an error, never a silent default. `report` hears of
/// the first export failure (see [`Reporter`]).
pub fn init_from_env(report: Arc<Reporter>) -> Result<OtelGuard, String> {
    let names = SpanNames::parse(std::env::var("FABRIC_OTEL_SPAN_NAMES").ok().as_deref())?;
    let flush = flush_deadline()?;
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    // `OTEL_TRACES_EXPORTER=none`: no exporter, whatever the endpoint says (the standard way to
    // switch tracing off where the endpoint is set for other signals).
    let no_exporter = match first_set(&["OTEL_TRACES_EXPORTER"]) {
        None => false,
        Some((_, v)) if v.split(',').any(|e| e.trim().eq_ignore_ascii_case("none")) => true,
        Some((_, v)) if v.split(',').all(|e| e.trim().eq_ignore_ascii_case("otlp")) => false,
        Some((var, v)) => return Err(format!("{var}: `{v:.40}` is not one of otlp, none (the only trace exporters here)")),
    };
    let endpoint = first_set(&["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]);
    let Some((_, endpoint)) = endpoint.filter(|_| !disabled && !no_exporter) else { return Ok(OtelGuard::off()) };
    let (protocol, compression) = (protocol()?, compression()?);
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(protocol).with_http_client(exporter_client()?);
    if let Some(c) = compression {
        builder = builder.with_compression(c);
    }
    let exporter = builder
        .build()
        // The crate's message may quote the endpoint, credentials and all: name the variables only.
        .map_err(|_| {
            "OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: not a valid http(s) endpoint URL; \
             the OTLP exporter cannot start"
                .to_owned()
        })?;
    let exporter = Reported { inner: exporter, origin: crate::redact::origin_and_path(&endpoint), report: report.clone() };
    // The SDK's resource reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (which wins
    // in that order); `fabric-runtime` only where neither names the service.
    let named = first_set(&["OTEL_SERVICE_NAME"]).is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.split(',').any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.trim() == "service.name")));
    let resource = if named { Resource::builder().build() } else { Resource::builder().with_service_name(TRACER_NAME).build() };
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    global::set_tracer_provider(provider.clone());
    use_span_names(names);
    enable_spans();
    Ok(OtelGuard { provider: Some(provider), flush, report: Some(report) })
}

/// The exporter's HTTP client: the one the OTLP crate would build (its timeout from
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms, default 10 s), but
/// following no redirect: `OTEL_EXPORTER_OTLP_HEADERS` often carries a collector's API key, and
/// an HTTP client strips only `Authorization` when a redirect leaves the origin.
fn exporter_client() -> Result<reqwest::blocking::Client, String> {
    let timeout = match first_set(&["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]) {
        None => Duration::from_secs(10),
        Some((var, ms)) => Duration::from_millis(ms.parse().map_err(|_| format!("{var}: `{ms:.40}` is not a whole number of milliseconds"))?),
    };
    // A blocking client owns a runtime of its own: build it off any async context.
    std::thread::spawn(move || reqwest::blocking::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build())
        .join()
        .map_err(|_| "the OTLP exporter's HTTP client could not be built".to_owned())?
        .map_err(|e| format!("the OTLP exporter's HTTP client could not be built: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn span_names_parse() {
        assert_eq!(SpanNames::parse(None), Ok(SpanNames::GenAi));
        assert_eq!(SpanNames::parse(Some(" Legacy ")), Ok(SpanNames::Legacy));
        assert_eq!(SpanNames::parse(Some("genai")), Ok(SpanNames::GenAi));
        assert!(SpanNames::parse(Some("otel")).unwrap_err().contains("FABRIC_OTEL_SPAN_NAMES"));
    }

    #[test]
    fn a_reporter_tells_once() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        let r = Reporter::new(move |m| sink.lock().unwrap().push(m.to_owned()));
        r.once("first");
        r.once("second");
        assert_eq!(*told.lock().unwrap(), vec!["first".to_owned()]);
    }
}
