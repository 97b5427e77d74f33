//! The store's reads: a run (by id, by idempotency key), the run list, a run's events from a
//! `seq` on, its journal (each model reply's system prompt joined back from `run_prompts`), its
//! next `seq`, how many runs are queued; and [`run_of`], the one reading of a `runs` row, which
//! the claims and the outbox use too. Reads never go through the writer: they take a connection
//! of the pool (on SQLite, WAL readers that never wait for the writer).

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::db;
use super::{CatalogueVersion, IdempotencyKey, RunFilter, StoreError, StoredEvent, StoredRun, StoredStatus};
use crate::exec::JournalEntry;

/// Text PostgreSQL cannot hold (NUL) cannot be a key any row has: such a lookup finds nothing
/// without asking the database (which would refuse the statement).
pub(super) fn impossible(key: &str) -> bool {
    key.contains('\0')
}

// The read methods of `RunStore` (`super::sql` delegates to them).
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
    pub(super) async fn run_of_key(&self, key: &IdempotencyKey) -> Result<Option<StoredRun>, StoreError> {
        let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE idempotency_key = $1"));
        let row = sqlx::query(sql).bind(key.as_str()).fetch_optional(self.pool_ref()).await.map_err(db)?;
        row.as_ref().map(run_of).transpose()
    }

    pub(super) async fn get_run(&self, run_id: &str) -> Result<Option<StoredRun>, StoreError> {
        if impossible(run_id) {
            return Ok(None);
        }
        let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"));
        let row = sqlx::query(sql).bind(run_id).fetch_optional(self.pool_ref()).await.map_err(db)?;
        row.as_ref().map(run_of).transpose()
    }

    pub(super) async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<StoredRun>, StoreError> {
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
            .fetch_all(self.pool_ref())
            .await
            .map_err(db)?;
        // A row that does not read is left out of the page, named in the log, so that one row
        // broken by hand does not take the list (and the inspector) down; reading that run
        // alone says why ([`run_of`]).
        Ok(rows.iter().filter_map(|row| run_of(row).inspect_err(|e| tracing::error!(error = %e, "run store: a run left out of a list")).ok()).collect())
    }

    pub(super) async fn events_after(&self, run_id: &str, after_seq: u64) -> Result<Vec<StoredEvent>, StoreError> {
        if impossible(run_id) {
            return Ok(Vec::new());
        }
        let rows = sqlx::query("SELECT seq, kind, body FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq")
            .bind(run_id)
            .bind(after_seq.min(i64::MAX as u64) as i64)
            .fetch_all(self.pool_ref())
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
    }

    pub(super) async fn journal(&self, run_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        if impossible(run_id) {
            return Ok(Vec::new());
        }
        // A model reply's system prompt is a row of its own (`super::prompts`), joined back.
        let sql = "SELECT j.entry, j.prompt, p.body FROM run_journal j LEFT JOIN run_prompts p ON p.digest = j.prompt WHERE j.run_id = $1 ORDER BY j.id";
        let rows = sqlx::query(sql).bind(run_id).fetch_all(self.pool_ref()).await.map_err(db)?;
        rows.iter()
            .map(|r| {
                let (entry, prompt, body): (String, Option<String>, Option<String>) =
                    (r.try_get(0).map_err(db)?, r.try_get(1).map_err(db)?, r.try_get(2).map_err(db)?);
                super::prompts::join(run_id, &entry, prompt.as_deref(), body.as_deref())
            })
            .collect()
    }

    pub(super) async fn next_seq(&self, run_id: &str) -> Result<u64, StoreError> {
        if impossible(run_id) {
            return Ok(1);
        }
        let last: i64 = sqlx::query("SELECT COALESCE(MAX(seq), 0) AS last FROM run_events WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(self.pool_ref())
            .await
            .map_err(db)?
            .try_get("last")
            .map_err(db)?;
        Ok(last.max(0) as u64 + 1)
    }

    pub(super) async fn queued(&self) -> Result<u64, StoreError> {
        let n: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM runs WHERE status = 'queued'").fetch_one(self.pool_ref()).await.map_err(db)?.try_get("n").map_err(db)?;
        Ok(n.max(0) as u64)
    }
}

/// The columns [`run_of`] reads.
pub(crate) const RUN_COLUMNS: &str =
    "run_id, route_id, status, request, result, reason_class, question, next_seq, created_at, updated_at, lease_token, cancel_reason, catalogue_version";

/// A `runs` row (as selected with [`RUN_COLUMNS`]), on any database whose text and integers
/// decode as `String` and `i64`.
pub(crate) fn run_of<R>(row: &R) -> Result<StoredRun, StoreError>
where
    R: Row,
    for<'r> &'r str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let text = |k: &str| -> Result<String, StoreError> { row.try_get::<String, _>(k).map_err(db) };
    let opt = |k: &str| -> Result<Option<String>, StoreError> { row.try_get::<Option<String>, _>(k).map_err(db) };
    let run_id = text("run_id")?;
    // Each column is read into its type once, here; one that does not read names the run.
    let bad = |what: &str, e: &dyn std::fmt::Display| StoreError::Database(format!("run {run_id}: its stored {what} does not read: {e}"));
    let status = text("status")?;
    let status = StoredStatus::parse(&status).ok_or_else(|| bad("status", &format_args!("`{status}` is no run status")))?;
    let request = serde_json::from_str(&text("request")?).map_err(|e| bad("start contract", &e))?;
    let result: Option<crate::exec::RunResult> = opt("result")?.map(|r| serde_json::from_str(&r)).transpose().map_err(|e| bad("result", &e))?;
    let reason_class = opt("reason_class")?
        .map(|c| crate::failure::ReasonClass::parse(&c).ok_or_else(|| bad("reason class", &format_args!("`{c}` is no reason class"))))
        .transpose()?;
    let catalogue_version = opt("catalogue_version")?.map(|v| CatalogueVersion::parse(&v)).transpose().map_err(|e| bad("catalogue version", &e))?;
    Ok(StoredRun {
        catalogue_version,
        route_id: text("route_id")?,
        status,
        request,
        reason_class,
        // The result holds the question exactly (the column, a copy, cannot hold a NUL).
        question: result.as_ref().and_then(|r| r.question()).map(str::to_owned).or(opt("question")?),
        result,
        run_id,
        next_seq: row.try_get::<i64, _>("next_seq").map_err(db)?.max(1) as u64,
        created_at: text("created_at")?,
        updated_at: text("updated_at")?,
        lease_token: row.try_get::<i64, _>("lease_token").map_err(db)?,
        cancel_reason: opt("cancel_reason")?,
    })
}
