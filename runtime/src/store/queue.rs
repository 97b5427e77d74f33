//! The write path every SQL store shares: one writer task that takes what the runs hand it and
//! writes everything waiting in one transaction (group commit: at many concurrent runs one
//! fsync serves many stages), the rows a batch becomes, and how they are written on any sqlx
//! database ([`PoolWriter`]), each run's rows only while it holds its lease (the fence).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{ColumnIndex, Decode, Row, Type};
use tokio::sync::{mpsc, oneshot};

use super::health::Health;
use super::prompts::{self, Known, Prompt, StoredEntry};
use super::{Lease, StoreError, StoredRun, StoredStatus, now};
use crate::exec::{JournalBatch, RunStatus};
use crate::failure::BoxFuture;

/// What a write is told once the writer task is gone (the runtime shutting down).
const WRITER_STOPPED: &str = "the store's writer has stopped";

/// Commits waiting for the writer; more than this waiting means the database cannot keep up.
const WRITE_QUEUE: usize = 4096;

/// Jobs written in one transaction at the most.
const JOBS_PER_TRANSACTION: usize = 256;

/// The pauses between two tries of a transaction while the database cannot write.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(50);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// What differs between the SQL of the databases a store runs on.
pub(crate) trait Dialect {
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

/// What the writer does: a new run's row (claimed by `owner` for `lease_ms`, or queued), or a
/// claimed run's commit.
pub(crate) enum Write {
    /// With a `key` (an idempotency key), the row is written only when no run has that key.
    Create {
        run_id: String,
        route_id: String,
        request: String,
        claim: Option<(String, i64)>,
        key: Option<String>,
        /// Where the run's ends are posted (`runs.webhook_url`).
        webhook: Option<String>,
        session: Option<String>,
    },
    Commit {
        lease: Lease,
        batch: Box<Prepared>,
    },
}

/// A batch as rows: serialized by the run that hands it over (on its own thread), so the
/// writer, which every run shares, only writes.
pub(crate) struct Prepared {
    /// (seq, kind, body).
    events: Vec<(i64, &'static str, String)>,
    entries: Vec<StoredEntry>,
    end: Option<PreparedEnd>,
}

pub(crate) struct PreparedEnd {
    pub status: StoredStatus,
    pub result: String,
    pub reason_class: Option<&'static str>,
    pub question: Option<String>,
    /// One past the last event written, when the batch has events.
    pub next_seq: Option<i64>,
}

impl Prepared {
    fn of(batch: JournalBatch) -> Prepared {
        let events = batch
            .events
            .iter()
            .map(|e| {
                let mut body = Vec::with_capacity(256);
                e.write_json_line(&mut body);
                body.pop();
                (e.seq as i64, e.kind.as_str(), String::from_utf8(body).unwrap_or_default())
            })
            .collect();
        // A model reply's system prompt goes to its own row, once per prompt (`super::prompts`).
        let entries = batch.entries.iter().map(prompts::split).collect();
        // Between stages only the next `seq` changes, and the events' rows already say it.
        let end = batch.end.as_ref().map(|result| PreparedEnd {
            status: match result.status() {
                RunStatus::Completed => StoredStatus::Completed,
                RunStatus::Failed => StoredStatus::Failed,
                RunStatus::AwaitingInput => StoredStatus::AwaitingInput,
                RunStatus::Cancelled => StoredStatus::Cancelled,
            },
            result: serde_json::to_string(result).unwrap_or_default(),
            reason_class: result.error().map(|e| e.reason_class.as_str()),
            // A copy for people reading the table (the result holds the question exactly, JSON
            // escaped): PostgreSQL's text cannot hold NUL, so it is shown as U+FFFD there.
            question: result.question().map(|q| q.replace('\0', "\u{FFFD}")),
            next_seq: batch.events.last().map(|e| e.seq as i64 + 1),
        });
        Prepared { events, entries, end }
    }
}

impl Write {
    /// A new run's row, claimed by `holder` or queued, with its idempotency key.
    pub(crate) fn create(run: &super::NewRun<'_>, holder: Option<&super::Holder>, key: Option<&super::IdempotencyKey>) -> Write {
        Write::Create {
            run_id: run.run_id.to_owned(),
            route_id: run.route_id.to_owned(),
            request: run.request_json(),
            claim: holder.map(|h| (h.owner.clone(), h.lease_ms())),
            key: key.map(|k| k.as_str().to_owned()),
            webhook: run.webhook.map(str::to_owned),
            session: run.session_id.map(str::to_owned),
        }
    }

