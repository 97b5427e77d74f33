//! Model fallback chains (issue 49) against three fake providers of three kinds on real
//! sockets: OpenAI's chat API, Anthropic's Messages API, the Gemini API. Which failures move on
//! and which do not, the schema in each provider's own form (against LangChain's wire fixtures),
//! a thousand runs with seeded faults replayed for zero calls, the breaker, and the bad
//! catalogues refused at load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fabric::cancel::{Cancel, CancelHandle};
use fabric::config::{ProviderKind, Settings};
use fabric::events::{EventKind, EventSink, FanOut, MemorySink};
use fabric::exec::RunStatus;
use fabric::runtime::{Durable, Runtime, StartRequest};
use serde_json::{Value, json};

use crate::support::{Canned, FakeProvider, fixtures, packs_dir};

/// The stage's schema: the one LangChain's wire fixtures were made with.
fn fixture_schema() -> Value {
    wire_fixture("openai")["requests"][0]["schema"].clone()
}

fn wire_fixture(provider: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(format!("wire/{provider}.json"))).unwrap()).unwrap()
}

/// A reply of `kind` carrying `answer` as its structured output, in that provider's form.
fn answer(kind: ProviderKind, body: &Value, answer: &Value) -> Value {
    match kind {
        ProviderKind::OpenAi => json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer.to_string()}, "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 20, "completion_tokens": 5}}),
        ProviderKind::Anthropic => json!({"content": [{"type": "tool_use", "id": "t", "name": body["tool_choice"]["name"], "input": answer}],
                                          "stop_reason": "tool_use", "usage": {"input_tokens": 20, "output_tokens": 5}}),
        ProviderKind::Gemini => json!({"candidates": [{"content": {"role": "model", "parts": [{"text": answer.to_string()}]}, "finishReason": "STOP"}]}),
        other => panic!("no fake for {other:?}"),
    }
}

const GOOD: &str = r#"{"category": "billing", "priority": 2}"#;

/// A fake provider of `kind` that answers every request well.
fn healthy(kind: ProviderKind) -> FakeProvider {
    FakeProvider::new(move |body| Canned::json(200, answer(kind, body, &serde_json::from_str(GOOD).unwrap())))
}

/// A catalogue: route `fb` of one structured stage, its profile `primary` (OpenAI at `a`) falling
/// back to `backup` (Anthropic at `b`), then `last` (Gemini at `c`); `extra` added to `primary`.
fn catalogue(dir: &Path, urls: [&str; 3], extra: &str) -> PathBuf {
    let routes = dir.join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    let schema = serde_json::to_string(&fixture_schema()).unwrap();
    let [a, b, c] = urls;
    std::fs::write(
        routes.join("fb.yaml"),
        format!(
            "profiles:\n  primary:\n    provider: openai\n    model: gpt-4o-mini\n    base_url: {a}\n    api_key_env: KEY_A\n    fallbacks: [backup]\n{extra}\
             \n  backup:\n    provider: anthropic\n    model: claude-sonnet-4-5\n    base_url: {b}\n    api_key_env: KEY_B\n    fallbacks: [last]\n\
             \n  last:\n    provider: google_genai\n    model: gemini-2.5-flash\n    base_url: {c}\n    api_key_env: KEY_C\n\
             capabilities:\n  triage:\n    description: Classify the ticket.\n    output_schema: {schema}\n\
             workflows:\n  fb:\n    stages:\n      - {{id: classify, llm_role: classify, capability: triage}}\n\
             routes:\n  fb:\n    model_profile: primary\n    prompt_pack: support\n    workflow: fb\n"
        ),
    )
    .unwrap();
    routes
}

/// The settings of a process that honours profiles; `more` on top.
fn settings(more: &[(&'static str, &'static str)]) -> Settings {
    let more: Vec<(&'static str, &'static str)> = more.to_vec();
    Settings::load(move |k| {
        let base = [
            ("FABRIC_HONOR_MODEL_PROFILE", "1"),
            ("FABRIC_LLM_MODEL", "openai:gpt-4o-mini"),
            ("OPENAI_API_KEY", "unused"),
            ("KEY_A", "key-a"),
            ("KEY_B", "key-b"),
            ("KEY_C", "key-c"),
            ("FABRIC_LLM_RETRY_MAX", "1"),
        ];
        more.iter().chain(base.iter()).find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    })
    .unwrap()
}

