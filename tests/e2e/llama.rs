//! Real inference: llama.cpp's server with a tiny model, through the OpenAI-compatible and
//! Anthropic backends. Needs `../shared/llm-server/` beside the repository; skips without it.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::support::{fixture_env, repo};

pub(crate) struct Server {
    pid: String,
    pub(crate) port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(&self.pid).status();
    }
}

fn llm_server_dir() -> Option<PathBuf> {
    let dir = repo().parent()?.join("shared/llm-server");
    dir.join("serve.sh").is_file().then_some(dir)
}

pub(crate) fn start(variant: &str) -> Option<Server> {
    let Some(dir) = llm_server_dir() else {
        crate::support::skip_unless(false, "llama.cpp's server", "../shared/llm-server/ is not beside the repository");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new("bash").arg(dir.join("serve.sh")).arg(port.to_string()).arg(variant).output().unwrap();
    assert!(out.status.success(), "serve.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(Server { pid: String::from_utf8(out.stdout).unwrap().trim().to_owned(), port })
}

fn run_triage(env: &[(&str, String)]) -> (Value, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
    cmd.current_dir(repo()).envs(fixture_env()).args([
        "run",
        "support-triage",
        "--goal",
        r#"{"ticket":"I was charged twice"}"#,
        "--events-out",
        events.to_str().unwrap(),
    ]);
    for var in fabric::config::VARIABLES {
        cmd.env_remove(var);
    }
    cmd.env_remove("KB_SEARCH_URL").env("FABRIC_LLM_RETRY_BASE_S", "0.05");
    cmd.envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "stdout: {}\nstderr: {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = std::fs::read_to_string(events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (result, events)
}

fn check(result: &Value, events: &[Value]) {
    assert_eq!(result["status"], "completed");
    // Grammar-constrained decoding: the classification is one of the enum members.
    let intake: Value = serde_json::from_str(result["slots"]["intake"].as_str().unwrap()).unwrap();
    assert!(["billing", "technical", "other"].contains(&intake["category"].as_str().unwrap()), "{intake}");
    assert!(["low", "high"].contains(&intake["urgency"].as_str().unwrap()), "{intake}");
    let completed: Vec<&Value> = events.iter().filter(|e| e["type"] == "run.llm.completed").collect();
    assert_eq!(completed.len(), 3);
    assert!(completed[0]["input_tokens"].as_u64().unwrap() > 0, "usage is read from the reply");
}

#[test]
fn support_triage_through_openai_compatible_llama_server() {
    let Some(server) = start("plain") else { return };
    let env = [("FABRIC_LLM_MODEL", "openai:tiny".to_owned()), ("OPENAI_BASE_URL", format!("http://127.0.0.1:{}/v1", server.port))];
    let (result, events) = run_triage(&env);
    check(&result, &events);
    assert_eq!(events.iter().find(|e| e["type"] == "run.llm.started").unwrap()["provider"], "openai");
}

#[test]
fn support_triage_through_anthropic_messages_on_llama_server() {
    let Some(server) = start("tools") else { return };
    let env = [("FABRIC_LLM_MODEL", "anthropic:tiny".to_owned()), ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", server.port))];
    // Several runs: real models sometimes put a text block before the forced tool_use.
    for _ in 0..3 {
        let (result, events) = run_triage(&env);
        check(&result, &events);
    }
}

/// A TCP proxy in front of `port` that passes the server's bytes on unchanged, but each SSE
/// event (up to its blank line) in a write of its own, 25 ms apart: the tiny model writes a short
/// answer in a few milliseconds, faster than the deltas' 50 ms batching, and this paces it as a
/// real model's tokens come. Returns its port and the count of events it passed on.
async fn pacing_proxy(port: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let events = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (proxy_port, counted) = (listener.local_addr().unwrap().port(), events.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { continue };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut up_read, mut up_write) = upstream.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut up_write).await });
            let counted = counted.clone();
            tokio::spawn(async move {
                let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 16 * 1024]);
                while let Ok(n @ 1..) = up_read.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                        let event: Vec<u8> = buf.drain(..end + 2).collect();
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if client_write.write_all(&event).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                    }
                    if !buf.is_empty() && client_write.write_all(&std::mem::take(&mut buf)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (proxy_port, events)
}

/// Streaming from a real server (issue 48): support-triage's synthesis through `fabric serve` on
/// llama.cpp's OpenAI-compatible API with `"stream": true` (paced by [`pacing_proxy`], its bytes
/// unchanged); its deltas joined are the reply the journal keeps, byte for byte, and came in more
/// than one piece.
#[tokio::test]
async fn a_streaming_synthesis_on_llama_server_joins_into_the_journalled_reply() {
    let Some(server) = start("plain") else { return };
    let (port, events_passed) = pacing_proxy(server.port).await;
    let env = [("FABRIC_LLM_MODEL", "openai:tiny".to_owned()), ("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))];
    let (events, deltas, raw) = crate::provider_streams::streamed_triage(&env).await;
    let passed = events_passed.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("llama.cpp stream: {passed} SSE events from the server, {} deltas, {} bytes of reply", deltas.len(), raw.len());
    assert!(deltas.len() > 1, "more than one delta: {deltas:?}");
    assert_eq!(deltas.concat(), raw, "the deltas joined are the journalled reply");
    let completed = events.iter().filter(|(_, k, d)| k == "run.llm.completed" && d["stage_id"] == "answer").map(|(_, _, d)| d.clone()).next().unwrap();
    assert!(completed["output_tokens"].as_u64().unwrap() > 0, "usage from the stream's last chunk: {completed}");
}
