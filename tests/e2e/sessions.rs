//! One run per session (`multitask`, `FABRIC_SESSION_POLICY`) through two real `fabric serve`
//! replicas on one store, SQLite and PostgreSQL: each policy under a double start sent to both
//! replicas at once. The runs are of `support-agent`, which asks the user first: a run that asks
//! stays live (awaiting input) until it is replied to or cancelled, so what is live is known.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::durable::store_url;
use crate::service::{Server, TOKEN, asking_stub, client, post};

fn start(session: &str, policy: Option<&str>) -> Value {
    let mut body = json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default", "session_id": session});
    if let Some(p) = policy {
        body["multitask"] = json!(p);
    }
    body
}

async fn get(s: &Server, run_id: &str) -> Value {
    client().get(format!("{}/v1/runs/{run_id}", s.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap()
}

/// Polls until the run's status is `want`, at most 30 s; the run as it is then.
async fn until(s: &Server, run_id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(s, run_id).await;
        if v["status"] == want || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Of two runs, the one that reaches `awaiting_input` first, and the other, at most 30 s.
async fn first_of(s: &Server, x: &str, y: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (one, other) in [(x, y), (y, x)] {
            if get(s, one).await["status"] == "awaiting_input" {
                return (one.to_owned(), other.to_owned());
            }
        }
        assert!(Instant::now() < deadline, "neither {x} nor {y} asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The same start sent to both replicas at once: both answers.
async fn double(a: &Server, b: &Server, body: &Value) -> [(u16, Value); 2] {
    let (x, y) = tokio::join!(post(a, "/v1/runs", body.clone()), post(b, "/v1/runs", body.clone()));
    [x, y]
}

fn replicas(db: &str, stub: &std::path::Path, policy: Option<&str>) -> (Server, Server) {
    let mut env = vec![("FABRIC_CLAIM_POLL_MS", "100"), ("FABRIC_LOG", "warn")];
    if let Some(p) = policy {
        env.push(("FABRIC_SESSION_POLICY", p));
    }
    (Server::start(db, stub, &env), Server::start(db, stub, &env))
}

#[tokio::test]
async fn each_session_policy_holds_under_a_double_start_on_two_replicas_on_sqlite() {
    policies("sqlite").await;
}

#[tokio::test]
async fn each_session_policy_holds_under_a_double_start_on_two_replicas_on_postgres() {
    policies("postgres").await;
}

async fn policies(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let (a, b) = replicas(&db, stub.path(), None);

    // reject: of two simultaneous starts, one runs and the other is refused naming it.
    for round in 0..4 {
        let session = format!("reject-{round}");
        let answers = double(&a, &b, &start(&session, Some("reject"))).await;
        let created: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 201).map(|(_, v)| v).collect();
        let refused: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 409).map(|(_, v)| v).collect();
        assert_eq!((created.len(), refused.len()), (1, 1), "{kind}: {answers:?}");
        let live = created[0]["run_id"].as_str().unwrap();
        assert_eq!(refused[0]["error"]["code"], "session_busy", "{kind}");
        assert!(refused[0]["error"]["message"].as_str().unwrap().contains(live), "{kind}: the refusal names the live run: {refused:?}");
        assert_eq!(until(&a, live, "awaiting_input").await["status"], "awaiting_input", "{kind}");
        // Still live while it asks; once it ended, the session takes a new run.
        assert_eq!(post(&b, "/v1/runs", start(&session, Some("reject"))).await.0, 409, "{kind}");
        assert_eq!(post(&a, &format!("/v1/runs/{live}/cancel"), json!({})).await.0, 202, "{kind}");
        assert_eq!(post(&b, "/v1/runs", start(&session, Some("reject"))).await.0, 201, "{kind}");
    }

    // allow (the default): both run.
    let answers = double(&a, &b, &start("allow", None)).await;
    for (status, v) in &answers {
        assert_eq!(*status, 201, "{kind}: {v} {} {}", a.logs(), b.logs());
        assert_eq!(until(&a, v["run_id"].as_str().unwrap(), "awaiting_input").await["status"], "awaiting_input", "{kind}");
    }

    // enqueue: both accepted, queued; one runs, the other waits until it ended, then runs.
    let answers = double(&a, &b, &start("enqueue", Some("enqueue"))).await;
    let ids: Vec<String> = answers
        .iter()
        .map(|(s, v)| {
            assert_eq!((*s, v["status"].as_str()), (201, Some("queued")), "{kind}: {v}");
            v["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    // One runs (the store took its start first); the other waits while it is live (it asks).
    let (first, second) = first_of(&a, &ids[0], &ids[1]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(&b, &second).await["status"], "queued", "{kind}: the second waits while the first is live (it asks)");
    let (status, replied) = post(&b, &format!("/v1/runs/{first}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, replied["status"].as_str()), (200, Some("completed")), "{kind}: {replied}");
    assert_eq!(until(&a, &second, "awaiting_input").await["status"], "awaiting_input", "{kind}: the second ran once the first ended");

    // interrupt: a live run, then two interrupting starts at once: the live run and the older of
    // the two are cancelled (interrupted_by_session); the newest runs.
    let (status, live) = post(&a, "/v1/runs?wait=true", start("interrupt", None)).await;
    assert_eq!((status, live["status"].as_str()), (200, Some("awaiting_input")), "{kind}: {live}");
    let answers = double(&a, &b, &start("interrupt", Some("interrupt"))).await;
    let ids: Vec<String> = answers
        .iter()
        .map(|(s, v)| {
            assert_eq!(*s, 201, "{kind}: {v}");
            v["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    let v = until(&b, live["run_id"].as_str().unwrap(), "cancelled").await;
    assert_eq!((v["status"].as_str(), v["error"]["message"].as_str()), (Some("cancelled"), Some("interrupted_by_session")), "{kind}: {v}");
    // The start the store took second interrupted the first: that one ends cancelled, the
    // other runs on (and asks).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (x, y) = loop {
        let (x, y) = (get(&a, &ids[0]).await, get(&a, &ids[1]).await);
        let mut st = [x["status"].as_str().unwrap_or_default().to_owned(), y["status"].as_str().unwrap_or_default().to_owned()];
        st.sort();
        if st == ["awaiting_input", "cancelled"] || Instant::now() > deadline {
            break (x, y);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cancelled = if x["status"] == "cancelled" { &x } else { &y };
    assert_eq!(cancelled["error"]["message"], "interrupted_by_session", "{kind}: {x} {y}");
    assert!([&x, &y].iter().any(|v| v["status"] == "awaiting_input"), "{kind}: {x} {y}");
}

#[tokio::test]
async fn the_fleet_policy_applies_unless_the_contract_says_and_bad_sessions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let stub = asking_stub();
    let (a, _b) = replicas(&db, stub.path(), Some("reject"));
    let (status, first) = post(&a, "/v1/runs?wait=true", start("fleet", None)).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("awaiting_input")), "{first}");
    let (status, busy) = post(&a, "/v1/runs", start("fleet", None)).await;
    assert_eq!((status, busy["error"]["code"].as_str()), (409, Some("session_busy")), "{busy}");
    assert_eq!(post(&a, "/v1/runs", start("fleet", Some("allow"))).await.0, 201, "the contract's policy wins");
    // No session (or an empty one): no policy; a policy named without a session is refused.
    let (status, _) = post(&a, "/v1/runs", json!({"route_id": "support-agent", "goal": {"question": "?"}, "model_profile": "default"})).await;
    assert_eq!(status, 201);
    for _ in 0..2 {
        assert_eq!(post(&a, "/v1/runs?wait=true", start("", None)).await.0, 200, "an empty session is none");
    }
    let (status, v) = post(&a, "/v1/runs", json!({"route_id": "support-agent", "goal": {}, "model_profile": "default", "multitask": "reject"})).await;
    assert_eq!((status, v["error"]["code"].as_str()), (422, Some("invalid_request")), "{v}");
    for (body, code) in
        [(start("a\u{0}b", None), "invalid_request"), (start(&"s".repeat(1025), None), "invalid_request"), (start("x", Some("queue")), "invalid_request")]
    {
        let (status, v) = post(&a, "/v1/runs", body).await;
        assert_eq!((status, v["error"]["code"].as_str()), (422, Some(code)), "{v}");
    }
    let out =
        crate::support::fabric_cli(&["serve", "--listen", "127.0.0.1:0"], &[("FABRIC_SESSION_POLICY", "sometimes".into()), ("FABRIC_LLM_STUB", "1".into())])
            .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("FABRIC_SESSION_POLICY") && err.contains("allow, reject, enqueue or interrupt"), "{err}");
}

/// An interrupting start recorded in the store whose starter went away before it ended the live
/// run (its client disconnected, its replica died): a replica's poll ends the run, and the new
/// one starts.
#[tokio::test]
async fn an_interrupt_whose_starter_went_away_is_finished_by_a_replica() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let stub = asking_stub();
    let (a, _b) = replicas(&db, stub.path(), None);
    let (_, live) = post(&a, "/v1/runs?wait=true", start("gone", None)).await;
    assert_eq!(live["status"], "awaiting_input", "{live}");
    // The start as a starter that stopped right after the store took it leaves it.
    let store = fabric::store::open(&db).await.unwrap();
    let request: fabric::store::StartRequest = serde_json::from_value(start("gone", Some("interrupt"))).unwrap();
    let id = fabric::exec::new_run_id();
    let run = fabric::store::NewRun { session_id: Some("gone"), ..fabric::store::NewRun::new(&id, &request) };
    let made = store.create_session_run(run, None, fabric::config::SessionPolicy::Interrupt, None).await.unwrap();
    assert!(matches!(&made, fabric::store::SessionStart::Created { lease: None, interrupted } if interrupted.len() == 1), "{made:?}");
    let v = until(&a, live["run_id"].as_str().unwrap(), "cancelled").await;
    assert_eq!((v["status"].as_str(), v["error"]["message"].as_str()), (Some("cancelled"), Some("interrupted_by_session")), "{v}");
    assert_eq!(until(&a, &id, "awaiting_input").await["status"], "awaiting_input", "the new run started");
}
