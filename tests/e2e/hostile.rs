//! Hostile input and faults: what a peer, a file or the environment may send must never crash the
//! runtime, leak a secret or silently lose work (issues 8 and 22, one test per finding).

mod stalls;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use fabric::api::ApiConfig;
use fabric::catalogue::{self, Catalogue, RouteEntry};
use fabric::config::{ProviderKind, RetryPolicy, Settings, Tuning};
use fabric::events::{Event, MemorySink};
use fabric::exec::{JournalBatch, JournalEntry, RunRequest, RunResult, RunStatus, Runner, StartError};
use fabric::failure::BoxFuture;
use fabric::llm::providers::{DEFAULT_MAX_REPLY_BYTES, HttpBackend, backend_for, shared_client};
use fabric::llm::stub::StubLlm;
use fabric::store::{CancelAsk, Claimed, Holder, IdempotencyKey, Keyed, Lease, NewRun, RunFilter, RunStore, StoreError, StoredEvent, StoredRun};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::service::{self, TOKEN, authed, call, send};
use crate::support::{Canned, FakeProvider, fabric_cli, fixture_env, packs_dir, reply_json, repo, routes_dir, serve, stub_dir, target};

const KINDS: [ProviderKind; 4] = [ProviderKind::Ollama, ProviderKind::OpenAi, ProviderKind::Gemini, ProviderKind::Anthropic];
const FAST_RETRY: RetryPolicy = RetryPolicy { max_attempts: 2, base: Duration::from_millis(5), max_backoff: Duration::from_millis(50), jitter_seed: None };
const GOAL: &str = r#"{"ticket":"I was charged twice"}"#;

fn shipped() -> Arc<Catalogue> {
    Arc::new(catalogue::load(&routes_dir(), &packs_dir()))
}

fn goal() -> serde_json::Map<String, Value> {
    json!({"ticket": "charged twice"}).as_object().unwrap().clone()
}

async fn triage_on(kind: ProviderKind, url: &str, max_reply_bytes: usize) -> (RunResult, Vec<Event>) {
    let backend = backend_for(shared_client().unwrap(), target(kind, url, "m-1"), Tuning::default(), max_reply_bytes);
    let runner = Runner::new(shipped(), fabric::llm::stack::build(backend, FAST_RETRY), Arc::new(|_: &str| None)).unwrap();
    let sink = Arc::new(MemorySink::default());
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal: goal(), prefetch: vec![] }, sink.clone()).await.unwrap();
    (result, sink.events())
}

/// Everything a run leaves behind, as one text: result, events, notes.
fn record(result: &RunResult, events: &[Event]) -> String {
    let mut all = serde_json::to_string(result).unwrap();
    for e in events {
        all.push_str(&e.to_json().to_string());
    }
    all
}

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

// ---- 1. Retry-After ----

#[tokio::test]
async fn huge_retry_after_headers_are_capped_not_a_crash() {
    for kind in KINDS {
        for (header, value) in [("retry-after", "1e308"), ("retry-after-ms", "1e30"), ("retry-after", "-5"), ("retry-after", "NaN"), ("retry-after", "inf")] {
            let fake = FakeProvider::new(move |body| Canned::json(200, reply_json(kind, body)));
            fake.push(Canned { status: 503, headers: vec![(header, value.to_owned())], body: "{}".into(), delay: Duration::ZERO });
            let url = fake.start().await;
            let (result, events) = triage_on(kind, &url, DEFAULT_MAX_REPLY_BYTES).await;
            assert_eq!(result.status(), RunStatus::Completed, "{kind:?} {header}: {value}: {result:?}");
            let retry = events.iter().find(|e| e.kind == "run.llm.retrying").unwrap();
            assert!(retry.to_json()["delay_ms"].as_u64().unwrap() <= 50, "capped at the retry maximum: {:?}", retry.data);
        }
    }
    // The doctor's probe goes through the same stack, flow gate included: a 429 naming a wait
    // past FABRIC_LLM_MAX_PAUSE_S fails the probe at once, saying why (issue 46), and one within
    // it is waited out.
    let ok = json!({"choices": [{"message": {"content": "{\"ok\":true}"}, "finish_reason": "stop"}]});
    for (value, passes) in [("1e308", false), ("0.2", true)] {
        let ok = ok.clone();
        let fake = FakeProvider::new(move |_| Canned::json(200, ok.clone()));
        fake.push(Canned { status: 429, headers: vec![("retry-after", value.into())], body: "{}".into(), delay: Duration::ZERO });
        let url = fake.start().await;
        let env = [("FABRIC_LLM_MODEL", "openai:m".to_owned()), ("OPENAI_BASE_URL", url), ("FABRIC_LLM_RETRY_MAX_BACKOFF_S", "0.05".into())];
        let started = std::time::Instant::now();
        let o = fabric_cli(&["doctor", "--probe"], &env).await;
        assert!(started.elapsed() < Duration::from_secs(30), "{value}: {:?}", started.elapsed());
        assert_eq!(o.status.success(), passes, "{value}: {}{}", out(&o), err(&o));
        if !passes {
            assert!(out(&o).contains("FABRIC_LLM_MAX_PAUSE_S") && out(&o).contains("a day or more (retry-after)"), "{}", out(&o));
        }
    }
}

// ---- 2. redirects ----

#[tokio::test]
async fn provider_calls_never_follow_a_redirect() {
    for kind in KINDS {
        let elsewhere = FakeProvider::new(move |body| Canned::json(200, reply_json(kind, body)));
        let elsewhere_url = elsewhere.start().await;
        for status in [302, 307, 308] {
            let to = format!("{elsewhere_url}/v1/messages?token=abc");
            let fake = FakeProvider::new(move |_| Canned { status, headers: vec![("location", to.clone())], body: String::new(), delay: Duration::ZERO });
            let url = fake.start().await;
            let (result, events) = triage_on(kind, &url, DEFAULT_MAX_REPLY_BYTES).await;
            let error = result.error().unwrap().clone();
            assert_eq!(error.reason_class, "provider_error", "{kind:?} {status}");
            assert!(error.message.contains(&format!("HTTP {status}")) && error.message.contains("never follow redirects"), "{}", error.message);
            assert!(!record(&result, &events).contains("token=abc"), "the redirect's query is not repeated");
            assert_eq!(fake.requests().len(), 1, "not retried");
        }
        assert!(elsewhere.requests().is_empty(), "{kind:?}: the key and prompt went to another host");
    }
}

// ---- 3. secrets in tool URLs ----

/// support-agent's `kb_search` with a key in its URL's query.
fn keyed_catalogue() -> Arc<Catalogue> {
    let text = std::fs::read_to_string(routes_dir().join("support-triage.yaml"))
        .unwrap()
        .replace("url: ${KB_SEARCH_URL}/search", "url: ${KB_SEARCH_URL}/search?api_key=${KB_KEY}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("routes");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["profiles.yaml", "support-agent.yaml"] {
        std::fs::copy(routes_dir().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("support-triage.yaml"), text).unwrap();
    let cat = catalogue::load(&dir, &packs_dir());
    assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
    Arc::new(cat)
}

#[tokio::test]
async fn secrets_in_tool_urls_reach_no_message() {
    const SECRET: &str = "kb-secret-4711";
    let redirecting =
        serve(axum::Router::new().fallback(|| async { axum::response::Redirect::temporary("http://127.0.0.1:9/elsewhere?api_key=kb-secret-4711") })).await;
    let huge = "x".repeat(1024 * 1024);
    let cases = [
        ("http://127.0.0.1:9".to_owned(), "CALL kb_search {\"q\":\"refund\"}".to_owned(), "tool_connection"),
        (redirecting, "CALL kb_search {\"q\":\"refund\"}".to_owned(), "tool_connection"),
        ("http://127.0.0.1:9".to_owned(), format!("CALL kb_search {{\"q\":\"{huge}\"}}"), "invalid_tool_arguments"),
    ];
    for (base, call, class) in cases {
        let stub = StubLlm::default().script("support-agent", "decide", &[&call, "DONE no luck"]);
        let vars = [("KB_SEARCH_URL", base.clone()), ("KB_KEY", SECRET.to_owned())];
        let runner = Runner::new(
            keyed_catalogue(),
            fabric::llm::stack::build(stub, FAST_RETRY),
            Arc::new(move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())),
        )
        .unwrap()
        .with_tool("add", fabric::tools::builtin_add());
        let sink = Arc::new(MemorySink::default());
        let result = runner.run(RunRequest { route_id: "support-agent".into(), goal: goal(), prefetch: vec![] }, sink.clone()).await.unwrap();
        let events = sink.events();
        let failed = events.iter().find(|e| e.kind == "run.tool.failed").unwrap();
        assert_eq!(failed.to_json()["reason_class"], class, "{base}: {:?}", failed.data);
        assert!(result.notes.iter().any(|n| n.contains(class)), "the model sees the error: {:?}", result.notes);
        assert!(!record(&result, &events).contains(SECRET), "{base}: the key leaked");
    }
    // A workflow stage: the failure ends the run, and its message is clean too.
    let vars = [("KB_SEARCH_URL", "http://127.0.0.1:9".to_owned()), ("KB_KEY", SECRET.to_owned())];
    let runner = Runner::new(
        keyed_catalogue(),
        fabric::llm::stack::build(StubLlm::default(), FAST_RETRY),
        Arc::new(move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())),
    )
    .unwrap();
    let sink = Arc::new(MemorySink::default());
    let result = runner.run(RunRequest { route_id: "support-triage".into(), goal: goal(), prefetch: vec![] }, sink.clone()).await.unwrap();
    assert_eq!(result.error().unwrap().reason_class, "tool_connection");
    assert!(!record(&result, &sink.events()).contains(SECRET));
}

