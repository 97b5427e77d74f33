//! What differs between the SQL of the databases a store runs on ([`Dialect`]: the clock, row
//! locks, placeholders, the advisory locks of a sweep and of a session), and the one function
//! that writes many rows' placeholders ([`rows_sql`]). Every other statement of the store is SQL
//! both databases take (`$n`, `CAST(… AS TEXT)`, `RETURNING`), written once.

/// What differs between the SQL of the databases a store runs on.
pub trait Dialect {
    /// Milliseconds since the epoch on the database's clock (PostgreSQL's server; SQLite's is
    /// the machine's, which every process using the file shares): leases never compare two
    /// machines' clocks.
    const NOW_MS: &'static str;
    /// Appended to the select of a claim: rows another claimer holds are skipped, not waited
    /// for (empty where a write locks the whole database).
    const SKIP_LOCKED: &'static str;
    /// Appended to a select that locks the rows of many runs at once, `ORDER BY run_id`: every
    /// statement that updates several runs' rows (the writer's fence, the lease renewal) takes
    /// their locks in one order, so two of them never wait for each other (PostgreSQL's
    /// `deadlock detected`, which failed the writer's transaction and refused starts with a 503
    /// under load: `tests/e2e/durable_load.rs`). Empty where a write locks the whole database.
    const LOCK_ROWS: &'static str;
    /// Placeholders numbered (`$1, $2`) or anonymous (`?`, bound in the order they appear).
    /// SQLite takes both, but sqlx looks each numbered one up by name, a cost that grows with
    /// the square of a statement's parameters: the writer's large statements use `?` there.
    const NUMBERED: bool;
    /// One `BIGINT`, 1 when this transaction may sweep old runs and 0 when another replica's
    /// sweep holds the lock (PostgreSQL's advisory lock, let go at the commit); 1 where a write
    /// locks the whole database anyway.
    const SWEEP_LOCK: &'static str;
    /// Run first in a start's transaction under a session policy, with the session as `$1`: it
    /// waits until no other such transaction of the session is open (PostgreSQL's advisory
    /// lock, let go at the commit). Empty where a write locks the whole database anyway.
    const SESSION_LOCK: &'static str;
}

impl Dialect for sqlx::Sqlite {
    const NOW_MS: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    const SKIP_LOCKED: &'static str = "";
    const LOCK_ROWS: &'static str = "";
    const NUMBERED: bool = false;
    const SWEEP_LOCK: &'static str = "SELECT 1";
    const SESSION_LOCK: &'static str = "";
}

impl Dialect for sqlx::Postgres {
    const NOW_MS: &'static str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const LOCK_ROWS: &'static str = " FOR UPDATE";
    const NUMBERED: bool = true;
    // The key is the sweep's own (`fabric` sweep, in ASCII), apart from the migrations' lock.
    const SWEEP_LOCK: &'static str = "SELECT CAST(CASE WHEN pg_try_advisory_xact_lock(6661735247) THEN 1 ELSE 0 END AS BIGINT)";
    const SESSION_LOCK: &'static str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 6661735248))";
}

/// `head` followed by `n` copies of `row`, comma-separated, each `?` of which becomes the next
/// placeholder: numbered from `$first` on (`$1, $2, …`, across the rows), or left `?` where the
/// database binds anonymous placeholders in order ([`Dialect::NUMBERED`]).
pub(crate) fn rows_sql(head: &str, row: &str, n: usize, first: usize, numbered: bool) -> String {
    let mut sql = String::with_capacity(head.len() + n * (row.len() + 16));
    sql.push_str(head);
    let mut k = first;
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        for c in row.chars() {
            if c == '?' && numbered {
                sql.push('$');
                sql.push_str(&k.to_string());
                k += 1;
            } else {
                sql.push(c);
            }
        }
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sql_numbers_placeholders_across_rows() {
        assert_eq!(rows_sql("INSERT INTO t VALUES ", "(?, ?)", 2, 1, true), "INSERT INTO t VALUES ($1, $2),($3, $4)");
        assert_eq!(rows_sql("V ", "('x', ?, f() + ?)", 2, 2, true), "V ('x', $2, f() + $3),('x', $4, f() + $5)");
        assert_eq!(rows_sql("V ", "(?, ?)", 2, 1, false), "V (?, ?),(?, ?)");
    }
}
