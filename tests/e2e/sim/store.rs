//! The run store as the simulated processes see it: the real store (SQLite, or PostgreSQL)
//! runs on a real-time runtime of its own, and each call blocks the simulation's one thread
//! until it returns. So a store call takes no virtual time, nothing else of the simulation runs
//! meanwhile, and the paused clock cannot jump while the database works (sqlx's own timeouts
//! live on the real runtime). On top, the store's faults:
//! - a write fails before it reaches the database (`Unavailable`), or commits and its
//!   acknowledgement is lost;
//! - the clock jumps past every lease (their `lease_until` is set in the past);
//! - the process crashes at a store call (before it, or after it with the answer lost): the
//!   call never returns and the driver drops the process's runtime.
//!
//! An appended batch is written at once (and waited for), or, drawn from the seed, held here
//! until the run's next write: the real store's writer writes a queued batch soon after, or a
//! crash comes first and it is lost; both orders happen here, each for its seed. Held batches
//! are kept per run, as in the real writer's one queue: a segment that lost its lease and the
//! one that took the run over may have batches waiting there together.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fabric::config::SessionPolicy;
use fabric::exec::{JournalBatch, JournalEntry};
use fabric::failure::BoxFuture;
use fabric::store::{CancelAsk, Claimed, Holder, IdempotencyKey, Keyed, Lease, NewRun, RunFilter, RunStore, SessionStart, StoreError, StoredEvent, StoredRun};

use super::faults::Faults;
use super::trace::Trace;

/// The real store and the runtime it runs on.
pub struct Real {
    pub store: Arc<dyn RunStore>,
    pub rt: tokio::runtime::Runtime,
    pub jump: Jump,
}

/// A connection of its own to the store's database, for the clock jump.
#[derive(Clone)]
pub enum Jump {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Real {
    /// The clock jumps past every lease: each running run's `lease_until` is set in the past,
    /// so its holder's lease has expired while it goes on (leases are the database's time).
    pub fn jump_clock(&self) {
        const JUMP: &str = "UPDATE runs SET lease_until = 0 WHERE status = 'running'";
        let jump = self.jump.clone();
        self.block(async move {
            let done = match jump {
                Jump::Sqlite(pool) => sqlx::query(JUMP).execute(&pool).await.map(drop),
                Jump::Postgres(pool) => sqlx::query(JUMP).execute(&pool).await.map(drop),
            };
            done.expect("the clock jumps")
        });
    }

    /// Runs `work` on the store's runtime and waits for it on this thread.
    pub fn block<T: Send + 'static>(&self, work: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.rt.spawn(async move {
            let _ = tx.send(work.await);
        });
        rx.recv().expect("the store's runtime stopped")
    }
}

/// A run's journal as it was read: its model replies (stage, turn). (Not its completed stages:
/// a branched workflow may run a stage again, a decision loop does every turn.)
pub type Recorded = std::collections::HashSet<(String, u32)>;

/// What every process of one seed shares: the fences seen, the crash, the journals as recovered
/// runs read them, and the violations found on the way.
#[derive(Debug, Default)]
pub struct Shared {
    /// Store calls made so far (all processes): the crash point counts them.
    pub calls: AtomicU64,
    /// The call at which the process crashes, if it does.
    pub crash_at: Mutex<Option<(u64, bool)>>,
    pub crashed: AtomicBool,
    pub crash_signal: tokio::sync::Notify,
    /// The highest fencing token handed out per run.
    pub tokens: Mutex<HashMap<String, i64>>,
    /// The leases whose write failed (a fault): their segment must stop there, so the model
    /// may not be asked for anything by it again (`model`).
    pub stopped: Mutex<std::collections::HashSet<Lease>>,
    /// Each segment's lease, by its sink (`sink_key`).
    pub segments: Mutex<HashMap<usize, Lease>>,
    /// What each run's journal held when it was last recovered or continued: the model may not
    /// be asked for one of its replies (`model`).
    pub recorded: Mutex<HashMap<String, Recorded>>,
    /// Invariant violations found on the way (the model's, the store's, the user's).
    pub violations: Mutex<Vec<String>>,
}

