//! The writer's side of a sqlx pool ([`PoolWriter`]): one transaction's [`Rows`] written on one
//! connection (the new runs, the fence with the ends, then one multi-row INSERT per table for
//! the runs that hold their lease), whether a transaction whose COMMIT went unanswered
//! committed after all, and the healer's probe. PostgreSQL's writes and an in-memory SQLite
//! database's go through it; a SQLite file's through [`super::sqlite_writer`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::StoreError;
use super::dialect::{Dialect, rows_sql};
use super::health::Health;
use super::prompts::Known;
use super::rows::{End, Rows, WriteFailure, WriteRows};
use super::sql_error::{db, poisons};
use crate::failure::BoxFuture;

/// The writer's side of a pool: how many rows one INSERT takes at the most (a database bounds
/// the parameters of a statement).
pub(crate) struct PoolWriter<DB: sqlx::Database> {
    pub pool: sqlx::Pool<DB>,
    pub per_insert: usize,
    pub health: Arc<Health>,
    /// The prompts known to be committed (shared by the store's writers).
    pub known: Arc<Known>,
}

// By hand: a derive would ask `DB: Clone`, which the databases' marker types are not.
impl<DB: sqlx::Database> Clone for PoolWriter<DB> {
    fn clone(&self) -> Self {
        PoolWriter { pool: self.pool.clone(), per_insert: self.per_insert, health: self.health.clone(), known: self.known.clone() }
    }
}

impl<DB: sqlx::Database> PoolWriter<DB> {
    /// A connection that failed is not handed out again: its state is not known (a transaction
    /// that may still be open, a file SQLite opened read-only).
    fn forget(&self, conn: &mut sqlx::pool::PoolConnection<DB>, f: &ConnFailure) {
        if self.health.discards() {
            conn.close_on_drop();
        }
        if f.poison {
            // A no-op for an in-memory database (its one connection is the database).
            self.health.poison();
        }
    }
}

