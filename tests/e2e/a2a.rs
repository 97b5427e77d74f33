//! Routes as A2A agents (issue 52) on a real `fabric serve`, driven by the official A2A Python SDK
//! (PyPI `a2a-sdk`, pinned, in a venv of its own; the driver is `tests/fixtures/a2a/client.py`):
//! the cards, a send (blocking and streamed, the model's text as artifact updates), an idempotent
//! repeat, get with history, list, an `input-required` round trip, cancel; a resubscribe after
//! `kill -9` of the replica the stream came from, to the other replica, with no event lost or
//! repeated (SQLite and PostgreSQL); bad input answered with the protocol's error codes (raw
//! JSON-RPC over a real socket, the server serving on). The TCK runs in `a2a_tck`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::service::{Server, TOKEN, client};
use crate::support::repo;

/// The SDK's version the tests pin.
const A2A_SDK: &str = "a2a-sdk==1.3.0";

/// The Python of a venv with the A2A SDK (`support::python_venv`).
pub(crate) fn a2a_python() -> Option<PathBuf> {
    let ready = "import importlib.metadata as m, sys; sys.exit(m.version('a2a-sdk') != '1.3.0')";
    crate::support::python_venv("a2a-venv", A2A_SDK, ready, "the A2A tests drive /a2a with the official A2A Python SDK")
}