/// A segment's sink, as a key (its address: the segment's sink lives as long as the segment).
pub fn sink_key(sink: &Arc<dyn fabric::events::EventSink>) -> usize {
    Arc::as_ptr(sink) as *const () as usize
}

impl Shared {
    pub fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    /// A violation when the segment whose events go to `sink` goes on after one of its writes
    /// failed (a run stops at a failed write; another segment takes it over from its journal).
    pub fn check_going_on(&self, sink: &Arc<dyn fabric::events::EventSink>, what: &str) {
        let Some(lease) = self.segments.lock().unwrap().get(&sink_key(sink)).cloned() else { return };
        if self.stopped.lock().unwrap().contains(&lease) {
            self.violation(format!("run {} went on past a write of its own that failed (token {}): {what}", lease.run_id(), lease.token()));
        }
    }
}

/// One process's view of the store.
pub struct SimStore {
    pub real: Arc<Real>,
    pub faults: Arc<Faults>,
    pub trace: Arc<Trace>,
    pub shared: Arc<Shared>,
    /// The process (0 first, then one more per crash), as the trace names it.
    pub process: u32,
    pending: Mutex<HashMap<String, Vec<(Lease, JournalBatch)>>>,
    /// Leases whose write failed here (a fault): every later write of theirs gets that error,
    /// as the real store answers after a failed batch (the run must not go on past it).
    failed: Mutex<HashMap<Lease, String>>,
}

impl std::fmt::Debug for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore").field("process", &self.process).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
enum WriteFault {
    Refused,
    AckLost,
}

impl SimStore {
    pub fn new(real: Arc<Real>, faults: Arc<Faults>, trace: Arc<Trace>, shared: Arc<Shared>, process: u32) -> SimStore {
        SimStore { real, faults, trace, shared, process, pending: Mutex::new(HashMap::new()), failed: Mutex::new(HashMap::new()) }
    }

    /// Counts a call; `Some(after)` when the process crashes at it (after it was made, or before).
    fn crash_here(&self) -> Option<bool> {
        let n = self.shared.calls.fetch_add(1, Ordering::SeqCst);
        let at = *self.shared.crash_at.lock().unwrap();
        match at {
            Some((k, after)) if k == n && !self.shared.crashed.load(Ordering::SeqCst) => Some(after),
            _ => None,
        }
    }

    fn crash(&self, op: &str) {
        self.trace.log(format!("p{} crash at {op}", self.process));
        self.shared.crashed.store(true, Ordering::SeqCst);
        self.shared.crash_signal.notify_one();
    }

    /// A call of the real store through the bridge, with the crash point and the clock jump.
    async fn call<T: Send + 'static>(&self, op: &str, work: impl Future<Output = T> + Send + 'static) -> T {
        if self.faults.fault("store:jump", self.faults.rates.lease_jump, &["jump"]).is_some() {
            self.trace.log(format!("p{} clock jump: every lease expires", self.process));
            self.real.jump_clock();
        }
        match self.crash_here() {
            Some(false) => {
                self.crash(op);
                std::future::pending::<()>().await;
            }
            Some(true) => {
                let _ = self.real.block(work);
                self.crash(&format!("{op} (made, its answer lost)"));
                return std::future::pending::<T>().await;
            }
            None => {}
        }
        self.real.block(work)
    }

    /// A fault fails this lease's writes from now on; the error to answer with.
    fn fail(&self, lease: &Lease, why: &str) -> StoreError {
        self.drop_held(lease);
        self.shared.stopped.lock().unwrap().insert(lease.clone());
        self.failed.lock().unwrap().insert(lease.clone(), why.to_owned());
        StoreError::Unavailable(why.to_owned())
    }

    /// Forgets this lease's held batches (another holder's of the same run stay).
    fn drop_held(&self, lease: &Lease) {
        if let Some(held) = self.pending.lock().unwrap().get_mut(lease.run_id()) {
            held.retain(|(l, _)| l != lease);
        }
    }

    /// The error of an earlier fault of this lease's writes, if there was one.
    fn failed_before(&self, lease: &Lease) -> Option<StoreError> {
        self.failed.lock().unwrap().get(lease).map(|why| StoreError::Unavailable(why.clone()))
    }

    fn note_token(&self, run_id: &str, token: i64) {
        let mut tokens = self.shared.tokens.lock().unwrap();
        let t = tokens.entry(run_id.to_owned()).or_default();
        *t = (*t).max(token);
    }

    /// The real database refuses nothing here but a stale holder (no disk fills, no server
    /// goes away: those faults are the decorator's): any other refusal of a write is a bug of
    /// the rows written (a duplicate `seq`, say), which the run would only survive by being
    /// taken over until it is given up.
    fn refused_by_the_database(&self, lease: &Lease, done: &Result<(), StoreError>) {
        if let Err(e) = done
            && !matches!(e, StoreError::LeaseLost(_))
        {
            self.shared.violation(format!("the database refused a write of run {} token {}: {e}", lease.run_id(), lease.token()));
        }
    }

    fn stale(&self, lease: &Lease) -> bool {
        self.shared.tokens.lock().unwrap().get(lease.run_id()).is_some_and(|t| *t > lease.token())
    }
}

