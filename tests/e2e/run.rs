//! Runs through the library: stage behaviour, events, failures, tools, child runs, prefetch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Query;
use axum::routing::get;
use fabric::catalogue::{self, Catalogue};
use fabric::events::{Event, MemorySink};
use fabric::exec::{RunRequest, RunResult, RunStatus, Runner, StartError};
use fabric::llm::stub::StubLlm;
use fabric::prompt::DEFAULT_SYSTEM_TEXT;
use serde_json::{Map, Value, json};

use crate::support::{Recording, Seen, fixtures, packs_dir, routes_dir, serve, stub_dir};

fn shipped() -> Arc<Catalogue> {
    Arc::new(catalogue::load(&routes_dir(), &packs_dir()))
}

fn shipped_stub() -> StubLlm {
    StubLlm::load(&stub_dir()).unwrap().strict(true)
}

fn goal() -> Map<String, Value> {
    json!({"ticket": "I was charged twice for my subscription"}).as_object().unwrap().clone()
}

struct Harness {
    runner: Runner,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn harness(cat: Arc<Catalogue>, stub: StubLlm, vars: Vec<(&'static str, String)>) -> Harness {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let llm = fabric::llm::stack::build(Recording { inner: stub, seen: seen.clone() }, Default::default());
    let lookup = move |k: &str| vars.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone());
    Harness { runner: Runner::new(cat, llm, Arc::new(lookup)).unwrap(), seen }
}

async fn run(h: &Harness, route: &str, prefetch: Vec<String>) -> (RunResult, Vec<Event>) {
    let sink = Arc::new(MemorySink::default());
    let result = h.runner.run(RunRequest { route_id: route.into(), goal: goal(), prefetch }, sink.clone()).await.unwrap();
    (result, sink.events())
}

fn types(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| format!("{}{}", e.kind, e.stage_id.as_ref().map(|s| format!(":{s}")).unwrap_or_default())).collect()
}

