//! Scheduled runs in the store (issue 50): schedules (`schedules`) and one record per fire time
//! (`schedule_fires`), behind the [`ScheduleStore`] port. Exactly once across replicas: the due
//! fires of a schedule are decided in one transaction ([`ScheduleStore::decide`]) that moves its
//! cursor on only if it is still where the replica read it, and inserts their rows. A fire to start
//! is `starting` under a short claim until its run is recorded; an expired claim (its replica died)
//! is taken over ([`ScheduleStore::claim_starts`]) and started with the same idempotency key, so
//! the run exists once whoever starts it. Times are milliseconds on the replicas' clocks.

use std::time::Instant;

use sqlx::Row;

use super::{StoreError, dialect::Dialect, now, sql::SqlStore, sql_error::db, sql_error::write_error};
use crate::failure::BoxFuture;

/// A schedule as stored: its definition (`body`, the JSON the service reads back typed), where it
/// comes from (`origin`: `api`, or `catalogue` for one a route declares), and its state.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSchedule {
    pub id: String,
    pub route_id: String,
    pub body: serde_json::Value,
    pub origin: String,
    pub paused: bool,
    pub paused_reason: Option<String>,
    /// The first fire time not decided yet (ms since the epoch); `None`: it fires no more.
    pub next_fire_ms: Option<i64>,
    pub last_run_id: Option<String>, // the run of its last started fire
    pub created_at: String,
    pub updated_at: String,
}

/// A fire time's record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FireRecord {
    pub schedule_id: String,
    /// The fire time (RFC 3339, UTC).
    pub fire_time: String,
    #[serde(skip)]
    pub fire_ms: i64,
    /// `starting` (its run is being started), `started`, `skipped`, `buffered` (waits for the
    /// live run to end), `missed`, or `failed` (the start was refused; `why` says why).
    pub outcome: String,
    pub why: Option<String>,
    pub run_id: Option<String>,
    /// Fired by `trigger`, not by the expression.
    pub manual: bool,
    pub decided_at: String,
    /// How long after its time its run was started (ms).
    pub lag_ms: Option<i64>,
}

/// A fire to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFire {
    pub fire_ms: i64,
    pub fire_time: String,
    pub outcome: &'static str,
    pub why: Option<String>,
    pub manual: bool,
    /// For a `starting` fire: until when its decider holds it (ms).
    pub claim_until: i64,
}

/// What became of a `starting` fire: its run, started (or found under its key) this long after
/// the fire time; or why the start was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireEnd<'a> {
    Started { run_id: &'a str, lag_ms: i64 },
    Failed { why: &'a str },
}

/// The port of scheduled runs.
pub trait ScheduleStore: std::fmt::Debug + Send + Sync {
    /// Adds a schedule; false when its id is taken.
    fn create_schedule<'a>(&'a self, s: &'a StoredSchedule) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Replaces a schedule's definition and state (not its fires); false when it is gone.
    fn update_schedule<'a>(&'a self, s: &'a StoredSchedule) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn get_schedule<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSchedule>, StoreError>>;
    /// Every schedule, by id, up to `limit`.
    fn list_schedules(&self, limit: usize) -> BoxFuture<'_, Result<Vec<StoredSchedule>, StoreError>>;
    /// Deletes a schedule and its fire records (its runs stay); false when it was not there.
    fn delete_schedule<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// The schedules not paused whose cursor is at `now_ms` or before.
    fn due_schedules(&self, now_ms: i64, limit: usize) -> BoxFuture<'_, Result<Vec<StoredSchedule>, StoreError>>;
    /// Records `fires` and moves the cursor from `cursor_ms` to `next_ms` in one transaction, if it is
    /// still there: false (nothing written) when another replica decided them first.
    fn decide<'a>(&'a self, id: &'a str, cursor_ms: i64, next_ms: Option<i64>, fires: &'a [NewFire]) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Records one fire (a `trigger`); false when that fire time has a record already.
    fn add_fire<'a>(&'a self, id: &'a str, fire: &'a NewFire) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Claims until `until_ms` the `starting` fires whose claim ended by `now_ms` (their replica died).
    fn claim_starts(&self, now_ms: i64, until_ms: i64, limit: usize) -> BoxFuture<'_, Result<Vec<FireRecord>, StoreError>>;
    /// A `buffered` fire of each schedule, oldest first.
    fn buffered_fires(&self, limit: usize) -> BoxFuture<'_, Result<Vec<FireRecord>, StoreError>>;
    /// Moves a `buffered` fire to `starting`, claimed until `until_ms`; false if another did.
    fn unbuffer<'a>(&'a self, id: &'a str, fire_ms: i64, until_ms: i64) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Records what became of a `starting` fire (a started run is the schedule's last run).
    fn record_fire<'a>(&'a self, id: &'a str, fire_ms: i64, end: FireEnd<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
    fn fires<'a>(&'a self, id: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<FireRecord>, StoreError>>; // newest first
    /// Deletes up to `limit` ended fire records decided before `cutoff_ms`; how many.
    fn prune_fires(&self, cutoff_ms: i64, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>>;
}

