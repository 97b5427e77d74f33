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