fn runtime(routes: &Path, settings: Settings) -> Runtime {
    Runtime::builder().settings(settings).catalogue_dirs(routes.to_path_buf(), packs_dir()).build().unwrap()
}

fn goal() -> serde_json::Map<String, Value> {
    json!({"ticket": "I was charged twice for my plan"}).as_object().unwrap().clone()
}

/// `run.llm.fallback` events as `from>to:reason:class`.
fn fallbacks(sink: &MemorySink) -> Vec<String> {
    sink.events()
        .iter()
        .filter(|e| e.kind == EventKind::LlmFallback)
        .map(|e| {
            let v = serde_json::to_value(&e.data).unwrap();
            format!("{}>{}:{}:{}", v["from"].as_str().unwrap(), v["to"].as_str().unwrap(), v["reason"].as_str().unwrap(), v["reason_class"].as_str().unwrap())
        })
        .collect()
}

const A: &str = "openai:gpt-4o-mini";
const B: &str = "anthropic:claude-sonnet-4-5";

#[tokio::test]
async fn each_failure_of_the_first_model_moves_on_or_not_as_documented() {
    let refusal =
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": "I cannot help with that."}, "finish_reason": "stop"}]});
    let filtered = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "content_filter"}]});
    let off_schema = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"category\": \"nope\"}"}, "finish_reason": "stop"}]});
    let cut = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"cat"}, "finish_reason": "length"}]});
    // (what the first model answers, `fallback_on_invalid`, the fallback said or none)
    let cases: Vec<(Canned, bool, Option<&str>)> = vec![
        (Canned::json(503, json!({"error": {"code": "overloaded"}})), false, Some("unavailable:server_error")),
        (Canned::json(500, json!({})), false, Some("unavailable:server_error")),
        (Canned { headers: vec![("retry-after", "0".into())], ..Canned::json(429, json!({})) }, false, Some("rate_limited:rate_limited")),
        (Canned::json(401, json!({"error": {"code": "invalid_api_key"}})), false, Some("auth:client_error")),
        (Canned::json(403, json!({})), false, Some("auth:client_error")),
        (Canned::json(200, refusal), false, Some("refused:provider_error")),
        (Canned::json(200, filtered), false, Some("refused:provider_error")),
        (Canned::json(200, off_schema.clone()), true, Some("invalid:schema_validation")),
        // Never: the request the route made is wrong for every model; invalid output unless
        // the profile asks; a reply cut at the token limit.
        (Canned::json(400, json!({"error": {"code": "invalid_request_error"}})), true, None),
        (Canned::json(404, json!({})), true, None),
        (Canned::json(200, off_schema), false, None),
        (Canned::json(200, cut), true, None),
    ];
    for (canned, on_invalid, moves) in cases {
        let (a, b, c) = (healthy(ProviderKind::OpenAi), healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
        a.push(canned.clone());
        let urls = [a.start().await, b.start().await, c.start().await];
        let dir = tempfile::tempdir().unwrap();
        let extra = if on_invalid { "    fallback_on_invalid: true\n" } else { "" };
        let routes = catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], extra);
        let rt = runtime(&routes, settings(&[]));
        let sink = Arc::new(MemorySink::default());
        let out = rt.run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await.unwrap();
        let what = format!("{} {:?}", canned.status, canned.body);
        match moves {
            Some(why) => {
                assert_eq!(fallbacks(&sink), [format!("{A}>{B}:{why}")], "{what}");
                assert_eq!(out.result.status(), RunStatus::Completed, "{what}: {:?}", out.result.end);
                assert_eq!((a.requests().len(), b.requests().len(), c.requests().len()), (1, 1, 0), "{what}");
            }
            None => {
                assert!(fallbacks(&sink).is_empty(), "{what}: {:?}", fallbacks(&sink));
                assert_eq!(out.result.status(), RunStatus::Failed, "{what}");
                assert_eq!((b.requests().len(), c.requests().len()), (0, 0), "{what}: nothing else was asked");
            }
        }
    }
}

