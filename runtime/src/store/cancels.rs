//! Cancel requests: one recorded on a run's row (`cancel_reason`, the first reason stays) by
//! one conditional statement that also claims a queued or awaiting run for the requester, who
//! ends it at once; the holder of a running run finds the request by polling
//! (`cancel_requests`); requests left on queued or awaiting runs by a requester that died are
//! found by anyone (`pending_cancels`).

use std::time::Instant;

use sqlx::Row;

use super::dialect::Dialect;
use super::reads::impossible;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{CancelAsk, Holder, Lease, StoreError, StoredStatus, now};

// The cancel methods of `RunStore` (`super::sql` delegates to them).
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
    pub(super) async fn request_cancel(&self, run_id: &str, reason: &str, holder: &Holder) -> Result<CancelAsk, StoreError> {
        self.health_ref().check()?;
        if impossible(run_id) {
            return Ok(CancelAsk::NotFound);
        }
        // Each step is one conditional UPDATE; a run that moved between two (a claim, a
        // reply, an end) is looked at again. Every move is towards an end, so this ends.
        for _ in 0..8 {
            let began = Instant::now();
            let sql = format!(
                "UPDATE runs SET status = 'running', cancel_reason = COALESCE(cancel_reason, $1), lease_owner = $2, lease_token = lease_token + 1, \
                 lease_until = {} + $3, updated_at = $4 WHERE run_id = $5 AND status IN ('queued', 'awaiting_input') \
                 RETURNING lease_token, route_id, cancel_reason",
                DB::NOW_MS
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(reason)
                .bind(holder.owner.as_str())
                .bind(holder.lease_ms())
                .bind(now())
                .bind(run_id)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?;
            if let Some(row) = row {
                let lease = Lease::new(run_id.to_owned(), row.try_get("lease_token").map_err(db)?);
                let (route_id, reason) = (row.try_get("route_id").map_err(db)?, row.try_get("cancel_reason").map_err(db)?);
                return Ok(CancelAsk::Claimed { lease, route_id, reason });
            }
            let asked = sqlx::query(
                "UPDATE runs SET cancel_reason = COALESCE(cancel_reason, $1), updated_at = $2 WHERE run_id = $3 AND status = 'running' RETURNING cancel_reason",
            )
            .bind(reason)
            .bind(now())
            .bind(run_id)
            .fetch_optional(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
            if let Some(row) = asked {
                return Ok(CancelAsk::Requested { reason: row.try_get("cancel_reason").map_err(db)? });
            }
            match SqlStore::get_run(self, run_id).await?.map(|r| r.status) {
                None => return Ok(CancelAsk::NotFound),
                Some(StoredStatus::Cancelled) => return Ok(CancelAsk::AlreadyCancelled),
                Some(s @ (StoredStatus::Completed | StoredStatus::Failed)) => return Ok(CancelAsk::Ended(s)),
                Some(StoredStatus::Queued | StoredStatus::Running | StoredStatus::AwaitingInput) => continue,
            }
        }
        Err(StoreError::Database(format!("run {run_id} changed status under every attempt to cancel it; try again")))
    }

    pub(super) async fn cancel_requests(&self, holder: &Holder) -> Result<Vec<(Lease, String)>, StoreError> {
        // The partial index `runs_cancel_requested` holds exactly these rows.
        let rows =
            sqlx::query("SELECT run_id, lease_token, cancel_reason FROM runs WHERE lease_owner = $1 AND cancel_reason IS NOT NULL AND status = 'running'")
                .bind(holder.owner.as_str())
                .fetch_all(self.pool_ref())
                .await
                .map_err(db)?;
        rows.iter().map(|r| Ok((Lease::new(r.try_get::<String, _>(0).map_err(db)?, r.try_get(1).map_err(db)?), r.try_get(2).map_err(db)?))).collect()
    }

    pub(super) async fn pending_cancels(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        // The partial index `runs_cancel_pending` holds exactly these rows.
        let rows = sqlx::query(
            "SELECT run_id, cancel_reason FROM runs WHERE cancel_reason IS NOT NULL AND status IN ('queued', 'awaiting_input') ORDER BY run_id LIMIT $1",
        )
        .bind(limit.clamp(1, 1000) as i64)
        .fetch_all(self.pool_ref())
        .await
        .map_err(db)?;
        rows.iter().map(|r| Ok((r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?))).collect()
    }
}