/// One run of the driver with `steps`: each step's result.
pub(crate) async fn drive(python: &Path, steps: Value) -> Vec<Value> {
    let spec = json!({"token": TOKEN, "steps": steps}).to_string() + "\n";
    let (python, script) = (python.to_owned(), repo().join("tests/fixtures/a2a/client.py"));
    let out = tokio::task::spawn_blocking(move || crate::support::run_python(&python, &script, &spec)).await.unwrap();
    assert!(out.status.success(), "the A2A client failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["steps"].as_array().unwrap().clone()
}

pub(crate) fn agent(s: &Server, route: &str) -> String {
    format!("{}/a2a/{route}", s.url)
}

/// The states of a step's stream responses, in order.
fn states(events: &Value) -> Vec<String> {
    let events = events.as_array().unwrap();
    events.iter().filter_map(|e| e.get("statusUpdate").or(e.get("task")).map(|u| u["status"]["state"].as_str().unwrap().to_owned())).collect()
}

/// The text of a stream's `text:` artifact updates (replaced where one does not append).
fn streamed_text(events: &Value) -> String {
    let mut text = String::new();
    for a in events.as_array().unwrap().iter().filter_map(|e| e.get("artifactUpdate")) {
        if a["artifact"]["artifactId"].as_str().unwrap().starts_with("text:answer") {
            if a["append"] != true {
                text.clear();
            }
            text.push_str(a["artifact"]["parts"][0]["text"].as_str().unwrap_or_default());
        }
    }
    text
}

#[tokio::test]
async fn the_sdk_discovers_sends_streams_gets_and_lists() {
    let Some(python) = a2a_python() else { return };
    let (server, _dir, _stub) = crate::mcp_server::serve(&[]);
    let triage = agent(&server, "support-triage");
    let steps = drive(
        &python,
        json!([
            {"op": "card", "url": server.url},
            {"op": "card", "url": triage},
            {"op": "send", "url": triage, "text": "I was charged twice", "message_id": "a2a-1", "streaming": false},
            {"op": "send", "url": triage, "text": "I was charged twice", "message_id": "a2a-1", "streaming": false},
            {"op": "send", "url": triage, "text": "I was charged twice", "message_id": "a2a-2"},
            {"op": "get", "url": triage, "task_id": "$2"},
            {"op": "get", "url": triage, "task_id": "$2", "history_length": 1},
            {"op": "list", "url": triage},
            {"op": "send", "url": agent(&server, "order-status"), "data": {"order_id": 42}, "message_id": "a2a-3", "streaming": false},
        ]),
    )
    .await;
    let fleet = &steps[0]["card"];
    let skills: Vec<&str> = fleet["skills"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    for route in ["support-triage", "support-agent", "order-status"] {
        assert!(skills.contains(&route), "{route} is a skill: {fleet}");
    }
    assert_eq!(fleet["capabilities"]["streaming"], true, "{fleet}");
    assert!(fleet["securitySchemes"]["bearer"].is_object(), "the bearer scheme: {fleet}");
    let card = &steps[1]["card"];
    assert_eq!(card["supportedInterfaces"][0]["url"], triage.as_str(), "{card}");
    assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0", "{card}");
    // A blocking send answers the task once it completed, its output the artifact.
    let task = &steps[2]["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert!(task["artifacts"][0]["parts"][0]["text"].as_str().unwrap().contains("charged twice"), "{task}");
    // The same messageId again: the same task, no second run.
    assert_eq!(steps[3]["task_id"], steps[2]["task_id"], "{:?}", steps[3]);
    // Streamed: submitted, working ..., completed; the model's text as artifact updates is the output.
    let streamed = &steps[4]["events"];
    let states = states(streamed);
    assert_eq!(states.first().map(String::as_str), Some("TASK_STATE_SUBMITTED"), "{states:?}");
    assert_eq!(states.last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "{states:?}");
    let output = streamed.as_array().unwrap().iter().find_map(|e| e["artifactUpdate"]["artifact"].as_object().filter(|a| a["artifactId"] == "output")).unwrap();
    assert!(streamed_text(streamed).contains(output["parts"][0]["text"].as_str().unwrap()), "the model's reply, as written: {streamed}");
    // Get: with its history (the goal, the output); cut to the last message.
    let got = &steps[5]["task"];
    assert_eq!(got["history"][0]["parts"][0]["data"], json!({"message": "I was charged twice"}), "{got}");
    assert_eq!(got["history"].as_array().unwrap().len(), 2, "{got}");
    assert_eq!(steps[6]["task"]["history"].as_array().unwrap().len(), 1, "{:?}", steps[6]);
    let listed: Vec<&str> = steps[7]["list"]["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(listed.len(), 2, "two tasks of support-triage: {listed:?}");
    // A data part is the goal, checked against the route's goal schema.
    assert_eq!(steps[8]["events"][0]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{:?}", steps[8]);
    // Every task is a run.
    let run = crate::service::get(&server, &format!("/v1/runs/{}", steps[2]["task_id"].as_str().unwrap())).await;
    assert_eq!(run["status"], "completed", "{run}");
}

#[tokio::test]
async fn an_input_required_task_is_answered_by_the_next_message_and_another_is_cancelled() {
    let Some(python) = a2a_python() else { return };
    let (server, _dir, _stub) = crate::mcp_server::serve(&[]);
    let support = agent(&server, "support-agent");
    let steps = drive(
        &python,
        json!([
            {"op": "send", "url": support, "text": "Where is my refund?", "message_id": "ask-1"},
            {"op": "send", "url": support, "text": "Order 42", "message_id": "ask-1-reply", "task_id": "$0"},
            {"op": "get", "url": support, "task_id": "$0"},
            {"op": "send", "url": support, "text": "Another refund?", "message_id": "ask-2", "streaming": false},
            {"op": "cancel", "url": support, "task_id": "$3"},
            {"op": "cancel", "url": support, "task_id": "$0"},
            {"op": "send", "url": support, "text": "too late", "message_id": "ask-2-late", "task_id": "$3"},
            {"op": "get", "url": agent(&server, "support-triage"), "task_id": "$0"},
        ]),
    )
    .await;
    let asked = &steps[0]["events"];
    let last = asked.as_array().unwrap().last().unwrap();
    assert_eq!(last["statusUpdate"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asked}");
    assert!(!last["statusUpdate"]["status"]["message"]["parts"][0]["text"].as_str().unwrap().is_empty(), "the question: {last}");
    // The reply continues the same task to its end.
    let answered = &steps[1]["events"];
    assert_eq!(steps[1]["task_id"], steps[0]["task_id"], "{answered}");
    assert_eq!(states(answered).last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "{answered}");
    let history: Vec<&str> = steps[2]["task"]["history"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(history, ["ROLE_USER", "ROLE_AGENT", "ROLE_USER", "ROLE_AGENT"], "goal, question, reply, output: {:?}", steps[2]);
    // Asking, then cancelled: at once.
    assert_eq!(steps[3]["events"][0]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{:?}", steps[3]);
    assert_eq!(steps[4]["task"]["status"]["state"], "TASK_STATE_CANCELED", "{:?}", steps[4]);
    let run = crate::service::get(&server, &format!("/v1/runs/{}", steps[3]["task_id"].as_str().unwrap())).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    // A completed task cannot be cancelled; a canceled one takes no message; another route's task is not found.
    assert!(steps[5]["error"].as_str().unwrap().contains("-32002") || steps[5]["error"].as_str().unwrap().contains("ancel"), "{:?}", steps[5]);
    assert!(steps[6]["error"].is_string(), "{:?}", steps[6]);
    assert!(steps[7]["error"].is_string(), "{:?}", steps[7]);
}

/// One raw JSON-RPC call: the HTTP status and the body.
pub(crate) async fn rpc(server: &Server, route: &str, body: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = client().post(agent(server, route)).header("content-type", "application/json").body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn send(message: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message}}).to_string()
}

#[tokio::test]
async fn bad_input_is_answered_with_the_protocols_error_codes() {
    let (server, _dir, _stub) = crate::mcp_server::serve(&[]);
    let code = |v: &Value| v["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {v}"));
    let (_, done) = rpc(&server, "support-triage", &send(json!({"messageId": "ok-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]})), Some(TOKEN)).await;
    let task_id = done["result"]["task"]["id"].as_str().unwrap().to_owned();
    let huge = "x".repeat(300 * 1024);
    let cases: Vec<(&str, String, i64)> = vec![
        ("not JSON", "{nope".into(), -32700),
        ("a batch", json!([{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}]).to_string(), -32600),
        ("no jsonrpc", json!({"id": 1, "method": "GetTask"}).to_string(), -32600),
        ("an unknown method", json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/explode"}).to_string(), -32601),
        ("params not an object", json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": [1]}).to_string(), -32602),
        ("no message", json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}).to_string(), -32602),
        ("no parts", send(json!({"messageId": "e-1", "role": "ROLE_USER", "parts": []})), -32602),
        ("no role", send(json!({"messageId": "e-5", "parts": [{"text": "x"}]})), -32602),
        ("a file part only", send(json!({"messageId": "e-2", "role": "ROLE_USER", "parts": [{"url": "https://example.com/a.pdf"}]})), -32005),
        ("a huge part", send(json!({"messageId": "e-3", "role": "ROLE_USER", "parts": [{"text": huge}]})), -32602),
        ("a task of another route", json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}).to_string(), -32001),
        ("no such task", json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}).to_string(), -32001),
        ("a push config without its task", json!({"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig", "params": {}}).to_string(), -32602),
    ];
    for (what, body, expected) in cases {
        let (status, answer) = rpc(&server, "support-agent", &body, Some(TOKEN)).await;
        assert_eq!((status, code(&answer)), (200, expected), "{what}: {answer}");
    }
    // A goal that does not fit the route's schema: invalid params, located.
    let (_, bad) =
        rpc(&server, "order-status", &send(json!({"messageId": "e-4", "role": "ROLE_USER", "parts": [{"data": {"order_id": "forty-two"}}]})), Some(TOKEN))
            .await;
    assert_eq!(code(&bad), -32602, "{bad}");
    assert!(bad["error"]["data"]["problems"][0].as_str().unwrap().contains("/order_id"), "the JSON path: {bad}");
    // A body over the service's limit: an invalid request, its 413 kept.
    let (status, too_big) =
        rpc(&server, "support-agent", &send(json!({"messageId": "e-6", "role": "ROLE_USER", "parts": [{"text": "y".repeat(2 << 20)}]})), Some(TOKEN)).await;
    assert_eq!((status, code(&too_big)), (413, -32600), "{too_big}");
    // A messageId longer than a key may be is still one start (its SHA-256 is the key).
    let long = send(json!({"messageId": "m".repeat(300), "role": "ROLE_USER", "parts": [{"text": "hi"}]}));
    let (_, first) = rpc(&server, "support-triage", &long, Some(TOKEN)).await;
    let (_, second) = rpc(&server, "support-triage", &long, Some(TOKEN)).await;
    assert_eq!(first["result"]["task"]["id"], second["result"]["task"]["id"], "{first} {second}");
    assert!(first["result"]["task"]["id"].is_string(), "{first}");
    // A streaming method's error is a stream of that one error response.
    let r = client()
        .post(agent(&server, "support-agent"))
        .bearer_auth(TOKEN)
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": "nope"}}).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let (_, _, data) = crate::service::sse_block(&format!("id: 0\n{}", r.text().await.unwrap()));
    assert_eq!(code(&data), -32001, "{data}");
    // An unknown A2A-Version.
    let r = client()
        .post(agent(&server, "support-agent"))
        .bearer_auth(TOKEN)
        .header("a2a-version", "9.1")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(code(&r.json().await.unwrap()), -32009);
    // The older names answer in 0.3's shapes.
    let (_, old) =
        rpc(&server, "support-triage", &json!({"jsonrpc": "2.0", "id": "x", "method": "tasks/get", "params": {"id": task_id}}).to_string(), Some(TOKEN)).await;
    assert_eq!(
        (old["id"].as_str(), old["result"]["kind"].as_str(), old["result"]["status"]["state"].as_str()),
        (Some("x"), Some("task"), Some("completed")),
        "{old}"
    );
    // No token: 401; no such route: 404; and the server serves on.
    assert_eq!(rpc(&server, "support-agent", &send(json!({})), None).await.0, 401);
    assert_eq!(rpc(&server, "no-such-route", &send(json!({})), Some(TOKEN)).await.0, 404);
    let (_, again) = rpc(&server, "support-triage", &send(json!({"messageId": "ok-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]})), Some(TOKEN)).await;
    assert_eq!(again["result"]["task"]["id"].as_str(), Some(task_id.as_str()), "{again}");
}

#[tokio::test]
async fn a_resubscribe_after_kill_9_of_the_streaming_replica_loses_and_repeats_nothing_on_sqlite() {
    resubscribe_after_kill("sqlite").await;
}

#[tokio::test]
async fn a_resubscribe_after_kill_9_of_the_streaming_replica_loses_and_repeats_nothing_on_postgres() {
    resubscribe_after_kill("postgres").await;
}

async fn resubscribe_after_kill(kind: &str) {
    let Some(python) = a2a_python() else { return };
    let Some((first, survivor, _dir, _stub)) = crate::stream_fleet::killable_pair(kind).await else { return };
    let spec = json!({"token": TOKEN, "steps": [{"op": "kill_resubscribe", "url": agent(&first, "support-triage"), "url2": agent(&survivor, "support-triage"),
        "data": {"ticket": "charged twice, killed"}, "message_id": format!("kill-{kind}")}]});
    let script = repo().join("tests/fixtures/a2a/client.py");
    let pid = first.child.id();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python).arg(script).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{spec}").unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut report = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line.contains("\"kill\"") {
                Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
                writeln!(stdin, "go").unwrap();
            } else {
                report = line;
            }
        }
        let status = child.wait_with_output().unwrap();
        (report, String::from_utf8_lossy(&status.stderr).into_owned())
    })
    .await
    .unwrap();
    let report: Value = serde_json::from_str(&out.0).unwrap_or_else(|e| panic!("{kind}: no report ({e}): {}", out.1));
    let step = &report["steps"][0];
    assert!(step["error"].is_null(), "{kind}: {step}");
    assert!(step["broke"].is_string(), "{kind}: the stream from the killed replica broke: {step}");
    // Each update once: one frame per event, two for `run.completed` (its artifact, its status).
    let frames: Vec<(u64, String)> = step["before"]
        .as_array()
        .unwrap()
        .iter()
        .chain(step["after"].as_array().unwrap())
        .filter_map(|e| e.get("statusUpdate").or(e.get("artifactUpdate")))
        .map(|u| (u["metadata"]["fabric"]["seq"].as_f64().unwrap() as u64, u["metadata"]["fabric"]["event"].as_str().unwrap().to_owned()))
        .collect();
    let mut seen: Vec<u64> = frames.iter().map(|f| f.0).collect();
    seen.dedup();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{kind}: in order, none twice: {frames:?}");
    for s in &seen {
        let of: Vec<&String> = frames.iter().filter(|f| f.0 == *s).map(|f| &f.1).collect();
        assert_eq!(of.len(), if of[0] == "run.completed" { 2 } else { 1 }, "{kind}: event {s} once: {frames:?}");
    }
    // Every event of the record an A2A update shows, each once (the record read after the end).
    let id = step["task_id"].as_str().unwrap();
    let view = crate::service::settled(&survivor, id).await;
    assert_eq!(view["status"], "completed", "{kind}: {view}");
    let shown = ["run.started", "run.resumed", "run.stage.started", "run.stage.completed", "run.llm.delta", "run.llm.restarted", "run.completed"];
    let record: Vec<u64> =
        crate::service::sse(&survivor, id, None).await.into_iter().filter(|(_, k, _)| shown.contains(&k.as_str())).map(|(s, _, _)| s).collect();
    assert_eq!(seen, record, "{kind}: every update of the record, none lost");
    let after = step["after"].as_array().unwrap();
    assert_eq!(states(&Value::Array(after.clone())).last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "{kind}: {step}");
    // The text a client keeps (each artifact update that does not append replaces it: the new
    // holder's call starts again) is the answer's reply, whole.
    let all: Vec<Value> = step["before"].as_array().unwrap().iter().chain(after).cloned().collect();
    let output = view["output"].as_str().unwrap();
    assert!(streamed_text(&Value::Array(all)).contains(output), "{kind}: the kept text holds the output {output:?}: {step}");
}