const SCHEDULE_COLUMNS: &str = "id, route_id, body, origin, paused, paused_reason, next_fire_ms, last_run_id, created_at, updated_at";
const FIRE_COLUMNS: &str = "schedule_id, fire_ms, fire_time, outcome, why, run_id, manual, decided_at, lag_ms";

fn schedule_of<R: Row>(row: &R) -> Result<StoredSchedule, StoreError>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'t> String: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
    for<'t> i64: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
{
    let id: String = row.try_get("id").map_err(db)?;
    let body: String = row.try_get("body").map_err(db)?;
    let body = serde_json::from_str(&body).map_err(|e| StoreError::Database(format!("schedule {id}: its stored definition does not read: {e}")))?;
    Ok(StoredSchedule {
        route_id: row.try_get("route_id").map_err(db)?,
        body,
        origin: row.try_get("origin").map_err(db)?,
        paused: row.try_get::<i64, _>("paused").map_err(db)? != 0,
        paused_reason: row.try_get("paused_reason").map_err(db)?,
        next_fire_ms: row.try_get("next_fire_ms").map_err(db)?,
        last_run_id: row.try_get("last_run_id").map_err(db)?,
        created_at: row.try_get("created_at").map_err(db)?,
        updated_at: row.try_get("updated_at").map_err(db)?,
        id,
    })
}

fn fire_of<R: Row>(row: &R) -> Result<FireRecord, StoreError>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'t> String: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
    for<'t> i64: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
{
    Ok(FireRecord {
        schedule_id: row.try_get("schedule_id").map_err(db)?,
        fire_ms: row.try_get("fire_ms").map_err(db)?,
        fire_time: row.try_get("fire_time").map_err(db)?,
        outcome: row.try_get("outcome").map_err(db)?,
        why: row.try_get("why").map_err(db)?,
        run_id: row.try_get("run_id").map_err(db)?,
        manual: row.try_get::<i64, _>("manual").map_err(db)? != 0,
        decided_at: row.try_get("decided_at").map_err(db)?,
        lag_ms: row.try_get("lag_ms").map_err(db)?,
    })
}

