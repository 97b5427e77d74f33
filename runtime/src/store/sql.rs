//! The run store over any SQL database sqlx has: one implementation of [`RunStore`] for SQLite
//! and PostgreSQL, whose SQL both take (`$n` placeholders, `CAST(… AS TEXT)`, `ON CONFLICT`).
//! The adapters ([`super::sqlite`], [`super::postgres`]) only open, tune and migrate a pool.

use std::time::Duration;

use serde_json::Value;
use sqlx::Row;

use super::queue::{RUN_COLUMNS, Write, WriteQueue, db, run_of};
use super::{RunFilter, RunStore, StoreError, StoredEvent, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, JournalEntry, RunJournal};
use crate::failure::BoxFuture;

/// How many rows a statement changed: sqlx has no trait for it.
pub trait RowsAffected {
    fn count(&self) -> u64;
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn count(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn count(&self) -> u64 {
        self.rows_affected()
    }
}

/// A run store on a pool of `DB` connections, with the shared writer task.
#[derive(Debug)]
pub struct SqlStore<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    queue: WriteQueue,
}

impl<DB: sqlx::Database> SqlStore<DB> {
    /// A store on `pool` (migrated), whose writes go through `queue`.
    pub(crate) fn new(pool: sqlx::Pool<DB>, queue: WriteQueue) -> SqlStore<DB> {
        SqlStore { pool, queue }
    }
}

impl<DB: sqlx::Database> RunJournal for SqlStore<DB> {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.append(run_id, batch))
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.queue.commit(run_id, batch))
    }
}

impl<DB> RunStore for SqlStore<DB>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
    DB::QueryResult: RowsAffected,
{
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
                "SELECT {RUN_COLUMNS} FROM runs WHERE (CAST($1 AS TEXT) IS NULL OR route_id = $1) \
                 AND (CAST($2 AS TEXT) IS NULL OR status = $2) AND (CAST($3 AS TEXT) IS NULL OR run_id < $3) \
                 ORDER BY run_id DESC LIMIT $4"
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
            Ok(done.count() == 1)
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
            let at = now();
            for chunk in run_ids.chunks(1000) {
                let marks: Vec<String> = (2..chunk.len() + 2).map(|k| format!("${k}")).collect();
                let sql = format!("UPDATE runs SET updated_at = $1 WHERE status = 'running' AND run_id IN ({})", marks.join(", "));
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(at.as_str());
                for id in chunk {
                    q = q.bind(id.as_str());
                }
                q.execute(&self.pool).await.map_err(db)?;
            }
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
                let seq: i64 = sqlx::query("SELECT COALESCE(MAX(seq) + 1, 1) AS next FROM run_events WHERE run_id = $1")
                    .bind(run.run_id.as_str())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?
                    .try_get("next")
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
                if done.count() == 1 {
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
