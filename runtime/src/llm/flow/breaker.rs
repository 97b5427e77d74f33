//! A circuit breaker per model, for the models of fallback chains: after `failures` calls in a
//! row that failed for a reason of the model's health (down, rate limited past its retries, too
//! slow, its key refused) it opens, and the chains skip that model for `cooldown` instead of
//! paying its timeout on every call; then one call goes through (half-open): its success closes
//! the breaker, its failure opens it again. An opening is told to the fleet (on PostgreSQL,
//! through the same table and `NOTIFY` as a 429's pause), so every replica skips the model.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::failure::ReasonClass;

/// When a breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Failures in a row that open it.
    pub failures: u32,
    /// How long it stays open before one call may try the model again.
    pub cooldown: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> BreakerPolicy {
        BreakerPolicy { failures: DEFAULT_FAILURES, cooldown: DEFAULT_COOLDOWN }
    }
}

/// `FABRIC_LLM_BREAKER_FAILURES`'s default: LiteLLM's router cools a deployment down after 3
/// failures too.
pub const DEFAULT_FAILURES: u32 = 3;
/// `FABRIC_LLM_BREAKER_COOLDOWN_S`'s default.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);

/// The prefix of a breaker's key among the fleet's pauses (`breaker/openai:gpt-4o`).
pub const FLEET_PREFIX: &str = "breaker/";

/// A breaker's state, as metrics show it (`fabric_model_breaker_state`: 0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// What a breaker says of itself, for `/metrics` and `fabric doctor`.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerStatus {
    pub key: Arc<str>,
    pub state: BreakerState,
    /// Times it opened since start (here, or told by the fleet).
    pub opened: u64,
}

#[derive(Debug)]
struct State {
    in_a_row: u32,
    open_until: Option<Instant>,
    /// The class of the last failure that counted: what a skip of the open breaker reports.
    last_class: ReasonClass,
}

/// One model's breaker.
#[derive(Debug)]
pub struct Breaker {
    key: Arc<str>,
    policy: BreakerPolicy,
    state: Mutex<State>,
    /// A half-open breaker's one call is out.
    probing: AtomicBool,
    opened: AtomicU64,
    /// Where an opening is told to the fleet, `(FLEET_PREFIX + key, cooldown)`.
    fleet: Option<mpsc::UnboundedSender<(Arc<str>, Duration)>>,
}

/// Whether a call may go to the model now.
#[derive(Debug)]
pub enum Admit {
    /// Closed: go.
    Go,
    /// Half-open: this call is the one that tries the model again; the guard ends the trial if
    /// the call is dropped before it reports.
    Probe(Probe),
    /// Open (or half-open with its trial out): skip it; the class that opened it.
    Skip(ReasonClass),
}

/// The half-open breaker's trial call; dropped without a report, it lets another call try.
#[derive(Debug)]
pub struct Probe(Arc<Breaker>);

impl Drop for Probe {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::SeqCst);
    }
}

impl Breaker {
    pub fn new(key: Arc<str>, policy: BreakerPolicy, fleet: Option<mpsc::UnboundedSender<(Arc<str>, Duration)>>) -> Arc<Breaker> {
        let state = State { in_a_row: 0, open_until: None, last_class: ReasonClass::ServerError };
        Arc::new(Breaker { key, policy, state: Mutex::new(state), probing: AtomicBool::new(false), opened: AtomicU64::new(0), fleet })
    }