#[tokio::test]
async fn a_chain_across_three_providers_asks_each_for_the_schema_its_own_way() {
    let (a, b, c) = (healthy(ProviderKind::OpenAi), healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
    a.push(Canned::json(503, json!({})));
    b.push(Canned::json(529, json!({"type": "error", "error": {"type": "overloaded_error"}})));
    let urls = [a.start().await, b.start().await, c.start().await];
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], ""), settings(&[]));
    let sink = Arc::new(MemorySink::default());
    let out = rt.run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await.unwrap();
    assert_eq!(out.result.status(), RunStatus::Completed, "{:?}", out.result.end);
    assert_eq!(
        fallbacks(&sink),
        [format!("{A}>{B}:unavailable:server_error"), format!("{B}>google_genai:gemini-2.5-flash:unavailable:server_error")],
        "the backup's own fallback follows it"
    );
    let kinds: Vec<EventKind> = sink.events().iter().map(|e| e.kind).filter(|k| k.as_str().starts_with("run.llm.")).collect();
    assert_eq!(kinds, [EventKind::LlmStarted, EventKind::LlmFallback, EventKind::LlmFallback, EventKind::LlmCompleted], "one logical call");
    // Each request carries the stage's schema in its provider's form, as LangChain asks for it.
    for (fake, key, kind) in [(&a, "openai", ProviderKind::OpenAi), (&b, "anthropic", ProviderKind::Anthropic), (&c, "google_genai", ProviderKind::Gemini)] {
        let reference = &wire_fixture(key)["requests"][0];
        assert_eq!(reference["kind"], "structured");
        let pointer = crate::wire::schema_pointer(kind);
        let ours = fake.requests()[0].body.pointer(pointer).cloned().unwrap_or_else(|| panic!("{key}: no schema at {pointer}"));
        let theirs = reference["body"].pointer(pointer).cloned().unwrap_or_else(|| panic!("{key} fixture: no schema at {pointer}"));
        assert_eq!(crate::wire::semantic(&ours), crate::wire::semantic(&theirs), "{key}");
    }
    let b_req = &b.requests()[0];
    assert_eq!(b_req.body["model"], "claude-sonnet-4-5");
    assert_eq!(b_req.headers["x-api-key"], "key-b", "each model with its own key");
    assert_eq!(c.requests()[0].headers["x-goog-api-key"], "key-c");
}