    fn run_id(&self) -> &str {
        match self {
            Write::Create { run_id, .. } => run_id,
            Write::Commit { lease, .. } => &lease.run_id,
        }
    }
}

/// A job, and who waits for it (appends are not waited for).
type Job = (Write, Option<oneshot::Sender<Result<(), StoreError>>>);

/// A run's end as its row takes it: the prepared end, with the lease that writes it.
pub(crate) struct End<'a> {
    pub run_id: &'a str,
    pub token: i64,
    pub end: &'a PreparedEnd,
}

/// A new run's row.
pub(crate) struct Create<'a> {
    pub run_id: &'a str,
    pub route_id: &'a str,
    pub request: &'a str,
    /// Claimed by (owner, lease_ms), or queued.
    pub claim: Option<(&'a str, i64)>,
    pub key: Option<&'a str>,
    pub webhook: Option<&'a str>,
    pub session: Option<&'a str>,
}

/// What one transaction writes, table by table, in the order the jobs came.
pub(crate) struct Rows<'a> {
    /// The time the rows are stamped with.
    pub at: String,
    pub creates: Vec<Create<'a>>,
    /// The leases of the runs this transaction commits for: the fence.
    pub leases: Vec<(&'a str, i64)>,
    /// (run_id, seq, kind, body).
    pub events: Vec<(&'a str, i64, &'a str, &'a str)>,
    /// (run_id, entry, the digest of the prompt it names).
    pub entries: Vec<(&'a str, &'a str, Option<&'a str>)>,
    /// (run_id, prompt): the prompts the entries name, for the runs that hold their lease, in
    /// the order of their digests (PostgreSQL writers inserting the same new keys in one order
    /// never wait for each other in a cycle).
    pub prompts: Vec<(&'a str, &'a Prompt)>,
    pub ends: Vec<End<'a>>,
}

impl<'a> Rows<'a> {
    fn of(jobs: &'a [Job]) -> Rows<'a> {
        let mut rows =
            Rows { at: now(), creates: Vec::new(), leases: Vec::new(), events: Vec::new(), entries: Vec::new(), prompts: Vec::new(), ends: Vec::new() };
        let mut seen = HashSet::new();
        for (job, _) in jobs {
            match job {
                Write::Create { run_id, route_id, request, claim, key, webhook, session } => rows.creates.push(Create {
                    run_id,
                    route_id,
                    request,
                    claim: claim.as_ref().map(|(o, ms)| (o.as_str(), *ms)),
                    key: key.as_deref(),
                    webhook: webhook.as_deref(),
                    session: session.as_deref(),
                }),
                Write::Commit { lease, batch } => {
                    let run_id = &lease.run_id;
                    if seen.insert((run_id.as_str(), lease.token)) {
                        rows.leases.push((run_id.as_str(), lease.token));
                    }
                    rows.events.extend(batch.events.iter().map(|(seq, kind, body)| (run_id.as_str(), *seq, *kind, body.as_str())));
                    for e in &batch.entries {
                        rows.entries.push((run_id.as_str(), e.json.as_str(), e.prompt.as_ref().map(|p| p.digest.as_str())));
                        if let Some(p) = &e.prompt {
                            rows.prompts.push((run_id.as_str(), p));
                        }
                    }
                    if let Some(end) = &batch.end {
                        rows.ends.push(End { run_id, token: lease.token, end });
                    }
                }
            }
        }
        rows.prompts.sort_unstable_by(|a, b| a.1.digest.cmp(&b.1.digest));
        rows
    }

    /// The prompts to write for the runs in `holding`, each once, leaving out those `known`.
    pub fn new_prompts(&self, holding: &HashSet<&str>, known: &Known) -> Vec<&'a Prompt> {
        let mut new: Vec<&Prompt> = self.prompts.iter().filter(|(run, p)| holding.contains(run) && !known.has(&p.digest)).map(|(_, p)| *p).collect();
        // Sorted already: equal ones are neighbours.
        new.dedup_by(|a, b| a.digest == b.digest);
        new
    }
}

/// How one database writes a transaction's rows (all of them, or none): the rows of runs that
/// hold their lease; the ids of those that do not (fenced) are returned, and so are those of
/// new runs whose idempotency key another run has (not written either).
pub(crate) trait WriteRows: Send + Sync + 'static {
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, WriteFailure>>;
    /// Whether the transaction of `rows` committed after all (its connection broke before it
    /// heard), and then which of its runs are fenced now: the rows of a run still holding its
    /// lease were written by this writer alone, so the first of them says.
    fn committed<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<Option<HashSet<String>>, StoreError>>;
}

/// A transaction that failed, and whether it may have committed all the same (its connection
/// broke while the COMMIT was on its way: only the database knows now).
#[derive(Debug)]
pub(crate) struct WriteFailure {
    pub error: StoreError,
    pub in_doubt: bool,
}

impl WriteFailure {
    fn before_commit(error: StoreError) -> WriteFailure {
        WriteFailure { error, in_doubt: false }
    }
}

/// The handle the store keeps: where jobs go, and which runs had a queued write fail.
#[derive(Debug)]
pub(crate) struct WriteQueue {
    /// One queue per writer task; a run's jobs always go to the same one (so they stay in
    /// order), and the writers write in parallel where the database can (PostgreSQL).
    writes: Vec<mpsc::Sender<Job>>,
    /// Leases (run, token) one of whose queued writes failed: their next append or commit says so.
    failed: Failed,
}

/// The failure of each lease's earlier write, kept as the store's error so that a later append
/// or commit answers with the same variant (a lost lease stays `LeaseLost`).
type Failed = Arc<Mutex<HashMap<(String, i64), StoreError>>>;

/// The failure recorded for an earlier batch of `lease`, if any. A run's end is its last write
/// here, so asking for the end's (`last`) forgets the failure.
fn earlier_failure(failed: &Failed, lease: &Lease, last: bool) -> Option<StoreError> {
    let mut failed = failed.lock().unwrap_or_else(|p| p.into_inner());
    let key = (lease.run_id.clone(), lease.token);
    if last { failed.remove(&key) } else { failed.get(&key).cloned() }
}

/// A job's outcome, told to whoever waits for it; a failed batch that is not the run's end is
/// recorded, so that nothing of the run is written after it.
fn settle(failed: &Failed, job: &Write, ack: Option<oneshot::Sender<Result<(), StoreError>>>, done: Result<(), StoreError>) {
    if let (Err(e), Write::Commit { lease, batch }) = (&done, job)
        && batch.end.is_none()
    {
        failed.lock().unwrap_or_else(|p| p.into_inner()).insert((lease.run_id.clone(), lease.token), e.clone());
    }
    if let Some(ack) = ack {
        let _ = ack.send(done);
    }
}

/// A new run refused while the store cannot write: the client is told `Unavailable` (503) and
/// nothing of it is written, neither now nor later.
fn refuse_start(failed: &Failed, job: &Write, ack: Option<oneshot::Sender<Result<(), StoreError>>>, error: &str) {
    settle(failed, job, ack, Err(StoreError::Unavailable(format!("the new run could not be recorded: {error}"))));
}

/// The failure of an earlier batch of the run a job writes for (a create has none).
fn failure_before(failed: &Failed, job: &Write) -> Option<StoreError> {
    match job {
        Write::Commit { lease, batch } => earlier_failure(failed, lease, batch.end.is_some()),
        Write::Create { .. } => None,
    }
}

impl WriteQueue {
    /// Starts `writers` writer tasks (on the current tokio runtime), each with its own
    /// connection from the pool at a time.
    pub fn start<W: WriteRows + Clone>(db: W, writers: usize, health: Arc<Health>) -> WriteQueue {
        let failed = Arc::new(Mutex::new(HashMap::new()));
        let writes = (0..writers.max(1))
            .map(|_| {
                let (writes, queue) = mpsc::channel(WRITE_QUEUE);
                tokio::spawn(writer(db.clone(), queue, failed.clone(), health.clone()));
                writes
            })
            .collect();
        WriteQueue { writes, failed }
    }

    /// One writer task on a thread of its own (a runtime of its own on it), for a database
    /// whose writes block ([`super::sqlite_writer`]): a transaction never holds up the tasks of
    /// the runs. The thread ends when the store is dropped (every sender gone).
    pub fn start_on_thread<W: WriteRows>(db: W, health: Arc<Health>) -> Result<WriteQueue, StoreError> {
        let failed: Failed = Arc::new(Mutex::new(HashMap::new()));
        let (writes, queue) = mpsc::channel(WRITE_QUEUE);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| StoreError::Database(format!("cannot start the store's writer: {e}")))?;
        let shared = failed.clone();
        std::thread::Builder::new()
            .name("fabric-store-writer".into())
            .spawn(move || runtime.block_on(writer(db, queue, shared, health)))
            .map_err(|e| StoreError::Database(format!("cannot start the store's writer: {e}")))?;
        Ok(WriteQueue { writes: vec![writes], failed })
    }

    fn writer_of(&self, run_id: &str) -> &mpsc::Sender<Job> {
        // FNV-1a: stable and cheap; any spread will do.
        let hash = run_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        &self.writes[(hash % self.writes.len() as u64) as usize]
    }

    /// Hands a job to the writer and waits until its transaction committed.
    pub async fn write(&self, job: Write) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        let stopped = || StoreError::Database(WRITER_STOPPED.into());
        self.writer_of(job.run_id()).send((job, Some(ack))).await.map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }

