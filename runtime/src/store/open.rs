//! Opening the store a URL names: the adapter it takes (SQLite or PostgreSQL), and a store a
//! reader wants that must exist already.

use std::sync::Arc;

use super::{RunStore, StoreError, postgres, sqlite};

/// Opens the store a URL names: `sqlite://PATH` (created when missing), `sqlite::memory:`, or
/// `postgres://USER:PASSWORD@HOST[:PORT]/DB` (the database must exist; its tables are created).
pub async fn open(url: &str) -> Result<Arc<dyn RunStore>, StoreError> {
    let url = url.trim();
    if url.starts_with("sqlite:") {
        return Ok(Arc::new(sqlite::SqliteStore::open(url).await?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(postgres::PgStore::open(url).await?));
    }
    // libpq's key=value form (`host=… password=…`) is not read (sqlx takes URLs only); it is
    // named back redacted like any URL, and the fix said in the message.
    let hint = if url.contains('=') && !url.contains("://") {
        " (PostgreSQL's key=value form is not supported: write it as postgres://USER:PASSWORD@HOST:PORT/DB)"
    } else {
        ""
    };
    Err(StoreError::Url(format!("`{}` is not a store URL; use sqlite://PATH or postgres://…{hint}", crate::redact::redact_url(url))))
}

/// Opens a store that must exist already, as a reader of it (`fabric runs`, `fabric replay`)
/// wants: a SQLite file that is not there is [`StoreError::Missing`] and is not created.
pub async fn open_existing(url: &str) -> Result<Arc<dyn RunStore>, StoreError> {
    let url = url.trim();
    if url.starts_with("sqlite:") && !url.contains(":memory:") {
        let file = sqlite::file_of(url)?;
        if !file.exists() {
            return Err(StoreError::Missing(format!(
                "no run store at {} ({}): the file does not exist (runs are recorded by `fabric serve` and `fabric run --store`; FABRIC_DATABASE_URL or --store names another)",
                file.display(),
                crate::redact::redact_url(url)
            )));
        }
    }
    open(url).await
}
