//! The embedded SQLite run store: opening, tuning (WAL, a busy timeout, a small pool) and
//! migrating; what a store does is [`super::sql::SqlStore`].
//!
//! `synchronous=NORMAL` with WAL survives a crash of the process (every commit is in the log)
//! but not of the machine's power; `docs/operations.md` says so.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::health::{FileWatch, Health};
use super::migrations;
use super::queue::{PoolWriter, WriteQueue, db, describe};
use super::sql::SqlStore;
use super::sqlite_writer::SqliteWriter;
use super::{StoreError, now};

/// The schema versions this binary knows, in order: (version, SQL).
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/sqlite/0001_runs.sql")),
    (2, include_str!("migrations/sqlite/0002_leases.sql")),
    (3, include_str!("migrations/sqlite/0003_health.sql")),
    (4, include_str!("migrations/sqlite/0004_prompts.sql")),
    (5, include_str!("migrations/sqlite/0005_idempotency.sql")),
    (6, include_str!("migrations/sqlite/0006_cancel.sql")),
    (7, include_str!("migrations/sqlite/0007_webhooks.sql")),
    (8, include_str!("migrations/sqlite/0008_sessions.sql")),
    (9, include_str!("migrations/sqlite/0009_webhook_reopen.sql")),
    (10, include_str!("migrations/sqlite/0010_webhook_writer.sql")),
    (11, include_str!("migrations/sqlite/0011_session_order.sql")),
    (12, include_str!("migrations/sqlite/0012_llm_shares.sql")),
];

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
        let pool = SqlitePoolOptions::new()
            .max_connections(if memory { 1 } else { 4 })
            // A connection open when an error poisoned the pool (a read-only file: SQLite keeps
            // such a connection read-only for good) is closed, not handed out.
            .before_acquire(move |_, meta| {
                let fresh = fresh.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::Database(format!("cannot open {}: {}", crate::redact::redact_url(url), describe(&e))))?;
        migrate(&pool).await?;
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

/// The file a `sqlite://` URL names.
pub(crate) fn file_of(url: &str) -> Result<std::path::PathBuf, StoreError> {
    let options = SqliteConnectOptions::from_str(url).map_err(|e| StoreError::Url(format!("`{}`: {e}", crate::redact::redact_url(url))))?;
    Ok(options.get_filename().to_owned())
}

/// Migrates under the database's write lock, taken first (`BEGIN IMMEDIATE`, waiting out the
/// busy timeout): the version read, every check and every migration applied are one transaction,
/// so processes opening one fresh file at once apply each migration once, the later ones finding
/// it applied. Reading the version outside it let two of them both apply the first.
async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    use sqlx::Connection;
    let mut conn = pool.acquire().await.map_err(db)?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
    sqlx::query("CREATE TABLE IF NOT EXISTS fabric_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)").execute(&mut *tx).await.map_err(db)?;
    // Checksums came later than the table: a database of an older runtime gets the column.
    let has_sums: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info('fabric_schema') WHERE name = 'checksum'").fetch_one(&mut *tx).await.map_err(db)?;
    if has_sums == 0 {
        sqlx::query("ALTER TABLE fabric_schema ADD COLUMN checksum TEXT").execute(&mut *tx).await.map_err(db)?;
    }
    let applied: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT version, checksum FROM fabric_schema ORDER BY version").fetch_all(&mut *tx).await.map_err(db)?;
    let found = applied.last().map_or(0, |a| a.0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, sum) in migrations::verify(&applied, MIGRATIONS)? {
        sqlx::query("UPDATE fabric_schema SET checksum = ? WHERE version = ?").bind(sum).bind(version).execute(&mut *tx).await.map_err(db)?;
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO fabric_schema (version, applied_at, checksum) VALUES (?, ?, ?)")
            .bind(version)
            .bind(now())
            .bind(migrations::checksum(sql))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(())
}