#[tokio::test]
async fn a_thousand_runs_with_seeded_faults_complete_valid_and_replay_for_nothing() {
    // The first model fails 30 % of its requests, seeded: a 503, a 429, a refusal or a reply
    // off the schema, in turn.
    let seq = Arc::new(AtomicU64::new(0));
    let faulty = {
        let seq = seq.clone();
        FakeProvider::new(move |body| {
            let n = seq.fetch_add(1, Ordering::SeqCst);
            let roll = n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % 100;
            if roll >= 30 {
                return Canned::json(200, answer(ProviderKind::OpenAi, body, &serde_json::from_str(GOOD).unwrap()));
            }
            match n % 4 {
                0 => Canned::json(503, json!({})),
                1 => Canned { headers: vec![("retry-after", "0".into())], ..Canned::json(429, json!({})) },
                2 => Canned::json(200, json!({"choices": [{"message": {"role": "assistant", "content": null, "refusal": "no"}, "finish_reason": "stop"}]})),
                _ => Canned::json(200, answer(ProviderKind::OpenAi, body, &json!({"category": "weather", "priority": "high"}))),
            }
        })
    };
    let (b, c) = (healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
    let urls = [faulty.start().await, b.start().await, c.start().await];
    let dir = tempfile::tempdir().unwrap();
    let routes = catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], "    fallback_on_invalid: true\n");
    let store = fabric::store::open(&format!("sqlite://{}", dir.path().join("fabric.db").display())).await.unwrap();
    // The breaker would skip the first model after three failures in a row: a thousand runs
    // should see every fault, so it opens only past a hundred.
    let rt = Arc::new(Durable::new(runtime(&routes, settings(&[("FABRIC_LLM_BREAKER_FAILURES", "100")])), store.clone()));
    let metrics = Arc::new(fabric::api::metrics::Metrics::default());
    let sink: Arc<dyn EventSink> = Arc::new(FanOut(vec![metrics.clone()]));
    let mut tasks = tokio::task::JoinSet::new();
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    for worker in 0..8 {
        let (rt, sink, ids) = (rt.clone(), sink.clone(), ids.clone());
        tasks.spawn(async move {
            for _ in 0..125 {
                let req = StartRequest { route_id: "fb".into(), goal: goal(), ..serde_json::from_value(json!({"route_id": "fb", "goal": {}})).unwrap() };
                let (handle, cancel) = CancelHandle::new();
                let out = rt.run_recorded(&req, sink.clone(), &handle, cancel).await.unwrap();
                assert_eq!(out.result.status(), RunStatus::Completed, "worker {worker}: {:?}", out.result.end);
                let v: Value = serde_json::from_str(out.result.output().unwrap()).unwrap();
                assert!(["billing", "technical", "other"].contains(&v["category"].as_str().unwrap()) && v["priority"].is_i64(), "schema-valid: {v}");
                ids.lock().unwrap().push(out.result.run_id.clone());
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 1000);
    // The fallbacks in the record, and in the metrics.
    let mut recorded = 0u64;
    for id in &ids {
        let events = store.events_after(id, 0).await.unwrap();
        let fell_back = events.iter().filter(|e| e.body.contains("\"type\":\"run.llm.fallback\"")).count() as u64;
        let journal = store.journal(id).await.unwrap();
        let model = journal.iter().find_map(|e| match e {
            fabric::exec::JournalEntry::ModelReply { model, .. } => model.clone(),
            _ => None,
        });
        assert_eq!(model.as_deref(), Some(if fell_back == 0 { A } else { B }), "the journal names who answered");
        recorded += fell_back;
    }
    let text = metrics.render(0, &[], &rt.runtime().breaker_status());
    let counted: u64 =
        text.lines().filter(|l| l.starts_with("fabric_model_fallbacks_total{")).map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum();
    assert!(recorded > 200 && recorded < 400, "about 30 % of runs fell back: {recorded}");
    assert_eq!(counted, recorded, "{text}");
    // Every run replays from its record: no provider is asked again.
    let asked = (faulty.requests().len(), b.requests().len(), c.requests().len());
    assert_eq!(asked.0, 1000);
    assert_eq!(asked.1 as u64, recorded);
    for id in &ids {
        let report = rt.replay(id, fabric::runtime::ReplayOn::Recorded).await.unwrap();
        assert!(report.divergences.is_empty(), "{id}: {:?}", report.divergences);
        assert_eq!(report.result.status(), RunStatus::Completed);
    }
    assert_eq!((faulty.requests().len(), b.requests().len(), c.requests().len()), asked, "a replay asks no model");
}

#[tokio::test]
async fn a_model_that_is_down_is_skipped_after_n_failures_and_tried_again_after_the_cooldown() {
    let down = Arc::new(AtomicBool::new(true));
    let a = {
        let down = down.clone();
        FakeProvider::new(move |body| {
            if down.load(Ordering::SeqCst) {
                Canned::json(503, json!({}))
            } else {
                Canned::json(200, answer(ProviderKind::OpenAi, body, &serde_json::from_str(GOOD).unwrap()))
            }
        })
    };
    let (b, c) = (healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
    let urls = [a.start().await, b.start().await, c.start().await];
    let dir = tempfile::tempdir().unwrap();
    let routes = catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], "");
    let rt = runtime(&routes, settings(&[("FABRIC_LLM_BREAKER_FAILURES", "3"), ("FABRIC_LLM_BREAKER_COOLDOWN_S", "1")]));
    let run = || async {
        let sink = Arc::new(MemorySink::default());
        let out = rt.run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await.unwrap();
        assert_eq!(out.result.status(), RunStatus::Completed);
        fallbacks(&sink)
    };
    for _ in 0..3 {
        assert_eq!(run().await, [format!("{A}>{B}:unavailable:server_error")]);
    }
    let state = || rt.breaker_status().into_iter().find(|s| &*s.key == A).unwrap();
    assert_eq!(state().state, fabric::runtime::BreakerState::Open);
    for _ in 0..20 {
        assert_eq!(run().await, [format!("{A}>{B}:circuit_open:server_error")]);
    }
    assert_eq!(a.requests().len(), 3, "skipped while open: no timeout paid");
    // After the cool-down one call tries it; still down: open again.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(run().await, [format!("{A}>{B}:unavailable:server_error")]);
    assert_eq!(run().await, [format!("{A}>{B}:circuit_open:server_error")]);
    assert_eq!(a.requests().len(), 4);
    // Back up: the next trial closes it.
    down.store(false, Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert!(run().await.is_empty());
    assert_eq!(state().state, fabric::runtime::BreakerState::Closed);
    assert!(run().await.is_empty());
    assert_eq!(a.requests().len(), 6);
    assert_eq!(state().opened, 2);
}

#[tokio::test]
async fn one_replicas_breaker_opening_is_seen_by_the_other_within_a_second_on_postgresql() {
    let Some(url) = crate::store::fresh_postgres().await else { return };
    let a = FakeProvider::new(|_| Canned::json(503, json!({})));
    let (b, c) = (healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
    let urls = [a.start().await, b.start().await, c.start().await];
    let dir = tempfile::tempdir().unwrap();
    let routes = catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], "");
    let replica = |routes: PathBuf, url: String| async move {
        let store = fabric::store::open(&url).await.unwrap();
        let s = settings(&[("FABRIC_LLM_BREAKER_FAILURES", "1"), ("FABRIC_LLM_BREAKER_COOLDOWN_S", "60"), ("FABRIC_FLEET", "breakers")]);
        let d = Arc::new(Durable::new(runtime(&routes, s), store));
        tokio::spawn(d.clone().share_flow());
        d
    };
    let (one, two) = (replica(routes.clone(), url.clone()).await, replica(routes, url).await);
    let state = |d: &Durable| d.runtime().breaker_status().into_iter().find(|s| &*s.key == A).unwrap().state;
    assert_eq!(state(&two), fabric::runtime::BreakerState::Closed);
    // Let both listen before the opening.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let out = one
        .runtime()
        .run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, Arc::new(MemorySink::default()), Cancel::never())
        .await
        .unwrap();
    assert_eq!(out.result.status(), RunStatus::Completed);
    assert_eq!(state(&one), fabric::runtime::BreakerState::Open);
    let told = std::time::Instant::now();
    while state(&two) != fabric::runtime::BreakerState::Open {
        assert!(told.elapsed() < std::time::Duration::from_secs(1), "the other replica did not see the opening within 1 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let sink = Arc::new(MemorySink::default());
    two.runtime().run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await.unwrap();
    assert_eq!(fallbacks(&sink), [format!("{A}>{B}:circuit_open:server_error")]);
    assert_eq!(a.requests().len(), 1, "the second replica never asked the model that is down");
}

#[test]
fn bad_fallbacks_are_refused_when_the_catalogue_loads_located() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("fallbacks: [nowhere]", "fallback `nowhere` of model profile `primary` is not a model profile"),
        ("fallbacks: [primary]", "fallback `primary` of model profile `primary` is the profile itself"),
        ("fallbacks: [backup, backup]", "fallback `backup` of model profile `primary` is named twice"),
        ("fallbacks: backup", "`fallbacks` must be a list"),
        ("fallback_on_invalid: sometimes", "`fallback_on_invalid`"),
    ];
    for (line, needle) in cases {
        let routes = dir.path().join("routes");
        let _ = std::fs::remove_dir_all(&routes);
        let routes = catalogue(dir.path(), ["http://127.0.0.1:9", "http://127.0.0.1:9", "http://127.0.0.1:9"], "");
        let file = routes.join("fb.yaml");
        let text = std::fs::read_to_string(&file).unwrap().replace("    fallbacks: [backup]\n", &format!("    {line}\n"));
        std::fs::write(&file, text).unwrap();
        let cat = fabric::catalogue::load(&routes, &packs_dir());
        let shown: Vec<String> = cat.diagnostics().iter().map(ToString::to_string).collect();
        let hit = shown.iter().find(|d| d.contains(needle)).unwrap_or_else(|| panic!("{line}: {shown:#?}"));
        assert!(hit.contains("fb.yaml:7:"), "located at the entry's line: {hit}");
        assert!(cat.route("fb").is_err(), "{line}: the route that uses the profile is broken");
    }
    // A cycle through the fallbacks' own fallbacks: each profile on it is refused at its entry.
    let routes = catalogue(dir.path(), ["http://127.0.0.1:9", "http://127.0.0.1:9", "http://127.0.0.1:9"], "");
    let file = routes.join("fb.yaml");
    let text = std::fs::read_to_string(&file).unwrap().replace("    api_key_env: KEY_C\n", "    api_key_env: KEY_C\n    fallbacks: [primary]\n");
    std::fs::write(&file, text).unwrap();
    let cat = fabric::catalogue::load(&routes, &packs_dir());
    let shown: Vec<String> = cat.diagnostics().iter().map(ToString::to_string).collect();
    for who in ["primary", "backup", "last"] {
        assert!(shown.iter().any(|d| d.contains(&format!("of model profile `{who}` leads back to `{who}`"))), "{who}: {shown:#?}");
    }
    assert!(cat.route("fb").is_err());
}

