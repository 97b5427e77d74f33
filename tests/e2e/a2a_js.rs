//! The official A2A JavaScript SDK (npm `@a2a-js/sdk`, pinned with its lock file in
//! `tests/fixtures/a2a-js`, installed with `npm ci`) as a client of a real `fabric serve`: it
//! discovers the fleet's card and a route's, streams a message until the task asks, answers it
//! with a message carrying the task's id, reads the task back with its history, cancels a task
//! that waits for its user, and gets the protocol's error (as the SDK's typed error) for a
//! message to an ended task. The Python SDK's side is `a2a`.

use serde_json::Value;

use crate::service::TOKEN;

#[tokio::test]
async fn the_javascript_sdk_discovers_streams_answers_gets_and_cancels() {
    let why = "the official A2A JavaScript SDK calls the routes over /a2a";
    let Some(dir) = tokio::task::spawn_blocking(move || crate::support::npm_clients("a2a-js", why)).await.unwrap() else { return };
    let (server, _db, _stub) = crate::mcp_server::serve(&[]);
    let out = tokio::process::Command::new("node").arg("client.mjs").args([server.url.as_str(), TOKEN]).current_dir(&dir).output().await.unwrap();
    assert!(out.status.success(), "node: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(report["error"].is_null(), "{report}");
    let skills: Vec<&str> = report["skills"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(skills.contains(&"support-agent"), "{report}");
    // The stream: the task first, working while it runs, and it ends asking.
    let asked = report["asked"].as_array().unwrap();
    assert_eq!((asked[0]["kind"].as_str(), asked[0]["state"].as_str()), (Some("task"), Some("TASK_STATE_SUBMITTED")), "{report}");
    assert_eq!(asked.last().unwrap()["state"], "TASK_STATE_INPUT_REQUIRED", "{report}");
    assert!(asked.iter().any(|e| e["kind"] == "artifactUpdate"), "the model's text as it is written: {report}");
    // Answered by a message with the task's id: it completed; its history is goal, question, reply, output.
    assert_eq!(report["answered"], "TASK_STATE_COMPLETED", "{report}");
    assert_eq!(report["task"]["history"], serde_json::json!(["ROLE_USER", "ROLE_AGENT", "ROLE_USER", "ROLE_AGENT"]), "{report}");
    assert_eq!(report["task"]["output"][0][0], "Order 42 is refunded.", "{report}");
    assert_eq!(report["cancelled"], "TASK_STATE_CANCELED", "{report}");
    assert_eq!(report["late"]["name"], "JsonRpcUnsupportedOperationError", "-32004 as the SDK's typed error: {report}");
}
