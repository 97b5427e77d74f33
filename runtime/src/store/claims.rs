//! Claims and leases: a claim takes queued runs (and running ones whose lease expired) for a
//! holder, bumping each run's fencing token; a reply's claim moves one run from
//! `awaiting_input` to `running`; renewals extend the leases a holder still has and name the
//! runs another process took; a lease let go (released, or a reply put back) moves the token
//! on, so the old holder's later writes are fenced. All of them are single conditional
//! statements on the pool, outside the writer: each is one row lock (PostgreSQL) or the write
//! lock (SQLite), and a failure that may pass tells the store's health as the writer's would.
//!
//! Claims on PostgreSQL select with `FOR UPDATE SKIP LOCKED`, so replicas claiming together
//! take different runs without waiting for each other; on SQLite the claim is one UPDATE under
//! the database's write lock, which gives processes on one machine the same guarantee.

use std::time::Instant;

use sqlx::Row;

use super::dialect::{Dialect, rows_sql};
use super::reads::{RUN_COLUMNS, impossible, run_of};
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{Claimed, Holder, Lease, StoreError, now};

// The claim and lease methods of `RunStore` (`super::sql` delegates to them).
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
    /// Whether a claim may take runs over (running, lease expired) now: not while writes fail,
    /// and not until a renewal period after they came back, so that a holder whose renewals
    /// failed with everyone else's renews first, and a store error never moves a run.
    fn takeovers_allowed(&self, holder: &Holder) -> bool {
        self.health_ref().recovered_ago().is_none_or(|ago| ago > holder.lease / 3 + std::time::Duration::from_secs(2))
    }

    pub(super) async fn claim_runs(&self, holder: &Holder, routes: &[String], limit: usize) -> Result<Vec<Claimed>, StoreError> {
        // Nothing to claim while writes fail (the claim is a write too).
        if routes.is_empty() || limit == 0 || self.health_ref().failing() {
            return Ok(Vec::new());
        }
        let now_ms = DB::NOW_MS;
        let expired = if self.takeovers_allowed(holder) { format!("status = 'running' AND lease_until < {now_ms}") } else { "1 = 0".to_owned() };
        // Oldest first (ids are UUIDv7): queued runs, and running ones whose holder stopped
        // renewing its lease; a run started under `enqueue` or `interrupt` (its gate) only
        // once no run of its session started before it (in the store's order of the
        // session's starts, `session_seq`), nor any started under `allow`, is live.
        let sql = format!(
            "UPDATE runs SET status = 'running', lease_owner = $1, lease_token = lease_token + 1, lease_until = {now_ms} + $2, updated_at = $3 \
             WHERE run_id IN (SELECT run_id FROM runs WHERE (status = 'queued' OR ({expired})) \
             AND route_id IN ({}) AND (session_gate = 0 OR status = 'running' OR NOT EXISTS (SELECT 1 FROM runs o WHERE o.session_id = runs.session_id \
             AND o.run_id <> runs.run_id AND o.status IN ('queued', 'running', 'awaiting_input') \
             AND (o.session_seq IS NULL OR o.session_seq < runs.session_seq))) \
             ORDER BY run_id LIMIT $4{}) RETURNING {RUN_COLUMNS}",
            rows_sql("", "?", routes.len(), 5, true),
            DB::SKIP_LOCKED
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(holder.owner.as_str()).bind(holder.lease_ms()).bind(now()).bind(limit.min(1000) as i64);
        for r in routes {
            q = q.bind(r.as_str());
        }
        let began = Instant::now();
        let rows = q.fetch_all(self.pool_ref()).await.map_err(|e| write_error(self.health_ref(), began, e))?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let lease = Lease::new(row.try_get::<String, _>("run_id").map_err(db)?, row.try_get("lease_token").map_err(db)?);
            let (route_id, cancel_reason) = (row.try_get("route_id").map_err(db)?, row.try_get("cancel_reason").map_err(db)?);
            claimed.push(Claimed { route_id, cancel_reason, run: run_of(row), lease });
        }
        claimed.sort_by(|a, b| a.lease.run_id().cmp(b.lease.run_id()));
        Ok(claimed)
    }

    pub(super) async fn claim_reply(&self, run_id: &str, holder: &Holder) -> Result<Option<Lease>, StoreError> {
        // A reply is refused at once while writes fail, like a start.
        self.health_ref().check()?;
        if impossible(run_id) {
            return Ok(None);
        }
        let began = Instant::now();
        let row = sqlx::query(sqlx::AssertSqlSafe(reply_claim::<DB>("")))
            .bind(holder.owner.as_str())
            .bind(holder.lease_ms())
            .bind(now())
            .bind(run_id)
            .fetch_optional(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
        row.map(|r| r.try_get::<i64, _>("lease_token").map(|token| Lease::new(run_id.to_owned(), token)).map_err(db)).transpose()
    }

    pub(super) async fn renew(&self, holder: &Holder, leases: &[Lease]) -> Result<Vec<String>, StoreError> {
        let mut lost = Vec::new();
        for chunk in leases.chunks(500) {
            // `updated_at` too: a replica of the version before leases judges liveness by it.
            // The rows locked in the order of their ids, as the writer's fence locks them
            // (`Dialect::LOCK_ROWS`): two such statements never wait for each other.
            let mut sql = format!(
                "UPDATE runs SET lease_until = {} + $1, updated_at = $3 FROM (SELECT run_id AS locked FROM runs WHERE lease_owner = $2 AND status = 'running' AND (",
                DB::NOW_MS
            );
            for k in 0..chunk.len() {
                let sep = if k > 0 { " OR " } else { "" };
                sql.push_str(&format!("{sep}(run_id = ${} AND lease_token = ${})", 2 * k + 4, 2 * k + 5));
            }
            sql.push_str(&format!(") ORDER BY run_id{}) AS l WHERE runs.run_id = l.locked RETURNING runs.run_id", DB::LOCK_ROWS));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(holder.lease_ms()).bind(holder.owner.as_str()).bind(now());
            let began = Instant::now();
            for l in chunk {
                q = q.bind(l.run_id()).bind(l.token());
            }
            let renewed: Vec<String> = q
                .fetch_all(self.pool_ref())
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()
                .map_err(db)?;
            let missing: Vec<&Lease> = chunk.iter().filter(|l| !renewed.iter().any(|r| r == l.run_id())).collect();
            if missing.is_empty() {
                continue;
            }
            // Not renewed: ended meanwhile (its own last commit), or taken over (a newer token).
            let sql = format!("SELECT run_id, lease_token FROM runs WHERE run_id IN ({})", rows_sql("", "?", missing.len(), 1, true));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for l in &missing {
                q = q.bind(l.run_id());
            }
            for row in q.fetch_all(self.pool_ref()).await.map_err(db)? {
                let (id, token): (String, i64) = (row.try_get(0).map_err(db)?, row.try_get(1).map_err(db)?);
                if missing.iter().any(|l| l.run_id() == id && l.token() != token) {
                    lost.push(id);
                }
            }
        }
        Ok(lost)
    }

    /// Lets a run's lease go (`set` says what else changes), only while `lease` is still the
    /// run's: a lease lost meanwhile is not this holder's to let go.
    pub(super) async fn let_go(&self, lease: &Lease, set: &'static str) -> Result<(), StoreError> {
        let began = Instant::now();
        let sql =
            format!("UPDATE runs SET {set}lease_owner = NULL, lease_until = 0, updated_at = $1 WHERE run_id = $2 AND lease_token = $3 AND status = 'running'");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now())
            .bind(lease.run_id())
            .bind(lease.token())
            .execute(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
        Ok(())
    }
}

/// The statement that claims a run awaiting input for a reply (binds: holder, lease ms, now, run
/// id), on `also` more conditions (`AND ...`); it returns the new token and the run's `next_seq`.
pub(super) fn reply_claim<DB: Dialect>(also: &str) -> String {
    format!(
        "UPDATE runs SET status = 'running', lease_owner = $1, lease_token = lease_token + 1, lease_until = {} + $2, updated_at = $3 \
         WHERE run_id = $4 AND status = 'awaiting_input'{also} RETURNING lease_token, next_seq",
        DB::NOW_MS
    )
}
