//! Shared test helpers: paths, a recording LLM backend, tiny HTTP tool servers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fabric::llm::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo};

/// The repository root (tests run with the package directory `runtime/` as cwd).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// The Python of a venv named `name` under cargo's scratch folder with `requirement` installed
/// (`pip install`), made once and kept between runs; `ready` is Python code that exits 0 once it
/// is there. `None` when there is no `python3` with `venv` here: a skip (a failure under CI),
/// `why` saying which tests need it.
pub fn python_venv(name: &str, requirement: &str, ready: &str, why: &str) -> Option<PathBuf> {
    // One maker at a time: two tests must not pip into one venv at once.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin/python");
    if std::process::Command::new(&python).args(["-c", ready]).output().is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    let made = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).output().is_ok_and(|o| o.status.success());
    if skip_unless(made, "python3 with venv", why) {
        return None;
    }
    let pip = std::process::Command::new(venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check", requirement]).output().unwrap();
    assert!(pip.status.success(), "pip install {requirement}: {}", String::from_utf8_lossy(&pip.stderr));
    Some(python)
}

/// `python script` with `input` on its stdin, to its exit (its output captured).
pub fn run_python(python: &Path, script: &Path, input: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut child = std::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// The catalogue the tests of behaviour run on: a copy of the shipped routes (with
/// `profiles.yaml`), their prompt packs and stub scripts, under `tests/fixtures/catalogue/`.
/// `routes/` is where users add their own routes; a test that read it would count theirs, or
/// trip over one being written. `catalogue::the_fixture_catalogue_is_the_shipped_one` keeps the
/// copy equal to the shipped files, since snapshots and expected outputs were taken of those.
pub fn routes_dir() -> PathBuf {
    fixtures().join("catalogue/routes")
}

/// The fixture catalogue's prompt packs (see `routes_dir`).
pub fn packs_dir() -> PathBuf {
    fixtures().join("catalogue/prompt-packs")
}

/// The fixture catalogue's stub scripts (see `routes_dir`).
pub fn stub_dir() -> PathBuf {
    fixtures().join("catalogue/stub")
}

/// The fixture catalogue, loaded.
pub fn fixture_catalogue() -> fabric::catalogue::Catalogue {
    fabric::catalogue::load(&routes_dir(), &packs_dir())
}

/// The variables that point a `fabric` process at the fixture catalogue; a test's own settings
/// (set after these, or as `--catalogue`/`--prompt-packs`/`--stub-dir`) take precedence.
pub fn fixture_env() -> [(&'static str, String); 3] {
    let s = |p: PathBuf| p.to_str().unwrap().to_owned();
    [("FABRIC_CATALOGUE_DIR", s(routes_dir())), ("FABRIC_PROMPT_PACKS_DIR", s(packs_dir())), ("FABRIC_LLM_STUB_DIR", s(stub_dir()))]
}

/// The catalogue of the streaming tests: the fixture routes with `two-streams` over them (two
/// synthesis stages with no output schema: each stage's output is its text as streamed), for
/// `FABRIC_CATALOGUE_DIR`; and the stub directory with its script.
pub fn two_streams() -> (String, PathBuf) {
    let dir = fixtures().join("streaming");
    (format!("{}:{}", routes_dir().display(), dir.join("routes").display()), dir.join("stub"))
}

/// `fabric-bench` beside the `fabric` under test, where `fabric bench` (the forwarder) looks for
/// it, when it is there and current; else `None`, the test skipping (`skip_unless`: a failure
/// under `CI=true`).
///
/// Cargo builds a package's binaries for its own integration tests only (`CARGO_BIN_EXE_*`), and
/// `fabric-bench` is another package of the workspace (it depends on this one, so it cannot be a
/// dependency of these tests). `cargo test --workspace` (`.ci/test`) builds it anyway, into the
/// same directory and before any test runs, because its package has integration tests of its
/// own; a narrower `cargo test -p fabric-runtime` does not, and no test runs cargo: `cargo build
/// -p fabric-bench` (same profile and target directory) puts it there. One older than a source
/// it is built from ([`is_current`]) is not used either: it would test code that is not the
/// tree's.
pub fn fabric_bench() -> Option<PathBuf> {
    let fabric = PathBuf::from(env!("CARGO_BIN_EXE_fabric"));
    let bench = fabric.with_file_name(format!("fabric-bench{}", std::env::consts::EXE_SUFFIX));
    let why = if !bench.is_file() {
        format!("not built at {} (`cargo test --workspace` builds it, as .ci/test does; or `cargo build -p fabric-bench`)", bench.display())
    } else if !is_current(&bench) {
        format!("{} is older than its sources (`cargo build -p fabric-bench`, or `cargo test --workspace` as .ci/test does)", bench.display())
    } else {
        return Some(bench);
    };
    (!skip_unless(false, "fabric-bench", &why)).then_some(bench)
}

/// Whether `exe` is newer than every file it is built from that this tree holds: the bench's
/// and the library's sources (`bench/src`, `runtime/src`, their `include_str!` files among them)
/// and the manifests. Not the dep-info file beside it: cargo writes that one only when it builds
/// the binary itself (`cargo build`), not when it builds it for another package's tests (`cargo
/// test --workspace`), so it may be missing or an older build's.
fn is_current(exe: &Path) -> bool {
    let Ok(built) = std::fs::metadata(exe).and_then(|m| m.modified()) else { return false };
    let mut files: Vec<PathBuf> = ["Cargo.toml", "Cargo.lock", "bench/Cargo.toml", "runtime/Cargo.toml"].iter().map(|f| repo().join(f)).collect();
    let mut dirs = vec![repo().join("bench/src"), repo().join("runtime/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
    }
    files.iter().all(|f| std::fs::metadata(f).and_then(|m| m.modified()).is_ok_and(|m| m <= built))
}

pub use crate::skip::skip_unless;

/// `.ci/test` passes its arguments to `cargo test --workspace`, lists the skips recorded meanwhile
/// (each once) and exits with cargo's status. Cargo here is a stand-in script on `PATH` that
/// records what a skipping test would: running the real suite inside itself would take minutes.
#[test]
fn the_test_command_lists_the_skips_after_cargo() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("cargo");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"cargo $*\"\nif [ \"$3\" = skip ]; then\n  for i in 1 2; do echo 'store::t: PostgreSQL: unset' >>\"$FABRIC_TEST_SKIPS\"; done\nfi\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |arg: &str| {
        let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        // Its own target directory: the skip file of a `.ci/test` running these tests is not touched.
        let out =
            std::process::Command::new(repo().join(".ci/test")).arg(arg).env("PATH", path).env("CARGO_TARGET_DIR", dir.path().join("target")).output().unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    let (code, out) = run("skip");
    assert_eq!(code, Some(3), "{out}");
    assert!(out.starts_with("cargo test --workspace skip\n"), "{out}");
    assert!(out.ends_with("1 test(s) skipped, in whole or in part (what they need: why it is missing):\n  store::t: PostgreSQL: unset\n"), "{out}");
    let (code, out) = run("none");
    assert_eq!((code, out.as_str()), (Some(3), "cargo test --workspace none\nno test skipped\n"), "the file is cleared first");
}

/// Replaces the absolute repository path so snapshots are portable.
pub fn portable(text: &str) -> String {
    text.replace(&format!("{}/", repo().display()), "")
}

/// What a backend was asked, for assertions on system text and user message.
#[derive(Debug, Clone)]
pub struct Seen {
    pub system: String,
    pub user: String,
}

/// Wraps another backend and records every request it passes on.
pub struct Recording<L> {
    pub inner: L,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl<L: Llm> Llm for Recording<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        self.seen.lock().unwrap().push(Seen { system: req.system.to_owned(), user: req.user.to_owned() });
        self.inner.complete(req)
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}

/// Serves `app` on a loopback port; returns its base URL.
/// The knowledge-base server of support-triage's and support-agent's `kb_search`: hits for a
/// query, a 500 for `boom`, a 400 without `q`.
pub async fn kb_server() -> String {
    use axum::extract::Query;
    use serde_json::json;
    let app = axum::Router::new().route(
        "/search",
        axum::routing::get(|Query(q): Query<std::collections::HashMap<String, String>>| async move {
            match q.get("q").map(String::as_str) {
                Some("boom") => Err((axum::http::StatusCode::INTERNAL_SERVER_ERROR, "index offline")),
                Some(query) => Ok(axum::Json(json!({"hits": [{"id": 7, "title": format!("Refunds for {query}")}]}))),
                None => Err((axum::http::StatusCode::BAD_REQUEST, "missing q")),
            }
        }),
    );
    serve(app).await
}

pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

/// One recorded request to a fake provider.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    /// The query string, without the `?` (Azure OpenAI's `api-version`).
    pub query: Option<String>,
    pub headers: axum::http::HeaderMap,
    pub body: serde_json::Value,
}

/// A canned reply: status, extra headers, body; or a delay before answering.
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: std::time::Duration,
}

