//! Streaming from the providers (issue 48, part 1): a fake provider on a real socket writes a
//! chunk every 10 ms in each of the four streaming formats (OpenAI-compatible SSE, Anthropic
//! Messages SSE, Gemini `streamGenerateContent?alt=sse`, Ollama NDJSON); `fabric serve` runs
//! support-triage on it, and the synthesis stage's `run.llm.delta` texts join into the reply the
//! journal keeps, byte for byte. LangChain's own provider packages read the same streams to the
//! same text (the reference check), and hostile streams end the call with a clear error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabric::config::{ProviderKind, Tuning};
use fabric::llm::providers::{HttpBackend, ReplyLimits, shared_client};
use fabric::llm::stream::Deltas;
use fabric::llm::{Llm, LlmError, LlmReply, OutputSpec, ReasonClass};
use serde_json::{Value, json};

use crate::service::{Server, asking_stub, get, post, sse};
use crate::support::{Recorded, target};

/// The synthesis stage's answer: long enough for many chunks, with non-ASCII text and escapes.
const ANSWER: &str = "Refunded: the duplicate charge of 42 € (order \"#7\") goes back to your card — within 5 days.\nThanks for waiting.";

/// The four formats, as the fake tells them apart by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    OpenAi,
    Anthropic,
    Gemini,
    Ollama,
}

const FORMATS: [(Format, ProviderKind); 4] = [
    (Format::OpenAi, ProviderKind::OpenAi),
    (Format::Anthropic, ProviderKind::Anthropic),
    (Format::Gemini, ProviderKind::Gemini),
    (Format::Ollama, ProviderKind::Ollama),
];

fn format_of(path: &str) -> Format {
    if path.ends_with("/chat/completions") {
        Format::OpenAi
    } else if path.ends_with("/v1/messages") {
        Format::Anthropic
    } else if path.contains(":streamGenerateContent") || path.contains(":generateContent") {
        Format::Gemini
    } else {
        Format::Ollama
    }
}

/// The stage's structured answer as a model writes it (spaced), cut into pieces of 3 characters.
fn answer_text() -> String {
    format!("{{\"text\": {}}}", serde_json::to_string(ANSWER).unwrap())
}

fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(3).map(|c| c.iter().collect()).collect()
}

/// The chunks of a streaming reply in `format` whose text is `text`; with `tool`, Anthropic's
/// forced tool call whose input is that (JSON) text.
pub(crate) fn stream_chunks(format: Format, text: &str, tool: Option<&str>) -> Vec<String> {
    let sse = |v: Value| format!("data: {v}\n\n");
    let named = |v: Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
    let mut out = Vec::new();
    match format {
        Format::OpenAi => {
            let chunk = |delta: Value, finish: Value| json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            out.push(sse(chunk(json!({"role": "assistant", "content": ""}), Value::Null)));
            out.extend(pieces(text).into_iter().map(|p| sse(chunk(json!({"content": p}), Value::Null))));
            out.push(sse(chunk(json!({}), json!("stop"))));
            out.push(sse(json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m-1", "choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}})));
            out.push("data: [DONE]\n\n".into());
        }
        Format::Anthropic => {
            out.push(named(json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant", "model": "m-1", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 31, "output_tokens": 1}}})));
            let (block, delta) = match tool {
                Some(name) => (json!({"type": "tool_use", "id": "toolu_s", "name": name, "input": {}}), "input_json_delta"),
                None => (json!({"type": "text", "text": ""}), "text_delta"),
            };
            out.push(named(json!({"type": "content_block_start", "index": 0, "content_block": block})));
            out.push(named(json!({"type": "ping"})));
            for p in pieces(text) {
                let d = if tool.is_some() { json!({"type": delta, "partial_json": p}) } else { json!({"type": delta, "text": p}) };
                out.push(named(json!({"type": "content_block_delta", "index": 0, "delta": d})));
            }
            out.push(named(json!({"type": "content_block_stop", "index": 0})));
            let stop = if tool.is_some() { "tool_use" } else { "end_turn" };
            out.push(named(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 9}})));
            out.push(named(json!({"type": "message_stop"})));
        }
        Format::Gemini => {
            let all = pieces(text);
            let n = all.len();
            for (i, p) in all.into_iter().enumerate() {
                let mut c =
                    json!({"candidates": [{"content": {"role": "model", "parts": [{"text": p}]}, "index": 0}], "modelVersion": "m-1", "responseId": "resp-s"});
                if i + 1 == n {
                    c["candidates"][0]["finishReason"] = json!("STOP");
                    c["usageMetadata"] = json!({"promptTokenCount": 31, "candidatesTokenCount": 9, "totalTokenCount": 40});
                }
                out.push(format!("data: {c}\r\n\r\n"));
            }
        }
        Format::Ollama => {
            for p in pieces(text) {
                out.push(format!(
                    "{}\n",
                    json!({"model": "m-1", "created_at": "2026-12-06T00:00:00Z", "message": {"role": "assistant", "content": p}, "done": false})
                ));
            }
            out.push(format!(
                "{}\n",
                json!({"model": "m-1", "created_at": "2026-12-06T00:00:00Z", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop", "prompt_eval_count": 31, "eval_count": 9})
            ));
        }
    }
    out
}

