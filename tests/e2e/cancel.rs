//! Cancel on request (`POST /v1/runs/{id}/cancel`, `fabric runs cancel`, `Durable::cancel`)
//! through real `fabric serve` replicas on one store, on SQLite and on PostgreSQL: a run in a
//! slow model call on replica B cancelled through replica A ends `cancelled` at once, its call
//! aborted (the provider sees no further request); an asking run cancelled cannot be replied to;
//! a run whose replica is `kill -9`'d with a cancel request on it is ended `cancelled` by the
//! replica that claims it, not taken over and walked; a queued run ends at once; the answers
//! (202, 200, 409, 404, 422) and the CLI's exit codes.

use std::time::{Duration, Instant};

use fabric::runtime::{Cancelling, Runtime, StartRequest};
use serde_json::{Value, json};

use crate::durable::{store_url, triage};
use crate::service::{Server, TOKEN, asking_stub, client, post};
use crate::support::{Canned, FakeProvider, fabric_cli, packs_dir, routes_dir, triage_reply_for};

/// `POST /v1/runs/{id}/cancel` with `body` (none when `None`): (status, body).
async fn cancel(s: &Server, run_id: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = client().post(format!("{}/v1/runs/{run_id}/cancel", s.url)).bearer_auth(TOKEN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn get(s: &Server, run_id: &str) -> Value {
    client().get(format!("{}/v1/runs/{run_id}", s.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap()
}

/// Polls the run on `s` until its status is not `running`/`queued`, at most `limit`.
async fn settled(s: &Server, run_id: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = get(s, run_id).await;
        if !matches!(v["status"].as_str(), Some("running" | "queued")) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The types of a stored run's events, in order.
async fn kinds(db: &str, run_id: &str) -> Vec<String> {
    let store = fabric::store::open(db).await.unwrap();
    store.events_after(run_id, 0).await.unwrap().into_iter().map(|e| e.kind).collect()
}

/// A provider whose every reply takes 30 s: a call in flight is only ever ended by a cancel.
async fn slow_provider() -> (FakeProvider, Vec<(&'static str, String)>) {
    let fake = FakeProvider::new(|body| {
        let props: Vec<String> =
            body.pointer("/response_format/json_schema/schema/properties").and_then(Value::as_object).map(|m| m.keys().cloned().collect()).unwrap_or_default();
        let reply = json!({"choices": [{"message": {"content": triage_reply_for(&props).to_string()}, "finish_reason": "stop"}]});
        Canned { delay: Duration::from_secs(30), ..Canned::json(200, reply) }
    });
    let url = fake.start().await;
    (fake, crate::support::openai_env(url))
}

#[tokio::test]
async fn a_slow_call_on_one_replica_is_cancelled_through_another_on_sqlite() {
    across_replicas("sqlite").await;
}

#[tokio::test]
async fn a_slow_call_on_one_replica_is_cancelled_through_another_on_postgres() {
    across_replicas("postgres").await;
}

async fn across_replicas(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let (fake, env) = slow_provider().await;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (a, b) = (Server::start(&db, stub.path(), &env), Server::start(&db, stub.path(), &env));
    let (status, started) = post(&b, "/v1/runs", triage(1)).await;
    assert_eq!(status, 201, "{kind}: {started}");
    let id = started["run_id"].as_str().unwrap().to_owned();
    // B's model call is in flight.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.requests().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fake.requests().len(), 1, "{kind}: the first stage's call reached the provider");

    let asked = Instant::now();
    let (status, view) = cancel(&a, &id, Some(json!({"reason": "the user left"}))).await;
    assert_eq!(status, 202, "{kind}: {view}");
    // Ended long before the call's 30 s: the call was aborted, not awaited. (The poll is every
    // second; the bound is loose for a busy machine.)
    let end = settled(&a, &id, Duration::from_secs(15)).await;
    let took = asked.elapsed();
    assert_eq!(end["status"], "cancelled", "{kind}: {end}");
    assert!(took < Duration::from_secs(10), "{kind}: cancelled after {took:?}");
    eprintln!("{kind}: cancelled through the other replica in {took:?}");
    assert_eq!((end["error"]["reason_class"].as_str(), end["error"]["message"].as_str()), (Some("cancelled"), Some("the user left")), "{kind}: {end}");
    let kinds = kinds(&db, &id).await;
    assert_eq!(kinds.last().map(String::as_str), Some("run.cancelled"), "{kind}: {kinds:?}");
    assert!(kinds.contains(&"run.llm.failed".to_owned()), "{kind}: the call in flight ended: {kinds:?}");
    // No further model call: the run did not go on to its next stage.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(fake.requests().len(), 1, "{kind}: the provider saw no further request");
    // Again, on either replica: 200, the run as it is.
    for s in [&a, &b] {
        let (status, again) = cancel(s, &id, None).await;
        assert_eq!((status, again["status"].as_str()), (200, Some("cancelled")), "{kind}: {again}");
    }
    let metrics = client().get(format!("{}/metrics", b.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fabric_runs_finished_total{route=\"support-triage\",status=\"cancelled\"} 1"), "{kind}: {metrics}");
}

#[tokio::test]
async fn an_asking_run_cancelled_cannot_be_replied_to_and_the_answers_on_sqlite() {
    asking_and_answers("sqlite").await;
}

#[tokio::test]
async fn an_asking_run_cancelled_cannot_be_replied_to_and_the_answers_on_postgres() {
    asking_and_answers("postgres").await;
}

async fn asking_and_answers(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_LOG", "warn")];
    let (a, b) = (Server::start(&db, stub.path(), &env), Server::start(&db, stub.path(), &env));
    let (status, asked) =
        post(&b, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!((status, asked["status"].as_str()), (200, Some("awaiting_input")), "{kind}: {asked}");
    let id = asked["run_id"].as_str().unwrap();
    // No body: the default reason; the run ends at once (nobody executes it).
    let (status, view) = cancel(&a, id, None).await;
    assert_eq!((status, view["status"].as_str(), view["error"]["message"].as_str()), (202, Some("cancelled"), Some("cancelled by request")), "{kind}: {view}");
    let (status, refused) = post(&b, &format!("/v1/runs/{id}/reply"), json!({"message": "order 42"})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("not_waiting")), "{kind}: {refused}");
    let kinds = kinds(&db, id).await;
    assert_eq!(&kinds[kinds.len() - 2..], ["run.awaiting_input", "run.cancelled"], "{kind}: {kinds:?}");
    let (status, again) = cancel(&b, id, Some(json!({"reason": "twice"}))).await;
    assert_eq!((status, again["error"]["message"].as_str()), (200, Some("cancelled by request")), "{kind}: the first reason stays: {again}");

    // A run that ended otherwise: 409; an unknown run: 404; a bad body: 422; a text body: 415.
    let (_, done) = post(&a, "/v1/runs?wait=true", triage(2)).await;
    assert_eq!(done["status"], "completed", "{kind}: {done}");
    let (status, e) = cancel(&a, done["run_id"].as_str().unwrap(), None).await;
    assert_eq!((status, e["error"]["code"].as_str()), (409, Some("not_cancellable")), "{kind}: {e}");
    let (status, e) = cancel(&a, &fabric::exec::new_run_id(), None).await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("not_found")), "{kind}: {e}");
    let (status, e) = cancel(&a, "not-a-run", None).await;
    assert_eq!(status, 404, "{kind}: {e}");
    for bad in [json!({"why": "x"}), json!({"reason": 7}), json!({"reason": "r".repeat(1025)}), json!({"reason": "a\0b"})] {
        let (_, run) = post(&a, "/v1/runs", triage(3)).await;
        let (status, e) = cancel(&a, run["run_id"].as_str().unwrap(), Some(bad.clone())).await;
        assert_eq!((status, e["error"]["code"].as_str()), (422, Some("invalid_request")), "{kind}: {bad}: {e}");
    }
    let r = client().post(format!("{}/v1/runs/{id}/cancel", a.url)).bearer_auth(TOKEN).body("reason").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 415, "{kind}");
    let r = client().post(format!("{}/v1/runs/{id}/cancel", a.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401, "{kind}: the token is needed");
}

#[tokio::test]
async fn a_run_whose_replica_dies_with_a_cancel_request_is_ended_not_taken_over_on_sqlite() {
    killed_with_a_request("sqlite").await;
}

#[tokio::test]
async fn a_run_whose_replica_dies_with_a_cancel_request_is_ended_not_taken_over_on_postgres() {
    killed_with_a_request("postgres").await;
}

async fn killed_with_a_request(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let slow = [("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_LLM_STUB_LATENCY_MS", "30000"), ("FABRIC_LOG", "warn")];
    let b = Server::start(&db, stub.path(), &slow);
    let (status, started) = post(&b, "/v1/runs", triage(1)).await;
    assert_eq!(status, 201, "{kind}: {started}");
    let id = started["run_id"].as_str().unwrap().to_owned();
    // B stops before it can see the request, and dies with it unseen.
    b.signal("STOP");
    let a = Server::start(&db, stub.path(), &[("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_CLAIM_POLL_MS", "100"), ("FABRIC_LOG", "warn")]);
    let (status, view) = cancel(&a, &id, Some(json!({"reason": "stop it"}))).await;
    assert_eq!((status, view["status"].as_str()), (202, Some("running")), "{kind}: requested: {view}");
    b.signal("KILL");
    // A claims the run once B's lease runs out, and ends it without a walk.
    let end = settled(&a, &id, Duration::from_secs(30)).await;
    assert_eq!((end["status"].as_str(), end["error"]["message"].as_str()), (Some("cancelled"), Some("stop it")), "{kind}: {end}");
    let kinds = kinds(&db, &id).await;
    // B committed nothing (its first stage never ended); A wrote only the end.
    assert_eq!(kinds, ["run.cancelled"], "{kind}: never walked again");
    assert_eq!(kinds.last().map(String::as_str), Some("run.cancelled"), "{kind}: {kinds:?}");
    let metrics = client().get(format!("{}/metrics", a.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("fabric_model_call_duration_seconds_count{route=\"support-triage\"}"), "{kind}: A made no model call: {metrics}");
    // And it stays so: nothing claims a cancelled run.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let store = fabric::store::open(&db).await.unwrap();
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status.as_str(), run.lease_token), ("cancelled", 2), "{kind}: claimed once by A, to end it");
}

#[tokio::test]
async fn a_queued_run_is_cancelled_at_once_and_never_claimed_on_sqlite() {
    queued("sqlite").await;
}

#[tokio::test]
async fn a_queued_run_is_cancelled_at_once_and_never_claimed_on_postgres() {
    queued("postgres").await;
}

async fn queued(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let store = fabric::store::open(&db).await.unwrap();
    let settings = fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let rt = fabric::runtime::Durable::new(Runtime::builder().settings(settings).catalogue_dirs(routes_dir(), packs_dir()).build().unwrap(), store.clone());
    let req: StartRequest = serde_json::from_value(triage(1)).unwrap();
    let accepted = rt.accept(&req, false).await.unwrap();
    assert!(accepted.lease.is_none(), "{kind}: queued");
    let Cancelling::Ended(result) = rt.cancel(&accepted.run_id, Some("  not needed  "), std::sync::Arc::new(fabric::events::NullSink)).await.unwrap() else {
        panic!("{kind}: a queued run ends at once")
    };
    assert_eq!(result.status(), fabric::exec::RunStatus::Cancelled, "{kind}");
    assert_eq!(result.error().map(|e| e.message.as_str()), Some("not needed"), "{kind}: trimmed");
    assert!(rt.claim_runs(10).await.unwrap().is_empty(), "{kind}: nothing to claim");
    let run = store.get_run(&accepted.run_id).await.unwrap().unwrap();
    assert_eq!(
        (run.status.as_str(), run.reason_class.map(|c| c.as_str()), run.cancel_reason.as_deref()),
        ("cancelled", Some("cancelled"), Some("not needed")),
        "{kind}"
    );
    assert!(matches!(rt.cancel(&accepted.run_id, None, std::sync::Arc::new(fabric::events::NullSink)).await, Ok(Cancelling::Already)), "{kind}");
}

#[tokio::test]
async fn fabric_runs_cancel_ends_a_recorded_run_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    // `fabric run --store` in a slow model call; `fabric runs cancel` from another process.
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(crate::support::repo())
        .envs(crate::support::fixture_env())
        .env("FABRIC_LLM_STUB", "1")
        .env("FABRIC_LLM_STUB_LATENCY_MS", "30000")
        .env("FABRIC_RUN_LEASE_S", "3")
        .args(["run", "support-triage", "--goal", r#"{"ticket":"x"}"#, "--store", &db])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let store = loop {
        if let Ok(s) = fabric::store::open_existing(&db).await
            && let Ok(runs) = s.list_runs(&fabric::store::RunFilter { limit: 1, ..Default::default() }).await
            && !runs.is_empty()
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let id = store.list_runs(&fabric::store::RunFilter { limit: 1, ..Default::default() }).await.unwrap()[0].run_id.clone();
    let env = crate::support::fixture_env().to_vec();
    let o = fabric_cli(&["runs", "cancel", &id, "--store", &db, "--reason", "enough"], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cancel requested"), "{}", String::from_utf8_lossy(&o.stderr));
    // The run's process sees the request at its next lease beat (a second here) and exits 5.
    let out = tokio::time::timeout(Duration::from_secs(20), run.wait_with_output()).await.expect("the run ends").unwrap();
    assert_eq!(out.status.code(), Some(5), "exit code of a cancelled run");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((result["status"].as_str(), result["error"]["message"].as_str()), (Some("cancelled"), Some("enough")), "{result}");
    // Again: cancelled already (0); a bad id (2); `--status cancelled` lists it.
    let o = fabric_cli(&["runs", "cancel", &id, "--store", &db], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cancelled already"));
    let o = fabric_cli(&["runs", "cancel", "nope", "--store", &db], &env).await;
    assert_eq!(o.status.code(), Some(2));
    let o = fabric_cli(&["runs", "list", "--status", "cancelled", "--store", &db], &env).await;
    assert!(String::from_utf8_lossy(&o.stdout).contains(&id), "{}", String::from_utf8_lossy(&o.stdout));
}

/// A run that asked before its holder saw a cancel request made while it ran: the request stands.
/// A reply ends it `cancelled` (409) instead of continuing it, and a second cancel keeps the
/// first reason.
#[tokio::test]
async fn a_request_made_while_a_run_ran_stands_after_it_asks_on_every_store() {
    let (stores, _dir) = crate::store::stores().await;
    let stub = asking_stub();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let rt = crate::store::runtime(store.clone(), stub.path());
        let other = crate::store::runtime(store.clone(), stub.path());
        for then_reply in [true, false] {
            let req = crate::store::start("support-agent", json!({"question": "refund?"}));
            let accepted = rt.accept(&req, true).await.unwrap();
            let lease = accepted.lease.unwrap();
            let id = accepted.run_id.clone();
            let asked = other.cancel(&id, Some("first"), std::sync::Arc::new(fabric::events::NullSink)).await.unwrap();
            assert!(matches!(&asked, Cancelling::Requested { reason } if reason == "first"), "{name}: {asked:?}");
            // Its holder never polls here: the run asks, with the request on it.
            let out =
                rt.execute(&lease, &req, &accepted.edition, std::sync::Arc::new(fabric::events::NullSink), fabric::cancel::Cancel::never()).await.unwrap();
            assert_eq!(out.result.status(), fabric::exec::RunStatus::AwaitingInput, "{name}");
            if then_reply {
                let refused = rt.claim_reply(&id, "order 42".into()).await.unwrap_err();
                assert!(matches!(&refused, fabric::runtime::ReplyError::NotWaiting { status: "cancelled", .. }), "{name}: {refused}");
            } else {
                let second = rt.cancel(&id, Some("second"), std::sync::Arc::new(fabric::events::NullSink)).await.unwrap();
                assert!(matches!(second, Cancelling::Ended(_)), "{name}: {second:?}");
            }
            let run = store.get_run(&id).await.unwrap().unwrap();
            let message = run.result.as_ref().and_then(|r| r.error()).map(|e| e.message.clone());
            assert_eq!((run.status.as_str(), message.as_deref()), ("cancelled", Some("first")), "{name}: the first reason stays");
        }
    }
}
