//! Catalogue versions kept in the store: each version's sources, once, under their digest
//! (`catalogue_versions`), written before the first run that records the version, read by any
//! replica that must finish a run on a version it did not load. A row is content-addressed and
//! never changes, so it is inserted with `ON CONFLICT DO NOTHING`, and read back checked: sources
//! whose digest is not their version are refused, not run.

use std::time::Instant;

use sqlx::Row;

use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{Lease, StoreError, now};
use crate::version::{CatalogueVersion, Sources};

// The catalogue methods of `RunStore` (`super::sql` delegates to them).
impl<DB> SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
{
    pub(super) async fn put_catalogue(&self, version: &CatalogueVersion, sources: &Sources) -> Result<(), StoreError> {
        self.health_ref().check()?;
        // JSON escapes a NUL, which PostgreSQL's text cannot hold.
        let body = serde_json::to_string(sources).map_err(|e| StoreError::Database(format!("catalogue version {version}: {e}")))?;
        let began = Instant::now();
        sqlx::query("INSERT INTO catalogue_versions (version, body, created_at) VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING")
            .bind(version.as_str())
            .bind(body)
            .bind(now())
            .execute(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
        Ok(())
    }

    pub(super) async fn catalogue(&self, version: &CatalogueVersion) -> Result<Option<Sources>, StoreError> {
        let row =
            sqlx::query("SELECT body FROM catalogue_versions WHERE version = $1").bind(version.as_str()).fetch_optional(self.pool_ref()).await.map_err(db)?;
        let Some(row) = row else { return Ok(None) };
        let body: String = row.try_get("body").map_err(db)?;
        let sources: Sources = serde_json::from_str(&body)
            .map_err(|e| StoreError::VersionUnreadable(format!("catalogue version {version}: its stored sources do not read: {e}")))?;
        let digest = sources.version();
        if &digest != version {
            return Err(StoreError::VersionUnreadable(format!("catalogue version {version}: its stored sources are version {digest}; the row was changed")));
        }
        Ok(Some(sources))
    }

    pub(super) async fn stranded_versions(&self, routes: &[String], limit: usize) -> Result<Vec<CatalogueVersion>, StoreError> {
        let now_ms = DB::NOW_MS;
        let others =
            if routes.is_empty() { String::new() } else { format!("AND route_id NOT IN ({})", super::dialect::rows_sql("", "?", routes.len(), 2, true)) };
        let sql = format!(
            "SELECT DISTINCT catalogue_version FROM runs WHERE catalogue_version IS NOT NULL              AND (status = 'queued' OR (status = 'running' AND lease_until < {now_ms})) {others} LIMIT $1"
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(limit.min(100) as i64);
        for r in routes {
            q = q.bind(r.as_str());
        }
        let rows = q.fetch_all(self.pool_ref()).await.map_err(db)?;
        // A row's version that does not read is its run's business (its claim says so).
        Ok(rows.iter().filter_map(|r| r.try_get::<String, _>("catalogue_version").ok()).filter_map(|v| CatalogueVersion::parse(&v).ok()).collect())
    }

    pub(super) async fn move_catalogue(&self, lease: &Lease, version: &CatalogueVersion) -> Result<(), StoreError> {
        self.health_ref().check()?;
        let began = Instant::now();
        let moved = sqlx::query("UPDATE runs SET catalogue_version = $1 WHERE run_id = $2 AND lease_token = $3 AND status = 'running' RETURNING run_id")
            .bind(version.as_str())
            .bind(lease.run_id())
            .bind(lease.token())
            .fetch_optional(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
        if moved.is_none() {
            return Err(StoreError::LeaseLost(lease.run_id().to_owned()));
        }
        Ok(())
    }

    pub(super) async fn catalogue_versions(&self, prefix: &str, limit: usize) -> Result<Vec<CatalogueVersion>, StoreError> {
        // A prefix of hex digits only: anything else matches no version (and no LIKE pattern).
        if !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Vec::new());
        }
        let rows = sqlx::query("SELECT version FROM catalogue_versions WHERE version LIKE $1 ORDER BY version LIMIT $2")
            .bind(format!("{}%", prefix.to_ascii_lowercase()))
            .bind(limit.min(1000) as i64)
            .fetch_all(self.pool_ref())
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let text: String = r.try_get("version").map_err(db)?;
                CatalogueVersion::parse(&text).map_err(|e| StoreError::Database(format!("catalogue_versions: {e}")))
            })
            .collect()
    }
}