impl Canned {
    pub fn json(status: u16, body: serde_json::Value) -> Canned {
        Canned { status, headers: vec![], body: body.to_string(), delay: std::time::Duration::ZERO }
    }
}

/// An in-process provider: answers with queued replies, else with `fallback(request body)`.
#[derive(Clone)]
pub struct FakeProvider {
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    queue: Arc<Mutex<std::collections::VecDeque<Canned>>>,
    fallback: Arc<dyn Fn(&serde_json::Value) -> Canned + Send + Sync>,
}

impl FakeProvider {
    pub fn new(fallback: impl Fn(&serde_json::Value) -> Canned + Send + Sync + 'static) -> FakeProvider {
        FakeProvider { requests: Arc::default(), queue: Arc::default(), fallback: Arc::new(fallback) }
    }

    pub fn push(&self, reply: Canned) -> &Self {
        self.queue.lock().unwrap().push_back(reply);
        self
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// Starts the fake on a loopback port; returns its base URL.
    pub async fn start(&self) -> String {
        let me = self.clone();
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let me = me.clone();
            async move {
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                me.requests.lock().unwrap().push(Recorded { path: uri.path().to_owned(), query: uri.query().map(str::to_owned), headers, body: body.clone() });
                let canned = me.queue.lock().unwrap().pop_front().unwrap_or_else(|| (me.fallback)(&body));
                if !canned.delay.is_zero() {
                    tokio::time::sleep(canned.delay).await;
                }
                let mut response = axum::response::Response::builder().status(canned.status).header("content-type", "application/json");
                for (k, v) in canned.headers {
                    response = response.header(k, v);
                }
                response.body(axum::body::Body::from(canned.body)).unwrap()
            }
        });
        serve(app).await
    }
}