#[tokio::test]
async fn the_fleets_default_model_falls_back_through_fabric_run_and_doctor_shows_the_chain() {
    let a = FakeProvider::new(|_| Canned::json(503, json!({})));
    let b = FakeProvider::new(|body| Canned::json(200, crate::support::reply_json(ProviderKind::Anthropic, body)));
    let (a_url, b_url) = (a.start().await, b.start().await);
    let env = vec![
        ("FABRIC_LLM_MODEL", "openai:gpt-4o-mini".to_owned()),
        ("OPENAI_BASE_URL", a_url),
        ("OPENAI_API_KEY", "sk-secret-a".to_owned()),
        ("FABRIC_LLM_FALLBACKS", "anthropic:claude-haiku-4-5".to_owned()),
        ("ANTHROPIC_BASE_URL", b_url),
        ("ANTHROPIC_API_KEY", "sk-secret-b".to_owned()),
        ("FABRIC_LLM_RETRY_MAX", "1".to_owned()),
    ];
    let goal = r#"{"ticket": "I was charged twice"}"#;
    let out = crate::support::fabric_cli(&["run", "support-triage", "--goal", goal, "--events-out", "-"], &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let fell: Vec<Value> = stderr.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|e| e["type"] == "run.llm.fallback").collect();
    assert_eq!(fell.len(), 3, "each of the three model stages: {stderr}");
    assert_eq!(
        (fell[0]["from"].as_str(), fell[0]["to"].as_str(), fell[0]["reason"].as_str()),
        (Some(A), Some("anthropic:claude-haiku-4-5"), Some("unavailable"))
    );
    assert_eq!(b.requests().len(), 3);
    assert!(!stderr.contains("sk-secret"), "no key in events");
    let out = crate::support::fabric_cli(&["doctor"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("fallbacks of the default model: anthropic:claude-haiku-4-5 (FABRIC_LLM_FALLBACKS)"), "{stdout}");
    assert!(stdout.contains("open after 3 failures in a row (FABRIC_LLM_BREAKER_FAILURES), for 30 s"), "{stdout}");
    // The default model itself, or a word that is no model: refused at start, naming the variable.
    for (bad, needle) in [("openai:gpt-4o-mini", "the default model itself"), ("anthropic:x,,ollama:y", "entry 2 is empty")] {
        let mut env = env.clone();
        env.retain(|(k, _)| *k != "FABRIC_LLM_FALLBACKS");
        env.push(("FABRIC_LLM_FALLBACKS", bad.to_owned()));
        let out = crate::support::fabric_cli(&["run", "support-triage", "--goal", goal], &env).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("FABRIC_LLM_FALLBACKS") && stderr.contains(needle), "{bad}: {stderr}");
    }
}

