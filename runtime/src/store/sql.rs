//! The run store over any SQL database sqlx has: one implementation of [`RunStore`] for SQLite
//! and PostgreSQL, whose SQL both take (`$n` placeholders, `CAST(… AS TEXT)`, `RETURNING`); what
//! differs (the clock, `SKIP LOCKED`) is the [`Dialect`]. The adapters ([`super::sqlite`],
//! [`super::postgres`]) only open, tune and migrate a pool.
//!
//! Claims on PostgreSQL select with `FOR UPDATE SKIP LOCKED`, so replicas claiming together
//! take different runs without waiting for each other; on SQLite the claim is one UPDATE under
//! the database's write lock, which gives processes on one machine the same guarantee.

use sqlx::Row;

use std::sync::Arc;
use std::time::Instant;

use super::health::Health;
use super::queue::{Dialect, RUN_COLUMNS, Write, WriteQueue, db, rows_sql, run_of, write_error};
use super::{
    CancelAsk, Claimed, Holder, IdempotencyKey, Keyed, Lease, NewRun, RunFilter, RunStore, SessionStart, StoreError, StoredEvent, StoredRun, StoredStatus, now,
};
use crate::exec::{JournalBatch, JournalEntry};
use crate::failure::BoxFuture;

/// A run store on a pool of `DB` connections, with the shared writer task.
#[derive(Debug)]
pub struct SqlStore<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    queue: WriteQueue,
    health: Arc<Health>,
}

/// Text PostgreSQL cannot hold (NUL) cannot be a key any row has: such a lookup finds nothing
/// without asking the database (which would refuse the statement).
fn impossible(key: &str) -> bool {
    key.contains('\0')
}

impl<DB: sqlx::Database> SqlStore<DB> {
    /// A store on `pool` (migrated), whose writes go through `queue` and report to `health`.
    pub(crate) fn new(pool: sqlx::Pool<DB>, queue: WriteQueue, health: Arc<Health>) -> SqlStore<DB> {
        SqlStore { pool, queue, health }
    }

    /// Whether a claim may take runs over (running, lease expired) now: not while writes fail,
    /// and not until a renewal period after they came back, so that a holder whose renewals
    /// failed with everyone else's renews first, and a store error never moves a run.
    fn takeovers_allowed(&self, holder: &Holder) -> bool {
        self.health.recovered_ago().is_none_or(|ago| ago > holder.lease / 3 + std::time::Duration::from_secs(2))
    }

    /// The pool, for the store's other ports over the same tables ([`super::outbox`]).
    pub(super) fn pool_ref(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    pub(super) fn health_ref(&self) -> &Health {
        &self.health
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }
}

impl<DB> SqlStore<DB>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    /// Lets a run's lease go (`set` says what else changes), only while `lease` is still the
    /// run's: a lease lost meanwhile is not this holder's to let go.
    async fn let_go(&self, lease: &Lease, set: &'static str) -> Result<(), StoreError> {
        let began = Instant::now();
        let sql =
            format!("UPDATE runs SET {set}lease_owner = NULL, lease_until = 0, updated_at = $1 WHERE run_id = $2 AND lease_token = $3 AND status = 'running'");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now())
            .bind(lease.run_id.as_str())
            .bind(lease.token)
            .execute(&self.pool)
            .await
            .map_err(|e| write_error(&self.health, began, e))?;
        Ok(())
    }
}

