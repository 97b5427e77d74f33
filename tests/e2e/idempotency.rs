//! Idempotent starts (`Idempotency-Key`) through real `fabric serve` replicas on one store, on
//! SQLite and on PostgreSQL: a key sent many times at once to two replicas makes one run; a
//! retry answers with that run (200, `Idempotent-Replayed`, the same `Location`), or waits for
//! its result; another contract with the key is refused; a bad key is 400.

use std::time::Duration;

use fabric::store::{Holder, IdempotencyKey, Keyed, NewRun};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::durable::{store_url, triage};
use crate::service::{Server, TOKEN, asking_stub, client};

/// A keyed start: (status, `Idempotent-Replayed`, `Location`, body).
async fn start(s: &Server, path: &str, key: &str, body: &Value) -> (u16, Option<String>, Option<String>, Value) {
    let r = client().post(format!("{}{path}", s.url)).bearer_auth(TOKEN).header("Idempotency-Key", key).json(body).send().await.unwrap();
    let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (replayed, location) = (header("idempotent-replayed"), header("location"));
    (r.status().as_u16(), replayed, location, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn one_key_sent_twenty_times_at_once_to_two_replicas_makes_one_run_on_sqlite() {
    twenty_at_once("sqlite").await;
}

#[tokio::test]
async fn one_key_sent_twenty_times_at_once_to_two_replicas_makes_one_run_on_postgres() {
    twenty_at_once("postgres").await;
}

async fn twenty_at_once(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_LLM_STUB_LATENCY_MS", "20"), ("FABRIC_LOG", "warn")];
    let servers = [Server::start(&db, stub.path(), &env), Server::start(&db, stub.path(), &env)];
    // Several keys, each raced by 20 requests across both replicas: one run per key.
    for round in 0..3 {
        let key = format!("order-{round}-{kind}");
        let body = triage(round);
        let tries = (0..20).map(|k| start(&servers[k % 2], "/v1/runs", &key, &body));
        let answers: Vec<_> = futures_util::stream::iter(tries).buffer_unordered(20).collect().await;
        let ids: std::collections::BTreeSet<String> = answers.iter().map(|a| a.3["run_id"].as_str().unwrap_or_default().to_owned()).collect();
        assert_eq!(ids.len(), 1, "{kind}: one run for key {key}: {answers:?}");
        let id = ids.into_iter().next().unwrap();
        let created = answers.iter().filter(|a| a.0 == 201).count();
        assert_eq!(created, 1, "{kind}: one 201, the others replayed: {answers:?}");
        for (status, replayed, location, body) in &answers {
            assert_eq!(location.as_deref(), Some(format!("/v1/runs/{id}").as_str()), "{kind}: {body}");
            if *status == 200 {
                assert_eq!(replayed.as_deref(), Some("true"), "{kind}: {body}");
            } else {
                assert_eq!((*status, replayed.as_deref()), (201, None), "{kind}: {body}");
            }
        }
    }
    // The store agrees: three runs, no more.
    let store = fabric::store::open(&db).await.unwrap();
    let runs = store.list_runs(&fabric::store::RunFilter { limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(runs.len(), 3, "{kind}");
}

#[tokio::test]
async fn a_retry_waits_for_the_result_and_another_contract_is_refused_on_sqlite() {
    retries("sqlite").await;
}

#[tokio::test]
async fn a_retry_waits_for_the_result_and_another_contract_is_refused_on_postgres() {
    retries("postgres").await;
}

async fn retries(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let stub = asking_stub();
    let env = [("FABRIC_LOG", "warn")];
    let (a, b) = (Server::start(&db, stub.path(), &env), Server::start(&db, stub.path(), &env));
    let body = triage(1);
    let (status, _, _, first) = start(&a, "/v1/runs?wait=true", "k-1", &body).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("completed")), "{kind}: {first}");
    // After it ended, on the other replica, with wait: its result, marked as a replay.
    let (status, replayed, _, again) = start(&b, "/v1/runs?wait=true", "k-1", &body).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("true")), "{kind}: {again}");
    assert_eq!((&again["run_id"], &again["output"]), (&first["run_id"], &first["output"]), "{kind}");
    // The same contract written otherwise (keys in another order, spaces) is the same contract.
    let reordered = r#"{ "model_profile": "default", "goal": {"ticket": "ticket 1"}, "route_id": "support-triage" }"#;
    let r = client()
        .post(format!("{}/v1/runs", b.url))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "k-1")
        .header("content-type", "application/json")
        .body(reordered)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{kind}: {}", r.text().await.unwrap());
    // Another contract with the key: refused, naming the run; nothing started.
    let (status, _, _, refused) = start(&b, "/v1/runs", "k-1", &triage(2)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{kind}: {refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains(first["run_id"].as_str().unwrap()), "{refused}");
    // Keys that are not 1 to 255 visible ASCII characters: 400, nothing started.
    for bad in ["", "has space", &"x".repeat(256), "tab\there"] {
        let (status, _, _, e) = start(&a, "/v1/runs", bad, &body).await;
        assert_eq!((status, e["error"]["code"].as_str()), (400, Some("invalid_request")), "{kind}: {bad:?}: {e}");
    }
    let r = client().post(format!("{}/v1/runs", a.url)).bearer_auth(TOKEN).header("Idempotency-Key", "a").header("Idempotency-Key", "b").json(&body);
    assert_eq!(r.send().await.unwrap().status().as_u16(), 400, "{kind}: two keys");
    let store = fabric::store::open(&db).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.list_runs(&fabric::store::RunFilter { limit: 100, ..Default::default() }).await.unwrap().len(), 1, "{kind}");
}