    /// [`crate::exec::RunJournal::append`]: queued, not waited for.
    pub async fn append(&self, lease: &Lease, batch: JournalBatch) -> Result<(), StoreError> {
        if let Some(e) = earlier_failure(&self.failed, lease, false) {
            return Err(e);
        }
        let job = Write::Commit { lease: lease.clone(), batch: Box::new(Prepared::of(batch)) };
        self.writer_of(&lease.run_id).send((job, None)).await.map_err(|_| StoreError::Database(WRITER_STOPPED.into()))
    }

    /// [`crate::exec::RunJournal::commit`]: waited for. After an earlier queued failure nothing
    /// is written (an end after a hole would record less than the run did): the error is
    /// returned, the run stays `running`, and whoever claims it next goes on from its journal.
    pub async fn commit(&self, lease: &Lease, batch: JournalBatch) -> Result<(), StoreError> {
        if let Some(e) = earlier_failure(&self.failed, lease, true) {
            return Err(e);
        }
        self.write(Write::Commit { lease: lease.clone(), batch: Box::new(Prepared::of(batch)) }).await
    }
}

/// The writer's inbox: the queue, and the commits that came in while a transaction was being
/// tried again (held, in order, for the next one).
struct Inbox {
    queue: mpsc::Receiver<Job>,
    held: std::collections::VecDeque<Job>,
}