impl<DB> PoolWriter<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> usize: ColumnIndex<DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    /// [`WriteRows::committed`] on one connection.
    async fn committed_on(&self, conn: &mut sqlx::pool::PoolConnection<DB>, rows: &Rows<'_>) -> Result<Option<HashSet<String>>, ConnFailure> {
        let conn = &mut **conn;
        let mut fenced = HashSet::new();
        for (run_id, token) in &rows.leases {
            let row = sqlx::query("SELECT lease_token FROM runs WHERE run_id = $1").bind(*run_id).fetch_optional(&mut *conn).await.map_err(failed)?;
            let now: Option<i64> = row.map(|r| r.try_get(0)).transpose().map_err(failed)?;
            if now != Some(*token) {
                fenced.insert((*run_id).to_owned());
            }
        }
        let witness = if let Some((run_id, seq, ..)) = rows.events.iter().find(|e| !fenced.contains(e.0)) {
            sqlx::query("SELECT run_id FROM run_events WHERE run_id = $1 AND seq = $2").bind(*run_id).bind(*seq).fetch_optional(&mut *conn).await
        } else if !rows.creates.is_empty() {
            // Any new run's row says (one whose key another run has was never written).
            let sql = format!("SELECT run_id FROM runs WHERE run_id IN ({}) LIMIT 1", rows_sql("", "?", rows.creates.len(), 1, DB::NUMBERED));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for c in &rows.creates {
                q = q.bind(c.run_id);
            }
            q.fetch_optional(&mut *conn).await
        } else {
            // Every run it wrote for is fenced now: whether it committed changes nothing.
            return Ok(Some(fenced));
        };
        if witness.map_err(failed)?.is_none() {
            return Ok(None);
        }
        // Committed: a keyed new run whose row is not there found its key taken.
        for c in rows.creates.iter().filter(|c| c.key.is_some()) {
            let row = sqlx::query("SELECT run_id FROM runs WHERE run_id = $1").bind(c.run_id).fetch_optional(&mut *conn).await.map_err(failed)?;
            if row.is_none() {
                fenced.insert(c.run_id.to_owned());
            }
        }
        Ok(Some(fenced))
    }

    /// Heals what no write would: while writes fail, a probe every [`HEAL_EVERY`] finds out
    /// when they work again (with no run writing, nothing else would); a SQLite file removed or
    /// replaced under the store is found and said. For as long as the store lives.
    pub(crate) async fn heal(self, watch: Option<super::health::FileWatch>) {
        let mut tick = tokio::time::interval(super::health::HEAL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(problem) = watch.as_ref().and_then(super::health::FileWatch::problem) {
                self.health.file_lost(problem);
            }
            if self.health.failing() {
                let _ = self.probe().await;
            }
        }
    }

    /// One small write, committed, on a connection of its own: whether the database takes
    /// writes now (the healer's probe while writes fail). A connection it fails on goes.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let began = std::time::Instant::now();
        let mut conn = self.pool.acquire().await.map_err(db)?;
        let done = sqlx::query("UPDATE fabric_health SET beat = beat + 1 WHERE id = 1").execute(&mut *conn).await.map_err(failed);
        match done {
            Ok(_) => {
                self.health.probe_succeeded();
                Ok(())
            }
            Err(f) => {
                self.forget(&mut conn, &f);
                if let StoreError::Unavailable(e) = &f.error {
                    self.health.write_failed(began, e);
                }
                Err(f.error)
            }
        }
    }

    /// The new runs' rows; the fence with the ends (it locks the rows of the runs committed for,
    /// so no claim can come between the check and the writes); then one multi-row INSERT per
    /// table (per `per_insert` rows) for the runs that hold their lease, each row's token checked
    /// again in the statement.
    async fn write_on(&self, conn: &mut sqlx::pool::PoolConnection<DB>, rows: &Rows<'_>) -> Result<HashSet<String>, ConnFailure> {
        let per_insert = self.per_insert;
        let at = rows.at.as_str();
        let mut tx = sqlx::Connection::begin(&mut **conn).await.map_err(failed)?;
        // New runs whose idempotency key another run has: not written, and returned with the fenced.
        let mut refused = HashSet::new();
        for chunk in rows.creates.chunks(per_insert) {
            let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at, lease_owner, lease_token, idempotency_key, webhook_url, session_id, catalogue_version, lease_until) VALUES ";
            let row = format!("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {} + ?)", DB::NOW_MS);
            let sql = format!(
                "{} ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING run_id",
                rows_sql(head, &row, chunk.len(), 1, DB::NUMBERED)
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for c in chunk {
                let status = if c.claim.is_some() { "running" } else { "queued" };
                let (owner, token, ms) = c.claim.map_or((None, 0, 0), |(o, ms)| (Some(o), 1, ms));
                q = q
                    .bind(status)
                    .bind(c.run_id)
                    .bind(c.route_id)
                    .bind(c.request)
                    .bind(at)
                    .bind(at)
                    .bind(owner)
                    .bind(token)
                    .bind(c.key)
                    .bind(c.webhook)
                    .bind(c.session)
                    .bind(c.version)
                    .bind(ms);
            }
            let written: HashSet<String> =
                q.fetch_all(&mut *tx).await.map_err(failed)?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>().map_err(failed)?;
            refused.extend(chunk.iter().filter(|c| !written.contains(c.run_id)).map(|c| c.run_id.to_owned()));
        }
        // The fence and the ends, in one statement: the runs still `running` under the
        // token their writer holds get their row updated (an end: status, result, the lease let
        // go; a reply claims the run anew) and are returned. The UPDATE locks their rows until
        // the commit, so no claim can come between the check and the writes below, which are
        // made for those runs only.
        let mut holding: HashSet<&str> = HashSet::with_capacity(rows.leases.len());
        let ends: HashMap<&str, &End> = rows.ends.iter().map(|e| (e.run_id, e)).collect();
        let mut hooks: Vec<(&End, String)> = Vec::new();
        // In the order of their ids, as the lease renewal locks them (`Dialect::LOCK_ROWS`).
        let mut leases: Vec<(&str, i64)> = rows.leases.clone();
        leases.sort_unstable();
        for chunk in leases.chunks(per_insert / 4) {
            if !DB::LOCK_ROWS.is_empty() {
                let sql =
                    format!("SELECT run_id FROM runs WHERE run_id IN ({}) ORDER BY run_id{}", rows_sql("", "?", chunk.len(), 1, DB::NUMBERED), DB::LOCK_ROWS);
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (run_id, _) in chunk {
                    q = q.bind(*run_id);
                }
                q.fetch_all(&mut *tx).await.map_err(failed)?;
            }
            let values = rows_sql("", "(?, ?, ?, ?, ?, ?, ?)", chunk.len(), 2, DB::NUMBERED);
            let at_mark = if DB::NUMBERED { "$1" } else { "?" };
            // No end in this batch (the run goes on): the row keeps its result and lease.
            let going_on = "v.column3 IS NULL";
            let sql = format!(
                "UPDATE runs SET updated_at = {at_mark}, status = COALESCE(v.column3, runs.status), \
                 result = CASE WHEN {going_on} THEN runs.result ELSE v.column4 END, \
                 reason_class = CASE WHEN {going_on} THEN runs.reason_class ELSE v.column5 END, \
                 question = CASE WHEN {going_on} THEN runs.question ELSE v.column6 END, \
                 next_seq = COALESCE(v.column7, runs.next_seq), \
                 lease_owner = CASE WHEN {going_on} THEN runs.lease_owner ELSE NULL END, \
                 lease_until = CASE WHEN {going_on} THEN runs.lease_until ELSE 0 END \
                 FROM (VALUES {values}) AS v WHERE runs.run_id = v.column1 AND runs.lease_token = v.column2 AND runs.status = 'running' \
                 RETURNING runs.run_id, runs.webhook_url"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(at);
            for (run_id, token) in chunk {
                let end = ends.get(run_id).filter(|e| e.token == *token);
                q = q
                    .bind(*run_id)
                    .bind(*token)
                    .bind(end.map(|e| e.end.status.as_str()))
                    .bind(end.map(|e| e.end.result.as_str()))
                    .bind(end.and_then(|e| e.end.reason_class))
                    .bind(end.and_then(|e| e.end.question.as_deref()))
                    .bind(end.and_then(|e| e.end.next_seq));
            }
            for row in q.fetch_all(&mut *tx).await.map_err(failed)? {
                let id: String = row.try_get(0).map_err(failed)?;
                if let Some((run_id, token)) = chunk.iter().find(|(r, _)| *r == id) {
                    holding.insert(run_id);
                    if let (Some(end), Some(url)) = (ends.get(run_id).filter(|e| e.token == *token), row.try_get::<Option<String>, _>(1).map_err(failed)?) {
                        hooks.push((end, url));
                    }
                }
            }
        }
        // The webhook deliveries of the runs that ended (or asked) here, in the same transaction.
        for chunk in hooks.chunks(per_insert) {
            let head = "INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url) VALUES ";
            let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "(?, ?, ?, ?, ?, ?, ?)", chunk.len(), 1, DB::NUMBERED)));
            for (e, url) in chunk {
                q = q
                    .bind(e.run_id)
                    .bind(e.end.status.as_str())
                    .bind(e.end.result.as_str())
                    .bind(e.end.reason_class)
                    .bind(e.end.question.as_deref())
                    .bind(at)
                    .bind(url.as_str());
            }
            q.execute(&mut *tx).await.map_err(failed)?;
        }
        // Each state change's delivery to each A2A push config of its run, in this transaction too.
        let changes = rows.push_changes(&holding);
        for chunk in changes.chunks(per_insert) {
            let values = rows_sql("", "(?, ?, ?, ?, ?)", chunk.len(), 2, DB::NUMBERED);
            let at_mark = if DB::NUMBERED { "$1" } else { "?" };
            let sql = format!(
                "INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url, push_config) \
                 SELECT v.column1, v.column2, v.column3, v.column4, v.column5, {at_mark}, p.url, p.config_id \
                 FROM (VALUES {values}) AS v JOIN a2a_push_configs p ON p.run_id = v.column1 ORDER BY p.created_at, p.config_id"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(at);
            for c in chunk {
                q = q.bind(c.run_id).bind(c.status).bind(c.result).bind(c.reason_class).bind(c.question);
            }
            q.execute(&mut *tx).await.map_err(failed)?;
        }
        let mut fenced: HashSet<String> = rows.leases.iter().filter(|(r, _)| !holding.contains(r)).map(|(r, _)| (*r).to_owned()).collect();
        fenced.extend(refused);
        // Each row carries its writer's token, checked again by the statement that writes it
        // (under the lock the fence took, so it cannot have moved on since).
        let tokens: HashMap<&str, i64> = rows.leases.iter().copied().collect();
        // A scalar subquery, not EXISTS: PostgreSQL may plan a semi-join as a scan of `runs`; this
        // is one primary-key lookup per row on both databases.
        let holds = "v.column2 = (SELECT r.lease_token FROM runs r WHERE r.run_id = v.column1)";
        let events: Vec<_> = rows.events.iter().filter(|e| holding.contains(e.0)).collect();
        for chunk in events.chunks(per_insert) {
            let values = rows_sql("", "(?, ?, ?, ?, ?)", chunk.len(), 1, DB::NUMBERED);
            let sql = format!(
                "INSERT INTO run_events (run_id, seq, kind, body) SELECT v.column1, v.column3, v.column4, v.column5 FROM (VALUES {values}) AS v WHERE {holds}"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (run_id, seq, kind, body) in chunk {
                q = q.bind(*run_id).bind(tokens[run_id]).bind(*seq).bind(*kind).bind(*body);
            }
            q.execute(&mut *tx).await.map_err(failed)?;
        }
        // Content-addressed: a prompt another transaction wrote meanwhile is the same row.
        let prompts = rows.new_prompts(&holding, &self.known);
        for chunk in prompts.chunks(per_insert) {
            let values = rows_sql("", "(?, ?)", chunk.len(), 1, DB::NUMBERED);
            let sql = format!("INSERT INTO run_prompts (digest, body) VALUES {values} ON CONFLICT (digest) DO NOTHING");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for p in chunk {
                q = q.bind(p.digest.as_str()).bind(p.body.as_str());
            }
            q.execute(&mut *tx).await.map_err(failed)?;
        }
        let entries: Vec<_> = rows.entries.iter().filter(|e| holding.contains(e.0)).collect();
        for chunk in entries.chunks(per_insert) {
            // In the order given (the journal's order is its ids'), whatever the plan.
            let values = rows_sql("", "(?, ?, ?, ?, ?)", chunk.len(), 1, DB::NUMBERED);
            let sql = format!(
                "INSERT INTO run_journal (run_id, entry, prompt) SELECT v.column1, v.column3, v.column5 FROM (VALUES {values}) AS v WHERE {holds} ORDER BY v.column4"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (k, (run_id, entry, prompt)) in chunk.iter().enumerate() {
                q = q.bind(*run_id).bind(tokens[run_id]).bind(*entry).bind(k as i64).bind(*prompt);
            }
            q.execute(&mut *tx).await.map_err(failed)?;
        }
        tx.commit().await.map_err(|e| ConnFailure { in_doubt: in_doubt(&e), ..failed(e) })?;
        self.known.add(prompts.iter().map(|p| p.digest.as_str()));
        Ok(fenced)
    }
}

// The same bounds as the inherent impl above: Rust has no alias for a set of higher-ranked
// bounds on other types than `DB`, so each impl spells them out.
impl<DB> WriteRows for PoolWriter<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> usize: ColumnIndex<DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    fn committed<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<Option<HashSet<String>>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await.map_err(db)?;
            self.committed_on(&mut conn, rows).await.map_err(|f| {
                self.forget(&mut conn, &f);
                f.error
            })
        })
    }

    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, WriteFailure>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await.map_err(|e| WriteFailure::before_commit(db(e)))?;
            // The transaction is rolled back when it drops; the connection goes too.
            self.write_on(&mut conn, rows).await.map_err(|f| {
                self.forget(&mut conn, &f);
                WriteFailure { error: f.error, in_doubt: f.in_doubt }
            })
        })
    }
}

/// A transaction's failure on a connection: the error, whether it failed at a COMMIT whose
/// outcome only the database knows, and whether every connection open now is suspect
/// ([`poisons`]).
struct ConnFailure {
    error: StoreError,
    in_doubt: bool,
    poison: bool,
}

/// A statement's failure on the writer's connection.
fn failed(e: sqlx::Error) -> ConnFailure {
    ConnFailure { poison: poisons(&e), error: db(e), in_doubt: false }
}

/// Whether a failed COMMIT may have committed: its connection broke on the way (an answer of
/// the database, such as SQLite's full disk, says for certain that it did not).
fn in_doubt(e: &sqlx::Error) -> bool {
    !matches!(e, sqlx::Error::Database(_))
}