fn is_streaming(format: Format, r: &Recorded) -> bool {
    match format {
        Format::Gemini => r.path.contains(":streamGenerateContent"),
        _ => r.body["stream"] == json!(true),
    }
}

/// What the fake does with a streaming request.
#[derive(Clone)]
enum Behaviour {
    /// The answer, a chunk every 10 ms.
    Answer,
    /// These chunks (each after 10 ms), then the body ends.
    Chunks(Vec<String>),
    /// These chunks, then nothing (the connection stays open).
    Stall(Vec<String>),
}

/// A fake of the four providers on a loopback port: a whole reply for a request that does not
/// stream (support-triage's shipped replies), a stream for one that does.
#[derive(Clone)]
struct StreamingFake {
    requests: Arc<Mutex<Vec<Recorded>>>,
    behaviour: Arc<Mutex<Behaviour>>,
}

impl StreamingFake {
    fn new(behaviour: Behaviour) -> StreamingFake {
        StreamingFake { requests: Arc::default(), behaviour: Arc::new(Mutex::new(behaviour)) }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    async fn start(&self) -> String {
        let me = self.clone();
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let me = me.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let recorded = Recorded { path: uri.path().to_owned(), query: uri.query().map(str::to_owned), headers, body: body.clone() };
                me.requests.lock().unwrap().push(recorded.clone());
                let format = format_of(uri.path());
                let kind = FORMATS.iter().find(|(f, _)| *f == format).unwrap().1;
                let response = axum::response::Response::builder().status(200);
                if !is_streaming(format, &recorded) {
                    return response
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(crate::support::reply_json(kind, &body).to_string()))
                        .unwrap();
                }
                let tool = body.pointer("/tool_choice/name").and_then(Value::as_str);
                let (chunks, stall) = match me.behaviour.lock().unwrap().clone() {
                    Behaviour::Answer => (stream_chunks(format, &answer_text(), tool), false),
                    Behaviour::Chunks(c) => (c, false),
                    Behaviour::Stall(c) => (c, true),
                };
                let content_type = if format == Format::Ollama { "application/x-ndjson" } else { "text/event-stream" };
                let stream = futures_util::stream::unfold((chunks.into_iter(), stall), |(mut it, stall)| async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    match it.next() {
                        Some(c) => Some((Ok::<_, std::convert::Infallible>(c), (it, stall))),
                        None if stall => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            None
                        }
                        None => None,
                    }
                });
                response.header("content-type", content_type).body(axum::body::Body::from_stream(stream)).unwrap()
            }
        });
        crate::support::serve(app).await
    }
}

/// A fake Anthropic whose first call streams the start of `shown` (9 pieces 10 ms apart, some
/// of them sent as deltas) and breaks off with an overloaded error (a server error: retried);
/// every later call streams `text` whole, a piece every `gap`. Its URL.
pub(crate) async fn restarting_anthropic(shown: &str, text: &str, gap: Duration) -> String {
    let mut broken = stream_chunks(Format::Anthropic, shown, None)[..12].to_vec();
    broken.push("event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n".into());
    let whole = stream_chunks(Format::Anthropic, text, None);
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new().fallback(move || {
        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        let (chunks, gap) = if first { (broken.clone(), Duration::from_millis(10)) } else { (whole.clone(), gap) };
        async move {
            let stream = futures_util::stream::unfold(chunks.into_iter(), move |mut it| async move {
                tokio::time::sleep(gap).await;
                it.next().map(|c| (Ok::<_, std::convert::Infallible>(c), it))
            });
            axum::response::Response::builder().header("content-type", "text/event-stream").body(axum::body::Body::from_stream(stream)).unwrap()
        }
    });
    crate::support::serve(app).await
}