/// The variables that point a `fabric` process at a fake OpenAI provider at `url` (no stub).
pub fn openai_env(url: String) -> Vec<(&'static str, String)> {
    vec![
        ("FABRIC_LLM_STUB", "0".to_owned()),
        ("FABRIC_LLM_MODEL", "openai:m".to_owned()),
        ("OPENAI_BASE_URL", url),
        ("OPENAI_API_KEY", "sk-test".to_owned()),
        ("FABRIC_LOG", "warn".to_owned()),
    ]
}

/// The reply support-triage's stages expect, chosen by the property names of the schema asked.
pub fn triage_reply_for(props: &[String]) -> serde_json::Value {
    if props.iter().any(|p| p == "category") {
        serde_json::json!({"category": "billing", "urgency": "high"})
    } else if props.iter().any(|p| p == "query") {
        serde_json::json!({"query": "duplicate charge refund"})
    } else {
        serde_json::json!({"text": "Refunded."})
    }
}

/// A provider target for tests: the given provider at a fake's URL, with a test key.
pub fn target(kind: fabric::config::ProviderKind, base_url: &str, model: &str) -> fabric::config::ProviderTarget {
    fabric::config::ProviderTarget {
        provider: kind,
        model: model.into(),
        base_url: base_url.into(),
        api_key: Some(fabric::config::ApiKey::new("test-key-123".into())),
        api_key_var: None,
        api_version: fabric::llm::model::DEFAULT_GEMINI_VERSION.into(),
        cloud: None,
    }
}

