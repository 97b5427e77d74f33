//! `fabric tool-server`: a small HTTP tool server for demos, tests and benchmarks.
//!
//! `GET /search?q=...` answers `{"hits":[{"id":1,"title":"Result for <q>"}]}` (the search tool
//! of `support-triage` and `support-agent`, as BENCH.md describes it); `GET /add?a=..&b=..`
//! answers `{"sum": a+b}`. It runs as its own process so that benchmarks do not share the
//! runtime's scheduler with it.

use std::collections::HashMap;

use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

pub fn router() -> Router {
    Router::new()
        .route(
            "/search",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                match q.get("q") {
                    Some(query) => Ok(Json(json!({"hits": [{"id": 1, "title": format!("Result for {query}")}]}))),
                    None => Err((StatusCode::BAD_REQUEST, "missing q")),
                }
            }),
        )
        .route(
            "/add",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                let num = |k: &str| q.get(k).and_then(|v| v.parse::<f64>().ok());
                match (num("a"), num("b")) {
                    (Some(a), Some(b)) => {
                        let sum = a + b;
                        let v: Value = if sum.fract() == 0.0 && sum.abs() < 9e15 { json!({"sum": sum as i64}) } else { json!({"sum": sum}) };
                        Ok(Json(v))
                    }
                    _ => Err((StatusCode::BAD_REQUEST, "a and b must be numbers")),
                }
            }),
        )
}

/// Serves until the process is stopped; prints `http://ADDR` once listening.
pub async fn serve(listen: &str) -> std::io::Result<()> {
    let addr: std::net::SocketAddr = listen.parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("--listen {listen}: {e}")))?;
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    // A deep backlog: the concurrency benchmark opens thousands of connections at once.
    let listener = socket.listen(4096)?;
    use std::io::Write;
    let mut out = std::io::stdout();
    writeln!(out, "http://{}", listener.local_addr()?)?;
    out.flush()?;
    axum::serve(listener, router()).await
}
