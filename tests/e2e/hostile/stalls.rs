//! What one provider reply may hold a model to (issue 46): a 429's named wait and a reply's
//! claimed usage are bounded by settings an operator controls, through the real `fabric` binary
//! against a fake OpenAI-compatible provider on a real socket.

use std::time::{Duration, Instant};

use fabric::config::ProviderKind;
use serde_json::{Value, json};

use crate::support::{Canned, FakeProvider, fabric_cli, reply_json};

const GOAL: &str = r#"{"ticket":"I was charged twice"}"#;

/// `fabric run support-triage` on the fake at `url`; its result and its events.
async fn run_on(url: &str, extra: &[(&str, &str)]) -> (Value, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let mut env = vec![
        ("FABRIC_LLM_MODEL", "openai:m".to_owned()),
        ("OPENAI_BASE_URL", format!("{url}/v1")),
        ("OPENAI_API_KEY", "sk-test-stalls".to_owned()),
        ("FABRIC_LLM_RETRY_MAX_BACKOFF_S", "0.05".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let o = fabric_cli(&["run", "support-triage", "--goal", GOAL, "--events-out", events.to_str().unwrap()], &env).await;
    let result: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
    let events = std::fs::read_to_string(&events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (result, events)
}

fn answering() -> FakeProvider {
    FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::OpenAi, body)))
}

fn status_429(header: &'static str, value: &str) -> Canned {
    Canned { status: 429, headers: vec![(header, value.to_owned())], body: "{}".into(), delay: Duration::ZERO }
}

#[tokio::test]
async fn a_429_naming_a_wait_past_the_longest_pause_fails_its_call_at_once() {
    let cases = [
        ("retry-after", "1e12", "a day or more"),
        ("retry-after", "1e308", "a day or more"),
        ("retry-after-ms", "1e30", "a day or more"),
        ("retry-after", "18446744073709551616", "a day or more"),
        ("x-ratelimit-reset-tokens", "5h", "18000.0 s"),
        ("retry-after", "61", "61.0 s"),
    ];
    for (header, value, stated) in cases {
        let fake = answering();
        fake.push(status_429(header, value));
        let url = fake.start().await;
        let started = Instant::now();
        let (result, _) = run_on(&url, &[]).await;
        // Before: every call of the model paused 600 s, and `fabric run` waited it out.
        assert!(started.elapsed() < Duration::from_secs(30), "{header}: {value}: {:?}", started.elapsed());
        assert_eq!(result["status"], "failed", "{header}: {value}: {result}");
        assert_eq!(result["error"]["reason_class"], "rate_limited", "{result}");
        let message = result["error"]["message"].as_str().unwrap();
        for part in [format!("asked to wait {stated} ({header})"), "FABRIC_LLM_MAX_PAUSE_S".into(), "(60 s".into()] {
            assert!(message.contains(&part), "{part}: {message}");
        }
        assert_eq!(fake.requests().len(), 1, "{header}: {value}: not retried: the wait is the operator's to allow");
    }
}

#[tokio::test]
async fn a_429_within_the_longest_pause_pauses_the_model_and_the_run_goes_on() {
    let fake = answering();
    fake.push(status_429("retry-after", "1"));
    let url = fake.start().await;
    let (result, events) = run_on(&url, &[("FABRIC_LLM_MAX_PAUSE_S", "5")]).await;
    assert_eq!(result["status"], "completed", "{result}");
    let waited = events.iter().find(|e| e["type"] == "run.llm.waiting").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(waited["limit"], "paused", "{waited}");
    // A longer named wait with the bound lowered: refused, naming the operator's bound.
    let fake = answering();
    fake.push(status_429("retry-after", "30"));
    let url = fake.start().await;
    let (result, _) = run_on(&url, &[("FABRIC_LLM_MAX_PAUSE_S", "5")]).await;
    assert_eq!(result["error"]["reason_class"], "rate_limited", "{result}");
    assert!(result["error"]["message"].as_str().unwrap().contains("(5 s, FABRIC_LLM_MAX_PAUSE_S)"), "{result}");
}

