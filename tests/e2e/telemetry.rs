//! Spans: one `llm.complete` per logical model call (retries inside it), under stage and run
//! spans, with the GenAI attributes; OTLP export only when the standard variables ask for it.

use std::sync::{Arc, Mutex, OnceLock};

use fabric::config::{ProviderKind, RetryPolicy, Tuning};
use fabric::events::MemorySink;
use fabric::exec::{RunRequest, Runner};
use fabric::llm::providers::backend_for;
use opentelemetry::Value as OtelValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue as OtlpKeyValue, any_value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;

use crate::support::{Canned, FakeProvider, fixture_env, packs_dir, repo, routes_dir, serve, stub_dir, triage_reply_for};

fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        opentelemetry::global::set_tracer_provider(provider);
        fabric::otel::enable_spans();
        exporter
    })
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// The finished spans of one run (other tests share the global exporter).
fn spans_of(exporter: &InMemorySpanExporter, run_id: &str) -> Vec<SpanData> {
    exporter.get_finished_spans().unwrap().into_iter().filter(|s| attr(s, "fabric.run_id").map(|v| v.as_str()) == Some(run_id.into())).collect()
}

#[tokio::test]
async fn one_llm_span_per_logical_call_with_genai_attributes() {
    let exporter = exporter();
    let f = FakeProvider::new(|body| {
        let props: Vec<String> =
            body.pointer("/response_format/json_schema/schema/properties").and_then(|p| p.as_object()).map(|p| p.keys().cloned().collect()).unwrap_or_default();
        Canned::json(
            200,
            json!({"id": "chatcmpl-7", "model": "gpt-test-0613", "choices": [{"message": {"content": triage_reply_for(&props).to_string()}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 12, "completion_tokens": 5}}),
        )
    });
    f.push(Canned::json(503, json!({"error": {"message": "busy"}}))).push(Canned::json(503, json!({"error": {"message": "busy"}})));
    let url = f.start().await;
    let target = crate::support::target(ProviderKind::OpenAi, &url, "gpt-test");
    let retry =
        RetryPolicy { max_attempts: 3, base: std::time::Duration::from_millis(5), max_backoff: std::time::Duration::from_millis(50), jitter_seed: None };
    let llm = fabric::llm::stack::build(
        backend_for(fabric::llm::providers::shared_client().unwrap(), target, Tuning::default(), fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES),
        retry,
    );
    let cat = Arc::new(fabric::catalogue::load(&routes_dir(), &packs_dir()));
    let runner = Runner::new(cat, llm, Arc::new(|_: &str| None)).unwrap();
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    assert_eq!(f.requests().len(), 5, "two retries happened");
    let spans = spans_of(exporter, &result.run_id);
    let named = |n: &str| spans.iter().filter(|s| s.name == n).cloned().collect::<Vec<_>>();
    let (runs, stages, calls) = (named("run"), named("stage"), named("chat gpt-test"));
    assert_eq!((runs.len(), stages.len(), calls.len()), (1, 3, 3), "one llm.complete per stage, retries included");
    assert!(stages.iter().all(|s| s.parent_span_id == runs[0].span_context.span_id()), "stage spans are children of the run span");
    for call in &calls {
        assert!(stages.iter().any(|s| s.span_context.span_id() == call.parent_span_id), "llm.complete is a child of its stage span");
        assert_eq!(attr(call, "gen_ai.provider.name").unwrap().as_str(), "openai");
        assert_eq!(attr(call, "gen_ai.request.model").unwrap().as_str(), "gpt-test");
        assert_eq!(attr(call, "gen_ai.operation.name").unwrap().as_str(), "chat");
        assert_eq!(attr(call, "gen_ai.usage.input_tokens"), Some(&OtelValue::I64(12)));
        assert_eq!(attr(call, "gen_ai.usage.output_tokens"), Some(&OtelValue::I64(5)));
        assert_eq!(attr(call, "gen_ai.request.temperature"), Some(&OtelValue::F64(0.1)));
        assert_eq!(attr(call, "gen_ai.request.max_tokens"), Some(&OtelValue::I64(4096)));
        assert_eq!(attr(call, "gen_ai.response.id").unwrap().as_str(), "chatcmpl-7");
        assert_eq!(attr(call, "gen_ai.response.model").unwrap().as_str(), "gpt-test-0613");
        let reasons = opentelemetry::Value::Array(opentelemetry::Array::String(vec!["stop".into()]));
        assert_eq!(attr(call, "gen_ai.response.finish_reasons"), Some(&reasons));
        assert_eq!(attr(call, "server.address").unwrap().as_str(), "127.0.0.1");
        let port: i64 = url.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(attr(call, "server.port"), Some(&OtelValue::I64(port)));
        assert_eq!(call.span_kind, opentelemetry::trace::SpanKind::Client);
        assert_eq!(call.instrumentation_scope.name(), "fabric-runtime");
        assert_eq!(call.instrumentation_scope.version(), Some(env!("CARGO_PKG_VERSION")));
    }
    assert_eq!(attr(&runs[0], "fabric.route_id").unwrap().as_str(), "support-triage");
}

#[tokio::test]
async fn failed_calls_mark_their_spans() {
    let exporter = exporter();
    let stub = fabric::llm::stub::StubLlm::default().script("support-triage", "intake", &["not json"]);
    let cat = Arc::new(fabric::catalogue::load(&routes_dir(), &packs_dir()));
    let runner = Runner::new(cat, fabric::llm::stack::build(stub, RetryPolicy::default()), Arc::new(|_: &str| None)).unwrap();
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    let spans = spans_of(exporter, &result.run_id);
    let call = spans.iter().find(|s| s.name == "chat seeded-stub").unwrap();
    assert_eq!(attr(call, "error.type").unwrap().as_str(), "invalid_json");
    // The reply came and used tokens, though it failed validation.
    assert!(matches!(attr(call, "gen_ai.usage.input_tokens"), Some(OtelValue::I64(n)) if *n > 0));
    assert!(matches!(attr(call, "gen_ai.usage.output_tokens"), Some(OtelValue::I64(n)) if *n > 0));
    assert!(matches!(call.status, opentelemetry::trace::Status::Error { .. }));
    let run = spans.iter().find(|s| s.name == "run").unwrap();
    assert_eq!(attr(run, "error.type").unwrap().as_str(), "invalid_json");
}

#[tokio::test]
async fn a_fallback_chains_span_names_the_model_that_answered() {
    let exporter = exporter();
    let down = FakeProvider::new(|_| Canned::json(503, json!({})));
    let target = crate::support::target(ProviderKind::OpenAi, &down.start().await, "gpt-down");
    let client = fabric::llm::providers::shared_client().unwrap();
    let flow = fabric::llm::flow::Flow::new(Default::default());
    let once = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let first = fabric::llm::stack::member(backend_for(client, target, Tuning::default(), fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES), once, &flow, true);
    let backup = fabric::llm::stack::member(fabric::llm::stub::StubLlm::load(&stub_dir()).unwrap(), once, &flow, false);
    let llm = fabric::llm::stack::chain(first, vec![backup], Default::default());
    let cat = Arc::new(fabric::catalogue::load(&routes_dir(), &packs_dir()));
    let runner = Runner::new(cat, llm, Arc::new(|_: &str| None)).unwrap();
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    let spans = spans_of(exporter, &result.run_id);
    let calls: Vec<&SpanData> = spans.iter().filter(|s| s.name == "chat gpt-down").collect();
    assert_eq!(calls.len(), 3, "one span a logical call, named after the profile's own model");
    for call in calls {
        assert_eq!(attr(call, "gen_ai.request.model").unwrap().as_str(), "gpt-down");
        assert_eq!(attr(call, "fabric.llm.served_by").unwrap().as_str(), "stub:seeded-stub");
        assert!(attr(call, "error.type").is_none());
    }
}

/// A collector that accepts connections and never answers: its port, and the task holding them.
async fn silent_collector() -> (u16, tokio::task::JoinHandle<()>) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    (port, held)
}

