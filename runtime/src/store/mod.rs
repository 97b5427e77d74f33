//! The run store: runs (start contract, status, result), their events and their journal.
//!
//! One small trait, [`RunStore`], with one implementation per database; SQLite
//! ([`sqlite::SqliteStore`], the default `sqlite://fabric.db`) is embedded. A store is also the
//! executor's [`RunJournal`]: a journalled run commits its events and journal entries once per
//! completed stage and once at its end. SQL and its row types stay inside the implementations.
//! Schema versions are numbered; a store refuses a database whose schema is newer than it knows.

pub mod postgres;
mod queue;
pub mod sql;
pub mod sqlite;

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::exec::{JournalEntry, RunJournal};
use crate::failure::BoxFuture;

pub use crate::llm::model::DEFAULT_DATABASE_URL;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The URL names no store this runtime has, or cannot be parsed.
    #[error("{0}")]
    Url(String),
    /// The database's schema is newer than this binary (a newer runtime migrated it).
    #[error("the database's schema is version {found}; this runtime knows versions up to {known}: upgrade the runtime")]
    TooNew { found: i64, known: i64 },
    #[error("the run store failed: {0}")]
    Database(String),
    #[error("no run `{0}`")]
    NotFound(String),
}

/// Where a run stands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredStatus {
    Running,
    Completed,
    Failed,
    AwaitingInput,
}

impl StoredStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StoredStatus::Running => "running",
            StoredStatus::Completed => "completed",
            StoredStatus::Failed => "failed",
            StoredStatus::AwaitingInput => "awaiting_input",
        }
    }

    pub fn parse(s: &str) -> Option<StoredStatus> {
        [StoredStatus::Running, StoredStatus::Completed, StoredStatus::Failed, StoredStatus::AwaitingInput].into_iter().find(|k| k.as_str() == s)
    }
}

/// A run as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    pub run_id: String,
    pub route_id: String,
    pub status: StoredStatus,
    /// The start contract as accepted: `{route_id, goal, model_profile, prefetch, session_id}`.
    pub request: Value,
    /// The result object (as `fabric run` prints it), once the run ended or asked.
    pub result: Option<Value>,
    pub reason_class: Option<String>,
    pub question: Option<String>,
    /// The `seq` the run's next event gets.
    pub next_seq: u64,
    pub created_at: String,
    pub updated_at: String,
}

/// Which runs to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub route_id: Option<String>,
    pub status: Option<StoredStatus>,
    /// Only runs created before this run (its id; ids sort by start time): the next page.
    pub before: Option<String>,
    pub limit: u32,
}

/// One stored event: its `seq`, its type and the JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    pub kind: String,
    pub body: String,
}

/// The port to a run store. Contract: `create_run` inserts a new run (`running`); commits
/// (the [`RunJournal`] side) append events and journal entries and, with an end, set the run's
/// status, result and next `seq` in the same transaction; `claim_reply` atomically moves a run
/// from `awaiting_input` to `running` and says whether it did (so two replies cannot both
/// continue a run).
pub trait RunStore: RunJournal + std::fmt::Debug {
    fn create_run<'a>(&'a self, run_id: &'a str, route_id: &'a str, request: &'a Value) -> BoxFuture<'a, Result<(), StoreError>>;
    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>>;
    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>>;
    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>>;
    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>>;
    fn claim_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Puts a claimed reply back (`running` → `awaiting_input`) when the run could not go on.
    fn reopen_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Says that this process still executes these runs (every third of the lease).
    fn heartbeat<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Runs left `running` by a process that is gone (no heartbeat for `silent_for`, the lease):
    /// each fails with `interrupted`, with a `run.failed` event after its last one and a result
    /// that keeps what its journal holds. Returns how many.
    fn fail_orphans<'a>(&'a self, silent_for: std::time::Duration) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// Whether the database answers (`/readyz`).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// Opens the store a URL names: `sqlite://PATH` (created when missing), `sqlite::memory:`, or
/// `postgres://USER:PASSWORD@HOST[:PORT]/DB` (the database must exist; its tables are created).
pub async fn open(url: &str) -> Result<Arc<dyn RunStore>, StoreError> {
    let url = url.trim();
    if url.starts_with("sqlite:") {
        return Ok(Arc::new(sqlite::SqliteStore::open(url).await?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(postgres::PgStore::open(url).await?));
    }
    Err(StoreError::Url(format!("`{}` is not a store URL; use sqlite://PATH or postgres://…", crate::redact::redact_url(url))))
}

/// What failing a run whose process is gone writes: a result that keeps what its journal holds,
/// and a last `run.failed` event.
pub(crate) struct Orphan<'a> {
    run: &'a StoredRun,
    pub result: String,
}

impl<'a> Orphan<'a> {
    const MESSAGE: &'static str = "the process executing the run stopped (no heartbeat)";

    pub fn of(run: &'a StoredRun, history: &[JournalEntry]) -> Orphan<'a> {
        let class = crate::failure::ReasonClass::Interrupted;
        let result = crate::exec::result_from_journal(&run.run_id, &run.route_id, history, class, Self::MESSAGE);
        Orphan { run, result: serde_json::to_string(&result).unwrap_or_default() }
    }

    /// The `run.failed` event, numbered `seq`.
    pub fn event(&self, seq: i64) -> String {
        let (run_id, route_id, ts) = (&self.run.run_id, &self.run.route_id, now());
        serde_json::json!({"type": "run.failed", "run_id": run_id, "route_id": route_id, "seq": seq, "ts": ts, "reason_class": "interrupted", "message": Self::MESSAGE})
            .to_string()
    }
}

/// The time now, as stored (`YYYY-MM-DDTHH:MM:SS.mmmZ`, sortable as text).
pub(crate) fn now() -> String {
    crate::events::rfc3339_now()
}
