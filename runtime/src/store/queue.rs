//! The write path every SQL store shares: one writer task that takes what the runs hand it and
//! writes everything waiting in one transaction (group commit: at many concurrent runs one
//! fsync serves many stages), the rows a batch becomes, and how they are written on any sqlx
//! database ([`PoolWriter`]), each run's rows only while it holds its lease (the fence).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};
use tokio::sync::{mpsc, oneshot};

use super::{Lease, StoreError, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, RunStatus};
use crate::failure::BoxFuture;

/// Commits waiting for the writer; more than this waiting means the database cannot keep up.
const WRITE_QUEUE: usize = 4096;

/// Jobs written in one transaction at the most.
const JOBS_PER_TRANSACTION: usize = 256;

/// How long the writer keeps trying a transaction while the database is unreachable (a
/// restart): the runs wait, then go on; past it their writes fail (and, still `running` in the
/// store, they are claimed again once their lease expires).
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(120);

/// What differs between the SQL of the databases a store runs on.
pub(crate) trait Dialect {
    /// Milliseconds since the epoch on the database's clock: leases never compare two
    /// processes' clocks.
    const NOW_MS: &'static str;
    /// Appended to the select of a claim: rows another claimer holds are skipped, not waited
    /// for (empty where a write locks the whole database).
    const SKIP_LOCKED: &'static str;
}

impl Dialect for sqlx::Sqlite {
    const NOW_MS: &'static str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    const SKIP_LOCKED: &'static str = "";
}

impl Dialect for sqlx::Postgres {
    const NOW_MS: &'static str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
}

/// What the writer does: a new run's row (claimed by `owner` for `lease_ms`, or queued), or a
/// claimed run's commit.
pub(crate) enum Write {
    Create { run_id: String, route_id: String, request: String, claim: Option<(String, i64)> },
    Commit { lease: Lease, batch: Box<JournalBatch> },
}

impl Write {
    fn run_id(&self) -> &str {
        match self {
            Write::Create { run_id, .. } => run_id,
            Write::Commit { lease, .. } => &lease.run_id,
        }
    }
}

/// A job, and who waits for it (appends are not waited for).
type Job = (Write, Option<oneshot::Sender<Result<(), StoreError>>>);

/// A run's end as its row takes it.
pub(crate) struct End<'a> {
    pub run_id: &'a str,
    pub token: i64,
    pub status: StoredStatus,
    pub result: String,
    pub reason_class: Option<&'a str>,
    pub question: Option<&'a str>,
    /// One past the last event written, when the batch has events.
    pub next_seq: Option<i64>,
}

