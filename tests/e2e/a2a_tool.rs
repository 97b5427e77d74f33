//! A route calling another fleet's route over A2A (issue 52, part 4): two `fabric serve`
//! processes, separate stores; the caller's decision loop calls its `partner` tool (`invoke:
//! {a2a: ...}`), the callee (`support-agent` on the asking stub) asks once, the caller's run asks
//! its user that question (across a restart of the caller: the callee's task id is in its
//! journal), the reply goes to the callee's task, and the callee's output is the tool's result,
//! journalled: a replay makes no call. A caller `kill -9`'d while the callee works on the reply
//! (SQLite, then PostgreSQL): another caller process continues the same task. A workflow stage (a
//! result; a question is the run's, its reply the agent's), a callee whose task fails, hostile answers (not JSON, a JSON-RPC
//! error, a huge body, a redirect, a slow drip), bad catalogue entries, `fabric doctor`, `routes
//! diff`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::service::{Server, TOKEN, asking_stub, client, post, settled};
use crate::support::{packs_dir, repo, routes_dir};

const CALLER_ROUTES: &str = r#"
capabilities:
  partner:
    description: The partner fleet's support agent.
    input_schema: {type: object, properties: {question: {type: string}}, required: [question]}
    invoke: {a2a: "${PARTNER_A2A_URL}/a2a/support-agent", skill: support-agent, token_env: PARTNER_A2A_TOKEN, timeout_ms: 20000}
  triage:
    description: The partner fleet's triage.
    input_schema: {type: object, properties: {ticket: {type: string}}, required: [ticket]}
    invoke: {a2a: "${PARTNER_A2A_URL}/a2a/support-triage", skill: support-triage, token_env: PARTNER_A2A_TOKEN}
  junk:
    description: An agent that answers badly.
    input_schema: {type: object, properties: {q: {type: string}}}
    invoke: {a2a: "${JUNK_A2A_URL}", skill: junk, token_env: PARTNER_A2A_TOKEN, timeout_ms: 3000, max_response_bytes: 4096}
routes:
  concierge:
    description: Asks the partner fleet.
    model_profile: default
    prompt_pack: support
    decision_loop: {tools: [partner, triage, junk]}
    max_loop_steps: 8
  relay:
    description: A workflow whose one stage is the partner's agent.
    model_profile: default
    prompt_pack: support
    workflow: relay
  relay-triage:
    description: A workflow whose one stage is the partner's triage.
    model_profile: default
    prompt_pack: support
    workflow: relay-triage
workflows:
  relay:
    stages:
      - {id: forward, llm_role: none, capability: partner}
  relay-triage:
    stages:
      - {id: forward, llm_role: none, capability: triage}
"#;

/// The caller's catalogue layer and stub: `concierge`'s decisions as `calls` says.
fn caller_files(calls: &[&str]) -> (tempfile::TempDir, tempfile::TempDir) {
    let (routes, stub) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(routes.path().join("concierge.yaml"), CALLER_ROUTES).unwrap();
    let lines: Vec<String> = calls.iter().map(|c| format!("    - {}\n", serde_json::to_string(c).unwrap())).collect();
    std::fs::write(stub.path().join("concierge.yaml"), format!("stages:\n  decide:\n{}", lines.concat())).unwrap();
    (routes, stub)
}

fn caller(db: &str, routes: &std::path::Path, stub: &std::path::Path, env: &[(&str, &str)]) -> Server {
    let catalogue = format!("{}:{}", routes_dir().display(), routes.display());
    let mut all = vec![("FABRIC_CATALOGUE_DIR", catalogue.as_str()), ("PARTNER_A2A_TOKEN", TOKEN)];
    all.extend_from_slice(env);
    Server::start(db, stub, &all)
}

async fn get(s: &Server, path: &str) -> Value {
    client().get(format!("{}{path}", s.url)).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap()
}

async fn runs_of(s: &Server, route: &str) -> Vec<Value> {
    let page = get(s, &format!("/v1/runs?route_id={route}")).await;
    page["runs"].as_array().unwrap().iter().filter(|r| r["route_id"] == route).cloned().collect()
}

async fn start(s: &Server) -> Value {
    let (status, run) = post(s, "/v1/runs?wait=true", json!({"route_id": "concierge", "goal": {"q": "refund?"}, "model_profile": "default"})).await;
    assert_eq!(status, 200, "{run}");
    run
}

