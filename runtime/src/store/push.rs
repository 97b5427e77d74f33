//! A2A push notification configs kept in the store (issue 52): where a run's status changes are
//! posted, several per run. The rows are statements on the pool (a config is not a run's
//! write); their deliveries are the outbox's rows ([`super::outbox`]), which the writers add in
//! the transaction of each status change (`rows::Rows::push_changes`), so a config created is
//! delivered whatever replica dies after.

use sqlx::Row;

use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{StoreError, now};
use crate::failure::BoxFuture;

/// How a delivery authenticates itself to its receiver: `Authorization: {scheme} {credentials}`.
#[derive(Clone, PartialEq, Eq)]
pub struct PushAuth {
    /// `Bearer` or `Basic`.
    pub scheme: String,
    pub credentials: Option<String>,
}

impl std::fmt::Debug for PushAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushAuth").field("scheme", &self.scheme).field("credentials", &self.credentials.as_ref().map(|_| "<redacted>")).finish()
    }
}

/// A config as kept. Its `token` and credentials are secrets: its `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct PushConfig {
    pub run_id: String,
    pub config_id: String,
    pub url: String,
    /// Sent as `X-A2A-Notification-Token` with each delivery.
    pub token: Option<String>,
    pub auth: Option<PushAuth>,
    /// Created through an A2A 0.3 method: its deliveries' bodies are 0.3's.
    pub legacy: bool,
}

impl std::fmt::Debug for PushConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConfig")
            .field("run_id", &self.run_id)
            .field("config_id", &self.config_id)
            .field("url", &crate::redact::origin_and_path(&self.url))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("auth", &self.auth)
            .field("legacy", &self.legacy)
            .finish()
    }
}

/// The configs' port ([`super::RunStore::push_configs`]).
pub trait PushConfigStore: Send + Sync {
    /// Keeps `config`, in place of the run's config of the same id if there is one.
    fn put_push_config<'a>(&'a self, config: &'a PushConfig) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Adds a delivery of the run's state now to a config kept after the run started (a send's:
    /// its run may have been claimed, have started or asked before the config was kept), unless
    /// the writer added one for that state already.
    fn push_catch_up<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    fn push_config<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<Option<PushConfig>, StoreError>>;
    /// A run's configs, oldest first.
    fn list_push_configs<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<PushConfig>, StoreError>>;
    /// Deletes a config (false: there was none) and gives up its pending deliveries: nothing
    /// more is posted for it.
    fn delete_push_config<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// The columns a config is read from.
const COLUMNS: &str = "run_id, config_id, url, token, auth_scheme, auth_credentials, legacy";

/// A config from `row`, its columns named `{prefix}{column}` (the outbox's claim reads them
/// joined to a delivery's row, prefixed).
pub(super) fn config_of<R: Row>(row: &R, prefix: &str) -> Result<PushConfig, StoreError>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'t> String: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
    for<'t> i64: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
{
    let column = |c: &str| format!("{prefix}{c}");
    let scheme: Option<String> = row.try_get(column("auth_scheme").as_str()).map_err(db)?;
    let credentials: Option<String> = row.try_get(column("auth_credentials").as_str()).map_err(db)?;
    Ok(PushConfig {
        run_id: row.try_get(column("run_id").as_str()).map_err(db)?,
        config_id: row.try_get(column("config_id").as_str()).map_err(db)?,
        url: row.try_get(column("url").as_str()).map_err(db)?,
        token: row.try_get(column("token").as_str()).map_err(db)?,
        auth: scheme.map(|scheme| PushAuth { scheme, credentials }),
        legacy: row.try_get::<i64, _>(column("legacy").as_str()).map_err(db)? != 0,
    })
}

impl<DB> PushConfigStore for SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
{
    fn put_push_config<'a>(&'a self, c: &'a PushConfig) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = std::time::Instant::now();
            sqlx::query(
                "INSERT INTO a2a_push_configs (run_id, config_id, url, token, auth_scheme, auth_credentials, legacy, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (run_id, config_id) DO UPDATE SET url = excluded.url, token = excluded.token, \
                 auth_scheme = excluded.auth_scheme, auth_credentials = excluded.auth_credentials, legacy = excluded.legacy",
            )
            .bind(c.run_id.as_str())
            .bind(c.config_id.as_str())
            .bind(c.url.as_str())
            .bind(c.token.as_deref())
            .bind(c.auth.as_ref().map(|a| a.scheme.as_str()))
            .bind(c.auth.as_ref().and_then(|a| a.credentials.as_deref()))
            .bind(i64::from(c.legacy))
            .bind(now())
            .execute(self.pool_ref())
            .await
            .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }

    fn push_catch_up<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let began = std::time::Instant::now();
            // A running run's result is its last question's, if any: not told with `working`.
            sqlx::query(
                "INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url, push_config) \
                 SELECT r.run_id, r.status, CASE WHEN r.status = 'running' THEN NULL ELSE r.result END, \
                 CASE WHEN r.status = 'running' THEN NULL ELSE r.reason_class END, CASE WHEN r.status = 'running' THEN NULL ELSE r.question END, \
                 r.updated_at, p.url, p.config_id FROM runs r JOIN a2a_push_configs p ON p.run_id = r.run_id AND p.config_id = $2 \
                 WHERE r.run_id = $1 AND r.status IN ('running', 'awaiting_input', 'completed', 'failed', 'cancelled') \
                 AND NOT EXISTS (SELECT 1 FROM run_webhooks w WHERE w.run_id = r.run_id AND w.push_config = p.config_id AND w.status = r.status)",
            )
            .bind(run_id)
            .bind(config_id)
            .execute(self.pool_ref())
            .await
            .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }

    fn push_config<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<Option<PushConfig>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {COLUMNS} FROM a2a_push_configs WHERE run_id = $1 AND config_id = $2");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run_id).bind(config_id).fetch_optional(self.pool_ref()).await.map_err(db)?;
            row.map(|r| config_of(&r, "")).transpose()
        })
    }

    fn list_push_configs<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<PushConfig>, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {COLUMNS} FROM a2a_push_configs WHERE run_id = $1 ORDER BY created_at, config_id");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(run_id).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter().map(|r| config_of(r, "")).collect()
        })
    }

    fn delete_push_config<'a>(&'a self, run_id: &'a str, config_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = std::time::Instant::now();
            let fail = |err| write_error(self.health_ref(), began, err);
            let deleted = sqlx::query("DELETE FROM a2a_push_configs WHERE run_id = $1 AND config_id = $2 RETURNING config_id")
                .bind(run_id)
                .bind(config_id)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(fail)?;
            // A delivery the sender claims meanwhile finds no config and is given up the same way.
            sqlx::query(
                "UPDATE run_webhooks SET state = 'failed', last_error = 'its push notification config was deleted', done_at = $1 \
                 WHERE run_id = $2 AND push_config = $3 AND state = 'pending'",
            )
            .bind(now())
            .bind(run_id)
            .bind(config_id)
            .execute(self.pool_ref())
            .await
            .map_err(fail)?;
            Ok(deleted.is_some())
        })
    }
}
