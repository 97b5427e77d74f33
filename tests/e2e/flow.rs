//! Flow control of model calls end to end: real `fabric serve` processes on SQLite and on a real
//! PostgreSQL call a fake OpenAI-compatible provider (a real HTTP server) that counts the calls
//! in flight, answers 429 above its limit, and records when each request arrived by its own
//! clock. Counts, not timings: each test checks what the provider saw.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::durable::store_url;
use crate::service::{Server, get, post, settled};
use crate::support::{packs_dir, reply_json, serve};

/// A provider that allows `limit` calls at once.
struct Fake {
    limit: u32,
    latency: Duration,
    in_flight: AtomicU32,
    max_seen: AtomicU32,
    /// Requests that came while `limit` were in flight (answered 429).
    over: AtomicU32,
    /// Each request's arrival, and whether it was of route `y`.
    arrivals: Mutex<Vec<(Instant, bool)>>,
    /// The arrival (0-based) answered with one 429 and `Retry-After: 2`, and when it was.
    refuse: Option<usize>,
    refused_at: Mutex<Option<Instant>>,
    served: AtomicU64,
}

struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    fn new(limit: u32, latency_ms: u64, refuse: Option<usize>) -> Arc<Fake> {
        Arc::new(Fake {
            limit,
            latency: Duration::from_millis(latency_ms),
            in_flight: AtomicU32::new(0),
            max_seen: AtomicU32::new(0),
            over: AtomicU32::new(0),
            arrivals: Mutex::default(),
            refuse,
            refused_at: Mutex::default(),
            served: AtomicU64::new(0),
        })
    }

    async fn start(self: &Arc<Self>) -> String {
        let me = self.clone();
        let app = axum::Router::new().fallback(move |body: axum::body::Bytes| {
            let me = me.clone();
            async move { me.answer(&body).await }
        });
        serve(app).await
    }

    async fn answer(&self, body: &[u8]) -> axum::response::Response {
        let text = String::from_utf8_lossy(body);
        let index = {
            let mut a = self.arrivals.lock().unwrap();
            a.push((Instant::now(), text.contains("y_lane")));
            a.len() - 1
        };
        let response = |status: u16, retry: Option<&str>, body: String| {
            let mut r = axum::response::Response::builder().status(status).header("content-type", "application/json");
            if let Some(s) = retry {
                r = r.header("retry-after", s);
            }
            r.body(axum::body::Body::from(body)).unwrap()
        };
        if self.refuse == Some(index) {
            *self.refused_at.lock().unwrap() = Some(Instant::now());
            return response(429, Some("2"), json!({"error": {"code": "rate_limit_exceeded"}}).to_string());
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _guard = InFlight(&self.in_flight);
        if now > self.limit {
            self.over.fetch_add(1, Ordering::SeqCst);
            return response(429, None, json!({"error": {"code": "rate_limit_exceeded"}}).to_string());
        }
        self.max_seen.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.served.fetch_add(1, Ordering::SeqCst);
        let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        response(200, None, reply_json(fabric::config::ProviderKind::OpenAi, &request).to_string())
    }

    fn arrivals(&self) -> Vec<(Instant, bool)> {
        self.arrivals.lock().unwrap().clone()
    }
}

/// A catalogue of routes `x`, `y` and `urgent` (priority 5), each one model stage.
fn catalogue() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("routes.yaml"),
        "profiles:\n  default: {description: The fleet's model.}\n\
         capabilities:\n  say: {description: Say it., output_schema: {type: object, properties: {text: {type: string}}, required: [text]}}\n\
         workflows:\n  one: {stages: [{id: say, llm_role: synthesis, capability: say}]}\n\
         routes:\n  x: {model_profile: default, prompt_pack: support, workflow: one}\n  y: {model_profile: default, prompt_pack: support, workflow: one}\n",
    )
    .unwrap();
    dir
}

/// A `fabric serve` on `db` whose model is the fake provider at `url`.
fn replica(db: &str, url: &str, cat: &tempfile::TempDir, extra: &[(&str, &str)]) -> Server {
    let stub = tempfile::tempdir().unwrap();
    let base = format!("{url}/v1");
    let mut env: Vec<(&str, &str)> = vec![
        ("FABRIC_LLM_STUB", "0"),
        ("FABRIC_LLM_MODEL", "openai:fake"),
        ("OPENAI_BASE_URL", &base),
        ("OPENAI_API_KEY", "sk-test-flow"),
        ("FABRIC_CATALOGUE_DIR", cat.path().to_str().unwrap()),
        ("FABRIC_FLEET", "flow"),
        ("FABRIC_CLAIM_POLL_MS", "100"),
        ("FABRIC_LLM_RETRY_BASE_S", "0.05"),
    ];
    env.extend_from_slice(extra);
    let packs = packs_dir();
    env.push(("FABRIC_PROMPT_PACKS_DIR", packs.to_str().unwrap()));
    Server::start(db, stub.path(), &env)
}

