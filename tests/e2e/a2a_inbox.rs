//! Messages to a task that is `working` (issue 52): kept in the run's inbox and answering its
//! next question, in the order they came, once per `messageId`, on a real `fabric serve` (raw
//! JSON-RPC over a real socket). A message acknowledged by a replica that is then `kill -9`'d
//! before the run asks answers the question the run asks on the survivor (SQLite and
//! PostgreSQL). The TCK's `test_message_send_continue_task` and `test_task_history_length`
//! send such messages too (`a2a_tck`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::a2a::rpc;
use crate::service::{Server, TOKEN, get};

fn send(id: &str, text: &str, task: Option<&str>) -> String {
    let mut message = json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]});
    if let Some(t) = task {
        message["taskId"] = json!(t);
    }
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message, "configuration": {"returnImmediately": true}}}).to_string()
}

async fn get_task(server: &Server, task: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task}}).to_string();
    rpc(server, "support-agent", &body, Some(TOKEN)).await.1["result"].clone()
}

/// The run's view once it ended (within 60 s).
async fn ended(server: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = get(server, &format!("/v1/runs/{id}")).await;
        if ["completed", "failed", "cancelled"].contains(&view["status"].as_str().unwrap_or_default()) || Instant::now() > deadline {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The replies the run took (its `run.resumed` events), in order.
async fn replies(server: &Server, id: &str) -> Vec<String> {
    let events = crate::service::sse(server, id, None).await;
    events.into_iter().filter(|(_, kind, _)| kind == "run.resumed").map(|(_, _, e)| e["reply"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Starts a support-agent task (its model asks after one slow call) and sends it two messages
/// while it works, the first one twice.
async fn start_and_queue(server: &Server, tag: &str) -> String {
    let (_, started) = rpc(server, "support-agent", &send(&format!("{tag}-goal"), "Where is my refund?", None), Some(TOKEN)).await;
    let task = started["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{started}")).to_owned();
    for (id, text) in [("m-1", "Order 42"), ("m-1", "Order 42"), ("m-2", "and the other one")] {
        let (status, answer) = rpc(server, "support-agent", &send(&format!("{tag}-{id}"), text, Some(&task)), Some(TOKEN)).await;
        assert_eq!(status, 200, "{answer}");
        let state = answer["result"]["task"]["status"]["state"].as_str().unwrap_or_else(|| panic!("a task: {answer}")).to_owned();
        assert!(["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"].contains(&state.as_str()), "queued while it works: {answer}");
    }
    // Both wait (the repeat queued nothing), shown at the end of its history.
    let history: Vec<String> =
        get_task(server, &task).await["history"].as_array().unwrap().iter().map(|m| m["parts"][0]["text"].as_str().unwrap_or("(data)").to_owned()).collect();
    assert_eq!(history, ["(data)", "Order 42", "and the other one"], "the goal, then the waiting messages");
    task
}

#[tokio::test]
async fn messages_to_a_working_task_answer_its_questions_in_order_once_each() {
    let (server, _dir, _stub) = crate::mcp_server::serve(&[("FABRIC_LLM_STUB_LATENCY_MS", "1500")]);
    let task = start_and_queue(&server, "one").await;
    let view = ended(&server, &task).await;
    assert_eq!(view["status"], "completed", "{view}");
    // The run asked once: the oldest message was the reply; the other stays unused.
    assert_eq!(replies(&server, &task).await, ["Order 42"]);
    let history: Vec<(String, String)> = get_task(&server, &task).await["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), m["parts"][0]["text"].as_str().unwrap_or("(data)").to_owned()))
        .collect();
    let roles: Vec<&str> = history.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(roles, ["ROLE_USER", "ROLE_AGENT", "ROLE_USER", "ROLE_AGENT", "ROLE_USER"], "goal, question, reply, output, unused: {history:?}");
    assert_eq!((history[2].1.as_str(), history[4].1.as_str()), ("Order 42", "and the other one"), "{history:?}");
    // An ended task takes no more messages.
    let (_, late) = rpc(&server, "support-agent", &send("one-late", "anyone?", Some(&task)), Some(TOKEN)).await;
    assert_eq!(late["error"]["code"], -32004, "{late}");
    // A route that never asks takes no message after the first.
    let (_, triage) = rpc(&server, "support-triage", &send("triage-1", "charged twice", None), Some(TOKEN)).await;
    let triage_task = triage["result"]["task"]["id"].as_str().unwrap().to_owned();
    let (_, refused) = rpc(&server, "support-triage", &send("triage-2", "more", Some(&triage_task)), Some(TOKEN)).await;
    assert_eq!(refused["error"]["code"], -32004, "{refused}");
}

#[tokio::test]
async fn a_message_acknowledged_before_kill_9_answers_the_question_on_the_survivor_on_sqlite() {
    acknowledged_then_killed("sqlite").await;
}

#[tokio::test]
async fn a_message_acknowledged_before_kill_9_answers_the_question_on_the_survivor_on_postgres() {
    acknowledged_then_killed("postgres").await;
}

async fn acknowledged_then_killed(kind: &str) {
    let Some((first, survivor, _dir, _stub)) = crate::stream_fleet::killable_pair(kind).await else { return };
    let task = start_and_queue(&first, kind).await;
    // Killed during the model's first call (3 s), before the run asks.
    let run = get(&first, &format!("/v1/runs/{task}")).await;
    assert_ne!(run["status"], "awaiting_input", "{kind}: it had not asked yet: {run}");
    first.signal("KILL");
    let view = ended(&survivor, &task).await;
    assert_eq!(view["status"], "completed", "{kind}: {view}\n{}", survivor.logs());
    assert_eq!(replies(&survivor, &task).await, ["Order 42"], "{kind}: the first message answered the question, once");
}

/// The inbox on every store, through the facade: once per message id, in order, never for an
/// ended run; a message taken for a question whose reply was never recorded (its replica died
/// between the claim and the record) waits again, before the later ones; pruned with its run.
#[tokio::test]
async fn a_taken_message_whose_reply_was_never_recorded_waits_again_on_every_store() {
    use fabric::events::NullSink;
    use fabric::store::StoredStatus;
    use fabric::store::inbox::Queued;
    let (stores, _dir) = crate::store::stores().await;
    let stub = crate::service::asking_stub();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let rt = crate::store::runtime(store.clone(), stub.path());
        let req = crate::store::start("support-agent", json!({"question": "refund?"}));
        let accepted = rt.accept(&req, true).await.unwrap();
        let asking = accepted.run_id.clone();
        rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, std::sync::Arc::new(NullSink), fabric::cancel::Cancel::never()).await.unwrap();
        assert_eq!(store.get_run(&asking).await.unwrap().unwrap().status, StoredStatus::AwaitingInput, "{name}");
        assert_eq!(rt.queue_message(&asking, "m-1", "order 42").await.unwrap(), Queued::Queued, "{name}");
        assert_eq!(rt.queue_message(&asking, "m-1", "order 42").await.unwrap(), Queued::Again, "{name}");
        assert_eq!(rt.queue_message(&asking, "m-2", "and another").await.unwrap(), Queued::Queued, "{name}");
        assert_eq!(rt.runs_with_waiting_messages().await.unwrap(), std::slice::from_ref(&asking), "{name}");
        let taken = rt.claim_queued_reply(&asking).await.unwrap().unwrap_or_else(|| panic!("{name}: the run asks and a message waits"));
        assert!(rt.claim_queued_reply(&asking).await.unwrap().is_none(), "{name}: claimed: it does not ask now");
        // Its holder dies before the reply's record; the run asks again (its status as the next
        // holder leaves it, with no `run.resumed` since the claim).
        store.reopen_reply(taken.lease()).await.unwrap();
        let again = rt.claim_queued_reply(&asking).await.unwrap().unwrap_or_else(|| panic!("{name}: the message taken waits again"));
        let done = rt.continue_run(again, std::sync::Arc::new(NullSink), fabric::cancel::Cancel::never()).await.unwrap();
        assert_eq!(serde_json::to_value(&done.result).unwrap()["output"], "Order 42 is refunded.", "{name}");
        let resumed: Vec<String> = store.events_after(&asking, 0).await.unwrap().into_iter().filter(|e| e.kind == "run.resumed").map(|e| e.body).collect();
        assert_eq!(resumed.len(), 1, "{name}: {resumed:?}");
        assert!(resumed[0].contains("order 42"), "{name}: the oldest message was the reply: {resumed:?}");
        let kept: Vec<(String, bool)> = rt.queued_messages(&asking).await.unwrap().into_iter().map(|m| (m.message_id, m.taken_at.is_some())).collect();
        assert_eq!(kept, [("m-1".to_owned(), true), ("m-2".to_owned(), false)], "{name}");
        assert_eq!(rt.queue_message(&asking, "m-3", "late").await.unwrap(), Queued::Ended(Some(StoredStatus::Completed)), "{name}");
        assert!(rt.runs_with_waiting_messages().await.unwrap().is_empty(), "{name}: an ended run's messages wait for nothing");
        // Its messages go with it at retention.
        crate::store::sql(&url, "UPDATE runs SET created_at = '2000-01-01T00:00:00.000Z', updated_at = '2000-01-01T00:00:00.000Z'").await;
        assert_eq!(rt.prune(Duration::from_secs(3600), false).await.unwrap(), 1, "{name}");
        assert!(rt.queued_messages(&asking).await.unwrap().is_empty(), "{name}: pruned with its run");
    }
}

fn call(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).to_string()
}

/// What an adversarial client found (issue 52's review), each answered with the protocol's
/// error now: a reply larger than a goal split into parts, an inbox flooded, a `messageId`
/// reused for another text, fields of the wrong type taken for absent ones, ids that would not
/// come back as sent, a `Host` that would point the cards elsewhere, a path that is not UTF-8.
#[tokio::test]
async fn hostile_messages_and_parameters_are_refused_with_the_protocols_errors() {
    let (server, _dir, _stub) = crate::mcp_server::serve(&[("FABRIC_LLM_STUB_LATENCY_MS", "20000")]);
    let code = |v: &Value| v["error"]["code"].as_i64().unwrap_or_else(|| panic!("an error: {v}"));
    let (_, started) = rpc(&server, "support-agent", &send("h-goal", "Where is my refund?", None), Some(TOKEN)).await;
    let task = started["result"]["task"]["id"].as_str().unwrap().to_owned();
    // Four parts of 100 KB: each under the limit, their text over it.
    let part = json!({"text": "b".repeat(100_000)});
    let big = json!({"messageId": "h-big", "role": "ROLE_USER", "taskId": task, "parts": [part, part, part]});
    let (_, refused) = rpc(&server, "support-agent", &call("SendMessage", json!({"message": big})), Some(TOKEN)).await;
    assert_eq!(code(&refused), -32602, "{refused}");
    // 32 may wait; the 33rd is refused; the same id with another text too.
    for i in 0..32 {
        let (_, ok) = rpc(&server, "support-agent", &send(&format!("h-{i}"), "more", Some(&task)), Some(TOKEN)).await;
        assert!(ok["result"]["task"].is_object(), "{i}: {ok}");
    }
    let (_, full) = rpc(&server, "support-agent", &send("h-32", "one too many", Some(&task)), Some(TOKEN)).await;
    assert_eq!((code(&full), full["error"]["data"]["waiting"].as_i64()), (-32602, Some(32)), "{full}");
    let (_, reused) = rpc(&server, "support-agent", &send("h-0", "another text", Some(&task)), Some(TOKEN)).await;
    assert_eq!(code(&reused), -32602, "{reused}");
    // Fields of the wrong type.
    let msg = |extra: Value| {
        let mut m = json!({"messageId": "h-typed", "role": "ROLE_USER", "parts": [{"text": "x"}]});
        m.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        m
    };
    let typed = [
        ("taskId 7", call("SendMessage", json!({"message": msg(json!({"taskId": 7}))}))),
        ("taskId object", call("SendMessage", json!({"message": msg(json!({"taskId": {"id": task}}))}))),
        ("contextId 5", call("SendMessage", json!({"message": msg(json!({"contextId": 5}))}))),
        ("configuration a string", call("SendMessage", json!({"message": msg(json!({})), "configuration": "fast"}))),
        ("returnImmediately a string", call("SendMessage", json!({"message": msg(json!({})), "configuration": {"returnImmediately": "true"}}))),
        ("pageToken 5", call("ListTasks", json!({"pageToken": 5}))),
        ("status 5", call("ListTasks", json!({"status": 5}))),
        ("includeArtifacts yes", call("ListTasks", json!({"includeArtifacts": "yes"}))),
    ];
    for (what, body) in typed {
        let (_, answer) = rpc(&server, "support-agent", &body, Some(TOKEN)).await;
        assert_eq!(code(&answer), -32602, "{what}: {answer}");
    }
    // An offset is RFC 3339 too.
    let (_, listed) = rpc(&server, "support-agent", &call("ListTasks", json!({"statusTimestampAfter": "2000-01-01T05:00:00+05:00"})), Some(TOKEN)).await;
    assert!(listed["result"]["tasks"].is_array(), "{listed}");
    // An unknown method is that, whatever its params.
    let (_, unknown) =
        rpc(&server, "support-agent", &json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/explode", "params": [1]}).to_string(), Some(TOKEN)).await;
    assert_eq!(code(&unknown), -32601, "{unknown}");
    // Ids that would not come back as sent.
    for id in ["1.5", "1e5", "123456789012345678901234567890"] {
        let body = format!(r#"{{"jsonrpc": "2.0", "id": {id}, "method": "ListTasks", "params": {{}}}}"#);
        let (_, answer) = rpc(&server, "support-agent", &body, Some(TOKEN)).await;
        assert_eq!((code(&answer), &answer["id"]), (-32600, &Value::Null), "{id}: {answer}");
    }
    let (_, exact) = rpc(&server, "support-agent", &json!({"jsonrpc": "2.0", "id": u64::MAX, "method": "ListTasks"}).to_string(), Some(TOKEN)).await;
    assert_eq!(exact["id"], json!(u64::MAX), "{exact}");
    // A Host with user info does not make the card's URLs.
    let card: Value = crate::service::client()
        .get(format!("{}/a2a/support-agent/.well-known/agent-card.json", server.url))
        .header("host", "127.0.0.1:1@evil.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = card["supportedInterfaces"][0]["url"].as_str().unwrap();
    assert!(url.starts_with("http://localhost/"), "the Host was sent, and not taken: {url}");
    // A route segment that is not UTF-8: the API's error shape.
    let r = crate::service::client().post(format!("{}/a2a/%ff", server.url)).bearer_auth(TOKEN).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
}

/// A subscribe from the first event of a task that asked, was answered and completed shows it
/// all to its end; the question it passes was answered.
#[tokio::test]
async fn a_resubscribe_from_the_start_of_an_answered_task_goes_to_its_end() {
    let (server, _dir, _stub) = crate::mcp_server::serve(&[]);
    let blocking = |id: &str, text: &str, task: Option<&str>| {
        let mut message = json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]});
        if let Some(t) = task {
            message["taskId"] = json!(t);
        }
        call("SendMessage", json!({"message": message}))
    };
    let (_, asked) = rpc(&server, "support-agent", &blocking("r-1", "Where is my refund?", None), Some(TOKEN)).await;
    let task = asked["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(asked["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asked}");
    let (_, done) = rpc(&server, "support-agent", &blocking("r-2", "Order 42", Some(&task)), Some(TOKEN)).await;
    assert_eq!(done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let r = crate::service::client()
        .post(format!("{}/a2a/support-agent", server.url))
        .bearer_auth(TOKEN)
        .header("last-event-id", "0")
        .body(call("SubscribeToTask", json!({"id": task})))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let states: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter_map(|v| v["result"]["statusUpdate"]["status"]["state"].as_str().map(str::to_owned))
        .collect();
    assert!(states.contains(&"TASK_STATE_INPUT_REQUIRED".to_owned()), "{states:?}");
    assert_eq!(states.last().map(String::as_str), Some("TASK_STATE_COMPLETED"), "past the answered question: {states:?}");
}