/// One request a collector received.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    content_type: String,
    encoding: Option<String>,
    body: Vec<u8>,
}

type Inbox = Arc<Mutex<Vec<Received>>>;

/// A collector on a loopback port answering every request with `status`.
async fn collector(status: u16) -> (String, Inbox) {
    let inbox: Inbox = Arc::default();
    let sink = inbox.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
        let sink = sink.clone();
        async move {
            let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
            sink.lock().unwrap().push(Received {
                path: uri.path().to_owned(),
                content_type: header("content-type").unwrap_or_default(),
                encoding: header("content-encoding"),
                body: body.to_vec(),
            });
            (axum::http::StatusCode::from_u16(status).unwrap(), "")
        }
    });
    (serve(app).await, inbox)
}

/// Decodes a request as an OTLP collector would: gzip if so encoded, then protobuf or JSON.
fn decode(r: &Received) -> ExportTraceServiceRequest {
    let body = match r.encoding.as_deref() {
        Some("gzip") => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut out).unwrap();
            out
        }
        None => r.body.clone(),
        Some(other) => panic!("unexpected content-encoding {other}"),
    };
    match r.content_type.as_str() {
        "application/x-protobuf" => prost::Message::decode(&body[..]).expect("an OTLP protobuf body"),
        "application/json" => serde_json::from_slice(&body).expect("an OTLP JSON body"),
        other => panic!("unexpected content-type {other}"),
    }
}