/// The store's constraint alone (no look-up first): two stores on one database, as two replicas
/// have, racing `create_keyed_run` with one key create one run; the others get it back.
#[tokio::test]
async fn racing_keyed_creates_on_two_stores_make_one_run_on_every_store() {
    let (stores, _dir) = crate::store::stores().await;
    for (name, url) in stores {
        let (one, two) = (fabric::store::open(&url).await.unwrap(), fabric::store::open(&url).await.unwrap());
        let key = IdempotencyKey::parse("race-1").unwrap();
        let holder = Holder::new(Duration::from_secs(30));
        let request = fabric::store::StartRequest { route_id: "r".into(), ..Default::default() };
        let ids: Vec<String> = (0..12).map(|_| fabric::exec::new_run_id()).collect();
        let creates = ids.iter().enumerate().map(|(k, id)| {
            let store = if k % 2 == 0 { &one } else { &two };
            store.create_keyed_run(NewRun::new(id, &request), Some(&holder), &key)
        });
        let outcomes = futures_util::future::join_all(creates).await;
        let created: Vec<&String> = ids.iter().zip(&outcomes).filter(|(_, o)| matches!(o, Ok(Keyed::Created(Some(_))))).map(|(id, _)| id).collect();
        assert_eq!(created.len(), 1, "{name}: {outcomes:?}");
        for o in &outcomes {
            match o {
                Ok(Keyed::Existing(run)) => assert_eq!(&run.run_id, created[0], "{name}"),
                Ok(Keyed::Created(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
        // Keyless runs never conflict; another key is another run.
        one.create_run(NewRun::new(&fabric::exec::new_run_id(), &request), None).await.unwrap();
        one.create_run(NewRun::new(&fabric::exec::new_run_id(), &request), None).await.unwrap();
        let other = IdempotencyKey::parse("race-2").unwrap();
        assert!(matches!(two.create_keyed_run(NewRun::new(&fabric::exec::new_run_id(), &request), None, &other).await, Ok(Keyed::Created(None))), "{name}");
        assert_eq!(one.list_runs(&fabric::store::RunFilter { limit: 100, ..Default::default() }).await.unwrap().len(), 4, "{name}");
        assert_eq!(one.run_of_key(&key).await.unwrap().map(|r| r.run_id).as_ref(), Some(created[0]), "{name}");
    }
}

/// A retry is compared with its key's run as the service reads a start, not as it was written
/// (issue 46): an empty `session_id` is none, `multitask: allow` without a session is none, and
/// a `webhook_url` is the URL the service parses (the scheme's case, blanks, `/./`). What
/// differs in what the service does is still refused.
#[tokio::test]
async fn a_retry_written_otherwise_but_read_alike_is_the_same_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let env = [
        ("FABRIC_LOG", "warn"),
        ("FABRIC_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", "http://127.0.0.1:9"),
        ("FABRIC_WEBHOOK_MAX_ATTEMPTS", "1"),
    ];
    let server = Server::start(&db, stub.path(), &env);
    let with = |extra: Value| {
        let mut body = triage(7);
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let alike = [
        (json!({"session_id": ""}), json!({})),
        (json!({}), json!({"session_id": ""})),
        (json!({"multitask": "allow"}), json!({})),
        (json!({"session_id": "s-1", "multitask": "allow"}), json!({"session_id": "s-1"})),
        (json!({"webhook_url": "HTTP://127.0.0.1:9/h"}), json!({"webhook_url": " http://127.0.0.1:9/./h"})),
    ];
    for (k, (first, retry)) in alike.into_iter().enumerate() {
        let key = format!("alike-{k}");
        let (status, _, _, run) = start(&server, "/v1/runs?wait=true", &key, &with(first.clone())).await;
        assert_eq!(status, 200, "{first}: {run}");
        let (status, replayed, _, again) = start(&server, "/v1/runs?wait=true", &key, &with(retry.clone())).await;
        assert_eq!((status, replayed.as_deref()), (200, Some("true")), "{first} then {retry}: {again}");
        assert_eq!(again["run_id"], run["run_id"]);
    }
    let unlike = [
        (json!({"session_id": "s-2"}), json!({})),
        (json!({"session_id": "s-3", "multitask": "reject"}), json!({"session_id": "s-3"})),
        (json!({"webhook_url": "http://127.0.0.1:9/h"}), json!({"webhook_url": "http://127.0.0.1:9/other"})),
    ];
    for (k, (first, retry)) in unlike.into_iter().enumerate() {
        let key = format!("unlike-{k}");
        let (status, _, _, run) = start(&server, "/v1/runs?wait=true", &key, &with(first.clone())).await;
        assert_eq!(status, 200, "{first}: {run}");
        let (status, _, _, refused) = start(&server, "/v1/runs", &key, &with(retry.clone())).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{first} then {retry}: {refused}");
    }
}