impl<DB> RunStore for SqlStore<DB>
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
    fn create_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(async move {
            // While writes fail, a start is refused at once (the healer finds out when they
            // work again); it is never acknowledged without its row committed.
            self.health.check()?;
            self.queue.write(Write::create(&run, holder, None)).await?;
            Ok(holder.map(|_| Lease { run_id: run.run_id.to_owned(), token: 1 }))
        })
    }

    fn create_keyed_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Keyed, StoreError>> {
        Box::pin(async move {
            self.health.check()?;
            match self.queue.write(Write::create(&run, holder, Some(key))).await {
                Ok(()) => Ok(Keyed::Created(holder.map(|_| Lease { run_id: run.run_id.to_owned(), token: 1 }))),
                // The key's run is committed (the constraint saw it): read it.
                Err(StoreError::KeyTaken) => self
                    .run_of_key(key)
                    .await?
                    .map(|run| Keyed::Existing(Box::new(run)))
                    .ok_or_else(|| StoreError::Database("the run of this idempotency key was removed while it was being read; start again".into())),
                Err(e) => Err(e),
            }
        })
    }

    fn create_session_run<'a>(
        &'a self,
        run: NewRun<'a>,
        holder: Option<&'a Holder>,
        policy: crate::config::SessionPolicy,
        key: Option<&'a IdempotencyKey>,
    ) -> BoxFuture<'a, Result<SessionStart, StoreError>> {
        Box::pin(super::session::session_run(self, run, holder, policy, key))
    }

    fn run_of_key<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(async move {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE idempotency_key = $1"));
            let row = sqlx::query(sql).bind(key.as_str()).fetch_optional(&self.pool).await.map_err(db)?;
            row.as_ref().map(run_of).transpose()
        })
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(async move {
            if impossible(run_id) {
                return Ok(None);
            }
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"));
            let row = sqlx::query(sql).bind(run_id).fetch_optional(&self.pool).await.map_err(db)?;
            row.as_ref().map(run_of).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        Box::pin(async move {
            if filter.route_id.as_deref().is_some_and(impossible) || filter.before.as_deref().is_some_and(impossible) {
                return Ok(Vec::new());
            }
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
            if impossible(run_id) {
                return Ok(Vec::new());
            }
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
            if impossible(run_id) {
                return Ok(Vec::new());
            }
            // A model reply's system prompt is a row of its own (`super::prompts`), joined back.
            let sql = "SELECT j.entry, j.prompt, p.body FROM run_journal j LEFT JOIN run_prompts p ON p.digest = j.prompt WHERE j.run_id = $1 ORDER BY j.id";
            let rows = sqlx::query(sql).bind(run_id).fetch_all(&self.pool).await.map_err(db)?;
            rows.iter()
                .map(|r| {
                    let (entry, prompt, body): (String, Option<String>, Option<String>) =
                        (r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?, r.try_get(2).map_err(db)?);
                    super::prompts::join(run_id, &entry, prompt.as_deref(), body.as_deref())
                })
                .collect()
        })
    }

    fn next_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            if impossible(run_id) {
                return Ok(1);
            }
            let last: i64 = sqlx::query("SELECT COALESCE(MAX(seq), 0) AS last FROM run_events WHERE run_id = $1")
                .bind(run_id)
                .fetch_one(&self.pool)
                .await
                .map_err(db)?
                .try_get("last")
                .map_err(db)?;
            Ok(last.max(0) as u64 + 1)
        })
    }

    fn claim_runs<'a>(&'a self, holder: &'a Holder, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            // Nothing to claim while writes fail (the claim is a write too).
            if routes.is_empty() || limit == 0 || self.health.failing() {
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
            let rows = q.fetch_all(&self.pool).await.map_err(|e| write_error(&self.health, began, e))?;
            let mut claimed = Vec::with_capacity(rows.len());
            for row in &rows {
                let lease = Lease { run_id: row.try_get("run_id").map_err(db)?, token: row.try_get("lease_token").map_err(db)? };
                claimed.push(Claimed { route_id: row.try_get("route_id").map_err(db)?, run: run_of(row), lease });
            }
            claimed.sort_by(|a, b| a.lease.run_id.cmp(&b.lease.run_id));
            Ok(claimed)
        })
    }

    fn claim_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(async move {
            // A reply is refused at once while writes fail, like a start.
            self.health.check()?;
            if impossible(run_id) {
                return Ok(None);
            }
            let began = Instant::now();
            let sql = format!(
                "UPDATE runs SET status = 'running', lease_owner = $1, lease_token = lease_token + 1, lease_until = {} + $2, updated_at = $3 \
                 WHERE run_id = $4 AND status = 'awaiting_input' RETURNING lease_token",
                DB::NOW_MS
            );
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(holder.owner.as_str())
                .bind(holder.lease_ms())
                .bind(now())
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| write_error(&self.health, began, e))?;
            row.map(|r| r.try_get::<i64, _>("lease_token").map(|token| Lease { run_id: run_id.to_owned(), token }).map_err(db)).transpose()
        })
    }

    fn reopen_reply<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.let_go(lease, "status = 'awaiting_input', "))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        // The token moves on: whatever the holder still writes is refused by the fence.
        Box::pin(self.let_go(lease, "lease_token = lease_token + 1, "))
    }

    fn request_cancel<'a>(&'a self, run_id: &'a str, reason: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<CancelAsk, StoreError>> {
        Box::pin(async move {
            self.health.check()?;
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
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| write_error(&self.health, began, e))?;
                if let Some(row) = row {
                    let lease = Lease { run_id: run_id.to_owned(), token: row.try_get("lease_token").map_err(db)? };
                    let (route_id, reason) = (row.try_get("route_id").map_err(db)?, row.try_get("cancel_reason").map_err(db)?);
                    return Ok(CancelAsk::Claimed { lease, route_id, reason });
                }
                let asked = sqlx::query(
                    "UPDATE runs SET cancel_reason = COALESCE(cancel_reason, $1), updated_at = $2 WHERE run_id = $3 AND status = 'running' RETURNING cancel_reason",
                )
                .bind(reason)
                .bind(now())
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| write_error(&self.health, began, e))?;
                if let Some(row) = asked {
                    return Ok(CancelAsk::Requested { reason: row.try_get("cancel_reason").map_err(db)? });
                }
                match self.get_run(run_id).await?.map(|r| r.status) {
                    None => return Ok(CancelAsk::NotFound),
                    Some(StoredStatus::Cancelled) => return Ok(CancelAsk::AlreadyCancelled),
                    Some(s @ (StoredStatus::Completed | StoredStatus::Failed)) => return Ok(CancelAsk::Ended(s)),
                    Some(StoredStatus::Queued | StoredStatus::Running | StoredStatus::AwaitingInput) => continue,
                }
            }
            Err(StoreError::Database(format!("run {run_id} changed status under every attempt to cancel it; try again")))
        })
    }

    fn cancel_requests<'a>(&'a self, holder: &'a Holder) -> BoxFuture<'a, Result<Vec<(Lease, String)>, StoreError>> {
        Box::pin(async move {
            // The partial index `runs_cancel_requested` holds exactly these rows.
            let rows =
                sqlx::query("SELECT run_id, lease_token, cancel_reason FROM runs WHERE lease_owner = $1 AND cancel_reason IS NOT NULL AND status = 'running'")
                    .bind(holder.owner.as_str())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?;
            rows.iter().map(|r| Ok((Lease { run_id: r.try_get(0).map_err(db)?, token: r.try_get(1).map_err(db)? }, r.try_get(2).map_err(db)?))).collect()
        })
    }

    fn pending_cancels(&self, limit: usize) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(async move {
            // The partial index `runs_cancel_pending` holds exactly these rows.
            let rows = sqlx::query(
                "SELECT run_id, cancel_reason FROM runs WHERE cancel_reason IS NOT NULL AND status IN ('queued', 'awaiting_input') ORDER BY run_id LIMIT $1",
            )
            .bind(limit.clamp(1, 1000) as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            rows.iter().map(|r| Ok((r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?))).collect()
        })
    }

    fn prune<'a>(&'a self, cutoff: &'a str, limit: usize, dry_run: bool) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            // `created_at <= updated_at`: the first bound lets `runs_by_status` narrow the scan.
            // A run whose webhook delivery is still pending stays until it is delivered or its
            // attempts run out: a retention shorter than the retries' horizon would otherwise
            // drop the delivery unsent and unsaid (issue 46).
            const ENDED: &str = "status IN ('completed', 'failed', 'cancelled') AND created_at < $1 AND updated_at < $1 \
                 AND NOT EXISTS (SELECT 1 FROM run_webhooks w WHERE w.run_id = runs.run_id AND w.state = 'pending')";
            if dry_run {
                let sql = format!("SELECT COUNT(*) FROM runs WHERE {ENDED}");
                let n: i64 = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(cutoff).fetch_one(&self.pool).await.map_err(db)?.try_get(0).map_err(db)?;
                return Ok(n.max(0) as u64);
            }
            self.health.check()?;
            // Chosen before the transaction: on SQLite its first statement is then a write, which
            // waits for the writer's lock (a read first would make the upgrade fail at once).
            // Ended runs never change again, so the rows chosen stay the rows to delete. A
            // sweep's own failure is only the sweep's: it does not mark the store unhealthy.
            let sql = format!("SELECT run_id FROM runs WHERE {ENDED} ORDER BY created_at LIMIT $2");
            let ids: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(cutoff)
                .bind(limit.clamp(1, 1000) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(db)?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()
                .map_err(db)?;
            if ids.is_empty() {
                return Ok(0);
            }
            let mut tx = self.pool.begin().await.map_err(db)?;
            let free: i64 = sqlx::query(DB::SWEEP_LOCK).fetch_one(&mut *tx).await.map_err(db)?.try_get(0).map_err(db)?;
            if free != 1 {
                return Ok(0);
            }
            let list = rows_sql("", "?", ids.len(), 1, true);
            for table in ["run_events", "run_journal", "run_webhooks"] {
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
        })
    }

    fn awaiting_since<'a>(&'a self, cutoff: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let sql = "SELECT run_id FROM runs WHERE status = 'awaiting_input' AND created_at < $1 AND updated_at < $1 ORDER BY created_at LIMIT $2";
            let rows = sqlx::query(sql).bind(cutoff).bind(limit.clamp(1, 1000) as i64).fetch_all(&self.pool).await.map_err(db)?;
            rows.iter().map(|r| r.try_get(0).map_err(db)).collect()
        })
    }

    fn renew<'a>(&'a self, holder: &'a Holder, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
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
                    q = q.bind(l.run_id.as_str()).bind(l.token);
                }
                let renewed: Vec<String> = q
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| write_error(&self.health, began, e))?
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()
                    .map_err(db)?;
                let missing: Vec<&Lease> = chunk.iter().filter(|l| !renewed.contains(&l.run_id)).collect();
                if missing.is_empty() {
                    continue;
                }
                // Not renewed: ended meanwhile (its own last commit), or taken over (a newer token).
                let sql = format!("SELECT run_id, lease_token FROM runs WHERE run_id IN ({})", rows_sql("", "?", missing.len(), 1, true));
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for l in &missing {
                    q = q.bind(l.run_id.as_str());
                }
                for row in q.fetch_all(&self.pool).await.map_err(db)? {
                    let (id, token): (String, i64) = (row.try_get(0).map_err(db)?, row.try_get(1).map_err(db)?);
                    if missing.iter().any(|l| l.run_id == id && l.token != token) {
                        lost.push(id);
                    }
                }
            }
            Ok(lost)
        })
    }

    fn append<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.append(lease, batch))
    }

    fn commit<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.commit(lease, batch))
    }

    fn queued(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let n: i64 =
                sqlx::query("SELECT COUNT(*) AS n FROM runs WHERE status = 'queued'").fetch_one(&self.pool).await.map_err(db)?.try_get("n").map_err(db)?;
            Ok(n.max(0) as u64)
        })
    }

    fn health(&self) -> Result<(), StoreError> {
        self.health.check()
    }

    fn webhooks(&self) -> &dyn super::WebhookOutbox {
        self
    }

    fn fleet(&self) -> Option<&dyn super::FleetBudget> {
        (self as &dyn std::any::Any).downcast_ref::<SqlStore<sqlx::Postgres>>().map(|s| s as &dyn super::FleetBudget)
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
            Ok(())
        })
    }
}
