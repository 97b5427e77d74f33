//! The durable facade: a [`Runtime`] and the run store it records runs in. Everything that
//! needs the store is here (accept a run, execute it under its lease, resume one claimed after
//! a crash or a takeover, continue one that asked, cancel, replay, prune, the fleet's share of
//! the model limits); a `Runtime` alone runs routes with no record. There is no `Durable`
//! without its store, so no stored run can be executed without its journal.

use std::sync::Arc;
use std::time::Duration;

use super::{Edition, RunOutcome, Runtime};
use crate::cancel::{Cancel, CancelHandle};
use crate::events::EventSink;
use crate::exec::{Begin, RunHistory, StartError};
use crate::failure::ReasonClass;
use crate::store::{Fenced, Holder, IdempotencyKey, Lease, RunStore, StartRequest, StoreError, StoredRun, StoredStatus};
use crate::version::CatalogueVersion;

/// A runtime with its run store (see the module docs). Cheap to share behind an `Arc`; the
/// runtime inside is shared too ([`Durable::runtime`]).
pub struct Durable {
    pub(super) runtime: Arc<Runtime>,
    pub(super) store: Arc<dyn RunStore>,
    /// This process as the store's claims name it (a new name at every start).
    pub(super) holder: Holder,
    /// The catalogue versions this process kept in the store (before its first run on each).
    pub(super) kept: std::sync::Mutex<std::collections::HashSet<CatalogueVersion>>,
    /// One rebuild of a version from the store at a time: runs taken over together after a
    /// crash, all on one version, rebuild it once.
    pub(super) rebuilding: tokio::sync::Mutex<()>,
    /// When the store was last asked for the versions of runs no route in force covers.
    pub(super) stranded_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("runtime", &self.runtime).field("holder", &self.holder.owner).finish_non_exhaustive()
    }
}

impl Durable {
    /// `runtime` recording its runs in `store`, holding them under leases of the settings'
    /// `FABRIC_RUN_LEASE`.
    pub fn new(runtime: impl Into<Arc<Runtime>>, store: Arc<dyn RunStore>) -> Durable {
        let runtime = runtime.into();
        let holder = Holder::new(runtime.settings().service.run_lease);
        Durable { runtime, store, holder, kept: Default::default(), rebuilding: tokio::sync::Mutex::new(()), stranded_at: Default::default() }
    }

