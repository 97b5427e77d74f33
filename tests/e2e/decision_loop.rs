//! The decision loop (the autonomous mode): tools, failures, budget, ask, native decisions.

use std::sync::Arc;

use fabric::catalogue::{self, Catalogue};
use fabric::config::{ProviderKind, RetryPolicy, Tuning};
use fabric::events::{Event, MemorySink};
use fabric::exec::{RunRequest, RunResult, RunStatus, Runner, StartError};
use fabric::llm::providers::backend_for;
use fabric::llm::stub::StubLlm;
use fabric::tools::{FnTool, builtin_add};
use serde_json::{Map, Value, json};

use crate::support::{Canned, FakeProvider, kb_server, packs_dir, routes_dir, serve};

fn shipped() -> Arc<Catalogue> {
    Arc::new(catalogue::load(&routes_dir(), &packs_dir()))
}

async fn run_agent(script: &[&str], kb_url: Option<String>) -> (RunResult, Vec<Event>) {
    let stub = StubLlm::default().strict(true).script("support-agent", "decide", script);
    let llm = fabric::llm::stack::build(stub, RetryPolicy::default());
    let runner =
        Runner::new(shipped(), llm, Arc::new(move |k: &str| (k == "KB_SEARCH_URL").then(|| kb_url.clone()).flatten())).unwrap().with_tool("add", builtin_add());
    let sink = Arc::new(MemorySink::default());
    let goal = json!({"question": "Was I refunded?"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-agent".into(), goal, prefetch: vec![] }, sink.clone()).await.unwrap();
    (result, sink.events())
}

fn kinds(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| format!("{}{}", e.kind, e.stage_id.as_ref().map(|s| format!(":{s}")).unwrap_or_default())).collect()
}

#[tokio::test]
async fn tool_call_tool_call_done() {
    let kb = kb_server().await;
    let (result, events) =
        run_agent(&[r#"CALL kb_search {"q":"duplicate charge"}"#, r#"CALL add {"a":2,"b":3}"#, "DONE The duplicate charge was refunded."], Some(kb)).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.output(), Some("The duplicate charge was refunded."));
    assert_eq!(result.notes, [r#"kb_search: {"hits":[{"id":7,"title":"Refunds for duplicate charge"}]}"#, r#"add: {"sum":5}"#]);
    assert_eq!(
        kinds(&events),
        [
            "run.started",
            "run.stage.started:decide",
            "run.llm.started:decide",
            "run.llm.completed:decide",
            "run.stage.completed:decide",
            "run.stage.started:kb_search",
            "run.tool.started:kb_search",
            "run.tool.completed:kb_search",
            "run.stage.completed:kb_search",
            "run.stage.started:decide",
            "run.llm.started:decide",
            "run.llm.completed:decide",
            "run.stage.completed:decide",
            "run.stage.started:add",
            "run.tool.started:add",
            "run.tool.completed:add",
            "run.stage.completed:add",
            "run.stage.started:decide",
            "run.llm.started:decide",
            // The answer, as the decision is written (a tool call shows nothing).
            "run.llm.delta:decide",
            "run.llm.completed:decide",
            "run.stage.completed:decide",
            "run.completed",
        ]
    );
    assert_eq!(events[4].to_json()["output"], r#"{"action":"tool_call","tool_name":"kb_search","arguments":{"q":"duplicate charge"},"message":null}"#);
}

#[tokio::test]
async fn tool_errors_are_noted_and_the_loop_goes_on() {
    let kb = kb_server().await;
    let (result, events) = run_agent(&[r#"CALL kb_search {"q":"boom"}"#, r#"CALL add {"a":"two","b":3}"#, "DONE sorry"], Some(kb)).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(result.notes[0], "kb_search: error: tool_http_status: tool `kb_search`: HTTP 500: index offline");
    assert!(result.notes[1].starts_with("add: error: invalid_tool_arguments: arguments do not match the input schema: /a: "), "{}", result.notes[1]);
    // Arguments are checked before anything is sent: the in-process tool never ran.
    assert!(!events.iter().any(|e| e.kind == "run.tool.started" && e.stage_id.as_deref() == Some("add")));
    let failed: Vec<String> =
        events.iter().filter(|e| e.kind == "run.stage.failed").map(|e| e.to_json()["reason_class"].as_str().unwrap().to_owned()).collect();
    assert_eq!(failed, ["tool_http_status", "invalid_tool_arguments"]);
    // Without KB_SEARCH_URL the search tool is unavailable; also noted, not fatal.
    let (result, _) = run_agent(&[r#"CALL kb_search {"q":"x"}"#, "DONE no search"], None).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert!(result.notes[0].contains("is not configured"), "{}", result.notes[0]);
}

#[tokio::test]
async fn unknown_tools_fail_at_once() {
    let (result, events) = run_agent(&[r#"CALL delete_account {"id":1}"#], None).await;
    let err = result.error().unwrap();
    assert_eq!((err.reason_class.as_str(), err.stage_id.as_deref()), ("unknown_tool", Some("decide")));
    assert_eq!(
        kinds(&events),
        ["run.started", "run.stage.started:decide", "run.llm.started:decide", "run.llm.failed:decide", "run.stage.failed:decide", "run.failed:decide"]
    );
    assert!(!events.iter().any(|e| e.kind.as_str().starts_with("run.tool")));
}

#[tokio::test]
async fn malformed_call_lines_fail_the_run() {
    let (result, events) = run_agent(&["CALL add {\"a\": 2,"], None).await;
    assert_eq!(result.error().unwrap().reason_class, "invalid_decision");
    assert_eq!(events[3].to_json()["reason_class"], "invalid_decision");
}

#[tokio::test]
async fn the_budget_bounds_model_turns() {
    let calls: Vec<String> = (0..9).map(|i| format!(r#"CALL add {{"a":{i},"b":1}}"#)).collect();
    let script: Vec<&str> = calls.iter().map(String::as_str).collect();
    let (result, events) = run_agent(&script[..8], None).await;
    assert_eq!(result.status(), RunStatus::Failed);
    assert_eq!(result.output(), None, "no partial answer");
    assert_eq!(result.error().unwrap().reason_class, "loop_budget_exceeded");
    let failed = events.last().unwrap();
    assert_eq!(failed.kind, "run.failed");
    let failed = failed.to_json();
    let decisions = failed["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 8);
    assert_eq!(decisions[7]["arguments"], json!({"a": 7, "b": 1}));
    assert_eq!(events.iter().filter(|e| e.kind == "run.llm.started").count(), 8);
}

#[tokio::test]
async fn ask_ends_the_run_awaiting_the_user() {
    let (result, events) = run_agent(&["ASK Which order number was charged twice?"], None).await;
    assert_eq!(result.status(), RunStatus::AwaitingInput);
    assert_eq!(result.question(), Some("Which order number was charged twice?"));
    assert_eq!(events.last().unwrap().kind, "run.awaiting_input");
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json["status"], "awaiting_input");
    assert_eq!(json["question"], "Which order number was charged twice?");
}

#[tokio::test]
async fn in_process_tools_come_from_the_library_api() {
    let stub = StubLlm::default().script("support-agent", "decide", &[r#"CALL add {"a":1,"b":2}"#, "DONE ok"]);
    let tool = FnTool(|args: &Map<String, Value>| Ok(json!({"custom": args["a"].as_f64().unwrap() * 10.0})));
    let runner = Runner::new(shipped(), fabric::llm::stack::build(stub.clone(), RetryPolicy::default()), Arc::new(|_: &str| None))
        .unwrap()
        .with_tool("add", Arc::new(tool));
    let goal = json!({}).as_object().unwrap().clone();
    let result =
        runner.run(RunRequest { route_id: "support-agent".into(), goal: goal.clone(), prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    assert_eq!(result.notes, [r#"add: {"custom":10.0}"#]);
    // Without a registration the route cannot start.
    let bare = Runner::new(shipped(), fabric::llm::stack::build(stub, RetryPolicy::default()), Arc::new(|_: &str| None)).unwrap();
    let err = bare.run(RunRequest { route_id: "support-agent".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap_err();
    assert!(matches!(err, StartError::ToolNotRegistered { ref tool, .. } if tool == "add"), "{err}");
}

#[tokio::test]
async fn a_decision_the_stub_cannot_read_is_shown_in_its_failed_event() {
    let (result, events) = run_agent(&["MAYBE later"], None).await;
    assert_eq!(result.status(), RunStatus::Failed);
    let failed = events.iter().find(|e| e.kind.as_str() == "run.llm.failed").unwrap();
    assert_eq!(failed.to_json()["reply"], "MAYBE later", "{:?}", failed.data);
}

/// An in-process tool that never answers.
struct Hangs;

impl fabric::tools::Tool for Hangs {
    fn call<'a>(&'a self, _: &'a Map<String, Value>) -> fabric::failure::BoxFuture<'a, Result<Value, fabric::tools::ToolFailure>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn an_in_process_tool_that_never_answers_times_out_and_the_loop_goes_on() {
    let stub = StubLlm::default().strict(true).script("support-agent", "decide", &[r#"CALL add {"a":1,"b":2}"#, "DONE without the sum"]);
    let runner = Runner::new(shipped(), fabric::llm::stack::build(stub, RetryPolicy::default()), Arc::new(|_: &str| None))
        .unwrap()
        .with_tool("add", Arc::new(Hangs))
        .with_tool_timeout(std::time::Duration::from_millis(50));
    let sink = Arc::new(MemorySink::default());
    let goal = json!({}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-agent".into(), goal, prefetch: vec![] }, sink.clone()).await.unwrap();
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.output(), Some("without the sum"));
    assert_eq!(result.notes, ["add: error: tool_timeout: tool `add`: no result within 50 ms"]);
    let failed: Vec<_> = sink.events().into_iter().filter(|e| e.kind.as_str() == "run.tool.failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].to_json()["reason_class"], "tool_timeout", "{:?}", failed[0]);
}

#[tokio::test]
async fn live_providers_decide_with_native_structured_output() {
    let f = FakeProvider::new(|_| {
        Canned::json(200, json!({"choices": [{"message": {"content": "{\"action\":\"done\",\"message\":\"All done.\"}"}, "finish_reason": "stop"}]}))
    });
    f.push(Canned::json(200, json!({"choices": [{"message": {"content": "{\"action\":\"tool_call\",\"tool_name\":\"add\",\"arguments\":{\"a\":2,\"b\":3}}"}, "finish_reason": "stop"}]})));
    let url = f.start().await;
    let target = crate::support::target(ProviderKind::OpenAi, &url, "gpt-test");
    let llm = fabric::llm::stack::build(
        backend_for(fabric::llm::providers::shared_client().unwrap(), target, Tuning::default(), fabric::llm::providers::DEFAULT_MAX_REPLY_BYTES),
        RetryPolicy::default(),
    );
    let runner = Runner::new(shipped(), llm, Arc::new(|_: &str| None)).unwrap().with_tool("add", builtin_add());
    let goal = json!({"question": "2+3?"}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "support-agent".into(), goal, prefetch: vec![] }, Arc::new(MemorySink::default())).await.unwrap();
    assert_eq!(result.output(), Some("All done."));
    assert_eq!(result.notes, [r#"add: {"sum":5}"#]);
    let body = &f.requests()[0].body;
    let schema = &body["response_format"]["json_schema"];
    assert_eq!(schema["name"], "decide");
    assert_eq!(schema["strict"], false);
    assert_eq!(schema["schema"]["properties"]["tool_name"]["enum"], json!(["kb_search", "add"]));
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("Never promise a refund")
            && system.contains(r#"- add: Add two numbers."#)
            && system.contains(r#"input schema: {"type":"object","properties":{"a""#),
        "{system}"
    );
    // The second turn sees the tool result as a prior stage output.
    assert!(f.requests()[1].body["messages"][1]["content"].as_str().unwrap().ends_with("prior stage outputs:\n- add: {\"sum\":5}"));
}

#[tokio::test]
async fn hostile_arguments_stay_in_the_query_string() {
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(uri.to_string());
            axum::Json(json!({"hits": []}))
        }
    });
    let url = serve(app).await;
    let hostile = r#"CALL kb_search {"q":"x&admin=1/../../etc?#@evil.example:80/"}"#;
    let (result, _) = run_agent(&[hostile, "DONE ok"], Some(url)).await;
    assert_eq!(result.status(), RunStatus::Completed);
    let uris = seen.lock().unwrap().clone();
    assert_eq!(uris.len(), 1);
    assert!(uris[0].starts_with("/search?q="), "{}", uris[0]);
    assert!(!uris[0].contains("&admin=") && !uris[0].contains('#'), "encoded: {}", uris[0]);
}

#[tokio::test]
async fn the_step_budget_is_carried_into_child_runs() {
    let cat = crate::support::catalogue_with(
        &["support-triage.yaml", "support-agent.yaml"],
        "workflows:\n  parent:\n    stages:\n      - {id: agent, llm_role: none, kind: child_run, route: support-agent}\nroutes:\n  parent: {model_profile: default, prompt_pack: support, workflow: parent, max_loop_steps: 2}\n",
    );
    let stub = StubLlm::default().script("support-agent", "decide", &[r#"CALL add {"a":1,"b":1}"#, r#"CALL add {"a":1,"b":1}"#, "DONE 2"]);
    let runner = Runner::new(cat, fabric::llm::stack::build(stub, RetryPolicy::default()), Arc::new(|_: &str| None)).unwrap().with_tool("add", builtin_add());
    let sink = Arc::new(MemorySink::default());
    let goal = json!({}).as_object().unwrap().clone();
    let result = runner.run(RunRequest { route_id: "parent".into(), goal, prefetch: vec![] }, sink.clone()).await.unwrap();
    let err = result.error().unwrap();
    assert_eq!(err.reason_class, "child_run_failed");
    assert!(err.message.contains("loop_budget_exceeded: no answer after max_loop_steps (2) model turns"), "{}", err.message);
    assert_eq!(sink.events().iter().filter(|e| e.kind == "run.llm.started").count(), 2);
}