#[tokio::test]
async fn a_reply_claiming_absurd_usage_costs_its_model_at_most_a_minute_of_tokens() {
    // The first reply claims 10^12 prompt tokens (a proxy reporting cumulative or garbage usage).
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let fake = FakeProvider::new(move |body| {
        let mut reply = reply_json(ProviderKind::OpenAi, body);
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            reply["usage"] = json!({"prompt_tokens": 1_000_000_000_000u64, "completion_tokens": u64::MAX});
        }
        Canned::json(200, reply)
    });
    let url = fake.start().await;
    let started = Instant::now();
    let (result, events) = run_on(&url, &[("FABRIC_LLM_TPM", "600000")]).await;
    // Before: the bucket was years in debt; the next call waited its 300 s and failed.
    assert_eq!(result["status"], "completed", "{result}");
    let waits: Vec<&Value> = events.iter().filter(|e| e["type"] == "run.llm.waiting").collect();
    assert!(!waits.is_empty(), "the debt is paid by waiting: {events:?}");
    for w in &waits {
        assert_eq!(w["limit"], "tpm", "{w}");
        assert!(w["waited_ms"].as_u64().unwrap() <= 62_000, "at most one minute of the rate: {w}");
    }
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
}

/// Opens a run's event stream on a raw connection and reads its head; the connection is the
/// client's to drop.
async fn open_stream(server: &crate::service::Server, run_id: &str) -> (u16, tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!("GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n", crate::service::TOKEN);
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the head: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let status = String::from_utf8_lossy(&got).split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    (status, conn)
}

