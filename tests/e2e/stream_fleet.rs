//! Streaming across a fleet (issue 48, part 3): a model's text reaches the watchers of another
//! replica while the call runs (through the store), a client that disconnects and reconnects to
//! either replica with `Last-Event-ID` gets every event once, and a replica killed mid-stream
//! (`kill -9`) is followed by `run.llm.restarted` and a whole new text from the run's next holder.
//! Real `fabric serve` processes on SQLite and PostgreSQL, read as raw SSE over real sockets.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::durable::store_url;
use crate::service::{Server, TOKEN, asking_stub, client, get, post, settled};

/// One SSE event: (id, type, data).
type Sse = (u64, String, Value);

/// A run's event stream as it comes: connect (after `last`), then read event by event.
struct Reader {
    response: reqwest::Response,
    buf: String,
}

impl Reader {
    async fn open(s: &Server, run_id: &str, last: Option<u64>) -> Reader {
        let mut req = client().get(format!("{}/v1/runs/{run_id}/events", s.url)).bearer_auth(TOKEN).timeout(Duration::from_secs(60));
        if let Some(id) = last {
            req = req.header("last-event-id", id.to_string());
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status(), 200);
        Reader { response, buf: String::new() }
    }

    /// The next event, or `None` at the end of the stream.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(at) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..at + 2).collect();
                if !block.contains("data:") {
                    continue; // a keep-alive comment
                }
                return Some(crate::service::sse_block(&block));
            }
            let chunk = self.response.chunk().await.ok()??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

fn ends_run(kind: &str) -> bool {
    matches!(kind, "run.completed" | "run.failed" | "run.cancelled" | "run.awaiting_input")
}

/// The journalled reply of `stage` (its first model reply).
async fn journalled(s: &Server, id: &str, stage: &str) -> String {
    let record = get(s, &format!("/v1/runs/{id}/record")).await;
    let entry = record["entries"].as_array().unwrap().iter().find(|e| e["entry"] == "model_reply" && e["stage_id"] == stage).cloned();
    entry.unwrap_or_else(|| panic!("no reply of {stage}: {record}"))["raw"].as_str().unwrap().to_owned()
}

/// The text a watcher keeps of `stage`: its deltas, dropped at each `run.llm.restarted`.
fn kept_text(events: &[Sse], stage: &str) -> String {
    let mut text = String::new();
    for (_, kind, d) in events.iter().filter(|(_, _, d)| d["stage_id"] == stage) {
        match kind.as_str() {
            "run.llm.delta" => text.push_str(d["text"].as_str().unwrap()),
            "run.llm.restarted" => text.clear(),
            _ => {}
        }
    }
    text
}

fn assert_whole(events: &[Sse], what: &str) {
    let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{what}: every event once, in order");
}

fn start_triage(k: usize) -> Value {
    json!({"route_id": "support-triage", "goal": {"ticket": format!("charged twice, ticket {k}")}, "model_profile": "default"})
}

#[tokio::test]
async fn another_replica_shows_the_text_while_the_call_runs_on_sqlite() {
    another_replica_shows_the_text("sqlite").await;
}

#[tokio::test]
async fn another_replica_shows_the_text_while_the_call_runs_on_postgres() {
    another_replica_shows_the_text("postgres").await;
}

async fn another_replica_shows_the_text(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    // Each call 4 s long; the run executes on the replica that accepted it.
    let runner = Server::start(&db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "4000")]);
    let watcher = Server::start(&db, stub.path(), &[("FABRIC_CLAIM_POLL_MS", "60000")]);
    let (status, run) = post(&runner, "/v1/runs", start_triage(0)).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let mut reader = Reader::open(&watcher, &id, None).await;
    let (mut first_delta, mut completed) = (None, None);
    let mut events = Vec::new();
    while let Some(e) = reader.next().await {
        if e.2["stage_id"] == "answer" {
            if e.1 == "run.llm.delta" && first_delta.is_none() {
                first_delta = Some(Instant::now());
            }
            if e.1 == "run.llm.completed" {
                completed = Some(Instant::now());
            }
        }
        let end = ends_run(&e.1);
        events.push(e);
        if end {
            break;
        }
    }
    let (first_delta, completed) = (first_delta.expect("the other replica showed deltas"), completed.expect("and the call's end"));
    // The text came while the call ran (4 s), not with the stage's end.
    assert!(completed - first_delta >= Duration::from_millis(1500), "{kind}: the first delta came {:?} before the call's end", completed - first_delta);
    assert_whole(&events, kind);
    assert_eq!(kept_text(&events, "answer"), journalled(&runner, &id, "answer").await, "{kind}");
}

