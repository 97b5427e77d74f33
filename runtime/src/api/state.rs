//! What every handler shares ([`AppState`]: the durable runtime, the live runs, the limits, the
//! metrics, the streams' caps) and the replica's share of the fleet's work that runs on it:
//! the lease keeper's beat, the claims, the drain at a shutdown.

use super::*;

/// The service's limits and access.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer token every endpoint but health needs; `None` only with `--no-auth`.
    pub token: Option<String>,
    /// Runs executing at once; more are refused with 429 and `Retry-After`.
    pub max_in_flight: usize,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// The largest goal (as compact JSON).
    pub max_goal_bytes: usize,
    /// The most prefetched chunks a run may be given.
    pub max_prefetch_chunks: usize,
    /// The largest prefetch, all its chunks together (their UTF-8 bytes).
    pub max_prefetch_bytes: usize,
    /// How long `?wait=true` waits before answering with the run as it stands.
    pub wait_max: Duration,
    /// Runs the store may hold `queued` (accepted while every replica was busy); past it, 429.
    /// 0: a busy service refuses new runs rather than queue them.
    pub max_queued: u64,
    /// How often this process looks for runs to claim (queued, or whose process stopped).
    pub claim_poll: Duration,
    /// How long a request's body may take to arrive, once its headers have; past it, 408.
    pub body_timeout: Duration,
    /// Event streams of one run open at once; past it, 429 `too_many_streams`.
    pub max_run_streams: usize,
    /// Run event streams open at once, all runs together; past it, 429 `too_many_streams`.
    pub max_event_streams: usize,
    /// How long [`serve`]'s shutdown lets the runs in flight finish before it hands them over.
    pub shutdown_grace: Duration,
    /// How long an event stream may wait for its client to take the next event; past it the
    /// stream ends (the client reconnects with `Last-Event-ID`). A client that keeps its
    /// connection open and reads nothing would otherwise hold its stream's place for good.
    pub stream_stall: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            token: None,
            max_in_flight: 1024,
            max_body_bytes: 1024 * 1024,
            max_goal_bytes: 256 * 1024,
            // Every model call of the run sees the prefetch: bounded like the goal, not only by
            // the body.
            max_prefetch_chunks: 256,
            max_prefetch_bytes: 256 * 1024,
            wait_max: Duration::from_secs(60),
            max_queued: 10_000,
            claim_poll: Duration::from_secs(1),
            body_timeout: Duration::from_secs(10),
            max_run_streams: 32,
            max_event_streams: 4096,
            shutdown_grace: Duration::from_secs(30),
            stream_stall: Duration::from_secs(30),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub(super) inner: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) durable: Arc<Durable>,
    pub(super) config: ApiConfig,
    pub(super) live: Live,
    pub(super) metrics: Arc<Metrics>,
    pub(super) in_flight: Arc<Semaphore>,
    /// Set when a shutdown begins: no more claims.
    pub(super) stopping: std::sync::atomic::AtomicBool,
    /// Run-list streams (`/v1/runs/updates`) open at once.
    pub(super) update_streams: Arc<Semaphore>,
    /// Set when a shutdown's grace period is over: every event stream ends then, with a
    /// `: shutting down` comment (a stream would otherwise hold the shutdown until its run ends).
    pub(super) closing: tokio::sync::watch::Sender<bool>,
    /// One store poller per run followed through the store, shared by its streams.
    pub(super) feeds: Arc<follow::Feeds>,
    /// The run event streams open, per run and in all (the caps).
    pub(super) stream_slots: Arc<follow::StreamSlots>,
    /// Wakes the webhook sender: a run ended or asked here.
    pub(super) webhook_wake: tokio::sync::Notify,
    /// The replica's background loops: which are down, how often each panicked.
    pub(super) loops: Arc<loops::Loops>,
    /// The catalogue reloads, by outcome.
    pub(super) reloads: catalogue::Reloads,
    /// Asks the replica's catalogue loop for a reload (`SIGHUP`).
    pub(super) reload_wake: tokio::sync::Notify,
    /// The schedules' fires this replica decided or started (`fabric_schedule_*`).
    pub(super) fires: scheduler::FireCounts,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl AppState {
    /// A service over `durable`: its runtime and its run store.
    pub fn new(durable: Arc<Durable>, config: ApiConfig) -> AppState {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        let stopping = std::sync::atomic::AtomicBool::new(false);
        let update_streams = Arc::new(Semaphore::new(inspect::MAX_UPDATE_STREAMS));
        let closing = tokio::sync::watch::channel(false).0;
        AppState {
            inner: Arc::new(Shared {
                durable,
                config,
                live: Live::default(),
                metrics: Arc::default(),
                in_flight,
                stopping,
                update_streams,
                closing,
                feeds: Arc::default(),
                stream_slots: Arc::default(),
                webhook_wake: tokio::sync::Notify::new(),
                loops: Arc::default(),
                reloads: Default::default(),
                reload_wake: tokio::sync::Notify::new(),
                fires: Default::default(),
            }),
        }
    }

    /// The record of this replica's background loops (their owner, [`crate::replica::Replica`],
    /// keeps it).
    pub fn loops(&self) -> &loops::Loops {
        &self.inner.loops
    }

    /// The same record, shared with the replica's supervisors.
    pub fn loops_shared(&self) -> Arc<loops::Loops> {
        self.inner.loops.clone()
    }

    /// The runtime the service runs.
    pub fn runtime(&self) -> &Arc<Runtime> {
        self.inner.durable.runtime()
    }

    /// The runtime with its run store.
    pub fn durable(&self) -> &Arc<Durable> {
        &self.inner.durable
    }

    /// Every third of the lease, for ever, renews the leases of the runs this process executes
    /// (and stops those another process took over). A loop of the replica's
    /// ([`crate::replica::Replica`]), apart from the claims, so that slow claims never delay a
    /// renewal past the lease.
    pub async fn renew_leases(self) {
        let durable = self.inner.durable.clone();
        let held = || self.inner.live.leases();
        let never = durable
            .keep_leases(held, |leases, lost| {
                for run_id in lost {
                    // The segment that held the lost lease, not a newer one of the same run
                    // (this process may have claimed the run again meanwhile); stopped
                    // already: handed over at a shutdown.
                    let Some(token) = leases.iter().find(|l| l.run_id() == run_id).map(|l| l.token()) else { continue };
                    let Some(live) = self.inner.live.get(&run_id).filter(|l| l.lease().token() == token && !l.is_stopped()) else { continue };
                    tracing::warn!(
                        run_id,
                        "run lease lost (another process took the run over after this one went silent past its lease); this process stops the run"
                    );
                    live.stop("lease lost");
                }
                std::future::ready(())
            })
            .await;
        match never {}
    }

    /// Every `claim_poll`, until a shutdown begins, claims what this process has room for:
    /// queued runs, and runs whose process stopped renewing (died, or stalled past its lease),
    /// which go on from their journal. A loop of the replica's.
    pub async fn claim_work(self) {
        let runtime = self.inner.durable.clone();
        let poll = self.inner.config.claim_poll.min(runtime.holder().lease / 3).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let room = self.inner.in_flight.available_permits().min(64);
            if room == 0 {
                continue;
            }
            let claimed = match runtime.claim_runs(room).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "run store: claiming runs");
                    continue;
                }
            };
            for run in claimed {
                let lease = run.lease().clone();
                let Ok(permit) = self.inner.in_flight.clone().try_acquire_owned() else {
                    // A request took the room meanwhile: let the run go for the next claim.
                    let _ = runtime.release(&lease).await;
                    continue;
                };
                // A segment of this very run still going here held the lease this claim took
                // (its process was cut off from the database past the lease): it is stopped, and
                // the run goes on from its journal in the new segment.
                if let Some(old) = self.inner.live.get(lease.run_id()).filter(|l| l.lease().token() != lease.token()) {
                    old.stop("taken over");
                }
                if run.is_takeover() {
                    self.inner.metrics.taken_over(run.route_id());
                    tracing::warn!(run_id = lease.run_id(), claim = lease.token(), "taking over a run whose process stopped; it goes on from its journal");
                } else {
                    tracing::info!(run_id = lease.run_id(), "claimed a queued run");
                }
                run_segment(&self, &lease, permit, move |runtime, sink, cancel| async move { Ok(runtime.resume(run, sink, cancel).await) });
            }
        }
    }

    /// Runs executing now.
    pub fn runs_in_flight(&self) -> usize {
        self.inner.config.max_in_flight - self.inner.in_flight.available_permits()
    }

    /// Stops claiming, waits until no run executes, at most `grace`; then hands the rest over:
    /// their leases are let go, so another replica (or this one's successor) claims each at once
    /// and continues it from its journal; the work since each run's last commit is done again
    /// there. Returns how many runs were handed over.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        while self.runs_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let go first (the fence then refuses whatever the stopped segment still writes), then
        // stop: nothing of the interruption reaches the record, a client or the metrics.
        let leases = self.inner.live.leases();
        for lease in &leases {
            if let Err(e) = self.inner.durable.release(lease).await {
                tracing::error!(run_id = lease.run_id(), error = %e, "run store: handing a run over");
            }
            if let Some(live) = self.inner.live.get(lease.run_id()) {
                live.stop("handed over");
            }
        }
        self.inner.durable.leave_fleet().await;
        // The streams have shown what the grace period let finish; they end now, cleanly, so
        // that their connections close and the process can stop. After a handover, a little
        // later: a stream following a handed-over run then shows its end too when the replica
        // that took it over finishes it quickly.
        if leases.is_empty() {
            self.inner.closing.send_replace(true);
        } else {
            let state = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HANDOVER_FOLLOW).await;
                state.inner.closing.send_replace(true);
            });
        }
        leases.len()
    }
}

/// How long event streams go on after a shutdown handed runs over (see [`AppState::drain`]).
pub(super) const HANDOVER_FOLLOW: Duration = Duration::from_secs(3);
