//! Retention: ended runs deleted in short batches with their events, journal entries, messages,
//! webhook deliveries and A2A push notification configs (one sweep at a time across processes:
//! PostgreSQL's advisory lock, SQLite's write lock), never a run whose webhook delivery is still
//! pending; and the runs awaiting input for too long, for the facade to expire.

use sqlx::Row;

use super::StoreError;
use super::dialect::{Dialect, rows_sql};
use super::sql::SqlStore;
use super::sql_error::db;

// The retention methods of `RunStore` (`super::sql` delegates to them).
impl<DB> SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
    for<'r> usize: sqlx::ColumnIndex<DB::Row>,
{
    pub(super) async fn prune(&self, cutoff: &str, limit: usize, dry_run: bool) -> Result<u64, StoreError> {
        // `created_at <= updated_at`: the first bound lets `runs_by_status` narrow the scan.
        // A run whose webhook delivery is still pending stays until it is delivered or its
        // attempts run out: a retention shorter than the retries' horizon would otherwise
        // drop the delivery unsent and unsaid (issue 46).
        const ENDED: &str = "status IN ('completed', 'failed', 'cancelled') AND created_at < $1 AND updated_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM run_webhooks w WHERE w.run_id = runs.run_id AND w.state = 'pending')";
        if dry_run {
            let sql = format!("SELECT COUNT(*) FROM runs WHERE {ENDED}");
            let n: i64 = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(cutoff).fetch_one(self.pool_ref()).await.map_err(db)?.try_get(0).map_err(db)?;
            return Ok(n.max(0) as u64);
        }
        self.health_ref().check()?;
        // Chosen before the transaction: on SQLite its first statement is then a write, which
        // waits for the writer's lock (a read first would make the upgrade fail at once).
        // Ended runs never change again, so the rows chosen stay the rows to delete. A
        // sweep's own failure is only the sweep's: it does not mark the store unhealthy.
        let sql = format!("SELECT run_id FROM runs WHERE {ENDED} ORDER BY created_at LIMIT $2");
        let ids: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(cutoff)
            .bind(limit.clamp(1, 1000) as i64)
            .fetch_all(self.pool_ref())
            .await
            .map_err(db)?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(db)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool_ref().begin().await.map_err(db)?;
        let free: i64 = sqlx::query(DB::SWEEP_LOCK).fetch_one(&mut *tx).await.map_err(db)?.try_get(0).map_err(db)?;
        if free != 1 {
            return Ok(0);
        }
        let list = rows_sql("", "?", ids.len(), 1, true);
        for table in ["run_events", "run_journal", "run_webhooks", "run_inbox", "a2a_push_configs"] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE run_id IN ({list})")));
            for id in &ids {
                q = q.bind(id.as_str());
            }
            q.execute(&mut *tx).await.map_err(db)?;
        }
        // Counted by what this sweep deleted: one that overlapped another deletes nothing twice.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM runs WHERE run_id IN ({list}) RETURNING run_id")));
        for id in &ids {
            q = q.bind(id.as_str());
        }
        let deleted = q.fetch_all(&mut *tx).await.map_err(db)?.len();
        tx.commit().await.map_err(db)?;
        Ok(deleted as u64)
    }

    pub(super) async fn awaiting_since(&self, cutoff: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT run_id FROM runs WHERE status = 'awaiting_input' AND created_at < $1 AND updated_at < $1 ORDER BY created_at LIMIT $2";
        let rows = sqlx::query(sql).bind(cutoff).bind(limit.clamp(1, 1000) as i64).fetch_all(self.pool_ref()).await.map_err(db)?;
        rows.iter().map(|r| r.try_get(0).map_err(db)).collect()
    }
}