#[tokio::test]
async fn two_hundred_seeded_disconnects_lose_and_repeat_nothing_on_postgres() {
    let Some(db) = crate::store::fresh_postgres().await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_LLM_STUB_LATENCY_MS", "2500"), ("FABRIC_CLAIM_POLL_MS", "60000"), ("FABRIC_LOG", "warn")];
    let replicas = [Server::start(&db, stub.path(), &env), Server::start(&db, stub.path(), &env)];
    let mut seed: u64 = 48;
    let mut disconnects = 0;
    let mut k = 0;
    while disconnects < 200 {
        // Four runs at a time, each read by a client that drops its connection after a seeded
        // 1 to 4 events and reconnects, alternately to each replica, after the last it got.
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..4 {
            k += 1;
            let (_, run) = post(&replicas[k % 2], "/v1/runs", start_triage(k)).await;
            let id = run["run_id"].as_str().unwrap().to_owned();
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let urls = [replicas[0].url.clone(), replicas[1].url.clone()];
            clients.spawn(read_with_disconnects(urls, id, seed));
        }
        while let Some(done) = clients.join_next().await {
            let (id, events, dropped) = done.unwrap();
            disconnects += dropped;
            assert_whole(&events, &id);
            let view = settled(&replicas[0], &id).await;
            assert_eq!(view["status"], "completed", "{view}");
            assert_eq!(kept_text(&events, "answer"), journalled(&replicas[0], &id, "answer").await, "run {id}: the text, byte for byte");
            assert!(events.iter().all(|e| e.1 != "run.llm.restarted"), "nothing restarted");
        }
    }
}

/// Reads a run's events to its end, dropping the connection after a seeded 1 to 4 events each
/// time and reconnecting to the other replica with `Last-Event-ID`: (run, events, disconnects).
async fn read_with_disconnects(urls: [String; 2], id: String, mut seed: u64) -> (String, Vec<Sse>, usize) {
    let mut events: Vec<Sse> = Vec::new();
    for dropped in 0.. {
        let last = events.last().map(|e| e.0);
        let mut req = client().get(format!("{}/v1/runs/{id}/events", urls[dropped % 2])).bearer_auth(TOKEN).timeout(Duration::from_secs(60));
        if let Some(l) = last {
            req = req.header("last-event-id", l.to_string());
        }
        let mut reader = Reader { response: req.send().await.unwrap(), buf: String::new() };
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let take = 1 + (seed % 4) as usize;
        for _ in 0..take {
            match reader.next().await {
                Some(e) => {
                    let end = ends_run(&e.1);
                    events.push(e);
                    if end {
                        return (id, events, dropped);
                    }
                }
                None => panic!("run {id}: the stream ended before the run did, after {:?}", events.last()),
            }
        }
        drop(reader);
    }
    unreachable!()
}

#[tokio::test]
async fn a_replica_killed_mid_stream_is_followed_by_restarted_and_a_whole_new_text_on_sqlite() {
    killed_mid_stream("sqlite").await;
}

#[tokio::test]
async fn a_replica_killed_mid_stream_is_followed_by_restarted_and_a_whole_new_text_on_postgres() {
    killed_mid_stream("postgres").await;
}

