//! The service: the router without sockets (tower `oneshot`), then `fabric serve` over a real
//! socket with the stub: start, events, ask, reply, restart, limits, metrics, OpenAPI.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use fabric::api::{ApiConfig, AppState, router};
use fabric::config::Settings;
use fabric::runtime::Runtime;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{fixture_env, packs_dir, repo, routes_dir, stub_dir};

pub(crate) const TOKEN: &str = "test-token-4711";

/// A stub directory where support-agent asks first, then calls `add`, then answers.
pub(crate) fn asking_stub() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["support-triage.yaml", "ticket-router.yaml", "refund-review.yaml"] {
        std::fs::copy(stub_dir().join(f), dir.path().join(f)).unwrap();
    }
    // The script the README's service example uses.
    std::fs::copy(repo().join("examples/stub-asking/support-agent.yaml"), dir.path().join("support-agent.yaml")).unwrap();
    dir
}

pub(crate) async fn app(fleet: Option<&str>, config: ApiConfig) -> (axum::Router, tempfile::TempDir) {
    app_on(fabric::store::open("sqlite::memory:").await.unwrap(), fleet, config)
}

/// The app over a store of the caller's (a wrapper that watches what is asked, say).
pub(crate) fn app_on(store: Arc<dyn fabric::store::RunStore>, fleet: Option<&str>, config: ApiConfig) -> (axum::Router, tempfile::TempDir) {
    let (state, stub) = state_on(store, fleet, config);
    (router(state), stub)
}

/// The service's state over a store of the caller's.
pub(crate) fn state_on(store: Arc<dyn fabric::store::RunStore>, fleet: Option<&str>, config: ApiConfig) -> (AppState, tempfile::TempDir) {
    let mut vars = vec![("FABRIC_LLM_STUB", "1".to_owned())];
    if let Some(f) = fleet {
        vars.push(("FABRIC_FLEET", f.to_owned()));
    }
    let settings = Settings::load(move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())).unwrap();
    let stub = asking_stub();
    let runtime = fabric::runtime::Durable::new(
        Runtime::builder()
            .settings(settings)
            .catalogue_dirs(routes_dir(), packs_dir())
            .stub_dir(stub.path())
            .tool("add", fabric::tools::builtin_add())
            .build()
            .unwrap(),
        store,
    );
    (AppState::new(Arc::new(runtime), config), stub)
}

/// `api::serve` as mini-redis's server is tested: a listener on port 0 and a shutdown future of
/// the test's, no process and no signal.
#[tokio::test]
async fn api_serve_answers_until_its_shutdown_future_resolves() {
    let config = authed(ApiConfig { shutdown_grace: Duration::from_millis(200), ..ApiConfig::default() });
    let (state, _stub) = state_on(fabric::store::open("sqlite::memory:").await.unwrap(), None, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fabric::api::serve(listener, state, async move {
        let _ = stop_rx.await;
    }));
    let client = reqwest::Client::new();
    let health = client.get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let routes = client.get(format!("http://{addr}/v1/routes")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(routes.status(), 200);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server stops after its grace period").unwrap();
    assert!(client.get(format!("http://{addr}/healthz")).send().await.is_err(), "nothing listens any more");
}

pub(crate) fn authed(config: ApiConfig) -> ApiConfig {
    ApiConfig { token: Some(TOKEN.into()), ..config }
}

/// A request with a JSON body (declared `application/json`, as the API requires) or none.
pub(crate) async fn call(app: &axum::Router, method: &str, uri: &str, body: Option<Value>, token: bool) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if token {
        req = req.header("authorization", format!("Bearer {TOKEN}"));
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    send(app, req.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).unwrap()).await
}

/// Any request; the answer's body as JSON, else as a JSON string.
pub(crate) async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned())))
}