/// Hands the held batches to the real store in order. Each answers its own writer: an error
/// of another holder's batch (a stale segment's, fenced) is that segment's to hear, at its next
/// write, from the real store; only `own`'s first error is the caller's.
async fn flush(store: &dyn RunStore, own: &Lease, batches: Vec<(Lease, JournalBatch)>) -> Result<(), StoreError> {
    let mut first = Ok(());
    for (lease, batch) in batches {
        let done = store.append(&lease, batch).await;
        if &lease == own && first.is_ok() {
            first = done;
        }
    }
    first
}

fn shown(done: &Result<(), StoreError>) -> String {
    match done {
        Ok(()) => "ok".to_owned(),
        Err(StoreError::LeaseLost(_)) => "lease lost".to_owned(),
        Err(e) => e.to_string(),
    }
}

fn entries_line(batch: &JournalBatch) -> String {
    let kind = |e: &JournalEntry| match e {
        JournalEntry::ModelReply { stage_id, turn, .. } => format!("reply {stage_id}/{turn}"),
        JournalEntry::StageCompleted { stage_id, .. } => format!("stage {stage_id}"),
        JournalEntry::Note { .. } => "note".to_owned(),
        JournalEntry::UserReply { .. } => "user".to_owned(),
        JournalEntry::ToolAsked(ask) => format!("asked {}", ask.stage_id),
    };
    let entries: Vec<String> = batch.entries.iter().map(kind).collect();
    let end = batch.end.as_ref().map(|r| format!(" end {:?}", r.status())).unwrap_or_default();
    format!("{} events [{}]{end}", batch.events.len(), entries.join(", "))
}

/// A new run's row, owned: what a store call on the store's own runtime takes with it.
struct OwnedRun {
    run_id: String,
    request: fabric::store::StartRequest,
    webhook: Option<String>,
    session_id: Option<String>,
}

impl OwnedRun {
    fn of(run: &NewRun<'_>) -> OwnedRun {
        OwnedRun {
            run_id: run.run_id.to_owned(),
            request: run.request.clone(),
            webhook: run.webhook.map(str::to_owned),
            session_id: run.session_id.map(str::to_owned),
        }
    }

    fn view(&self) -> NewRun<'_> {
        NewRun { webhook: self.webhook.as_deref(), session_id: self.session_id.as_deref(), ..NewRun::new(&self.run_id, &self.request) }
    }
}

