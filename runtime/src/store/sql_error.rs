//! What a database error means to the store: [`StoreError::Unavailable`] when trying again may
//! cure it (a refused or cut connection, a busy, locked, full or read-only SQLite file),
//! [`StoreError::Database`] when not; whether it makes every open connection suspect (SQLite
//! keeps a connection opened on a read-only file read-only); and what it says, in the
//! database's words. The writers (the pool's and `sqlite_writer`'s) and every other write
//! (claims, renewals, a lease let go) classify their failures here, so the health they report
//! agrees.

use super::StoreError;
use super::health::Health;

/// A database error as the store reports it: one that trying again may cure is
/// [`StoreError::Unavailable`]: a refused or cut connection, a server shutting down or out of
/// space, a busy, locked, full or read-only SQLite file.
pub(crate) fn db(e: sqlx::Error) -> StoreError {
    let text = describe(&e);
    if transient(&e) { StoreError::Unavailable(text) } else { StoreError::Database(text) }
}

/// [`db`] for a write made outside the writer (a claim, a renewal, a lease let go): a failure
/// that may pass tells `health` too, as the writer's would (readiness says so, starts are
/// refused, the probe finds out when writes work again), and one that makes every connection
/// suspect poisons them, so that a server with no run writing does not claim for ever on
/// connections SQLite opened read-only, while `/readyz` says ready.
/// `began` is when the write started (a failure of a write begun before the store last
/// recovered does not mark it failing again: [`Health::write_failed`]).
pub(crate) fn write_error(health: &Health, began: std::time::Instant, e: sqlx::Error) -> StoreError {
    if poisons(&e) {
        health.poison();
    }
    let error = db(e);
    if let StoreError::Unavailable(m) = &error {
        health.write_failed(began, m);
    }
    error
}

/// Whether a SQLite error (its primary result code) may pass: busy, locked, read-only, I/O,
/// full, cannot open.
pub(crate) fn sqlite_transient(code: i32) -> bool {
    [SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN].contains(&code)
}

/// Whether a SQLite error (its primary result code) makes every open connection suspect.
pub(crate) fn sqlite_poisons(code: i32) -> bool {
    [SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN].contains(&code)
}

fn transient(e: &sqlx::Error) -> bool {
    match e {
        // A connection cut mid-message (a server restarting) reads as a protocol error too.
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => {
            if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                let c = pg.code();
                // Connection exceptions (08…), operator intervention (57P…), insufficient
                // resources (53…: disk full, out of memory, too many connections), system
                // errors (58…: I/O), a deadlock or serialization failure, a read-only
                // transaction (a standby, or a primary told to refuse writes).
                return ["08", "57P", "53", "58"].iter().any(|p| c.starts_with(p)) || ["40P01", "40001", "25006"].contains(&c);
            }
            sqlite_primary(d.as_ref()).is_some_and(sqlite_transient)
        }
        _ => false,
    }
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;

/// A SQLite error's primary result code (the low byte of its extended code, which sqlx gives).
fn sqlite_primary(d: &dyn sqlx::error::DatabaseError) -> Option<i32> {
    d.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    d.code()?.parse::<i32>().ok().map(|c| c & 0xff)
}

/// Whether an error says something about every connection open now, not just the one that
/// failed: a SQLite connection opened while the file was read-only stays read-only, and one
/// whose file went wrong under it (I/O, cannot open, full) is not to be trusted either. Busy
/// and locked say only that another writer holds the file.
pub(super) fn poisons(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => sqlite_primary(d.as_ref()).is_some_and(sqlite_poisons),
        _ => false,
    }
}

/// What went wrong, in the database's words: its message and code, without sqlx's wrapping or
/// the server's source location (`at line 334`).
pub(crate) fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!("{} ({code})", d.message()),
            None => d.message().to_owned(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_that_is_away_is_unavailable_and_a_refusal_is_not() {
        assert!(matches!(db(sqlx::Error::PoolTimedOut), StoreError::Unavailable(_)));
        assert!(matches!(db(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))), StoreError::Unavailable(_)));
        assert!(matches!(db(sqlx::Error::RowNotFound), StoreError::Database(_)));
    }
}