impl Inbox {
    /// The next job: a held one first, else one from the queue (`None` once every sender is gone).
    async fn next(&mut self) -> Option<Job> {
        match self.held.pop_front() {
            Some(job) => Some(job),
            None => self.queue.recv().await,
        }
    }

    fn try_next(&mut self) -> Option<Job> {
        self.held.pop_front().or_else(|| self.queue.try_recv().ok())
    }

    /// Waits `pause` while the database cannot write, answering what comes in meanwhile: a new
    /// run is refused at once (it must not wait behind writes that may not succeed for minutes,
    /// and must never be acknowledged late), a commit is held for the next transaction. Another
    /// writer's success (PostgreSQL has several) ends the wait at once: the database is back,
    /// and what came in meanwhile is held instead, to be written next.
    async fn wait_out(&mut self, pause: Duration, health: &Health, failed: &Failed, error: &str) {
        let until = tokio::time::Instant::now() + pause;
        while tokio::time::Instant::now() < until && health.failing() {
            let tick = (until - tokio::time::Instant::now()).min(Duration::from_millis(50));
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                job = self.queue.recv() => match job {
                    Some((job @ Write::Create { .. }, ack)) if health.failing() => refuse_start(failed, &job, ack, error),
                    Some(job) => self.held.push_back(job),
                    None => return,
                },
            }
        }
    }
}

async fn writer(db: impl WriteRows, queue: mpsc::Receiver<Job>, failed: Failed, health: Arc<Health>) {
    let mut inbox = Inbox { queue, held: std::collections::VecDeque::new() };
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = inbox.next().await {
        // The lease token each run's batches in this transaction carry.
        let mut holders: HashMap<String, i64> = HashMap::new();
        holds_as(&mut holders, &first.0);
        jobs.push(first);
        while jobs.len() < JOBS_PER_TRANSACTION {
            match inbox.try_next() {
                // Two holders of one run (a segment that lost its lease, and the one that took
                // the run over) never share a transaction: the fence and the rows' token checks
                // are per run, so the stale one would pass as holding. It waits for the next.
                Some(c) if !holds_as(&mut holders, &c.0) => {
                    inbox.held.push_front(c);
                    break;
                }
                Some(c) => jobs.push(c),
                None => break,
            }
        }
        // A batch of a run one of whose earlier batches failed is not written, even if it was
        // queued before that failure was known (a run does not wait for its appends): a later
        // stage after a hole, or an end, would record less than the run did.
        let mut kept = Vec::with_capacity(jobs.len());
        for (job, ack) in jobs.drain(..) {
            match failure_before(&failed, &job) {
                Some(e) => settle(&failed, &job, ack, Err(e)),
                None => kept.push((job, ack)),
            }
        }
        jobs = kept;
        if jobs.is_empty() {
            continue;
        }
        match write_retrying(&db, &health, &failed, &mut inbox, &mut jobs).await {
            Ok(fenced) => {
                for (job, ack) in jobs.drain(..) {
                    let done = outcome(&job, &fenced);
                    settle(&failed, &job, ack, done);
                }
            }
            // One job the database refuses must not fail the others sharing its transaction:
            // each is tried on its own, in order, and a run whose batch failed here writes
            // nothing after it (its later batches wait behind it in this same group).
            Err(StoreError::Database(_)) if jobs.len() > 1 => {
                for job in std::mem::take(&mut jobs) {
                    let mut one = vec![job];
                    let done = match failure_before(&failed, &one[0].0) {
                        Some(e) => Err(e),
                        None => write_retrying(&db, &health, &failed, &mut inbox, &mut one).await,
                    };
                    // Gone when it was a start refused while the store could not write (and
                    // answered then).
                    if let Some((job, ack)) = one.pop() {
                        let done = done.and_then(|fenced| outcome(&job, &fenced));
                        settle(&failed, &job, ack, done);
                    }
                }
            }
            Err(e) => {
                for (job, ack) in jobs.drain(..) {
                    settle(&failed, &job, ack, Err(e.clone()));
                }
            }
        }
    }
}

