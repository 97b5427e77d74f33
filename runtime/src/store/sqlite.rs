//! The embedded SQLite run store (sqlx): WAL, a busy timeout, one writer task that commits what
//! arrives together in one transaction (group commit), readers on a small pool.
//!
//! `synchronous=NORMAL` with WAL survives a crash of the process (every commit is in the log)
//! but not of the machine's power; `docs/operations.md` says so.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::{mpsc, oneshot};

use super::{RunFilter, RunStore, StoreError, StoredEvent, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, JournalEntry, RunJournal, RunStatus};
use crate::failure::BoxFuture;

/// The schema versions this binary knows, in order: (version, SQL).
const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("migrations/sqlite/0001_runs.sql"))];

/// Commits waiting for the writer; more than this waiting means the disk cannot keep up.
const WRITE_QUEUE: usize = 4096;

fn db(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

/// What the writer does: a new run's row, or a run's commit.
enum Write {
    Create { run_id: String, route_id: String, request: String },
    Commit { run_id: String, batch: Box<JournalBatch> },
}

/// A job, and who waits for it (appends are not waited for).
type Commit = (Write, Option<oneshot::Sender<Result<(), StoreError>>>);

/// Rows per multi-row INSERT (SQLite allows 32,766 parameters per statement).
const ROWS_PER_INSERT: usize = 500;

#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    writes: mpsc::Sender<Commit>,
    /// Runs one of whose queued writes failed: their next append or commit says so.
    failed: Arc<Mutex<HashMap<String, String>>>,
}

impl SqliteStore {
    /// Opens (creating when missing) and migrates the database at `url` (`sqlite://PATH`).
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Url(format!("`{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // One in-memory database is one connection: a pool of several would see several.
        let max = if url.contains(":memory:") { 1 } else { 4 };
        let pool = SqlitePoolOptions::new().max_connections(max).connect_with(options).await.map_err(db)?;
        migrate(&pool).await?;
        let (writes, queue) = mpsc::channel(WRITE_QUEUE);
        let failed = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(writer(pool.clone(), queue, failed.clone()));
        Ok(SqliteStore { pool, writes, failed })
    }
}

impl SqliteStore {
    /// Hands a job to the writer and waits until its transaction committed.
    async fn write(&self, job: Write) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        let stopped = || StoreError::Database("the store's writer has stopped".into());
        self.writes.send((job, Some(ack))).await.map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }
}

async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS fabric_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)").execute(pool).await.map_err(db)?;
    let found: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM fabric_schema").fetch_one(pool).await.map_err(db)?;
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        let mut tx = pool.begin().await.map_err(db)?;
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
        sqlx::query("INSERT INTO fabric_schema (version, applied_at) VALUES (?, ?)").bind(version).bind(now()).execute(&mut *tx).await.map_err(db)?;
        tx.commit().await.map_err(db)?;
    }
    Ok(())
}

