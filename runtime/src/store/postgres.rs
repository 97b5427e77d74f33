//! The PostgreSQL run store, for several processes on one database: connecting (one connection
//! first, so a refusal is said with its cause), the pool, its writer tasks, and the migration
//! ([`super::migrations`], under an advisory lock); what a store does is
//! [`super::sql::SqlStore`].

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};

use super::StoreError;
use super::health::Health;
use super::migrations;
use super::pool_writer::PoolWriter;
use super::queue::WriteQueue;
use super::sql::SqlStore;
use super::sql_error::describe;

/// How long connecting, or waiting for a connection of the pool, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a transaction of this process may sit idle in the server before the server ends it
/// (PostgreSQL's `idle_in_transaction_session_timeout`, set on each of the pool's connections).
/// This process never waits on anything but the database inside a transaction, so only a process
/// frozen in the middle of one (SIGSTOP, a paused VM) reaches it; without it the frozen process
/// would keep its runs' rows locked, and so kept from every other replica's takeover, for as long
/// as it stays frozen, past any lease. Its writes are refused by the fence when it wakes.
const SET_IDLE_IN_TRANSACTION: &str = "SET idle_in_transaction_session_timeout = '10s'";

/// Writer tasks (each a connection while it writes): PostgreSQL writes their transactions in
/// parallel; the pool keeps the rest of its connections for reads, claims and renewals.
const WRITERS: usize = 4;

/// Rows per multi-row INSERT (PostgreSQL allows 65,535 parameters per statement).
const ROWS_PER_INSERT: usize = 1000;

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
            .after_connect(|conn, _| Box::pin(async move { sqlx::query(SET_IDLE_IN_TRANSACTION).execute(conn).await.map(|_| ()) }))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to {here}: {}", describe(&e))))?;
        migrations::migrate(&pool).await?;
        let health = Arc::new(Health::new(true));
        let writer = PoolWriter { pool: pool.clone(), per_insert: ROWS_PER_INSERT, health: health.clone(), known: Default::default() };
        tokio::spawn(writer.clone().heal(None));
        let queue = WriteQueue::start(writer, WRITERS, health.clone());
        Ok(SqlStore::new(pool, queue, health))
    }
}
