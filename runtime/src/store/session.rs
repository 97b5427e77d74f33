//! Starts under a session policy ([`RunStore::create_session_run`]): one transaction that no other
//! start of the same session interleaves with. On PostgreSQL it first takes an advisory lock on
//! the session (`Dialect::SESSION_LOCK`; READ COMMITTED alone would let two starts both see no
//! live run); on SQLite its first statement is a write, which takes the database's write lock,
//! and every later statement reads under it.
//!
//! [`RunStore::create_session_run`]: super::RunStore::create_session_run

use std::time::Instant;

use sqlx::Row;

use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{CatalogueVersion, Holder, IdempotencyKey, Lease, NewRun, SessionStart, StoreError, now};
use crate::config::{INTERRUPTED_BY_SESSION, SessionPolicy};

/// The statuses of a live run.
const LIVE: &str = "status IN ('queued', 'running', 'awaiting_input')";

/// [`super::RunStore::create_session_run`] on `store`.
pub(super) async fn session_run<DB>(
    store: &SqlStore<DB>,
    run: NewRun<'_>,
    holder: Option<&Holder>,
    policy: SessionPolicy,
    key: Option<&IdempotencyKey>,
) -> Result<SessionStart, StoreError>
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
    let Some(session) = run.session_id else { return Err(StoreError::Database("a start under a session policy needs a session_id".into())) };
    store.health_ref().check()?;
    let began = Instant::now();
    let fail = |e| write_error(store.health_ref(), began, e);
    let mut tx = store.pool_ref().begin().await.map_err(fail)?;
    if !DB::SESSION_LOCK.is_empty() {
        sqlx::query(DB::SESSION_LOCK).bind(session).execute(&mut *tx).await.map_err(fail)?;
    }
    // `interrupt`: the request on the live runs first (a write: on SQLite it takes the lock).
    let interrupted: Vec<String> = if policy == SessionPolicy::Interrupt {
        let sql = format!("UPDATE runs SET cancel_reason = COALESCE(cancel_reason, $1) WHERE session_id = $2 AND {LIVE} RETURNING run_id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(INTERRUPTED_BY_SESSION).bind(session).fetch_all(&mut *tx).await.map_err(fail)?;
        rows.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>().map_err(db)?
    } else {
        Vec::new()
    };
    // `reject` runs at once when it may (claimed by the holder); the others wait behind the
    // session's live runs, queued with the gate the claims look at.
    let claimed = if policy == SessionPolicy::Reject { holder } else { None };
    let (status, owner, token, lease_ms) = claimed.map_or(("queued", None, 0, 0), |h| ("running", Some(h.owner.as_str()), 1, h.lease_ms()));
    let gate: i64 = if policy == SessionPolicy::Reject { 0 } else { 1 };
    let only_if_free =
        if policy == SessionPolicy::Reject { format!("NOT EXISTS (SELECT 1 FROM runs WHERE session_id = $11 AND {LIVE})") } else { "1 = 1".into() };
    // SQLite reads `INSERT … SELECT … ON CONFLICT` only with a WHERE in the SELECT.
    let sql = format!(
        "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at, lease_owner, lease_token, idempotency_key, webhook_url, session_id, session_gate, \
             session_seq, catalogue_version, lease_until) \
             SELECT $1, $2, $3, $4, $5, $5, $6, $7, $8, $9, $11, $10, \
             (SELECT COALESCE(MAX(s.session_seq), 0) + 1 FROM runs s WHERE s.session_id = $11 AND s.session_seq IS NOT NULL), $13, {} + $12 WHERE {only_if_free} \
             ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING run_id",
        DB::NOW_MS
    );
    let created = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(status)
        .bind(run.run_id)
        .bind(run.route_id)
        .bind(run.request_json())
        .bind(now())
        .bind(owner)
        .bind(token)
        .bind(key.map(IdempotencyKey::as_str))
        .bind(run.webhook)
        .bind(gate)
        .bind(session)
        .bind(lease_ms)
        .bind(run.catalogue_version.map(CatalogueVersion::as_str))
        .fetch_optional(&mut *tx)
        .await
        .map_err(fail)?;
    if created.is_some() {
        tx.commit().await.map_err(fail)?;
        return Ok(SessionStart::Created { lease: claimed.map(|_| Lease::new(run.run_id.to_owned(), 1)), interrupted });
    }
    // Not created: the key's run exists, or (`reject`) the session has a live run.
    let busy = format!("SELECT run_id FROM runs WHERE session_id = $1 AND {LIVE} ORDER BY run_id LIMIT 1");
    let live: Option<String> =
        sqlx::query(sqlx::AssertSqlSafe(busy)).bind(session).fetch_optional(&mut *tx).await.map_err(db)?.map(|r| r.try_get(0)).transpose().map_err(db)?;
    tx.rollback().await.map_err(db)?;
    if let Some(key) = key
        && let Some(existing) = super::RunStore::run_of_key(store, key).await?
    {
        return Ok(SessionStart::Existing(Box::new(existing)));
    }
    match live {
        Some(run_id) => Ok(SessionStart::Busy { run_id }),
        None => Err(StoreError::Database("the start was not recorded and the session has no live run; start again".into())),
    }
}