/// Takes commits as they come and writes every one waiting in one transaction: at many
/// concurrent runs one fsync serves many stages.
async fn writer(pool: SqlitePool, mut queue: mpsc::Receiver<Commit>, failed: Arc<Mutex<HashMap<String, String>>>) {
    let mut batch: Vec<Commit> = Vec::new();
    while let Some(first) = queue.recv().await {
        batch.push(first);
        while batch.len() < 256 {
            match queue.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let result = write_all(&pool, &batch).await;
        if let Err(e) = &result {
            let mut failed = failed.lock().unwrap_or_else(|p| p.into_inner());
            for (job, _) in &batch {
                let (Write::Create { run_id, .. } | Write::Commit { run_id, .. }) = job;
                failed.insert(run_id.clone(), e.to_string());
            }
        }
        for (job, ack) in batch.drain(..) {
            if let Some(ack) = ack {
                let _ = ack.send(result.clone());
            }
            // A run's last commit settles it: forget an earlier failure.
            if let Write::Commit { run_id, batch } = job
                && batch.end.is_some()
            {
                failed.lock().unwrap_or_else(|p| p.into_inner()).remove(&run_id);
            }
        }
    }
}

/// Writes every waiting job in one transaction, with as few statements as the rows allow: one
/// multi-row INSERT per table (per 500 rows), one UPDATE per run.
async fn write_all(pool: &SqlitePool, batch: &[Commit]) -> Result<(), StoreError> {
    let at = now();
    let mut tx = pool.begin().await.map_err(db)?;
    let creates: Vec<(&str, &str, &str)> = batch
        .iter()
        .filter_map(|(w, _)| match w {
            Write::Create { run_id, route_id, request } => Some((run_id.as_str(), route_id.as_str(), request.as_str())),
            Write::Commit { .. } => None,
        })
        .collect();
    for chunk in creates.chunks(ROWS_PER_INSERT) {
        let sql = rows_sql("INSERT INTO runs (run_id, route_id, status, request, created_at, updated_at) VALUES ", "(?, ?, 'running', ?, ?, ?)", chunk.len());
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (run_id, route_id, request) in chunk {
            q = q.bind(*run_id).bind(*route_id).bind(*request).bind(&at).bind(&at);
        }
        q.execute(&mut *tx).await.map_err(db)?;
    }
    let commits: Vec<(&str, &JournalBatch)> = batch
        .iter()
        .filter_map(|(w, _)| match w {
            Write::Commit { run_id, batch } => Some((run_id.as_str(), batch.as_ref())),
            Write::Create { .. } => None,
        })
        .collect();
    let mut events = Vec::new();
    for (run_id, b) in &commits {
        for e in &b.events {
            let mut body = Vec::with_capacity(256);
            e.write_json_line(&mut body);
            body.pop();
            events.push((*run_id, e.seq as i64, e.kind.as_str(), String::from_utf8(body).unwrap_or_default()));
        }
    }
    for chunk in events.chunks(ROWS_PER_INSERT) {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql("INSERT INTO run_events (run_id, seq, kind, body) VALUES ", "(?, ?, ?, ?)", chunk.len())));
        for (run_id, seq, kind, body) in chunk {
            q = q.bind(*run_id).bind(*seq).bind(*kind).bind(body.as_str());
        }
        q.execute(&mut *tx).await.map_err(db)?;
    }
    let entries: Vec<(&str, String)> =
        commits.iter().flat_map(|(run_id, b)| b.entries.iter().map(move |e| (*run_id, serde_json::to_string(e).unwrap_or_default()))).collect();
    for chunk in entries.chunks(ROWS_PER_INSERT) {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql("INSERT INTO run_journal (run_id, entry) VALUES ", "(?, ?)", chunk.len())));
        for (run_id, entry) in chunk {
            q = q.bind(*run_id).bind(entry.as_str());
        }
        q.execute(&mut *tx).await.map_err(db)?;
    }
    for (run_id, b) in &commits {
        let next_seq = b.events.last().map(|e| e.seq as i64 + 1);
        // Between stages only the next `seq` changes, and the events' rows already say it.
        if let Some(result) = &b.end {
            let status = match result.status {
                RunStatus::Completed => StoredStatus::Completed,
                RunStatus::Failed => StoredStatus::Failed,
                RunStatus::AwaitingInput => StoredStatus::AwaitingInput,
            };
            let text = serde_json::to_string(result).unwrap_or_default();
            let class = result.error.as_ref().map(|e| e.reason_class.as_str());
            sqlx::query(
                "UPDATE runs SET status = ?, result = ?, reason_class = ?, question = ?, next_seq = COALESCE(?, next_seq), updated_at = ? WHERE run_id = ?",
            )
            .bind(status.as_str())
            .bind(text)
            .bind(class)
            .bind(result.question.as_deref())
            .bind(next_seq)
            .bind(&at)
            .bind(*run_id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
    }
    tx.commit().await.map_err(db)
}

/// `head` followed by `n` copies of `row`, comma-separated.
fn rows_sql(head: &str, row: &str, n: usize) -> String {
    let mut sql = String::with_capacity(head.len() + n * (row.len() + 1));
    sql.push_str(head);
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(row);
    }
    sql
}

impl RunJournal for SqliteStore {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if let Some(e) = self.failed.lock().unwrap_or_else(|p| p.into_inner()).get(run_id) {
                return Err(e.clone());
            }
            let job = Write::Commit { run_id: run_id.to_owned(), batch: Box::new(batch) };
            self.writes.send((job, None)).await.map_err(|_| "the store's writer has stopped".to_owned())
        })
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let earlier = self.failed.lock().unwrap_or_else(|p| p.into_inner()).get(run_id).cloned();
            let result = self.write(Write::Commit { run_id: run_id.to_owned(), batch: Box::new(batch) }).await.map_err(|e| e.to_string());
            match earlier {
                Some(e) => Err(e),
                None => result,
            }
        })
    }
}

fn run_of(row: &sqlx::sqlite::SqliteRow) -> Result<StoredRun, StoreError> {
    let text = |k: &str| -> Result<String, StoreError> { row.try_get::<String, _>(k).map_err(db) };
    let opt = |k: &str| -> Result<Option<String>, StoreError> { row.try_get::<Option<String>, _>(k).map_err(db) };
    let status = text("status")?;
    Ok(StoredRun {
        run_id: text("run_id")?,
        route_id: text("route_id")?,
        status: StoredStatus::parse(&status).ok_or_else(|| StoreError::Database(format!("unknown run status `{status}` in the store")))?,
        request: serde_json::from_str(&text("request")?).unwrap_or(Value::Null),
        result: opt("result")?.and_then(|r| serde_json::from_str(&r).ok()),
        reason_class: opt("reason_class")?,
        question: opt("question")?,
        next_seq: row.try_get::<i64, _>("next_seq").map_err(db)?.max(1) as u64,
        created_at: text("created_at")?,
        updated_at: text("updated_at")?,
    })
}