/// Notes `job`'s lease in `holders` (run → token of the transaction's batches); false, noting
/// nothing, when the transaction holds a batch of that run under another token. A map, not a
/// scan of the jobs: a transaction takes up to 256 of them.
fn holds_as(holders: &mut HashMap<String, i64>, job: &Write) -> bool {
    let Write::Commit { lease, .. } = job else { return true };
    match holders.get(&lease.run_id) {
        Some(token) => *token == lease.token,
        None => {
            holders.insert(lease.run_id.clone(), lease.token);
            true
        }
    }
}

/// A refused job: a commit whose lease was lost, or a new run whose idempotency key is taken.
fn outcome(job: &Write, fenced: &HashSet<String>) -> Result<(), StoreError> {
    match job {
        _ if !fenced.contains(job.run_id()) => Ok(()),
        Write::Create { .. } => Err(StoreError::KeyTaken),
        Write::Commit { .. } => Err(StoreError::LeaseLost(job.run_id().to_owned())),
    }
}

/// Writes the jobs' rows, trying again for as long as the database cannot write for a reason
/// that may pass (full, read-only, locked, away): the runs wait, they do not fail, and the
/// store's health says so meanwhile. New runs (creates) are not kept waiting: once a try is
/// known not to have committed, they are refused (`Unavailable`: the client is told 503 and
/// retries) and taken out of `jobs`, and so are those that come in meanwhile ([`Inbox::wait_out`]). A transaction whose connection broke while it committed may
/// have committed: that is looked up before it is written again, so nothing is written twice.
async fn write_retrying(db: &impl WriteRows, health: &Health, failed: &Failed, inbox: &mut Inbox, jobs: &mut Vec<Job>) -> Result<HashSet<String>, StoreError> {
    // From 50 ms, doubling to 2 s, jittered (replicas retrying together spread out), for as long
    // as the error may pass.
    let mut pauses = backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default().with_min_delay(RETRY_PAUSE_MIN).with_max_delay(RETRY_PAUSE_MAX).without_max_times().with_jitter(),
    );
    let mut in_doubt = false;
    // While this lasts, only this writer's own success says that writes work again.
    let _retrying = health.retrying();
    loop {
        if jobs.is_empty() {
            return Ok(HashSet::new());
        }
        let began = std::time::Instant::now();
        let rows = Rows::of(jobs);
        let tried = if in_doubt {
            match db.committed(&rows).await {
                Ok(Some(fenced)) => Ok(fenced),
                Ok(None) => db.write_rows(&rows).await,
                Err(error) => Err(WriteFailure { error, in_doubt: true }),
            }
        } else {
            db.write_rows(&rows).await
        };
        drop(rows);
        match tried {
            Ok(fenced) => {
                health.write_succeeded();
                return Ok(fenced);
            }
            Err(WriteFailure { error: StoreError::Unavailable(e), in_doubt: doubt }) => {
                health.write_failed(began, &e);
                in_doubt = doubt;
                if !in_doubt {
                    for (job, ack) in std::mem::take(jobs) {
                        match job {
                            Write::Create { .. } => refuse_start(failed, &job, ack, &e),
                            commit => jobs.push((commit, ack)),
                        }
                    }
                }
                let pause = Iterator::next(&mut pauses).unwrap_or(RETRY_PAUSE_MAX);
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "run store unavailable; the writes wait");
                inbox.wait_out(pause, health, failed, &e).await;
            }
            Err(WriteFailure { error, .. }) => return Err(error),
        }
    }
}

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
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
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
            let head = "INSERT INTO runs (status, run_id, route_id, request, created_at, updated_at, lease_owner, lease_token, idempotency_key, webhook_url, session_id, lease_until) VALUES ";
            let row = format!("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {} + ?)", DB::NOW_MS);
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
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
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
fn poisons(e: &sqlx::Error) -> bool {
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

/// The columns [`run_of`] reads.
pub(crate) const RUN_COLUMNS: &str =
    "run_id, route_id, status, request, result, reason_class, question, next_seq, created_at, updated_at, lease_token, cancel_reason";

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
    let run_id = text("run_id")?;
    // Each column is read into its type once, here; one that does not read names the run.
    let bad = |what: &str, e: &dyn std::fmt::Display| StoreError::Database(format!("run {run_id}: its stored {what} does not read: {e}"));
    let status = text("status")?;
    let status = StoredStatus::parse(&status).ok_or_else(|| bad("status", &format_args!("`{status}` is no run status")))?;
    let request = serde_json::from_str(&text("request")?).map_err(|e| bad("start contract", &e))?;
    let result: Option<crate::exec::RunResult> = opt("result")?.map(|r| serde_json::from_str(&r)).transpose().map_err(|e| bad("result", &e))?;
    let reason_class = opt("reason_class")?
        .map(|c| crate::failure::ReasonClass::parse(&c).ok_or_else(|| bad("reason class", &format_args!("`{c}` is no reason class"))))
        .transpose()?;
    Ok(StoredRun {
        route_id: text("route_id")?,
        status,
        request,
        reason_class,
        // The result holds the question exactly (the column, a copy, cannot hold a NUL).
        question: result.as_ref().and_then(|r| r.question()).map(str::to_owned).or(opt("question")?),
        result,
        run_id,
        next_seq: row.try_get::<i64, _>("next_seq").map_err(db)?.max(1) as u64,
        created_at: text("created_at")?,
        updated_at: text("updated_at")?,
        lease_token: row.try_get::<i64, _>("lease_token").map_err(db)?,
        cancel_reason: opt("cancel_reason")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database that keeps the (run, seq) of every event it committed, and misbehaves on cue.
    #[derive(Default)]
    struct Flaky {
        committed: Mutex<Vec<(String, i64)>>,
        /// Commit the first transaction, then report its connection broken.
        lose_first_ack: std::sync::atomic::AtomicBool,
        /// Refuse any transaction holding this run's rows.
        poison: Option<&'static str>,
        /// Every transaction fails as a full disk does (not committed) while this is set.
        full: std::sync::atomic::AtomicBool,
        /// A transaction with a new run's row (and no poisoned rows) fails as a database that
        /// went away does, before its COMMIT.
        creates_away: bool,
    }

    impl WriteRows for Arc<Flaky> {
        fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, WriteFailure>> {
            Box::pin(async move {
                if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(WriteFailure::before_commit(StoreError::Unavailable("database or disk is full (13)".into())));
                }
                // Only the poisoned run's first batch: a later one would be written.
                if let Some(p) = self.poison
                    && rows.events.iter().any(|e| e.0 == p && e.1 == 1)
                {
                    return Err(WriteFailure::before_commit(StoreError::Database("refused".into())));
                }
                if self.creates_away && !rows.creates.is_empty() {
                    return Err(WriteFailure::before_commit(StoreError::Unavailable("connection refused".into())));
                }
                self.committed.lock().unwrap().extend(rows.events.iter().map(|e| (e.0.to_owned(), e.1)));
                if self.lose_first_ack.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Err(WriteFailure { error: StoreError::Unavailable("connection reset while committing".into()), in_doubt: true });
                }
                Ok(HashSet::new())
            })
        }

        fn committed<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<Option<HashSet<String>>, StoreError>> {
            Box::pin(async move {
                let first = rows.events.first().map(|e| (e.0.to_owned(), e.1));
                Ok(first.filter(|f| self.committed.lock().unwrap().contains(f)).map(|_| HashSet::new()))
            })
        }
    }

    fn batch(run: &str, seq: u64) -> JournalBatch {
        let event = crate::events::Event {
            kind: crate::events::EventKind::RunResumed,
            run_id: run.into(),
            route_id: "r".into(),
            seq,
            ts: String::new(),
            stage_id: None,
            parent_run_id: None,
            data: crate::events::EventData::RunResumed { reply: String::new() },
        };
        JournalBatch { events: vec![event], entries: Vec::new(), end: None }
    }

    fn lease(run: &str) -> Lease {
        Lease { run_id: run.into(), token: 1 }
    }

    #[test]
    fn a_database_that_is_away_is_unavailable_and_a_refusal_is_not() {
        assert!(matches!(db(sqlx::Error::PoolTimedOut), StoreError::Unavailable(_)));
        assert!(matches!(db(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))), StoreError::Unavailable(_)));
        assert!(matches!(db(sqlx::Error::RowNotFound), StoreError::Database(_)));
    }

    /// Whether a transaction committed, asked of a real database: by its first row, and which
    /// of its runs are fenced now.
    #[tokio::test]
    async fn a_real_database_says_whether_a_transaction_committed() {
        let store = super::super::sqlite::SqliteStore::open("sqlite::memory:").await.unwrap();
        let writer = PoolWriter { pool: store.pool().clone(), per_insert: 100, health: Arc::new(Health::new(false)), known: Default::default() };
        let holder = super::super::Holder::new(Duration::from_secs(30));
        let create = |run: &str| Write::Create {
            run_id: run.into(),
            route_id: "r".into(),
            request: "{}".into(),
            claim: Some((holder.owner.clone(), 30_000)),
            key: None,
            webhook: None,
            session: None,
        };
        let commit = |run: &str, seq| Write::Commit { lease: lease(run), batch: Box::new(Prepared::of(batch(run, seq))) };
        let jobs: Vec<Job> = vec![(create("a"), None), (create("b"), None), (commit("a", 1), None), (commit("b", 1), None)];
        let never: Vec<Job> = vec![(commit("a", 2), None)];
        assert_eq!(writer.committed(&Rows::of(&jobs)).await.unwrap(), None, "not written yet");
        assert_eq!(writer.write_rows(&Rows::of(&jobs)).await.unwrap(), HashSet::new());
        assert_eq!(writer.committed(&Rows::of(&jobs)).await.unwrap(), Some(HashSet::new()), "written, nobody fenced");
        assert_eq!(writer.committed(&Rows::of(&never)).await.unwrap(), None, "a transaction that did not commit");
        // `b` is let go (its token moves on): a transaction of it is fenced, whatever it did.
        let b_lease = lease("b");
        store_release(&store, &b_lease).await;
        let fenced = writer.committed(&Rows::of(&jobs)).await.unwrap().unwrap();
        assert_eq!(fenced, HashSet::from(["b".to_owned()]));
        let only_b: Vec<Job> = vec![(commit("b", 2), None)];
        assert_eq!(writer.committed(&Rows::of(&only_b)).await.unwrap(), Some(HashSet::from(["b".to_owned()])), "fenced: nothing to write either way");
    }

    /// A segment that lost its lease and the segment that took the run over (in the same
    /// process: a stall past the lease) queue writes of the same run at once. Found by the
    /// simulation (`tests/sim`, seed 35): sharing a transaction, the fence, which was kept per
    /// run, counted the stale writer as holding, and its rows were written under the new token.
    #[tokio::test]
    async fn a_stale_holder_and_the_new_one_never_share_a_transaction() {
        use super::super::RunStore;
        let store = super::super::sqlite::SqliteStore::open("sqlite::memory:").await.unwrap();
        let holder = super::super::Holder::new(Duration::from_secs(30));
        let stale = store
            .create_run(super::super::NewRun::new("a", &super::super::StartRequest { route_id: "r".into(), ..Default::default() }), Some(&holder))
            .await
            .unwrap()
            .unwrap();
        store.commit(&stale, batch("a", 1)).await.unwrap();
        store.release(&stale).await.unwrap();
        let taken = store.claim_runs(&holder, &["r".to_owned()], 1).await.unwrap();
        let live = Lease { run_id: "a".into(), token: taken[0].lease.token };
        let writer = PoolWriter { pool: store.pool().clone(), per_insert: 100, health: Arc::new(Health::new(false)), known: Default::default() };
        let queue = WriteQueue::start(writer, 1, Arc::new(Health::new(false)));
        // Queued together, before the writer has seen either.
        let (old, new) = tokio::join!(queue.append(&stale, batch("a", 9)), queue.commit(&live, batch("a", 2)));
        old.unwrap();
        new.unwrap();
        assert_eq!(queue.commit(&stale, batch("a", 10)).await, Err(StoreError::LeaseLost("a".into())), "the stale holder is told");
        let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM run_events WHERE run_id = 'a' ORDER BY seq").fetch_all(store.pool()).await.unwrap();
        assert_eq!(seqs, [1, 2], "nothing of the stale holder written");
    }

    async fn store_release(store: &super::super::sqlite::SqliteStore, lease: &Lease) {
        use super::super::RunStore;
        store.release(lease).await.unwrap();
    }

    /// A run queues its batches without waiting; when one fails, those queued behind it (a later
    /// stage, its end) are not written either.
    #[tokio::test]
    async fn batches_queued_behind_a_failed_one_are_not_written() {
        let db = Arc::new(Flaky { poison: Some("bad"), ..Flaky::default() });
        let queue = WriteQueue::start(db.clone(), 1, Arc::new(Health::new(true)));
        let bad_lease = lease("bad");
        // Queued together, before the writer has seen any of them.
        let (a, b, c) = tokio::join!(queue.append(&bad_lease, batch("bad", 1)), queue.append(&bad_lease, batch("bad", 2)), async {
            tokio::task::yield_now().await;
            queue.commit(&bad_lease, batch("bad", 3)).await
        });
        a.unwrap();
        b.unwrap();
        assert!(c.is_err());
        assert!(db.committed.lock().unwrap().is_empty(), "nothing after the hole: {:?}", db.committed.lock().unwrap());
    }

    #[tokio::test]
    async fn a_transaction_whose_commit_was_not_acknowledged_is_not_written_twice() {
        let db = Arc::new(Flaky { lose_first_ack: true.into(), ..Flaky::default() });
        let queue = WriteQueue::start(db.clone(), 1, Arc::new(Health::new(true)));
        queue.commit(&lease("a"), batch("a", 1)).await.unwrap();
        queue.commit(&lease("a"), batch("a", 2)).await.unwrap();
        assert_eq!(*db.committed.lock().unwrap(), [("a".to_owned(), 1), ("a".to_owned(), 2)]);
    }

    #[tokio::test]
    async fn a_job_the_database_refuses_fails_alone_and_its_run_writes_no_more() {
        let db = Arc::new(Flaky { poison: Some("bad"), ..Flaky::default() });
        let queue = WriteQueue::start(db.clone(), 1, Arc::new(Health::new(true)));
        // Queued together: they share a transaction, which the bad run's rows make fail.
        queue.append(&lease("bad"), batch("bad", 1)).await.unwrap();
        let (good_lease, bad_lease) = (lease("good"), lease("bad"));
        let (good, bad) = tokio::join!(queue.commit(&good_lease, batch("good", 1)), async {
            tokio::task::yield_now().await;
            queue.commit(&bad_lease, batch("bad", 2)).await
        });
        good.unwrap();
        assert_eq!(bad.unwrap_err(), StoreError::Database("refused".into()), "the earlier failure is the answer");
        assert_eq!(*db.committed.lock().unwrap(), [("good".to_owned(), 1)], "nothing of the bad run, not even its (writable) end");
    }

    /// A transaction the database refuses is tried again job by job; a start among them that
    /// then finds the database away is refused (and taken out), and the writer goes on: later
    /// writes are written, not told that the writer stopped.
    #[tokio::test]
    async fn a_start_refused_while_its_jobs_are_tried_one_by_one_stops_no_writer() {
        let db = Arc::new(Flaky { poison: Some("bad"), creates_away: true, ..Flaky::default() });
        let queue = WriteQueue::start(db.clone(), 1, Arc::new(Health::new(true)));
        let create = Write::Create { run_id: "new".into(), route_id: "r".into(), request: "{}".into(), claim: None, key: None, webhook: None, session: None };
        // Queued together: one transaction, which the bad run's rows make fail.
        queue.append(&lease("bad"), batch("bad", 1)).await.unwrap();
        let refused = queue.write(create).await;
        assert!(matches!(refused, Err(StoreError::Unavailable(_))), "{refused:?}");
        let later = tokio::time::timeout(Duration::from_secs(5), queue.commit(&lease("good"), batch("good", 1))).await.expect("answered");
        assert_eq!(later, Ok(()), "the writer goes on");
        assert_eq!(*db.committed.lock().unwrap(), [("good".to_owned(), 1)]);
    }

    /// A start handed to the writer while it tries a run's commit again (the disk full) is
    /// refused at once, not kept waiting behind that commit for as long as the disk stays full;
    /// the commit, and one queued after it, are written once space returns.
    #[tokio::test]
    async fn a_start_queued_behind_a_retried_commit_is_refused_at_once() {
        let db = Arc::new(Flaky { full: true.into(), ..Flaky::default() });
        let health = Arc::new(Health::new(true));
        let queue = Arc::new(WriteQueue::start(db.clone(), 1, health.clone()));
        let first = tokio::spawn({
            let queue = queue.clone();
            async move { queue.commit(&lease("a"), batch("a", 1)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(health.failing());
        let create = Write::Create { run_id: "new".into(), route_id: "r".into(), request: "{}".into(), claim: None, key: None, webhook: None, session: None };
        let refused = tokio::time::timeout(Duration::from_secs(1), queue.write(create)).await.expect("refused within a second, not held");
        assert!(matches!(refused, Err(StoreError::Unavailable(_))), "{refused:?}");
        let second = tokio::spawn({
            let queue = queue.clone();
            async move { queue.commit(&lease("a"), batch("a", 2)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        db.full.store(false, std::sync::atomic::Ordering::SeqCst);
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(*db.committed.lock().unwrap(), [("a".to_owned(), 1), ("a".to_owned(), 2)], "in order, once each");
        assert!(!health.failing());
    }

    #[test]
    fn rows_sql_numbers_placeholders_across_rows() {
        assert_eq!(rows_sql("INSERT INTO t VALUES ", "(?, ?)", 2, 1, true), "INSERT INTO t VALUES ($1, $2),($3, $4)");
        assert_eq!(rows_sql("V ", "('x', ?, f() + ?)", 2, 2, true), "V ('x', $2, f() + $3),('x', $4, f() + $5)");
        assert_eq!(rows_sql("V ", "(?, ?)", 2, 1, false), "V (?, ?),(?, ?)");
    }
}