#[tokio::test]
async fn the_router_answers_every_refusal_in_one_shape() {
    let (app, _stub) = app(Some("agent-runtime-shared"), authed(ApiConfig { max_body_bytes: 4096, max_goal_bytes: 512, ..ApiConfig::default() })).await;
    let start = |route: &str, goal: Value| json!({"route_id": route, "goal": goal, "model_profile": "default"});
    // Health needs no token; everything else does.
    assert_eq!(call(&app, "GET", "/healthz", None, false).await.0, StatusCode::OK);
    assert_eq!(call(&app, "GET", "/readyz", None, false).await.0, StatusCode::OK);
    let (status, headers, body) = call(&app, "GET", "/v1/routes", None, false).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert_eq!(call(&app, "POST", "/v1/runs", Some(start("support-triage", json!({"t": 1}))), false).await.0, StatusCode::UNAUTHORIZED);
    // Unknown route, foreign fleet, a goal that is not an object, an unknown profile.
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(start("nope", json!({}))), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(start("refund-review", json!({}))), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("wrong_fleet")));
    assert!(body["error"]["message"].as_str().unwrap().contains("agent-runtime-custom"), "{body}");
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(start("support-triage", json!([1, 2]))), true).await;
    assert_eq!((status, body["error"]["message"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("`goal` must be a JSON object")));
    let (status, _, _) = call(&app, "POST", "/v1/runs", Some(json!({"route_id": "support-triage", "goal": {}, "model_profile": "nope"})), true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, _) = call(&app, "POST", "/v1/runs", Some(json!({"goal": {}})), true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(json!({"route_id": "support-triage", "goal": {}})), true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "the start contract needs model_profile: {body}");
    // Too large: the body, then the goal.
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(start("support-triage", json!({"t": "x".repeat(5000)}))), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")));
    let (status, _, _) = call(&app, "POST", "/v1/runs", Some(start("support-triage", json!({"t": "x".repeat(1000)}))), true).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // A run, its record, a late reply, a list.
    let (status, headers, body) = call(&app, "POST", "/v1/runs", Some(start("support-triage", json!({"ticket": "charged twice"}))), true).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(headers["location"], format!("/v1/runs/{id}"));
    let mut view = Value::Null;
    for _ in 0..200 {
        view = call(&app, "GET", &format!("/v1/runs/{id}"), None, true).await.2;
        if view["status"] != "running" && view["status"] != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(view["output"], "You were charged twice; the duplicate charge has been refunded.");
    let (status, _, body) = call(&app, "POST", &format!("/v1/runs/{id}/reply"), Some(json!({"message": "hi"})), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("not_waiting")));
    assert_eq!(call(&app, "POST", "/v1/runs/nope/reply", Some(json!({"message": "hi"})), true).await.0, StatusCode::NOT_FOUND);
    assert_eq!(call(&app, "GET", "/v1/runs/nope", None, true).await.0, StatusCode::NOT_FOUND);
    // Unknown endpoints, methods and query strings answer in the same shape.
    let (status, _, body) = call(&app, "GET", "/v1/nothing", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, _, body) = call(&app, "DELETE", "/v1/runs", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed")));
    let (status, _, body) = call(&app, "GET", "/v1/runs?limit=many", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")), "{body}");
    let (_, _, page) = call(&app, "GET", "/v1/runs?route_id=support-triage&status=completed", None, true).await;
    assert_eq!(page["runs"].as_array().unwrap().len(), 1, "{page}");
    let (_, _, routes) = call(&app, "GET", "/v1/routes", None, true).await;
    let review = routes.as_array().unwrap().iter().find(|r| r["id"] == "refund-review").unwrap();
    assert_eq!((review["fleet"].as_str(), review["runs_here"].as_bool()), (Some("agent-runtime-custom"), Some(false)));
}

#[tokio::test]
async fn past_the_bound_on_runs_in_flight_it_is_429_with_retry_after() {
    let (app, _stub) = app(None, authed(ApiConfig { max_in_flight: 0, max_queued: 0, ..ApiConfig::default() })).await;
    let (status, headers, body) =
        call(&app, "POST", "/v1/runs", Some(json!({"route_id": "support-triage", "goal": {}, "model_profile": "default"})), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("too_many_runs")));
    assert_eq!(headers["retry-after"], "1");
}

#[tokio::test]
async fn a_broken_route_is_422_with_its_problems() {
    let settings = Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(routes_dir().join("profiles.yaml"), tmp.path().join("profiles.yaml")).unwrap();
    std::fs::write(tmp.path().join("r.yaml"), "routes:\n  bad: {model_profile: nope, prompt_pack: support, workflow: w}\n").unwrap();
    let runtime = fabric::runtime::Durable::new(
        Runtime::builder().settings(settings).catalogue_dirs(tmp.path(), packs_dir()).stub(fabric::llm::stub::StubLlm::default()).build().unwrap(),
        fabric::store::open("sqlite::memory:").await.unwrap(),
    );
    let app = router(AppState::new(Arc::new(runtime), ApiConfig::default()));
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(json!({"route_id": "bad", "goal": {}, "model_profile": "default"})), false).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("broken_route")));
    assert!(body["error"]["problems"][0].as_str().unwrap().contains("r.yaml:2:"), "{body}");
    // Its picture is refused the same way.
    let (status, headers, graph) = call(&app, "GET", "/v1/routes/bad/graph.svg", None, false).await;
    assert_eq!((status, graph["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("broken_route")));
    assert_eq!(graph["error"]["problems"], body["error"]["problems"]);
    assert_eq!(headers["content-type"], "application/json");
}

#[tokio::test]
async fn a_route_graph_is_served_as_a_locked_down_svg() {
    let (app, _stub) = app(None, authed(ApiConfig::default())).await;
    let (status, headers, body) = call(&app, "GET", "/v1/routes/ticket-router/graph.svg", None, true).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "image/svg+xml");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["content-security-policy"], "default-src 'none'; style-src 'unsafe-inline'");
    let cat = fabric::catalogue::load(&routes_dir(), &packs_dir());
    let svg = body.as_str().unwrap();
    assert_eq!(svg, fabric::svg::render_svg(cat.route("ticket-router").unwrap()));
    crate::hydrate::check_svg(svg).unwrap();
    // The same bearer token as every `/v1` endpoint; an unknown route is the usual 404.
    let (status, headers, body) = call(&app, "GET", "/v1/routes/ticket-router/graph.svg", None, false).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    assert_eq!(headers["www-authenticate"], "Bearer");
    let (status, _, body) = call(&app, "GET", "/v1/routes/nope/graph.svg", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    // The known routes follow (`an_unknown_route_lists_the_known_ones`).
    assert!(body["error"]["message"].as_str().unwrap().starts_with("unknown route `nope`; known routes: "), "{body}");
    let (status, _, _) = call(&app, "POST", "/v1/routes/ticket-router/graph.svg", None, true).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_openapi_document_is_generated_kept_in_docs_and_describes_the_responses() {
    let (app, _stub) = app(None, authed(ApiConfig::default())).await;
    let (status, _, doc) = call(&app, "GET", "/openapi.json", None, true).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
    for path in [
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/reply",
        "/v1/runs/{run_id}/record",
        "/v1/runs/updates",
        "/v1/routes",
        "/v1/routes/{route_id}/graph.svg",
        "/v1/catalogue/diff",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is documented");
    }
    let copy = repo().join("docs/openapi.json");
    let pretty = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    if std::env::var_os("FABRIC_UPDATE_OPENAPI").is_some() {
        std::fs::write(&copy, &pretty).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&copy).unwrap_or_default(), pretty, "docs/openapi.json is stale: run the tests with FABRIC_UPDATE_OPENAPI=1");
    // The component schemas are JSON Schema (2020-12, as OpenAPI 3.1 says): real answers fit them.
    let schema = |name: &str| {
        let mut s = doc["components"]["schemas"][name].clone();
        s["$defs"] = doc["components"]["schemas"].clone();
        let text = s.to_string().replace("#/components/schemas/", "#/$defs/");
        jsonschema::validator_for(&serde_json::from_str(&text).unwrap()).unwrap()
    };
    let (_, _, run) =
        call(&app, "POST", "/v1/runs?wait=true", Some(json!({"route_id": "support-agent", "goal": {"q": 1}, "model_profile": "default"})), true).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    assert!(schema("RunView").is_valid(&run), "{run}");
    let (_, _, error) = call(&app, "GET", "/v1/runs/nope", None, true).await;
    assert!(schema("ErrorBody").is_valid(&error));
    let (_, _, routes) = call(&app, "GET", "/v1/routes", None, true).await;
    assert!(routes.as_array().unwrap().iter().all(|r| schema("RouteInfo").is_valid(r)));
    let (_, _, page) = call(&app, "GET", "/v1/runs", None, true).await;
    assert!(schema("RunPage").is_valid(&page), "{page}");
    let (_, _, record) = call(&app, "GET", &format!("/v1/runs/{}/record", run["run_id"].as_str().unwrap()), None, true).await;
    assert!(schema("RunRecord").is_valid(&record), "{record}");
}

// ---- over a real socket ----

/// `fabric serve` on a free loopback port, killed when dropped.
pub(crate) struct Server {
    pub child: Child,
    pub url: String,
    /// Where its logs go (a file: a pipe nobody reads would stall a chatty server).
    log: tempfile::NamedTempFile,
}

/// The run once it is no longer `running` (or as it stands after 30 s).
pub(crate) async fn settled(server: &Server, id: &str) -> Value {
    let mut view = Value::Null;
    for _ in 0..300 {
        view = get(server, &format!("/v1/runs/{id}")).await;
        if view["status"] != "running" && view["status"] != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    view
}

impl Server {
    pub(crate) fn start(store: &str, stub: &std::path::Path, extra: &[(&str, &str)]) -> Server {
        Server::start_at("127.0.0.1:0", store, stub, extra)
    }

    /// As `start`, listening on `listen` (a port given again after a restart).
    pub(crate) fn start_at(listen: &str, store: &str, stub: &std::path::Path, extra: &[(&str, &str)]) -> Server {
        Server::spawn(Command::new(env!("CARGO_BIN_EXE_fabric")), listen, store, stub, extra)
    }

    /// As `start`, as another user (`setpriv` execs the binary in its place: the pid is the
    /// server's).
    pub(crate) fn start_as(user: &str, store: &str, stub: &std::path::Path, extra: &[(&str, &str)]) -> Server {
        // The other user must reach the binary and the repository's fixtures: a clone under a
        // `mktemp -d` folder (mode 0700) would keep it out. Each folder above them gets search
        // permission for others (no read: nothing is listed), as root may give it.
        for path in [std::path::Path::new(env!("CARGO_BIN_EXE_fabric")), &repo()] {
            for dir in path.ancestors().skip(1) {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(meta) = std::fs::metadata(dir)
                    && meta.permissions().mode() & 0o001 == 0
                {
                    let mut perms = meta.permissions();
                    perms.set_mode(perms.mode() | 0o001);
                    let _ = std::fs::set_permissions(dir, perms);
                }
            }
        }
        let mut cmd = Command::new("setpriv");
        cmd.args([&format!("--reuid={user}"), "--regid=nogroup", "--clear-groups", env!("CARGO_BIN_EXE_fabric")]);
        Server::spawn(cmd, "127.0.0.1:0", store, stub, extra)
    }

    fn spawn(mut cmd: Command, listen: &str, store: &str, stub: &std::path::Path, extra: &[(&str, &str)]) -> Server {
        let log = tempfile::NamedTempFile::new().unwrap();
        cmd.current_dir(repo())
            .envs(fixture_env())
            .args(["--stub-dir", stub.to_str().unwrap(), "serve", "--listen", listen])
            .env("FABRIC_LLM_STUB", "1")
            .env("FABRIC_API_TOKEN", TOKEN)
            .env("FABRIC_DATABASE_URL", store)
            .env("FABRIC_LOG_FORMAT", "json")
            .env_remove("FABRIC_FLEET")
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("http://"), "no address: {line:?}");
        Server { child, url: line.trim().to_owned(), log }
    }

    /// Sends a signal (`TERM`, `STOP`, `CONT`, `KILL`).
    pub(crate) fn signal(&self, name: &str) {
        Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
    }

    /// Its logs so far.
    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// SIGTERM, then the exit status and the logs.
    pub(crate) fn stop(self) -> (std::process::ExitStatus, String) {
        self.stop_with("TERM")
    }

    /// This signal (`TERM`, `HUP`, `INT`), then the exit status and the logs.
    pub(crate) fn stop_with(mut self, signal: &str) -> (std::process::ExitStatus, String) {
        self.signal(signal);
        let status = self.child.wait().unwrap();
        (status, self.logs())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

pub(crate) async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = client().post(format!("{}{path}", s.url)).bearer_auth(TOKEN).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Reads a run's SSE stream to its end: (id, event type, data) each.
pub(crate) async fn sse(s: &Server, run_id: &str, last_event_id: Option<u64>) -> Vec<(u64, String, Value)> {
    let mut req = client().get(format!("{}/v1/runs/{run_id}/events", s.url)).bearer_auth(TOKEN);
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id.to_string());
    }
    let text = req.send().await.unwrap().text().await.unwrap();
    text.split("\n\n").filter(|b| b.contains("data:")).map(sse_block).collect()
}

/// One SSE event block of a run's stream: (id, event type, data).
pub(crate) fn sse_block(block: &str) -> (u64, String, Value) {
    let field = |name: &str| block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned()).unwrap_or_default();
    (field("id:").parse().unwrap(), field("event:"), serde_json::from_str(&field("data:")).unwrap())
}