const RUN_COLUMNS: &str = "run_id, route_id, status, request, result, reason_class, question, next_seq, created_at, updated_at";

impl RunStore for SqliteStore {
    fn create_run<'a>(&'a self, run_id: &'a str, route_id: &'a str, request: &'a Value) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.write(Write::Create { run_id: run_id.to_owned(), route_id: route_id.to_owned(), request: request.to_string() }))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(async move {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?"));
            let row = sqlx::query(sql).bind(run_id).fetch_optional(&self.pool).await.map_err(db)?;
            row.as_ref().map(run_of).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        Box::pin(async move {
            // Run ids are UUIDv7: ordering by id is ordering by start time.
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE (?1 IS NULL OR route_id = ?1) AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR run_id < ?3) ORDER BY run_id DESC LIMIT ?4"
            ));
            let rows = sqlx::query(sql)
                .bind(filter.route_id.as_deref())
                .bind(filter.status.map(StoredStatus::as_str))
                .bind(filter.before.as_deref())
                .bind(i64::from(filter.limit.clamp(1, 1000)))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            rows.iter().map(run_of).collect()
        })
    }

    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT seq, kind, body FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq")
                .bind(run_id)
                .bind(after_seq.min(i64::MAX as u64) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            rows.iter()
                .map(|r| {
                    Ok(StoredEvent {
                        seq: r.try_get::<i64, _>("seq").map_err(db)? as u64,
                        kind: r.try_get("kind").map_err(db)?,
                        body: r.try_get("body").map_err(db)?,
                    })
                })
                .collect()
        })
    }

    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT entry FROM run_journal WHERE run_id = ? ORDER BY id").bind(run_id).fetch_all(&self.pool).await.map_err(db)?;
            rows.iter()
                .map(|r| {
                    let text: String = r.try_get("entry").map_err(db)?;
                    serde_json::from_str(&text).map_err(|e| StoreError::Database(format!("a journal entry of run {run_id} does not read: {e}")))
                })
                .collect()
        })
    }

    fn claim_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query("UPDATE runs SET status = 'running', updated_at = ? WHERE run_id = ? AND status = 'awaiting_input'")
                .bind(now())
                .bind(run_id)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn reopen_reply<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("UPDATE runs SET status = 'awaiting_input', updated_at = ? WHERE run_id = ? AND status = 'running'")
                .bind(now())
                .bind(run_id)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    fn heartbeat<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let at = now();
            for chunk in run_ids.chunks(ROWS_PER_INSERT) {
                let marks = vec!["?"; chunk.len()].join(", ");
                let sql = sqlx::AssertSqlSafe(format!("UPDATE runs SET updated_at = ? WHERE status = 'running' AND run_id IN ({marks})"));
                let mut q = sqlx::query(sql).bind(&at);
                for id in chunk {
                    q = q.bind(id);
                }
                q.execute(&self.pool).await.map_err(db)?;
            }
            Ok(())
        })
    }

    fn fail_orphans<'a>(&'a self, silent_for: std::time::Duration) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let cutoff = crate::events::rfc3339_at(std::time::SystemTime::now() - silent_for);
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND updated_at < ?"));
            let rows = sqlx::query(sql).bind(cutoff).fetch_all(&self.pool).await.map_err(db)?;
            let mut failed = 0;
            for row in &rows {
                let run = run_of(row)?;
                let history = self.journal(&run.run_id).await?;
                let message = "the process executing the run stopped (no heartbeat)";
                let result = crate::exec::result_from_journal(&run.run_id, &run.route_id, &history, crate::failure::ReasonClass::Interrupted, message);
                let mut tx = self.pool.begin().await.map_err(db)?;
                // The events table, not `next_seq`, says what was written: appends and the run row
                // are separate writes, and a process can die between them.
                let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq) + 1, 0) FROM run_events WHERE run_id = ?")
                    .bind(&run.run_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let event = serde_json::json!({"type": "run.failed", "run_id": run.run_id, "route_id": run.route_id, "seq": seq, "ts": now(), "reason_class": "interrupted", "message": message});
                // Only if nobody touched it meanwhile: a live process's heartbeat wins.
                let done = sqlx::query(
                    "UPDATE runs SET status = 'failed', reason_class = 'interrupted', result = ?, next_seq = ?, updated_at = ? WHERE run_id = ? AND status = 'running' AND updated_at = ?",
                )
                .bind(serde_json::to_string(&result).unwrap_or_default())
                .bind(seq + 1)
                .bind(now())
                .bind(&run.run_id)
                .bind(&run.updated_at)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
                if done.rows_affected() == 1 {
                    sqlx::query("INSERT INTO run_events (run_id, seq, kind, body) VALUES (?, ?, 'run.failed', ?)")
                        .bind(&run.run_id)
                        .bind(seq)
                        .bind(event.to_string())
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    failed += 1;
                }
                tx.commit().await.map_err(db)?;
            }
            Ok(failed)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
            Ok(())
        })
    }
}