impl RunStore for SimStore {
    fn create_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(async move {
            let (store, owned, holder) = (self.real.store.clone(), OwnedRun::of(&run), holder.cloned());
            let made = self.call("create", async move { store.create_run(owned.view(), holder.as_ref()).await }).await;
            if let Ok(Some(lease)) = &made {
                self.note_token(run.run_id, lease.token());
            }
            self.trace.log(format!(
                "p{} create {} {}: {}",
                self.process,
                run.run_id,
                run.route_id,
                made.as_ref().map(|l| format!("{:?}", l.as_ref().map(|l| l.token()))).unwrap_or_else(|e| e.to_string())
            ));
            made
        })
    }

    fn create_keyed_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Keyed, StoreError>> {
        Box::pin(async move {
            let (store, owned, holder, key) = (self.real.store.clone(), OwnedRun::of(&run), holder.cloned(), key.clone());
            let made = self.call("create", async move { store.create_keyed_run(owned.view(), holder.as_ref(), &key).await }).await;
            if let Ok(Keyed::Created(Some(lease))) = &made {
                self.note_token(run.run_id, lease.token());
            }
            self.trace.log(format!(
                "p{} create keyed {} {}: {}",
                self.process,
                run.run_id,
                run.route_id,
                made.as_ref().map(|k| format!("{k:?}")).unwrap_or_else(|e| e.to_string())
            ));
            made
        })
    }

    fn create_session_run<'a>(
        &'a self,
        run: NewRun<'a>,
        holder: Option<&'a Holder>,
        policy: SessionPolicy,
        key: Option<&'a IdempotencyKey>,
    ) -> BoxFuture<'a, Result<SessionStart, StoreError>> {
        Box::pin(async move {
            let (store, owned, holder, key) = (self.real.store.clone(), OwnedRun::of(&run), holder.cloned(), key.cloned());
            let made = self.call("create", async move { store.create_session_run(owned.view(), holder.as_ref(), policy, key.as_ref()).await }).await;
            if let Ok(SessionStart::Created { lease: Some(lease), .. }) = &made {
                self.note_token(run.run_id, lease.token());
            }
            self.trace.log(format!("p{} create session {} {}: {made:?}", self.process, run.run_id, run.route_id));
            made
        })
    }

    fn run_of_key<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        let (store, key) = (self.real.store.clone(), key.clone());
        Box::pin(self.call("get", async move { store.run_of_key(&key).await }))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        let (store, id) = (self.real.store.clone(), run_id.to_owned());
        Box::pin(self.call("get", async move { store.get_run(&id).await }))
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        let (store, filter) = (self.real.store.clone(), filter.clone());
        Box::pin(self.call("list", async move { store.list_runs(&filter).await }))
    }

    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>> {
        let (store, id) = (self.real.store.clone(), run_id.to_owned());
        Box::pin(self.call("events", async move { store.events_after(&id, after_seq).await }))
    }

    fn next_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (store, id) = (self.real.store.clone(), run_id.to_owned());
        Box::pin(self.call("next_seq", async move { store.next_seq(&id).await }))
    }

    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>> {
        let (store, id) = (self.real.store.clone(), run_id.to_owned());
        Box::pin(self.call("journal", async move { store.journal(&id).await }))
    }

    fn claim_runs<'a>(&'a self, holder: &'a Holder, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            let (store, holder, routes) = (self.real.store.clone(), holder.clone(), routes.to_vec());
            let claimed = self.call("claim", async move { store.claim_runs(&holder, &routes, limit).await }).await;
            if let Ok(c) = &claimed {
                for c in c {
                    self.note_token(c.lease.run_id(), c.lease.token());
                    self.trace.log(format!("p{} claimed {} token {}", self.process, c.lease.run_id(), c.lease.token()));
                }
            }
            claimed
        })
    }

    fn request_cancel<'a>(&'a self, run_id: &'a str, reason: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<CancelAsk, StoreError>> {
        Box::pin(async move {
            let (store, id, why, holder) = (self.real.store.clone(), run_id.to_owned(), reason.to_owned(), holder.clone());
            let asked = self.call("cancel", async move { store.request_cancel(&id, &why, &holder).await }).await;
            if let Ok(CancelAsk::Claimed { lease, .. }) = &asked {
                self.note_token(run_id, lease.token());
            }
            asked
        })
    }

    fn prune<'a>(&'a self, cutoff: &'a str, limit: usize, dry_run: bool) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (store, cutoff) = (self.real.store.clone(), cutoff.to_owned());
        Box::pin(self.call("prune", async move { store.prune(&cutoff, limit, dry_run).await }))
    }

    fn awaiting_since<'a>(&'a self, cutoff: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let (store, cutoff) = (self.real.store.clone(), cutoff.to_owned());
        Box::pin(self.call("get", async move { store.awaiting_since(&cutoff, limit).await }))
    }

    fn cancel_requests<'a>(&'a self, holder: &'a Holder) -> BoxFuture<'a, Result<Vec<(Lease, String)>, StoreError>> {
        let (store, holder) = (self.real.store.clone(), holder.clone());
        Box::pin(self.call("get", async move { store.cancel_requests(&holder).await }))
    }

    fn claim_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(async move {
            let (store, id, holder) = (self.real.store.clone(), run_id.to_owned(), holder.clone());
            let claimed = self.call("claim_reply", async move { store.claim_reply(&id, &holder).await }).await;
            if let Ok(Some(l)) = &claimed {
                self.note_token(run_id, l.token());
            }
            claimed
        })
    }

    fn reopen_reply<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        let (store, lease) = (self.real.store.clone(), lease.clone());
        Box::pin(self.call("reopen_reply", async move { store.reopen_reply(&lease).await }))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.drop_held(lease);
            let (store, l) = (self.real.store.clone(), lease.clone());
            let done = self.call("release", async move { store.release(&l).await }).await;
            self.trace.log(format!("p{} release {} token {}: {done:?}", self.process, lease.run_id(), lease.token()));
            done
        })
    }

    fn renew<'a>(&'a self, holder: &'a Holder, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let (store, holder, leases) = (self.real.store.clone(), holder.clone(), leases.to_vec());
        Box::pin(self.call("renew", async move { store.renew(&holder, &leases).await }))
    }

    fn append<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let p = self.process;
            let line = entries_line(&batch);
            if let Some(e) = self.failed_before(lease) {
                self.trace.log(format!("p{p} append {} token {} {line}: refused (an earlier write failed)", lease.run_id(), lease.token()));
                return Err(e);
            }
            if self.faults.fault("store:append", self.faults.rates.store, &["refused"]).is_some() {
                self.trace.log(format!("p{p} append {} token {} {line}: refused (fault)", lease.run_id(), lease.token()));
                return Err(self.fail(lease, "sim: the database refused the write"));
            }
            let mut batches = self.pending.lock().unwrap().remove(lease.run_id()).unwrap_or_default();
            batches.push((lease.clone(), batch));
            // The real writer writes a queued batch soon, or a crash comes first: both happen.
            if self.faults.pick("store:append:held", 4) == 0 {
                self.trace.log(format!("p{p} append {} token {} {line}: queued", lease.run_id(), lease.token()));
                self.pending.lock().unwrap().insert(lease.run_id().to_owned(), batches);
                return Ok(());
            }
            let stale = self.stale(lease);
            let store = self.real.store.clone();
            let (l, empty) = (lease.clone(), JournalBatch::default());
            let done = self
                .call("append", async move {
                    let own = flush(store.as_ref(), &l, batches).await;
                    // Waits until the batches are durable (an empty batch writes no row).
                    let durable = store.commit(&l, empty).await;
                    own.and(durable)
                })
                .await;
            self.trace.log(format!("p{p} append {} token {} {line}: written, {}", lease.run_id(), lease.token(), shown(&done)));
            self.refused_by_the_database(lease, &done);
            if stale && done.is_ok() {
                self.shared.violation(format!("a stale holder's batch was taken: run {} token {}", lease.run_id(), lease.token()));
            }
            done
        })
    }

    fn commit<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let line = entries_line(&batch);
            let p = self.process;
            if let Some(e) = self.failed_before(lease) {
                self.trace.log(format!("p{p} commit {} token {} {line}: refused (an earlier write failed)", lease.run_id(), lease.token()));
                return Err(e);
            }
            let mut batches = self.pending.lock().unwrap().remove(lease.run_id()).unwrap_or_default();
            batches.push((lease.clone(), batch));
            let fault = self.faults.fault("store:commit", self.faults.rates.store, &[WriteFault::Refused, WriteFault::AckLost]);
            if let Some(WriteFault::Refused) = fault {
                self.trace.log(format!("p{p} commit {} token {} {line}: refused (fault)", lease.run_id(), lease.token()));
                return Err(self.fail(lease, "sim: the database refused the write"));
            }
            let stale = self.stale(lease);
            let store = self.real.store.clone();
            let done = self
                .call("commit", async move {
                    let last = batches.pop().expect("the commit's own batch");
                    let own = flush(store.as_ref(), &last.0, batches).await;
                    let committed = store.commit(&last.0, last.1).await;
                    own.and(committed)
                })
                .await;
            self.trace.log(format!("p{p} commit {} token {} {line}: {}", lease.run_id(), lease.token(), shown(&done)));
            self.refused_by_the_database(lease, &done);
            if stale && done.is_ok() {
                self.shared.violation(format!("a stale holder's commit was taken: run {} token {}", lease.run_id(), lease.token()));
            }
            if done.is_ok()
                && let Some(WriteFault::AckLost) = fault
            {
                self.trace.log(format!("p{p} commit {}: its acknowledgement is lost (fault)", lease.run_id()));
                return Err(self.fail(lease, "sim: the connection broke before the commit was acknowledged"));
            }
            done
        })
    }

    fn put_catalogue<'a>(&'a self, version: &'a fabric::store::CatalogueVersion, sources: &'a fabric::store::Sources) -> BoxFuture<'a, Result<(), StoreError>> {
        let (store, version, sources) = (self.real.store.clone(), version.clone(), sources.clone());
        Box::pin(self.call("put_catalogue", async move { store.put_catalogue(&version, &sources).await }))
    }

    fn catalogue<'a>(&'a self, version: &'a fabric::store::CatalogueVersion) -> BoxFuture<'a, Result<Option<fabric::store::Sources>, StoreError>> {
        let (store, version) = (self.real.store.clone(), version.clone());
        Box::pin(self.call("catalogue", async move { store.catalogue(&version).await }))
    }

    fn stranded_versions<'a>(&'a self, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<fabric::store::CatalogueVersion>, StoreError>> {
        let (store, routes) = (self.real.store.clone(), routes.to_vec());
        Box::pin(self.call("stranded_versions", async move { store.stranded_versions(&routes, limit).await }))
    }

    fn move_catalogue<'a>(&'a self, lease: &'a Lease, version: &'a fabric::store::CatalogueVersion) -> BoxFuture<'a, Result<(), StoreError>> {
        let (store, lease, version) = (self.real.store.clone(), lease.clone(), version.clone());
        Box::pin(self.call("move_catalogue", async move { store.move_catalogue(&lease, &version).await }))
    }

    fn catalogue_versions<'a>(&'a self, prefix: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<fabric::store::CatalogueVersion>, StoreError>> {
        let (store, prefix) = (self.real.store.clone(), prefix.to_owned());
        Box::pin(self.call("catalogue_versions", async move { store.catalogue_versions(&prefix, limit).await }))
    }

    fn queued(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        let store = self.real.store.clone();
        Box::pin(self.call("queued", async move { store.queued().await }))
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let store = self.real.store.clone();
        Box::pin(self.call("ping", async move { store.ping().await }))
    }

    fn health(&self) -> Result<(), StoreError> {
        self.real.store.health()
    }

    fn pending_cancels(&self, limit: usize) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>> {
        let store = self.real.store.clone();
        Box::pin(self.call("get", async move { store.pending_cancels(limit).await }))
    }

    /// The simulation runs no service, so no sender: the real store's outbox as it is.
    fn webhooks(&self) -> &dyn fabric::store::WebhookOutbox {
        self.real.store.webhooks()
    }
}