    pub fn key(&self) -> &Arc<str> {
        &self.key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change is one statement: a poisoned lock still holds consistent counts.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a call may go to the model now.
    pub fn admit(self: &Arc<Self>) -> Admit {
        let st = self.lock();
        match st.open_until {
            None => Admit::Go,
            Some(until) if Instant::now() < until => Admit::Skip(st.last_class),
            Some(_) => {
                let class = st.last_class;
                drop(st);
                if self.probing.swap(true, Ordering::SeqCst) { Admit::Skip(class) } else { Admit::Probe(Probe(self.clone())) }
            }
        }
    }

    /// A call of the model answered: closed, and the count starts again.
    pub fn succeeded(&self) {
        let mut st = self.lock();
        st.in_a_row = 0;
        st.open_until = None;
    }

    /// A call of the model failed for a reason of its health (`class`): counted; opens the
    /// breaker at the policy's count, or again at once after a failed trial.
    pub fn failed(&self, class: ReasonClass) {
        let mut st = self.lock();
        st.in_a_row = st.in_a_row.saturating_add(1);
        st.last_class = class;
        let trial_failed = st.open_until.is_some();
        if !trial_failed && st.in_a_row < self.policy.failures.max(1) {
            return;
        }
        st.open_until = Some(Instant::now() + self.policy.cooldown);
        drop(st);
        self.opened.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(model = %self.key, cooldown_s = self.policy.cooldown.as_secs_f64(), reason_class = class.as_str(), "a model's breaker opens: fallback chains skip it");
        if let Some(tx) = &self.fleet {
            let _ = tx.send((format!("{FLEET_PREFIX}{}", self.key).into(), self.policy.cooldown));
        }
    }

    /// Another replica of the fleet opened this model's breaker: open here for `remaining`.
    pub fn open_from_fleet(&self, remaining: Duration) {
        let until = Instant::now() + remaining.min(self.policy.cooldown);
        let mut st = self.lock();
        if st.open_until.is_none_or(|u| u < until) {
            if st.open_until.is_none() {
                self.opened.fetch_add(1, Ordering::Relaxed);
            }
            st.open_until = Some(until);
        }
    }

    pub fn status(&self) -> BreakerStatus {
        let st = self.lock();
        let state = match st.open_until {
            None => BreakerState::Closed,
            Some(u) if Instant::now() < u => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        };
        BreakerStatus { key: self.key.clone(), state, opened: self.opened.load(Ordering::Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32, cooldown_ms: u64) -> (Arc<Breaker>, mpsc::UnboundedReceiver<(Arc<str>, Duration)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Breaker::new("p:m".into(), BreakerPolicy { failures, cooldown: Duration::from_millis(cooldown_ms) }, Some(tx)), rx)
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_in_a_row_and_tries_once_after_the_cooldown() {
        let (b, mut told) = breaker(3, 10_000);
        b.failed(ReasonClass::ServerError);
        b.failed(ReasonClass::Timeout);
        b.succeeded();
        b.failed(ReasonClass::ServerError);
        b.failed(ReasonClass::ServerError);
        assert!(matches!(b.admit(), Admit::Go), "a success in between starts the count again");
        b.failed(ReasonClass::Connection);
        assert!(matches!(b.admit(), Admit::Skip(ReasonClass::Connection)));
        assert_eq!(b.status().state, BreakerState::Open);
        assert_eq!(told.try_recv().unwrap(), (Arc::from("breaker/p:m"), Duration::from_secs(10)), "the fleet is told");
        tokio::time::advance(Duration::from_millis(10_001)).await;
        assert_eq!(b.status().state, BreakerState::HalfOpen);
        let probe = b.admit();
        assert!(matches!(probe, Admit::Probe(_)));
        assert!(matches!(b.admit(), Admit::Skip(_)), "one trial at a time");
        b.failed(ReasonClass::ServerError);
        drop(probe);
        assert!(matches!(b.admit(), Admit::Skip(_)), "a failed trial opens it again at once");
        tokio::time::advance(Duration::from_millis(10_001)).await;
        let probe = b.admit();
        b.succeeded();
        drop(probe);
        assert!(matches!(b.admit(), Admit::Go));
        assert_eq!(b.status().opened, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_trial_lets_another_call_try_and_the_fleet_opens_it_too() {
        let (b, _told) = breaker(1, 1_000);
        b.failed(ReasonClass::RateLimited);
        tokio::time::advance(Duration::from_millis(1_001)).await;
        drop(b.admit());
        assert!(matches!(b.admit(), Admit::Probe(_)), "the cancelled trial gave its turn back");
        let (other, _) = breaker(3, 1_000);
        other.open_from_fleet(Duration::from_secs(60));
        assert_eq!(other.status().state, BreakerState::Open);
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert_eq!(other.status().state, BreakerState::HalfOpen, "never longer than its own cooldown");
    }
}