#[tokio::test]
async fn ask_reply_across_a_restart_with_resumable_events_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    ask_reply_across_a_restart(&format!("sqlite://{}", dir.path().join("fabric.db").display())).await;
}

#[tokio::test]
async fn ask_reply_across_a_restart_with_resumable_events_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        ask_reply_across_a_restart(&url).await;
    }
}

async fn ask_reply_across_a_restart(db: &str) {
    let stub = asking_stub();
    let server = Server::start(db, stub.path(), &[]);
    // support-triage end to end.
    let (status, run) =
        post(&server, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}");
    // support-agent asks.
    let (status, run) =
        post(&server, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str(), run["question"].as_str()), (200, Some("awaiting_input"), Some("Which order number?")), "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let before = sse(&server, &id, None).await;
    assert_eq!(before.last().unwrap().1, "run.awaiting_input");
    // The process stops between the question and the answer.
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    for line in logs.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("a log line is JSON ({e}): {line}"));
        assert!(!line.contains("charged twice") && !line.contains(TOKEN), "no goal or token in logs: {line}");
        if v["message"] == "request" {
            assert!(v["request_id"].is_string() && v["status"].is_number(), "{line}");
        }
    }
    let server = Server::start(db, stub.path(), &[]);
    let (status, done) = post(&server, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, done["status"].as_str(), done["output"].as_str()), (200, Some("completed"), Some("Order 42 is refunded.")), "{done}");
    assert_eq!(done["notes"][0], "user: order 42", "the reply is a note the next decision sees");
    // The whole stream: 1..n without gaps or duplicates; resumed from the middle, the rest.
    let all = sse(&server, &id, None).await;
    let seqs: Vec<u64> = all.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=all.len() as u64).collect::<Vec<_>>());
    assert_eq!(all[before.len()].1, "run.resumed");
    assert_eq!(all.last().unwrap().1, "run.completed");
    for (seq, kind, data) in &all {
        assert_eq!((data["seq"].as_u64(), data["type"].as_str()), (Some(*seq), Some(kind.as_str())));
    }
    let rest = sse(&server, &id, Some(5)).await;
    assert_eq!(rest.iter().map(|e| e.0).collect::<Vec<_>>(), (6..=all.len() as u64).collect::<Vec<_>>());
    // A reply to a run that is not waiting.
    let (status, body) = post(&server, &format!("/v1/runs/{id}/reply"), json!({"message": "again"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_waiting")));
    // Metrics parse as Prometheus text.
    let text = client().get(format!("{}/metrics", server.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    check_prometheus(&text);
    assert!(text.contains("fabric_runs_finished_total{route=\"support-agent\",status=\"completed\"} 1"), "{text}");
    // The store, read by the CLI.
    drop(server);
    let out = Command::new(env!("CARGO_BIN_EXE_fabric")).args(["runs", "--store", db, "show", &id]).output().unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["status"], "completed");
}

/// Every line is a comment, or `name{labels} value` with a valid name and a number.
fn check_prometheus(text: &str) {
    let mut samples = 0;
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        assert!(value.parse::<f64>().is_ok(), "value of {line}");
        let name = series.split('{').next().unwrap();
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "name of {line}");
        if let Some(labels) = series.strip_prefix(name) {
            assert!(labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')), "labels of {line}");
        }
        samples += 1;
    }
    assert!(samples > 10, "{text}");
}

#[tokio::test]
async fn a_graceful_shutdown_hands_what_outlives_the_grace_to_the_next_replica() {
    let dir = tempfile::tempdir().unwrap();
    let db = &format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let server = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "20000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")]);
    let (status, run) = post(&server, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "slow"}, "model_profile": "default"})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(logs.contains("handed over"), "{logs}");
    assert!(!logs.contains("lease lost") && !logs.contains("run record"), "a handover is not reported as a failure: {logs}");
    // Not failed: let go, so the next process claims it at once (no lease to wait out).
    let store = fabric::store::open(db).await.unwrap();
    let stored = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(stored.status, fabric::store::StoredStatus::Running);
    assert!(store.events_after(&id, 0).await.unwrap().iter().all(|e| e.kind != "run.failed"), "the interruption is not recorded");
    let next = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "10"), ("FABRIC_CLAIM_POLL_MS", "50")]);
    let view = settled(&next, &id).await;
    assert_eq!(view["status"], "completed", "{view}");
    let kinds: Vec<String> = sse(&next, &id, None).await.into_iter().map(|e| e.1).collect();
    assert_eq!(kinds.iter().filter(|k| *k == "run.started").count(), 1, "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "run.failed"), "{kinds:?}");
}

