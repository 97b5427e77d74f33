//! A2A push notification configs (issue 52) on a real `fabric serve`, SQLite and PostgreSQL: the
//! official A2A Python SDK (`a2a-sdk` 1.3.0) sets, gets, lists and deletes a task's configs; a
//! receiver on loopback gets the task's `input-required`, `working` and completion as A2A
//! bodies, with the config's token and `Authorization`, each verified by the Standard Webhooks
//! reference library; a config outlives the replica that took it (`kill -9`). Raw JSON-RPC:
//! another route's task, an origin not allowed, credentials in a URL, an unknown config; 0.3's
//! method names in 0.3's shapes, a 0.3 send's config delivered in 0.3's body.

use std::time::Duration;

use serde_json::{Value, json};

use crate::a2a::{a2a_python, agent, drive, rpc};
use crate::service::{Server, TOKEN, asking_stub};
use crate::support::{fixtures, routes_dir};
use crate::webhooks::{Got, Receiver, SECRET, reference_python, verified};

/// A replica over a store of `kind` that posts to `hooks` (its allowed origin), `extra` besides.
async fn serve_on(kind: &str, hooks: &str, extra: &[(&str, &str)]) -> Option<(Server, tempfile::TempDir, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::durable::store_url(kind, &dir).await?;
    let stub = asking_stub();
    let catalogue = format!("{}:{}", routes_dir().display(), fixtures().join("mcp/routes").display());
    let mut env = vec![
        ("FABRIC_CATALOGUE_DIR", catalogue.as_str()),
        ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", hooks),
        ("FABRIC_WEBHOOK_SECRET", SECRET),
        ("FABRIC_WEBHOOK_BACKOFF_BASE_S", "1"),
        ("FABRIC_WEBHOOK_BACKOFF_MAX_S", "2"),
    ];
    env.extend_from_slice(extra);
    Some((Server::start(&store, stub.path(), &env), dir, stub))
}

/// The deliveries that carry `token`.
fn with_token<'a>(got: &'a [Got], token: &str) -> Vec<&'a Got> {
    got.iter().filter(|g| g.headers.get("x-a2a-notification-token").map(String::as_str) == Some(token)).collect()
}

