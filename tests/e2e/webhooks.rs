//! Completion webhooks through real `fabric serve` replicas, on SQLite and on PostgreSQL: every
//! delivery is checked by the Standard Webhooks reference library for Python (`standardwebhooks`,
//! in a venv of its own), never by the runtime's code. A receiver answering 500 twice gets three
//! deliveries with one `webhook-id`; a delivery in flight when its replica is `kill -9`'d is sent
//! after a restart; a `webhook_url` outside the allowed origins is refused at start; a redirect is
//! not followed; a run that asks, then ends, sends one delivery each; retention deletes them; the
//! example receiver (`examples/webhook-receiver/receiver.py`) verifies a real delivery.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::durable::{store_url, triage};
use crate::service::{Server, TOKEN, asking_stub, client, post};
use crate::support::repo;

/// A Standard Webhooks secret (24 bytes), as `whsec_` and base64.
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The Python of a venv with the reference library (`support::python_venv`).
pub(crate) fn reference_python() -> Option<PathBuf> {
    let why = "the webhook tests verify deliveries with Python's standardwebhooks";
    crate::support::python_venv("standardwebhooks-venv", "standardwebhooks==1.1.0", "import standardwebhooks", why)
}

/// A delivery as the receiver got it: its headers (lowercase names) and its body, as sent.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: String,
}

/// An answer: a status, and a `Location` for a redirect.
type Answer = (u16, Option<String>);

/// A webhook receiver on loopback: records every POST, answers the queued statuses (with a
/// `Location` for a redirect) first, 204 after.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    answers: Arc<Mutex<Vec<Answer>>>,
    /// How long each answer takes.
    delay: Duration,
}

impl Receiver {
    fn answering(answers: &[(u16, Option<&str>)]) -> Receiver {
        let r = Receiver::default();
        *r.answers.lock().unwrap() = answers.iter().rev().map(|(s, l)| (*s, l.map(str::to_owned))).collect();
        r
    }

