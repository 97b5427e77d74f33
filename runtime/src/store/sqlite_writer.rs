//! The SQLite store's writer: the shared writer task ([`super::queue`]) on a thread of its own,
//! writing each group commit through rusqlite on one connection with cached prepared statements.
//!
//! Why not sqlx here (measured, docs/performance.md): sqlx's SQLite driver runs every statement
//! on a worker thread of the connection (a hand-over each way) and prepares a multi-row INSERT
//! anew for every row count; a journalled run paid ~1 ms of CPU for its five transactions. Here
//! a transaction is a few `step`s of statements prepared once, on the thread that owns the
//! connection. Reads, claims and renewals stay on sqlx's pool (WAL readers on their own
//! connections, which never wait for this writer).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rusqlite::{Connection, OpenFlags, params};

use super::StoreError;
use super::dialect::Dialect;
use super::health::Health;
use super::prompts::Known;
use super::rows::{End, Rows, WriteFailure, WriteRows};
use crate::failure::BoxFuture;

/// The database's clock in milliseconds (the same expression the other statements use).
const NOW_MS: &str = <sqlx::Sqlite as Dialect>::NOW_MS;

/// Prepared statements kept per connection: the writer uses six.
const STATEMENTS: usize = 16;

/// The writer's connection, opened on first use and again after a failure (a connection that
/// failed is not trusted: SQLite keeps a connection opened on a read-only file read-only).
#[derive(Clone)]
pub(crate) struct SqliteWriter {
    path: PathBuf,
    /// The connection and when it was opened.
    conn: Arc<Mutex<Option<(Connection, Instant)>>>,
    health: Arc<Health>,
    /// The prompts known to be committed.
    known: Arc<Known>,
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter").field("path", &self.path).finish_non_exhaustive()
    }
}

impl SqliteWriter {
    pub(crate) fn new(path: PathBuf, health: Arc<Health>) -> SqliteWriter {
        SqliteWriter { path, conn: Arc::new(Mutex::new(None)), health, known: Default::default() }
    }

    fn open(&self) -> Result<Connection, rusqlite::Error> {
        // The file exists and is migrated (the pool opened it first); no URI parsing.
        let conn = Connection::open_with_flags(&self.path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        // The same settings as the pool's connections (sqlite.rs): WAL is the file's, the rest
        // each connection's own. `synchronous=NORMAL` in WAL: docs/operations.md says what a
        // power loss can take.
        conn.execute_batch("PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")?;
        conn.set_prepared_statement_cache_capacity(STATEMENTS);
        Ok(conn)
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer's connection (opened when
    /// there is none); a failure rolls back and drops the connection.
    fn with_tx<T>(&self, f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, rusqlite::Error>) -> Result<T, Failure> {
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        // Closed when any connection's error made every open one suspect since it was opened, as
        // the pool's are (`Health::fresh`): one connection of the process left holding the file
        // or its shared memory read-only keeps every new one read-only too.
        if slot.as_ref().is_some_and(|(_, opened)| !self.health.fresh(opened.elapsed())) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some((self.open().map_err(Failure::of)?, Instant::now()));
        }
        let (conn, _) = slot.as_mut().expect("opened above");
        let done = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).and_then(|tx| {
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        });
        done.map_err(|e| {
            let failure = Failure::of(e);
            // Not trusted again (its transaction rolled back as the `Transaction` dropped).
            *slot = None;
            if failure.poison {
                self.health.poison();
            }
            failure
        })
    }
}