/// The provider variables of `kind` pointed at `url`.
fn provider_env(kind: ProviderKind, url: &str) -> Vec<(&'static str, String)> {
    let model = ("FABRIC_LLM_MODEL", format!("{}:m-1", kind.key()));
    let (base, key) = match kind {
        ProviderKind::OpenAi => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        ProviderKind::Anthropic => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
        ProviderKind::Gemini => ("GOOGLE_GEMINI_BASE_URL", "GOOGLE_API_KEY"),
        _ => ("OLLAMA_BASE_URL", "OLLAMA_API_KEY"),
    };
    vec![model, (base, url.to_owned()), (key, "test-key-123".to_owned())]
}

/// A support-triage run through `fabric serve` with `env` (a real provider's variables): the
/// run's events, the synthesis stage's delta texts in order, and its reply as journalled.
pub(crate) async fn streamed_triage(env: &[(&str, String)]) -> (Vec<(u64, String, Value)>, Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("FABRIC_LLM_STUB", "0"));
    let s = Server::start(&db, stub.path(), &env);
    let (status, run) =
        post(&s, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}\n{}", s.logs());
    let id = run["run_id"].as_str().unwrap();
    let events = sse(&s, id, None).await;
    let deltas: Vec<String> = events
        .iter()
        .filter(|(_, kind, d)| kind == "run.llm.delta" && d["stage_id"] == "answer")
        .map(|(_, _, d)| d["text"].as_str().unwrap().to_owned())
        .collect();
    let record = get(&s, &format!("/v1/runs/{id}/record")).await;
    let entries = record["entries"].as_array().unwrap();
    let raw = entries.iter().find(|e| e["entry"] == "model_reply" && e["stage_id"] == "answer").unwrap()["raw"].as_str().unwrap().to_owned();
    (events, deltas, raw)
}

#[tokio::test]
async fn every_provider_streams_the_synthesis_and_its_deltas_join_into_the_journalled_reply() {
    for (format, kind) in FORMATS {
        let fake = StreamingFake::new(Behaviour::Answer);
        let url = fake.start().await;
        let (events, deltas, raw) = streamed_triage(&provider_env(kind, &url)).await;
        assert!(deltas.len() >= 3, "{format:?}: the text came in several deltas: {deltas:?}");
        assert_eq!(deltas.concat(), raw, "{format:?}: the deltas joined are the journalled reply");
        let value: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(value["text"], ANSWER, "{format:?}");
        // The usage of the stream's last chunk.
        let completed = events.iter().filter(|(_, k, d)| k == "run.llm.completed" && d["stage_id"] == "answer").map(|(_, _, d)| d.clone()).next().unwrap();
        assert_eq!((completed["input_tokens"].as_u64(), completed["output_tokens"].as_u64()), (Some(31), Some(9)), "{format:?}: {completed}");
        // The synthesis asked for a stream with the provider's flags; classify and query formulation did not.
        let requests = fake.requests();
        assert_eq!(requests.len(), 3, "{format:?}");
        assert!(requests[..2].iter().all(|r| !is_streaming(format, r)), "{format:?}");
        let answer = &requests[2];
        assert!(is_streaming(format, answer), "{format:?}: {answer:?}");
        match format {
            Format::OpenAi => assert_eq!(answer.body["stream_options"], json!({"include_usage": true})),
            Format::Gemini => assert_eq!(answer.query.as_deref(), Some("alt=sse")),
            _ => {}
        }
    }
}

/// One call of `backend` with deltas: the reply (or error) and the deltas' texts joined.
async fn call_streaming(backend: &dyn Llm, output: &OutputSpec) -> (Result<LlmReply, LlmError>, String) {
    let sink = Arc::new(fabric::events::MemorySink::default());
    let events = fabric::events::RunEvents::new("r", "route", None, sink.clone());
    let deltas = Deltas::new(&events, "answer", 0);
    let reply = crate::support::complete(backend, &events, "answer", output, Some(&deltas)).await;
    deltas.flush();
    let shown: String = sink.events().iter().filter_map(|e| e.to_json()["text"].as_str().map(str::to_owned)).collect();
    (reply, shown)
}

fn backend(kind: ProviderKind, url: &str, limits: ReplyLimits) -> Box<dyn Llm> {
    fabric::llm::providers::backend_for(shared_client().unwrap(), target(kind, url, "m-1"), Tuning::default(), limits)
}