/// Two replicas over one store of `kind` whose model calls take 3 s and whose runs are taken
/// over within about 2 s of their holder's death: (the one to kill, the survivor, and what they
/// keep: the store's directory and the stub), or `None` when the store cannot be had here.
pub(crate) async fn killable_pair(kind: &str) -> Option<(Server, Server, tempfile::TempDir, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url(kind, &dir).await?;
    let stub = asking_stub();
    let env = [("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_LLM_STUB_LATENCY_MS", "3000"), ("FABRIC_CLAIM_POLL_MS", "100")];
    let first = Server::start(&db, stub.path(), &env);
    let survivor = Server::start(&db, stub.path(), &env);
    Some((first, survivor, dir, stub))
}

async fn killed_mid_stream(kind: &str) {
    let Some((first, survivor, _dir, _stub)) = killable_pair(kind).await else { return };
    let (_, run) = post(&first, "/v1/runs", start_triage(7)).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    // Watched on the survivor; the first replica is killed once some of the answer was shown.
    let mut reader = Reader::open(&survivor, &id, None).await;
    let mut events = Vec::new();
    let mut killed = false;
    while let Some(e) = reader.next().await {
        let shown = e.1 == "run.llm.delta" && e.2["stage_id"] == "answer";
        let end = ends_run(&e.1);
        events.push(e);
        if shown && !killed {
            first.signal("KILL");
            killed = true;
        }
        if end {
            break;
        }
    }
    assert!(killed, "{kind}: the answer streamed before the run ended: {events:?}");
    assert_eq!(events.last().unwrap().1, "run.completed", "{kind}: {}", survivor.logs());
    assert_whole(&events, kind);
    let answer: Vec<&Sse> = events.iter().filter(|e| e.2["stage_id"] == "answer" && e.1.starts_with("run.llm.")).collect();
    let restarted = answer.iter().position(|e| e.1 == "run.llm.restarted").unwrap_or_else(|| panic!("{kind}: no restart: {answer:?}"));
    assert!(answer[..restarted].iter().any(|e| e.1 == "run.llm.delta"), "{kind}: text was shown before");
    assert_eq!(answer[restarted].2["attempt"], 2, "{kind}: {:?}", answer[restarted]);
    let reply = journalled(&survivor, &id, "answer").await;
    let before: String = answer[..restarted].iter().filter(|e| e.1 == "run.llm.delta").map(|e| e.2["text"].as_str().unwrap()).collect();
    assert!(reply.starts_with(&before) && before.len() < reply.len(), "{kind}: the first holder's text was part of the same reply");
    assert_eq!(kept_text(&events, "answer"), reply, "{kind}: after the restart, a whole new text");
    assert!(answer[restarted + 1..].iter().filter(|e| e.1 == "run.llm.delta").all(|e| e.2["attempt"] == 2), "{kind}");
    // The call goes on from its recorded start: the stage and the call started once.
    let count = |k: &str| events.iter().filter(|e| e.1 == k && e.2["stage_id"] == "answer").count();
    assert_eq!((count("run.stage.started"), count("run.llm.started"), count("run.llm.completed")), (1, 1, 1), "{kind}: {answer:?}");
}

#[tokio::test]
async fn a_decision_shows_only_its_question_and_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let s = Server::start(&db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "600")]);
    let (_, run) = post(&s, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let (status, _) = post(&s, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "42"})).await;
    assert_eq!(status, 200);
    let events = crate::service::sse(&s, &id, None).await;
    let turn_text = |turn: u64| -> String {
        events.iter().filter(|(_, k, d)| k == "run.llm.delta" && d["turn"] == turn).map(|(_, _, d)| d["text"].as_str().unwrap()).collect()
    };
    assert_eq!(turn_text(0), "Which order number?", "the question, without its keyword");
    assert_eq!(turn_text(1), "", "a tool call shows nothing");
    assert_eq!(turn_text(2), "Order 42 is refunded.", "the answer");
    assert!(events.iter().filter(|(_, k, d)| k == "run.llm.delta" && d["turn"] == 0).count() >= 2, "in pieces: {events:?}");
}
