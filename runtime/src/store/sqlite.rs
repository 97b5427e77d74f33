//! The embedded SQLite run store (sqlx): WAL, a busy timeout, the shared writer task
//! ([`super::queue`]: group commit), readers on a small pool.
//!
//! `synchronous=NORMAL` with WAL survives a crash of the process (every commit is in the log)
//! but not of the machine's power; `docs/operations.md` says so.

use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::queue::{RUN_COLUMNS, Rows, Write, WriteQueue, WriteRows, db, rows_sql, run_of};
use super::{RunFilter, RunStore, StoreError, StoredEvent, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, JournalEntry, RunJournal};
use crate::failure::BoxFuture;

/// The schema versions this binary knows, in order: (version, SQL).
const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("migrations/sqlite/0001_runs.sql"))];

/// Rows per multi-row INSERT (SQLite allows 32,766 parameters per statement).
const ROWS_PER_INSERT: usize = 500;

#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    queue: WriteQueue,
}

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
        // One in-memory database is one connection: a pool of several would see several.
        let max = if url.contains(":memory:") { 1 } else { 4 };
        let pool = SqlitePoolOptions::new().max_connections(max).connect_with(options).await.map_err(db)?;
        migrate(&pool).await?;
        let queue = WriteQueue::start(Writer(pool.clone()));
        Ok(SqliteStore { pool, queue })
    }
}

async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS fabric_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)").execute(pool).await.map_err(db)?;
    let found: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM fabric_schema").fetch_one(pool).await.map_err(db)?;
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        let mut tx = pool.begin().await.map_err(db)?;
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO fabric_schema (version, applied_at) VALUES (?, ?)").bind(version).bind(now()).execute(&mut *tx).await.map_err(db)?;
        tx.commit().await.map_err(db)?;
    }
    Ok(())
}

/// The writer task's side of the pool.
struct Writer(SqlitePool);