// ---- 4. doctor ----

#[tokio::test]
async fn doctor_redacts_credentials_in_base_urls() {
    let env = [("FABRIC_LLM_MODEL", "openai:m".to_owned()), ("OPENAI_BASE_URL", "http://user:PASSWORD@127.0.0.1:9/v1?token=TOKEN123".to_owned())];
    let o = fabric_cli(&["doctor"], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let text = out(&o);
    assert!(!text.contains("PASSWORD") && !text.contains("TOKEN123") && !text.contains("user:"), "{text}");
    assert!(text.contains("base_url: http://REDACTED:REDACTED@127.0.0.1:9/v1?token=REDACTED"), "{text}");
    // A URL that does not parse is not echoed either.
    let env = [("FABRIC_LLM_MODEL", "openai:m".to_owned()), ("OPENAI_BASE_URL", "ftp://user:PASSWORD@host/?token=TOKEN123".to_owned())];
    let o = fabric_cli(&["doctor"], &env).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(!out(&o).contains("PASSWORD") && !out(&o).contains("TOKEN123"), "{}", out(&o));
}

// ---- 5. truncated replies ----

#[tokio::test]
async fn replies_cut_at_the_token_limit_fail_on_every_provider() {
    let cut = [
        (
            ProviderKind::Ollama,
            json!({"message": {"role": "assistant", "content": "{\"category\":\"billing\",\"urgency\":\"high\"}"}, "done": true, "done_reason": "length"}),
        ),
        (
            ProviderKind::Anthropic,
            json!({"content": [{"type": "tool_use", "id": "t", "name": "intake", "input": {"category": "billing", "urgency": "high"}}], "stop_reason": "max_tokens"}),
        ),
        (ProviderKind::OpenAi, json!({"choices": [{"message": {"content": "{}"}, "finish_reason": "length"}]})),
        (ProviderKind::Gemini, json!({"candidates": [{"content": {"parts": [{"text": "{}"}]}, "finishReason": "MAX_TOKENS"}]})),
    ];
    for (kind, body) in cut {
        let fake = FakeProvider::new(move |_| Canned::json(200, body.clone()));
        let url = fake.start().await;
        let (result, _) = triage_on(kind, &url, DEFAULT_MAX_REPLY_BYTES).await;
        let e = result.error().unwrap();
        assert_eq!(e.reason_class, "provider_error", "{kind:?}");
        assert!(e.message.contains("cut at the output token limit"), "{kind:?}: {}", e.message);
    }
    // Prose cut at the limit (a text call) fails too.
    let fake = FakeProvider::new(|_| Canned::json(200, json!({"content": [{"type": "text", "text": "We refunded the dupl"}], "stop_reason": "max_tokens"})));
    let url = fake.start().await;
    let backend =
        HttpBackend::new(shared_client().unwrap(), fabric::llm::providers::anthropic::Anthropic, target(ProviderKind::Anthropic, &url, "m"), Tuning::default());
    let events = fabric::events::RunEvents::new("r", "x", None, Arc::new(fabric::events::NullSink));
    let never = fabric::cancel::Cancel::never();
    let cx = opentelemetry::Context::current();
    let req = fabric::llm::LlmRequest {
        events: &events,
        route_id: "x",
        stage_id: "policy",
        turn: 0,
        priority: 0,
        system: "s",
        user: "u",
        output: &fabric::llm::OutputSpec::Text,
        cx: &cx,
        cancel: &never,
        stream: None,
    };
    use fabric::llm::Llm;
    let e = backend.complete(&req).await.unwrap_err();
    assert!(e.message.contains("stop_reason: max_tokens"), "{e}");
}

// ---- 6, 7. duplicate names and files that do not parse ----

fn catalogue_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("routes");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["profiles.yaml", "support-triage.yaml", "support-agent.yaml"] {
        std::fs::copy(routes_dir().join(f), dir.join(f)).unwrap();
    }
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    tmp
}

#[tokio::test]
async fn a_duplicate_route_name_breaks_the_route() {
    let tmp = catalogue_dir(&[(
        "zz-copy.yaml",
        "workflows:\n  other:\n    stages:\n      - {id: only, llm_role: synthesis, capability: answer_text}\nroutes:\n  support-triage: {model_profile: default, prompt_pack: support, workflow: other}\n",
    )]);
    let dir = tmp.path().join("routes");
    let cat = catalogue::load(&dir, &packs_dir());
    match cat.get("support-triage") {
        Some(RouteEntry::Broken(b)) => assert!(b.problems.iter().any(|d| d.message.contains("already defined")), "{:?}", b.problems),
        other => panic!("{other:?}"),
    }
    assert!(matches!(cat.get("support-agent"), Some(RouteEntry::Ready(_))), "other routes still load");
    let dir_s = dir.to_str().unwrap();
    let o = fabric_cli(&["--catalogue", dir_s, "run", "support-triage", "--goal", GOAL], &[("FABRIC_LLM_STUB", "1".into())]).await;
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("already defined"), "{}", err(&o));
    let o = fabric_cli(&["--catalogue", dir_s, "routes", "list"], &[]).await;
    assert!(out(&o).contains("support-triage\t-\t-\tbroken"), "{}", out(&o));
}

#[tokio::test]
async fn files_that_do_not_parse_are_named_wherever_routes_go_missing() {
    for (name, text, needle) in [
        ("broken.yaml", "routes:\n  lost-route: {model_profile: default\n", "invalid YAML"),
        (
            "dupkey.yaml",
            "routes:\n  lost-route: {model_profile: default, prompt_pack: support, workflow: support-triage}\n  lost-route: {model_profile: default}\n",
            "duplicate key `lost-route`",
        ),
    ] {
        let tmp = catalogue_dir(&[(name, text)]);
        let dir = tmp.path().join("routes");
        let dir_s = dir.to_str().unwrap();
        let o = fabric_cli(&["--catalogue", dir_s, "routes", "check"], &[]).await;
        assert_eq!(o.status.code(), Some(2));
        assert!(out(&o).contains(&format!("{name}:")) && out(&o).contains(needle), "{}", out(&o));
        assert!(!out(&o).contains("DuplicateKeyPolicy"), "no parser internals: {}", out(&o));
        assert!(err(&o).contains("1 file(s) could not be loaded"), "{}", err(&o));
        let o = fabric_cli(&["--catalogue", dir_s, "routes", "list"], &[]).await;
        assert!(out(&o).contains(&format!("not loaded: {dir_s}/{name}")), "{}", out(&o));
        let o = fabric_cli(&["--catalogue", dir_s, "run", "lost-route", "--goal", GOAL], &[("FABRIC_LLM_STUB", "1".into())]).await;
        assert_eq!(o.status.code(), Some(2));
        assert!(err(&o).contains("unknown route `lost-route`") && err(&o).contains(name), "{}", err(&o));
    }
}

// ---- 8, 12. output that cannot be written ----