fn ms_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl<DB> ScheduleStore for SqlStore<DB>
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
{
    fn create_schedule<'a>(&'a self, s: &'a StoredSchedule) -> BoxFuture<'a, Result<bool, StoreError>> {
        let sql = "INSERT INTO schedules (id, route_id, body, origin, paused, paused_reason, next_fire_ms, last_run_id, created_at, updated_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, $8, $8) ON CONFLICT (id) DO NOTHING RETURNING id";
        Box::pin(write_schedule(self, sql, s))
    }

    fn update_schedule<'a>(&'a self, s: &'a StoredSchedule) -> BoxFuture<'a, Result<bool, StoreError>> {
        let sql = "UPDATE schedules SET route_id = $2, body = $3, origin = $4, paused = $5, paused_reason = $6, next_fire_ms = $7, updated_at = $8 \
                   WHERE id = $1 RETURNING id";
        Box::pin(write_schedule(self, sql, s))
    }

    fn get_schedule<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSchedule>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = $1");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(self.pool_ref()).await.map_err(db)?;
            row.as_ref().map(schedule_of).transpose()
        })
    }

    fn list_schedules(&self, limit: usize) -> BoxFuture<'_, Result<Vec<StoredSchedule>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY id LIMIT $1");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(limit.min(10_000) as i64).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter().map(schedule_of).collect()
        })
    }

    fn delete_schedule<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let fail = |e| write_error(self.health_ref(), began, e);
            let mut tx = self.pool_ref().begin().await.map_err(fail)?;
            let gone = sqlx::query("DELETE FROM schedules WHERE id = $1 RETURNING id").bind(id).fetch_optional(&mut *tx).await.map_err(fail)?;
            sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = $1").bind(id).execute(&mut *tx).await.map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            Ok(gone.is_some())
        })
    }

    fn due_schedules(&self, now_ms: i64, limit: usize) -> BoxFuture<'_, Result<Vec<StoredSchedule>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE paused = 0 AND next_fire_ms <= $1 ORDER BY next_fire_ms LIMIT $2");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now_ms).bind(limit as i64).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter().map(schedule_of).collect()
        })
    }

    fn decide<'a>(&'a self, id: &'a str, cursor_ms: i64, next_ms: Option<i64>, fires: &'a [NewFire]) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let fail = |e| write_error(self.health_ref(), began, e);
            let mut tx = self.pool_ref().begin().await.map_err(fail)?;
            // The compare-and-set first: a write, which takes SQLite's lock and PostgreSQL's row lock.
            let moved = sqlx::query("UPDATE schedules SET next_fire_ms = $1 WHERE id = $2 AND next_fire_ms = $3 AND paused = 0 RETURNING id")
                .bind(next_ms)
                .bind(id)
                .bind(cursor_ms)
                .fetch_optional(&mut *tx)
                .await
                .map_err(fail)?;
            if moved.is_none() {
                tx.rollback().await.map_err(fail)?;
                return Ok(false);
            }
            for fire in fires {
                insert_fire(id, fire).execute(&mut *tx).await.map_err(fail)?;
            }
            tx.commit().await.map_err(fail)?;
            Ok(true)
        })
    }

    fn add_fire<'a>(&'a self, id: &'a str, fire: &'a NewFire) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let done = insert_fire(id, fire).fetch_optional(self.pool_ref()).await.map_err(|e| write_error(self.health_ref(), began, e))?;
            Ok(done.is_some())
        })
    }

    fn claim_starts(&self, now_ms: i64, until_ms: i64, limit: usize) -> BoxFuture<'_, Result<Vec<FireRecord>, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            // A read first: the update, even of no row, would take SQLite's write lock five times a second.
            let any = "SELECT fire_ms FROM schedule_fires WHERE outcome = 'starting' AND claim_until <= $1 LIMIT 1";
            if sqlx::query(any).bind(now_ms).fetch_optional(self.pool_ref()).await.map_err(db)?.is_none() {
                return Ok(Vec::new());
            }
            let began = Instant::now();
            // The condition again outside: a claimer that waited for another's row lock finds it claimed.
            let sql = format!(
                "UPDATE schedule_fires SET claim_until = $1 WHERE outcome = 'starting' AND claim_until <= $2 AND (schedule_id, fire_ms) IN \
                 (SELECT schedule_id, fire_ms FROM schedule_fires WHERE outcome = 'starting' AND claim_until <= $2 ORDER BY fire_ms LIMIT $3) RETURNING {FIRE_COLUMNS}"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(until_ms)
                .bind(now_ms)
                .bind(limit as i64)
                .fetch_all(self.pool_ref())
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?;
            rows.iter().map(fire_of).collect()
        })
    }

    fn buffered_fires(&self, limit: usize) -> BoxFuture<'_, Result<Vec<FireRecord>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE outcome = 'buffered' ORDER BY fire_ms LIMIT $1");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(limit as i64).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter().map(fire_of).collect()
        })
    }

    fn unbuffer<'a>(&'a self, id: &'a str, fire_ms: i64, until_ms: i64) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let done = sqlx::query("UPDATE schedule_fires SET outcome = 'starting', claim_until = $1 WHERE schedule_id = $2 AND fire_ms = $3 AND outcome = 'buffered' RETURNING fire_ms")
                .bind(until_ms)
                .bind(id)
                .bind(fire_ms)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?;
            Ok(done.is_some())
        })
    }

    fn record_fire<'a>(&'a self, id: &'a str, fire_ms: i64, end: FireEnd<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let fail = |e| write_error(self.health_ref(), began, e);
            let mut tx = self.pool_ref().begin().await.map_err(fail)?;
            let (outcome, run_id, lag, why) = match end {
                FireEnd::Started { run_id, lag_ms } => ("started", Some(run_id), Some(lag_ms), None),
                FireEnd::Failed { why } => ("failed", None, None, Some(why)),
            };
            // `why` kept when started: a `cancel_other` fire says which run it cancelled.
            sqlx::query("UPDATE schedule_fires SET outcome = $1, run_id = $2, lag_ms = $3, why = COALESCE($4, why) WHERE schedule_id = $5 AND fire_ms = $6")
                .bind(outcome)
                .bind(run_id)
                .bind(lag)
                .bind(why)
                .bind(id)
                .bind(fire_ms)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
            if let Some(run_id) = run_id {
                sqlx::query("UPDATE schedules SET last_run_id = $1 WHERE id = $2").bind(run_id).bind(id).execute(&mut *tx).await.map_err(fail)?;
            }
            tx.commit().await.map_err(fail)
        })
    }

    fn fires<'a>(&'a self, id: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<FireRecord>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = $1 ORDER BY fire_ms DESC LIMIT $2");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).bind(limit.min(10_000) as i64).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter().map(fire_of).collect()
        })
    }

    fn prune_fires(&self, cutoff_ms: i64, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = Instant::now();
            let sql = "DELETE FROM schedule_fires WHERE (schedule_id, fire_ms) IN (SELECT schedule_id, fire_ms FROM schedule_fires \
                       WHERE decided_ms < $1 AND outcome NOT IN ('starting', 'buffered') ORDER BY decided_ms LIMIT $2) RETURNING fire_ms";
            let done =
                sqlx::query(sql).bind(cutoff_ms).bind(limit as i64).fetch_all(self.pool_ref()).await.map_err(|e| write_error(self.health_ref(), began, e))?;
            Ok(done.len() as u64)
        })
    }
}

