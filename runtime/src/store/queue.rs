//! The write path every SQL store shares: one writer task that takes what the runs hand it and
//! writes everything waiting in one transaction (group commit: at many concurrent runs one
//! fsync serves many stages), the rows a batch becomes, and how they are written on any sqlx
//! database ([`PoolWriter`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};
use tokio::sync::{mpsc, oneshot};

use super::{StoreError, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, RunStatus};
use crate::failure::BoxFuture;

/// Commits waiting for the writer; more than this waiting means the database cannot keep up.
const WRITE_QUEUE: usize = 4096;

/// Jobs written in one transaction at the most.
const JOBS_PER_TRANSACTION: usize = 256;

/// What the writer does: a new run's row, or a run's commit.
pub(crate) enum Write {
    Create { run_id: String, route_id: String, request: String },
    Commit { run_id: String, batch: Box<JournalBatch> },
}

impl Write {
    fn run_id(&self) -> &str {
        match self {
            Write::Create { run_id, .. } | Write::Commit { run_id, .. } => run_id,
        }
    }
}

/// A job, and who waits for it (appends are not waited for).
type Job = (Write, Option<oneshot::Sender<Result<(), StoreError>>>);

/// A run's end as its row takes it.
pub(crate) struct End<'a> {
    pub run_id: &'a str,
    pub status: StoredStatus,
    pub result: String,
    pub reason_class: Option<&'a str>,
    pub question: Option<&'a str>,
    /// One past the last event written, when the batch has events.
    pub next_seq: Option<i64>,
}

/// What one transaction writes, table by table, in the order the jobs came.
pub(crate) struct Rows<'a> {
    /// The time the rows are stamped with.
    pub at: String,
    /// (run_id, route_id, request).
    pub creates: Vec<(&'a str, &'a str, &'a str)>,
    /// (run_id, seq, kind, body).
    pub events: Vec<(&'a str, i64, &'a str, String)>,
    /// (run_id, entry).
    pub entries: Vec<(&'a str, String)>,
    pub ends: Vec<End<'a>>,
}

impl<'a> Rows<'a> {
    fn of(jobs: &'a [Job]) -> Rows<'a> {
        let mut rows = Rows { at: now(), creates: Vec::new(), events: Vec::new(), entries: Vec::new(), ends: Vec::new() };
        for (job, _) in jobs {
            match job {
                Write::Create { run_id, route_id, request } => rows.creates.push((run_id, route_id, request)),
                Write::Commit { run_id, batch } => {
                    for e in &batch.events {
                        let mut body = Vec::with_capacity(256);
                        e.write_json_line(&mut body);
                        body.pop();
                        rows.events.push((run_id, e.seq as i64, e.kind.as_str(), String::from_utf8(body).unwrap_or_default()));
                    }
                    rows.entries.extend(batch.entries.iter().map(|e| (run_id.as_str(), serde_json::to_string(e).unwrap_or_default())));
                    // Between stages only the next `seq` changes, and the events' rows already say it.
                    if let Some(result) = &batch.end {
                        rows.ends.push(End {
                            run_id,
                            status: match result.status {
                                RunStatus::Completed => StoredStatus::Completed,
                                RunStatus::Failed => StoredStatus::Failed,
                                RunStatus::AwaitingInput => StoredStatus::AwaitingInput,
                            },
                            result: serde_json::to_string(result).unwrap_or_default(),
                            reason_class: result.error.as_ref().map(|e| e.reason_class.as_str()),
                            question: result.question.as_deref(),
                            next_seq: batch.events.last().map(|e| e.seq as i64 + 1),
                        });
                    }
                }
            }
        }
        rows
    }
}

/// How one database writes a transaction's rows (all of them, or none).
pub(crate) trait WriteRows: Send + Sync + 'static {
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The handle the store keeps: where jobs go, and which runs had a queued write fail.
#[derive(Debug)]
pub(crate) struct WriteQueue {
    writes: mpsc::Sender<Job>,
    /// Runs one of whose queued writes failed: their next append or commit says so.
    failed: Arc<Mutex<HashMap<String, String>>>,
}

impl WriteQueue {
    /// Starts the writer task (on the current tokio runtime).
    pub fn start(db: impl WriteRows) -> WriteQueue {
        let (writes, queue) = mpsc::channel(WRITE_QUEUE);
        let failed = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(writer(db, queue, failed.clone()));
        WriteQueue { writes, failed }
    }

    /// Hands a job to the writer and waits until its transaction committed.
    pub async fn write(&self, job: Write) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        let stopped = || StoreError::Database("the store's writer has stopped".into());
        self.writes.send((job, Some(ack))).await.map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }

    fn earlier_failure(&self, run_id: &str) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).get(run_id).cloned()
    }

    /// [`crate::exec::RunJournal::append`]: queued, not waited for.
    pub async fn append(&self, run_id: &str, batch: JournalBatch) -> Result<(), String> {
        if let Some(e) = self.earlier_failure(run_id) {
            return Err(e);
        }
        let job = Write::Commit { run_id: run_id.to_owned(), batch: Box::new(batch) };
        self.writes.send((job, None)).await.map_err(|_| "the store's writer has stopped".to_owned())
    }

    /// [`crate::exec::RunJournal::commit`]: waited for; an earlier queued failure wins.
    pub async fn commit(&self, run_id: &str, batch: JournalBatch) -> Result<(), String> {
        let earlier = self.earlier_failure(run_id);
        let result = self.write(Write::Commit { run_id: run_id.to_owned(), batch: Box::new(batch) }).await.map_err(|e| e.to_string());
        match earlier {
            Some(e) => Err(e),
            None => result,
        }
    }
}