#[tokio::test]
async fn unwritable_events_or_results_are_reported_with_exit_4() {
    let stub = ("FABRIC_LLM_STUB", "1".to_owned());
    let o = fabric_cli(&["run", "support-triage", "--goal", GOAL, "--events-out", "/dev/full"], std::slice::from_ref(&stub)).await;
    assert_eq!(o.status.code(), Some(4), "{}", err(&o));
    assert!(err(&o).contains("events of run") && err(&o).contains("incomplete"), "{}", err(&o));
    assert!(out(&o).contains("\"status\":\"completed\""), "the result still goes out");
    // stdout on a full disk, and on a closed pipe: an I/O error, never a panic (101).
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .envs(fixture_env())
        .args(["run", "support-triage", "--goal", GOAL])
        .env("FABRIC_LLM_STUB", "1")
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", err(&o));
    assert!(err(&o).contains("cannot write the output"), "{}", err(&o));
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .envs(fixture_env())
        .args(["routes", "list"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", err(&o));
}

// ---- 9. special files in the catalogue ----

#[test]
fn special_files_in_a_catalogue_are_refused_not_read() {
    let tmp = catalogue_dir(&[]);
    let dir = tmp.path().join("routes");
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.yaml")).unwrap();
    let fifo = dir.join("pipe.yaml");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // A symlink loop of directories is read once.
    std::os::unix::fs::symlink(".", dir.join("again")).unwrap();
    let cat = catalogue::load(&dir, &packs_dir());
    let messages: Vec<String> = cat.unloaded().iter().map(ToString::to_string).collect();
    assert!(messages.iter().any(|m| m.contains("zero.yaml") && m.contains("not a regular file")), "{messages:?}");
    assert!(messages.iter().any(|m| m.contains("pipe.yaml") && m.contains("not a regular file")), "{messages:?}");
    assert!(matches!(cat.get("support-triage"), Some(RouteEntry::Ready(_))));
    assert_eq!(cat.routes().count(), 2);
}

// ---- 10. bad model profiles ----

#[tokio::test]
async fn bad_model_profiles_break_only_their_routes() {
    let tmp = catalogue_dir(&[(
        "bad-profiles.yaml",
        "profiles:\n  no-model: {base_url: 'http://127.0.0.1:9'}\n  odd-provider: {provider: watsonx, model: m}\n  bare: {model: qwen3:8b}\n  keyless: {model: 'openai:gpt-4o', api_key_env: MY_OPENAI_KEY}\nroutes:\n  uses-bad: {model_profile: no-model, prompt_pack: support, workflow: support-triage}\n  uses-keyless: {model_profile: keyless, prompt_pack: support, workflow: support-triage}\n",
    )]);
    let dir = tmp.path().join("routes");
    let dir_s = dir.to_str().unwrap();
    let o = fabric_cli(&["--catalogue", dir_s, "routes", "check"], &[]).await;
    let text = out(&o);
    assert!(text.contains("bad-profiles.yaml:2:13: routing moves as one unit"), "{text}");
    assert!(text.contains("bad-profiles.yaml:3:28: provider `watsonx` is not supported"), "{text}");
    assert!(text.contains("bad-profiles.yaml:4:17: `model` cannot tell the provider of `qwen3:8b`"), "{text}");
    let cat = catalogue::load(&dir, &packs_dir());
    assert!(matches!(cat.get("uses-bad"), Some(RouteEntry::Broken(_))));
    // Honouring profiles: a profile whose key is missing refuses its routes only.
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::Ollama, body)));
    let url = fake.start().await;
    let env = [("FABRIC_HONOR_MODEL_PROFILE", "1".to_owned()), ("OLLAMA_MODEL", "qwen3:8b".into()), ("OLLAMA_BASE_URL", url)];
    let o = fabric_cli(&["--catalogue", dir_s, "run", "support-triage", "--goal", GOAL], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = fabric_cli(&["--catalogue", dir_s, "run", "uses-keyless", "--goal", GOAL], &env).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("model profile `keyless` cannot be used here") && err(&o).contains("MY_OPENAI_KEY"), "{}", err(&o));
}

// ---- 11. settings, placeholders, packs ----

#[test]
fn settings_read_toml_integers_and_only_the_injected_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.toml");
    std::fs::write(&file, "FABRIC_LLM_RETRY_MAX = 5\nFABRIC_LLM_RETRY_BASE_S = 0.5\nFABRIC_LLM_STUB = true\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let s = Settings::load(move |k| (k == "FABRIC_CONFIG").then(|| path.clone())).unwrap();
    assert_eq!((s.retry.max_attempts, s.retry.base, s.stub), (5, Duration::from_millis(500), true));
    // A key variable named by a profile is read through the same lookup, not the process.
    let s = Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let t = s.resolve_target(ProviderKind::OpenAi, "m".into(), None, Some("PATH")).unwrap_err();
    assert_eq!(t.var, "PATH", "PATH is set in the process but not in the injected lookup");
}

#[test]
fn a_malformed_config_file_is_located_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.toml");
    std::fs::write(&file, "FABRIC_LLM_MODEL = \"openai:gpt-4o\"\nOPENAI_BASE_URL = \"http://x/?token=SECRET99\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let e = Settings::load(move |k| (k == "FABRIC_CONFIG").then(|| path.clone())).unwrap_err();
    assert_eq!(e.var, "FABRIC_CONFIG");
    assert!(e.message.contains("fabric.toml:2:") && e.message.contains("not valid TOML"), "{e}");
    assert!(!e.message.contains("SECRET99"), "{e}");
    let e = Settings::load(|k| match k {
        "FABRIC_LLM_MODEL" => Some("anthropic:claude".into()),
        "ANTHROPIC_API_KEY" => Some("sk-abc\r\nX-Injected: 1".into()),
        _ => None,
    })
    .unwrap_err();
    assert_eq!(e.var, "ANTHROPIC_API_KEY");
    assert!(!e.message.contains("sk-abc"), "{e}");
    let e = Settings::load(|k| (k == "FABRIC_LLM_STUB_LATENCY_MS").then(|| "18446744073709551615".into())).unwrap_err();
    assert_eq!(e.var, "FABRIC_LLM_STUB_LATENCY_MS");
}

#[tokio::test]
async fn with_the_stub_a_model_string_is_only_a_warning() {
    let env = [("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_LLM_MODEL", "gemini-2.5-flash".into())];
    let o = fabric_cli(&["run", "support-triage", "--goal", GOAL], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // A bare `gemini-…` is Vertex AI, as LangChain reads it; without its credentials, a warning.
    assert!(err(&o).contains("warning: GOOGLE_APPLICATION_CREDENTIALS: is required for provider google_vertexai"), "{}", err(&o));
}

#[test]
fn placeholders_with_spaces_and_agent_templates_without_tools() {
    let packs = [catalogue::SourceFile {
        path: "p/spaced.yaml".into(),
        text: "host: HOST TEXT\nrules: [Be kind.]\nroles:\n  classify: \"{{ host }} Classify.\"\nagent: \"Decide well.\"\n".into(),
    }];
    let files = [catalogue::SourceFile {
        path: "r/c.yaml".into(),
        text: "profiles: {d: {}}\ncapabilities:\n  c: {output_schema: {type: object, properties: {a: {type: string}}}}\n  t: {description: A tool., input_schema: {type: object, properties: {q: {type: string}}}, invoke: {url: 'http://127.0.0.1:9/t'}}\nworkflows:\n  w: {stages: [{id: s, llm_role: classify, capability: c}]}\nroutes:\n  r: {model_profile: d, prompt_pack: spaced, workflow: w}\n  a: {model_profile: d, prompt_pack: spaced, decision_loop: {tools: [t]}}\n".into(),
    }];
    let cat = catalogue::load_from_texts(&files, &packs);
    let route = cat.route("r").unwrap();
    assert_eq!(route.graph()[route.entry()].prompt().system_text(), "HOST TEXT Classify.");
    let agent = cat.route("a").unwrap();
    let prompt = agent.graph()[agent.entry()].prompt().system_text();
    assert!(prompt.starts_with("HOST TEXT\n\nDecide well."), "{prompt}");
    assert!(prompt.contains("Rules:\n- Be kind.") && prompt.contains("Tools:\n- t: A tool.\n  input schema:"), "{prompt}");
    assert!(cat.diagnostics().iter().any(|d| d.message.contains("`agent` does not use {{host}}, {{rules}}, {{tools}}")), "{:?}", cat.diagnostics());
}

// ---- 13. output caps ----

#[tokio::test]
async fn provider_bodies_are_capped() {
    let huge_error = json!({"error": {"message": "e".repeat(2 * 1024 * 1024)}});
    let fake = FakeProvider::new(move |_| Canned::json(400, huge_error.clone()));
    let url = fake.start().await;
    let (result, events) = triage_on(ProviderKind::OpenAi, &url, DEFAULT_MAX_REPLY_BYTES).await;
    let message = &result.error().unwrap().message;
    assert_eq!(message, "HTTP 400 from openai", "no provider error text in messages");
    assert!(record(&result, &events).len() < 20_000);
    // Of an error body only the provider's error code is kept: its text may quote a key.
    let leaky = json!({"error": {"message": "Incorrect API key provided: sk-proj-SECRET", "type": "invalid_request_error", "code": "invalid_api_key"}});
    let fake = FakeProvider::new(move |_| Canned::json(401, leaky.clone()));
    let url = fake.start().await;
    let (result, events) = triage_on(ProviderKind::OpenAi, &url, DEFAULT_MAX_REPLY_BYTES).await;
    assert_eq!(result.error().unwrap().message, "HTTP 401 from openai (invalid_api_key)");
    assert!(!record(&result, &events).contains("SECRET"));
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::OpenAi, body)));
    let url = fake.start().await;
    let (result, _) = triage_on(ProviderKind::OpenAi, &url, 64).await;
    let e = result.error().unwrap();
    assert_eq!(e.reason_class, "provider_error");
    assert!(e.message.contains("larger than the 64-byte limit (FABRIC_LLM_MAX_REPLY_BYTES)"), "{}", e.message);
}

