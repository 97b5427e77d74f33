//! The embedded SQLite run store: opening, tuning (WAL, a busy timeout, a small pool), the
//! migration ([`super::migrations`], under the write lock) and the writer thread
//! ([`super::sqlite_writer`]); what a store does is [`super::sql::SqlStore`].
//!
//! `synchronous=NORMAL` with WAL survives a crash of the process (every commit is in the log)
//! but not of the machine's power; `docs/operations.md` says so.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::StoreError;
use super::health::{FileWatch, Health};
use super::migrations;
use super::pool_writer::PoolWriter;
use super::queue::WriteQueue;
use super::sql::SqlStore;
use super::sql_error::describe;
use super::sqlite_writer::SqliteWriter;

/// Rows per multi-row INSERT (SQLite allows 32,766 parameters per statement).
const ROWS_PER_INSERT: usize = 500;

pub type SqliteStore = SqlStore<sqlx::Sqlite>;

impl SqliteStore {
    /// Opens (creating when missing) and migrates the database at `url` (`sqlite://PATH`).
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Url(format!("`{}`: {e}", crate::redact::redact_url(url))))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // One in-memory database is one connection: a pool of several would see several, and
        // closing it would lose the database.
        let memory = url.contains(":memory:");
        let health = Arc::new(Health::new(!memory));
        let fresh = health.clone();
        let pool_options = SqlitePoolOptions::new()
            .max_connections(if memory { 1 } else { 4 })
            // A connection open when an error poisoned the pool (a read-only file: SQLite keeps
            // such a connection read-only for good) is closed, not handed out.
            .before_acquire(move |_, meta| {
                let fresh = fresh.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            });
        // Processes opening one new file together: the first to switch it to WAL holds a lock
        // the others' switch may meet without SQLite's busy handler (`database is locked` at
        // once, under load): they try again, within the busy timeout.
        let opening = tokio::time::Instant::now();
        let pool = loop {
            match pool_options.clone().connect_with(options.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && opening.elapsed() < Duration::from_secs(10) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(StoreError::Database(format!("cannot open {}: {}", crate::redact::redact_url(url), describe(&e)))),
            }
        };
        migrations::migrate(&pool).await?;
        let writer = PoolWriter { pool: pool.clone(), per_insert: ROWS_PER_INSERT, health: health.clone(), known: Default::default() };
        let watch = if memory { None } else { FileWatch::open(options.get_filename()).ok() };
        tokio::spawn(writer.clone().heal(watch));
        // An in-memory database is the pool's one connection: its writes go through it. A
        // file's go through the writer thread's own connection (sqlite_writer.rs).
        let queue = if memory {
            WriteQueue::start(writer, 1, health.clone())
        } else {
            WriteQueue::start_on_thread(SqliteWriter::new(options.get_filename().to_owned(), health.clone()), health.clone())?
        };
        Ok(SqlStore::new(pool, queue, health))
    }
}

/// SQLite's `SQLITE_BUSY` (5) or `SQLITE_LOCKED` (6): another connection holds the lock.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "5" || c == "6")
}

/// The file a `sqlite://` URL names.
pub(crate) fn file_of(url: &str) -> Result<std::path::PathBuf, StoreError> {
    let options = SqliteConnectOptions::from_str(url).map_err(|e| StoreError::Url(format!("`{}`: {e}", crate::redact::redact_url(url))))?;
    Ok(options.get_filename().to_owned())
}