/// A body's task state (a status update's, or a task's).
fn state_of(body: &Value) -> String {
    let status = body.get("statusUpdate").or(body.get("task")).map_or(&body["status"], |u| &u["status"]);
    status["state"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `done(got)`, at most 30 s.
async fn until(receiver: &Receiver, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = receiver.wait_for(0, Duration::ZERO).await;
        if done(&got) || std::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_sdk_manages_configs_and_the_receiver_gets_the_question_and_the_end_on_sqlite() {
    sdk_configs_and_deliveries("sqlite").await;
}

#[tokio::test]
async fn the_sdk_manages_configs_and_the_receiver_gets_the_question_and_the_end_on_postgres() {
    sdk_configs_and_deliveries("postgres").await;
}

async fn sdk_configs_and_deliveries(kind: &str) {
    let (Some(python), Some(reference)) = (a2a_python(), reference_python()) else { return };
    let receiver = Receiver::default();
    let hooks = receiver.start().await;
    let Some((server, _dir, _stub)) = serve_on(kind, &hooks, &[("FABRIC_LLM_STUB_LATENCY_MS", "2500")]).await else { return };
    let support = agent(&server, "support-agent");
    let steps = drive(
        &python,
        json!([
            {"op": "send", "url": support, "text": "Where is my refund?", "message_id": format!("push-{kind}"), "streaming": false, "return_immediately": true},
            {"op": "push_create", "url": support, "task_id": "$0", "config": {"id": "cfg-1", "url": format!("{hooks}/one"), "token": "tok-1", "scheme": "Bearer", "credentials": "cred-1"}},
            {"op": "push_create", "url": support, "task_id": "$0", "config": {"url": format!("{hooks}/two"), "token": "tok-2"}},
            {"op": "push_get", "url": support, "task_id": "$0", "id": "cfg-1"},
            {"op": "push_list", "url": support, "task_id": "$0"},
            {"op": "push_delete", "url": support, "task_id": "$0", "id": "$2"},
            {"op": "push_list", "url": support, "task_id": "$0"},
        ]),
    )
    .await;
    for s in &steps {
        assert!(s["error"].is_null(), "{kind}: {steps:?}");
    }
    let task_id = steps[0]["task_id"].as_str().unwrap().to_owned();
    let made = &steps[1]["config"];
    assert_eq!(
        (made["id"].as_str(), made["taskId"].as_str(), made["token"].as_str(), made["authentication"]["scheme"].as_str()),
        (Some("cfg-1"), Some(task_id.as_str()), Some("tok-1"), Some("Bearer")),
        "{kind}: {made}"
    );
    let generated = steps[2]["config"]["id"].as_str().unwrap();
    assert!(!generated.is_empty() && generated != "cfg-1", "{kind}: an id of its own: {:?}", steps[2]);
    assert_eq!(steps[3]["config"]["url"], format!("{hooks}/one"), "{kind}: {:?}", steps[3]);
    assert_eq!(steps[4]["list"]["configs"].as_array().unwrap().len(), 2, "{kind}: {:?}", steps[4]);
    let left: Vec<&str> = steps[6]["list"]["configs"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(left, ["cfg-1"], "{kind}: the deleted config is gone: {:?}", steps[6]);
    // The question reaches the config's URL as a status update, with its token and credentials.
    let got = until(&receiver, |g| with_token(g, "tok-1").iter().any(|d| d.body.contains("INPUT_REQUIRED"))).await;
    let asked = with_token(&got, "tok-1");
    assert!(!asked.is_empty(), "{kind}: no delivery: {got:?}\n{}", server.logs());
    assert_eq!(asked[0].headers.get("authorization").map(String::as_str), Some("Bearer cred-1"), "{kind}: {:?}", asked[0]);
    // The reply, then the end.
    let reply = drive(
        &python,
        json!([{"op": "send", "url": support, "text": "Order 42", "message_id": format!("push-{kind}-reply"), "task_id": task_id, "streaming": false}]),
    )
    .await;
    assert!(reply[0]["error"].is_null(), "{kind}: {reply:?}");
    let got = until(&receiver, |g| with_token(g, "tok-1").iter().any(|d| d.body.contains("TASK_STATE_COMPLETED"))).await;
    let mine: Vec<Got> = with_token(&got, "tok-1").into_iter().cloned().collect();
    let bodies = verified(&reference, &mine);
    let states: Vec<String> = bodies.iter().map(state_of).collect();
    for state in ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"] {
        assert!(states.iter().any(|s| s == state), "{kind}: {state} delivered: {states:?}");
    }
    let question = bodies.iter().find(|b| state_of(b) == "TASK_STATE_INPUT_REQUIRED").unwrap();
    assert_eq!(question["statusUpdate"]["taskId"], task_id.as_str(), "{kind}: {question}");
    assert!(question["statusUpdate"]["status"]["message"]["parts"][0]["text"].is_string(), "{kind}: the question: {question}");
    let end = bodies.iter().find(|b| state_of(b) == "TASK_STATE_COMPLETED").unwrap();
    assert_eq!(end["task"]["id"], task_id.as_str(), "{kind}: {end}");
    assert!(end["task"]["artifacts"][0]["parts"].is_array(), "{kind}: the output: {end}");
    assert!(with_token(&got, "tok-2").is_empty(), "{kind}: nothing for the deleted config: {got:?}");
    // The secrets are nowhere else: not in the run's events, its deliveries' list or the logs.
    let events = crate::service::sse(&server, &task_id, None).await;
    let listed = crate::service::get(&server, &format!("/v1/runs/{task_id}/webhooks")).await;
    let pushed: Vec<&Value> = listed["webhooks"].as_array().unwrap().iter().filter(|w| w["a2a_push_config"] == "cfg-1").collect();
    assert!(pushed.len() >= 3 && pushed.iter().any(|w| w["type"] == "run.awaiting_input"), "{kind}: the config's deliveries listed: {listed}");
    let seen = format!("{events:?}{listed}{}", server.logs());
    for secret in ["tok-1", "cred-1", "tok-2"] {
        assert!(!seen.contains(secret), "{kind}: {secret} shown: {seen}");
    }
}

/// One JSON-RPC call's answer on `route`.
async fn call(server: &Server, route: &str, method: &str, params: Value) -> Value {
    rpc(server, route, &json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(), Some(TOKEN)).await.1
}

#[tokio::test]
async fn configs_are_refused_for_other_routes_tasks_and_origins_not_allowed_and_0_3_names_use_0_3_shapes() {
    let receiver = Receiver::default();
    let hooks = receiver.start().await;
    let Some((server, _dir, _stub)) = serve_on("sqlite", &hooks, &[]).await else { return };
    let message = |id: &str, text: &str| json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]});
    let done = call(&server, "support-triage", "SendMessage", json!({"message": message("p-1", "hi")})).await;
    let task = done["result"]["task"]["id"].as_str().unwrap().to_owned();
    let code = |v: &Value| v["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {v}"));
    let create = |task: &str, url: String| json!({"taskId": task, "id": "c", "url": url});
    let cases = [
        ("another route's task", "support-agent", create(&task, format!("{hooks}/x")), -32001),
        ("no such task", "support-triage", create("nope", format!("{hooks}/x")), -32001),
        ("an origin not allowed", "support-triage", create(&task, "https://evil.example/h".into()), -32602),
        ("credentials in the URL", "support-triage", create(&task, hooks.replace("http://", "http://user:hunter2@")), -32602),
        ("no URL", "support-triage", json!({"taskId": task}), -32602),
        ("a scheme not served", "support-triage", json!({"taskId": task, "url": format!("{hooks}/x"), "authentication": {"scheme": "Digest"}}), -32602),
    ];
    for (what, route, params, expected) in cases {
        let answer = call(&server, route, "CreateTaskPushNotificationConfig", params).await;
        assert_eq!(code(&answer), expected, "{what}: {answer}");
        assert!(!answer.to_string().contains("hunter2"), "{what}: the URL's password echoed: {answer}");
    }
    let unknown = call(&server, "support-triage", "GetTaskPushNotificationConfig", json!({"taskId": task, "id": "nope"})).await;
    assert_eq!(code(&unknown), -32001, "{unknown}");
    // Delete is idempotent (A2A 1.0, 3.1.10): an unknown config is deleted already.
    let again = call(&server, "support-triage", "DeleteTaskPushNotificationConfig", json!({"taskId": task, "id": "nope"})).await;
    assert_eq!(again["result"], json!({}), "{again}");
    // 0.3's names, 0.3's shapes.
    let config = json!({"id": "old", "url": format!("{hooks}/old"), "token": "t03", "authentication": {"schemes": ["bearer"], "credentials": "c03"}});
    let set = call(&server, "support-triage", "tasks/pushNotificationConfig/set", json!({"taskId": task, "pushNotificationConfig": config})).await;
    let expected = json!({"taskId": task, "pushNotificationConfig": {"id": "old", "url": format!("{hooks}/old"), "token": "t03", "authentication": {"schemes": ["Bearer"], "credentials": "c03"}}});
    assert_eq!(set["result"], expected, "{set}");
    let got = call(&server, "support-triage", "tasks/pushNotificationConfig/get", json!({"id": task, "pushNotificationConfigId": "old"})).await;
    assert_eq!(got["result"], expected, "{got}");
    let first = call(&server, "support-triage", "tasks/pushNotificationConfig/get", json!({"id": task})).await;
    assert_eq!(first["result"], expected, "the task's first config: {first}");
    let list = call(&server, "support-triage", "tasks/pushNotificationConfig/list", json!({"id": task})).await;
    assert_eq!(list["result"], json!([expected]), "{list}");
    let deleted = call(&server, "support-triage", "tasks/pushNotificationConfig/delete", json!({"id": task, "pushNotificationConfigId": "old"})).await;
    assert_eq!(deleted["result"], Value::Null, "{deleted}");
    assert!(deleted["error"].is_null(), "{deleted}");
    let gone = call(&server, "support-triage", "tasks/pushNotificationConfig/get", json!({"id": task, "pushNotificationConfigId": "old"})).await;
    assert_eq!(code(&gone), -32001, "{gone}");
    // A 0.3 send's config: a config of its task (the task's id its id), delivered in 0.3's body.
    let push = json!({"url": format!("{hooks}/legacy"), "token": "t-legacy"});
    let sent =
        call(&server, "support-agent", "message/send", json!({"message": message("p-2", "refund?"), "configuration": {"pushNotificationConfig": push}})).await;
    let asking = sent["result"]["id"].as_str().unwrap_or_else(|| panic!("{sent}")).to_owned();
    assert_eq!(sent["result"]["status"]["state"], "input-required", "{sent}");
    let listed = call(&server, "support-agent", "tasks/pushNotificationConfig/list", json!({"id": asking})).await;
    assert_eq!(listed["result"][0]["pushNotificationConfig"]["id"], asking.as_str(), "{listed}");
    let cancelled = call(&server, "support-agent", "tasks/cancel", json!({"id": asking})).await;
    assert_eq!(cancelled["result"]["status"]["state"], "canceled", "{cancelled}");
    let got = until(&receiver, |g| with_token(g, "t-legacy").iter().any(|d| d.body.contains("canceled"))).await;
    let bodies: Vec<Value> = with_token(&got, "t-legacy").iter().map(|g| serde_json::from_str(&g.body).unwrap()).collect();
    let states: Vec<&str> = bodies.iter().map(|b| b["status"]["state"].as_str().unwrap_or_default()).collect();
    assert!(states.contains(&"input-required") && states.contains(&"canceled"), "{states:?}: {bodies:?}");
    assert!(bodies.iter().all(|b| b["kind"] == "task" && b["id"] == asking.as_str()), "0.3's task: {bodies:?}");
}

