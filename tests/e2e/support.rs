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
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}