async fn gauge(server: &crate::service::Server, name: &str) -> Option<f64> {
    let text = crate::service::client().get(format!("{}/metrics", server.url)).bearer_auth(crate::service::TOKEN).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_watcher_that_goes_away_gives_its_stream_slot_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    // A run on a slow model (two minutes a call): it makes no event while its call is out.
    let server = crate::service::Server::start(&db, &crate::support::stub_dir(), &[("FABRIC_LLM_STUB_LATENCY_MS", "120000")]);
    let (status, run) =
        crate::service::post(&server, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "slow"}, "model_profile": "default"})).await;
    assert!(status == 201 || status == 202, "{status} {run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let mut watchers = Vec::new();
    for _ in 0..32 {
        let (status, conn) = open_stream(&server, &id).await;
        assert_eq!(status, 200);
        watchers.push(conn);
    }
    assert_eq!(open_stream(&server, &id).await.0, 429, "the run's 32 slots are taken");
    drop(watchers);
    // Given back within the keep-alive interval (15 s), and the gauge follows; before, they
    // stayed taken until the run ended.
    let given_back = Instant::now();
    loop {
        if gauge(&server, "fabric_event_streams").await == Some(0.0) {
            break;
        }
        assert!(given_back.elapsed() < Duration::from_secs(15), "slots still held: {:?}", gauge(&server, "fabric_event_streams").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut again = Vec::new();
    for _ in 0..32 {
        let (status, conn) = open_stream(&server, &id).await;
        assert_eq!(status, 200, "a new watcher gets a slot");
        again.push(conn);
    }
}

/// A client that keeps its connection and reads nothing: its stream ends after
/// `ApiConfig::stream_stall`, and its place is given back (the body is never polled here, as
/// hyper stops polling one whose client's window is shut). Also a `Last-Event-ID` past the
/// store's range is a 400, not an overflow.
#[tokio::test]
async fn a_client_that_reads_nothing_gives_its_stream_slot_back_after_the_stall_bound() {
    use axum::body::Body;
    use axum::http::Request;
    use fabric::api::{ApiConfig, AppState, router};
    use fabric::events::EventKind;
    use fabric::exec::JournalBatch;
    use fabric::store::{Holder, NewRun};
    use tower::ServiceExt;
    let store = fabric::store::open("sqlite::memory:").await.unwrap();
    let runtime = fabric::runtime::Durable::new(
        fabric::runtime::Runtime::builder()
            .settings(fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap())
            .catalogue_dirs(crate::support::routes_dir(), crate::support::packs_dir())
            .stub(fabric::llm::stub::StubLlm::default())
            .build()
            .unwrap(),
        store.clone(),
    );
    let token = "t".repeat(32);
    let config = ApiConfig { token: Some(token.clone()), stream_stall: Duration::from_millis(500), ..ApiConfig::default() };
    let app = router(AppState::new(std::sync::Arc::new(runtime), config));
    let request = |uri: &str, last: Option<&str>| {
        let mut r = Request::builder().uri(uri).header("authorization", format!("Bearer {token}"));
        if let Some(l) = last {
            r = r.header("last-event-id", l);
        }
        r.body(Body::empty()).unwrap()
    };
    // A run executed by another replica, with far more events than a stream buffers.
    let elsewhere = Holder::new(Duration::from_secs(30));
    let contract: fabric::store::StartRequest = serde_json::from_value(json!({"route_id": "support-triage", "goal": {}, "model_profile": "default"})).unwrap();
    let id = "0190a000-0000-7000-8000-0000000000aa";
    let lease = store.create_run(NewRun::new(id, &contract), Some(&elsewhere)).await.unwrap().unwrap();
    let events = (1..=400)
        .map(|seq| fabric::events::Event {
            kind: EventKind::StageStarted,
            run_id: id.into(),
            route_id: "support-triage".into(),
            seq,
            ts: "2026-01-01T00:00:00.000Z".into(),
            stage_id: None,
            parent_run_id: None,
            data: crate::support::bare_data(EventKind::StageStarted),
        })
        .collect();
    store.commit(&lease, JournalBatch { events, ..Default::default() }).await.unwrap();
    let mut unread = Vec::new();
    for _ in 0..4 {
        let response = app.clone().oneshot(request(&format!("/v1/runs/{id}/events"), None)).await.unwrap();
        assert_eq!(response.status(), 200);
        unread.push(response.into_body());
    }
    let open = |app: axum::Router| async move {
        let response = app.oneshot(request("/metrics", None)).await.unwrap();
        let text = String::from_utf8(axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap();
        text.lines().find_map(|l| l.strip_prefix("fabric_event_streams ")).unwrap().to_owned()
    };
    assert_eq!(open(app.clone()).await, "4");
    let began = Instant::now();
    while open(app.clone()).await != "0" {
        assert!(began.elapsed() < Duration::from_secs(10), "four streams nobody reads still hold their places");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(unread);
    for bad in ["18446744073709551615", "9223372036854775808"] {
        let response = app.clone().oneshot(request(&format!("/v1/runs/{id}/events"), Some(bad))).await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }
    let last = app.clone().oneshot(request(&format!("/v1/runs/{id}/events"), Some("9223372036854775807"))).await.unwrap();
    assert_eq!(last.status(), 200, "the store's largest seq is a seq");
}

/// A session's `enqueue` starts are queued whatever room there is: `FABRIC_MAX_QUEUED_RUNS`
/// bounds them too (issue 46: one client queued runs without end behind a run that waits on it).
#[tokio::test]
async fn a_sessions_enqueued_starts_are_bounded_by_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = crate::service::asking_stub();
    let server = crate::service::Server::start(&db, stub.path(), &[("FABRIC_MAX_QUEUED_RUNS", "2"), ("FABRIC_SESSION_POLICY", "enqueue")]);
    let start = |k: usize| json!({"route_id": "support-agent", "goal": {"question": format!("refund {k}?")}, "model_profile": "default", "session_id": "s-1"});
    // The first asks, and waits on its user: the session is live.
    let (status, first) = crate::service::post(&server, "/v1/runs?wait=true", start(0)).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("awaiting_input")), "{first}");
    let mut codes = Vec::new();
    for k in 1..=4 {
        let (status, body) = crate::service::post(&server, "/v1/runs", start(k)).await;
        codes.push((status, body["error"]["code"].as_str().unwrap_or_default().to_owned()));
    }
    let want: Vec<(u16, String)> = vec![(201, String::new()), (201, String::new()), (429, "too_many_runs".into()), (429, "too_many_runs".into())];
    assert_eq!(codes, want);
}
