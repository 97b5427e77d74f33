//! Scenario T (first text): how much later than a provider's first piece of text a watcher of the
//! run gets it as a `run.llm.delta`. A fake OpenAI-compatible provider on loopback (raw HTTP/1.1,
//! in this process) streams a reply as SSE chunks, one every 10 ms, and notes when it wrote the
//! first piece of text; a run of a one-stage route with the real OpenAI backend (the streaming
//! executor, its fold, `Deltas`, the telemetry layer, the event sink) notes when the first delta
//! reached its sink. The difference is what streaming adds to the first word's latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use fabric::catalogue::{self, SourceFile};
use fabric::config::Settings;
use fabric::events::{Event, EventKind, EventSink};
use fabric::exec::RunRequest;
use fabric::runtime::Runtime;

use crate::fixture::{PACK, goal};
use crate::measure::{meta, stats};
use crate::options::BenchOptions;

/// The time between two chunks of the fake provider.
const CHUNK_EVERY: Duration = Duration::from_millis(10);

/// Pieces of text the fake provider writes per reply.
const PIECES: usize = 20;

const CATALOGUE: &str = "profiles:\n  bench: {}\nworkflows:\n  first-text:\n    stages:\n      - {id: answer, llm_role: synthesis}\nroutes:\n  first-text: {model_profile: bench, prompt_pack: bench, workflow: first-text}\n";

/// When the run's first delta reached the sink.
#[derive(Default)]
struct FirstDelta(Mutex<Option<Instant>>);

impl EventSink for FirstDelta {
    fn emit(&self, event: &Event) {
        if event.kind == EventKind::LlmDelta {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
        }
    }
}

pub async fn first_text(opts: &BenchOptions) -> Result<Value, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let url = format!("http://{}/v1", listener.local_addr().map_err(|e| e.to_string())?);
    let base = url.clone();
    let written: Arc<Mutex<Option<Instant>>> = Arc::default();
    let provider = tokio::spawn(serve(listener, written.clone()));
    let vars = move |k: &str| -> Option<String> {
        match k {
            "FABRIC_LLM_MODEL" => Some("openai:m-1".into()),
            "OPENAI_BASE_URL" => Some(base.clone()),
            "OPENAI_API_KEY" => Some("bench-key".into()),
            _ => None,
        }
    };
    let settings = Settings::load(vars.clone()).map_err(|e| e.to_string())?;
    let files = [SourceFile { path: "bench/first-text.yaml".into(), text: CATALOGUE.to_owned() }];
    let packs = [SourceFile { path: "bench/bench.yaml".into(), text: PACK.to_owned() }];
    let runtime =
        Runtime::builder().settings(settings).catalogue(Arc::new(catalogue::load_from_texts(&files, &packs))).vars(vars).build().map_err(|e| e.to_string())?;
    let runs = opts.runs.min(200);
    let mut after_first_byte = Vec::with_capacity(runs);
    let mut failed = 0;
    for i in 0..runs + 5 {
        *written.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let sink = Arc::new(FirstDelta::default());
        let req = RunRequest { route_id: "first-text".into(), goal: goal(), prefetch: Vec::new() };
        let ok =
            matches!(runtime.run(req, sink.clone(), fabric::cancel::Cancel::never()).await, Ok(r) if r.result.status() == fabric::exec::RunStatus::Completed);
        let (wrote, seen) = (*written.lock().unwrap_or_else(|p| p.into_inner()), *sink.0.lock().unwrap_or_else(|p| p.into_inner()));
        match (ok, wrote, seen) {
            // The first five warm the connection pool and the allocator.
            (true, Some(w), Some(s)) if i >= 5 => after_first_byte.push(s.saturating_duration_since(w).as_secs_f64() * 1e6),
            (true, Some(_), Some(_)) => {}
            _ => failed += 1,
        }
    }
    // The floor, in the same run: a bare HTTP client reading the same stream, the time from the
    // provider's first text to the client holding the chunk that carries it.
    let client = reqwest::Client::new();
    let mut floor = Vec::with_capacity(runs);
    for _ in 0..runs {
        *written.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let Ok(mut response) = client.post(format!("{url}/chat/completions")).body("{}").send().await else { continue };
        let mut seen = None;
        while let Ok(Some(chunk)) = response.chunk().await {
            if seen.is_none() && chunk.windows(4).any(|w| w == b"word") {
                seen = Some(Instant::now());
            }
        }
        if let (Some(s), Some(w)) = (seen, *written.lock().unwrap_or_else(|p| p.into_inner())) {
            floor.push(s.saturating_duration_since(w).as_secs_f64() * 1e6);
        }
    }
    provider.abort();
    Ok(json!({
        "scenario": "T", "route": "first-text", "runs": runs, "failed_runs": failed, "provider": "openai (fake, loopback)",
        "chunk_every_ms": CHUNK_EVERY.as_millis() as u64, "pieces": PIECES,
        "first_delta_after_first_text_us": stats(after_first_byte), "bare_client_after_first_text_us": stats(floor), "meta": meta(),
    }))
}

/// The fake provider: each connection one streamed reply (whatever it asked), then closed.
async fn serve(listener: tokio::net::TcpListener, written: Arc<Mutex<Option<Instant>>>) {
    while let Ok((mut conn, _)) = listener.accept().await {
        let written = written.clone();
        tokio::spawn(async move {
            if read_request(&mut conn).await.is_none() {
                return;
            }
            let chunk = |delta: Value, finish: Value| {
                let c = json!({"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1, "model": "m-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                format!("data: {c}\n\n")
            };
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
            if conn.write_all(head.as_bytes()).await.is_err()
                || conn.write_all(chunk(json!({"role": "assistant", "content": ""}), Value::Null).as_bytes()).await.is_err()
            {
                return;
            }
            for i in 0..PIECES {
                tokio::time::sleep(CHUNK_EVERY).await;
                if conn.write_all(chunk(json!({"content": format!("word{i} ")}), Value::Null).as_bytes()).await.is_err() {
                    return;
                }
                if i == 0 {
                    let _ = conn.flush().await;
                    written.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
                }
            }
            let usage = json!({"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1, "model": "m-1", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": PIECES, "total_tokens": 30 + PIECES}});
            let tail = format!("{}data: {usage}\n\ndata: [DONE]\n\n", chunk(json!({}), json!("stop")));
            let _ = conn.write_all(tail.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

/// Reads one request (its headers, and its body by `content-length`); `None` when it does not come.
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = conn.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(());
        }
    }
}