// ---- 15. stub scripts ----

#[tokio::test]
async fn a_broken_stub_script_breaks_only_its_route() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["support-triage.yaml", "support-agent.yaml"] {
        std::fs::copy(stub_dir().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("support-agent.yaml"), "stages:\n  decide: {oops: 1}\n").unwrap();
    let d = dir.path().to_str().unwrap();
    let stub = ("FABRIC_LLM_STUB", "1".to_owned());
    let o = fabric_cli(&["--stub-dir", d, "run", "support-triage", "--goal", GOAL], std::slice::from_ref(&stub)).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = fabric_cli(&["--stub-dir", d, "run", "support-agent", "--goal", "{}"], std::slice::from_ref(&stub)).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("support-agent.yaml:2:11"), "{}", err(&o));
    let o = fabric_cli(&["--stub-dir", "/no/such/dir", "run", "support-triage", "--goal", GOAL], std::slice::from_ref(&stub)).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("/no/such/dir") && err(&o).contains("does not exist"), "{}", err(&o));
}

// ---- 16. signals ----

#[tokio::test]
async fn a_signal_ends_the_run_with_a_result_and_an_event() {
    for (signal, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
            .current_dir(repo())
            .envs(fixture_env())
            .args(["run", "support-triage", "--goal", GOAL, "--events-out", events.to_str().unwrap()])
            .env("FABRIC_LLM_STUB", "1")
            .env("FABRIC_LLM_STUB_LATENCY_MS", "30000")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the first model call is in flight.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&events).unwrap_or_default().contains("run.llm.started") {
            assert!(std::time::Instant::now() < deadline, "the run did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
        let o = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output()).await.unwrap().unwrap();
        assert_eq!(o.status.code(), Some(code), "{signal}");
        let result: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(result["error"]["reason_class"], "interrupted", "{result}");
        let lines: Vec<Value> = std::fs::read_to_string(&events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert_eq!(&kinds[kinds.len() - 3..], ["run.llm.failed", "run.stage.failed", "run.failed"], "{kinds:?}");
        assert_eq!(lines.last().unwrap()["reason_class"], "interrupted");
    }
}

// ---- 17. the rest ----

#[tokio::test]
async fn odd_ends_of_the_review() {
    // `add` never reports a non-finite sum as a success.
    let add = fabric::tools::builtin_add();
    let args = json!({"a": 1e308, "b": 1e308}).as_object().unwrap().clone();
    assert!(add.call(&args).await.unwrap_err().0.contains("too large"));
    // --events-out is not opened (truncated) when the run cannot start.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keep.jsonl");
    std::fs::write(&file, "precious\n").unwrap();
    let o = fabric_cli(&["run", "nope", "--goal", GOAL, "--events-out", file.to_str().unwrap()], &[("FABRIC_LLM_STUB", "1".into())]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious\n");
    // Loop budgets name their stage; the decision node says it calls the model; in-process tool
    // results carry a status.
    let stub = StubLlm::default().script("support-agent", "decide", &["CALL add {\"a\":1,\"b\":2}"; 9]);
    let runner =
        Runner::new(shipped(), fabric::llm::stack::build(stub, FAST_RETRY), Arc::new(|_: &str| None)).unwrap().with_tool("add", fabric::tools::builtin_add());
    let sink = Arc::new(MemorySink::default());
    let result = runner.run(RunRequest { route_id: "support-agent".into(), goal: goal(), prefetch: vec![] }, sink.clone()).await.unwrap();
    assert_eq!(result.error().unwrap().reason_class, "loop_budget_exceeded");
    let events = sink.events();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(&kinds[kinds.len() - 2..], ["run.stage.failed", "run.failed"]);
    let decide = events.iter().find(|e| e.kind == "run.stage.started" && e.stage_id.as_deref() == Some("decide")).unwrap();
    assert_eq!(decide.to_json()["llm_role"], "decision");
    let tool = events.iter().find(|e| e.kind == "run.tool.completed").unwrap();
    assert_eq!(tool.to_json()["status"], "ok");
    // A route refused for a missing in-process tool still says why (unchanged behaviour).
    let bare = Runner::new(shipped(), fabric::llm::stack::build(StubLlm::default(), FAST_RETRY), Arc::new(|_: &str| None)).unwrap();
    assert!(matches!(bare.route("support-agent"), Err(StartError::ToolNotRegistered { .. })));
}

// ---- found by the second review ----

#[tokio::test]
async fn credentials_without_a_scheme_are_redacted_too() {
    for env in [
        vec![("OLLAMA_HOST", "user:PASSWORD@127.0.0.1:11434".to_owned())],
        vec![("OLLAMA_HOST", "ftp://u:PASSWORD@x".to_owned())],
        vec![("OLLAMA_HOST", "u:PASSWORD@x".to_owned())],
        vec![("FABRIC_LLM_MODEL", "openai:g".to_owned()), ("OPENAI_BASE_URL", "user:PASSWORD@host/v1?key=K".to_owned())],
        vec![("FABRIC_LLM_MODEL", "openai:g".to_owned()), ("OPENAI_BASE_URL", "http://h/v1".to_owned()), ("OPENAI_API_BASE", "user:PASSWORD@host".to_owned())],
    ] {
        for args in [&["doctor"][..], &["run", "support-triage", "--goal", GOAL][..]] {
            let o = fabric_cli(args, &env).await;
            assert!(!out(&o).contains("PASSWORD") && !err(&o).contains("PASSWORD"), "{env:?} {args:?}: {}{}", out(&o), err(&o));
        }
    }
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .envs(fixture_env())
        .args(["run", "support-triage", "--goal", GOAL])
        .env("FABRIC_LLM_STUB", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "user:PASSWORD@host")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!err(&o).contains("PASSWORD") && err(&o).contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{}", err(&o));
}

#[tokio::test]
async fn a_section_that_is_not_a_mapping_counts_as_not_loaded() {
    let tmp = catalogue_dir(&[("baz.yaml", "routes: [baz]\n")]);
    let dir = tmp.path().join("routes");
    let dir_s = dir.to_str().unwrap();
    let o = fabric_cli(&["--catalogue", dir_s, "routes", "list"], &[]).await;
    assert!(out(&o).contains("not loaded") && out(&o).contains("baz.yaml"), "{}", out(&o));
    let o = fabric_cli(&["--catalogue", dir_s, "run", "baz", "--goal", GOAL], &[("FABRIC_LLM_STUB", "1".into())]).await;
    assert!(err(&o).contains("baz.yaml"), "{}", err(&o));
}

#[test]
fn a_symlink_out_of_the_catalogue_is_not_followed() {
    let tmp = catalogue_dir(&[]);
    let dir = tmp.path().join("routes");
    std::os::unix::fs::symlink("/", dir.join("everything")).unwrap();
    let cat = catalogue::load(&dir, &packs_dir());
    assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
    assert!(cat.diagnostics().iter().any(|d| d.message.contains("leads outside")), "{:?}", cat.diagnostics());
    assert_eq!(cat.routes().count(), 2);
}

#[tokio::test]
async fn an_oversized_error_body_keeps_its_status_class() {
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::OpenAi, body)));
    fake.push(Canned { status: 503, headers: vec![], body: "x".repeat(4096), delay: Duration::ZERO });
    let url = fake.start().await;
    let (result, events) = triage_on(ProviderKind::OpenAi, &url, 1024).await;
    let retry = events.iter().find(|e| e.kind == "run.llm.retrying").expect("a 503 is retried");
    assert_eq!(retry.to_json()["reason_class"], "server_error");
    assert_eq!(retry.to_json()["message"], "HTTP 503 from openai", "{:?}", retry.data);
    assert_eq!(result.status(), RunStatus::Completed, "the retry's small reply is read: {result:?}");
}

