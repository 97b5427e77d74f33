//! A serving replica: the HTTP app's state and every background loop of the process, owned in
//! one place.
//!
//! `fabric serve` builds an [`AppState`] (what the handlers share) and starts a [`Replica`] over
//! it: each loop of the replica's share of the fleet's work (lease renewal, claims, cancel
//! requests, retention, webhook deliveries, the fleet's model limits, scheduled runs) runs in a task of its own
//! under a supervisor, all in one `JoinSet` under one stop signal. A loop that panics is logged
//! (ERROR), counted (`fabric_background_panics_total{loop}`) and restarted after a backoff; while a
//! loop the replica needs (renewal, claims) waits to restart, `/readyz` answers 503. A loop that
//! returns (nothing to do: no retention set, no webhook secret; or a shutdown began) is not
//! restarted. [`Replica::stop`] ends every loop and waits for each.
//!
//! It sits above `api`: the loops work on the state the handlers share (the live runs, their
//! permits, the metrics), so the app owns that state and the replica owns the tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::AppState;
use crate::api::loops::Loops;

/// The first wait before a loop that panicked runs again; it doubles with each panic in a row.
const FIRST_RESTART: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
const MAX_RESTART: Duration = Duration::from_secs(30);
/// A loop that ran this long without panicking starts its backoff again.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// A loop's work, made anew at each (re)start.
type Work = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One background loop of a replica.
struct Loop {
    name: &'static str,
    /// The replica cannot do its share without it: `/readyz` is 503 while it is down.
    needed: bool,
    work: Work,
}

/// A serving process's background work: every loop, supervised, until [`Replica::stop`].
#[derive(Debug)]
pub struct Replica {
    loops: JoinSet<()>,
    stop: watch::Sender<bool>,
    /// The state whose runtime's MCP servers are stopped with the loops.
    state: Option<AppState>,
}

impl Replica {
    /// Starts every loop of the replica over `state`.
    pub fn start(state: AppState) -> Replica {
        let of = |f: fn(AppState) -> Pin<Box<dyn Future<Output = ()> + Send>>| {
            let state = state.clone();
            Box::new(move || f(state.clone())) as Work
        };
        let loops = vec![
            Loop { name: "leases", needed: true, work: of(|s| Box::pin(s.renew_leases())) },
            Loop { name: "claims", needed: true, work: of(|s| Box::pin(s.claim_work())) },
            Loop { name: "cancels", needed: false, work: of(|s| Box::pin(s.watch_cancels())) },
            Loop { name: "retention", needed: false, work: of(|s| Box::pin(s.sweep())) },
            Loop { name: "webhooks", needed: false, work: of(|s| Box::pin(s.deliver_webhooks())) },
            Loop { name: "flow", needed: false, work: of(|s| Box::pin(s.durable().clone().share_flow())) },
            Loop { name: "catalogue", needed: false, work: of(|s| Box::pin(s.watch_catalogue())) },
            Loop { name: "schedules", needed: false, work: of(|s| Box::pin(s.fire_schedules())) },
        ];
        let mut replica = Replica::supervising(loops, state.loops_shared());
        replica.state = Some(state);
        replica
    }

    fn supervising(loops: Vec<Loop>, record: Arc<dyn LoopRecord>) -> Replica {
        let (stop, _) = watch::channel(false);
        let mut set = JoinSet::new();
        for l in loops {
            set.spawn(supervise(l, record.clone(), stop.subscribe()));
        }
        Replica { loops: set, stop, state: None }
    }

    /// Ends every loop (each at its next await) and waits for each; the loops that panicked on
    /// their way out are logged there. After a server's drain: the leases are renewed until
    /// then.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        let mut stopped = 0;
        while self.loops.join_next().await.is_some() {
            stopped += 1;
        }
        tracing::info!(loops = stopped, "every background loop of the replica stopped");
        // Last: a run's tool calls ended with the drain.
        if let Some(state) = &self.state {
            state.runtime().mcp().stop().await;
        }
    }
}

/// Where a supervisor records a loop's panics and restarts: the service's [`Loops`].
pub trait LoopRecord: Send + Sync {
    fn panicked(&self, name: &'static str, needed: bool);
    fn up(&self, name: &'static str);
}

impl LoopRecord for Loops {
    fn panicked(&self, name: &'static str, needed: bool) {
        self.panicked(name);
        if !needed {
            // Counted, but the replica still does its share: ready.
            self.up(name);
        }
    }

    fn up(&self, name: &'static str) {
        Loops::up(self, name);
    }
}

/// Runs `l` until it returns or `stop` fires, restarting it after a panic.
async fn supervise(l: Loop, record: Arc<dyn LoopRecord>, mut stop: watch::Receiver<bool>) {
    let mut backoff = FIRST_RESTART;
    loop {
        let started = tokio::time::Instant::now();
        let mut task = tokio::spawn((l.work)());
        let ended = tokio::select! {
            ended = &mut task => ended,
            () = stopped(&mut stop) => {
                task.abort();
                let _ = task.await;
                return;
            }
        };
        match ended {
            Ok(()) => return,
            Err(e) if e.is_panic() => {
                let what = e.into_panic();
                let message = what.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| what.downcast_ref::<String>().cloned()).unwrap_or_default();
                if started.elapsed() >= HEALTHY_AFTER {
                    backoff = FIRST_RESTART;
                }
                tracing::error!(
                    r#loop = l.name,
                    panic = message,
                    restart_in_s = backoff.as_secs_f64(),
                    "a background loop of the replica panicked; it is restarted"
                );
                record.panicked(l.name, l.needed);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stopped(&mut stop) => return,
                }
                backoff = (backoff * 2).min(MAX_RESTART);
                record.up(l.name);
            }
            // Aborted by the runtime's shutdown.
            Err(_) => return,
        }
    }
}

/// Resolves once the stop signal is given (or its sender is gone). The guard `wait_for` returns
/// is dropped here: it may not be held across an await of a task that moves between threads.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_panics_is_counted_down_then_restarted_and_stop_waits_for_every_loop() {
        let record = Arc::new(Loops::default());
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        // Panics at its first two starts, then runs for ever.
        let flaky = Loop {
            name: "claims",
            needed: true,
            work: Box::new(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if n < 2 {
                        panic!("injected {n}");
                    }
                    std::future::pending::<()>().await;
                })
            }),
        };
        let done = Loop { name: "retention", needed: false, work: Box::new(|| Box::pin(async {})) };
        let replica = Replica::supervising(vec![flaky, done], record.clone());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(record.down(), ["claims"], "down while it waits to restart");
        tokio::time::sleep(FIRST_RESTART + FIRST_RESTART * 2 + Duration::from_millis(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "restarted after each panic, with a doubling wait");
        assert!(record.down().is_empty(), "up again");
        assert_eq!(record.panics().get("claims"), Some(&2));
        assert_eq!(record.panics().get("retention"), None, "a loop that returns is not restarted");
        replica.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_the_replica_can_do_without_is_counted_but_keeps_it_ready() {
        let record = Arc::new(Loops::default());
        let once = Arc::new(AtomicU32::new(0));
        let webhooks = Loop {
            name: "webhooks",
            needed: false,
            work: Box::new(move || {
                let first = once.fetch_add(1, Ordering::SeqCst) == 0;
                Box::pin(async move {
                    assert!(!first, "injected");
                    std::future::pending::<()>().await;
                })
            }),
        };
        let replica = Replica::supervising(vec![webhooks], record.clone());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(record.down().is_empty());
        assert_eq!(record.panics().get("webhooks"), Some(&1));
        replica.stop().await;
    }
}
