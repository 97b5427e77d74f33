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
    pub fn parse(raw: Option<&str>) -> Result<SpanNames, OtelError> {
        match raw.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(SpanNames::GenAi),
            Some(v) if v.eq_ignore_ascii_case("genai") => Ok(SpanNames::GenAi),
            Some(v) if v.eq_ignore_ascii_case("legacy") => Ok(SpanNames::Legacy),
            Some(v) => Err(bad("FABRIC_OTEL_SPAN_NAMES", format!("`{}` is neither `genai` nor `legacy`", shown(v)))),
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
        "bedrock" | "bedrock_converse" => "aws.bedrock",
        "google_vertexai" => "gcp.vertex_ai",
        other => other,
    }
}

/// Marks the span of a context made by [`child`] failed, with its reason class as `error.type`
/// and as the status description. Never the failure's message: it may quote a model's reply,
/// a tool's arguments or its answer, and spans say what ran, not what was said (the message is
/// in the run's events).
pub fn fail_cx(cx: &Context, reason_class: &'static str) {
    if !spans_enabled() {
        return;
    }
    let span = cx.span();
    span.set_attribute(KeyValue::new("error.type", reason_class));
    span.set_status(Status::error(reason_class));
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
        if flush.is_zero() {
            // Told not to wait: what is queued is dropped, as asked, and nothing is said.
            return;
        }
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

/// A value as an error message may show it: control characters escaped, at most 40 characters.
fn shown(value: &str) -> String {
    value.chars().take(40).flat_map(char::escape_debug).collect()
}

/// Why tracing cannot start as the environment asks: checked at start-up, a value this build
/// cannot honour is refused (never read as a default); the front end shows it as a usage error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtelError {
    /// A variable whose value this build cannot honour, and what is wrong with it (never the
    /// value itself where it may hold a key).
    #[error("{var}: {problem}")]
    Variable { var: String, problem: String },
    /// The OTLP protocol `grpc`: this build has no gRPC exporter.
    #[error(
        "{var}=grpc: this build exports OTLP over HTTP only; use http/protobuf or http/json with the \
         collector's OTLP/HTTP endpoint (port 4318 by default)"
    )]
    Grpc { var: &'static str },
    /// The exporter refused the endpoint (its own message may quote it, credentials and all:
    /// only the variables are named).
    #[error(
        "OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: not a valid http(s) endpoint URL; \
         the OTLP exporter cannot start"
    )]
    Exporter,
    /// The exporter's HTTP client could not be built: reqwest's words, or none when the thread
    /// building it died.
    #[error("the OTLP exporter's HTTP client could not be built{}", .0.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    Client(Option<String>),
}

/// An [`OtelError::Variable`].
fn bad(var: &str, problem: impl Into<String>) -> OtelError {
    OtelError::Variable { var: var.to_owned(), problem: problem.into() }
}

/// One variable, signal-specific first: `(name, value)` of the first that is set and not blank.
fn first_set(names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()).map(|v| (*n, v.trim().to_owned())))
}