#[tokio::test]
async fn a_route_calls_another_fleets_route_which_asks_once() {
    let (callee_dir, caller_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let callee_stub = asking_stub();
    let callee = Server::start(&format!("sqlite://{}", callee_dir.path().join("callee.db").display()), callee_stub.path(), &[]);
    let (routes, stub) = caller_files(&[r#"CALL partner {"question": "I was charged twice"}"#, "DONE The partner fleet refunded it."]);
    let db = format!("sqlite://{}", caller_dir.path().join("caller.db").display());
    let env = [("PARTNER_A2A_URL", callee.url.as_str())];
    let server = caller(&db, routes.path(), stub.path(), &env);

    let run = start(&server).await;
    assert_eq!((run["status"].as_str(), run["question"].as_str()), (Some("awaiting_input"), Some("Which order number?")), "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let events = crate::service::sse(&server, &id, None).await;
    let last: Vec<(&str, &Value)> = events[events.len() - 4..].iter().map(|e| (e.1.as_str(), &e.2)).collect();
    let kinds: Vec<&str> = last.iter().map(|e| e.0).collect();
    assert_eq!(kinds, ["run.tool.started", "run.tool.completed", "run.stage.completed", "run.awaiting_input"], "{events:?}");
    assert_eq!((last[0].1["method"].as_str(), last[2].1["stage_id"].as_str()), (Some("a2a"), Some("partner")));
    assert_eq!(last[0].1["url"].as_str(), Some(format!("{}/a2a/support-agent", callee.url).as_str()));
    let called = runs_of(&callee, "support-agent").await;
    assert_eq!(called.len(), 1, "one task on the callee: {called:?}");
    assert_eq!(called[0]["status"], "awaiting_input");
    let task_id = called[0]["run_id"].as_str().unwrap().to_owned();
    let record = get(&server, &format!("/v1/runs/{id}/record")).await;
    let asked: Vec<&Value> = record["entries"].as_array().unwrap().iter().filter(|e| e["entry"] == "tool_asked").collect();
    assert_eq!(asked.len(), 1, "the callee's task is journalled with the ask: {record}");
    assert_eq!((asked[0]["task_id"].as_str(), asked[0]["stage_id"].as_str()), (Some(task_id.as_str()), Some("partner")));

    // The caller's process stops between the question and the reply; another one takes the reply.
    let (exit, logs) = server.stop();
    assert!(exit.success(), "{logs}");
    assert!(!logs.contains(TOKEN), "the token is in no log line");
    let server = caller(&db, routes.path(), stub.path(), &env);
    let (status, done) = post(&server, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, done["status"].as_str(), done["output"].as_str()), (200, Some("completed"), Some("The partner fleet refunded it.")), "{done}");
    assert!(
        done["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("Order 42 is refunded.")),
        "the callee's output is the tool's result: {done}"
    );

    // The reply went to the same task, which completed; no second task was started.
    let called = runs_of(&callee, "support-agent").await;
    assert_eq!(called.len(), 1, "{called:?}");
    let task = settled(&callee, &task_id).await;
    assert_eq!((task["status"].as_str(), task["output"].as_str()), (Some("completed"), Some("Order 42 is refunded.")), "{task}");
    assert_eq!(task["notes"][0], "user: order 42", "the caller's user's reply reached the callee: {task}");
    let callee_events = get(&callee, &format!("/v1/runs/{task_id}")).await["next_seq"].clone();

    // The caller's journal holds the result; its events never show the token.
    let record = get(&server, &format!("/v1/runs/{id}/record")).await;
    let entries = record["entries"].as_array().unwrap();
    let result = entries.iter().find(|e| e["entry"] == "stage_completed" && e["stage_id"] == "partner").unwrap_or_else(|| panic!("{record}"));
    assert_eq!(result["value"], "Order 42 is refunded.");
    assert!(!record.to_string().contains(TOKEN), "no token in the record");
    let (exit, logs) = server.stop();
    assert!(exit.success() && !logs.contains(TOKEN), "{logs}");

    // A replay makes no call: the callee sees nothing new.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .args(["--catalogue", &format!("{}:{}", routes_dir().display(), routes.path().display())])
        .args(["--prompt-packs", packs_dir().to_str().unwrap(), "replay", &id, "--store", &db])
        .env("FABRIC_LLM_STUB", "1")
        .env("PARTNER_A2A_URL", &callee.url)
        .env("PARTNER_A2A_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("0 divergence(s); status completed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(runs_of(&callee, "support-agent").await.len(), 1);
    assert_eq!(get(&callee, &format!("/v1/runs/{task_id}")).await["next_seq"], callee_events, "no message reached the callee's task");
}

/// On the caller's SQLite file, then on PostgreSQL (when the tests have one).
#[tokio::test]
async fn a_caller_killed_while_its_reply_is_with_the_callee_continues_the_same_task() {
    let dir = tempfile::tempdir().unwrap();
    killed_while_waiting(&format!("sqlite://{}", dir.path().join("caller.db").display())).await;
    if let Some(url) = crate::store::fresh_postgres().await {
        killed_while_waiting(&url).await;
    }
}

/// `kill -9` of the caller after it sent the user's reply to the callee's task, while the callee
/// works on it: another caller process takes the run over from its journal (the callee's task
/// recorded with the ask, the reply after it) and waits for that task; no second task, the reply
/// taken once.
async fn killed_while_waiting(db: &str) {
    let callee_dir = tempfile::tempdir().unwrap();
    let callee_stub = asking_stub();
    let slow = [("FABRIC_LLM_STUB_LATENCY_MS", "1500")];
    let callee = Server::start(&format!("sqlite://{}", callee_dir.path().join("callee.db").display()), callee_stub.path(), &slow);
    let (routes, stub) = caller_files(&[r#"CALL partner {"question": "I was charged twice"}"#, "DONE The partner fleet refunded it."]);
    let env = [("PARTNER_A2A_URL", callee.url.as_str()), ("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_CLAIM_POLL_MS", "100")];
    let a = caller(db, routes.path(), stub.path(), &env);
    let run = start(&a).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let task_id = runs_of(&callee, "support-agent").await[0]["run_id"].as_str().unwrap().to_owned();
    let (status, _) = post(&a, &format!("/v1/runs/{id}/reply"), json!({"message": "order 42"})).await;
    assert_eq!(status, 202);
    // The callee took the reply and works on it (two slow model turns): the caller dies waiting.
    let mut took = false;
    for _ in 0..100 {
        if get(&callee, &format!("/v1/runs/{task_id}")).await["status"] == "running" {
            took = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(took, "the callee took the reply");
    a.signal("KILL");
    let b = caller(db, routes.path(), stub.path(), &env);
    // Running (the dead process's lease) until `b` takes it over and ends it.
    let done = settled(&b, &id).await;
    assert_eq!((done["status"].as_str(), done["output"].as_str()), (Some("completed"), Some("The partner fleet refunded it.")), "{done}");
    assert!(done["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("Order 42 is refunded.")), "{done}");
    let called = runs_of(&callee, "support-agent").await;
    assert_eq!(called.len(), 1, "no second task: {called:?}");
    let task = settled(&callee, &task_id).await;
    assert_eq!(task["status"], "completed", "{task}");
    let replies = task["notes"].as_array().unwrap().iter().filter(|n| n.as_str().unwrap().starts_with("user:")).count();
    assert_eq!(replies, 1, "the reply was taken once: {task}");
}

#[tokio::test]
async fn a_workflow_stage_takes_the_agents_result_and_its_question_is_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let callee_stub = asking_stub();
    let callee = Server::start(&format!("sqlite://{}", dir.path().join("callee.db").display()), callee_stub.path(), &[]);
    let (routes, stub) = caller_files(&["DONE ok"]);
    let server =
        caller(&format!("sqlite://{}", dir.path().join("caller.db").display()), routes.path(), stub.path(), &[("PARTNER_A2A_URL", callee.url.as_str())]);
    let (_, run) =
        post(&server, "/v1/runs?wait=true", json!({"route_id": "relay-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    let triaged = runs_of(&callee, "support-triage").await;
    assert_eq!(triaged.len(), 1, "{triaged:?}");
    let output = settled(&callee, triaged[0]["run_id"].as_str().unwrap()).await["output"].clone();
    assert_eq!((run["status"].as_str(), &run["output"]), (Some("completed"), &output), "the callee's output is the stage's: {run}");

    // The partner's agent asks: so does the workflow's run; the reply goes to the same task.
    let (_, run) = post(&server, "/v1/runs?wait=true", json!({"route_id": "relay", "goal": {"question": "refund?"}, "model_profile": "default"})).await;
    assert_eq!((run["status"].as_str(), run["question"].as_str()), (Some("awaiting_input"), Some("Which order number?")), "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let asked = runs_of(&callee, "support-agent").await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    let (status, done) = post(&server, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, done["status"].as_str(), done["output"].as_str()), (200, Some("completed"), Some("Order 42 is refunded.")), "{done}");
    let task = settled(&callee, asked[0]["run_id"].as_str().unwrap()).await;
    assert_eq!((task["status"].as_str(), &task["notes"][0]), (Some("completed"), &json!("user: order 42")), "the reply reached the same task: {task}");
    assert_eq!(runs_of(&callee, "support-agent").await.len(), 1, "no second task");
    let events = crate::service::sse(&server, &id, None).await;
    let kinds: Vec<(&str, Option<&str>)> = events.iter().map(|e| (e.1.as_str(), e.2["stage_id"].as_str())).collect();
    let resumed = kinds.iter().position(|k| k.0 == "run.resumed").unwrap_or_else(|| panic!("{kinds:?}"));
    assert_eq!(kinds[resumed + 1], ("run.stage.started", Some("forward")), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| k.0 == "run.stage.completed").count(), 2, "the question, then the result: {kinds:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "one run's events, numbered on");
}

#[tokio::test]
async fn a_callee_whose_task_fails_fails_the_tool_with_agent_task_failed() {
    let dir = tempfile::tempdir().unwrap();
    let callee_stub = asking_stub();
    // support-triage's first stage answers what its schema refuses: the callee's run fails.
    std::fs::write(callee_stub.path().join("support-triage.yaml"), "stages:\n  intake:\n    - 'not json at all'\n").unwrap();
    let callee = Server::start(&format!("sqlite://{}", dir.path().join("callee.db").display()), callee_stub.path(), &[]);
    let (routes, stub) = caller_files(&[r#"CALL triage {"ticket": "charged twice"}"#, "DONE Noted."]);
    let server =
        caller(&format!("sqlite://{}", dir.path().join("caller.db").display()), routes.path(), stub.path(), &[("PARTNER_A2A_URL", callee.url.as_str())]);
    let run = start(&server).await;
    assert_eq!(run["status"], "completed", "a tool error is a note, the loop goes on: {run}");
    let note = run["notes"][0].as_str().unwrap();
    assert!(note.starts_with("triage: error: agent_task_failed: tool `triage`: the agent's task ended failed: invalid_json"), "{note}");
    let events = crate::service::sse(&server, run["run_id"].as_str().unwrap(), None).await;
    let failed = events.iter().find(|e| e.1 == "run.tool.failed").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!((failed.2["tool"].as_str(), failed.2["reason_class"].as_str()), (Some("triage"), Some("agent_task_failed")));
    let started = events.iter().find(|e| e.1 == "run.tool.started").unwrap();
    assert_eq!(started.2["method"], "a2a", "{started:?}");
}

/// A raw HTTP server answering each request with the next of `answers` (status, headers, body),
/// recording each request's head.
async fn raw_server(answers: Vec<(u16, String, Vec<u8>)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for (status, headers, body) in answers {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let Ok(n) = socket.read(&mut buf).await else { break };
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            log.lock().unwrap().push(String::from_utf8_lossy(&got).into_owned());
            let head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n", body.len());
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&body).await;
            let _ = socket.shutdown().await;
        }
    });
    (url, seen)
}

#[tokio::test]
async fn hostile_answers_are_clean_tool_errors_and_no_redirect_is_followed() {
    let (elsewhere, reached) = raw_server(vec![(200, String::new(), b"{}".to_vec())]).await;
    let rpc_error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "no such task"}}).to_string();
    let answers = vec![
        (200, String::new(), b"<html>not json</html>".to_vec()),
        (200, String::new(), rpc_error.into_bytes()),
        (200, String::new(), vec![b'x'; 10_000]),
        (302, format!("location: {elsewhere}/steal\r\n"), Vec::new()),
    ];
    let (junk, seen) = raw_server(answers).await;
    let dir = tempfile::tempdir().unwrap();
    let (routes, stub) = caller_files(&[r#"CALL junk {"q": "a"}"#, r#"CALL junk {"q": "b"}"#, r#"CALL junk {"q": "c"}"#, r#"CALL junk {"q": "d"}"#, "DONE ok"]);
    let server = caller(&format!("sqlite://{}", dir.path().join("caller.db").display()), routes.path(), stub.path(), &[("JUNK_A2A_URL", junk.as_str())]);
    let run = start(&server).await;
    assert_eq!(run["status"], "completed", "{run}");
    let notes: Vec<&str> = run["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(notes.len(), 4, "{notes:?}");
    assert!(notes[0].starts_with("junk: error: tool_failed: tool `junk`: the agent's answer is not JSON"), "{notes:?}");
    assert!(notes[1].contains("tool_failed: tool `junk`: the agent answered JSON-RPC error -32001: no such task"), "{notes:?}");
    assert!(notes[2].contains("tool_response_too_large"), "{notes:?}");
    assert!(notes[3].contains("tool_http_status: tool `junk`: HTTP 302") && notes[3].contains("redirects are not followed"), "{notes:?}");
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 4);
    let first = requests[0].to_ascii_lowercase();
    assert!(first.contains("a2a-version: 1.0") && first.contains(&format!("authorization: bearer {}", TOKEN.to_ascii_lowercase())), "{first}");
    assert!(reached.lock().unwrap().is_empty(), "the redirect was not followed");
    let events = crate::service::sse(&server, run["run_id"].as_str().unwrap(), None).await;
    assert!(!format!("{events:?}").contains(TOKEN) && !run.to_string().contains(TOKEN), "the token is in no event");
    let (_, logs) = server.stop();
    assert!(!logs.contains(TOKEN));
}

#[tokio::test]
async fn a_slow_agent_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts, then drips one byte a second forever.
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n").await;
                while socket.write_all(b" ").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (routes, stub) = caller_files(&[r#"CALL junk {"q": "a"}"#, "DONE ok"]);
    let server = caller(&format!("sqlite://{}", dir.path().join("caller.db").display()), routes.path(), stub.path(), &[("JUNK_A2A_URL", url.as_str())]);
    let began = std::time::Instant::now();
    let run = start(&server).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(run["notes"][0].as_str().unwrap().contains("tool_timeout"), "{run}");
    assert!(began.elapsed() < Duration::from_secs(15), "bounded by timeout_ms: {:?}", began.elapsed());
}

#[test]
fn bad_a2a_entries_are_refused_where_they_are() {
    use fabric::catalogue::{SourceFile, load_from_texts};
    let text = r#"capabilities:
  a: {invoke: {a2a: "ftp://x/a2a/r", skill: s}}
  b: {invoke: {a2a: "https://x/a2a/r"}}
  c: {invoke: {a2a: "https://x/a2a/r", skill: s, token_env: "Bearer abc123"}}
  d: {invoke: {a2a: "https://x/a2a/r", skill: s, timeout_ms: 0, tokn: X}}
  e: {invoke: {a2a: "https://x/a2a/r", skill: "  "}}
"#;
    let cat = load_from_texts(&[SourceFile { path: "r/a.yaml".into(), text: text.into() }], &[]);
    let shown: Vec<String> = cat.diagnostics().iter().map(ToString::to_string).collect();
    let has = |at: &str, what: &str| assert!(shown.iter().any(|d| d.starts_with(at) && d.contains(what)), "{at} {what}: {shown:#?}");
    has("r/a.yaml:2:21:", "`invoke.a2a` `ftp://x/a2a/r` must start with http:// or https://");
    has("r/a.yaml:3:", "skill");
    has("r/a.yaml:4:", "`invoke.token_env` `Bearer abc123` is not an environment variable name");
    has("r/a.yaml:5:", "`invoke.timeout_ms`");
    has("r/a.yaml:5:", "tokn");
    has("r/a.yaml:6:", "`invoke.skill` must name the agent's skill");
    assert!(!shown.iter().any(|d| d.contains("abc123") && !d.contains("token_env")), "{shown:#?}");
}

#[test]
fn doctor_names_each_agent_and_whether_its_variables_are_set_never_a_value() {
    let (routes, _stub) = caller_files(&["DONE ok"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabric"))
        .current_dir(repo())
        .args(["--catalogue", &format!("{}:{}", routes_dir().display(), routes.path().display())])
        .args(["--prompt-packs", packs_dir().to_str().unwrap(), "doctor"])
        .env("FABRIC_LLM_STUB", "1")
        .env("PARTNER_A2A_TOKEN", "sekrit-4711")
        .env("PARTNER_A2A_URL", "https://user:pw@partner.example")
        .env_remove("JUNK_A2A_URL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "a2a agent partner: ${PARTNER_A2A_URL}/a2a/support-agent skill support-agent; token: PARTNER_A2A_TOKEN set; variables: PARTNER_A2A_URL set"
        ),
        "{text}"
    );
    assert!(text.contains("a2a agent junk: ${JUNK_A2A_URL} skill junk; token: PARTNER_A2A_TOKEN set; variables: JUNK_A2A_URL UNSET"), "{text}");
    assert!(!text.contains("sekrit-4711") && !text.contains("user:pw"), "{text}");
}

#[test]
fn routes_diff_shows_an_agent_that_changed_never_a_secret() {
    use fabric::catalogue::{SourceFile, load_from_texts};
    let load = |invoke: &str| {
        let text = format!(
            "profiles: {{p: {{}}}}\ncapabilities:\n  partner:\n    input_schema: {{type: object}}\n    invoke: {invoke}\nroutes:\n  r: {{model_profile: p, prompt_pack: s, decision_loop: {{tools: [partner]}}}}\n"
        );
        let cat = load_from_texts(&[SourceFile { path: "r/a.yaml".into(), text }], &[SourceFile { path: "p/s.yaml".into(), text: "host: H\n".into() }]);
        assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
        cat
    };
    let old = load(r#"{a2a: "https://partner.example/a2a/r", skill: r}"#);
    let new = load(r#"{a2a: "https://user:hunter2@partner.example/a2a/r2", skill: r2, token_env: PARTNER_TOKEN, timeout_ms: 5000}"#);
    let d = fabric::diff::diff(&old, &new);
    let json = serde_json::to_value(&d).unwrap().to_string();
    assert!(json.contains(r#""field":"agent""#) && json.contains(r#""token_env":"PARTNER_TOKEN""#), "{json}");
    let text = d.to_string();
    assert!(text.contains("agent: https://partner.example/a2a/r skill r (no token, timeout 60000 ms, at most 1048576 bytes) -> "), "{text}");
    assert!(text.contains("skill r2 (token from PARTNER_TOKEN, timeout 5000 ms"), "{text}");
    assert!(!text.contains("hunter2") && !json.contains("hunter2"), "{text}");
}

/// A caller's run cancelled takes the agent's task with it: while it asks its user the agent's
/// question (the task in its journal), and while it waits for the agent (the task the agent
/// named). A replica stopping for a handover would not: its run's next holder waits for the task.
#[tokio::test]
async fn a_cancelled_caller_cancels_the_agents_task_asking_or_waiting() {
    let (callee_dir, caller_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let callee_stub = asking_stub();
    // The callee's model calls take 3 s: its tasks are `working` while the caller waits.
    let callee =
        Server::start(&format!("sqlite://{}", callee_dir.path().join("callee.db").display()), callee_stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "3000")]);
    let (routes, stub) = caller_files(&[r#"CALL partner {"question": "I was charged twice"}"#, "DONE done"]);
    let db = format!("sqlite://{}", caller_dir.path().join("caller.db").display());
    let server = caller(&db, routes.path(), stub.path(), &[("PARTNER_A2A_URL", callee.url.as_str())]);
    let callee_task = |n: usize| {
        let callee = &callee;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let runs = runs_of(callee, "support-agent").await;
                if runs.len() > n || std::time::Instant::now() > deadline {
                    return runs.first().cloned().unwrap_or(Value::Null);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let cancel = |id: String| {
        let server = &server;
        async move { post(server, &format!("/v1/runs/{id}/cancel"), json!({"reason": "the customer left"})).await }
    };
    // Waiting: the caller's tool polls the callee's working task when the caller is cancelled.
    let (_, run) = post(&server, "/v1/runs", json!({"route_id": "concierge", "goal": {"q": "refund?"}, "model_profile": "default"})).await;
    let waiting = callee_task(0).await;
    assert_eq!(waiting["status"], "running", "{waiting}");
    let (status, _) = cancel(run["run_id"].as_str().unwrap().to_owned()).await;
    assert!(status < 300, "{status}");
    let ended = settled(&callee, waiting["run_id"].as_str().unwrap()).await;
    assert_eq!(ended["status"], "cancelled", "the agent's task went with its caller: {ended}");
    // Asking: the caller asks its user the agent's question; cancelled, the task goes too.
    let run = start(&server).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    let asking = callee_task(1).await;
    assert_eq!(asking["status"], "awaiting_input", "{asking}");
    let (status, _) = cancel(run["run_id"].as_str().unwrap().to_owned()).await;
    assert!(status < 300, "{status}");
    let ended = settled(&callee, asking["run_id"].as_str().unwrap()).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
}