/// The fixture catalogue's profiles and packs, its route files named, and one extra file
/// `case.yaml`; the catalogue must load without errors.
pub fn catalogue_with(shipped: &[&str], case_yaml: &str) -> std::sync::Arc<fabric::catalogue::Catalogue> {
    let tmp = tempfile::tempdir().unwrap();
    let routes = tmp.path().join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    for f in ["profiles.yaml"].iter().chain(shipped) {
        std::fs::copy(routes_dir().join(f), routes.join(f)).unwrap();
    }
    std::fs::write(routes.join("case.yaml"), case_yaml).unwrap();
    let cat = fabric::catalogue::load(&routes, &packs_dir());
    assert_eq!(cat.error_count(), 0, "{:#?}", cat.diagnostics());
    std::sync::Arc::new(cat)
}

/// Runs the `fabric` binary in the repository with a clean configuration on the fixture
/// catalogue, plus `env`.
pub async fn fabric_cli(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric"));
    cmd.current_dir(repo()).args(args);
    for var in fabric::config::VARIABLES.iter().chain(["FABRIC_CONFIG", "KB_SEARCH_URL"].iter()) {
        cmd.env_remove(var);
    }
    cmd.envs(fixture_env());
    cmd.envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    cmd.output().await.unwrap()
}

