//! MCP servers as tool sources (issue #31): routes call the tools of a real MCP server, the
//! official Python SDK's `MCPServer` (`examples/mcp/server.py`, `mcp` pinned, in a venv of its
//! own), over stdio and over Streamable HTTP. Results, `isError`, arguments refused before the
//! call, a timeout, a server that dies mid-run (started again, the loop goes on), a `kill -9` of
//! `fabric serve` whose resumed run makes no second call, and `routes check --connect`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::catalogue::Layers;
use fabric::config::Settings;
use fabric::events::{Event, MemorySink};
use fabric::exec::{RunRequest, RunResult, RunStatus};
use fabric::llm::stub::StubLlm;
use fabric::runtime::Runtime;
use serde_json::{Value, json};

use crate::support::{packs_dir, repo, routes_dir, stub_dir};

/// The official MCP SDK for Python, pinned.
const MCP_PACKAGE: &str = "mcp==2.3.0";

fn python() -> Option<PathBuf> {
    crate::support::python_venv("mcp-venv", MCP_PACKAGE, "import mcp.server", "the MCP client tests run the official Python SDK's MCPServer")
}

fn server_py() -> String {
    repo().join("examples/mcp/server.py").to_str().unwrap().to_owned()
}

/// A catalogue layer over the fixture routes: the MCP server `kb` (as `server` declares it), the
/// capabilities `order_status` (`lookup_order`) and `slow` (`hang`, 300 ms), and the route
/// `mcp-agent` over them and three tools of `tools_from: kb`; the route `mcp-stage`, a
/// workflow whose one stage is the tool `order_status` (the goal its arguments).
fn catalogue(dir: &Path, server: &str) {
    let yaml = format!(
        "mcp_servers:\n  kb:\n{server}\ncapabilities:\n  order_status:\n    description: The status of an order.\n    invoke: {{mcp: kb, tool: lookup_order}}\n  slow:\n    invoke: {{mcp: kb, tool: hang, timeout_ms: 300}}\nroutes:\n  mcp-agent:\n    model_profile: default\n    prompt_pack: support\n    decision_loop:\n      tools: [order_status, slow]\n      tools_from: kb\n      only: [search, fail, crash]\n  mcp-stage:\n    model_profile: default\n    prompt_pack: support\n    workflow: order-lookup\nworkflows:\n  order-lookup:\n    stages: [{{id: status, llm_role: none, capability: order_status}}]\n"
    );
    std::fs::write(dir.join("mcp.yaml"), yaml).unwrap();
}

fn stdio_server(python: &Path, calls: &Path) -> String {
    format!("    command: [{:?}, {:?}]\n    env: {{MCP_CALLS_FILE: {:?}}}", python.to_str().unwrap(), server_py(), calls.to_str().unwrap())
}

/// A folder with the catalogue layer of a stdio `kb` and the file its calls are counted in;
/// `None` when there is no Python to run the server with (a skip).
fn stdio_catalogue() -> Option<(tempfile::TempDir, PathBuf)> {
    let python = python()?;
    let dir = tempfile::tempdir().unwrap();
    let calls_file = dir.path().join("calls.txt");
    catalogue(dir.path(), &stdio_server(&python, &calls_file));
    Some((dir, calls_file))
}

/// The tools called, in order, as the server recorded them (`TOOL ARGS` lines).
fn calls(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file).unwrap_or_default().lines().map(str::to_owned).collect()
}