fn start(route: &str, k: usize) -> Value {
    json!({"route_id": route, "goal": {format!("{route}_lane"): k}, "model_profile": "default"})
}

/// Starts `n` runs of `route` on `server`, 16 at a time; their ids.
async fn start_many(server: &Server, route: &str, n: usize, from: usize) -> Vec<String> {
    futures_util::stream::iter(from..from + n)
        .map(|k| async move {
            let (status, run) = post(server, "/v1/runs", start(route, k)).await;
            assert_eq!(status, 201, "{run}");
            run["run_id"].as_str().unwrap().to_owned()
        })
        .buffer_unordered(16)
        .collect()
        .await
}

async fn assert_all_completed(server: &Server, ids: &[String], what: &str) {
    for id in ids {
        let view = settled(server, id).await;
        assert_eq!(view["status"], "completed", "{what}: run {id}: {view}");
    }
}

async fn metric(server: &Server, name: &str) -> Option<f64> {
    let text = crate::service::client().get(format!("{}/metrics", server.url)).bearer_auth(crate::service::TOKEN).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn concurrency_holds_for_one_replica_on_sqlite() {
    concurrency("sqlite", 1).await;
}

#[tokio::test]
async fn concurrency_holds_across_two_replicas_on_postgres() {
    concurrency("postgres", 2).await;
}

/// 300 runs over `replicas` with `FABRIC_LLM_MAX_CONCURRENCY=3`: the provider never sees more
/// than 3 at once and every run completes.
async fn concurrency(kind: &str, replicas: usize) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let fake = Fake::new(3, 15, None);
    let url = fake.start().await;
    let cat = catalogue();
    let servers: Vec<Server> = (0..replicas).map(|_| replica(&db, &url, &cat, &[("FABRIC_LLM_MAX_CONCURRENCY", "3")])).collect();
    let per = 300 / replicas;
    let mut ids = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        ids.push(start_many(s, "x", per, i * per).await);
    }
    for (s, ids) in servers.iter().zip(&ids) {
        assert_all_completed(s, ids, kind).await;
    }
    assert_eq!(fake.over.load(Ordering::SeqCst), 0, "{kind}: no request came while 3 were in flight");
    assert!(fake.max_seen.load(Ordering::SeqCst) <= 3);
    assert_eq!(fake.served.load(Ordering::SeqCst), 300, "{kind}: one call per run");
    for s in servers {
        let (_, logs) = s.stop();
        assert!(!logs.contains("sk-test-flow"), "no key in the logs");
    }
}

#[tokio::test]
async fn one_429_pauses_every_call_on_sqlite() {
    one_pause("sqlite", 1).await;
}

#[tokio::test]
async fn one_429_pauses_every_call_on_postgres() {
    one_pause("postgres", 1).await;
}

#[tokio::test]
async fn one_429_pauses_every_replica_of_the_fleet_on_postgres() {
    one_pause("postgres", 2).await;
}

