//! A run's events read by reference clients, unmodified, through a real `fabric serve` (issue 48,
//! part 4): the Vercel AI SDK's `ai` package reads `?format=ui-message-stream` with its own
//! parser and `readUIMessageStream` (live, from the store, resumed in the middle of a text part,
//! a run that asks), and the npm `eventsource` package follows the plain stream across a restart
//! of the server on the same port, reconnecting with `Last-Event-ID` by itself. The clients are
//! pinned in tests/fixtures/ui-stream/package-lock.json and installed once under cargo's
//! scratch folder; the scripts beside it drive them.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::service::{Server, TOKEN, asking_stub, client, get, post, sse};

/// Every event type (docs/events.md): `eventsource` hands on only the named events it listens to.
const KINDS: &[&str] = &[
    "run.started",
    "run.stage.started",
    "run.llm.started",
    "run.llm.waiting",
    "run.llm.retrying",
    "run.llm.delta",
    "run.llm.restarted",
    "run.llm.completed",
    "run.llm.failed",
    "run.tool.started",
    "run.tool.completed",
    "run.tool.failed",
    "run.stage.completed",
    "run.stage.failed",
    "run.completed",
    "run.failed",
    "run.awaiting_input",
    "run.resumed",
    "run.cancelled",
    "run.catalogue_moved",
];

/// The folder with the reference clients and their scripts (installed once with `npm ci`);
/// `None` when there is no `node` and `npm` here (a skip, a failure under CI).
fn clients() -> Option<PathBuf> {
    static MADE: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = made.as_ref() {
        return Some(p.clone());
    }
    let dir = crate::support::npm_clients("ui-stream", "the AI SDK's `ai` package and npm's `eventsource` read the event streams")?;
    *made = Some(dir.clone());
    Some(dir)
}