    /// Serves on `listener`; returns its URL.
    fn serve(&self, listener: tokio::net::TcpListener) -> String {
        let me = self.clone();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let me = me.clone();
            async move {
                let headers = headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned())).collect();
                me.got.lock().unwrap().push(Got { headers, body: String::from_utf8_lossy(&body).into_owned() });
                let (status, location) = me.answers.lock().unwrap().pop().unwrap_or((204, None));
                tokio::time::sleep(me.delay).await;
                let mut r = axum::response::Response::builder().status(status);
                if let Some(l) = location {
                    r = r.header("location", l);
                }
                r.body(axum::body::Body::empty()).unwrap()
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    pub(crate) async fn start(&self) -> String {
        self.serve(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `n` deliveries came, at most `limit`.
    pub(crate) async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Got> {
        let deadline = Instant::now() + limit;
        while self.got().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.got()
    }
}

/// The payloads of `got`, each verified by the reference library (the test fails on any that
/// does not verify).
pub(crate) fn verified(python: &std::path::Path, got: &[Got]) -> Vec<Value> {
    let input = json!({"secret": SECRET, "deliveries": got.iter().map(|g| json!({"headers": g.headers, "body": g.body})).collect::<Vec<_>>()});
    let out = crate::support::run_python(python, &repo().join("tests/fixtures/webhooks/verify.py"), &input.to_string());
    assert!(out.status.success(), "standardwebhooks refused a delivery: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn webhook_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("FABRIC_WEBHOOK_URL", url.to_owned()),
        ("FABRIC_WEBHOOK_SECRET", SECRET.to_owned()),
        ("FABRIC_WEBHOOK_BACKOFF_BASE_S", "1".to_owned()),
        ("FABRIC_WEBHOOK_BACKOFF_MAX_S", "2".to_owned()),
        ("FABRIC_LOG", "info".to_owned()),
    ]
}

fn pairs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

async fn deliveries(s: &Server, run_id: &str) -> (u16, Value) {
    let r = client().get(format!("{}/v1/runs/{run_id}/webhooks", s.url)).bearer_auth(TOKEN).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Polls the run's deliveries until `done(list)`, at most `limit`.
async fn deliveries_until(s: &Server, run_id: &str, limit: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let (status, body) = deliveries(s, run_id).await;
        assert_eq!(status, 200, "{body}");
        let list = body["webhooks"].as_array().cloned().unwrap_or_default();
        if done(&list) || Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics(s: &Server) -> String {
    client().get(format!("{}/metrics", s.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn a_receiver_answering_500_twice_gets_three_signed_deliveries_with_one_id_on_sqlite() {
    retried("sqlite").await;
}

#[tokio::test]
async fn a_receiver_answering_500_twice_gets_three_signed_deliveries_with_one_id_on_postgres() {
    retried("postgres").await;
}

async fn retried(kind: &str) {
    let Some(python) = reference_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let receiver = Receiver::answering(&[(500, None), (500, None)]);
    let url = receiver.start().await;
    let env = webhook_env(&format!("{url}/hooks?token=sekrit-query"));
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));
    let (status, run) = post(&server, "/v1/runs?wait=true", triage(1)).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{kind}: {run}");
    let id = run["run_id"].as_str().unwrap();

    let got = receiver.wait_for(3, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 3, "{kind}: {got:?}");
    let ids: Vec<&str> = got.iter().map(|g| g.headers["webhook-id"].as_str()).collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "{kind}: one webhook-id on every attempt: {ids:?}");
    for payload in verified(&python, &got) {
        assert_eq!(payload["type"], "run.completed", "{kind}: {payload}");
        // `data` is the run as GET /v1/runs/{id} shows it.
        assert_eq!(payload["data"], run, "{kind}");
        assert_eq!(payload["timestamp"], run["updated_at"], "{kind}");
    }
    assert_eq!(got[0].headers["content-type"], "application/json");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.got().len(), 3, "{kind}: no delivery after the 2xx");

    let list = deliveries_until(&server, id, Duration::from_secs(10), |l| l.first().is_some_and(|d| d["state"] == "delivered")).await;
    assert_eq!(list.len(), 1, "{kind}: {list:?}");
    let d = &list[0];
    assert_eq!((d["state"].as_str(), d["attempts"].as_u64(), d["last_status"].as_u64()), (Some("delivered"), Some(3), Some(204)), "{kind}: {d}");
    assert_eq!((d["webhook_id"].as_str(), d["type"].as_str()), (Some(ids[0]), Some("run.completed")), "{kind}: {d}");
    assert_eq!(d["url"], format!("{url}/hooks"), "{kind}: the query is not shown: {d}");
    let m = metrics(&server).await;
    for line in ["fabric_webhook_deliveries_total{outcome=\"delivered\"} 1", "fabric_webhook_deliveries_total{outcome=\"retrying\"} 2"] {
        assert!(m.contains(line), "{kind}: {line} in {m}");
    }
    // Retention deletes the run's deliveries with it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = crate::support::fabric_cli(&["runs", "prune", "--older-than", "1s"], &[("FABRIC_DATABASE_URL", db.clone())]).await;
    assert!(out.status.success(), "{kind}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(deliveries(&server, id).await.0, 404, "{kind}");
    let (_, logs) = server.stop();
    assert!(!logs.contains("sekrit-query") && !logs.contains("MfKQ9r8G"), "{kind}: a secret in the logs: {logs}");
}

#[tokio::test]
async fn a_delivery_whose_replica_was_killed_mid_post_is_sent_after_a_restart_on_sqlite() {
    killed("sqlite").await;
}

#[tokio::test]
async fn a_delivery_whose_replica_was_killed_mid_post_is_sent_after_a_restart_on_postgres() {
    killed("postgres").await;
}

/// The receiver's port first holds a listener that never answers: the replica's POST hangs,
/// claimed under its lease, when it is `kill -9`'d. The next start claims it once the lease
/// expired and delivers it to the real receiver, now on that port.
async fn killed(kind: &str) {
    let Some(python) = reference_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = black_hole.local_addr().unwrap();
    let mut env = webhook_env(&format!("http://{addr}/hooks"));
    env.push(("FABRIC_RUN_LEASE_S", "2".to_owned()));
    let stub = asking_stub();
    let first = Server::start(&db, stub.path(), &pairs(&env));
    let (status, run) = post(&first, "/v1/runs?wait=true", triage(1)).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{kind}: {run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let pending = deliveries_until(&first, &id, Duration::from_secs(10), |l| !l.is_empty()).await;
    assert_eq!((pending.len(), pending[0]["state"].as_str()), (1, Some("pending")), "{kind}: {pending:?}");
    // The POST is in flight (the black hole took the connection and never answers).
    tokio::time::sleep(Duration::from_millis(700)).await;
    first.signal("KILL");
    drop(black_hole);
    let receiver = Receiver::default();
    receiver.serve(tokio::net::TcpListener::bind(addr).await.unwrap());

    let second = Server::start(&db, stub.path(), &pairs(&env));
    let got = receiver.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1, "{kind}: delivered after the restart: {got:?}");
    assert_eq!(got[0].headers["webhook-id"], pending[0]["webhook_id"].as_str().unwrap(), "{kind}");
    let payload = &verified(&python, &got)[0];
    assert_eq!((payload["type"].as_str(), payload["data"]["run_id"].as_str()), (Some("run.completed"), Some(id.as_str())), "{kind}: {payload}");
    let list = deliveries_until(&second, &id, Duration::from_secs(10), |l| l[0]["state"] == "delivered").await;
    assert_eq!(list[0]["state"], "delivered", "{kind}: {list:?}");
}

#[tokio::test]
async fn contract_urls_must_be_of_an_allowed_origin_and_asks_and_cancels_are_delivered() {
    let Some(python) = reference_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let (fleet, mine) = (Receiver::default(), Receiver::default());
    let (fleet_url, mine_url) = (fleet.start().await, mine.start().await);
    let mut env = webhook_env(&format!("{fleet_url}/fleet"));
    env.push(("FABRIC_WEBHOOK_ALLOWED_ORIGINS", format!("https://hooks.example.com,{mine_url}")));
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));

    let asking = |hook: &str| json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default", "webhook_url": hook});
    for refused in ["http://127.0.0.1:1/h".to_owned(), format!("{}/x", mine_url.replace("127.0.0.1", "localhost")), "https://evil.example/h".into()] {
        let (status, body) = post(&server, "/v1/runs", asking(&refused)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (422, Some("webhook_not_allowed")), "{refused}: {body}");
    }
    let (status, body) = post(&server, "/v1/runs", asking("not a url")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_request")), "{body}");

    // A run that asks: one delivery, to the contract's URL; the reply's end: another.
    let (status, asked) = post(&server, "/v1/runs?wait=true", asking(&format!("{mine_url}/mine?k=v"))).await;
    assert_eq!((status, asked["status"].as_str()), (200, Some("awaiting_input")), "{asked}");
    let id = asked["run_id"].as_str().unwrap().to_owned();
    let got = mine.wait_for(1, Duration::from_secs(20)).await;
    let first = &verified(&python, &got)[0];
    assert_eq!((first["type"].as_str(), first["data"]["question"].as_str()), (Some("run.awaiting_input"), asked["question"].as_str()), "{first}");
    let record: Value = client().get(format!("{}/v1/runs/{id}/record", server.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
    assert_eq!(record["request"]["webhook_url"], format!("{mine_url}/mine"), "the record shows no query: {record}");
    let (status, _) = post(&server, &format!("/v1/runs/{id}/cancel"), json!({"reason": "user left"})).await;
    assert_eq!(status, 202);
    let got = mine.wait_for(2, Duration::from_secs(20)).await;
    let payloads = verified(&python, &got);
    assert_eq!(payloads.len(), 2, "{payloads:?}");
    assert_eq!(
        (payloads[1]["type"].as_str(), payloads[1]["data"]["error"]["message"].as_str()),
        (Some("run.cancelled"), Some("user left")),
        "{:?}",
        payloads[1]
    );
    assert_ne!(got[0].headers["webhook-id"], got[1].headers["webhook-id"], "one id per delivery");
    // The payload of the question still shows the run as it was then.
    assert_eq!(payloads[0]["data"]["status"], "awaiting_input");

    // Without a webhook_url, the fleet's.
    let (status, run) = post(&server, "/v1/runs?wait=true", triage(2)).await;
    assert_eq!(status, 200, "{run}");
    let got = fleet.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(verified(&python, &got)[0]["data"]["run_id"], run["run_id"]);
    assert_eq!(mine.got().len(), 2, "the contract's receiver got only its run's");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_delivery_gives_up_after_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let elsewhere = Receiver::default();
    let elsewhere_url = elsewhere.start().await;
    let target = format!("{elsewhere_url}/stolen");
    let receiver = Receiver::answering(&[(307, Some(&target)), (308, Some(&target))]);
    let url = receiver.start().await;
    let mut env = webhook_env(&format!("{url}/hooks"));
    env.push(("FABRIC_WEBHOOK_MAX_ATTEMPTS", "2".to_owned()));
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));
    let (_, run) = post(&server, "/v1/runs?wait=true", triage(1)).await;
    let id = run["run_id"].as_str().unwrap();
    let list = deliveries_until(&server, id, Duration::from_secs(20), |l| l.first().is_some_and(|d| d["state"] == "failed")).await;
    let d = &list[0];
    assert_eq!((d["state"].as_str(), d["attempts"].as_u64(), d["last_status"].as_u64()), (Some("failed"), Some(2), Some(308)), "{d}");
    assert!(d["last_error"].as_str().unwrap().contains("redirect: not followed"), "{d}");
    assert!(d["done_at"].is_string() && d["next_attempt_at"].is_null(), "{d}");
    assert_eq!(receiver.got().len(), 2);
    assert!(elsewhere.got().is_empty(), "the redirect's target got nothing");
    let m = metrics(&server).await;
    for line in ["fabric_webhook_deliveries_total{outcome=\"retrying\"} 1", "fabric_webhook_deliveries_total{outcome=\"failed\"} 1"] {
        assert!(m.contains(line), "{line} in {m}");
    }
}

#[tokio::test]
async fn the_example_receiver_verifies_a_real_delivery() {
    let Some(python) = reference_python() else { return };
    let mut receiver = tokio::process::Command::new(&python)
        .arg(repo().join("examples/webhook-receiver/receiver.py"))
        .arg("0")
        .env("FABRIC_WEBHOOK_SECRET", SECRET)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(receiver.stdout.take().unwrap()).lines();
    let url = lines.next_line().await.unwrap().unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let env = webhook_env(&url);
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));
    let (_, run) = post(&server, "/v1/runs?wait=true", triage(1)).await;
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.expect("a delivery within 20 s").unwrap().unwrap();
    let line: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["run_id"], run["run_id"], "{line}");
    assert_eq!((line["type"].as_str(), line["status"].as_str(), line["duplicate"].as_bool()), (Some("run.completed"), Some("completed"), Some(false)));
    let list = deliveries_until(&server, run["run_id"].as_str().unwrap(), Duration::from_secs(10), |l| l[0]["state"] == "delivered").await;
    assert_eq!(list[0]["last_status"], 204, "{list:?}");
}