#[tokio::test]
async fn a_config_is_delivered_after_the_replica_that_took_it_is_killed_on_sqlite() {
    config_outlives_its_replica("sqlite").await;
}

#[tokio::test]
async fn a_config_is_delivered_after_the_replica_that_took_it_is_killed_on_postgres() {
    config_outlives_its_replica("postgres").await;
}

/// A task started and its config taken by one replica, which is `kill -9`'d before the run
/// asks: the other replica takes the run over, and the question reaches the config's URL.
async fn config_outlives_its_replica(kind: &str) {
    let receiver = Receiver::default();
    let hooks = receiver.start().await;
    let dir = tempfile::tempdir().unwrap();
    let Some(store) = crate::durable::store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [
        ("FABRIC_RUN_LEASE_S", "2"),
        ("FABRIC_LLM_STUB_LATENCY_MS", "3000"),
        ("FABRIC_CLAIM_POLL_MS", "100"),
        ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", hooks.as_str()),
        ("FABRIC_WEBHOOK_SECRET", SECRET),
    ];
    let first = Server::start(&store, stub.path(), &env);
    let survivor = Server::start(&store, stub.path(), &env);
    let message = json!({"messageId": format!("kill-{kind}"), "role": "ROLE_USER", "parts": [{"text": "refund?"}]});
    let sent = call(&first, "support-agent", "SendMessage", json!({"message": message, "configuration": {"returnImmediately": true}})).await;
    let task = sent["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{kind}: {sent}")).to_owned();
    let made = call(&first, "support-agent", "CreateTaskPushNotificationConfig", json!({"taskId": task, "url": format!("{hooks}/k"), "token": "t-kill"})).await;
    assert!(made["error"].is_null(), "{kind}: {made}");
    first.signal("KILL");
    let got = until(&receiver, |g| with_token(g, "t-kill").iter().any(|d| d.body.contains("INPUT_REQUIRED"))).await;
    assert!(
        with_token(&got, "t-kill").iter().any(|d| d.body.contains("INPUT_REQUIRED") && d.body.contains(&task)),
        "{kind}: the question after the kill: {got:?}\n{}",
        survivor.logs()
    );
}
