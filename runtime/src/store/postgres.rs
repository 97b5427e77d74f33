//! The PostgreSQL run store (sqlx): the same tables, migrations numbering and contract as SQLite,
//! for several processes on one database. Writes go through the shared writer task
//! ([`super::queue`]: group commit); reads use the pool.

use std::time::Duration;

use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::queue::{RUN_COLUMNS, Rows, Write, WriteQueue, WriteRows, db, rows_sql, run_of};
use super::{RunFilter, RunStore, StoreError, StoredEvent, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, JournalEntry, RunJournal};
use crate::failure::BoxFuture;

/// The schema versions this binary knows, in order: (version, SQL). Numbered as SQLite's are.
const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("migrations/postgres/0001_runs.sql"))];

/// Rows per multi-row INSERT (PostgreSQL allows 65,535 parameters per statement).
const ROWS_PER_INSERT: usize = 1000;

/// Any constant both migrating processes agree on: the advisory lock that serializes them.
const MIGRATION_LOCK: i64 = 0x6661_6272_6963; // "fabric"

#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    queue: WriteQueue,
}

impl PgStore {
    /// Connects to and migrates the database at `url` (`postgres://USER:PASSWORD@HOST/DB`).
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            // Where, without the password or the query string.
            .map_err(|e| StoreError::Database(format!("cannot connect to {}: {e}", crate::redact::redact_url(url))))?;
        migrate(&pool).await?;
        let queue = WriteQueue::start(Writer(pool.clone()));
        Ok(PgStore { pool, queue })
    }
}

async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(db)?;
    // Replicas starting together: one migrates, the others wait and then find it done.
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await.map_err(db)?;
    sqlx::query("CREATE TABLE IF NOT EXISTS fabric_schema (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)").execute(&mut *tx).await.map_err(db)?;
    let found: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0)::BIGINT FROM fabric_schema").fetch_one(&mut *tx).await.map_err(db)?;
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO fabric_schema (version, applied_at) VALUES ($1, $2)").bind(version).bind(now()).execute(&mut *tx).await.map_err(db)?;
    }
    tx.commit().await.map_err(db)
}

/// The writer task's side of the pool.
struct Writer(PgPool);

impl WriteRows for Writer {
    /// One multi-row INSERT per table (per 1,000 rows), one UPDATE per run that ended.
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let at = &rows.at;
            let mut tx = self.0.begin().await.map_err(db)?;
            for chunk in rows.creates.chunks(ROWS_PER_INSERT) {
                let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "'running'", 5, chunk.len(), true)));
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
                let sql = rows_sql(head, "", 4, chunk.len(), true) + " ON CONFLICT (run_id, seq) DO NOTHING";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (run_id, seq, kind, body) in chunk {
                    q = q.bind(*run_id).bind(*seq).bind(*kind).bind(body.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for chunk in rows.entries.chunks(ROWS_PER_INSERT) {
                let head = "INSERT INTO run_journal (run_id, entry) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "", 2, chunk.len(), true)));
                for (run_id, entry) in chunk {
                    q = q.bind(*run_id).bind(entry.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for end in &rows.ends {
                sqlx::query(
                    "UPDATE runs SET status = $1, result = $2, reason_class = $3, question = $4, next_seq = COALESCE($5, next_seq), updated_at = $6 WHERE run_id = $7 AND status = 'running'",
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

impl RunJournal for PgStore {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.append(run_id, batch))
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.commit(run_id, batch))
    }
}

impl RunStore for PgStore {
    fn create_run<'a>(&'a self, run_id: &'a str, route_id: &'a str, request: &'a Value) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.write(Write::Create { run_id: run_id.to_owned(), route_id: route_id.to_owned(), request: request.to_string() }))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(async move {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"));
            let row = sqlx::query(sql).bind(run_id).fetch_optional(&self.pool).await.map_err(db)?;
            row.as_ref().map(run_of).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        Box::pin(async move {
            // Run ids are UUIDv7: ordering by id is ordering by start time.
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE ($1::TEXT IS NULL OR route_id = $1) AND ($2::TEXT IS NULL OR status = $2) \
                 AND ($3::TEXT IS NULL OR run_id < $3) ORDER BY run_id DESC LIMIT $4"
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
            let rows = sqlx::query("SELECT seq, kind, body FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq")
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
            let rows = sqlx::query("SELECT entry FROM run_journal WHERE run_id = $1 ORDER BY id").bind(run_id).fetch_all(&self.pool).await.map_err(db)?;
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
            let done = sqlx::query("UPDATE runs SET status = 'running', updated_at = $1 WHERE run_id = $2 AND status = 'awaiting_input'")
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
            sqlx::query("UPDATE runs SET status = 'awaiting_input', updated_at = $1 WHERE run_id = $2 AND status = 'running'")
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
            if run_ids.is_empty() {
                return Ok(());
            }
            sqlx::query("UPDATE runs SET updated_at = $1 WHERE status = 'running' AND run_id = ANY($2)")
                .bind(now())
                .bind(run_ids)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    fn fail_orphans<'a>(&'a self, silent_for: Duration) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let cutoff = crate::events::rfc3339_at(std::time::SystemTime::now() - silent_for);
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND updated_at < $1"));
            let rows = sqlx::query(sql).bind(cutoff).fetch_all(&self.pool).await.map_err(db)?;
            let mut failed = 0;
            for row in &rows {
                let run = run_of(row)?;
                let history = self.journal(&run.run_id).await?;
                let orphan = super::Orphan::of(&run, &history);
                let mut tx = self.pool.begin().await.map_err(db)?;
                // The events table, not `next_seq`, says what was written.
                let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq) + 1, 1)::BIGINT FROM run_events WHERE run_id = $1")
                    .bind(&run.run_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                // Only if nobody touched it meanwhile: a live process's heartbeat wins.
                let done = sqlx::query(
                    "UPDATE runs SET status = 'failed', reason_class = 'interrupted', result = $1, next_seq = $2, updated_at = $3 \
                     WHERE run_id = $4 AND status = 'running' AND updated_at = $5",
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
                    sqlx::query("INSERT INTO run_events (run_id, seq, kind, body) VALUES ($1, $2, 'run.failed', $3)")
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
