//! The PostgreSQL run store, for several processes on one database: opening and migrating (the
//! same tables and numbering as SQLite); what a store does is [`super::sql::SqlStore`].

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

use super::health::Health;
use super::migrations;
use super::queue::{PoolWriter, WriteQueue, db, describe};
use super::sql::SqlStore;
use super::{StoreError, now};

/// The schema versions this binary knows, in order: (version, SQL). Numbered as SQLite's are.
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/postgres/0001_runs.sql")),
    (2, include_str!("migrations/postgres/0002_leases.sql")),
    (3, include_str!("migrations/postgres/0003_health.sql")),
    (4, include_str!("migrations/postgres/0004_prompts.sql")),
    (5, include_str!("migrations/postgres/0005_idempotency.sql")),
    (6, include_str!("migrations/postgres/0006_cancel.sql")),
    (7, include_str!("migrations/postgres/0007_webhooks.sql")),
    (8, include_str!("migrations/postgres/0008_sessions.sql")),
    (9, include_str!("migrations/postgres/0009_webhook_reopen.sql")),
    (10, include_str!("migrations/postgres/0010_webhook_writer.sql")),
    (11, include_str!("migrations/postgres/0011_session_order.sql")),
    (12, include_str!("migrations/postgres/0012_llm_shares.sql")),
];

/// How long connecting, or waiting for a connection of the pool, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Writer tasks (each a connection while it writes): PostgreSQL writes their transactions in
/// parallel; the pool keeps the rest of its connections for reads, claims and renewals.
const WRITERS: usize = 4;

/// Rows per multi-row INSERT (PostgreSQL allows 65,535 parameters per statement).
const ROWS_PER_INSERT: usize = 1000;

/// Any constant both migrating processes agree on: the advisory lock that serializes them.
const MIGRATION_LOCK: i64 = 0x6661_6272_6963; // "fabric"

pub type PgStore = SqlStore<sqlx::Postgres>;

impl PgStore {
    /// Connects to and migrates the database at `url` (`postgres://USER:PASSWORD@HOST/DB`).
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        // Where, without the credentials or the query string.
        let here = crate::redact::redact_url(url);
        let options = PgConnectOptions::from_str(url).map_err(|e| StoreError::Url(format!("`{here}`: {}", describe(&e))))?;
        // One connection first: the pool would retry until its timeout and then say only that
        // it timed out, hiding the cause (refused, unknown host, authentication failed).
        let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await;
        match first {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
            Ok(Err(e)) => return Err(StoreError::Unavailable(format!("cannot connect to {here}: {}", describe(&e)))),
            Err(_) => return Err(StoreError::Unavailable(format!("cannot connect to {here}: no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to {here}: {}", describe(&e))))?;
        migrate(&pool).await?;
        let health = Arc::new(Health::new(true));
        let writer = PoolWriter { pool: pool.clone(), per_insert: ROWS_PER_INSERT, health: health.clone(), known: Default::default() };
        tokio::spawn(writer.clone().heal(None));
        let queue = WriteQueue::start(writer, WRITERS, health.clone());
        Ok(SqlStore::new(pool, queue, health))
    }
}

async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(db)?;
    // Replicas starting together: one migrates, the others wait and then find it done.
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await.map_err(db)?;
    // Created only where missing (`IF NOT EXISTS` would say so in a notice at every start).
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('fabric_schema') IS NOT NULL").fetch_one(&mut *tx).await.map_err(db)?;
    if !exists {
        sqlx::query("CREATE TABLE fabric_schema (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)").execute(&mut *tx).await.map_err(db)?;
    }
    // Checksums came later than the table: a database of an older runtime gets the column.
    let has_sums: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'fabric_schema' AND column_name = 'checksum' AND table_schema = current_schema())",
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db)?;
    if !has_sums {
        sqlx::query("ALTER TABLE fabric_schema ADD COLUMN checksum TEXT").execute(&mut *tx).await.map_err(db)?;
    }
    let applied: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT version, checksum FROM fabric_schema ORDER BY version").fetch_all(&mut *tx).await.map_err(db)?;
    let found = applied.last().map_or(0, |a| a.0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, sum) in migrations::verify(&applied, MIGRATIONS)? {
        sqlx::query("UPDATE fabric_schema SET checksum = $1 WHERE version = $2").bind(sum).bind(version).execute(&mut *tx).await.map_err(db)?;
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO fabric_schema (version, applied_at, checksum) VALUES ($1, $2, $3)")
            .bind(version)
            .bind(now())
            .bind(migrations::checksum(sql))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)
}