fn runtime(dir: &Path, script: &[&str], vars: Vec<(&'static str, String)>) -> Runtime {
    let stub = StubLlm::default().strict(true).script("mcp-agent", "decide", script);
    Runtime::builder()
        .settings(Settings::load(|_| None).unwrap())
        .catalogue_dirs(Layers::new(vec![routes_dir(), dir.to_path_buf()]).unwrap(), packs_dir())
        .stub(stub)
        .vars(move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .build()
        .unwrap()
}

async fn run(rt: &Runtime) -> (RunResult, Vec<Value>) {
    run_route(rt, "mcp-agent", json!({"question": "Was order 42 refunded?"})).await
}

async fn run_route(rt: &Runtime, route: &str, goal: Value) -> (RunResult, Vec<Value>) {
    let sink = Arc::new(MemorySink::default());
    let goal = goal.as_object().unwrap().clone();
    let out = rt.run(RunRequest { route_id: route.into(), goal, prefetch: vec![] }, sink.clone(), fabric::cancel::Cancel::never()).await.unwrap();
    (out.result, sink.events().iter().map(Event::to_json).collect())
}

/// The `run.tool.*` events as `type tool server class-or-status`.
fn tool_events(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("run.tool.")))
        .map(|e| {
            let d = e;
            let how = d.get("reason_class").or(d.get("status")).or(d.get("method")).cloned().unwrap_or(Value::Null);
            format!(
                "{} {} {} {}",
                e["type"].as_str().unwrap(),
                d["tool"].as_str().unwrap(),
                d["mcp_server"].as_str().unwrap_or("-"),
                how.as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Results, `isError`, bad arguments, a timeout: each a note, and the loop goes on.
async fn results_errors_bad_arguments_and_a_timeout(rt: &Runtime, calls_file: &Path) {
    let (result, events) = run(rt).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.output(), Some("Order 42 was refunded."));
    assert_eq!(result.notes.len(), 5, "{:#?}", result.notes);
    // structuredContent as compact JSON; the text content of a tool with no structured result.
    assert_eq!(result.notes[0], r#"search: {"hits":[{"id":7,"title":"Refunds for duplicate charges"}]}"#);
    assert_eq!(result.notes[1], "order_status: Order 42 was refunded on 2026-11-30.");
    assert!(result.notes[2].starts_with("fail: error: tool_failed:") && result.notes[2].contains("cannot do that: not today"), "{}", result.notes[2]);
    assert!(result.notes[3].starts_with("search: error: invalid_tool_arguments:"), "{}", result.notes[3]);
    assert!(result.notes[4].starts_with("slow: error: tool_timeout:") && result.notes[4].contains("300 ms"), "{}", result.notes[4]);
    assert_eq!(
        tool_events(&events),
        [
            "run.tool.started search kb mcp",
            "run.tool.completed search kb ok",
            "run.tool.started order_status kb mcp",
            "run.tool.completed order_status kb ok",
            "run.tool.started fail kb mcp",
            "run.tool.failed fail kb tool_failed",
            // Refused before anything was sent: no start.
            "run.tool.failed search kb invalid_tool_arguments",
            "run.tool.started slow kb mcp",
            "run.tool.failed slow kb tool_timeout",
        ]
    );
    assert_eq!(
        calls(calls_file),
        [
            r#"search {"limit": 3, "q": "duplicate charge"}"#,
            r#"lookup_order {"order_id": "42"}"#,
            r#"fail {"reason": "not today"}"#,
            r#"hang {"seconds": 5.0}"#
        ],
        "the bad arguments never reached the server"
    );
}

const SCRIPT: [&str; 6] = [
    r#"CALL search {"q":"duplicate charge"}"#,
    r#"CALL order_status {"order_id":"42"}"#,
    r#"CALL fail {"reason":"not today"}"#,
    r#"CALL search {"q":7}"#,
    r#"CALL slow {"seconds":5}"#,
    "DONE Order 42 was refunded.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_s_tools_are_called_and_their_errors_noted() {
    let Some((dir, calls_file)) = stdio_catalogue() else { return };
    let rt = runtime(dir.path(), &SCRIPT, vec![]);
    results_errors_bad_arguments_and_a_timeout(&rt, &calls_file).await;
    rt.mcp().stop().await;
}

/// Starts the server over Streamable HTTP on `port`, else on a free loopback port.
fn http_server(python: &Path, calls_file: &Path, port: Option<u16>) -> (Child, u16) {
    let port = port.unwrap_or_else(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let child = Command::new(python)
        .args([server_py(), "http".into(), port.to_string()])
        .env("MCP_CALLS_FILE", calls_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the MCP server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

/// The server over Streamable HTTP and a catalogue layer with `kb` at its URL (the port from the
/// environment, `KB_MCP_PORT`, as a deployment would give it; `more` added to its declaration):
/// the folder, the calls file, the Python, the server's process and port.
fn http_catalogue(more: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf, Child, u16)> {
    let python = python()?;
    let dir = tempfile::tempdir().unwrap();
    let calls_file = dir.path().join("calls.txt");
    let (child, port) = http_server(&python, &calls_file, None);
    catalogue(dir.path(), &format!("    url: \"http://127.0.0.1:${{KB_MCP_PORT}}/mcp\"{more}"));
    Some((dir, calls_file, python, child, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_s_tools_are_called_and_their_errors_noted() {
    let Some((dir, calls_file, _, mut child, port)) = http_catalogue("\n    headers: {X-Fabric-Test: \"${KB_MCP_PORT}\"}") else { return };
    let rt = runtime(dir.path(), &SCRIPT, vec![("KB_MCP_PORT", port.to_string())]);
    results_errors_bad_arguments_and_a_timeout(&rt, &calls_file).await;
    rt.mcp().stop().await;
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_dies_mid_run_is_started_again_and_the_loop_goes_on() {
    let Some((dir, calls_file)) = stdio_catalogue() else { return };
    let script = [r#"CALL crash {}"#, r#"CALL search {"q":"cancelling"}"#, "DONE Order 42 was refunded."];
    let rt = runtime(dir.path(), &script, vec![]);
    let (result, events) = run(&rt).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert!(result.notes[0].starts_with("crash: error: tool_connection:"), "{:#?}", result.notes);
    assert_eq!(result.notes[1], r#"search: {"hits":[{"id":31,"title":"Cancelling an order"}]}"#);
    assert_eq!(
        tool_events(&events),
        ["run.tool.started crash kb mcp", "run.tool.failed crash kb tool_connection", "run.tool.started search kb mcp", "run.tool.completed search kb ok"]
    );
    assert_eq!(calls(&calls_file), ["crash {}", r#"search {"limit": 3, "q": "cancelling"}"#], "the second call went to a new process");
    rt.mcp().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_stage_calls_its_mcp_tool_with_the_goal_checked_first() {
    let Some((dir, calls_file)) = stdio_catalogue() else { return };
    let rt = runtime(dir.path(), &[], vec![]);
    let (result, events) = run_route(&rt, "mcp-stage", json!({"order_id": "42"})).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.output(), Some("Order 42 was refunded on 2026-11-30."));
    assert_eq!(tool_events(&events), ["run.tool.started order_status kb mcp", "run.tool.completed order_status kb ok"]);
    // A goal that does not match the tool's schema (from the server) fails the stage unsent.
    let (result, events) = run_route(&rt, "mcp-stage", json!({"order": 42})).await;
    assert_eq!(result.status(), RunStatus::Failed, "{result:?}");
    assert_eq!(tool_events(&events), ["run.tool.failed order_status kb invalid_tool_arguments"]);
    assert_eq!(calls(&calls_file), [r#"lookup_order {"order_id": "42"}"#]);
    rt.mcp().stop().await;
}

/// A Streamable HTTP server restarted between two runs does not know the session the client
/// holds: the session is established again and the second run's call goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_streamable_http_session_is_established_again() {
    let Some((dir, calls_file, python, mut child, port)) = http_catalogue("") else { return };
    let rt = runtime(dir.path(), &[], vec![("KB_MCP_PORT", port.to_string())]);
    let (first, _) = run_route(&rt, "mcp-stage", json!({"order_id": "1"})).await;
    assert_eq!(first.status(), RunStatus::Completed, "{first:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let (mut child, _) = http_server(&python, &calls_file, Some(port));
    let (second, events) = run_route(&rt, "mcp-stage", json!({"order_id": "2"})).await;
    assert_eq!(second.status(), RunStatus::Completed, "{second:?}\n{events:#?}");
    assert_eq!(calls(&calls_file), [r#"lookup_order {"order_id": "1"}"#, r#"lookup_order {"order_id": "2"}"#]);
    rt.mcp().stop().await;
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn routes_check_connect_lists_the_tools_and_locates_a_missing_one() {
    let Some((dir, calls_file)) = stdio_catalogue() else { return };
    // A second route names a tool the server does not have.
    let bad =
        "routes:\n  mcp-typo:\n    model_profile: default\n    prompt_pack: support\n    decision_loop:\n      tools_from: kb\n      only: [search, serch]\n";
    std::fs::write(dir.path().join("typo.yaml"), bad).unwrap();
    let layers = format!("{}:{}", routes_dir().display(), dir.path().display());
    let check = |connect: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.args(["--catalogue", &layers, "--prompt-packs", packs_dir().to_str().unwrap(), "routes", "check"]);
        if connect {
            cmd.arg("--connect");
        }
        cmd.output().unwrap()
    };
    // Without a connection the files are all there is to check.
    let offline = check(false);
    assert!(offline.status.success(), "{}", String::from_utf8_lossy(&offline.stderr));
    let out = check(true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("mcp kb: 5 tool(s): search, lookup_order, fail, hang, crash"), "{stdout}");
    let typo = dir.path().join("typo.yaml");
    let expected = format!("{}:7:22: MCP server `kb` has no tool `serch` (its tools: search, lookup_order, fail, hang, crash)", typo.display());
    assert!(stdout.lines().any(|l| l == expected), "{expected}\nin\n{stdout}");
    assert!(calls(&calls_file).is_empty(), "listing calls no tool");
}

/// `kill -9` of `fabric serve` once a tool's result is recorded: the replica that takes the run
/// over reads it from the journal and calls the server no second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_after_kill_9_makes_no_second_call_for_a_recorded_result() {
    use crate::service::{Server, post, settled};
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let calls_file = dir.path().join("calls.txt");
    let cat = dir.path().join("catalogue");
    std::fs::create_dir(&cat).unwrap();
    catalogue(&cat, &stdio_server(&python, &calls_file));
    let stub = dir.path().join("stub");
    crate::support::copy_dir(&stub_dir(), &stub);
    std::fs::write(stub.join("mcp-agent.yaml"), "stages:\n  decide:\n    - 'CALL search {\"q\":\"duplicate charge\"}'\n    - 'DONE Refunded.'\n").unwrap();
    let db = format!("sqlite://{}", dir.path().join("runs.db").display());
    let layers = format!("{}:{}", routes_dir().display(), cat.display());
    let env = [("FABRIC_CATALOGUE_DIR", layers.as_str()), ("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_LLM_STUB_LATENCY_MS", "1500"), ("FABRIC_CLAIM_POLL_MS", "100")];
    let mut first = Server::start(&db, &stub, &env);
    let goal = json!({"route_id": "mcp-agent", "goal": {"question": "Was I refunded?"}, "model_profile": "default"});
    let (code, run) = post(&first, "/v1/runs", goal).await;
    assert_eq!(code, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    // Killed once the tool's stage is recorded: the second decision (1.5 s) is in flight.
    let store = fabric::store::open(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.events_after(&id, 0).await.unwrap().iter().any(|e| e.kind == "run.stage.completed" && e.body.contains(r#""stage_id":"search""#)) {
        assert!(Instant::now() < deadline, "the tool's stage was never recorded\n{}", first.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    assert_eq!(calls(&calls_file).len(), 1);
    let second = Server::start(&db, &stub, &env);
    let view = settled(&second, &id).await;
    assert_eq!(view["status"], "completed", "{view}\n{}", second.logs());
    assert_eq!(calls(&calls_file), [r#"search {"limit": 3, "q": "duplicate charge"}"#], "the recorded result was not asked for again");
}

/// The example of docs/mcp.md as a user runs it: the shipped routes with `examples/mcp/routes`
/// layered over them, the example server started by `fabric run` and gone when it exits.
#[test]
fn the_shipped_example_runs_offline() {
    let Some(python) = python() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .env("MCP_PYTHON", &python)
        .env("FABRIC_LLM_STUB", "1")
        .args(["--catalogue", "routes:examples/mcp/routes", "--stub-dir", "examples/mcp/stub", "run", "kb-agent"])
        .args(["--goal", r#"{"question": "Was order 42 refunded?"}"#])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["output"], "Order 42 was refunded on 2026-11-30.");
    assert_eq!(result["notes"][0], r#"search: {"hits":[{"id":7,"title":"Refunds for duplicate charges"}]}"#);
    // `doctor` names the server and whether its variables are set, never their values.
    let doctor = |python: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.current_dir(repo()).env("FABRIC_LLM_STUB", "1").env_remove("MCP_PYTHON").args(["--catalogue", "routes:examples/mcp/routes", "doctor"]);
        if let Some(p) = python {
            cmd.env("MCP_PYTHON", p);
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    let line = "  mcp server kb: stdio `${MCP_PYTHON} examples/mcp/server.py`; variables: MCP_PYTHON";
    assert!(doctor(Some(&python)).contains(&format!("{line} set\n")), "{}", doctor(Some(&python)));
    assert!(doctor(None).contains(&format!("{line} UNSET\n")), "{}", doctor(None));
}