#[tokio::test]
async fn a_paused_model_is_skipped_when_the_profile_prefers_an_available_one() {
    // A 429 that names a 30 s wait pauses the first model for every call of the process.
    let a = healthy(ProviderKind::OpenAi);
    a.push(Canned { headers: vec![("retry-after", "30".into())], ..Canned::json(429, json!({})) });
    let (b, c) = (healthy(ProviderKind::Anthropic), healthy(ProviderKind::Gemini));
    let urls = [a.start().await, b.start().await, c.start().await];
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&catalogue(dir.path(), [&urls[0], &urls[1], &urls[2]], "    prefer_available: true\n"), settings(&[]));
    let run = || async {
        let sink = Arc::new(MemorySink::default());
        let out = rt.run(fabric::exec::RunRequest { route_id: "fb".into(), goal: goal(), prefetch: vec![] }, sink.clone(), Cancel::never()).await.unwrap();
        assert_eq!(out.result.status(), RunStatus::Completed);
        fallbacks(&sink)
    };
    assert_eq!(run().await, [format!("{A}>{B}:rate_limited:rate_limited")]);
    let started = std::time::Instant::now();
    for _ in 0..5 {
        assert_eq!(run().await, [format!("{A}>{B}:paused:rate_limited")], "skipped, not waited for");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(a.requests().len(), 1);
}