#[test]
fn config_keys_differing_in_case_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.toml");
    std::fs::write(&file, "Fabric_Llm_Model = \"openai:x\"\nFABRIC_LLM_MODEL = \"ollama:y\"\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let e = Settings::load(move |k| (k == "FABRIC_CONFIG").then(|| path.clone())).unwrap_err();
    assert!(e.message.contains("sets `FABRIC_LLM_MODEL` twice"), "{e}");
    // A lower-case key in the file is still overridden by the environment.
    std::fs::write(&file, "fabric_llm_stub = \"0\"\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let s = Settings::load(move |k| match k {
        "FABRIC_CONFIG" => Some(path.clone()),
        "FABRIC_LLM_STUB" => Some("1".into()),
        _ => None,
    })
    .unwrap();
    assert!(s.stub);
}

/// Tool redirects: followed within the first URL's origin (query kept out of messages), at most
/// five, never to another origin; the whole chain within the tool's timeout.
#[tokio::test]
async fn tool_redirects_stay_within_their_origin() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/hop/search", get(|| async { axum::response::Redirect::temporary("/hop2/search?q=moved") }))
        .route("/hop2/search", get(|| async { axum::response::Redirect::permanent("/search") }))
        .route("/search", get(|| async { axum::Json(serde_json::json!({"hits": [{"id": 1}]})) }))
        .route("/loop/search", get(|| async { axum::response::Redirect::temporary("/loop/search") }))
        .route("/away/search", get(|| async { axum::response::Redirect::temporary("http://localhost:9/search?api_key=kb-secret-4711") }))
        .route("/bad/search", get(|| async { (axum::http::StatusCode::FOUND, [("location", "http://[not-an-address")], "moved") }));
    let base = serve(app).await;
    for (suffix, outcome) in [
        ("/hop", Ok(r#"{"hits":[{"id":1}]}"#)),
        ("/loop", Err(("tool_connection", "too many redirects"))),
        ("/away", Err(("tool_connection", "another origin"))),
        // A `Location` that is no URL: the 302 itself is the answer.
        ("/bad", Err(("tool_http_status", "HTTP 302"))),
    ] {
        let stub = StubLlm::default().script("support-agent", "decide", &[r#"CALL kb_search {"q":"refund"}"#, "DONE ok"]);
        let url = format!("{base}{suffix}");
        let runner = Runner::new(
            Arc::new(catalogue::load(&routes_dir(), &packs_dir())),
            fabric::llm::stack::build(stub, FAST_RETRY),
            Arc::new(move |k: &str| (k == "KB_SEARCH_URL").then(|| url.clone())),
        )
        .unwrap()
        .with_tool("add", fabric::tools::builtin_add());
        let sink = Arc::new(MemorySink::default());
        let result = runner.run(RunRequest { route_id: "support-agent".into(), goal: goal(), prefetch: vec![] }, sink.clone()).await.unwrap();
        match outcome {
            Ok(body) => assert_eq!(result.notes[0], format!("kb_search: {body}"), "{suffix}"),
            Err((class, why)) => {
                let events = sink.events();
                let failed = events.iter().find(|e| e.kind == "run.tool.failed").unwrap();
                assert_eq!(failed.to_json()["reason_class"], class, "{suffix}");
                assert!(failed.to_json()["message"].as_str().unwrap().contains(why), "{suffix}: {:?}", failed.data);
                assert!(!record(&result, &events).contains("kb-secret-4711"), "{suffix}: the key leaked");
            }
        }
    }
}

// ---- issue 22: what the HTTP API reads ----

/// A run store that notes every run id and route filter it is asked about, so a test can tell
/// that an identifier was refused before any query.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn RunStore>,
    asked: std::sync::Mutex<Vec<String>>,
}

impl Watched {
    async fn new() -> Arc<Watched> {
        Arc::new(Watched { inner: fabric::store::open("sqlite::memory:").await.unwrap(), asked: Default::default() })
    }

    fn note(&self, what: &str) {
        self.asked.lock().unwrap().push(what.to_owned());
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl RunStore for Watched {
    fn put_catalogue<'a>(&'a self, version: &'a fabric::store::CatalogueVersion, sources: &'a fabric::store::Sources) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.put_catalogue(version, sources)
    }
    fn catalogue<'a>(&'a self, version: &'a fabric::store::CatalogueVersion) -> BoxFuture<'a, Result<Option<fabric::store::Sources>, StoreError>> {
        self.inner.catalogue(version)
    }
    fn stranded_versions<'a>(&'a self, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<fabric::store::CatalogueVersion>, StoreError>> {
        self.inner.stranded_versions(routes, limit)
    }
    fn move_catalogue<'a>(&'a self, lease: &'a Lease, version: &'a fabric::store::CatalogueVersion) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.move_catalogue(lease, version)
    }
    fn catalogue_versions<'a>(&'a self, prefix: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<fabric::store::CatalogueVersion>, StoreError>> {
        self.inner.catalogue_versions(prefix, limit)
    }
    fn create_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        self.inner.create_run(run, holder)
    }
    fn create_keyed_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Keyed, StoreError>> {
        self.inner.create_keyed_run(run, holder, key)
    }
    fn create_session_run<'a>(
        &'a self,
        run: NewRun<'a>,
        holder: Option<&'a Holder>,
        policy: fabric::config::SessionPolicy,
        key: Option<&'a IdempotencyKey>,
    ) -> BoxFuture<'a, Result<fabric::store::SessionStart, StoreError>> {
        self.inner.create_session_run(run, holder, policy, key)
    }
    fn run_of_key<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        self.inner.run_of_key(key)
    }
    fn request_cancel<'a>(&'a self, run_id: &'a str, reason: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<CancelAsk, StoreError>> {
        self.note(run_id);
        self.inner.request_cancel(run_id, reason, holder)
    }
    fn prune<'a>(&'a self, cutoff: &'a str, limit: usize, dry_run: bool) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.prune(cutoff, limit, dry_run)
    }
    fn awaiting_since<'a>(&'a self, cutoff: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.awaiting_since(cutoff, limit)
    }
    fn cancel_requests<'a>(&'a self, holder: &'a Holder) -> BoxFuture<'a, Result<Vec<(Lease, String)>, StoreError>> {
        self.inner.cancel_requests(holder)
    }
    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        self.note(run_id);
        self.inner.get_run(run_id)
    }
    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        self.note(&format!("list {:?} before {:?}", filter.route_id, filter.before));
        self.inner.list_runs(filter)
    }
    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>> {
        self.note(run_id);
        self.inner.events_after(run_id, after_seq)
    }
    fn next_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.note(run_id);
        self.inner.next_seq(run_id)
    }
    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>> {
        self.note(run_id);
        self.inner.journal(run_id)
    }
    fn claim_runs<'a>(&'a self, holder: &'a Holder, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        self.inner.claim_runs(holder, routes, limit)
    }
    fn claim_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        self.note(run_id);
        self.inner.claim_reply(run_id, holder)
    }
    fn reopen_reply<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.reopen_reply(lease)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release(lease)
    }
    fn renew<'a>(&'a self, holder: &'a Holder, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.renew(holder, leases)
    }
    fn append<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.append(lease, batch)
    }
    fn commit<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.commit(lease, batch)
    }
    fn queued(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.queued()
    }
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.ping()
    }

    fn health(&self) -> Result<(), StoreError> {
        self.inner.health()
    }
    fn webhooks(&self) -> &dyn fabric::store::WebhookOutbox {
        self.inner.webhooks()
    }
    fn pending_cancels(&self, limit: usize) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>> {
        self.inner.pending_cancels(limit)
    }
}