impl WriteRows for Writer {
    /// One multi-row INSERT per table (per 500 rows), one UPDATE per run that ended.
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let at = &rows.at;
            let mut tx = self.0.begin().await.map_err(db)?;
            for chunk in rows.creates.chunks(ROWS_PER_INSERT) {
                let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "'running'", 5, chunk.len(), false)));
                for (run_id, route_id, request) in chunk {
                    q = q.bind(*run_id).bind(*route_id).bind(*request).bind(at).bind(at);
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for chunk in rows.events.chunks(ROWS_PER_INSERT) {
                let head = "INSERT INTO run_events (run_id, seq, kind, body) VALUES ";
                // A run failed as an orphan while its process was alive after all (a stall past the
                // lease) holds a `run.failed` at a seq this process writes too: that row is skipped,
                // not a failure of every run sharing this transaction.
                let sql = rows_sql(head, "", 4, chunk.len(), false) + " ON CONFLICT (run_id, seq) DO NOTHING";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (run_id, seq, kind, body) in chunk {
                    q = q.bind(*run_id).bind(*seq).bind(*kind).bind(body.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for chunk in rows.entries.chunks(ROWS_PER_INSERT) {
                let head = "INSERT INTO run_journal (run_id, entry) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "", 2, chunk.len(), false)));
                for (run_id, entry) in chunk {
                    q = q.bind(*run_id).bind(entry.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for end in &rows.ends {
                sqlx::query(
                    "UPDATE runs SET status = ?, result = ?, reason_class = ?, question = ?, next_seq = COALESCE(?, next_seq), updated_at = ? WHERE run_id = ? AND status = 'running'",
                )
                .bind(end.status.as_str())
                .bind(&end.result)
                .bind(end.reason_class)
                .bind(end.question)
                .bind(end.next_seq)
                .bind(at)
                .bind(end.run_id)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            tx.commit().await.map_err(db)
        })
    }
}

impl RunJournal for SqliteStore {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.append(run_id, batch))
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.commit(run_id, batch))
    }
}

impl RunStore for SqliteStore {
    fn create_run<'a>(&'a self, run_id: &'a str, route_id: &'a str, request: &'a Value) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.write(Write::Create { run_id: run_id.to_owned(), route_id: route_id.to_owned(), request: request.to_string() }))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(async move {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?"));
            let row = sqlx::query(sql).bind(run_id).fetch_optional(&self.pool).await.map_err(db)?;
            row.as_ref().map(run_of).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        Box::pin(async move {
            // Run ids are UUIDv7: ordering by id is ordering by start time.
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE (?1 IS NULL OR route_id = ?1) AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR run_id < ?3) ORDER BY run_id DESC LIMIT ?4"
            ));
            let rows = sqlx::query(sql)
                .bind(filter.route_id.as_deref())
                .bind(filter.status.map(StoredStatus::as_str))
                .bind(filter.before.as_deref())
                .bind(i64::from(filter.limit.clamp(1, 1000)))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            rows.iter().map(run_of).collect()
        })
    }

    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT seq, kind, body FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq")
                .bind(run_id)
                .bind(after_seq.min(i64::MAX as u64) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            rows.iter()
                .map(|r| {
                    Ok(StoredEvent {
                        seq: r.try_get::<i64, _>("seq").map_err(db)? as u64,
                        kind: r.try_get("kind").map_err(db)?,
                        body: r.try_get("body").map_err(db)?,
                    })
                })
                .collect()
        })
    }

    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT entry FROM run_journal WHERE run_id = ? ORDER BY id").bind(run_id).fetch_all(&self.pool).await.map_err(db)?;
            rows.iter()
                .map(|r| {
                    let text: String = r.try_get("entry").map_err(db)?;
                    serde_json::from_str(&text).map_err(|e| StoreError::Database(format!("a journal entry of run {run_id} does not read: {e}")))
                })
                .collect()
        })
    }

    fn claim_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query("UPDATE runs SET status = 'running', updated_at = ? WHERE run_id = ? AND status = 'awaiting_input'")
                .bind(now())
                .bind(run_id)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn reopen_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("UPDATE runs SET status = 'awaiting_input', updated_at = ? WHERE run_id = ? AND status = 'running'")
                .bind(now())
                .bind(run_id)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    fn heartbeat<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let at = now();
            for chunk in run_ids.chunks(ROWS_PER_INSERT) {
                let marks = vec!["?"; chunk.len()].join(", ");
                let sql = sqlx::AssertSqlSafe(format!("UPDATE runs SET updated_at = ? WHERE status = 'running' AND run_id IN ({marks})"));
                let mut q = sqlx::query(sql).bind(&at);
                for id in chunk {
                    q = q.bind(id);
                }
                q.execute(&self.pool).await.map_err(db)?;
            }
            Ok(())
        })
    }

    fn fail_orphans<'a>(&'a self, silent_for: std::time::Duration) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let cutoff = crate::events::rfc3339_at(std::time::SystemTime::now() - silent_for);
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND updated_at < ?"));
            let rows = sqlx::query(sql).bind(cutoff).fetch_all(&self.pool).await.map_err(db)?;
            let mut failed = 0;
            for row in &rows {
                let run = run_of(row)?;
                let history = self.journal(&run.run_id).await?;
                let orphan = super::Orphan::of(&run, &history);
                let mut tx = self.pool.begin().await.map_err(db)?;
                // The events table, not `next_seq`, says what was written: appends and the run row
                // are separate writes, and a process can die between them.
                let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq) + 1, 1) FROM run_events WHERE run_id = ?")
                    .bind(&run.run_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                // Only if nobody touched it meanwhile: a live process's heartbeat wins.
                let done = sqlx::query(
                    "UPDATE runs SET status = 'failed', reason_class = 'interrupted', result = ?, next_seq = ?, updated_at = ? WHERE run_id = ? AND status = 'running' AND updated_at = ?",
                )
                .bind(&orphan.result)
                .bind(seq + 1)
                .bind(now())
                .bind(&run.run_id)
                .bind(&run.updated_at)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
                if done.rows_affected() == 1 {
                    sqlx::query("INSERT INTO run_events (run_id, seq, kind, body) VALUES (?, ?, 'run.failed', ?)")
                        .bind(&run.run_id)
                        .bind(seq)
                        .bind(orphan.event(seq))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    failed += 1;
                }
                tx.commit().await.map_err(db)?;
            }
            Ok(failed)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
            Ok(())
        })
    }
}