/// `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: OTLP over HTTP, protobuf (the default) or JSON. gRPC
/// is refused at start-up rather than ignored: this build has no gRPC exporter.
fn protocol() -> Result<opentelemetry_otlp::Protocol, OtelError> {
    use opentelemetry_otlp::Protocol;
    match first_set(&["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]) {
        None => Ok(Protocol::HttpBinary),
        Some((_, v)) if v == "http/protobuf" => Ok(Protocol::HttpBinary),
        Some((_, v)) if v == "http/json" => Ok(Protocol::HttpJson),
        Some((var, v)) if v == "grpc" => Err(OtelError::Grpc { var }),
        Some((var, v)) => Err(bad(var, format!("`{}` is not one of http/protobuf, http/json", shown(&v)))),
    }
}

/// `OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION`: `gzip` or `none` (the default).
fn compression() -> Result<Option<opentelemetry_otlp::Compression>, OtelError> {
    match first_set(&["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"]) {
        None => Ok(None),
        Some((_, v)) if v == "none" => Ok(None),
        Some((_, v)) if v == "gzip" => Ok(Some(opentelemetry_otlp::Compression::Gzip)),
        Some((var, v)) => Err(bad(var, format!("`{}` is not one of gzip, none", shown(&v)))),
    }
}

/// `FABRIC_OTEL_FLUSH_MS`: the flush deadline at exit.
fn flush_deadline() -> Result<Duration, OtelError> {
    match first_set(&["FABRIC_OTEL_FLUSH_MS"]) {
        None => Ok(DEFAULT_FLUSH),
        Some((var, v)) => match v.parse::<u64>() {
            Ok(ms) if Duration::from_millis(ms) <= MAX_FLUSH => Ok(Duration::from_millis(ms)),
            _ => Err(bad(var, format!("`{}` must be a whole number of milliseconds from 0 to {}", shown(&v), MAX_FLUSH.as_millis()))),
        },
    }
}

/// Installs the OTLP exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` says otherwise). Headers and timeout are read by the exporter
/// from the standard variables; protocol, compression and the Fabric variables are checked here,
/// and a value this build cannot honour is an error, never a silent default. `report` hears of
/// the first export failure (see [`Reporter`]).
pub fn init_from_env(report: Arc<Reporter>) -> Result<OtelGuard, OtelError> {
    // A value that is not UTF-8 would read as unset: refused instead, whatever it is.
    for (key, value) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("OTEL_") || key.starts_with("FABRIC_OTEL_")) && value.to_str().is_none() {
            return Err(bad(&key, "the value is not valid UTF-8"));
        }
    }
    let names = SpanNames::parse(std::env::var("FABRIC_OTEL_SPAN_NAMES").ok().as_deref())?;
    let flush = flush_deadline()?;
    let disabled = match first_set(&["OTEL_SDK_DISABLED"]) {
        None => false,
        Some((_, v)) if v.eq_ignore_ascii_case("true") => true,
        Some((_, v)) if v.eq_ignore_ascii_case("false") => false,
        Some((var, v)) => return Err(bad(var, format!("`{}` is neither true nor false", shown(&v)))),
    };
    // `OTEL_TRACES_EXPORTER=none`: no exporter, whatever the endpoint says (the standard way to
    // switch tracing off where the endpoint is set for other signals).
    let no_exporter = match first_set(&["OTEL_TRACES_EXPORTER"]) {
        None => false,
        Some((_, v)) if v.split(',').any(|e| e.trim().eq_ignore_ascii_case("none")) => true,
        Some((_, v)) if v.split(',').all(|e| e.trim().eq_ignore_ascii_case("otlp")) => false,
        Some((var, v)) => {
            return Err(bad(var, format!("`{}` is not one of otlp, none (the only trace exporters here)", shown(&v))));
        }
    };
    let endpoint = first_set(&["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]);
    let Some((endpoint_var, endpoint)) = endpoint.filter(|_| !disabled && !no_exporter) else {
        return Ok(OtelGuard::off());
    };
    check_endpoint(endpoint_var, &endpoint)?;
    check_exporter_env()?;
    let (protocol, compression) = (protocol()?, compression()?);
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(protocol).with_http_client(exporter_client()?);
    if let Some(c) = compression {
        builder = builder.with_compression(c);
    }
    let exporter = builder
        .build()
        // The crate's message may quote the endpoint, credentials and all: name the variables only.
        .map_err(|_| OtelError::Exporter)?;
    let exporter = Reported { inner: exporter, origin: crate::redact::origin_and_path(&endpoint), report: report.clone() };
    // The SDK reads both, but lets `OTEL_RESOURCE_ATTRIBUTES` win; the specification has
    // `OTEL_SERVICE_NAME` win, so it is set explicitly. `fabric-runtime` where neither says.
    let in_attributes =
        std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.split(',').any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.trim() == "service.name")));
    let resource = match first_set(&["OTEL_SERVICE_NAME"]) {
        Some((_, name)) => Resource::builder().with_service_name(name).build(),
        None if in_attributes => Resource::builder().build(),
        None => Resource::builder().with_service_name(TRACER_NAME).build(),
    };
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    global::set_tracer_provider(provider.clone());
    use_span_names(names);
    enable_spans();
    Ok(OtelGuard { provider: Some(provider), flush, report: Some(report) })
}