/// A request with a raw body and the token.
fn raw(method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(uri).header("authorization", format!("Bearer {TOKEN}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

fn start(route: &str, goal: Value) -> Value {
    json!({"route_id": route, "goal": goal, "model_profile": "default"})
}

/// A support-agent run that asked (the asking stub asks first): its reply endpoint.
async fn asking_run(app: &axum::Router) -> String {
    let (_, _, run) = call(app, "POST", "/v1/runs?wait=true", Some(start("support-agent", json!({"q": 1}))), true).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    run["run_id"].as_str().unwrap().to_owned()
}

fn code(body: &Value) -> Option<&str> {
    body["error"]["code"].as_str()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn request_bodies_must_be_declared_json_and_not_encoded() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    let reply = format!("/v1/runs/{}/reply", asking_run(&app).await);
    let bodies =
        [("/v1/runs", r#"{"route_id":"support-triage","goal":{"ticket":"x"},"model_profile":"default"}"#), (reply.as_str(), r#"{"message":"order 42"}"#)];
    for (uri, body) in bodies {
        for headers in [
            &[][..],
            &[("content-type", "text/plain")],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[("content-type", "application/xml")],
            &[("content-type", "application/jsonx")],
            &[("content-type", "application/json"), ("content-type", "application/json")],
            &[("content-type", "application/json"), ("content-encoding", "gzip")],
            &[("content-type", "application/json"), ("content-encoding", "identity, br")],
        ] {
            let (status, _, answer) = send(&app, raw("POST", uri, headers, body)).await;
            assert_eq!((status, code(&answer)), (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("unsupported_media_type")), "{uri} {headers:?}: {answer}");
            assert!(message(&answer).contains("application/json") || message(&answer).contains("Content-Encoding"), "{answer}");
        }
    }
    // Parameters and any case are fine, and so is `identity`.
    for ct in ["application/json; charset=utf-8", "Application/JSON"] {
        let (status, _, answer) = send(&app, raw("POST", "/v1/runs", &[("content-type", ct), ("content-encoding", "identity")], bodies[0].1)).await;
        assert_eq!(status, StatusCode::CREATED, "{ct}: {answer}");
    }
    let (status, _, answer) = send(&app, raw("POST", &reply, &[("content-type", "APPLICATION/json;charset=UTF-8")], bodies[1].1)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
}

#[tokio::test]
async fn a_start_body_must_be_a_json_object() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    let reply = format!("/v1/runs/{}/reply", asking_run(&app).await);
    // serde's derived structs take an array of their fields in order: this one was a run.
    for (uri, body) in [
        ("/v1/runs", r#"["support-triage", {"ticket": "x"}, "default"]"#),
        ("/v1/runs", "42"),
        ("/v1/runs", r#""support-triage""#),
        ("/v1/runs", " null"),
        (reply.as_str(), r#"["order 42"]"#),
    ] {
        let (status, _, answer) = send(&app, raw("POST", uri, JSON, body)).await;
        assert_eq!(
            (status, code(&answer), message(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request"), "the body must be a JSON object"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn integers_beyond_64_bits_are_refused_not_rounded() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    for (goal, path) in [
        (r#"{"n": 123456789012345678901234567890}"#, "`goal.n`"),
        (r#"{"a": [1, {"b": -9223372036854775809}]}"#, "`goal.a[1].b`"),
        (r#"{"odd key": 18446744073709551616}"#, r#"`goal["odd key"]`"#),
    ] {
        let body = format!(r#"{{"route_id": "support-triage", "goal": {goal}, "model_profile": "default"}}"#);
        let (status, _, answer) = send(&app, raw("POST", "/v1/runs", JSON, &body)).await;
        assert_eq!((status, code(&answer)), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request")), "{goal}: {answer}");
        assert!(message(&answer).contains(path) && message(&answer).contains("beyond 64 bits"), "{answer}");
    }
    // The edges of 64 bits are kept exactly, in the record.
    let body = r#"{"route_id": "support-triage", "goal": {"ticket": "x", "max": 18446744073709551615, "min": -9223372036854775808, "f": 1.5}, "model_profile": "default"}"#;
    let (status, _, run) = send(&app, raw("POST", "/v1/runs?wait=true", JSON, body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    let (_, _, record) = call(&app, "GET", &format!("/v1/runs/{}/record", run["run_id"].as_str().unwrap()), None, true).await;
    let goal = &record["request"]["goal"];
    assert_eq!((goal["max"].as_u64(), goal["min"].as_i64(), goal["f"].as_f64()), (Some(u64::MAX), Some(i64::MIN), Some(1.5)), "{record}");
}

#[tokio::test]
async fn run_list_parameters_are_checked_not_clamped() {
    let store = Watched::new().await;
    let (app, _stub) = service::app_on(store.clone(), None, authed(ApiConfig::default()));
    let (_, _, run) = call(&app, "POST", "/v1/runs?wait=true", Some(start("support-triage", json!({"ticket": "x"}))), true).await;
    let id = run["run_id"].as_str().unwrap();
    for query in ["before=garbage", "before=%00", &format!("before={}", id.to_uppercase()), "limit=0", "limit=201", "limit=100000"] {
        let (status, _, answer) = call(&app, "GET", &format!("/v1/runs?{query}"), None, true).await;
        assert_eq!((status, code(&answer)), (StatusCode::BAD_REQUEST, Some("invalid_request")), "{query}: {answer}");
    }
    for (query, runs) in [("limit=1", 1), ("limit=200", 1), (&format!("before={id}"), 0)] {
        let (status, _, page) = call(&app, "GET", &format!("/v1/runs?{query}"), None, true).await;
        assert_eq!((status, page["runs"].as_array().map(Vec::len)), (StatusCode::OK, Some(runs)), "{query}: {page}");
    }
    // A route filter with a control character names no route: an empty page, no query.
    for route in ["%00", "a%07b", "support-triage%0A"] {
        let (status, _, page) = call(&app, "GET", &format!("/v1/runs?route_id={route}"), None, true).await;
        assert_eq!((status, page), (StatusCode::OK, json!({"runs": []})), "{route}");
        let req = raw("GET", &format!("/v1/runs/updates?route_id={route}"), &[], "");
        let stream = app.clone().oneshot(req).await.unwrap();
        assert_eq!(stream.status(), StatusCode::OK);
        // Past the stream's first poll (500 ms).
        tokio::time::sleep(Duration::from_millis(700)).await;
        drop(stream);
    }
    let asked = store.asked();
    assert!(asked.iter().all(|a| !a.starts_with("list ") || a.contains("None before")), "{asked:?}");
    assert!(asked.iter().any(|a| a.starts_with("list None before Some(")), "the good `before` was asked: {asked:?}");
}

#[tokio::test]
async fn every_path_rejection_is_in_the_json_error_shape() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    for (method, uri) in [
        ("GET", "/v1/runs/%ff%fe"),
        ("GET", "/v1/runs/%ff%fe/events"),
        ("GET", "/v1/runs/%ff%fe/record"),
        ("POST", "/v1/runs/%ff%fe/reply"),
        ("GET", "/v1/routes/%ff/graph.svg"),
    ] {
        let (status, headers, answer) = send(&app, raw(method, uri, JSON, r#"{"message": "hi"}"#)).await;
        assert_eq!((status, code(&answer)), (StatusCode::BAD_REQUEST, Some("invalid_request")), "{uri}: {answer}");
        assert_eq!(headers["content-type"], "application/json", "{uri}");
        assert!(!message(&answer).contains("%ff") && !message(&answer).contains('\u{fffd}'), "the segment is not repeated: {answer}");
    }
}

#[tokio::test]
async fn identifiers_that_cannot_be_run_ids_are_404_before_any_store_query() {
    let store = Watched::new().await;
    let (app, _stub) = service::app_on(store.clone(), None, authed(ApiConfig::default()));
    let id = asking_run(&app).await;
    let ids = ["nope".to_owned(), "%00".into(), "a%0Ab".into(), id.to_uppercase(), format!("%7B{id}%7D"), id.replace('-', ""), format!("urn:uuid:{id}")];
    for bad in &ids {
        for (method, uri) in [
            ("GET", format!("/v1/runs/{bad}")),
            ("GET", format!("/v1/runs/{bad}/events")),
            ("GET", format!("/v1/runs/{bad}/record")),
            ("POST", format!("/v1/runs/{bad}/reply")),
        ] {
            let (status, _, answer) = send(&app, raw(method, &uri, JSON, r#"{"message": "order 42"}"#)).await;
            assert_eq!((status, code(&answer)), (StatusCode::NOT_FOUND, Some("not_found")), "{method} {uri}: {answer}");
        }
    }
    let asked = store.asked();
    assert!(asked.iter().all(|a| *a == id), "only the real run was looked up: {asked:?}");
    // The run that asked is still waiting: no reply reached it.
    assert_eq!(call(&app, "GET", &format!("/v1/runs/{id}"), None, true).await.2["status"], "awaiting_input");
    // The CLI says the same without opening the store (this one cannot be reached).
    let unreachable = "postgres://u:p@127.0.0.1:1/none";
    for args in [&["runs", "--store", unreachable, "show", "nope"][..], &["replay", "NOPE", "--store", unreachable][..]] {
        let o = fabric_cli(args, &[]).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(err(&o).contains("no run `nope`") || err(&o).contains("no run `NOPE`"), "{args:?}: {}", err(&o));
        assert!(!err(&o).contains("run store"), "{args:?}: {}", err(&o));
    }
}

#[tokio::test]
async fn empty_replies_are_refused() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    let id = asking_run(&app).await;
    for empty in ["", " ", "\n\t  "] {
        let (status, _, answer) = call(&app, "POST", &format!("/v1/runs/{id}/reply"), Some(json!({"message": empty})), true).await;
        assert_eq!((status, code(&answer)), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request")), "{empty:?}: {answer}");
        assert!(message(&answer).contains("empty"), "{answer}");
    }
    assert_eq!(call(&app, "GET", &format!("/v1/runs/{id}"), None, true).await.2["status"], "awaiting_input");
    let (status, _, _) = call(&app, "POST", &format!("/v1/runs/{id}/reply"), Some(json!({"message": "order 42"})), true).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn ids_echoed_in_errors_are_truncated() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    let long = "r".repeat(5000);
    let cut = format!("`{}…`", "r".repeat(64));
    let mut answers = Vec::new();
    for (method, uri) in [
        ("GET", format!("/v1/runs/{long}")),
        ("GET", format!("/v1/runs/{long}/events")),
        ("GET", format!("/v1/runs/{long}/record")),
        ("POST", format!("/v1/runs/{long}/reply")),
        ("GET", format!("/v1/routes/{long}/graph.svg")),
        ("GET", format!("/v1/runs?status={long}")),
    ] {
        answers.push((uri.clone(), send(&app, raw(method, &uri, JSON, r#"{"message": "hi"}"#)).await.2));
    }
    for body in [start(&long, json!({})), json!({"route_id": "support-triage", "goal": {}, "model_profile": long})] {
        answers.push(("/v1/runs".into(), call(&app, "POST", "/v1/runs", Some(body), true).await.2));
    }
    for (uri, answer) in answers {
        let m = message(&answer);
        assert!(m.contains(&cut) && m.chars().count() < 160, "{}: {m}", &uri[..40.min(uri.len())]);
    }
}

#[tokio::test]
async fn prefetch_has_a_limit_of_its_own() {
    let (app, _stub) = service::app(None, authed(ApiConfig::default())).await;
    let with = |prefetch: Vec<String>| json!({"route_id": "support-triage", "goal": {"ticket": "x"}, "model_profile": "default", "prefetch": prefetch});
    for prefetch in [vec!["p".to_owned(); 257], vec!["p".repeat(200 * 1024); 2]] {
        let (status, _, answer) = call(&app, "POST", "/v1/runs", Some(with(prefetch)), true).await;
        assert_eq!((status, code(&answer)), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")), "{}", message(&answer));
        assert!(message(&answer).contains("prefetch"), "{answer}");
    }
    for prefetch in [vec!["p".to_owned(); 256], vec!["p".repeat(256 * 1024)]] {
        let (status, _, answer) = call(&app, "POST", "/v1/runs", Some(with(prefetch)), true).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }
}

// ---- issue 22: hostile input, second pass ----

/// A PostgreSQL connection string in libpq's key=value form: its password (and any other secret
/// value) is shown by no command, and the store's error says which form to use instead.
#[tokio::test]
async fn a_key_value_postgres_string_never_shows_its_password() {
    const SECRET: &str = "Pw8-SECRET-kv";
    let kv = format!("host=127.0.0.1 port=1 password={SECRET} user=u sslpassword='{SECRET} 2' dbname=runs");
    let env = [("FABRIC_DATABASE_URL", kv.clone()), ("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_API_TOKEN", "t".repeat(40))];
    for args in [
        &["doctor"][..],
        &["runs", "list"][..],
        &["runs", "--store", &kv, "list"][..],
        &["runs", "--store", &kv, "show", "01a23557-75e7-7397-96f6-981d2487d8e5"][..],
        &["serve", "--listen", "127.0.0.1:0"][..],
    ] {
        let o = fabric_cli(args, &env).await;
        let all = format!("{}{}", out(&o), err(&o));
        assert!(!all.contains(SECRET), "{args:?}: {all}");
        // Where the database is stays visible.
        assert!(all.contains("host=127.0.0.1 port=1"), "{args:?}: {all}");
        if args[0] != "doctor" {
            assert_eq!(o.status.code(), Some(2), "{args:?}: {all}");
            assert!(all.contains("postgres://USER:PASSWORD@HOST:PORT/DB"), "{args:?}: {all}");
        }
    }
}

/// A PostgreSQL URL whose password holds `#`, `?` or `/` unencoded (a generated password, often):
/// sqlx refuses it ("invalid port number"), and the error, doctor and serve show none of the
/// password, though a cut at its `#` or `?` would come before the `@` that ends it.
#[tokio::test]
async fn a_postgres_url_whose_password_holds_a_hash_or_question_mark_never_shows_it() {
    for url in [
        "postgres://u:Pw8/SECRET#x@127.0.0.1:1/db",
        "postgres://u:Pw8?SECRET@127.0.0.1:1/db",
        "postgresql://u:Pw8#SECRET?y@127.0.0.1:1/db?sslmode=disable",
        "postgres://127.0.0.1:1/db?user=a@b&password=Pw8SECRET",
    ] {
        let env = [("FABRIC_DATABASE_URL", url.to_owned()), ("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_API_TOKEN", "t".repeat(40))];
        for args in [&["doctor"][..], &["runs", "list"][..], &["runs", "--store", url, "list"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
            let o = fabric_cli(args, &env).await;
            let all = format!("{}{}", out(&o), err(&o));
            assert!(!all.contains("SECRET") && !all.contains("Pw8"), "{url}: {args:?}: {all}");
        }
    }
}

/// SIGTERM drains: logged, exit 0, and the run in flight handed over (its lease let go, so
/// another process claims it at once), not killed with its lease held. (SIGHUP reloads the
/// catalogue: `versions::sighup_reloads_and_does_not_stop`.)
#[tokio::test]
async fn sigterm_drains_and_hands_over() {
    use crate::service::{Server, asking_stub, post};
    let dir = tempfile::tempdir().unwrap();
    let db = &format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let server = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "20000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")]);
    let (status, run) = post(&server, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "slow"}, "model_profile": "default"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (exit, logs) = server.stop_with("TERM");
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("shutting down"), "{logs}");
    assert!(logs.contains("handed over"), "{logs}");
    // After the drain the replica's loops are stopped and waited for, every one of them.
    let stopped = logs.lines().find(|l| l.contains("every background loop of the replica stopped")).unwrap_or_else(|| panic!("{logs}"));
    assert!(stopped.contains("\"loops\":8"), "{stopped}");
    assert!(logs.find("handed over").unwrap() < logs.find("every background loop").unwrap(), "{logs}");
    // Let go: a new holder claims it at once, long before its 30 s lease would have expired.
    let store = fabric::store::open(db).await.unwrap();
    let holder = fabric::store::Holder::new(Duration::from_secs(30));
    let claimed = store.claim_runs(&holder, &["support-triage".to_owned()], 10).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.lease.run_id()).collect::<Vec<_>>(), [id.as_str()]);
}

/// A short `FABRIC_API_TOKEN` is refused on an address the network reaches, and only warned about
/// on loopback (the README's `change-me` example keeps working).
#[tokio::test]
async fn a_short_token_is_refused_off_loopback_and_warned_about_on_it() {
    use crate::service::{Server, TOKEN, asking_stub, get};
    assert!(TOKEN.len() < 32);
    let serve = |listen: &str, token: &str| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.current_dir(repo())
            .args(["serve", "--listen", listen])
            .env("FABRIC_LLM_STUB", "1")
            .env("FABRIC_API_TOKEN", token)
            .env("FABRIC_DATABASE_URL", "sqlite::memory:")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    for short in ["x", "change-me", &"k".repeat(31)] {
        let o = serve("0.0.0.0:0", short).output().unwrap();
        let all = format!("{}{}", out(&o), err(&o));
        assert_eq!(o.status.code(), Some(2), "{all}");
        assert!(all.contains("FABRIC_API_TOKEN") && all.contains("32"), "{all}");
        assert!(short.len() < 4 || !all.contains(short), "the token is not echoed: {all}");
    }
    // 32 characters off loopback: it starts.
    let mut child = serve("0.0.0.0:0", &"k".repeat(32)).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("http://0.0.0.0:"), "{line:?}");
    // A short one on loopback: served, with a warning.
    let dir = tempfile::tempdir().unwrap();
    let stub = asking_stub();
    let server = Server::start(&format!("sqlite://{}", dir.path().join("fabric.db").display()), stub.path(), &[]);
    assert!(get(&server, "/v1/routes").await.is_array());
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(logs.contains("FABRIC_API_TOKEN is shorter than 32 characters"), "{logs}");
    assert!(!logs.contains(TOKEN), "{logs}");
}

/// A request body that never finishes arriving (trickled, or chunked without an end) is answered
/// 408 `request_timeout` and its connection closed, within the body timeout.
#[tokio::test]
async fn a_body_that_never_finishes_is_cut_off_with_408() {
    use crate::service::{Server, TOKEN, asking_stub, get};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let stub = asking_stub();
    let server = Server::start(&format!("sqlite://{}", dir.path().join("fabric.db").display()), stub.path(), &[("FABRIC_BODY_TIMEOUT_S", "1")]);
    let addr = server.url.trim_start_matches("http://").to_owned();
    for framing in ["Content-Length: 100000", "Transfer-Encoding: chunked"] {
        let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!("POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n");
        slow.write_all(head.as_bytes()).await.unwrap();
        let first: &[u8] = if framing.starts_with("Content") { b"{" } else { b"1\r\n{\r\n" };
        slow.write_all(first).await.unwrap();
        // A byte now and then, never the end, while the answer is read (until the server closes:
        // a reset after the answer still leaves the answer read); a minute is the test's patience.
        let (mut reader, mut writer) = slow.into_split();
        let trickle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let byte: &[u8] = if framing.starts_with("Content") { b" " } else { b"1\r\n \r\n" };
                if writer.write_all(byte).await.is_err() {
                    break;
                }
            }
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), async {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = reader.read(&mut buf).await {
                answer.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        trickle.abort();
        assert!(read.is_ok(), "{framing}: the connection is still open after a minute");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{framing}: {answer}");
        let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default()).unwrap_or_default();
        assert_eq!(body["error"]["code"], "request_timeout", "{framing}: {answer}");
    }
    // Others are served meanwhile and after.
    assert!(get(&server, "/v1/routes").await.is_array());
    // `fabric doctor` shows it with the other service settings, and refuses a bad one.
    let o = fabric_cli(&["doctor"], &[("FABRIC_LLM_STUB", "1".into()), ("FABRIC_BODY_TIMEOUT_S", "7".into())]).await;
    assert!(out(&o).contains("body timeout 7 s"), "{}", out(&o));
    let o = fabric_cli(&["doctor"], &[("FABRIC_LLM_STUB", "1".into()), ("FABRIC_BODY_TIMEOUT_S", "0".into())]).await;
    assert!(out(&o).contains("FABRIC_BODY_TIMEOUT_S"), "{}", out(&o));
}

/// Open event streams do not hold a shutdown past its grace period: each ends then with a clean
/// `: shutting down` comment, and the process exits soon after.
#[tokio::test]
async fn a_shutdown_ends_open_streams_with_a_comment_after_the_grace() {
    use crate::service::{Server, TOKEN, asking_stub, client, post};
    let dir = tempfile::tempdir().unwrap();
    let db = &format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let mut server = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "20000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")]);
    let (status, run) = post(&server, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "slow"}, "model_profile": "default"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let mut streams = Vec::new();
    for path in [format!("/v1/runs/{id}/events"), "/v1/runs/updates".to_owned()] {
        let response = client().get(format!("{}{path}", server.url)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        streams.push(tokio::spawn(async move { (path, response.text().await) }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signalled = std::time::Instant::now();
    server.signal("TERM");
    // Generous: the grace period is 1 s; before, the stream held the process for 16 s.
    let mut exit = None;
    while signalled.elapsed() < Duration::from_secs(10) && exit.is_none() {
        exit = server.child.try_wait().unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exit.is_some_and(|e| e.success()), "still running {:?} after SIGTERM: {exit:?} {}", signalled.elapsed(), server.logs());
    for stream in streams {
        let (path, text) = stream.await.unwrap();
        let text = text.unwrap_or_else(|e| panic!("{path}: the stream was cut: {e}"));
        assert!(text.ends_with(": shutting down\n\n"), "{path}: {text:?}");
    }
}

/// Event streams of a run are capped (per run and in all, 429 `too_many_streams`), and the
/// streams of a run followed through the store (executed by another replica) share one poller:
/// N streams cost one store reader, not N, and each still gets every event once, in order.
#[tokio::test]
async fn streams_of_a_run_elsewhere_share_one_poller_and_are_capped() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use fabric::api::{ApiConfig, AppState, router};
    use fabric::events::EventKind;
    use fabric::exec::JournalBatch;
    use fabric::store::Holder;
    use tower::ServiceExt;
    let store = fabric::store::open("sqlite::memory:").await.unwrap();
    let runtime = fabric::runtime::Durable::new(
        fabric::runtime::Runtime::builder()
            .settings(Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap())
            .catalogue_dirs(routes_dir(), packs_dir())
            .stub(StubLlm::default())
            .build()
            .unwrap(),
        store.clone(),
    );
    let config = ApiConfig { token: Some("t".repeat(32)), max_run_streams: 8, max_event_streams: 9, ..ApiConfig::default() };
    let app = router(AppState::new(Arc::new(runtime), config));
    let request = |uri: &str| Request::builder().uri(uri).header("authorization", format!("Bearer {}", "t".repeat(32))).body(Body::empty()).unwrap();
    // Two runs executed by another replica (claimed by another holder): followed through the store.
    let elsewhere = Holder::new(Duration::from_secs(30));
    let contract: fabric::store::StartRequest =
        serde_json::from_value(json!({"route_id": "support-triage", "goal": {}, "model_profile": "default", "prefetch": [], "session_id": null})).unwrap();
    let (a, b) = ("0190a000-0000-7000-8000-00000000000a", "0190a000-0000-7000-8000-00000000000b");
    let lease = store.create_run(NewRun::new(a, &contract), Some(&elsewhere)).await.unwrap().unwrap();
    store.create_run(NewRun::new(b, &contract), Some(&elsewhere)).await.unwrap().unwrap();
    let mut streams = Vec::new();
    for _ in 0..8 {
        let response = app.clone().oneshot(request(&format!("/v1/runs/{a}/events"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        streams.push(response.into_body());
    }
    let code = |response: axum::response::Response| async move {
        let status = response.status();
        let body: Value = serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap_or_default();
        (status, body["error"]["code"].as_str().unwrap_or_default().to_owned())
    };
    // The ninth of one run: refused.
    let refused = app.clone().oneshot(request(&format!("/v1/runs/{a}/events"))).await.unwrap();
    assert_eq!(refused.headers()["retry-after"], "5");
    assert_eq!(code(refused).await, (StatusCode::TOO_MANY_REQUESTS, "too_many_streams".to_owned()));
    // Another run still has room, up to the cap in all.
    let other = app.clone().oneshot(request(&format!("/v1/runs/{b}/events"))).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let over = app.clone().oneshot(request(&format!("/v1/runs/{b}/events"))).await.unwrap();
    assert_eq!(code(over).await, (StatusCode::TOO_MANY_REQUESTS, "too_many_streams".to_owned()));
    // Nine streams, two pollers: one per run.
    let metrics = |want: &'static [&'static str]| {
        let app = app.clone();
        async move {
            let mut text = String::new();
            for _ in 0..100 {
                let response = app.clone().oneshot(request("/metrics")).await.unwrap();
                text = String::from_utf8(axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap();
                if want.iter().all(|w| text.lines().any(|l| l == *w)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{want:?} not in {text}");
        }
    };
    metrics(&["fabric_event_streams 9", "fabric_event_stream_pollers 2"]).await;
    // The other replica records the run: every stream gets each event once, in order, and ends.
    let event = |seq: u64, kind| fabric::events::Event {
        kind,
        run_id: a.into(),
        route_id: "support-triage".into(),
        seq,
        ts: "2026-01-01T00:00:00.000Z".into(),
        stage_id: None,
        parent_run_id: None,
        data: crate::support::bare_data(kind),
    };
    store
        .commit(&lease, JournalBatch { events: vec![event(1, EventKind::RunStarted), event(2, EventKind::StageStarted)], ..Default::default() })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut end = fabric::exec::result_from_journal(a, "support-triage", &[], fabric::failure::ReasonClass::Interrupted, "x");
    end.end = fabric::exec::RunEnd::Completed { output: None };
    store.commit(&lease, JournalBatch { events: vec![event(3, EventKind::RunCompleted)], end: Some(end), ..Default::default() }).await.unwrap();
    for body in streams {
        let events = crate::service::read_sse(body, |_| false).await;
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["run.started", "run.stage.started", "run.completed"], "{events:?}");
        assert_eq!(events.iter().map(|(_, e)| e["seq"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3]);
    }
    // Its poller is gone with its run; the other's goes with its last stream.
    metrics(&["fabric_event_streams 1", "fabric_event_stream_pollers 1"]).await;
    drop(other);
    metrics(&["fabric_event_streams 0", "fabric_event_stream_pollers 0"]).await;
}