/// A schedule's row written by `sql` (an insert or an update, with the same parameters); whether
/// it returned the row.
async fn write_schedule<DB>(store: &SqlStore<DB>, sql: &'static str, s: &StoredSchedule) -> Result<bool, StoreError>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
{
    store.health_ref().check()?;
    let began = Instant::now();
    let row = sqlx::query(sql)
        .bind(s.id.as_str())
        .bind(s.route_id.as_str())
        .bind(s.body.to_string())
        .bind(s.origin.as_str())
        .bind(i64::from(s.paused))
        .bind(s.paused_reason.as_deref())
        .bind(s.next_fire_ms)
        .bind(now())
        .fetch_optional(store.pool_ref())
        .await
        .map_err(|e| write_error(store.health_ref(), began, e))?;
    Ok(row.is_some())
}

/// The insert of one fire record (a fire time recorded already stays as it is).
fn insert_fire<'q, DB>(id: &'q str, fire: &'q NewFire) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    DB: sqlx::Database,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    sqlx::query(
        "INSERT INTO schedule_fires (schedule_id, fire_ms, fire_time, outcome, why, manual, claim_until, decided_at, decided_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (schedule_id, fire_ms) DO NOTHING RETURNING fire_ms",
    )
    .bind(id)
    .bind(fire.fire_ms)
    .bind(fire.fire_time.as_str())
    .bind(fire.outcome)
    .bind(fire.why.as_deref())
    .bind(i64::from(fire.manual))
    .bind(fire.claim_until)
    .bind(now())
    .bind(ms_now())
}