    /// The runtime: the catalogue, the settings, the model gates, runs with no record.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The run store.
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.store
    }

    /// This process as it holds runs in the store.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Runs an accepted run this process holds on the edition it was accepted on
    /// ([`AcceptedRun::edition`]), recording it in the store as it goes (every write fenced by
    /// the lease).
    pub async fn execute(
        &self,
        lease: &Lease,
        req: &StartRequest,
        edition: &Edition,
        sink: Arc<dyn EventSink>,
        cancel: Cancel,
    ) -> Result<RunOutcome, StartError> {
        let fenced = Fenced { store: self.store.as_ref(), lease };
        let result = edition.runner().execute(req.run_request(), Begin::New { run_id: lease.run_id().to_owned() }, sink, cancel, Some(&fenced)).await?;
        Ok(RunOutcome { result, unused_script_lines: Vec::new() })
    }

    /// Accepts `req` and runs it here at once, recorded in the store as the service records a
    /// run, holding its lease until it ends: the lease is renewed every third of its length, so
    /// a service on the same store does not take the run over; if another process took it
    /// anyway, `handle` (the one of `cancel`) stops the run with the reason "lease lost". What
    /// `fabric run --store` does.
    pub async fn run_recorded(&self, req: &StartRequest, sink: Arc<dyn EventSink>, handle: &CancelHandle, cancel: Cancel) -> Result<RunOutcome, AcceptError> {
        let accepted = self.accept_here(req).await?;
        let lease = accepted.lease.ok_or(AcceptError::NotClaimed)?;
        Ok(self.holding(&lease, handle, self.execute(&lease, req, &accepted.edition, sink, cancel)).await?)
    }

    /// [`Durable::run_recorded`] once per idempotency key: the first call with `key` runs the
    /// route here (recorded, holding its lease); a later one with the same contract, from any
    /// process of the store, runs nothing and gets that run once it ended or asked (waiting for
    /// one still running elsewhere, until `cancel`); another contract is
    /// [`AcceptError::KeyReused`]. What the Python package's `run(..., idempotency_key=)` does.
    pub async fn run_recorded_once(
        &self,
        req: &StartRequest,
        key: &IdempotencyKey,
        sink: Arc<dyn EventSink>,
        handle: &CancelHandle,
        cancel: Cancel,
    ) -> Result<RecordedOnce, AcceptError> {
        let mut run = match self.accept_once_here(req, key).await? {
            Started::New(accepted) => {
                let lease = accepted.lease.ok_or(AcceptError::NotClaimed)?;
                let outcome = self.holding(&lease, handle, self.execute(&lease, req, &accepted.edition, sink, cancel)).await?;
                return Ok(RecordedOnce::Ran(Box::new(outcome)));
            }
            Started::Replayed(run) => run,
        };
        let store = &self.store;
        // Queued or running on another process: its end (or question) is what this call answers.
        while matches!(run.status, StoredStatus::Queued | StoredStatus::Running) && cancel.requested().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            run = Box::new(
                store.get_run(&run.run_id).await?.ok_or_else(|| StoreError::Database(format!("run {} was removed while it was awaited", run.run_id)))?,
            );
        }
        Ok(RecordedOnce::Replayed(run))
    }

    /// `work` (a run segment of `lease`'s run) with `lease` renewed every third of the lease for
    /// as long as it runs: in the same task as the run (no task of its own to outlive it),
    /// dropped with it. A lease another process took anyway stops `handle` ("lease lost"); a
    /// cancel request on the run, found at the same beat, cancels it (it ends `cancelled`).
    pub(super) async fn holding<T>(&self, lease: &Lease, handle: &CancelHandle, work: impl std::future::Future<Output = T>) -> T {
        let keep = self.keep_leases(
            || vec![lease.clone()],
            |held, lost| async move {
                if !lost.is_empty() {
                    handle.cancel("lease lost");
                }
                if let Ok(asked) = self.cancel_requests().await
                    && let Some((_, reason)) = asked.iter().find(|(l, _)| held.contains(l))
                {
                    handle.cancel_run(reason);
                }
            },
        );
        tokio::select! {
            biased;
            out = work => out,
            never = keep => match never {},
        }
    }

    /// The one lease keeper: every third of the lease, for as long as it is polled, renews the
    /// leases `held` names then, and gives `beat` them with the ids of the runs another process
    /// took over (which must stop here). `fabric run --store` and `fabric runs reply` keep their
    /// run's lease so, in the run's own task ([`Durable::run_recorded`]); a service replica
    /// keeps every lease of its runs in one of its loops. A renewal the store refuses is logged
    /// and tried again at the next beat (a lease outlives two missed beats).
    pub async fn keep_leases<Fut>(&self, held: impl Fn() -> Vec<Lease>, mut beat: impl FnMut(Vec<Lease>, Vec<String>) -> Fut) -> std::convert::Infallible
    where
        Fut: std::future::Future<Output = ()>,
    {
        let mut tick = tokio::time::interval(self.holder.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first beat is at once: after a restart of the replica's loop its runs' leases may
        // be close to their end (a lease just taken is renewed for nothing, once).
        loop {
            tick.tick().await;
            let leases = held();
            let lost = self.renew(&leases).await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "run store: renewing leases");
                Vec::new()
            });
            beat(leases, lost).await;
        }
    }

    /// Claims up to `limit` runnable runs of the routes this process serves: queued runs, and
    /// runs whose process stopped renewing its lease (died, or stalled past it), to
    /// [`Durable::resume`] each.
    pub async fn claim_runs(&self, limit: usize) -> Result<Vec<ClaimedRun>, StoreError> {
        let store = &self.store;
        let routes = self.claimable_routes().await;
        Ok(store
            .claim_runs(&self.holder, &routes, limit)
            .await?
            .into_iter()
            .map(|claimed| {
                let (request, version) = match claimed.run {
                    Ok(run) => (Ok(run.request), run.catalogue_version),
                    Err(e) => (Err(e), None),
                };
                ClaimedRun { lease: claimed.lease, route_id: claimed.route_id, request, version, cancel: claimed.cancel_reason }
            })
            .collect())
    }

    /// Executes a claimed run from where its journal ends: recorded model replies and completed
    /// stages and tool calls are taken from the journal (not done again), events go on after
    /// the last one written. A run that cannot go on here, or that was taken over more than
    /// [`MAX_TAKEOVERS`] times (it may be what kills its processes), is failed, keeping what it
    /// did. When its journal cannot be read the run is let go for another claim, and the
    /// outcome says `store_error` (nothing recorded).
    pub async fn resume(&self, claimed: ClaimedRun, sink: Arc<dyn EventSink>, cancel: Cancel) -> RunOutcome {
        let ClaimedRun { lease, route_id, request, version, cancel: asked } = claimed;
        let done = |result| RunOutcome { result, unused_script_lines: Vec::new() };
        // Someone asked to cancel it (its holder died first, or it was let go): it ends so.
        if let Some(reason) = asked {
            return match self.end_cancelled(&lease, &route_id, &reason, sink).await {
                Ok(result) => done(result),
                Err(e) => done(crate::exec::result_from_journal(lease.run_id(), &route_id, &[], ReasonClass::StoreError, &e.to_string())),
            };
        }
        let store = self.store.as_ref();
        let claimed_before = lease.token() > 1;
        let read = async {
            let mut history = read_history(store, lease.run_id()).await?;
            // Taken over: the call its last holder was streaming, if any, is made again.
            if claimed_before {
                let events = store.events_after(lease.run_id(), 0).await?;
                history.open = crate::exec::open_call(events.iter().map(|e| (e.kind.as_str(), e.body.as_str())));
            }
            // A run taken over too often is failed below, whatever its version.
            let version = version.as_ref().filter(|_| lease.token() <= MAX_TAKEOVERS);
            let on = self.edition_of(version, Some(self.runtime.settings().service.resume_on)).await?;
            if let (Some(moved), Ok(_)) = (on.moved.clone(), &request) {
                self.note_moved(&lease, &route_id, &mut history, moved, &on.edition, sink.clone()).await?;
            }
            Ok::<_, StoreError>((history, on.edition))
        };
        let (history, edition) = match read.await {
            Ok(read) => read,
            Err(e) => {
                let _ = store.release(&lease).await;
                let why = format!("the run's record could not be read: {e}");
                return done(crate::exec::result_from_journal(lease.run_id(), &route_id, &[], ReasonClass::StoreError, &why));
            }
        };
        let fenced = Fenced { store, lease: &lease };
        let why = match request {
            Ok(_) if lease.token() > MAX_TAKEOVERS => format!("it was taken over {} times", lease.token() - 1),
            Ok(req) => match edition.runner().execute(req.run_request(), Begin::Recover(history.clone()), sink.clone(), cancel, Some(&fenced)).await {
                Ok(result) => return done(result),
                Err(e) => format!("it cannot go on here: {e}"),
            },
            Err(e) => format!("its record does not read ({e})"),
        };
        done(edition.runner().abandon(&route_id, history, ReasonClass::Interrupted, &format!("the run was taken over, but {why}"), sink, &fenced).await)
    }

    /// Extends the leases of the runs this process executes; returns the runs another process
    /// took over (this one must stop them).
    pub async fn renew(&self, leases: &[Lease]) -> Result<Vec<String>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.store.renew(&self.holder, leases).await
    }

    /// Lets a run go that this process stopped without an end (its last write failed): it can
    /// be claimed again at once.
    pub async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.release(lease).await
    }
}