async fn writer(db: impl WriteRows, mut queue: mpsc::Receiver<Job>, failed: Arc<Mutex<HashMap<String, String>>>) {
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = queue.recv().await {
        jobs.push(first);
        while jobs.len() < JOBS_PER_TRANSACTION {
            match queue.try_recv() {
                Ok(c) => jobs.push(c),
                Err(_) => break,
            }
        }
        let result = db.write_rows(&Rows::of(&jobs)).await;
        if let Err(e) = &result {
            let mut failed = failed.lock().unwrap_or_else(|p| p.into_inner());
            for (job, _) in &jobs {
                failed.insert(job.run_id().to_owned(), e.to_string());
            }
        }
        for (job, ack) in jobs.drain(..) {
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

/// The writer's side of a pool: how many rows one INSERT takes at the most (a database bounds
/// the parameters of a statement).
pub(crate) struct PoolWriter<DB: sqlx::Database> {
    pub pool: sqlx::Pool<DB>,
    pub per_insert: usize,
}

impl<DB> WriteRows for PoolWriter<DB>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    /// One multi-row INSERT per table (per `per_insert` rows), one UPDATE per run that ended.
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let (pool, per_insert) = (&self.pool, self.per_insert);
        Box::pin(async move {
            let at = rows.at.as_str();
            let mut tx = pool.begin().await.map_err(db)?;
            for chunk in rows.creates.chunks(per_insert) {
                let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "'running'", 5, chunk.len())));
                for (run_id, route_id, request) in chunk {
                    q = q.bind(*run_id).bind(*route_id).bind(*request).bind(at).bind(at);
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for chunk in rows.events.chunks(per_insert) {
                let head = "INSERT INTO run_events (run_id, seq, kind, body) VALUES ";
                // A run failed as an orphan while its process was alive after all (a stall past the
                // lease) holds a `run.failed` at a seq this process writes too: that row is skipped,
                // not a failure of every run sharing this transaction.
                let sql = rows_sql(head, "", 4, chunk.len()) + " ON CONFLICT (run_id, seq) DO NOTHING";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (run_id, seq, kind, body) in chunk {
                    q = q.bind(*run_id).bind(*seq).bind(*kind).bind(body.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for chunk in rows.entries.chunks(per_insert) {
                let head = "INSERT INTO run_journal (run_id, entry) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "", 2, chunk.len())));
                for (run_id, entry) in chunk {
                    q = q.bind(*run_id).bind(entry.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for end in &rows.ends {
                // Guarded by `running`: the end of a run failed meanwhile as an orphan does not revive it.
                sqlx::query(
                    "UPDATE runs SET status = $1, result = $2, reason_class = $3, question = $4, next_seq = COALESCE($5, next_seq), \
                     updated_at = $6 WHERE run_id = $7 AND status = 'running'",
                )
                .bind(end.status.as_str())
                .bind(end.result.as_str())
                .bind(end.reason_class)
                .bind(end.question)
                .bind(end.next_seq)
                .bind(at)
                .bind(end.run_id)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            tx.commit().await.map_err(db)
        })
    }
}

/// `head` followed by `n` rows of `width` placeholders each (`$1, $2, …`, numbered across the
/// rows), comma-separated; a literal such as `'running'` can lead each row via `lead`.
pub(crate) fn rows_sql(head: &str, lead: &str, width: usize, n: usize) -> String {
    let mut sql = String::with_capacity(head.len() + n * (lead.len() + width * 5 + 3));
    sql.push_str(head);
    let mut k = 0;
    for i in 0..n {
        sql.push_str(if i > 0 { ",(" } else { "(" });
        sql.push_str(lead);
        for j in 0..width {
            if j > 0 || !lead.is_empty() {
                sql.push_str(", ");
            }
            k += 1;
            sql.push('$');
            sql.push_str(&k.to_string());
        }
        sql.push(')');
    }
    sql
}

pub(crate) fn db(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

/// The columns [`run_of`] reads.
pub(crate) const RUN_COLUMNS: &str = "run_id, route_id, status, request, result, reason_class, question, next_seq, created_at, updated_at";

/// A `runs` row (as selected with [`RUN_COLUMNS`]), on any database whose text and integers
/// decode as `String` and `i64`.
pub(crate) fn run_of<R>(row: &R) -> Result<StoredRun, StoreError>
where
    R: Row,
    for<'r> &'r str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
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

#[cfg(test)]
mod tests {
    use super::rows_sql;

    #[test]
    fn rows_sql_numbers_placeholders_across_rows() {
        assert_eq!(rows_sql("INSERT INTO t VALUES ", "", 2, 2), "INSERT INTO t VALUES ($1, $2),($3, $4)");
        assert_eq!(rows_sql("V ", "'x'", 2, 2), "V ('x', $1, $2),('x', $3, $4)");
    }
}