/// A new run's row: (run_id, route_id, request, claimed by (owner, lease_ms)).
pub(crate) type Create<'a> = (&'a str, &'a str, &'a str, Option<(&'a str, i64)>);

/// What one transaction writes, table by table, in the order the jobs came.
pub(crate) struct Rows<'a> {
    /// The time the rows are stamped with.
    pub at: String,
    pub creates: Vec<Create<'a>>,
    /// The leases of the runs this transaction commits for: the fence.
    pub leases: Vec<(&'a str, i64)>,
    /// (run_id, seq, kind, body).
    pub events: Vec<(&'a str, i64, &'a str, String)>,
    /// (run_id, entry).
    pub entries: Vec<(&'a str, String)>,
    pub ends: Vec<End<'a>>,
}

impl<'a> Rows<'a> {
    fn of(jobs: &'a [Job]) -> Rows<'a> {
        let mut rows = Rows { at: now(), creates: Vec::new(), leases: Vec::new(), events: Vec::new(), entries: Vec::new(), ends: Vec::new() };
        let mut fenced = HashSet::new();
        for (job, _) in jobs {
            match job {
                Write::Create { run_id, route_id, request, claim } => {
                    rows.creates.push((run_id, route_id, request, claim.as_ref().map(|(o, ms)| (o.as_str(), *ms))))
                }
                Write::Commit { lease, batch } => {
                    let run_id = &lease.run_id;
                    if fenced.insert((run_id.as_str(), lease.token)) {
                        rows.leases.push((run_id.as_str(), lease.token));
                    }
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
                            token: lease.token,
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

/// How one database writes a transaction's rows (all of them, or none): the rows of runs that
/// hold their lease; the ids of those that do not (fenced) are returned.
pub(crate) trait WriteRows: Send + Sync + 'static {
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, StoreError>>;
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
    pub async fn append(&self, lease: &Lease, batch: JournalBatch) -> Result<(), String> {
        if let Some(e) = self.earlier_failure(&lease.run_id) {
            return Err(e);
        }
        let job = Write::Commit { lease: lease.clone(), batch: Box::new(batch) };
        self.writes.send((job, None)).await.map_err(|_| "the store's writer has stopped".to_owned())
    }

    /// [`crate::exec::RunJournal::commit`]: waited for; an earlier queued failure wins.
    pub async fn commit(&self, lease: &Lease, batch: JournalBatch) -> Result<(), String> {
        let earlier = self.earlier_failure(&lease.run_id);
        let result = self.write(Write::Commit { lease: lease.clone(), batch: Box::new(batch) }).await.map_err(|e| e.to_string());
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
        let result = write_retrying(&db, &jobs).await;
        let outcome = |job: &Write| match &result {
            Err(e) => Err(e.clone()),
            Ok(fenced) if fenced.contains(job.run_id()) => Err(StoreError::LeaseLost(job.run_id().to_owned())),
            Ok(_) => Ok(()),
        };
        {
            let mut failed = failed.lock().unwrap_or_else(|p| p.into_inner());
            for (job, _) in &jobs {
                if let Err(e) = outcome(job) {
                    failed.insert(job.run_id().to_owned(), e.to_string());
                }
            }
        }
        for (job, ack) in jobs.drain(..) {
            let done = outcome(&job);
            if let Some(ack) = ack {
                let _ = ack.send(done);
            }
            // A run's last commit settles it: forget an earlier failure.
            if let Write::Commit { lease, batch } = job
                && batch.end.is_some()
            {
                failed.lock().unwrap_or_else(|p| p.into_inner()).remove(&lease.run_id);
            }
        }
    }
}

/// Writes the jobs' rows, trying again while the database is unreachable (at most
/// [`UNAVAILABLE_RETRY`]): a database restart delays the runs, it does not fail them.
async fn write_retrying(db: &impl WriteRows, jobs: &[Job]) -> Result<HashSet<String>, StoreError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        match db.write_rows(&Rows::of(jobs)).await {
            Err(StoreError::Unavailable(e)) if started.elapsed() < UNAVAILABLE_RETRY => {
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "run store unavailable; the writes wait");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
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
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> usize: ColumnIndex<DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    /// The fence first (it locks the rows of the runs committed for, so no claim can come
    /// between the check and the writes), then one multi-row INSERT per table (per `per_insert`
    /// rows) for the runs that hold their lease, and one UPDATE per run that ended.
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, StoreError>> {
        let (pool, per_insert) = (&self.pool, self.per_insert);
        Box::pin(async move {
            let at = rows.at.as_str();
            let mut tx = pool.begin().await.map_err(db)?;
            for chunk in rows.creates.chunks(per_insert) {
                let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at, lease_owner, lease_token, lease_until) VALUES ";
                let row = format!("(?, ?, ?, ?, ?, ?, ?, ?, {} + ?)", DB::NOW_MS);
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, &row, chunk.len())));
                for (run_id, route_id, request, claim) in chunk {
                    let status = if claim.is_some() { "running" } else { "queued" };
                    let (owner, token, ms) = claim.map_or((None, 0, 0), |(o, ms)| (Some(o), 1, ms));
                    q = q.bind(status).bind(*run_id).bind(*route_id).bind(*request).bind(at).bind(at).bind(owner).bind(token).bind(ms);
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            // The fence: the runs still `running` under the token their writer holds.
            let mut holding: HashSet<&str> = HashSet::with_capacity(rows.leases.len());
            for chunk in rows.leases.chunks(per_insert / 2) {
                let mut sql = String::from("UPDATE runs SET updated_at = $1 WHERE status = 'running' AND (");
                for k in 0..chunk.len() {
                    let sep = if k > 0 { " OR " } else { "" };
                    sql.push_str(&format!("{sep}(run_id = ${} AND lease_token = ${})", 2 * k + 2, 2 * k + 3));
                }
                sql.push_str(") RETURNING run_id");
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(at);
                for (run_id, token) in chunk {
                    q = q.bind(*run_id).bind(*token);
                }
                for row in q.fetch_all(&mut *tx).await.map_err(db)? {
                    let id: String = row.try_get(0).map_err(db)?;
                    if let Some((run_id, _)) = chunk.iter().find(|(r, _)| *r == id) {
                        holding.insert(run_id);
                    }
                }
            }
            let fenced: HashSet<String> = rows.leases.iter().filter(|(r, _)| !holding.contains(r)).map(|(r, _)| (*r).to_owned()).collect();
            let events: Vec<_> = rows.events.iter().filter(|e| holding.contains(e.0)).collect();
            for chunk in events.chunks(per_insert) {
                let head = "INSERT INTO run_events (run_id, seq, kind, body) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "(?, ?, ?, ?)", chunk.len())));
                for (run_id, seq, kind, body) in chunk {
                    q = q.bind(*run_id).bind(*seq).bind(*kind).bind(body.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            let entries: Vec<_> = rows.entries.iter().filter(|e| holding.contains(e.0)).collect();
            for chunk in entries.chunks(per_insert) {
                let head = "INSERT INTO run_journal (run_id, entry) VALUES ";
                let mut q = sqlx::query(sqlx::AssertSqlSafe(rows_sql(head, "(?, ?)", chunk.len())));
                for (run_id, entry) in chunk {
                    q = q.bind(*run_id).bind(entry.as_str());
                }
                q.execute(&mut *tx).await.map_err(db)?;
            }
            for end in rows.ends.iter().filter(|e| holding.contains(e.run_id)) {
                // The end lets the lease go (a reply claims the run anew).
                sqlx::query(
                    "UPDATE runs SET status = $1, result = $2, reason_class = $3, question = $4, next_seq = COALESCE($5, next_seq), \
                     updated_at = $6, lease_owner = NULL, lease_until = 0 WHERE run_id = $7 AND lease_token = $8 AND status = 'running'",
                )
                .bind(end.status.as_str())
                .bind(end.result.as_str())
                .bind(end.reason_class)
                .bind(end.question)
                .bind(end.next_seq)
                .bind(at)
                .bind(end.run_id)
                .bind(end.token)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            }
            tx.commit().await.map_err(db)?;
            Ok(fenced)
        })
    }
}

/// `head` followed by `n` copies of `row`, comma-separated, each `?` of which becomes the next
/// placeholder (`$1, $2, …`, numbered across the rows).
pub(crate) fn rows_sql(head: &str, row: &str, n: usize) -> String {
    let mut sql = String::with_capacity(head.len() + n * (row.len() + 16));
    sql.push_str(head);
    let mut k = 0;
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        for c in row.chars() {
            if c == '?' {
                k += 1;
                sql.push('$');
                sql.push_str(&k.to_string());
            } else {
                sql.push(c);
            }
        }
    }
    sql
}

/// A database error as the store reports it: one the database's absence explains (a refused or
/// cut connection, a server shutting down, a busy SQLite file) is [`StoreError::Unavailable`].
pub(crate) fn db(e: sqlx::Error) -> StoreError {
    let transient = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            // PostgreSQL: connection exceptions (08…), operator intervention (57P01-57P03: an
            // admin or crash shutdown, not accepting connections yet); SQLite: busy, locked.
            c.starts_with("08") || c.starts_with("57P") || c == "5" || c == "6" || c == "517"
        }),
        _ => false,
    };
    if transient { StoreError::Unavailable(e.to_string()) } else { StoreError::Database(e.to_string()) }
}

/// The columns [`run_of`] reads.
pub(crate) const RUN_COLUMNS: &str = "run_id, route_id, status, request, result, reason_class, question, next_seq, created_at, updated_at, lease_token";

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
        lease_token: row.try_get::<i64, _>("lease_token").map_err(db)?,
    })
}

#[cfg(test)]
mod tests {
    use super::rows_sql;

    #[test]
    fn rows_sql_numbers_placeholders_across_rows() {
        assert_eq!(rows_sql("INSERT INTO t VALUES ", "(?, ?)", 2), "INSERT INTO t VALUES ($1, $2),($3, $4)");
        assert_eq!(rows_sql("V ", "('x', ?, f() + ?)", 2), "V ('x', $1, f() + $2),('x', $3, f() + $4)");
    }
}