#[tokio::test]
async fn hostile_streams_end_the_call_with_a_clear_error() {
    let limits = ReplyLimits { max_bytes: 1 << 20, stream_idle: Duration::from_millis(300) };
    for (format, kind) in FORMATS {
        let full = stream_chunks(format, "Hello there, streaming world.", None);
        let cases: [(&str, Behaviour, ReplyLimits, ReasonClass); 4] = [
            ("stalled", Behaviour::Stall(full[..3].to_vec()), limits, ReasonClass::Timeout),
            ("cut short", Behaviour::Chunks(full[..full.len() - 1].to_vec()), limits, ReasonClass::Connection),
            (
                "invalid JSON",
                Behaviour::Chunks(vec![full[0].clone(), if format == Format::Ollama { "{oops\n".into() } else { "data: {oops\n\n".into() }]),
                limits,
                ReasonClass::ProviderError,
            ),
            ("over-long", Behaviour::Answer, ReplyLimits { max_bytes: 1024, ..limits }, ReasonClass::ProviderError),
        ];
        for (case, behaviour, limits, class) in cases {
            let fake = StreamingFake::new(behaviour);
            let url = fake.start().await;
            let started = std::time::Instant::now();
            let (reply, _) = call_streaming(backend(kind, &url, limits).as_ref(), &OutputSpec::Text).await;
            let e = reply.unwrap_err();
            assert_eq!(e.class, class, "{format:?} {case}: {e}");
            assert!(!e.message.contains("test-key-123"), "{e}");
            assert!(started.elapsed() < Duration::from_secs(5), "{format:?} {case}: {:?}", started.elapsed());
        }
    }
}

#[tokio::test]
async fn a_mid_stream_error_event_is_classed_by_its_code_and_a_non_2xx_as_without_a_stream() {
    let overloaded = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
    let mut chunks = stream_chunks(Format::Anthropic, "Hello", None)[..3].to_vec();
    chunks.push(overloaded.into());
    let fake = StreamingFake::new(Behaviour::Chunks(chunks));
    let url = fake.start().await;
    let (reply, _) = call_streaming(backend(ProviderKind::Anthropic, &url, ReplyLimits::from(1 << 20)).as_ref(), &OutputSpec::Text).await;
    let e = reply.unwrap_err();
    assert_eq!(e.class, ReasonClass::ServerError, "{e}");
    assert!(e.message.contains("overloaded_error"), "{e}");
    // A 429 to a streaming request: read as today (its class, its code, its wait).
    let fake = crate::support::FakeProvider::new(|_| crate::support::Canned {
        status: 429,
        headers: vec![("retry-after", "2".into())],
        body: json!({"error": {"type": "rate_limit_error", "message": "slow down sk-x"}}).to_string(),
        delay: Duration::ZERO,
    });
    let url = fake.start().await;
    let (reply, _) = call_streaming(backend(ProviderKind::OpenAi, &url, ReplyLimits::from(1 << 20)).as_ref(), &OutputSpec::Text).await;
    let e = reply.unwrap_err();
    assert_eq!((e.class, e.message.as_str()), (ReasonClass::RateLimited, "HTTP 429 from openai (rate_limit_error)"));
    assert_eq!(e.retry_after.map(|w| w.after), Some(Duration::from_secs(2)));
    assert_eq!(fake.requests()[0].body["stream"], json!(true));
}

/// The Python of a venv with LangChain's four provider packages at the pins of
/// tests/parity/wire-constraints.txt (made once, under cargo's scratch folder); `None` when there
/// is no `python3` with `venv` (a skip, a failure under CI).
fn langchain_python() -> Option<std::path::PathBuf> {
    static MADE: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = made.as_ref() {
        return Some(p.clone());
    }
    let venv = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("langchain-streams-venv");
    let python = venv.join("bin/python");
    let check = "import langchain, langchain_openai, langchain_anthropic, langchain_google_genai, langchain_ollama";
    let ready = |python: &std::path::PathBuf| std::process::Command::new(python).args(["-c", check]).output().is_ok_and(|o| o.status.success());
    if !ready(&python) {
        let made_venv = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).output().is_ok_and(|o| o.status.success());
        if crate::support::skip_unless(made_venv, "python3 with venv", "the stream reference check reads the fake's streams with LangChain's packages") {
            return None;
        }
        let constraints = crate::support::repo().join("tests/parity/wire-constraints.txt");
        let pip = std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check", "-c"])
            .arg(&constraints)
            .args(["langchain", "langchain-core", "langchain-openai", "langchain-anthropic", "langchain-google-genai", "langchain-ollama"])
            .output()
            .unwrap();
        assert!(pip.status.success(), "pip install: {}", String::from_utf8_lossy(&pip.stderr));
    }
    *made = Some(python.clone());
    Some(python)
}