/// A client following a run live on the replica that hands it over sees the run as it really
/// goes: no `run.failed` for the interruption, and its end as recorded by the next replica.
#[tokio::test]
async fn a_stream_on_a_replica_that_hands_its_run_over_shows_no_false_end() {
    let dir = tempfile::tempdir().unwrap();
    let db = &format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let stopping = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "3000"), ("FABRIC_SHUTDOWN_GRACE_S", "1")]);
    let other = Server::start(db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "10"), ("FABRIC_CLAIM_POLL_MS", "50")]);
    let (_, run) = post(&stopping, "/v1/runs", json!({"route_id": "support-triage", "goal": {"ticket": "slow"}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    let url = stopping.url.clone();
    let stream = tokio::spawn({
        let id = id.clone();
        async move {
            let text = client().get(format!("{url}/v1/runs/{id}/events")).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
            text.split("\n\n").filter_map(|b| b.lines().find_map(|l| l.strip_prefix("event:")).map(|k| k.trim().to_owned())).collect::<Vec<_>>()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stopping.signal("TERM");
    let kinds = tokio::time::timeout(Duration::from_secs(60), stream).await.expect("the stream ends").unwrap();
    assert!(!kinds.iter().any(|k| k == "run.failed" || k.ends_with(".failed")), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("run.completed"), "{kinds:?}");
    assert_eq!(settled(&other, &id).await["status"], "completed");
    drop(stopping);
}

#[test]
fn without_a_token_the_server_refuses_to_start_unless_told_and_then_only_on_loopback() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fabric"))
            .current_dir(repo())
            .envs(fixture_env())
            .args(args)
            .env("FABRIC_LLM_STUB", "1")
            .env_remove("FABRIC_API_TOKEN")
            .env("FABRIC_DATABASE_URL", "sqlite::memory:")
            .output()
            .unwrap()
    };
    let o = run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("FABRIC_API_TOKEN is not set"));
    let o = run(&["serve", "--no-auth", "--listen", "0.0.0.0:0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"));
}

pub(crate) async fn get(s: &Server, path: &str) -> Value {
    client().get(format!("{}{path}", s.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn a_reply_the_runtime_cannot_continue_leaves_the_run_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let db = &format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let server = Server::start(db, stub.path(), &[]);
    let (_, run) = post(&server, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"q": 1}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    drop(server);
    // The next process serves another fleet: the reply is refused, and the run still waits.
    let server = Server::start(db, stub.path(), &[("FABRIC_FLEET", "agent-runtime-custom")]);
    let (status, body) = post(&server, &format!("/v1/runs/{id}/reply"), json!({"message": "order 42"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("wrong_fleet")), "{body}");
    assert_eq!(get(&server, &format!("/v1/runs/{id}")).await["status"], "awaiting_input");
    drop(server);
    let server = Server::start(db, stub.path(), &[]);
    let (status, done) = post(&server, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, done["status"].as_str()), (200, Some("completed")), "{done}");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let stub = asking_stub();
    let server = Server::start(&format!("sqlite://{}", dir.path().join("fabric.db").display()), stub.path(), &[]);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // The server closes it (10 s header timeout); a minute is the test's own patience.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), slow.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection is still open after a minute");
    // Others are served meanwhile and after.
    assert_eq!(get(&server, "/v1/routes").await.as_array().map(Vec::len), Some(4));
}

// ---- the run inspector (/ui/) and what it reads ----

#[tokio::test]
async fn the_inspector_is_served_without_a_token_under_a_strict_policy() {
    let (app, _stub) = app(None, authed(ApiConfig::default())).await;
    for (path, kind) in [("/ui/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")] {
        let (status, headers, body) = call(&app, "GET", path, None, false).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind), "{path}: {:?}", headers["content-type"]);
        assert_eq!(
            headers["content-security-policy"],
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
        assert_eq!(headers["cache-control"], "no-cache");
        assert!(!body.as_str().unwrap().is_empty());
    }
    let (status, headers, _) = call(&app, "GET", "/ui", None, false).await;
    assert!(status.is_redirection());
    assert_eq!(headers["location"], "/ui/");
    // The page itself: no inline script, style or handler (the policy would refuse them anyway).
    let (_, _, html) = call(&app, "GET", "/ui/", None, false).await;
    let html = html.as_str().unwrap().to_ascii_lowercase();
    assert_eq!(html.matches("<script").count(), 1, "one script element");
    assert!(html.contains(r#"<script src="app.js" defer></script>"#));
    assert!(!html.contains("<style"), "no inline style element");
    assert!(!html.contains(" style="), "no style attribute");
    assert!(!html.contains("javascript:"));
    for (i, _) in html.match_indices(" on") {
        let rest = &html[i + 3..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
        assert!(name.is_empty() || !rest[name.len()..].trim_start().starts_with('='), "an inline handler `on{name}=`");
    }
    for id in ["token-form", "token", "token-save", "token-clear", "nav-runs", "nav-routes", "catalogue-version"] {
        assert!(html.contains(&format!(r#"id="{id}""#)), "#{id} in index.html");
    }
    // Data reaches the page as text, never as markup.
    let (_, _, js) = call(&app, "GET", "/ui/app.js", None, false).await;
    let js = js.as_str().unwrap();
    for banned in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "createContextualFragment"] {
        assert!(!js.contains(banned), "app.js uses {banned}");
    }
    assert!(js.contains("sessionStorage") && js.contains("'fabric-token'"), "the token is kept in sessionStorage");
    assert!(!js.contains("localStorage"), "never beyond the session");
    // Everything else still needs the token.
    let (status, _, _) = call(&app, "GET", "/ui/../v1/runs", None, false).await;
    assert_ne!(status, StatusCode::OK);
    let (status, _, _) = call(&app, "GET", "/ui/secret", None, false).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Reads Server-Sent Events from an in-process response until `done` says so (or 20 s pass).
pub(crate) async fn read_sse(body: axum::body::Body, mut done: impl FnMut(&[(String, Value)]) -> bool) -> Vec<(String, Value)> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(&events) {
        let chunk = tokio::time::timeout_at(deadline, stream.next()).await.expect("the stream answers in time");
        let Some(Ok(chunk)) = chunk else { break };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let kind = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("message").to_owned();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                events.push((kind, serde_json::from_str(data).unwrap()));
            }
        }
    }
    events
}

#[tokio::test]
async fn the_run_list_streams_new_runs_and_their_status_changes() {
    let (app, _stub) = app(None, authed(ApiConfig::default())).await;
    // An older run is sent first; then the new one and its changes, live.
    let (_, _, old) =
        call(&app, "POST", "/v1/runs?wait=true", Some(json!({"route_id": "support-triage", "goal": {"ticket": "a"}, "model_profile": "default"})), true).await;
    let (status, _, _) = call(&app, "GET", "/v1/runs/updates", None, false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, body) = call(&app, "GET", "/v1/runs/updates?status=nope", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_request")));
    let req = Request::builder().uri("/v1/runs/updates").header("authorization", format!("Bearer {TOKEN}")).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let starter = app.clone();
    let started = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (_, _, accepted) =
            call(&starter, "POST", "/v1/runs", Some(json!({"route_id": "support-agent", "goal": {"q": 1}, "model_profile": "default"})), true).await;
        let id = accepted["run_id"].as_str().unwrap().to_owned();
        settled_in(&starter, &id).await;
        // Long enough for the stream's reads (every 500 ms) to see it asking.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Answered: its status changes again.
        let (status, _, _) = call(&starter, "POST", &format!("/v1/runs/{id}/reply"), Some(json!({"message": "order 42"})), true).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        id
    });
    let events = read_sse(response.into_body(), |events| events.iter().any(|(_, r)| r["status"] == "completed" && r["route_id"] == "support-agent")).await;
    let id = started.await.unwrap();
    assert!(events.iter().all(|(kind, _)| kind == "run"));
    assert_eq!(events[0].1["run_id"], old["run_id"], "the runs there already come first");
    let new: Vec<&str> = events.iter().filter(|(_, r)| r["run_id"] == id.as_str()).map(|(_, r)| r["status"].as_str().unwrap()).collect();
    assert!(new.contains(&"awaiting_input") && new.last() == Some(&"completed"), "{new:?}");
    let run = &events.iter().rev().find(|(_, r)| r["run_id"] == id.as_str()).unwrap().1;
    assert_eq!(run["route_id"], "support-agent");
    assert!(run["created_at"].is_string() && run["updated_at"].is_string());
}

/// Waits until a run ended or asked (in-process).
async fn settled_in(app: &axum::Router, id: &str) -> Value {
    for _ in 0..200 {
        let (_, _, run) = call(app, "GET", &format!("/v1/runs/{id}"), None, true).await;
        if !matches!(run["status"].as_str(), Some("queued" | "running")) {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {id} did not settle");
}

#[tokio::test]
async fn a_run_record_holds_its_prompts_user_messages_and_replies_as_received() {
    let (app, _stub) = app(None, authed(ApiConfig::default())).await;
    let (_, _, run) = call(
        &app,
        "POST",
        "/v1/runs?wait=true",
        Some(json!({"route_id": "support-triage", "goal": {"ticket": "<script>alert(1)</script>"}, "model_profile": "default"})),
        true,
    )
    .await;
    assert_eq!(run["status"], "completed", "{run}");
    let id = run["run_id"].as_str().unwrap();
    let (status, _, record) = call(&app, "GET", &format!("/v1/runs/{id}/record"), None, false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{record}");
    let (status, _, record) = call(&app, "GET", &format!("/v1/runs/{id}/record"), None, true).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((record["run_id"].as_str(), record["route_id"].as_str(), record["status"].as_str()), (Some(id), Some("support-triage"), Some("completed")));
    assert_eq!(record["request"]["goal"]["ticket"], "<script>alert(1)</script>");
    let entries = record["entries"].as_array().unwrap();
    let replies: Vec<&Value> = entries.iter().filter(|e| e["entry"] == "model_reply").collect();
    assert_eq!(replies.iter().map(|e| e["stage_id"].as_str().unwrap()).collect::<Vec<_>>(), ["intake", "lookup", "answer"]);
    for r in &replies {
        for field in ["system", "user", "raw", "value"] {
            assert!(r[field].is_string(), "{field} in {r}");
        }
        assert!(!r["system"].as_str().unwrap().is_empty());
    }
    // The whole prompt, though the store keeps it once for every run (by digest).
    assert_eq!(replies[1]["system"], "Write one short knowledge-base search query for the customer's problem.\n");
    assert!(replies[0]["user"].as_str().unwrap().contains("<script>alert(1)</script>"), "the user message as sent");
    let completed = entries.iter().filter(|e| e["entry"] == "stage_completed").count();
    assert_eq!(completed, 3);
    let (status, _, body) = call(&app, "GET", "/v1/runs/nope/record", None, true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
}

/// The unknown-route 404 of a start and of a graph lists the routes there are: the first 20 by
/// name, then how many more.
#[tokio::test]
async fn an_unknown_route_lists_the_known_ones() {
    use fabric::catalogue::SourceFile;
    let mut text = String::from("profiles: {default: {}}\nworkflows: {w: {stages: [{id: a, llm_role: synthesis}]}}\nroutes:\n");
    for i in 1..=23 {
        text.push_str(&format!("  r{i:02}: {{model_profile: default, prompt_pack: p, workflow: w}}\n"));
    }
    let settings = Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let runtime = fabric::runtime::Durable::new(
        Runtime::builder()
            .settings(settings)
            .catalogue_texts(
                vec![SourceFile { path: "routes/many.yaml".into(), text }],
                vec![SourceFile { path: "packs/p.yaml".into(), text: "host: H\n".into() }],
            )
            .build()
            .unwrap(),
        fabric::store::open("sqlite::memory:").await.unwrap(),
    );
    let app = router(AppState::new(Arc::new(runtime), authed(ApiConfig::default())));
    let names: Vec<String> = (1..=20).map(|i| format!("r{i:02}")).collect();
    let expected = format!("unknown route `nope`; known routes: {} and 3 more", names.join(", "));
    let (status, _, body) = call(&app, "POST", "/v1/runs", Some(json!({"route_id": "nope", "goal": {}, "model_profile": "default"})), true).await;
    assert_eq!(
        (status, body["error"]["code"].as_str(), body["error"]["message"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"), Some(expected.as_str()))
    );
    let (status, _, body) = call(&app, "GET", "/v1/routes/nope/graph.svg", None, true).await;
    assert_eq!((status, body["error"]["message"].as_str()), (StatusCode::NOT_FOUND, Some(expected.as_str())));
}