/// A decoded span with what the tests look at.
#[derive(Debug)]
struct Flat {
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    kind: i32,
    status: i32,
    attrs: std::collections::BTreeMap<String, String>,
    scope: (String, String),
    resource: std::collections::BTreeMap<String, String>,
}

fn text_of(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(|v| text_of(&Some(v.clone()))).collect::<Vec<_>>().join(","),
        other => format!("{other:?}"),
    }
}

fn attrs(kvs: &[OtlpKeyValue]) -> std::collections::BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text_of(&kv.value))).collect()
}

fn flatten(inbox: &Inbox) -> Vec<Flat> {
    let mut spans = Vec::new();
    for r in inbox.lock().unwrap().iter() {
        assert_eq!(r.path, "/v1/traces");
        for rs in decode(r).resource_spans {
            let resource = attrs(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| (s.name, s.version)).unwrap_or_default();
                for span in ss.spans {
                    spans.push(Flat {
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent: span.parent_span_id,
                        kind: span.kind,
                        status: span.status.map_or(0, |s| s.code),
                        attrs: attrs(&span.attributes),
                        scope: scope.clone(),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }
    spans
}

/// `fabric run support-triage` with the stub, a clean OpenTelemetry environment plus `env`.
async fn fabric_run(goal: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"));
    cmd.current_dir(repo()).envs(fixture_env()).args(["run", "support-triage", "--goal", goal]).env("FABRIC_LLM_STUB", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") || k.starts_with("FABRIC_OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().await.unwrap()
}

#[tokio::test]
async fn exported_spans_decode_as_otlp_in_every_supported_encoding() {
    // The goal carries a marker no span may repeat: spans say what ran, never what was said.
    let goal = r#"{"ticket":"card 4111-PRIVATE-MARKER charged twice"}"#;
    let (url, inbox) = collector(200).await;
    let out = fabric_run(goal, &[]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(inbox.lock().unwrap().is_empty(), "nothing is exported unless an endpoint is set");
    for (protocol, compression, content_type) in [
        (None, None, "application/x-protobuf"),
        (Some("http/protobuf"), Some("gzip"), "application/x-protobuf"),
        (Some("http/json"), None, "application/json"),
        (Some("http/json"), Some("gzip"), "application/json"),
    ] {
        inbox.lock().unwrap().clear();
        let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str())];
        env.extend(protocol.map(|p| ("OTEL_EXPORTER_OTLP_PROTOCOL", p)));
        env.extend(compression.map(|c| ("OTEL_EXPORTER_OTLP_COMPRESSION", c)));
        let out = fabric_run(goal, &env).await;
        let case = format!("{protocol:?}/{compression:?}");
        assert_eq!(out.status.code(), Some(0), "{case}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "{case}: a working export is silent: {}", String::from_utf8_lossy(&out.stderr));
        {
            let got = inbox.lock().unwrap();
            assert!(!got.is_empty(), "{case}: spans were exported at exit");
            for r in got.iter() {
                assert_eq!(r.content_type, content_type, "{case}");
                assert_eq!(r.encoding.as_deref(), compression, "{case}");
                let raw = String::from_utf8_lossy(&r.body);
                assert!(!raw.contains("PRIVATE-MARKER"), "{case}: the goal leaked into the export");
            }
        }
        let spans = flatten(&inbox);
        let named = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
        let (runs, stages, calls) = (named("run"), named("stage"), named("chat seeded-stub"));
        assert_eq!((runs.len(), stages.len(), calls.len(), spans.len()), (1, 3, 3, 7), "{case}: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
        let run = runs[0];
        assert!(run.parent.is_empty(), "{case}: the run span is a root");
        assert!(spans.iter().all(|s| s.trace_id == run.trace_id && s.trace_id.len() == 16), "{case}: one trace");
        assert!(stages.iter().all(|s| s.parent == run.span_id), "{case}: stages under the run");
        for call in &calls {
            assert!(stages.iter().any(|s| s.span_id == call.parent), "{case}: each call under its stage");
            assert_eq!(call.kind, 3, "{case}: SPAN_KIND_CLIENT");
            assert_eq!(call.status, 0, "{case}: unset status on success");
            assert_eq!(call.attrs["gen_ai.operation.name"], "chat");
            assert_eq!(call.attrs["gen_ai.provider.name"], "stub");
            assert_eq!(call.attrs["gen_ai.request.model"], "seeded-stub");
            assert!(call.attrs["gen_ai.usage.input_tokens"].parse::<u64>().unwrap() > 0);
            assert_eq!(call.attrs["fabric.run_id"], run.attrs["fabric.run_id"]);
        }
        for span in &spans {
            assert_eq!(span.scope, ("fabric-runtime".to_owned(), env!("CARGO_PKG_VERSION").to_owned()), "{case}: the scope and its version");
            assert_eq!(span.resource["service.name"], "fabric-runtime", "{case}");
            assert!(span.attrs.values().all(|v| !v.contains("PRIVATE-MARKER")), "{case}");
        }
    }
    // `OTEL_TRACES_EXPORTER=none` switches the exporter off, endpoint or not.
    inbox.lock().unwrap().clear();
    let out = fabric_run(goal, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url), ("OTEL_TRACES_EXPORTER", "none")]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(inbox.lock().unwrap().is_empty(), "no export with OTEL_TRACES_EXPORTER=none");
    // The service is named by `OTEL_RESOURCE_ATTRIBUTES` when it says so; legacy span names on request.
    let traces = format!("{url}/v1/traces");
    let out = fabric_run(
        goal,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=support-fleet-7,deployment.environment=test"),
            ("FABRIC_OTEL_SPAN_NAMES", "legacy"),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0));
    let spans = flatten(&inbox);
    assert!(!spans.is_empty());
    assert!(spans.iter().all(|s| s.resource["service.name"] == "support-fleet-7" && s.resource["deployment.environment"] == "test"));
    assert_eq!(spans.iter().filter(|s| s.name == "llm.complete").count(), 3, "the contract's names with FABRIC_OTEL_SPAN_NAMES=legacy");
    // `OTEL_SERVICE_NAME` wins over a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, as specified.
    inbox.lock().unwrap().clear();
    let both = [
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.as_str()),
        ("OTEL_SERVICE_NAME", "named-here"),
        ("OTEL_RESOURCE_ATTRIBUTES", "service.name=not-this,deployment.environment=prod"),
    ];
    assert_eq!(fabric_run(goal, &both).await.status.code(), Some(0));
    let spans = flatten(&inbox);
    assert!(!spans.is_empty() && spans.iter().all(|s| s.resource["service.name"] == "named-here" && s.resource["deployment.environment"] == "prod"));
}

#[tokio::test]
async fn otel_settings_this_build_cannot_honour_are_refused_at_start() {
    let (url, inbox) = collector(200).await;
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("FABRIC_OTEL_SPAN_NAMES", "fancy"),
        ("FABRIC_OTEL_FLUSH_MS", "soon"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ("OTEL_SDK_DISABLED", "yes"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=fine,api-key-secret-123"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=line\nbreak"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ssl/collector.pem"),
        ("OTEL_BSP_SCHEDULE_DELAY", "abc"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "-5"),
        ("OTEL_TRACES_SAMPLER", "bogus"),
        ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ("OTEL_RESOURCE_ATTRIBUTES", "garbage"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://user:pw@host/x"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/q?token=abc"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/\u{1b}[2J"),
    ] {
        let out = fabric_run(r#"{"ticket":"x"}"#, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &url), (var, value)]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(stderr.contains(var), "{var}={value}: the message names the variable: {stderr}");
        assert!(out.stdout.is_empty(), "{var}={value}: nothing ran");
        for secret in ["api-key-secret", "user:pw", "token=abc", "\u{1b}"] {
            assert!(!stderr.contains(secret), "{var}={value}: the message repeats `{secret:?}`: {stderr}");
        }
    }
    // A value that is not UTF-8 would read as unset: it is refused too.
    {
        use std::os::unix::ffi::OsStrExt;
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.current_dir(repo()).envs(fixture_env()).args(["run", "support-triage", "--goal", r#"{"ticket":"x"}"#]).env("FABRIC_LLM_STUB", "1");
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &url).env("OTEL_TRACES_EXPORTER", std::ffi::OsStr::from_bytes(b"n\xffne"));
        let out = cmd.output().await.unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("OTEL_TRACES_EXPORTER: the value is not valid UTF-8"));
    }
    assert!(inbox.lock().unwrap().is_empty());
}

#[tokio::test]
async fn export_failures_are_told_once_and_never_change_the_exit_code() {
    let told = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).matches("OpenTelemetry:").count();
    // A collector that answers 503: the exporter's retries end within its timeout, then one line.
    let (url, inbox) = collector(503).await;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("OTEL_EXPORTER_OTLP_TIMEOUT", "400"), ("FABRIC_OTEL_FLUSH_MS", "10000")];
    let out = fabric_run(r#"{"ticket":"x"}"#, &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(told(&out), 1, "{stderr}");
    assert!(stderr.contains("503"), "{stderr}");
    assert!(!inbox.lock().unwrap().is_empty());
    // Nothing listening, and a URL with credentials: one line, no secret in it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://collector:hunter2@127.0.0.1:{closed}/v1/traces?api_key=sekrit");
    let out = fabric_run(r#"{"ticket":"x"}"#, &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint), ("FABRIC_OTEL_FLUSH_MS", "1500")]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(told(&out), 1, "{stderr}");
    assert!(!stderr.contains("hunter2") && !stderr.contains("sekrit"), "{stderr}");
    // A collector that accepts connections and never answers: the flush deadline ends the wait.
    let (port, held) = silent_collector().await;
    let started = std::time::Instant::now();
    let out = fabric_run(r#"{"ticket":"x"}"#, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://127.0.0.1:{port}")), ("FABRIC_OTEL_FLUSH_MS", "300")]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(told(&out), 1, "{stderr}");
    assert!(stderr.contains("flush deadline"), "{stderr}");
    // Far below the exporter's own 10 s timeout, whatever the machine's load.
    assert!(started.elapsed() < std::time::Duration::from_secs(8), "the deadline held: {:?}", started.elapsed());
    // `FABRIC_OTEL_FLUSH_MS=0`: no wait at all, and nothing to say about it.
    let out = fabric_run(r#"{"ticket":"x"}"#, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://127.0.0.1:{port}")), ("FABRIC_OTEL_FLUSH_MS", "0")]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    held.abort();
}

#[tokio::test]
async fn the_service_logs_an_export_failure_once() {
    let (url, inbox) = collector(503).await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("OTEL_EXPORTER_OTLP_TIMEOUT", "200"), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let server = crate::service::Server::start(&db, &stub_dir(), &env);
    for i in 0..3 {
        let body = json!({"route_id": "support-triage", "goal": {"ticket": format!("t{i}")}, "model_profile": "default"});
        let (status, view) = crate::service::post(&server, "/v1/runs?wait=true", body).await;
        assert!(matches!(status, 200 | 201), "{status} {view}");
    }
    // Batches go out every 100 ms; wait until the collector has refused a few.
    for _ in 0..100 {
        if inbox.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("could not be exported")).collect();
    assert_eq!(lines.len(), 1, "{logs}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
}

#[tokio::test]
async fn the_exporter_follows_no_redirect_with_its_headers() {
    let elsewhere: Arc<Mutex<Vec<axum::http::HeaderMap>>> = Arc::default();
    let seen = elsewhere.clone();
    let other = serve(axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(headers);
            ""
        }
    }))
    .await;
    let to = format!("{other}/v1/traces");
    let collector = serve(axum::Router::new().fallback(move || {
        let to = to.clone();
        async move { axum::response::Redirect::temporary(&to) }
    }))
    .await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .envs(fixture_env())
        .args(["run", "support-triage", "--goal", r#"{"ticket":"x"}"#])
        .env("FABRIC_LLM_STUB", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=collector-secret")
        .env_remove("OTEL_SDK_DISABLED")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "an export failure never changes the run's exit code");
    assert!(elsewhere.lock().unwrap().is_empty(), "the collector key went to another host");
}

#[tokio::test]
async fn agent_runs_and_tool_calls_are_genai_spans() {
    let exporter = exporter();
    let kb = serve(axum::Router::new().route(
        "/search",
        axum::routing::get(|axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>| async move {
            match q.get("q").map(String::as_str) {
                Some("boom") => Err((axum::http::StatusCode::INTERNAL_SERVER_ERROR, "index offline")),
                _ => Ok(axum::Json(json!({"hits": []}))),
            }
        }),
    ))
    .await;
    let script = [r#"CALL kb_search {"q":"refund"}"#, r#"CALL kb_search {"q":"boom"}"#, r#"CALL add {"a":2,"b":3}"#, "DONE Refunded."];
    let stub = fabric::llm::stub::StubLlm::default().strict(true).script("support-agent", "decide", &script);
    let cat = Arc::new(fabric::catalogue::load(&routes_dir(), &packs_dir()));
    let vars = Arc::new(move |k: &str| (k == "KB_SEARCH_URL").then(|| kb.clone()));
    let runner = Runner::new(cat, fabric::llm::stack::build(stub, RetryPolicy::default()), vars).unwrap().with_tool("add", fabric::tools::builtin_add());
    let goal = json!({"question": "Was I refunded?"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-agent".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    assert_eq!(result.output(), Some("Refunded."), "{result:?}");
    let spans = spans_of(exporter, &result.run_id);
    let agent: Vec<&SpanData> = spans.iter().filter(|s| s.name == "invoke_agent support-agent").collect();
    assert_eq!(agent.len(), 1, "{:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    assert_eq!(attr(agent[0], "gen_ai.operation.name").unwrap().as_str(), "invoke_agent");
    assert_eq!(attr(agent[0], "gen_ai.agent.name").unwrap().as_str(), "support-agent");
    let stage_ids: Vec<_> = spans.iter().filter(|s| s.name == "stage").map(|s| s.span_context.span_id()).collect();
    let tools: Vec<&SpanData> = spans.iter().filter(|s| s.name.starts_with("execute_tool ")).collect();
    let names: Vec<&str> = tools.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["execute_tool kb_search", "execute_tool kb_search", "execute_tool add"]);
    for (span, (tool, kind)) in tools.iter().zip([("kb_search", "extension"), ("kb_search", "extension"), ("add", "function")]) {
        assert_eq!(attr(span, "gen_ai.operation.name").unwrap().as_str(), "execute_tool");
        assert_eq!(attr(span, "gen_ai.tool.name").unwrap().as_str(), tool);
        assert_eq!(attr(span, "gen_ai.tool.type").unwrap().as_str(), kind);
        assert!(stage_ids.contains(&span.parent_span_id), "a tool span is a child of its stage's span");
    }
    assert!(matches!(tools[0].status, opentelemetry::trace::Status::Unset));
    // The status names the class only: the tool's answer ("index offline") is not repeated.
    assert_eq!(tools[1].status, opentelemetry::trace::Status::error("tool_http_status"), "the failed call is marked");
    assert_eq!(attr(tools[1], "error.type").unwrap().as_str(), "tool_http_status");
    assert_eq!(spans.iter().filter(|s| s.name == "chat seeded-stub").count(), 4, "one chat span per turn");
}

#[tokio::test]
async fn a_second_signal_stops_the_service_even_while_it_flushes_spans() {
    // A collector that accepts connections and never answers, and a long flush deadline.
    let (port, held) = silent_collector().await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("FABRIC_OTEL_FLUSH_MS", "60000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")];
    let mut server = crate::service::Server::start(&db, &stub_dir(), &env);
    let body = json!({"route_id": "support-triage", "goal": {"ticket": "t"}, "model_profile": "default"});
    let (status, _) = crate::service::post(&server, "/v1/runs?wait=true", body).await;
    assert!(matches!(status, 200 | 201));
    server.signal("TERM");
    // Past the drain (no run is left), the process waits on the flush; a second signal ends it.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(server.child.try_wait().unwrap().is_none(), "still flushing to the silent collector");
    server.signal("TERM");
    let mut exited = None;
    for _ in 0..100 {
        if let Some(status) = server.child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let status = exited.expect("the second SIGTERM stopped the process (not the 60 s flush deadline)");
    assert_eq!(status.code(), Some(143), "{}", server.logs());
    held.abort();
}