/// LangChain's reading of the fake's streams: for each provider, `.stream()`'s chunks' text
/// joined, and for Anthropic's forced tool, the tool call's arguments from the chunks summed.
const READ_WITH_LANGCHAIN: &str = r#"
import json, sys
from langchain.chat_models import init_chat_model
url = sys.argv[1]
out = {}
for provider in ["openai", "anthropic", "google_genai", "ollama"]:
    kwargs = dict(temperature=0.1, max_tokens=4096, timeout=60, base_url=url, api_key="test-key-123")
    if provider != "ollama":
        kwargs["max_retries"] = 0
    model = init_chat_model(f"{provider}:m-1", **kwargs)
    chunks = list(model.stream("Say it."))
    out[provider] = "".join(c.text if isinstance(c.text, str) else c.text() for c in chunks)
tool = {"name": "answer", "description": "The answer.", "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
model = init_chat_model("anthropic:m-1", temperature=0.1, max_tokens=4096, timeout=60, base_url=url, api_key="test-key-123", max_retries=0)
whole = None
for c in model.bind_tools([tool], tool_choice="answer").stream("Say it."):
    whole = c if whole is None else whole + c
out["anthropic_tool"] = whole.tool_calls[0]["args"]
print(json.dumps(out))
"#;

#[tokio::test]
async fn langchain_reads_the_same_streams_to_the_same_text() {
    let Some(python) = langchain_python() else { return };
    let fake = StreamingFake::new(Behaviour::Answer);
    let url = fake.start().await;
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), READ_WITH_LANGCHAIN).unwrap();
    let py = tokio::process::Command::new(&python)
        .arg(script.path())
        .arg(&url)
        .env("OLLAMA_API_KEY", "test-key-123")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .output()
        .await
        .unwrap();
    assert!(py.status.success(), "LangChain: {}", String::from_utf8_lossy(&py.stderr));
    let theirs: Value = serde_json::from_slice(&py.stdout).unwrap();
    let limits = ReplyLimits::from(1 << 20);
    for (format, kind) in FORMATS {
        let (reply, shown) = call_streaming(backend(kind, &url, limits).as_ref(), &OutputSpec::Text).await;
        let ours = reply.unwrap().raw_text();
        assert_eq!(ours, answer_text(), "{format:?}");
        assert_eq!(shown, ours, "{format:?}: the deltas joined");
        assert_eq!(theirs[kind.key()], json!(ours), "{format:?}: LangChain reads the same stream to the same text");
    }
    // Anthropic's forced tool: LangChain's arguments are our structured value.
    let schema =
        fabric::structured::FlatSchema::from_json(&json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})).unwrap();
    let (reply, shown) = call_streaming(backend(ProviderKind::Anthropic, &url, limits).as_ref(), &OutputSpec::Bindable(Arc::new(schema))).await;
    let raw = reply.unwrap().raw_text();
    assert_eq!(shown, raw, "the tool's input shown as journalled");
    assert_eq!(serde_json::from_str::<Value>(&raw).unwrap(), theirs["anthropic_tool"]);
}

/// A codec that does not stream keeps its whole call even when asked to stream (the telemetry
/// layer then shows its reply as one delta); a streaming request answered with a whole JSON body
/// is read whole.
#[tokio::test]
async fn a_provider_that_does_not_stream_keeps_its_whole_call() {
    let fake = crate::support::FakeProvider::new(|body| {
        crate::support::Canned::json(200, crate::support::cohere_reply(&json!({"text": body["stream"].is_null().to_string()})))
    });
    let url = fake.start().await;
    let b = HttpBackend::new(shared_client().unwrap(), fabric::llm::providers::cohere::Cohere, target(ProviderKind::Cohere, &url, "m-1"), Tuning::default());
    let (reply, shown) = call_streaming(&b, &OutputSpec::Text).await;
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(shown, "", "the backend itself shows nothing (the telemetry layer does)");
    assert_ne!(fake.requests()[0].body["stream"], json!(true));
    // A server that ignores `stream` and answers with a whole JSON body: read as a whole reply.
    let fake = crate::support::FakeProvider::new(|body| crate::support::Canned::json(200, crate::support::reply_json(ProviderKind::OpenAi, body)));
    let url = fake.start().await;
    let (reply, _) = call_streaming(backend(ProviderKind::OpenAi, &url, ReplyLimits::from(1 << 20)).as_ref(), &OutputSpec::Text).await;
    assert_eq!(reply.unwrap().raw_text(), r#"{"text":"Refunded."}"#);
    assert_eq!(fake.requests()[0].body["stream"], json!(true));
}