/// Writes a transaction's rows: the new runs; the fence with the ends (one UPDATE per run
/// committed for, under the database's write lock that `BEGIN IMMEDIATE` took, so no claim can
/// come between it and the rows below); then the events, prompts and entries of the runs that
/// hold. Returns the fenced runs, and the digests of the prompts written.
fn write<'a>(tx: &rusqlite::Transaction<'_>, rows: &Rows<'a>, known: &Known) -> Result<(HashSet<String>, Vec<&'a str>), rusqlite::Error> {
    let at = rows.at.as_str();
    let mut fenced = HashSet::new();
    if !rows.creates.is_empty() {
        // A new run whose idempotency key another run has is not written (and is returned).
        let mut create = tx.prepare_cached(&format!(
            "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at, lease_owner, lease_token, idempotency_key, webhook_url, session_id, catalogue_version, lease_until) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8, ?10, ?11, ?12, {NOW_MS} + ?9) ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
        ))?;
        for c in &rows.creates {
            let status = if c.claim.is_some() { "running" } else { "queued" };
            let (owner, token, ms) = c.claim.map_or((None, 0, 0), |(o, ms)| (Some(o), 1, ms));
            if create.execute(params![status, c.run_id, c.route_id, c.request, at, owner, token, c.key, ms, c.webhook, c.session, c.version])? == 0 {
                fenced.insert(c.run_id.to_owned());
            }
        }
    }
    let mut holding: HashSet<&str> = HashSet::with_capacity(rows.leases.len());
    let mut hooks: Vec<(&End<'_>, String)> = Vec::new();
    if !rows.leases.is_empty() {
        // Two statements: a commit that ends the run (or makes it ask) sets its status, result
        // and lease, and says where its webhook goes; one that does not (the run goes on)
        // touches only `updated_at`.
        let mut fence = tx.prepare_cached("UPDATE runs SET updated_at = ?1 WHERE run_id = ?2 AND lease_token = ?3 AND status = 'running'")?;
        let mut fence_end = tx.prepare_cached(
            "UPDATE runs SET updated_at = ?1, status = ?4, result = ?5, reason_class = ?6, question = ?7, \
             next_seq = COALESCE(?8, next_seq), lease_owner = NULL, lease_until = 0 \
             WHERE run_id = ?2 AND lease_token = ?3 AND status = 'running'",
        )?;
        // Read after the end, not returned by it: SQLite's RETURNING materialises its rows in a
        // table of its own (measured: ~9,000 instructions per run more than this lookup).
        let mut hook_of = tx.prepare_cached("SELECT webhook_url FROM runs WHERE run_id = ?1 AND webhook_url IS NOT NULL")?;
        for (run_id, token) in &rows.leases {
            let changed = match rows.ends.iter().find(|e| e.run_id == *run_id && e.token == *token) {
                None => fence.execute(params![at, run_id, token])?,
                Some(end) => {
                    let e = end.end;
                    let changed = fence_end.execute(params![
                        at,
                        run_id,
                        token,
                        e.status.as_str(),
                        e.result.as_str(),
                        e.reason_class,
                        e.question.as_deref(),
                        e.next_seq
                    ])?;
                    if changed == 1
                        && let Some(url) = hook_of.query_row(params![run_id], |r| r.get::<_, String>(0)).map(Some).or_else(none_if_no_rows)?
                    {
                        hooks.push((end, url));
                    }
                    changed
                }
            };
            if changed == 1 {
                holding.insert(run_id);
            } else {
                fenced.insert((*run_id).to_owned());
            }
        }
    }
    if !hooks.is_empty() {
        // The ends' webhook deliveries, in the transaction of the ends.
        let mut insert =
            tx.prepare_cached("INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?;
        for (end, url) in &hooks {
            let e = end.end;
            insert.execute(params![end.run_id, e.status.as_str(), e.result.as_str(), e.reason_class, e.question.as_deref(), at, url])?;
        }
    }
    // Each state change's delivery to each A2A push config of its run, in this transaction too.
    let changes = rows.push_changes(&holding);
    if !changes.is_empty() {
        let mut insert = tx.prepare_cached(
            "INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url, push_config) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, url, config_id FROM a2a_push_configs WHERE run_id = ?1 ORDER BY created_at, config_id",
        )?;
        for c in &changes {
            insert.execute(params![c.run_id, c.status, c.result, c.reason_class, c.question, at])?;
        }
    }
    let mut events = None;
    for (run_id, seq, kind, body) in rows.events.iter().filter(|e| holding.contains(e.0)) {
        let insert = match &mut events {
            Some(s) => s,
            None => events.insert(tx.prepare_cached("INSERT INTO run_events (run_id, seq, kind, body) VALUES (?1, ?2, ?3, ?4)")?),
        };
        insert.execute(params![run_id, seq, kind, body])?;
    }
    let prompts = rows.new_prompts(&holding, known);
    if !prompts.is_empty() {
        // Content-addressed: one already there is the same row.
        let mut insert = tx.prepare_cached("INSERT INTO run_prompts (digest, body) VALUES (?1, ?2) ON CONFLICT (digest) DO NOTHING")?;
        for p in &prompts {
            insert.execute(params![p.digest, p.body])?;
        }
    }
    let mut entries = None;
    for (run_id, entry, prompt) in rows.entries.iter().filter(|e| holding.contains(e.0)) {
        let insert = match &mut entries {
            Some(s) => s,
            None => entries.insert(tx.prepare_cached("INSERT INTO run_journal (run_id, entry, prompt) VALUES (?1, ?2, ?3)")?),
        };
        insert.execute(params![run_id, entry, prompt])?;
    }
    Ok((fenced, prompts.into_iter().map(|p| p.digest.as_str()).collect()))
}

/// [`WriteRows::committed`]: which runs of `rows` are fenced now (or, new, found their key
/// taken), and whether its rows are there.
fn committed(tx: &rusqlite::Transaction<'_>, rows: &Rows<'_>) -> Result<Option<HashSet<String>>, rusqlite::Error> {
    let mut fenced = HashSet::new();
    let mut token = tx.prepare_cached("SELECT lease_token FROM runs WHERE run_id = ?1")?;
    for (run_id, held) in &rows.leases {
        let now: Option<i64> = token.query_row([run_id], |r| r.get(0)).map(Some).or_else(none_if_no_rows)?;
        if now != Some(*held) {
            fenced.insert((*run_id).to_owned());
        }
    }
    let mut created = Vec::with_capacity(rows.creates.len());
    for c in &rows.creates {
        created.push(token.query_row([c.run_id], |_| Ok(())).map(Some).or_else(none_if_no_rows)?.is_some());
    }
    let witness = if let Some((run_id, seq, ..)) = rows.events.iter().find(|e| !fenced.contains(e.0)) {
        tx.query_row("SELECT 1 FROM run_events WHERE run_id = ?1 AND seq = ?2", params![run_id, seq], |_| Ok(())).map(Some).or_else(none_if_no_rows)?
    } else if !rows.creates.is_empty() {
        // Any new run's row says (one whose key another run has was never written).
        created.contains(&true).then_some(())
    } else {
        return Ok(Some(fenced));
    };
    if witness.is_none() {
        return Ok(None);
    }
    fenced.extend(rows.creates.iter().zip(&created).filter(|(_, c)| !**c).map(|(c, _)| c.run_id.to_owned()));
    Ok(Some(fenced))
}

fn none_if_no_rows<T>(e: rusqlite::Error) -> Result<Option<T>, rusqlite::Error> {
    match e {
        rusqlite::Error::QueryReturnedNoRows => Ok(None),
        other => Err(other),
    }
}

impl WriteRows for SqliteWriter {
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, WriteFailure>> {
        // Synchronous: this writer runs on a thread of its own (`WriteQueue::start_on_thread`).
        // A SQLite error is the engine's own answer: nothing is in doubt.
        let done = self.with_tx(|tx| write(tx, rows, &self.known)).map_err(|f| WriteFailure { error: f.error, in_doubt: false });
        let done = done.map(|(fenced, prompts)| {
            // Committed: known from now on.
            self.known.add(prompts);
            fenced
        });
        Box::pin(std::future::ready(done))
    }

    fn committed<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<Option<HashSet<String>>, StoreError>> {
        Box::pin(std::future::ready(self.with_tx(|tx| committed(tx, rows)).map_err(|f| f.error)))
    }
}

/// A failed statement: the store's error, and whether every connection open now is suspect.
struct Failure {
    error: StoreError,
    poison: bool,
}

impl Failure {
    fn of(e: rusqlite::Error) -> Failure {
        let primary = match &e {
            rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code & 0xff),
            _ => None,
        };
        let text = match &e {
            rusqlite::Error::SqliteFailure(f, Some(m)) => format!("{m} ({})", f.extended_code),
            rusqlite::Error::SqliteFailure(f, None) => format!("{f} ({})", f.extended_code),
            other => other.to_string(),
        };
        let transient = primary.is_some_and(super::sql_error::sqlite_transient);
        let poison = primary.is_some_and(super::sql_error::sqlite_poisons);
        Failure { error: if transient { StoreError::Unavailable(text) } else { StoreError::Database(text) }, poison }
    }
}
