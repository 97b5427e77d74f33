//! Real providers against in-process fakes that speak their wire formats: request bodies field
//! by field, replies, errors, retries and the events they produce.

use std::sync::Arc;
use std::time::Duration;

use fabric::catalogue::{self, Catalogue};
use fabric::config::{ProviderKind, RetryPolicy, Settings, Tuning, parse_model_string};
use fabric::events::{Event, MemorySink};
use fabric::exec::{RunRequest, RunResult, RunStatus, Runner};
use fabric::llm::providers::backend_for;
use serde_json::{Value, json};

use crate::support::{Canned, FakeProvider, fabric_cli, fixtures, packs_dir, routes_dir, target, triage_reply_for};

fn props_of(schema: Option<&Value>) -> Vec<String> {
    schema.and_then(|s| s.get("properties")).and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// A fake answering like each provider does, for support-triage.
fn fake(kind: ProviderKind) -> FakeProvider {
    FakeProvider::new(move |body| {
        let reply = match kind {
            ProviderKind::Ollama => {
                let r = triage_reply_for(&props_of(body.get("format")));
                json!({"model": body["model"], "created_at": "2026-11-29T00:00:00Z", "message": {"role": "assistant", "content": r.to_string()}, "done": true, "done_reason": "stop", "prompt_eval_count": 31, "eval_count": 9})
            }
            ProviderKind::OpenAi => {
                let r = triage_reply_for(&props_of(body.pointer("/response_format/json_schema/schema")));
                json!({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"], "choices": [{"index": 0, "message": {"role": "assistant", "content": r.to_string(), "refusal": null}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}})
            }
            ProviderKind::Gemini => {
                let r = triage_reply_for(&props_of(body.pointer("/generationConfig/responseJsonSchema")));
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "thinking…", "thought": true}, {"text": r.to_string()}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 31, "candidatesTokenCount": 7, "thoughtsTokenCount": 2, "totalTokenCount": 40}})
            }
            ProviderKind::Anthropic => {
                let r = triage_reply_for(&props_of(body.pointer("/tools/0/input_schema")));
                let name = body.pointer("/tool_choice/name").cloned().unwrap_or(json!("x"));
                json!({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": [{"type": "text", "text": "Let me answer with the tool."}, {"type": "tool_use", "id": "toolu_1", "name": name, "input": r}], "stop_reason": "tool_use", "usage": {"input_tokens": 31, "output_tokens": 9}})
            }
            cloud @ (ProviderKind::Bedrock | ProviderKind::BedrockConverse | ProviderKind::VertexAi | ProviderKind::HostedAnthropic(_)) => {
                crate::support::reply_json(cloud, body)
            }
            ProviderKind::Compat(_) | ProviderKind::Ibm => {
                crate::support::compat_reply(body, &triage_reply_for(&props_of(crate::support::compat_schema(body))))
            }
            ProviderKind::Cohere => crate::support::cohere_reply(&triage_reply_for(&props_of(body.pointer("/response_format/schema")))),
        };
        Canned::json(200, reply)
    })
}

fn shipped() -> Arc<Catalogue> {
    Arc::new(catalogue::load(&routes_dir(), &packs_dir()))
}

const FAST_RETRY: RetryPolicy = RetryPolicy { max_attempts: 3, base: Duration::from_millis(5), max_backoff: Duration::from_millis(300), jitter_seed: None };

async fn run_with(kind: ProviderKind, base_url: &str, retry: RetryPolicy) -> (RunResult, Vec<Event>) {
    let llm = fabric::llm::stack::build(
        backend_for(
            fabric::llm::providers::shared_client().unwrap(),
            target(kind, base_url, "m-1"),
            Tuning::default(),
            fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES,
        ),
        retry,
    );
    let runner = Runner::new(shipped(), llm, Arc::new(|_: &str| None)).unwrap();
    let sink = Arc::new(MemorySink::default());
    let goal = json!({"ticket": "charged twice"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, sink.clone()).await.unwrap();
    (result, sink.events())
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

#[test]
fn model_strings_agree_with_langchain() {
    let text = std::fs::read_to_string(fixtures().join("parity/model_strings.jsonl")).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let input = case["input"].as_str().unwrap();
        let got = parse_model_string(input);
        match case.get("error") {
            Some(_) => assert_eq!(got, None, "{input}"),
            None => assert_eq!(got, Some((case["provider"].as_str().unwrap().to_owned(), case["model"].as_str().unwrap().to_owned())), "{input}"),
        }
        // As FABRIC_LLM_MODEL: supported providers resolve; the others are named in the error.
        let vars = [("FABRIC_LLM_MODEL", input.to_owned()), ("OPENAI_API_KEY", "k".into()), ("ANTHROPIC_API_KEY", "k".into()), ("GOOGLE_API_KEY", "k".into())];
        // Every key of the OpenAI-compatible family set too, and its endpoints where it has no public one.
        let family = [
            ("MISTRAL_API_KEY", "k"),
            ("DEEPSEEK_API_KEY", "k"),
            ("XAI_API_KEY", "k"),
            ("FIREWORKS_API_KEY", "k"),
            ("PPLX_API_KEY", "k"),
            ("AZURE_OPENAI_API_KEY", "k"),
            ("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com"),
            ("OPENAI_API_VERSION", "2024-10-21"),
            ("COHERE_API_KEY", "k"),
        ];
        let family: Vec<(&str, String)> = family.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let settings = Settings::load(move |k| vars.iter().chain(&family).find(|(n, _)| *n == k).map(|(_, v)| v.clone()));
        match (case.get("provider").and_then(Value::as_str), settings) {
            // The cloud providers resolve too, and then need their credentials (none are set here).
            (Some(p @ ("bedrock" | "bedrock_converse" | "google_vertexai")), Err(e)) if !case["model"].as_str().unwrap().is_empty() => {
                assert!(e.message.contains(&format!("is required for provider {p}")), "{input}: {e}")
            }
            (Some(p), s) if ProviderKind::from_key(p).is_some() && !case["model"].as_str().unwrap().is_empty() => {
                let t = s.unwrap().target.unwrap();
                assert_eq!((t.provider.key(), t.model.as_str()), (p, case["model"].as_str().unwrap()), "{input}");
            }
            (Some(p), Err(e)) => assert!(e.to_string().contains(&format!("`{p}`")) || e.message.contains("names no model"), "{input}: {e}"),
            (None, Err(e)) => assert!(e.message.contains("cannot tell the provider"), "{input}: {e}"),
            (p, s) => panic!("{input}: {p:?} {s:?}"),
        }
        n += 1;
    }
    assert_eq!(n, 24);
}

#[tokio::test]
async fn support_triage_runs_on_every_provider() {
    for kind in [ProviderKind::Ollama, ProviderKind::OpenAi, ProviderKind::Gemini, ProviderKind::Anthropic] {
        let fake = fake(kind);
        let url = fake.start().await;
        let (result, events) = run_with(kind, &url, FAST_RETRY).await;
        assert_eq!(result.status(), RunStatus::Completed, "{kind:?}: {result:?}");
        assert_eq!(result.slots["intake"], r#"{"category":"billing","urgency":"high"}"#, "{kind:?}");
        assert_eq!(result.output(), Some("Refunded."), "{kind:?}");
        let completed: Vec<&Event> = events.iter().filter(|e| e.kind == "run.llm.completed").collect();
        assert_eq!(completed.len(), 3);
        assert_eq!(completed[0].to_json()["input_tokens"], 31, "{kind:?}");
        assert_eq!(completed[0].to_json()["output_tokens"], 9, "{kind:?}");
        let started = events.iter().find(|e| e.kind == "run.llm.started").unwrap();
        assert_eq!((started.to_json()["provider"].as_str(), started.to_json()["model"].as_str()), (Some(kind.key()), Some("m-1")));
        assert_eq!(fake.requests().len(), 3);
    }
}

#[tokio::test]
async fn request_bodies_field_by_field() {
    let sys = "You are the support desk assistant of Example Corp. Be accurate and brief.\nClassify the customer's ticket. Reply with the category and the urgency only.\n";
    let user = r#"goal: {"ticket":"charged twice"}"#;
    let classify_schema = json!({"type":"object","properties":{"category":{"type":"string","enum":["billing","technical","other"]},"urgency":{"type":"string","enum":["low","high"]}},"required":["category","urgency"]});

    let f = fake(ProviderKind::Ollama);
    run_with(ProviderKind::Ollama, &f.start().await, FAST_RETRY).await;
    let r = &f.requests()[0];
    assert_eq!(r.path, "/api/chat");
    assert_eq!(
        r.body,
        json!({"model": "m-1", "stream": false, "messages": [{"role": "system", "content": sys}, {"role": "user", "content": user}], "options": {"temperature": 0.1, "num_predict": 4096}, "format": classify_schema})
    );
    assert_eq!(r.headers["authorization"], "Bearer test-key-123");

    let f = fake(ProviderKind::OpenAi);
    run_with(ProviderKind::OpenAi, &f.start().await, FAST_RETRY).await;
    let r = &f.requests()[0];
    assert_eq!(r.path, "/chat/completions");
    let mut strict_schema = classify_schema.clone();
    strict_schema["additionalProperties"] = json!(false);
    assert_eq!(
        r.body,
        json!({"model": "m-1", "stream": false, "messages": [{"role": "system", "content": sys}, {"role": "user", "content": user}], "temperature": 0.1, "max_completion_tokens": 4096,
               "response_format": {"type": "json_schema", "json_schema": {"name": "intake", "strict": true, "schema": strict_schema}}})
    );
    assert_eq!(r.headers["authorization"], "Bearer test-key-123");
    // The synthesis stage's schema has an optional-free single property: strict too; plain text calls send no response_format.

    let f = fake(ProviderKind::Gemini);
    run_with(ProviderKind::Gemini, &f.start().await, FAST_RETRY).await;
    let r = &f.requests()[0];
    assert_eq!(r.path, "/v1/models/m-1:generateContent", "google-genai 3.6's default version");
    assert_eq!(
        r.body,
        json!({"contents": [{"role": "user", "parts": [{"text": user}]}], "systemInstruction": {"parts": [{"text": sys}]},
               "generationConfig": {"temperature": 0.1, "maxOutputTokens": 4096, "candidateCount": 1, "responseMimeType": "application/json", "responseJsonSchema": classify_schema}})
    );
    assert_eq!(r.headers["x-goog-api-key"], "test-key-123");
    assert!(r.headers.get("authorization").is_none());

    let f = fake(ProviderKind::Anthropic);
    run_with(ProviderKind::Anthropic, &f.start().await, FAST_RETRY).await;
    let r = &f.requests()[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(
        r.body,
        json!({"model": "m-1", "max_tokens": 4096, "system": sys, "messages": [{"role": "user", "content": user}], "temperature": 0.1,
               "tools": [{"name": "intake", "description": "Reply with the result in this shape.", "input_schema": classify_schema}], "tool_choice": {"type": "tool", "name": "intake"}})
    );
    assert_eq!(r.headers["x-api-key"], "test-key-123");
    assert_eq!(r.headers["anthropic-version"], "2023-06-01");
}

#[tokio::test]
async fn every_provider_request_names_the_runtime_in_its_user_agent() {
    for kind in [ProviderKind::Ollama, ProviderKind::OpenAi, ProviderKind::Gemini, ProviderKind::Anthropic] {
        let f = fake(kind);
        run_with(kind, &f.start().await, FAST_RETRY).await;
        let r = &f.requests()[0];
        assert_eq!(r.headers["user-agent"], concat!("fabric-runtime/", env!("CARGO_PKG_VERSION")), "{kind:?}");
    }
}

/// LangChain reads Ollama's and Gemini's structured replies as Markdown and accepts one in a code
/// fence; OpenAI's it reads as JSON only. The runtime does the same, provider by provider.
#[tokio::test]
async fn a_fenced_reply_is_accepted_where_the_reference_accepts_it() {
    for (kind, accepted) in [(ProviderKind::Ollama, true), (ProviderKind::Gemini, true), (ProviderKind::OpenAi, false)] {
        let f = FakeProvider::new(move |body| {
            let schema = match kind {
                ProviderKind::Ollama => body.get("format").cloned(),
                ProviderKind::Gemini => body.pointer("/generationConfig/responseJsonSchema").cloned(),
                _ => body.pointer("/response_format/json_schema/schema").cloned(),
            };
            let fenced = format!("```json\n{}\n```", triage_reply_for(&props_of(schema.as_ref())));
            Canned::json(
                200,
                match kind {
                    ProviderKind::Ollama => json!({"message": {"role": "assistant", "content": fenced}, "done": true}),
                    ProviderKind::Gemini => json!({"candidates": [{"content": {"role": "model", "parts": [{"text": fenced}]}, "finishReason": "STOP"}]}),
                    _ => json!({"choices": [{"message": {"role": "assistant", "content": fenced}, "finish_reason": "stop"}]}),
                },
            )
        });
        let (result, _) = run_with(kind, &f.start().await, FAST_RETRY).await;
        if accepted {
            assert_eq!(result.status(), fabric::exec::RunStatus::Completed, "{kind:?}: {result:?}");
        } else {
            assert_eq!(result.error().map(|e| e.reason_class.as_str()), Some("invalid_json"), "{kind:?}: {result:?}");
        }
    }
}

/// A fenced reply that fails its schema is shown in `run.llm.failed` as received: fence and all.
#[tokio::test]
async fn a_fenced_reply_that_fails_is_reported_as_received() {
    let fenced = "```json\n{\"category\": \"sales\", \"urgency\": \"high\"}\n```";
    let f = FakeProvider::new(move |_| Canned::json(200, json!({"message": {"role": "assistant", "content": fenced}, "done": true})));
    let (result, events) = run_with(ProviderKind::Ollama, &f.start().await, FAST_RETRY).await;
    assert_eq!(result.error().map(|e| e.reason_class.as_str()), Some("schema_validation"), "{result:?}");
    let failed = events.iter().find(|e| e.kind.as_str() == "run.llm.failed").unwrap();
    assert_eq!(failed.to_json()["reply"], fenced);
}

#[tokio::test]
async fn plain_text_calls_on_every_provider() {
    // refund-review's `policy` stage has no output schema: a plain text call.
    let kinds =
        [ProviderKind::Ollama, ProviderKind::OpenAi, ProviderKind::Gemini, ProviderKind::Anthropic, ProviderKind::BedrockConverse, ProviderKind::VertexAi];
    for kind in kinds {
        let f = FakeProvider::new(move |_| {
            Canned::json(
                200,
                match kind {
                    ProviderKind::Ollama => json!({"message": {"role": "assistant", "content": "plain words"}, "done": true}),
                    ProviderKind::OpenAi => json!({"choices": [{"message": {"content": "plain words"}, "finish_reason": "stop"}]}),
                    ProviderKind::Gemini => json!({"candidates": [{"content": {"parts": [{"text": "plain words"}]}, "finishReason": "STOP"}]}),
                    ProviderKind::Anthropic | ProviderKind::HostedAnthropic(_) => {
                        json!({"content": [{"type": "text", "text": "plain words"}], "stop_reason": "end_turn"})
                    }
                    ProviderKind::Bedrock | ProviderKind::BedrockConverse => {
                        json!({"output": {"message": {"role": "assistant", "content": [{"text": "plain words"}]}}, "stopReason": "end_turn"})
                    }
                    ProviderKind::VertexAi => json!({"candidates": [{"content": {"parts": [{"text": "plain words"}]}, "finishReason": "STOP"}]}),
                    ProviderKind::Compat(_) | ProviderKind::Ibm => crate::support::compat_reply(&json!({"model": "m"}), &json!("plain words")),
                    ProviderKind::Cohere => crate::support::cohere_reply(&json!("plain words")),
                },
            )
        });
        let url = f.start().await;
        let llm = fabric::llm::stack::build(
            backend_for(
                fabric::llm::providers::shared_client().unwrap(),
                target(kind, &url, "m"),
                Tuning::default(),
                fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES,
            ),
            FAST_RETRY,
        );
        let cat = Arc::new(catalogue::load(&fixtures().join("providers/routes"), &packs_dir()));
        let runner = Runner::new(cat, llm, Arc::new(|_: &str| None)).unwrap();
        let goal = json!({"q": 1}).as_object().unwrap().clone();
        let result = runner.run(RunRequest { route_id: "plain".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
        assert_eq!(result.output(), Some("plain words"), "{kind:?}");
        let body = &f.requests()[0].body;
        for key in ["format", "response_format", "tools"] {
            assert!(body.get(key).is_none(), "{kind:?} sent {key}");
        }
        assert!(body.pointer("/generationConfig/responseMimeType").is_none());
    }
}

#[tokio::test]
async fn transient_errors_are_retried_within_one_logical_call() {
    let f = fake(ProviderKind::OpenAi);
    let err = json!({"error": {"message": "overloaded", "type": "server_error"}});
    f.push(Canned::json(503, err.clone())).push(Canned::json(503, err));
    let (result, events) = run_with(ProviderKind::OpenAi, &f.start().await, FAST_RETRY).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(f.requests().len(), 5, "3 attempts for intake, then 1 each");
    let intake: Vec<&'static str> = events.iter().filter(|e| e.stage_id.as_deref() == Some("intake")).map(|e| e.kind.as_str()).collect();
    assert_eq!(intake, ["run.stage.started", "run.llm.started", "run.llm.retrying", "run.llm.retrying", "run.llm.completed", "run.stage.completed"]);
    let retrying: Vec<&Event> = events.iter().filter(|e| e.kind == "run.llm.retrying").collect();
    assert_eq!((retrying[0].to_json()["attempt"].as_u64(), retrying[1].to_json()["attempt"].as_u64()), (Some(2), Some(3)));
    assert_eq!(retrying[0].to_json()["reason_class"], "server_error");
    assert!(retrying[0].to_json()["delay_ms"].as_u64().unwrap() <= 300);
}

#[tokio::test]
async fn retry_after_is_honoured_up_to_the_cap() {
    let f = fake(ProviderKind::Anthropic);
    let body = json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}});
    let mut canned = Canned::json(429, body.clone());
    canned.headers.push(("retry-after", "0.2".into()));
    f.push(canned);
    let mut canned = Canned::json(429, body);
    canned.headers.push(("retry-after", "3600".into()));
    f.push(canned);
    let (result, events) = run_with(ProviderKind::Anthropic, &f.start().await, FAST_RETRY).await;
    assert_eq!(result.status(), RunStatus::Completed);
    let delays: Vec<u64> = events.iter().filter(|e| e.kind == "run.llm.retrying").map(|e| e.to_json()["delay_ms"].as_u64().unwrap()).collect();
    assert_eq!(delays, [200, 300], "Retry-After 0.2 s, then 3600 s capped at 300 ms");
}

#[tokio::test]
async fn client_errors_and_bad_replies_fail_at_once() {
    for (canned, class) in [
        (Canned::json(400, json!({"error": {"message": "Invalid schema for response_format", "type": "invalid_request_error"}})), "client_error"),
        (Canned::json(401, json!({"error": {"message": "bad key"}})), "client_error"),
        (Canned::json(200, json!({"choices": [{"message": {"content": "not json"}, "finish_reason": "stop"}]})), "invalid_json"),
        (
            Canned::json(200, json!({"choices": [{"message": {"content": "{\"category\":\"sales\",\"urgency\":\"high\"}"}, "finish_reason": "stop"}]})),
            "schema_validation",
        ),
        (Canned::json(200, json!({"choices": [{"message": {"content": "{\"cat"}, "finish_reason": "length"}]})), "provider_error"),
        (Canned::json(200, json!({"unexpected": true})), "provider_error"),
    ] {
        let f = fake(ProviderKind::OpenAi);
        f.push(canned);
        let (result, events) = run_with(ProviderKind::OpenAi, &f.start().await, FAST_RETRY).await;
        assert_eq!(f.requests().len(), 1, "{class}: never retried");
        assert_eq!(result.status(), RunStatus::Failed);
        assert_eq!(result.error().unwrap().reason_class, class);
        assert_eq!(kinds(&events), ["run.started", "run.stage.started", "run.llm.started", "run.llm.failed", "run.stage.failed", "run.failed"], "{class}");
        assert_eq!(events[3].to_json()["reason_class"], class);
        assert!(!events[3].to_json()["message"].as_str().unwrap().contains("test-key-123"));
    }
}

#[tokio::test]
async fn connection_refused_and_timeouts_are_retried() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let (result, events) = run_with(ProviderKind::Ollama, &closed, FAST_RETRY).await;
    let error = result.error().unwrap();
    assert_eq!(error.reason_class, "connection");
    // It says where it tried (the origin only).
    assert!(error.message.starts_with(&format!("cannot connect to {closed}: ")), "{}", error.message);
    let with_secrets = closed.replace("http://", "http://user:s3cret@") + "/base?key=k3y";
    let (result, _) = run_with(ProviderKind::Ollama, &with_secrets, FAST_RETRY).await;
    let message = result.error().unwrap().message.clone();
    assert!(message.starts_with(&format!("cannot connect to {closed}: ")), "{message}");
    assert!(!message.contains("s3cret") && !message.contains("k3y") && !message.contains("user"), "{message}");
    assert_eq!(events.iter().filter(|e| e.kind == "run.llm.retrying").count(), 2);

    let f = fake(ProviderKind::Ollama);
    let mut slow = Canned::json(200, json!({}));
    slow.delay = Duration::from_secs(5);
    f.push(slow);
    let url = f.start().await;
    let backend = fabric::llm::providers::HttpBackend::new(
        reqwest::Client::new(),
        fabric::llm::providers::ollama::Ollama,
        target(ProviderKind::Ollama, &url, "m"),
        Tuning::default(),
    )
    .with_timeout(Duration::from_millis(300));
    let runner = Runner::new(shipped(), fabric::llm::stack::build(backend, FAST_RETRY), Arc::new(|_: &str| None)).unwrap();
    let sink = Arc::new(MemorySink::default());
    let goal = json!({"ticket": "x"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal, prefetch: vec![] }, sink.clone()).await.unwrap();
    assert_eq!(result.status(), RunStatus::Completed, "the timed-out attempt was retried");
    let retry = sink.events().into_iter().find(|e| e.kind == "run.llm.retrying").unwrap();
    assert_eq!(retry.to_json()["reason_class"], "timeout");
}

const GOAL: &str = r#"{"ticket":"I was charged twice"}"#;

#[tokio::test]
async fn the_cli_selects_each_provider_by_environment_alone() {
    for (kind, model_var, model, url_var, key_var) in [
        (ProviderKind::Ollama, "OLLAMA_MODEL", "qwen3:8b", "OLLAMA_BASE_URL", None),
        (ProviderKind::OpenAi, "FABRIC_LLM_MODEL", "openai:gpt-4o-mini", "OPENAI_BASE_URL", Some("OPENAI_API_KEY")),
        (ProviderKind::Gemini, "FABRIC_LLM_MODEL", "google_genai:gemini-2.5-flash", "GOOGLE_GEMINI_BASE_URL", Some("GEMINI_API_KEY")),
        (ProviderKind::Anthropic, "FABRIC_LLM_MODEL", "claude-sonnet-4-5", "ANTHROPIC_BASE_URL", Some("ANTHROPIC_API_KEY")),
    ] {
        let f = fake(kind);
        let url = f.start().await;
        let mut env = vec![(model_var, model.to_owned()), (url_var, url), ("FABRIC_LLM_RETRY_BASE_S", "0.01".to_owned())];
        if let Some(k) = key_var {
            env.push((k, "sk-never-printed".into()));
        }
        let out = fabric_cli(&["run", "support-triage", "--goal", GOAL, "--events-out", "-"], &env).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{kind:?}: {stderr}");
        assert!(stdout.contains(r#""output":"Refunded.""#), "{kind:?}: {stdout}");
        assert!(!stdout.contains("sk-never-printed") && !stderr.contains("sk-never-printed"));
        assert_eq!(f.requests().len(), 3, "{kind:?}");
        let model_sent = match kind {
            ProviderKind::Gemini => f.requests()[0].path.clone(),
            _ => f.requests()[0].body["model"].as_str().unwrap().to_owned(),
        };
        assert!(model_sent.contains(model.rsplit(':').next().unwrap()), "{kind:?}: {model_sent}");
    }
}

#[tokio::test]
async fn missing_keys_and_bad_values_stop_before_inference() {
    let f = fake(ProviderKind::OpenAi);
    let url = f.start().await;
    for (env, needle) in [
        (vec![("FABRIC_LLM_MODEL", "openai:gpt-4o".to_owned())], "OPENAI_API_KEY: is required for provider openai"),
        (vec![("FABRIC_LLM_MODEL", "gemini-2.5-flash".to_owned())], "GOOGLE_APPLICATION_CREDENTIALS: is required for provider google_vertexai"),
        (
            vec![("FABRIC_LLM_MODEL", "openai:x".to_owned()), ("OPENAI_BASE_URL", url.clone()), ("FABRIC_LLM_RETRY_MAX", "many".to_owned())],
            "FABRIC_LLM_RETRY_MAX",
        ),
        (vec![("FABRIC_LLM_MODEL", "openai:x".to_owned()), ("OPENAI_BASE_URL", "not a url".to_owned())], "OPENAI_BASE_URL: `not a url` is not an http(s) URL"),
    ] {
        let out = fabric_cli(&["run", "support-triage", "--goal", GOAL], &env).await;
        assert_eq!(out.status.code(), Some(2), "{env:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(needle), "{env:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(f.requests().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn model_profiles_select_the_model_only_when_asked() {
    let default = fake(ProviderKind::OpenAi);
    let default_url = default.start().await;
    let profiled = fake(ProviderKind::Anthropic);
    let profiled_url = profiled.start().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    std::fs::copy(routes_dir().join("support-triage.yaml"), routes.join("support-triage.yaml")).unwrap();
    std::fs::write(
        routes.join("profiles.yaml"),
        format!("profiles:\n  default:\n    provider: anthropic\n    model: claude-haiku-4-5\n    base_url: {profiled_url}\n    api_key_env: TEAM_ANTHROPIC_KEY\n    max_tokens: 512\n"),
    )
    .unwrap();
    let cat = routes.to_str().unwrap();
    let base = vec![("FABRIC_LLM_MODEL", "openai:gpt-4o-mini".to_owned()), ("OPENAI_BASE_URL", default_url), ("OPENAI_API_KEY", "k".to_owned())];
    // Default: the profile is metadata only.
    let out = fabric_cli(&["--catalogue", cat, "run", "support-triage", "--goal", GOAL], &base).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((default.requests().len(), profiled.requests().len()), (3, 0));
    // Opt-in: the profile routes to its own endpoint (a custom base URL needs no key).
    let mut env = base.clone();
    env.push(("FABRIC_HONOR_MODEL_PROFILE", "1".into()));
    let out = fabric_cli(&["--catalogue", cat, "run", "support-triage", "--goal", GOAL], &env).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(profiled.requests().len(), 3);
    let r = &profiled.requests()[0];
    assert_eq!(r.body["model"], "claude-haiku-4-5");
    assert_eq!(r.body["max_tokens"], 512, "tuning merges over the defaults");
    assert_eq!(r.body["temperature"], 0.1, "unset tuning keeps the default");
    std::fs::write(
        routes.join("profiles.yaml"),
        "profiles:\n  default:\n    provider: anthropic\n    model: claude-haiku-4-5\n    api_key_env: TEAM_ANTHROPIC_KEY\n",
    )
    .unwrap();
    let out = fabric_cli(&["--catalogue", cat, "run", "support-triage", "--goal", GOAL], &env).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("model profile `default`") && stderr.contains("TEAM_ANTHROPIC_KEY: is required for provider anthropic"), "{stderr}");
    assert_eq!(profiled.requests().len(), 3, "nothing more was sent");
    assert_eq!(default.requests().len(), 3);
}

#[tokio::test]
async fn doctor_shows_the_resolved_configuration_and_probes() {
    let f = fake(ProviderKind::Gemini);
    f.push(Canned::json(200, json!({"candidates": [{"content": {"parts": [{"text": "{\"ok\": true}"}]}, "finishReason": "STOP"}]})));
    let url = f.start().await;
    let env = vec![
        ("FABRIC_LLM_MODEL", "google_genai:gemini-2.5-flash".to_owned()),
        ("GOOGLE_GEMINI_BASE_URL", url),
        ("GOOGLE_API_KEY", "AIza-secret".to_owned()),
        ("GEMINI_API_VERSION", "v1".to_owned()),
    ];
    let out = fabric_cli(&["doctor"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("GOOGLE_API_KEY=<redacted>  (environment)"), "{stdout}");
    assert!(stdout.contains("provider: google_genai  model: gemini-2.5-flash"), "{stdout}");
    assert!(stdout.contains("api_version: v1\n"), "{stdout}");
    assert!(!stdout.contains("AIza-secret"));
    assert!(f.requests().is_empty(), "no call without --probe");
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains(r#"probe: ok in "#) && stdout.contains(r#"{"ok":true}"#), "{stdout}");
    assert_eq!(f.requests()[0].path, "/v1/models/gemini-2.5-flash:generateContent");
    let out = fabric_cli(&["doctor"], &[("FABRIC_LLM_MODEL", "openai:gpt-4o".to_owned())]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration: ERROR OPENAI_API_KEY"));
}

#[tokio::test]
async fn a_config_file_sits_under_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.toml");
    std::fs::write(&file, "FABRIC_LLM_MODEL = \"anthropic:claude-haiku-4-5\"\nFABRIC_LLM_RETRY_MAX = 5\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let out = fabric_cli(&["doctor"], &[("FABRIC_CONFIG", path.clone()), ("FABRIC_LLM_RETRY_MAX", "2".into()), ("ANTHROPIC_API_KEY", "from-env".into())]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("provider: anthropic  model: claude-haiku-4-5"), "{stdout}");
    assert!(stdout.contains("retry: 2 attempts"), "the environment wins over the file: {stdout}");
    assert!(stdout.contains(&format!("FABRIC_LLM_MODEL=anthropic:claude-haiku-4-5  (FABRIC_CONFIG file {path})")), "{stdout}");
    assert!(stdout.contains("FABRIC_LLM_RETRY_MAX=2  (environment)"), "{stdout}");
    std::fs::write(&file, "FABRIC_LLM_MODLE = \"x\"\n").unwrap();
    let out = fabric_cli(&["doctor"], &[("FABRIC_CONFIG", path.clone())]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("unknown setting `FABRIC_LLM_MODLE`"));
    std::fs::write(&file, "ANTHROPIC_API_KEY = \"sk-in-a-file\"\n").unwrap();
    let out = fabric_cli(&["doctor"], &[("FABRIC_CONFIG", path)]).await;
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("keys are read only from the environment") && !stdout.contains("sk-in-a-file"), "{stdout}");
}