/// One 429 with `Retry-After: 2` while 100 runs wait: nothing reaches the provider for 2 s by
/// its clock, every run completes, and the provider got one request per run plus the refused
/// one. One replica: one call at a time, so nothing can be under way when the 429 comes. Two:
/// one call at a time each, so the other replica learns of the pause through the store while
/// its own calls go on; a request it sent in the moment before it heard (50 ms) is allowed.
async fn one_pause(kind: &str, replicas: usize) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    // Two replicas: late enough (and slow enough) that both hold a share when it comes.
    let fake = if replicas == 1 { Fake::new(1, 20, Some(10)) } else { Fake::new(2, 100, Some(40)) };
    let url = fake.start().await;
    let cat = catalogue();
    let limit = replicas.to_string();
    let servers: Vec<Server> = (0..replicas).map(|_| replica(&db, &url, &cat, &[("FABRIC_LLM_MAX_CONCURRENCY", &limit)])).collect();
    let per = 100 / replicas;
    let mut all = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let ids = start_many(s, "x", per, i * per).await;
        all.push(ids);
    }
    for (s, ids) in servers.iter().zip(&all) {
        assert_all_completed(s, ids, kind).await;
    }
    let refused = fake.refused_at.lock().unwrap().expect("a request was refused");
    let arrivals = fake.arrivals();
    assert_eq!(arrivals.len(), 101, "{kind}: every run's call and the refused one");
    let told = if replicas == 1 { Duration::ZERO } else { Duration::from_millis(50) };
    let next = arrivals.iter().map(|(t, _)| *t).filter(|t| *t > refused + told).min().unwrap();
    assert!(next - refused >= Duration::from_secs(2), "{kind}: a request {:?} after the 429", next - refused);
    assert_eq!(fake.over.load(Ordering::SeqCst), 0);
    let mut limited = 0.0;
    let mut paused = 0;
    for (s, ids) in servers.iter().zip(&all) {
        limited += metric(s, "fabric_model_rate_limited_total{provider=\"openai\"} ").await.unwrap_or(0.0);
        // The runs that waited say so.
        for id in ids {
            let events = crate::service::sse(s, id, None).await;
            paused += events.iter().filter(|(_, kind, data)| kind == "run.llm.waiting" && data["limit"] == "paused").count();
        }
    }
    assert_eq!(limited, 1.0, "{kind}: counted once, where it came");
    assert!(paused >= 1, "{kind}: some run waited for the pause");
    for s in servers {
        s.stop();
    }
}

#[tokio::test]
async fn requests_per_minute_are_spread_on_sqlite() {
    rpm("sqlite").await;
}

#[tokio::test]
async fn requests_per_minute_are_spread_on_postgres() {
    rpm("postgres").await;
}

/// `FABRIC_LLM_RPM=60`: one a second, a burst of one. Over any 4 s the provider sees at most 4
/// requests and one more.
async fn rpm(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let fake = Fake::new(100, 1, None);
    let url = fake.start().await;
    let cat = catalogue();
    let server = replica(&db, &url, &cat, &[("FABRIC_LLM_RPM", "60")]);
    let ids = start_many(&server, "x", 7, 0).await;
    assert_all_completed(&server, &ids, kind).await;
    let times: Vec<Instant> = fake.arrivals().iter().map(|(t, _)| *t).collect();
    assert_eq!(times.len(), 7);
    for (i, t) in times.iter().enumerate() {
        let within = times[i..].iter().filter(|u| **u < *t + Duration::from_secs(4)).count();
        assert!(within <= 5, "{kind}: {within} requests within 4 s of request {i}");
    }
    server.stop();
}

#[tokio::test]
async fn a_small_route_is_not_starved_by_a_burst_on_sqlite() {
    fairness("sqlite").await;
}

#[tokio::test]
async fn a_small_route_is_not_starved_by_a_burst_on_postgres() {
    fairness("postgres").await;
}

/// 500 runs of `x` queue, then 5 of `y`: all of `y` is served before half of the calls of `x`
/// still queued when `y` started (counted at the provider).
async fn fairness(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url(kind, &dir).await else { return };
    let fake = Fake::new(2, 20, None);
    let url = fake.start().await;
    let cat = catalogue();
    let server = replica(&db, &url, &cat, &[("FABRIC_LLM_MAX_CONCURRENCY", "2")]);
    let xs = start_many(&server, "x", 500, 0).await;
    let x_before = fake.arrivals().iter().filter(|(_, y)| !y).count();
    let ys = start_many(&server, "y", 5, 0).await;
    assert_all_completed(&server, &ys, kind).await;
    let arrivals = fake.arrivals();
    let last_y = arrivals.iter().rposition(|(_, y)| *y).unwrap();
    let x_by_then = arrivals[..last_y].iter().filter(|(_, y)| !y).count().max(x_before);
    let queued = 500 - x_before;
    assert!(queued >= 100, "{kind}: x still had {queued} calls queued when y started");
    assert!(x_by_then - x_before < queued / 2, "{kind}: {} of x's {queued} queued calls went before y's last", x_by_then - x_before);
    assert_all_completed(&server, &xs, kind).await;
    server.stop();
}