#[tokio::test]
async fn support_triage_tells_its_whole_story() {
    let stub = shipped_stub();
    let h = harness(shipped(), stub.clone(), vec![]);
    let (result, events) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(result.output(), Some("You were charged twice; the duplicate charge has been refunded."));
    assert_eq!(result.slots["intake"], r#"{"category":"billing","urgency":"high"}"#);
    assert_eq!(result.slots["lookup"], r#"{"query":"duplicate subscription charge refund"}"#);
    assert!(stub.unconsumed(&result.llm_calls).is_empty());
    assert_eq!(
        types(&events),
        [
            "run.started",
            "run.stage.started:intake",
            "run.llm.started:intake",
            "run.llm.completed:intake",
            "run.stage.completed:intake",
            "run.stage.started:lookup",
            "run.llm.started:lookup",
            "run.llm.completed:lookup",
            "run.stage.completed:lookup",
            "run.stage.started:answer",
            "run.llm.started:answer",
            // The synthesis streams: its text before the call's end.
            "run.llm.delta:answer",
            "run.llm.completed:answer",
            "run.stage.completed:answer",
            "run.completed",
        ]
    );
    let shown: String = events
        .iter()
        .filter_map(|e| match &e.data {
            fabric::events::EventData::LlmDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    // The reply as the model wrote it: the structured answer's JSON.
    let written: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(written["text"].as_str(), result.output(), "the deltas joined are the reply");
    for (idx, e) in events.iter().enumerate() {
        assert_eq!(e.seq, idx as u64 + 1);
        assert_eq!(e.run_id.as_ref(), result.run_id);
        assert_eq!(e.route_id.as_ref(), "support-triage");
        let j = e.to_json();
        for key in ["type", "run_id", "route_id", "seq", "ts"] {
            assert!(j.get(key).is_some(), "{key} missing in {j}");
        }
    }
    assert_eq!(events[0].to_json()["model_profile"], "default");
    // The exact user message of each call, built from run state.
    let seen = h.seen.lock().unwrap().clone();
    let g = r#"goal: {"ticket":"I was charged twice for my subscription"}"#;
    assert_eq!(seen[0].user, g);
    assert_eq!(seen[1].user, format!("{g}\nprior stage outputs:\n- intake: {{\"category\":\"billing\",\"urgency\":\"high\"}}"));
    assert_eq!(
        seen[2].user,
        format!(
            "{g}\nprior stage outputs:\n- intake: {{\"category\":\"billing\",\"urgency\":\"high\"}}\n- lookup: {{\"query\":\"duplicate subscription charge refund\"}}"
        )
    );
    assert!(seen[0].system.starts_with("You are the support desk assistant"), "role template with {{{{host}}}}: {}", seen[0].system);
}

#[tokio::test]
async fn query_formulation_calls_the_search_tool() {
    let app = axum::Router::new().route(
        "/search",
        get(|Query(q): Query<std::collections::HashMap<String, String>>| async move {
            axum::Json(json!({"hits": [{"id": 1, "title": format!("Result for {}", q["q"])}]}))
        }),
    );
    let url = serve(app).await;
    let h = harness(shipped(), shipped_stub(), vec![("KB_SEARCH_URL", url)]);
    let (result, events) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.slots["lookup"], r#"{"hits":[{"id":1,"title":"Result for duplicate subscription charge refund"}]}"#);
    let tool = events.iter().find(|e| e.kind == "run.tool.completed").unwrap();
    assert_eq!(tool.to_json()["status"], 200);
    let started = events.iter().find(|e| e.kind == "run.tool.started").unwrap();
    assert!(started.to_json()["url"].as_str().unwrap().ends_with("/search"), "no query string in events: {}", started.to_json()["url"]);
}

#[tokio::test]
async fn tool_failures_fail_the_stage_with_their_class() {
    let app = axum::Router::new()
        .route("/search", get(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom") }))
        .route("/big/search", get(|| async { "x".repeat(2 * 1024 * 1024) }))
        .route(
            "/slow/search",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route("/away/search", get(|| async { axum::response::Redirect::temporary("http://localhost:9/search") }));
    let base = serve(app).await;
    for (suffix, class) in [("", "tool_http_status"), ("/big", "tool_response_too_large"), ("/away", "tool_connection")] {
        let h = harness(shipped(), StubLlm::load(&stub_dir()).unwrap(), vec![("KB_SEARCH_URL", format!("{base}{suffix}"))]);
        let (result, events) = run(&h, "support-triage", vec![]).await;
        assert_eq!(result.status(), RunStatus::Failed);
        let err = result.error().unwrap();
        assert_eq!((err.reason_class.as_str(), err.stage_id.as_deref()), (class, Some("lookup")), "{suffix}: {}", err.message);
        let kinds = types(&events);
        assert!(kinds.ends_with(&["run.tool.failed:lookup".into(), "run.stage.failed:lookup".into(), "run.failed:lookup".into()]), "{kinds:?}");
        // What was done before the failure is kept.
        assert_eq!(result.slots["intake"], r#"{"category":"billing","urgency":"high"}"#);
    }
    // Timeouts: a catalogue with a 200 ms tool timeout.
    let tmp = tempfile::tempdir().unwrap();
    let routes = tmp.path().join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    for f in ["profiles.yaml", "support-triage.yaml"] {
        let text = std::fs::read_to_string(routes_dir().join(f)).unwrap().replace("timeout_ms: 5000", "timeout_ms: 200");
        std::fs::write(routes.join(f), text).unwrap();
    }
    let cat = Arc::new(catalogue::load(&routes, &packs_dir()));
    let h = harness(cat, StubLlm::load(&stub_dir()).unwrap(), vec![("KB_SEARCH_URL", format!("{base}/slow"))]);
    let (result, _) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.error().unwrap().reason_class, "tool_timeout");
}

#[tokio::test]
async fn a_schema_violation_fails_the_run_without_retry() {
    let stub = StubLlm::default().script("support-triage", "intake", &[r#"{"category":"sales","urgency":"high"}"#]);
    let h = harness(shipped(), stub, vec![]);
    let (result, events) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.status(), RunStatus::Failed);
    assert_eq!(result.error().unwrap().reason_class, "schema_validation");
    assert_eq!(
        types(&events),
        ["run.started", "run.stage.started:intake", "run.llm.started:intake", "run.llm.failed:intake", "run.stage.failed:intake", "run.failed:intake"]
    );
    assert_eq!(events[3].to_json()["reason_class"], "schema_validation");
    // The reply that failed, as received: what an operator reads to see why.
    assert_eq!(events[3].to_json()["reply"], r#"{"category":"sales","urgency":"high"}"#);
    assert_eq!(h.seen.lock().unwrap().len(), 1, "validation failures are never retried");
}

#[tokio::test]
async fn invalid_json_is_its_own_reason() {
    let stub = StubLlm::default().script("support-triage", "intake", &["Sure! The category is billing."]);
    let h = harness(shipped(), stub, vec![]);
    let (result, events) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.error().unwrap().reason_class, "invalid_json");
    let failed = events.iter().find(|e| e.kind.as_str() == "run.llm.failed").unwrap();
    assert_eq!(failed.to_json()["reply"], "Sure! The category is billing.");
}

#[tokio::test]
async fn a_failed_reply_in_an_event_is_capped() {
    let long = format!("é{}", "x".repeat(fabric::llm::telemetry::MAX_EVENT_REPLY_BYTES));
    let stub = StubLlm::default().script("support-triage", "intake", &[long.as_str()]);
    let h = harness(shipped(), stub, vec![]);
    let (_, events) = run(&h, "support-triage", vec![]).await;
    let failed = events.iter().find(|e| e.kind.as_str() == "run.llm.failed").unwrap();
    let failed = failed.to_json();
    let reply = failed["reply"].as_str().unwrap();
    assert!(reply.len() <= fabric::llm::telemetry::MAX_EVENT_REPLY_BYTES + '…'.len_utf8(), "{}", reply.len());
    assert!(reply.starts_with("éxxx") && reply.ends_with("x…"), "cut at a character boundary, marked");
}

#[tokio::test]
async fn strict_stub_fails_loudly_on_extra_calls_and_reports_unused_replies() {
    // Extra call: the answer stage has no script line left (the script for it is empty).
    let stub = StubLlm::default().strict(true).script("support-triage", "intake", &[r#"{"category":"billing","urgency":"low"}"#]);
    let h = harness(shipped(), stub.clone(), vec![]);
    let (result, _) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.error().unwrap().reason_class, "stub_script_exhausted");
    // Unused replies: two scripted for intake, one used.
    let stub = shipped_stub().script("support-triage", "intake", &[r#"{"category":"billing","urgency":"low"}"#, r#"{"category":"other","urgency":"low"}"#]);
    let h = harness(shipped(), stub.clone(), vec![]);
    let (result, _) = run(&h, "support-triage", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(stub.unconsumed(&result.llm_calls), ["route `support-triage` stage `intake`: 1 of 2 scripted replies unused"]);
}

#[tokio::test]
async fn the_stub_fallback_is_deterministic() {
    let h = harness(shipped(), StubLlm::default(), vec![]);
    let (a, _) = run(&h, "support-triage", vec![]).await;
    let (b, _) = run(&h, "support-triage", vec![]).await;
    assert_eq!(a.status(), RunStatus::Completed);
    assert_eq!(a.slots, b.slots);
    let intake: Value = serde_json::from_str(&a.slots["intake"]).unwrap();
    assert!(["billing", "technical", "other"].contains(&intake["category"].as_str().unwrap()));
}

#[tokio::test]
async fn branches_follow_slot_values() {
    for (reply, taken) in [
        (r#"{"category":"billing","urgency":"high"}"#, "escalate"),
        (r#"{"category":"billing","urgency":"low"}"#, "billing_answer"),
        (r#"{"category":"technical","urgency":"low"}"#, "general_answer"),
    ] {
        let stub = StubLlm::default().script("ticket-router", "intake", &[reply]);
        let h = harness(shipped(), stub, vec![]);
        let (result, _) = run(&h, "ticket-router", vec![]).await;
        assert_eq!(result.status(), RunStatus::Completed);
        assert_eq!(result.slots.keys().collect::<Vec<_>>(), ["intake", taken], "{reply}");
    }
}

#[tokio::test]
async fn manifest_appends_synthesis_and_defaults_empty_prompts() {
    let h = harness(shipped(), shipped_stub(), vec![]);
    let (result, events) = run(&h, "refund-review", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(result.output(), Some("We refunded the duplicate charge of 19.90."));
    assert!(events.iter().any(|e| e.kind == "run.stage.started" && e.to_json()["kind"] == "appended_synthesis"));
    // A manifest stage with no role template gets the default system text at the call.
    let cat = Arc::new(catalogue::load(&fixtures().join("hydrate/routes"), &fixtures().join("hydrate/packs")));
    let h = harness(cat, StubLlm::default(), vec![]);
    let (result, _) = run(&h, "manifest-no-role-template", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed);
    let seen = h.seen.lock().unwrap();
    assert_eq!(seen[0].system, DEFAULT_SYSTEM_TEXT);
    assert_eq!(seen.last().unwrap().system, "HOST only.", "appended synthesis falls back to the host");
}

#[tokio::test]
async fn prefetch_packs_reach_every_user_message_and_pass_through() {
    let cat = Arc::new(catalogue::load(&fixtures().join("hydrate/routes"), &fixtures().join("hydrate/packs")));
    let h = harness(cat, StubLlm::default(), vec![]);
    let (result, _) = run(&h, "workflow-full", vec!["Refund policy: duplicates are refunded.".into(), "SLA:\n 5 days".into()]).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    // `fetch` is a `none` stage whose URL variable is unset: it passes the pack through.
    assert_eq!(result.slots["fetch"], r#"["Refund policy: duplicates are refunded.","SLA:\n 5 days"]"#);
    let seen = h.seen.lock().unwrap();
    assert!(seen[0].user.contains("\npacked chunks:\n- Refund policy: duplicates are refunded.\n- SLA: 5 days"), "{}", seen[0].user);
}

#[tokio::test]
async fn child_runs_carry_the_parent_run_id() {
    let cat = inline(
        "workflows:\n  parent:\n    stages:\n      - {id: pack, llm_role: none}\n      - {id: triage, llm_role: none, kind: agent, route: support-triage}\n      - {id: wrap, llm_role: synthesis, capability: answer_text}\nroutes:\n  parent: {model_profile: default, prompt_pack: support, workflow: parent}\n",
    );
    // The old spelling still loads, with a deprecation warning.
    assert!(cat.diagnostics().iter().any(|d| d.message.contains("`kind: agent` is deprecated: write `kind: child_run`")), "{:?}", cat.diagnostics());
    let h = harness(cat, shipped_stub(), vec![]);
    let (result, events) = run(&h, "parent", vec!["chunk one".into()]).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.slots["pack"], r#"["chunk one"]"#, "prefetch passthrough");
    assert_eq!(result.slots["triage"], "You were charged twice; the duplicate charge has been refunded.");
    let child: Vec<&Event> = events.iter().filter(|e| e.route_id.as_ref() == "support-triage").collect();
    assert!(!child.is_empty());
    assert!(child.iter().all(|e| e.parent_run_id.as_deref() == Some(result.run_id.as_str())));
    assert!(child[0].run_id.as_ref() != result.run_id);
}

#[tokio::test]
async fn fleets_refuse_foreign_routes_and_broken_routes_do_not_start() {
    let h = harness(shipped(), StubLlm::default(), vec![]);
    let runner = h.runner.with_fleet(Some("agent-runtime-shared".into()));
    let err = runner.run(RunRequest { route_id: "refund-review".into(), goal: goal(), prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap_err();
    assert!(matches!(err, StartError::WrongFleet { .. }), "{err}");
    assert_eq!(err.to_string(), "route `refund-review` is served by fleet `agent-runtime-custom`, but this runtime is fleet `agent-runtime-shared`");
    let err = runner.run(RunRequest { route_id: "nope".into(), goal: goal(), prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap_err();
    assert!(matches!(err, StartError::UnknownRoute { .. }));
}

/// A catalogue written inline, loaded with the shipped profiles, packs and support-triage.
fn inline(yaml: &str) -> Arc<Catalogue> {
    crate::support::catalogue_with(&["support-triage.yaml"], yaml)
}

#[tokio::test]
async fn loops_are_bounded_by_max_loop_steps() {
    let cat = inline(
        "workflows:\n  retry:\n    stages:\n      - id: check\n        llm_role: classify\n        capability: classify_ticket\n        branches:\n          - {when: {slot: check.urgency, equals: high}, goto: check}\n          - {goto: end}\nroutes:\n  retry: {model_profile: default, prompt_pack: support, workflow: retry, max_loop_steps: 3}\n",
    );
    let high = r#"{"category":"billing","urgency":"high"}"#;
    let h = harness(cat.clone(), StubLlm::default().script("retry", "check", &[high, high, high, high]), vec![]);
    let (result, _) = run(&h, "retry", vec![]).await;
    let err = result.error().unwrap();
    assert_eq!(err.reason_class, "loop_budget_exceeded");
    assert_eq!(h.seen.lock().unwrap().len(), 3);
    let h = harness(cat, StubLlm::default().script("retry", "check", &[high, r#"{"category":"billing","urgency":"low"}"#]), vec![]);
    let (result, _) = run(&h, "retry", vec![]).await;
    assert_eq!(result.status(), RunStatus::Completed);
}

#[tokio::test]
async fn no_matching_branch_fails_the_run() {
    let cat = inline(
        "workflows:\n  strict:\n    stages:\n      - id: intake\n        llm_role: classify\n        capability: classify_ticket\n        branches:\n          - {when: {slot: intake.category, in: [billing, technical]}, goto: answer}\n      - {id: answer, llm_role: synthesis, capability: answer_text}\nroutes:\n  strict: {model_profile: default, prompt_pack: support, workflow: strict}\n",
    );
    let h = harness(cat, StubLlm::default().script("strict", "intake", &[r#"{"category":"other","urgency":"low"}"#]), vec![]);
    let (result, events) = run(&h, "strict", vec![]).await;
    let err = result.error().unwrap();
    assert_eq!((err.reason_class.as_str(), err.stage_id.as_deref()), ("no_branch_matched", Some("intake")));
    assert_eq!(events.last().unwrap().kind, "run.failed");
}

/// The README's embedding example, with the stub.
#[tokio::test]
async fn embedding_the_runtime_as_the_readme_shows() {
    let settings = fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let runtime = fabric::runtime::Runtime::builder()
        .settings(settings)
        .catalogue_dirs(routes_dir(), packs_dir())
        .stub_dir(stub_dir())
        .tool("add", fabric::tools::builtin_add())
        .build()
        .unwrap();
    let outcome = runtime.run_goal("support-triage", goal()).await.unwrap();
    assert_eq!(outcome.result.output(), Some("You were charged twice; the duplicate charge has been refunded."));
    let outcome = runtime.run_goal("support-agent", goal()).await.unwrap();
    assert_eq!(outcome.result.output(), Some("12"));
    assert!(matches!(runtime.check_route("nope"), Err(StartError::UnknownRoute { .. })));
}