/// The endpoint: an http(s) URL with a host. The base endpoint (to which `/v1/traces` is added)
/// takes no query or fragment, which the path would land after. The value is never echoed: it
/// may carry credentials.
fn check_endpoint(var: &str, endpoint: &str) -> Result<(), OtelError> {
    let url = reqwest::Url::parse(endpoint).map_err(|_| bad(var, "not a valid URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(bad(var, "the OTLP/HTTP endpoint must be an http:// or https:// URL with a host"));
    }
    if var == "OTEL_EXPORTER_OTLP_ENDPOINT" && (url.query().is_some() || url.fragment().is_some()) {
        return Err(bad(
            var,
            "a base endpoint takes no query or fragment (`/v1/traces` is added to its path); \
             use OTEL_EXPORTER_OTLP_TRACES_ENDPOINT for a full URL",
        ));
    }
    Ok(())
}

/// The other variables the exporter and the SDK read, checked here because they would ignore a
/// bad value without a word (or, for TLS files, this build cannot honour them at all).
fn check_exporter_env() -> Result<(), OtelError> {
    for var in [
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_INSECURE",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    ] {
        if first_set(&[var]).is_some() {
            return Err(bad(
                var,
                "not supported by this build (the exporter trusts the system's CA roots and sends no \
                 client certificate); unset it",
            ));
        }
    }
    for var in ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"] {
        let Some((var, headers)) = first_set(&[var]) else { continue };
        for (idx, entry) in headers.split(',').enumerate() {
            let ok = entry.split_once('=').is_some_and(|(k, v)| {
                let k = k.trim();
                !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) && !v.chars().any(char::is_control)
            });
            if !ok {
                // Never the entry itself: it is most likely a key.
                return Err(bad(var, format!("entry {} is not `name=value` with a header name and a value without control characters", idx + 1)));
            }
        }
    }
    if let Some((var, attributes)) = first_set(&["OTEL_RESOURCE_ATTRIBUTES"])
        && let Some(idx) = attributes.split(',').position(|kv| kv.split_once('=').is_none_or(|(k, _)| k.trim().is_empty()))
    {
        return Err(bad(var, format!("entry {} is not `key=value`", idx + 1)));
    }
    let whole = |var: &'static str, min: u64| -> Result<(), OtelError> {
        match first_set(&[var]) {
            Some((var, v)) if v.parse::<u64>().map_or(true, |n| n < min) => Err(bad(var, format!("`{}` is not a whole number of at least {min}", shown(&v)))),
            _ => Ok(()),
        }
    };
    whole("OTEL_BSP_SCHEDULE_DELAY", 0)?;
    whole("OTEL_BSP_EXPORT_TIMEOUT", 0)?;
    whole("OTEL_BSP_MAX_QUEUE_SIZE", 1)?;
    whole("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1)?;
    whole("OTEL_BSP_MAX_CONCURRENT_EXPORTS", 1)?;
    whole("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", 0)?;
    whole("OTEL_SPAN_EVENT_COUNT_LIMIT", 0)?;
    whole("OTEL_SPAN_LINK_COUNT_LIMIT", 0)?;
    const SAMPLERS: &[&str] = &["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"];
    if let Some((var, v)) = first_set(&["OTEL_TRACES_SAMPLER"]).filter(|(_, v)| !SAMPLERS.contains(&v.as_str())) {
        return Err(bad(var, format!("`{}` is not one of {}", shown(&v), SAMPLERS.join(", "))));
    }
    if let Some((var, v)) = first_set(&["OTEL_TRACES_SAMPLER_ARG"]).filter(|(_, v)| !v.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r))) {
        return Err(bad(var, format!("`{}` is not a ratio from 0 to 1", shown(&v))));
    }
    Ok(())
}

/// The exporter's HTTP client: the one the OTLP crate would build (its timeout from
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms, default 10 s), but
/// following no redirect: `OTEL_EXPORTER_OTLP_HEADERS` often carries a collector's API key, and
/// an HTTP client strips only `Authorization` when a redirect leaves the origin.
fn exporter_client() -> Result<reqwest::blocking::Client, OtelError> {
    let timeout = match first_set(&["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]) {
        None => Duration::from_secs(10),
        Some((var, ms)) => Duration::from_millis(ms.parse().map_err(|_| bad(var, format!("`{}` is not a whole number of milliseconds", shown(&ms))))?),
    };
    // A blocking client owns a runtime of its own: build it off any async context.
    std::thread::spawn(move || reqwest::blocking::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).build())
        .join()
        .map_err(|_| OtelError::Client(None))?
        .map_err(|e| OtelError::Client(Some(e.to_string())))
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
        assert!(SpanNames::parse(Some("otel")).unwrap_err().to_string().starts_with("FABRIC_OTEL_SPAN_NAMES: `otel` is neither"));
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