/// `kill -9` of one of two replicas: the survivor gets the whole limit within a lease, and the
/// provider never sees more than the limit.
#[tokio::test]
async fn a_killed_replicas_share_goes_to_the_others_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = store_url("postgres", &dir).await else { return };
    let fake = Fake::new(4, 100, None);
    let url = fake.start().await;
    let cat = catalogue();
    let env = [("FABRIC_LLM_MAX_CONCURRENCY", "4"), ("FABRIC_RUN_LEASE_S", "3")];
    let a = replica(&db, &url, &cat, &env);
    let b = replica(&db, &url, &cat, &env);
    let a_ids = start_many(&a, "x", 60, 0).await;
    let b_ids = start_many(&b, "x", 60, 60).await;
    let share = "fabric_model_fleet_share{model=\"openai:fake\"} ";
    // Both busy: each holds part of it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&b, share).await.is_none_or(|s| s >= 1.0) {
        assert!(Instant::now() < deadline, "b never shared the limit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.signal("KILL");
    let killed = Instant::now();
    while metric(&b, share).await.is_none_or(|s| s < 1.0) {
        assert!(killed.elapsed() < Duration::from_secs(30), "the dead replica's share never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Within its lease (3 s) and a beat, on a busy machine some more.
    assert!(killed.elapsed() < Duration::from_secs(12), "{:?}", killed.elapsed());
    // b finishes its own runs and takes over a's.
    assert_all_completed(&b, &b_ids, "b").await;
    assert_all_completed(&b, &a_ids, "a's, taken over").await;
    assert_eq!(fake.over.load(Ordering::SeqCst), 0, "never more than 4 at once");
    let view = get(&b, "/v1/routes").await;
    assert!(view.to_string().contains("\"x\""), "{view}");
    b.stop();
}

/// Bad limits stop `fabric run`, `fabric serve` and `fabric doctor` at start, naming the
/// variable; a TPM below what one call's system prompt alone needs is one of them.
#[tokio::test]
async fn bad_limits_are_refused_at_start_naming_the_variable() {
    let stub = ("FABRIC_LLM_STUB", "1".to_owned());
    let goal = r#"{"ticket": "refund?"}"#;
    for (var, value) in
        [("FABRIC_LLM_MAX_CONCURRENCY", "0"), ("FABRIC_LLM_RPM", "-5"), ("FABRIC_LLM_TPM", "lots"), ("FABRIC_LLM_TPM", "10"), ("FABRIC_LLM_MAX_PAUSE_S", "601")]
    {
        let o = crate::support::fabric_cli(&["run", "support-triage", "--goal", goal], &[stub.clone(), (var, value.to_owned())]).await;
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(var), "{var}={value}: {err}");
        if value == "10" {
            assert!(err.contains("route `") && err.contains("stage `") && err.contains("system prompt"), "the route and stage it cannot meet: {err}");
        }
        let o = crate::support::fabric_cli(&["doctor"], &[stub.clone(), (var, value.to_owned())]).await;
        let out = String::from_utf8_lossy(&o.stdout);
        if value != "10" {
            assert!(!o.status.success() && out.contains(var), "doctor, {var}={value}: {out}");
        }
    }
    // A file's table: named by FABRIC_CONFIG and the key.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.toml");
    std::fs::write(&file, "[llm_limits.\"openai:gpt-4o\"]\nrpm = 0\n").unwrap();
    let config = ("FABRIC_CONFIG", file.to_str().unwrap().to_owned());
    let o = crate::support::fabric_cli(&["run", "support-triage", "--goal", goal], &[stub.clone(), config.clone()]).await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("FABRIC_CONFIG") && err.contains("llm_limits.\"openai:gpt-4o\".rpm"), "{err}");
    // Two tables of one model (issue 46): refused, naming both spellings.
    std::fs::write(&file, "[llm_limits.\"gpt-4o\"]\nrpm = 1\n[llm_limits.\"openai:gpt-4o\"]\nrpm = 2\n").unwrap();
    let o = crate::support::fabric_cli(&["run", "support-triage", "--goal", goal], &[stub.clone(), config.clone()]).await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("already limited by `llm_limits.\"gpt-4o\"`") && err.contains("openai:gpt-4o"), "{err}");
    // Good limits: doctor shows them.
    std::fs::write(&file, "[llm_limits.\"openai:gpt-4o\"]\nrpm = 500\n").unwrap();
    let o = crate::support::fabric_cli(&["doctor"], &[stub, config, ("FABRIC_LLM_MAX_CONCURRENCY", "8".into())]).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("model limits: max concurrency 8"), "{out}");
    assert!(out.contains("openai:gpt-4o: max concurrency 8, rpm 500"), "{out}");
    assert!(out.contains("longest pause after a provider's 429: 60 s (FABRIC_LLM_MAX_PAUSE_S"), "{out}");
}