/// The shipped provider fake replies of support-triage, for every provider.
pub fn reply_json(kind: fabric::config::ProviderKind, body: &serde_json::Value) -> serde_json::Value {
    use fabric::config::ProviderKind;
    use serde_json::json;
    let props = |schema: Option<&serde_json::Value>| -> Vec<String> {
        schema.and_then(|s| s.get("properties")).and_then(serde_json::Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default()
    };
    match kind {
        ProviderKind::Ollama => {
            let r = triage_reply_for(&props(body.get("format")));
            json!({"model": body["model"], "message": {"role": "assistant", "content": r.to_string()}, "done": true, "done_reason": "stop", "prompt_eval_count": 31, "eval_count": 9})
        }
        ProviderKind::OpenAi => {
            let r = triage_reply_for(&props(body.pointer("/response_format/json_schema/schema")));
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": r.to_string()}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 31, "completion_tokens": 9}})
        }
        ProviderKind::Gemini => {
            let r = triage_reply_for(&props(body.pointer("/generationConfig/responseJsonSchema")));
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": r.to_string()}]}, "finishReason": "STOP"}]})
        }
        ProviderKind::Anthropic | ProviderKind::HostedAnthropic(_) => {
            let r = triage_reply_for(&props(body.pointer("/tools/0/input_schema")));
            let name = body.pointer("/tool_choice/name").cloned().unwrap_or(json!("x"));
            json!({"content": [{"type": "tool_use", "id": "t", "name": name, "input": r}], "stop_reason": "tool_use", "usage": {"input_tokens": 31, "output_tokens": 9}})
        }
        ProviderKind::Bedrock | ProviderKind::BedrockConverse => {
            let r = triage_reply_for(&props(body.pointer("/toolConfig/tools/0/toolSpec/inputSchema/json")));
            let name = body.pointer("/toolConfig/toolChoice/tool/name").cloned().unwrap_or(json!("x"));
            json!({"output": {"message": {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": name, "input": r}}]}}, "stopReason": "tool_use", "usage": {"inputTokens": 31, "outputTokens": 9}})
        }
        ProviderKind::VertexAi => {
            let r = triage_reply_for(&props(body.pointer("/tools/0/functionDeclarations/0/parameters")));
            let name = body.pointer("/toolConfig/functionCallingConfig/allowedFunctionNames/0").cloned().unwrap_or(json!("x"));
            json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": name, "args": r}}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 31, "candidatesTokenCount": 9}})
        }
        ProviderKind::Compat(_) | ProviderKind::Ibm => compat_reply(body, &triage_reply_for(&props(compat_schema(body)))),
        ProviderKind::Cohere => cohere_reply(&triage_reply_for(&props(body.pointer("/response_format/schema")))),
    }
}

/// A Cohere v2 chat reply with `answer` (a string as it is, anything else as JSON text).
pub fn cohere_reply(answer: &serde_json::Value) -> serde_json::Value {
    let text = answer.as_str().map_or_else(|| answer.to_string(), str::to_owned);
    serde_json::json!({"id": "c-1", "finish_reason": "COMPLETE", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
                       "usage": {"billed_units": {"input_tokens": 31, "output_tokens": 9}}})
}

/// Where an OpenAI-compatible request carries its schema: the forced tool's parameters, or
/// `response_format`.
pub fn compat_schema(body: &serde_json::Value) -> Option<&serde_json::Value> {
    body.pointer("/tools/0/function/parameters").or_else(|| body.pointer("/response_format/json_schema/schema")).or_else(|| body.pointer("/text/format/schema"))
}

/// An OpenAI-compatible reply with `answer`: a call of the forced tool when the request forced
/// one, the message content otherwise.
pub fn compat_reply(body: &serde_json::Value, answer: &serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    if body.get("input").is_some() {
        // The Responses API (meta, langsmith): the answer as a message item's output_text.
        let text = answer.as_str().map_or_else(|| answer.to_string(), str::to_owned);
        return json!({"id": "resp_1", "object": "response", "status": "completed", "model": body["model"],
                      "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
                      "usage": {"input_tokens": 31, "output_tokens": 9, "total_tokens": 40}});
    }
    let message = match body.pointer("/tools/0/function/name") {
        Some(name) => {
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": answer.to_string()}}]})
        }
        None => json!({"role": "assistant", "content": answer.as_str().map_or_else(|| answer.to_string(), str::to_owned)}),
    };
    json!({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"], "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}})
}

/// The fields of an event of `kind` for tests that write events of their own and read only
/// their types and numbers: empty texts, zeros.
pub fn bare_data(kind: fabric::events::EventKind) -> fabric::events::EventData {
    use fabric::events::{EventData as D, EventKind as K, ToolStatus};
    let (s, ms) = (String::new, 0.0);
    match kind {
        K::RunStarted => D::RunStarted { model_profile: s(), path: "workflow", prefetch_chunks: 0, source: None, activation_target: None },
        K::StageStarted => D::StageStarted { llm_role: "none", stage_idx: 0, kind: "task" },
        K::StageCompleted => D::StageCompleted { duration_ms: ms, output: s(), output_chars: 0 },
        K::StageFailed => D::StageFailed { reason_class: fabric::failure::ReasonClass::Interrupted, message: s(), duration_ms: ms },
        K::LlmStarted => D::LlmStarted { provider: s(), model: s(), turn: 0, structured: false },
        K::LlmWaiting => D::LlmWaiting { limit: "concurrency", waited_ms: 0 },
        K::LlmRetrying => D::LlmRetrying { attempt: 2, delay_ms: 0, reason_class: fabric::failure::ReasonClass::Timeout, message: s() },
        K::LlmDelta => D::LlmDelta { turn: 0, attempt: 1, index: 0, text: s() },
        K::LlmRestarted => D::LlmRestarted { turn: 0, attempt: 2 },
        K::LlmFallback => D::LlmFallback { from: s(), to: s(), reason: "unavailable", reason_class: fabric::failure::ReasonClass::ServerError },
        K::LlmCompleted => D::LlmCompleted { duration_ms: ms, tokens: None },
        K::LlmFailed => D::LlmFailed { reason_class: fabric::failure::ReasonClass::Interrupted, message: s(), duration_ms: ms, reply: None },
        K::ToolStarted => D::ToolStarted { tool: s(), mcp_server: None, method: "in_process", url: None },
        K::ToolCompleted => D::ToolCompleted { tool: s(), mcp_server: None, status: ToolStatus::InProcess, bytes: 0, duration_ms: ms },
        K::ToolFailed => D::ToolFailed { tool: s(), mcp_server: None, reason_class: fabric::failure::ReasonClass::Interrupted, message: s() },
        K::RunCompleted => D::RunCompleted { output: None, duration_ms: ms },
        K::RunFailed => D::RunFailed { reason_class: fabric::failure::ReasonClass::Interrupted, message: s(), duration_ms: Some(ms), decisions: None },
        K::RunAwaitingInput => D::RunAwaitingInput { question: s(), duration_ms: ms },
        K::RunResumed => D::RunResumed { reply: s() },
        K::RunCancelled => D::RunCancelled { reason: s(), duration_ms: Some(ms) },
        K::CatalogueMoved => D::CatalogueMoved { from: None, to: s(), reason: s() },
    }
}

/// Copies the files of `from` (not its folders) into `to`, made if missing.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A temporary copy of the files of `from`, to change without touching the fixture.
pub fn temp_copy(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(from, dir.path());
    dir
}

/// One model call of `backend` as stage `stage_id` makes it (system `s`, user `u`), its events to
/// `events`, its text to `stream` when given.
pub async fn complete(
    backend: &dyn fabric::llm::Llm,
    events: &fabric::events::RunEvents,
    stage_id: &str,
    output: &fabric::llm::OutputSpec,
    stream: Option<&fabric::llm::stream::Deltas<'_>>,
) -> Result<fabric::llm::LlmReply, fabric::llm::LlmError> {
    let never = fabric::cancel::Cancel::never();
    let cx = opentelemetry::Context::current();
    let req = fabric::llm::LlmRequest {
        events,
        route_id: events.route_id(),
        stage_id,
        turn: 0,
        priority: 0,
        system: "s",
        user: "u",
        output,
        cx: &cx,
        cancel: &never,
        stream,
    };
    backend.complete(&req).await
}

/// The npm clients of `tests/fixtures/{fixture}` (a `package.json`, its `package-lock.json` and
/// the scripts) copied into the target directory's `{fixture}` folder and installed there with
/// `npm ci` (again only when the lock file changed); `None` when there is no `node` and `npm`
/// here (a skip, a failure under CI), `why` saying what they are for.
pub fn npm_clients(fixture: &str, why: &str) -> Option<PathBuf> {
    let present = ["node", "npm"].iter().all(|c| std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()));
    if skip_unless(present, "node and npm", why) {
        return None;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(fixture);
    std::fs::create_dir_all(&dir).unwrap();
    let fixtures = repo().join("tests/fixtures").join(fixture);
    for file in std::fs::read_dir(&fixtures).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
    }
    let lock = std::fs::read(fixtures.join("package-lock.json")).unwrap();
    let installed = dir.join("node_modules/.fabric-lock.json");
    if std::fs::read(&installed).ok() != Some(lock.clone()) {
        let npm = std::process::Command::new("npm").args(["ci", "--no-audit", "--no-fund", "--loglevel=error"]).current_dir(&dir).output().unwrap();
        assert!(npm.status.success(), "npm ci in {}: {}", dir.display(), String::from_utf8_lossy(&npm.stderr));
        std::fs::write(&installed, &lock).unwrap();
    }
    Some(dir)
}