#[tokio::test]
async fn a_slow_answer_is_recorded_once_though_the_run_lease_is_shorter_on_sqlite() {
    slow_answer("sqlite").await;
}

#[tokio::test]
async fn a_slow_answer_is_recorded_once_though_the_run_lease_is_shorter_on_postgres() {
    slow_answer("postgres").await;
}

/// A receiver that takes 4 s to answer, two replicas with a 1 s run lease: the delivery's claim
/// outlasts the attempt (at least its timeout), so the other replica does not send it again.
async fn slow_answer(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let receiver = Receiver { delay: Duration::from_secs(4), ..Receiver::default() };
    let url = receiver.start().await;
    let mut env = webhook_env(&format!("{url}/slow"));
    env.push(("FABRIC_RUN_LEASE_S", "1".to_owned()));
    let stub = asking_stub();
    let (a, b) = (Server::start(&db, stub.path(), &pairs(&env)), Server::start(&db, stub.path(), &pairs(&env)));
    let (_, run) = post(&a, "/v1/runs?wait=true", triage(1)).await;
    let id = run["run_id"].as_str().unwrap();
    let list = deliveries_until(&b, id, Duration::from_secs(30), |l| l.first().is_some_and(|d| d["state"] == "delivered")).await;
    assert_eq!((list[0]["state"].as_str(), list[0]["attempts"].as_u64()), (Some("delivered"), Some(1)), "{kind}: {list:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.got().len(), 1, "{kind}: sent once");
}

/// A receiver that accepts connections and never answers (a listener nobody accepts on: the
/// kernel completes the handshakes), its URL, and the settings of a fleet whose own receiver is
/// `fine` and which allows the silent one's origin.
struct Silent {
    _listener: std::net::TcpListener,
    url: String,
    env: Vec<(&'static str, String)>,
}

impl Silent {
    fn beside(fine_url: &str) -> Silent {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut env = webhook_env(&format!("{fine_url}/fleet"));
        env.push(("FABRIC_WEBHOOK_ALLOWED_ORIGINS", format!("http://{addr}")));
        Silent { _listener: listener, url: format!("http://{addr}/never"), env }
    }
}

#[tokio::test]
async fn a_silent_receiver_holds_up_no_other_delivery_and_cli_runs_post_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let fine = Receiver::default();
    let black_hole = Silent::beside(&fine.start().await);
    let (silent, env) = (black_hole.url.clone(), black_hole.env.clone());
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));
    let mut stuck = triage(1);
    stuck["webhook_url"] = json!(silent);
    let (status, _) = post(&server, "/v1/runs?wait=true", stuck).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = Instant::now();
    post(&server, "/v1/runs?wait=true", triage(2)).await;
    let got = fine.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    assert!(began.elapsed() < Duration::from_secs(5), "delivered {:?} after its run, while the other hangs", began.elapsed());

    // `fabric run --store` sends no webhook, so its runs are given none.
    let cli_env: Vec<(&str, String)> =
        env.iter().map(|(k, v)| (*k, v.clone())).chain([("FABRIC_DATABASE_URL", db.clone()), ("FABRIC_LLM_STUB", "1".to_owned())]).collect();
    let out = crate::support::fabric_cli(&["run", "support-triage", "--store", "--goal", r#"{"ticket": "x"}"#], &cli_env).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let store = fabric::store::open(&db).await.unwrap();
    let runs = store.list_runs(&fabric::store::RunFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(runs.len(), 3);
    let newest = &runs[0].run_id;
    assert_eq!(store.webhooks().deliveries(newest).await.unwrap(), vec![], "the CLI's run has no delivery");
    drop(black_hole);
}

/// A receiver that never answers, with 40 deliveries due to it, holds at most half of a
/// replica's attempts in flight: another receiver's delivery goes out at once (issue 46: 32
/// silent deliveries took every one of the 32 places, and the others waited up to 10 s).
#[tokio::test]
async fn one_silent_origin_takes_at_most_half_of_the_senders_places() {
    let dir = tempfile::tempdir().unwrap();
    let db = store_url("sqlite", &dir).await.unwrap();
    let fine = Receiver::default();
    let black_hole = Silent::beside(&fine.start().await);
    let (silent, mut env) = (black_hole.url.clone(), black_hole.env.clone());
    env.push(("FABRIC_LOG", "warn".to_owned()));
    let stub = asking_stub();
    let server = Server::start(&db, stub.path(), &pairs(&env));
    let stuck: Vec<Value> = (0..40)
        .map(|k| {
            let mut body = triage(k);
            body["webhook_url"] = json!(silent);
            body
        })
        .collect();
    futures_util::future::join_all(stuck.into_iter().map(|b| post(&server, "/v1/runs?wait=true", b))).await;
    // Every silent attempt is out (each holds its place for 10 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let began = Instant::now();
    let (status, _) = post(&server, "/v1/runs?wait=true", triage(99)).await;
    assert_eq!(status, 200);
    let got = fine.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    assert!(began.elapsed() < Duration::from_secs(5), "delivered {:?} after its run, while 40 others hang", began.elapsed());
    drop(black_hole);
}
