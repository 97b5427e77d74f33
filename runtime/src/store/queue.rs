//! The write path every SQL store shares: one writer task that takes what the runs hand it and
//! writes everything waiting in one transaction (group commit: at many concurrent runs one
//! fsync serves many stages), each run's rows only while it holds its lease (the fence, checked
//! by the database's [`WriteRows`]), trying again for as long as the database cannot write for
//! a reason that may pass. What a transaction writes is [`super::rows`]; how, on a sqlx pool,
//! [`super::pool_writer`], and on a SQLite file, [`super::sqlite_writer`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::health::Health;
use super::rows::{Job, Prepared, Rows, Write, WriteFailure, WriteRows};
use super::{Lease, StoreError};
use crate::exec::JournalBatch;

/// What a write is told once the writer task is gone (the runtime shutting down).
const WRITER_STOPPED: &str = "the store's writer has stopped";

/// Commits waiting for the writer; more than this waiting means the database cannot keep up.
const WRITE_QUEUE: usize = 4096;

/// Jobs written in one transaction at the most.
const JOBS_PER_TRANSACTION: usize = 256;

/// The pauses between two tries of a transaction while the database cannot write.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(50);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

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
    let key = (lease.run_id().to_owned(), lease.token());
    if last { failed.remove(&key) } else { failed.get(&key).cloned() }
}

/// A job's outcome, told to whoever waits for it; a failed batch that is not the run's end is
/// recorded, so that nothing of the run is written after it.
fn settle(failed: &Failed, job: &Write, ack: Option<oneshot::Sender<Result<(), StoreError>>>, done: Result<(), StoreError>) {
    if let (Err(e), Write::Commit { lease, batch }) = (&done, job)
        && batch.end.is_none()
    {
        failed.lock().unwrap_or_else(|p| p.into_inner()).insert((lease.run_id().to_owned(), lease.token()), e.clone());
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
        self.writer_of(lease.run_id()).send((job, None)).await.map_err(|_| StoreError::Database(WRITER_STOPPED.into()))
    }

    /// [`crate::exec::RunJournal::append_then`]: queued, not waited for; `durable` called by a
    /// task of its own once the writer committed the batch (not if the write failed).
    pub async fn append_then(&self, lease: &Lease, batch: JournalBatch, durable: crate::exec::Durable) -> Result<(), StoreError> {
        if let Some(e) = earlier_failure(&self.failed, lease, false) {
            return Err(e);
        }
        let (ack, done) = oneshot::channel();
        let job = Write::Commit { lease: lease.clone(), batch: Box::new(Prepared::of(batch)) };
        self.writer_of(lease.run_id()).send((job, Some(ack))).await.map_err(|_| StoreError::Database(WRITER_STOPPED.into()))?;
        tokio::spawn(async move {
            if let Ok(Ok(())) = done.await {
                durable();
            }
        });
        Ok(())
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
    match holders.get(lease.run_id()) {
        Some(token) => *token == lease.token(),
        None => {
            holders.insert(lease.run_id().to_owned(), lease.token());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::BoxFuture;
    use crate::store::pool_writer::PoolWriter;

    /// A new run's row of route `r`, claimed or queued.
    fn create_write(run: &str, claim: Option<(String, i64)>) -> Write {
        Write::Create { run_id: run.into(), route_id: "r".into(), request: "{}".into(), claim, key: None, webhook: None, session: None, version: None }
    }

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
        Lease::new(run, 1)
    }

    /// Whether a transaction committed, asked of a real database: by its first row, and which
    /// of its runs are fenced now.
    #[tokio::test]
    async fn a_real_database_says_whether_a_transaction_committed() {
        let store = super::super::sqlite::SqliteStore::open("sqlite::memory:").await.unwrap();
        let writer = PoolWriter { pool: store.pool().clone(), per_insert: 100, health: Arc::new(Health::new(false)), known: Default::default() };
        let holder = super::super::Holder::new(Duration::from_secs(30));
        let create = |run: &str| create_write(run, Some((holder.owner.clone(), 30_000)));
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
    /// simulation (`tests/e2e/sim`, seed 35): sharing a transaction, the fence, which was kept per
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
        let live = Lease::new("a", taken[0].lease.token());
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
        let create = create_write("new", None);
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
        let create = create_write("new", None);
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
}