/// Why a run was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("model profile `{0}` is not defined in the catalogue")]
    UnknownProfile(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    WebhookNotAllowed(#[from] crate::config::WebhookRefused),
    #[error("the store did not let this process claim the run it accepted")]
    NotClaimed,
    /// The idempotency key started run `run_id` with another start contract.
    #[error("this idempotency key started run {run_id} with another start contract; use a new key for a new run")]
    KeyReused { run_id: String },
    /// `reject`: the session has this live run.
    #[error("session `{session}` has a live run, {run_id}; its policy (multitask `reject`) refuses another until it ends")]
    SessionBusy { session: String, run_id: String },
    #[error("`session_id` {0}")]
    BadSession(&'static str),
}

/// What a keyed start ([`Durable::accept_once`]) did: accepted a new run, or found the run the
/// first start with its key accepted.
#[derive(Debug, Clone)]
pub enum Started {
    New(AcceptedRun),
    Replayed(Box<StoredRun>),
}

/// What [`Durable::run_recorded_once`] did: ran the route, or found the key's run (as it is now:
/// ended or asking, unless the call was cancelled while it waited).
#[derive(Debug)]
pub enum RecordedOnce {
    Ran(Box<RunOutcome>),
    Replayed(Box<StoredRun>),
}

/// An accepted run: its id, and its lease when this process claimed it at once.
#[derive(Debug, Clone)]
pub struct AcceptedRun {
    pub run_id: String,
    pub lease: Option<Lease>,
    /// The session's live runs it interrupted (a cancel is requested on each; `interrupt`).
    pub interrupted: Vec<String>,
    /// The edition it was accepted on (its recorded catalogue version), which
    /// [`Durable::execute`] runs it on whatever reload came since.
    pub edition: Arc<Edition>,
}

/// A run this process claimed from the store ([`Durable::claim_runs`]), to [`Durable::resume`].
#[derive(Debug)]
pub struct ClaimedRun {
    lease: Lease,
    route_id: String,
    /// The start contract, or why the run's row does not read.
    request: Result<StartRequest, StoreError>,
    /// The catalogue version it recorded.
    version: Option<CatalogueVersion>,
    /// A cancel request's reason: the run is ended `cancelled`, not resumed.
    cancel: Option<String>,
}

impl ClaimedRun {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn route_id(&self) -> &str {
        &self.route_id
    }

    /// Whether another process held the run before (it is taken over, not started).
    pub fn is_takeover(&self) -> bool {
        self.lease.token() > 1
    }
}

/// A run's journal and the `seq` its next event gets, as a run taken up again needs them.
pub(super) async fn read_history(store: &dyn RunStore, run_id: &str) -> Result<RunHistory, StoreError> {
    Ok(RunHistory { run_id: run_id.to_owned(), entries: store.journal(run_id).await?, next_seq: store.next_seq(run_id).await?, open: None })
}

/// How many times a run may be taken over before the next claim fails it instead: a run that
/// takes its process down with it (a panic, memory) must not take the fleet down one by one.
pub const MAX_TAKEOVERS: i64 = 10;