/// The `ai` package's reading of a run's UI message stream (read-ui.mjs): the protocol header,
/// the chunk types, the errors and the last UIMessage.
async fn read_ui(dir: &std::path::Path, s: &Server, id: &str, last_event_id: Option<u64>) -> Value {
    let url = format!("{}/v1/runs/{id}/events?format=ui-message-stream", s.url);
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg("read-ui.mjs").args([&url, TOKEN]).current_dir(dir);
    if let Some(n) = last_event_id {
        cmd.arg(n.to_string());
    }
    let o = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("the stream ends").unwrap();
    assert!(o.status.success(), "read-ui.mjs: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The text parts of a UIMessage: (text, `providerMetadata.fabric.textId`).
fn texts(message: &Value) -> Vec<(String, String)> {
    let parts = message["parts"].as_array().unwrap();
    parts
        .iter()
        .filter(|p| p["type"] == "text")
        .map(|p| (p["text"].as_str().unwrap().to_owned(), p["providerMetadata"]["fabric"]["textId"].as_str().unwrap().to_owned()))
        .collect()
}

/// `fabric serve` on a SQLite file with the asking stub, each model call taking `latency_ms`;
/// with the folders it uses (kept as long as the server runs).
fn serve(latency_ms: &str) -> (Server, [tempfile::TempDir; 2]) {
    let (db, stub) = (tempfile::tempdir().unwrap(), asking_stub());
    let s = Server::start(&format!("sqlite://{}", db.path().join("fabric.db").display()), stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", latency_ms)]);
    (s, [db, stub])
}

/// The reply the journal keeps for a stage.
async fn journalled(s: &Server, id: &str, stage: &str) -> String {
    let record = get(s, &format!("/v1/runs/{id}/record")).await;
    let entries = record["entries"].as_array().unwrap();
    let reply = entries.iter().rfind(|e| e["entry"] == "model_reply" && e["stage_id"] == stage).unwrap();
    reply["raw"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_ai_package_reads_a_run_as_one_assistant_message_whose_text_is_the_reply() {
    let Some(dir) = clients() else { return };
    let (s, _folders) = serve("800");
    let (status, run) = post(&s, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    // Live, then from the store: the same message.
    let live = read_ui(&dir, &s, &id, None).await;
    let stored = read_ui(&dir, &s, &id, None).await;
    let reply = journalled(&s, &id, "answer").await;
    for read in [&live, &stored] {
        assert_eq!(read["header"], "v1", "{read}");
        assert_eq!(read["errors"], json!([]), "{read}");
        let types: Vec<&str> = read["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert_eq!((types.first(), types.last()), (Some(&"start"), Some(&"finish")), "{types:?}");
        assert_eq!(types.iter().filter(|t| **t == "start-step").count(), 3, "a step per stage: {types:?}");
        let message = &read["message"];
        assert_eq!((message["id"].as_str(), message["role"].as_str()), (Some(id.as_str()), Some("assistant")));
        let texts = texts(message);
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert_eq!(texts[0].0, reply, "the text is the journalled reply");
        let parts = message["parts"].as_array().unwrap();
        let run_part = parts.iter().find(|p| p["type"] == "data-fabric-run").unwrap();
        assert_eq!((run_part["id"].as_str(), run_part["data"]["type"].as_str()), (Some(id.as_str()), Some("run.completed")));
        assert_eq!(run_part["data"]["output"], get(&s, &format!("/v1/runs/{id}")).await["output"]);
        let stages: Vec<&str> = parts.iter().filter(|p| p["type"] == "data-fabric-stage").map(|p| p["data"]["type"].as_str().unwrap()).collect();
        assert_eq!(stages, ["run.stage.completed"; 3], "one part per stage, updated to its end");
    }
    assert_eq!(live["message"], stored["message"]);

    // A run that asks: the question is the message's last text; the stream ends there.
    let (_, asked) = post(&s, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!(asked["status"], "awaiting_input", "{asked}");
    let asked_id = asked["run_id"].as_str().unwrap();
    let read = read_ui(&dir, &s, asked_id, None).await;
    let question = texts(&read["message"]);
    assert_eq!(question.last().map(|t| t.0.as_str()), asked["question"].as_str(), "{read}");
    assert_eq!(read["types"].as_array().unwrap().last().unwrap(), "finish");
    // The reply, then the rest from the question's id: the next message of the run.
    let ask_seq = sse(&s, asked_id, None).await.last().unwrap().0;
    let (_, replied) = post(&s, &format!("/v1/runs/{asked_id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!(replied["status"], "completed", "{replied}");
    let rest = read_ui(&dir, &s, asked_id, Some(ask_seq)).await;
    assert_eq!(rest["message"]["id"], format!("{asked_id}-{}", ask_seq + 1), "{rest}");
    assert_eq!(texts(&rest["message"]).last().map(|t| t.0.as_str()), replied["output"].as_str(), "{rest}");
}

#[tokio::test]
async fn a_resume_in_the_middle_of_a_text_part_is_a_stream_the_ai_package_reads() {
    let Some(dir) = clients() else { return };
    let (s, _folders) = serve("1200");
    let (_, run) = post(&s, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    let events = sse(&s, &id, None).await;
    let deltas: Vec<(u64, String)> = events.iter().filter(|e| e.1 == "run.llm.delta").map(|e| (e.0, e.2["text"].as_str().unwrap().to_owned())).collect();
    assert!(deltas.len() >= 3, "{deltas:?}");
    // The raw stream: every frame has an id, the last of each event its seq.
    let raw = client().get(format!("{}/v1/runs/{id}/events?format=ui-message-stream", s.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(raw.headers()["x-vercel-ai-ui-message-stream"], "v1");
    let raw = raw.text().await.unwrap();
    let blocks: Vec<&str> = raw.split("\n\n").filter(|b| b.contains("data:")).collect();
    assert!(blocks.iter().all(|b| b.lines().any(|l| l.starts_with("id:")) && !b.lines().any(|l| l.starts_with("event:"))), "{raw}");
    assert!(blocks.last().unwrap().contains("data: [DONE]"), "{raw}");
    let full = read_ui(&dir, &s, &id, None).await;
    // After the first delta: the part again, with the same id, and the rest of the text.
    let (cut, _) = deltas[0];
    let rest = read_ui(&dir, &s, &id, Some(cut)).await;
    assert_eq!(rest["errors"], json!([]), "{rest}");
    let types: Vec<&str> = rest["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(types[..4], ["start", "start-step", "text-start", "text-delta"], "{types:?}");
    let after: String = deltas[1..].iter().map(|d| d.1.as_str()).collect();
    let (got, full_texts) = (texts(&rest["message"]), texts(&full["message"]));
    assert_eq!(got, [(after, full_texts[0].1.clone())]);
    assert_eq!(rest["message"]["id"], id.as_str());
    // A query that is not a format: 400.
    let bad = client().get(format!("{}/v1/runs/{id}/events?format=xml", s.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn another_replica_serves_the_same_message_through_its_store_poller() {
    let Some(dir) = clients() else { return };
    let (runner, folders) = serve("800");
    let db = format!("sqlite://{}", folders[0].path().join("fabric.db").display());
    let other = Server::start(&db, folders[1].path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "800")]);
    let (_, run) = post(&runner, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    let (followed, direct) = tokio::join!(read_ui(&dir, &other, &id, None), read_ui(&dir, &runner, &id, None));
    assert_eq!(followed["errors"], json!([]), "{followed}");
    assert_eq!(texts(&followed["message"]), texts(&direct["message"]));
    assert_eq!(texts(&followed["message"])[0].0, journalled(&runner, &id, "answer").await);
}

/// What npm's `eventsource` saw of a run (its events, each `{seq, type, data}`) while the server
/// was stopped (SIGTERM: the run in flight is handed over) in the middle of the answer's text
/// and started again on the same port, on the same SQLite file; the record; the reply.
async fn follow_across_a_restart() -> Option<(Vec<Value>, Vec<(u64, String, Value)>, String)> {
    let dir = clients()?;
    let db = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", db.path().join("fabric.db").display());
    let stub = asking_stub();
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let first = Server::start_at(&listen, &db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "3000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")]);
    let (_, run) = post(&first, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    let url = format!("{}/v1/runs/{id}/events", first.url);
    let mut follower = tokio::process::Command::new("node")
        .arg("follow-events.mjs")
        .args([&url, TOKEN])
        .args(KINDS)
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(follower.stdout.take().unwrap()));
    let (mut events, mut opens) = (Vec::<Value>::new(), 0);
    let (mut first, mut second) = (Some(first), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while let Some(line) = tokio::time::timeout_at(deadline, lines.next_line()).await.expect("the run ends").unwrap() {
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["end"] == true {
            break;
        }
        opens += usize::from(v.get("open").is_some());
        if v.get("seq").is_none() {
            continue;
        }
        events.push(v);
        // Stopped while the answer streams: the next process does the stage again.
        let shown = events.iter().filter(|e| e["type"] == "run.llm.delta" && e["data"]["stage_id"] == "answer").count();
        if shown == 2
            && let Some(server) = first.take()
        {
            let (exit, logs) = server.stop();
            assert!(exit.success(), "{logs}");
            second = Some(Server::start_at(&listen, &db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "1500"), ("FABRIC_CLAIM_POLL_MS", "50")]));
        }
    }
    let second = second.expect("the server was restarted mid-stream");
    assert!(opens >= 2, "it reconnected by itself: {opens} connections");
    let record = sse(&second, &id, None).await;
    let reply = journalled(&second, &id, "answer").await;
    let _ = follower.kill().await;
    Some((events, record, reply))
}

#[tokio::test]
async fn eventsource_follows_a_run_across_a_restart_of_the_server_and_sees_each_event_once() {
    let Some((events, record, reply)) = follow_across_a_restart().await else { return };
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "every seq once, in order, no gap");
    assert_eq!(events.last().unwrap()["type"], "run.completed");
    let seen: Vec<(u64, &str)> = events.iter().map(|e| (e["seq"].as_u64().unwrap(), e["type"].as_str().unwrap())).collect();
    let recorded: Vec<(u64, &str)> = record.iter().map(|e| (e.0, e.1.as_str())).collect();
    assert_eq!(seen, recorded, "the events of the record, by seq and type");
    // The answer's text as shown: from its call's last (re)start. The seeded stub writes the
    // same pieces in both processes, so this holds even where the pieces came from two
    // processes (see the test below).
    let answer: Vec<&Value> = events.iter().filter(|e| e["data"]["stage_id"] == "answer").collect();
    let from = answer.iter().rposition(|e| e["type"] == "run.llm.restarted" || e["type"] == "run.llm.started").unwrap();
    let text: String = answer[from..].iter().filter(|e| e["type"] == "run.llm.delta").map(|e| e["data"]["text"].as_str().unwrap()).collect();
    assert_eq!(text, reply);
}

/// What closed the gap found here (issue 48): a replica shows a model's text only once it was
/// handed to the run's record (a streaming call records its events every 100 ms), and the run's
/// next holder goes on from a call its last holder was streaming with `run.llm.restarted`. So a
/// client that resumes after the last event it saw gets either the record, or the word to drop
/// the text it has, never a splice of two model calls.
#[tokio::test]
async fn eventsource_after_a_takeover_mid_call_sees_the_record_or_is_told_to_drop_its_text() {
    let Some((events, record, reply)) = follow_across_a_restart().await else { return };
    let answer: Vec<&Value> = events.iter().filter(|e| e["data"]["stage_id"] == "answer").collect();
    match answer.iter().rposition(|e| e["type"] == "run.llm.restarted") {
        Some(restarted) => {
            let text: String = answer[restarted..].iter().filter(|e| e["type"] == "run.llm.delta").map(|e| e["data"]["text"].as_str().unwrap()).collect();
            assert_eq!(text, reply);
        }
        None => {
            for (seen, recorded) in events.iter().zip(&record) {
                assert_eq!(seen["data"], recorded.2, "seq {}: what the client saw is not the record", recorded.0);
            }
        }
    }
}
