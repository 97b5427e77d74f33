//! Spans: one `llm.complete` per logical model call (retries inside it), under stage and run
//! spans, with the GenAI attributes; OTLP export only when the standard variables ask for it.

use std::sync::{Arc, Mutex, OnceLock};

use fabric::config::{ProviderKind, RetryPolicy, Tuning};
use fabric::events::MemorySink;
use fabric::exec::{RunRequest, Runner};
use fabric::llm::providers::backend_for;
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;

use crate::support::{Canned, FakeProvider, repo, serve, triage_reply_for};

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
            json!({"choices": [{"message": {"content": triage_reply_for(&props).to_string()}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 5}}),
        )
    });
    f.push(Canned::json(503, json!({"error": {"message": "busy"}}))).push(Canned::json(503, json!({"error": {"message": "busy"}})));
    let url = f.start().await;
    let target = crate::support::target(ProviderKind::OpenAi, &url, "gpt-test");
    let retry = RetryPolicy { max_attempts: 3, base: std::time::Duration::from_millis(5), max_backoff: std::time::Duration::from_millis(50) };
    let llm = fabric::llm::stack::build(
        backend_for(fabric::llm::providers::shared_client().unwrap(), target, Tuning::default(), fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES),
        retry,
    );
    let cat = Arc::new(fabric::catalogue::load(&repo().join("routes"), &repo().join("prompt-packs")));
    let runner = Runner::new(cat, llm, Arc::new(|_: &str| None)).unwrap();
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    assert_eq!(f.requests().len(), 5, "two retries happened");
    let spans = spans_of(exporter, &result.run_id);
    let named = |n: &str| spans.iter().filter(|s| s.name == n).cloned().collect::<Vec<_>>();
    let (runs, stages, calls) = (named("run"), named("stage"), named("llm.complete"));
    assert_eq!((runs.len(), stages.len(), calls.len()), (1, 3, 3), "one llm.complete per stage, retries included");
    assert!(stages.iter().all(|s| s.parent_span_id == runs[0].span_context.span_id()), "stage spans are children of the run span");
    for call in &calls {
        assert!(stages.iter().any(|s| s.span_context.span_id() == call.parent_span_id), "llm.complete is a child of its stage span");
        assert_eq!(attr(call, "gen_ai.provider.name").unwrap().as_str(), "openai");
        assert_eq!(attr(call, "gen_ai.request.model").unwrap().as_str(), "gpt-test");
        assert_eq!(attr(call, "gen_ai.operation.name").unwrap().as_str(), "chat");
        assert_eq!(attr(call, "gen_ai.usage.input_tokens"), Some(&OtelValue::I64(12)));
        assert_eq!(attr(call, "gen_ai.usage.output_tokens"), Some(&OtelValue::I64(5)));
    }
    assert_eq!(attr(&runs[0], "fabric.route_id").unwrap().as_str(), "support-triage");
}

#[tokio::test]
async fn failed_calls_mark_their_spans() {
    let exporter = exporter();
    let stub = fabric::llm::stub::StubLlm::default().script("support-triage", "intake", &["not json"]);
    let cat = Arc::new(fabric::catalogue::load(&repo().join("routes"), &repo().join("prompt-packs")));
    let runner = Runner::new(cat, fabric::llm::stack::build(stub, RetryPolicy::default()), Arc::new(|_: &str| None)).unwrap();
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    let spans = spans_of(exporter, &result.run_id);
    let call = spans.iter().find(|s| s.name == "llm.complete").unwrap();
    assert_eq!(attr(call, "error.type").unwrap().as_str(), "invalid_json");
    assert!(matches!(call.status, opentelemetry::trace::Status::Error { .. }));
    let run = spans.iter().find(|s| s.name == "run").unwrap();
    assert_eq!(attr(run, "error.type").unwrap().as_str(), "invalid_json");
}

#[tokio::test]
async fn otlp_export_only_when_configured() {
    // (path, body) of every request the collector received.
    type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let received: Received = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, body: axum::body::Bytes| {
        let sink = sink.clone();
        async move {
            sink.lock().unwrap().push((uri.path().to_owned(), body.to_vec()));
            ""
        }
    });
    let url = serve(app).await;
    let run_with = |otel: Option<String>, extra: &[(&str, &str)]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.current_dir(repo()).args(["run", "support-triage", "--goal", r#"{"ticket":"x"}"#]).env("FABRIC_LLM_STUB", "1");
        for v in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
            "OTEL_SERVICE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES",
        ] {
            cmd.env_remove(v);
        }
        if let Some(endpoint) = otel {
            cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.output()
    };
    let run = |otel: Option<String>| run_with(otel, &[]);
    let out = run(None).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(received.lock().unwrap().is_empty());
    let out = run(Some(url.clone())).await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let got = received.lock().unwrap().clone();
    assert!(!got.is_empty(), "spans were exported at exit");
    assert!(got.iter().all(|(path, _)| path == "/v1/traces"));
    let body: Vec<u8> = got.into_iter().flat_map(|(_, b)| b).collect();
    let contains = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    for needle in ["llm.complete", "gen_ai.request.model", "seeded-stub", "fabric-runtime"] {
        assert!(contains(needle), "exported spans mention {needle}");
    }
    // `OTEL_TRACES_EXPORTER=none` switches the exporter off, endpoint or not.
    received.lock().unwrap().clear();
    let out = run_with(Some(url.clone()), &[("OTEL_TRACES_EXPORTER", "none")]).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(received.lock().unwrap().is_empty(), "no export with OTEL_TRACES_EXPORTER=none");
    // The service is named by `OTEL_RESOURCE_ATTRIBUTES` when it says so.
    let out = run_with(Some(url), &[("OTEL_RESOURCE_ATTRIBUTES", "service.name=support-fleet-7,deployment.environment=test")]).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let body: Vec<u8> = received.lock().unwrap().iter().flat_map(|(_, b)| b.clone()).collect();
    let contains = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(contains("support-fleet-7") && contains("deployment.environment"), "the resource of OTEL_RESOURCE_ATTRIBUTES");
    assert!(!contains("unknown_service"), "its service name, not the SDK's default");
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
