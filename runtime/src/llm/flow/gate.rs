//! One provider/model's gate: the calls in flight, the request and token buckets, the pause
//! after a 429, and the queue of calls waiting for room, served fairly.
//!
//! A call takes a [`Permit`] before its request goes out and gives it back when the reply is
//! in. A call that finds no room waits in its route's queue; the gate's ticker (a task of its
//! own, started by the first call that waits) lets waiters through as room comes: a permit
//! given back, the buckets refilled, a pause over, a larger fleet share. Room is given to the
//! routes of the highest priority waiting, round-robin across routes, except that after
//! [`FLOOR`]` - 1` grants in a row to the top priority the next goes to the lower one whose
//! head has waited longest, so low priority still advances.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::{Held, Limits};
use crate::llm::Wait;

/// The pause a 429 put on a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// How long every call of the model waits: at most the gate's longest pause.
    pub length: Duration,
    /// The wait the provider named, when it was longer than the gate's longest pause: the call
    /// that got it fails rather than wait that long.
    pub refused: Option<Wait>,
}

/// Of every `FLOOR` calls let through while several priorities wait, at least one is of a
/// priority below the highest.
pub const FLOOR: u32 = 4;
/// The first pause after a 429 that named no wait; it doubles with every further 429 in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause a 429 without a hint leads to (and never past the gate's longest pause).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The longest pause a provider's 429 may put on a model unless the operator says otherwise
/// (`FABRIC_LLM_MAX_PAUSE_S`): a longer hint fails its call instead of stalling the model.
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(60);
/// The largest `FABRIC_LLM_MAX_PAUSE_S` accepted.
pub const MAX_PAUSE: Duration = Duration::from_secs(600);
/// The deepest a token bucket goes into debt, in seconds of its rate: one minute of `tpm`. A
/// reply claiming absurd usage (a proxy reporting cumulative or garbage counts) then costs the
/// model at most a minute, not years.
const MAX_DEBT_S: f64 = 60.0;
/// Units of a fleet's budget of a model without a concurrency limit: a replica's share of the
/// rates is its units over these.
pub const RATE_UNITS: u32 = 100;

/// A token bucket refilled continuously; its level may go below zero (a call larger than one
/// second's tokens goes when the bucket is full, and the debt is paid back by waiting).
#[derive(Debug, Clone)]
struct Bucket {
    level: f64,
    per_s: f64,
    cap: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket of `per_minute`, full: one second's share (at least `min_cap`).
    fn new(per_minute: f64, min_cap: f64, now: Instant) -> Bucket {
        let per_s = per_minute / 60.0;
        let cap = if per_s > 0.0 { per_s.max(min_cap) } else { 0.0 };
        Bucket { level: cap, per_s, cap, at: now }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.per_s).min(self.cap);
        self.at = now;
    }

    /// How long until `need` (at most a full bucket) is there; `None` when it never refills.
    fn ready_in(&self, need: f64) -> Option<Duration> {
        let need = need.min(self.cap);
        if self.cap > 0.0 && self.level >= need {
            return Some(Duration::ZERO);
        }
        if self.per_s <= 0.0 {
            return None;
        }
        // A millisecond more: a wake that comes a rounding error early does not spin.
        Some(Duration::from_secs_f64((need - self.level) / self.per_s) + Duration::from_millis(1))
    }

    /// Takes `n` (a negative `n` gives back), within the bucket's bounds: never over a full
    /// bucket, never deeper in debt than [`MAX_DEBT_S`] of its rate.
    fn spend(&mut self, n: f64) {
        self.level = (self.level - n).clamp(-self.per_s * MAX_DEBT_S, self.cap.max(0.0));
    }

    fn set_rate(&mut self, per_minute: f64, min_cap: f64, now: Instant) {
        self.refill(now);
        self.per_s = per_minute / 60.0;
        self.cap = if self.per_s > 0.0 { self.per_s.max(min_cap) } else { 0.0 };
        self.level = self.level.min(self.cap);
    }
}

#[derive(Debug)]
struct Waiter {
    seq: u64,
    estimate: u64,
    held: Held,
    tx: oneshot::Sender<Permit>,
}

/// The waiters of one priority: a queue per route, the routes in round-robin order.
#[derive(Debug, Default)]
struct Level {
    order: VecDeque<Arc<str>>,
    queues: HashMap<Arc<str>, VecDeque<Waiter>>,
}

impl Level {
    /// The route whose head waiter is next, dropping waiters that went away.
    fn front(&mut self) -> Option<&Waiter> {
        while let Some(route) = self.order.front().cloned() {
            let queue = self.queues.get_mut(&route)?;
            while queue.front().is_some_and(|w| w.tx.is_closed()) {
                queue.pop_front();
            }
            if queue.is_empty() {
                self.queues.remove(&route);
                self.order.pop_front();
                continue;
            }
            return self.queues.get(&route).and_then(VecDeque::front);
        }
        None
    }

    /// Takes the head waiter of the front route; the route goes to the back of the order.
    fn pop(&mut self) -> Option<Waiter> {
        let route = self.order.pop_front()?;
        let queue = self.queues.get_mut(&route)?;
        let waiter = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&route);
        } else {
            self.order.push_back(route);
        }
        waiter
    }
}

#[derive(Debug)]
struct State {
    limits: Limits,
    /// This replica's units of the fleet's budget; `None`: the whole limits (one process).
    granted: Option<u32>,
    in_flight: u32,
    rpm: Option<Bucket>,
    tpm: Option<Bucket>,
    paused_until: Option<Instant>,
    /// The longest pause a 429 puts on this model (`FABRIC_LLM_MAX_PAUSE_S`).
    max_pause: Duration,
    backoff: Duration,
    /// Waiting calls by priority, highest last.
    levels: BTreeMap<u8, Level>,
    top_in_a_row: u32,
    next_seq: u64,
}

impl State {
    fn units(&self) -> u32 {
        self.limits.max_concurrency.unwrap_or(RATE_UNITS)
    }

    fn fraction(&self) -> f64 {
        self.granted.map_or(1.0, |g| f64::from(g.min(self.units())) / f64::from(self.units()))
    }

    fn concurrency_cap(&self) -> Option<u32> {
        match (self.limits.max_concurrency, self.granted) {
            (None, _) => None,
            (Some(n), None) => Some(n),
            (Some(n), Some(g)) => Some(g.min(n)),
        }
    }

    fn rates(&mut self, now: Instant) {
        let f = self.fraction();
        match (&mut self.rpm, self.limits.rpm) {
            (Some(b), Some(r)) => b.set_rate(f64::from(r) * f, 1.0, now),
            (slot, Some(r)) => *slot = Some(Bucket::new(f64::from(r) * f, 1.0, now)),
            (slot, None) => *slot = None,
        }
        match (&mut self.tpm, self.limits.tpm) {
            (Some(b), Some(t)) => b.set_rate(t as f64 * f, 0.0, now),
            (slot, Some(t)) => *slot = Some(Bucket::new(t as f64 * f, 0.0, now)),
            (slot, None) => *slot = None,
        }
    }

    /// The priority whose waiter goes next: the highest, unless the floor says a lower one's turn.
    fn next_level(&mut self) -> Option<u8> {
        loop {
            let top = *self.levels.keys().next_back()?;
            if self.levels.get_mut(&top).and_then(Level::front).is_none() {
                self.levels.remove(&top);
                continue;
            }
            if self.top_in_a_row + 1 < FLOOR || self.levels.len() < 2 {
                return Some(top);
            }
            let mut oldest: Option<(u64, u8)> = None;
            let lower: Vec<u8> = self.levels.keys().copied().filter(|p| *p != top).collect();
            for p in lower {
                match self.levels.get_mut(&p).and_then(Level::front).map(|w| w.seq) {
                    Some(seq) if oldest.is_none_or(|(s, _)| seq < s) => oldest = Some((seq, p)),
                    Some(_) => {}
                    None => {
                        self.levels.remove(&p);
                    }
                }
            }
            return Some(oldest.map_or(top, |(_, p)| p));
        }
    }

    /// Why the next call cannot go now, and until when (`None`: until something else changes).
    fn blocked(&mut self, estimate: u64, now: Instant) -> Option<(Held, Option<Instant>)> {
        if let Some(until) = self.paused_until {
            if until > now {
                return Some((Held::Paused, Some(until)));
            }
            self.paused_until = None;
        }
        if self.concurrency_cap().is_some_and(|cap| self.in_flight >= cap) {
            return Some((Held::Concurrency, None));
        }
        for (bucket, need, held) in [(&mut self.rpm, 1.0, Held::Rpm), (&mut self.tpm, estimate as f64, Held::Tpm)] {
            if let Some(b) = bucket {
                b.refill(now);
                match b.ready_in(need) {
                    Some(d) if d.is_zero() => {}
                    Some(d) => return Some((held, Some(now + d))),
                    None => return Some((held, None)),
                }
            }
        }
        None
    }

    fn take(&mut self, estimate: u64) {
        self.in_flight += 1;
        if let Some(b) = &mut self.rpm {
            b.spend(1.0);
        }
        if let Some(b) = &mut self.tpm {
            b.spend(estimate as f64);
        }
    }

    fn give_back(&mut self, estimate: u64, used: Option<u64>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let (Some(b), Some(used)) = (&mut self.tpm, used) {
            b.spend(used as f64 - estimate as f64);
        }
    }

    fn waiting(&mut self) -> impl Iterator<Item = (&Arc<str>, &Waiter)> {
        self.levels.values().flat_map(|l| l.queues.iter().flat_map(|(r, q)| q.iter().map(move |w| (r, w))))
    }
}

/// What a gate says of itself: for metrics, `fabric doctor` and the fleet's heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct GateStatus {
    pub key: Arc<str>,
    pub limits: Limits,
    pub in_flight: u32,
    /// Calls waiting for room, by route.
    pub waiting: BTreeMap<String, u32>,
    /// This replica's share of the fleet's limits (1 for a process on its own).
    pub share: f64,
    /// Units granted and the budget's units, in a fleet.
    pub granted: Option<(u32, u32)>,
    pub paused_for: Option<Duration>,
    /// 429s received since start.
    pub rate_limited: u64,
}

/// A provider/model's gate.
#[derive(Debug)]
pub struct Gate {
    key: Arc<str>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    ticking: Arc<AtomicBool>,
    rate_limited: AtomicU64,
    /// Where a pause of this gate's own 429 is told to the fleet.
    pauses: Option<mpsc::UnboundedSender<(Arc<str>, Duration)>>,
}

/// Room for one request; given back when dropped.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    estimate: u64,
    used: Option<u64>,
    armed: bool,
    /// What held the call, if it waited.
    held: Held,
}

impl Permit {
    /// The tokens the reply says the call used, instead of the estimate taken before it.
    pub fn used(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.gate.lock().give_back(self.estimate, self.used);
            self.gate.wake.notify_one();
        }
    }
}

/// Ends the ticker's flag when its task ends, whatever ends it (a runtime shut down drops it).
struct Ticking(Arc<AtomicBool>);

impl Drop for Ticking {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Gate {
    pub(super) fn new(key: Arc<str>, limits: Limits, max_pause: Duration, pauses: Option<mpsc::UnboundedSender<(Arc<str>, Duration)>>) -> Arc<Gate> {
        let mut state = State {
            limits,
            granted: None,
            in_flight: 0,
            rpm: None,
            tpm: None,
            paused_until: None,
            max_pause: max_pause.min(MAX_PAUSE),
            backoff: FIRST_BACKOFF,
            levels: BTreeMap::new(),
            top_in_a_row: 0,
            next_seq: 0,
        };
        state.rates(Instant::now());
        Arc::new(Gate { key, state: Mutex::new(state), wake: Arc::default(), ticking: Arc::default(), rate_limited: AtomicU64::new(0), pauses })
    }

    pub fn key(&self) -> &Arc<str> {
        &self.key
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding it cannot leave the counts half-written (each change is one
        // statement), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Room for one call of about `estimate` tokens of `route` at `priority`, waiting at most
    /// `max_wait`. `Ok` with what held it and for how long if it waited; `Err` with the same
    /// when the wait ran out.
    pub async fn acquire(
        self: &Arc<Self>,
        route: &str,
        priority: u8,
        estimate: u64,
        max_wait: Duration,
    ) -> Result<(Permit, Option<(Held, Duration)>), (Held, Duration)> {
        let started = Instant::now();
        // Most calls find room and no one waiting: no queue, no channel.
        {
            let mut st = self.lock();
            if st.levels.is_empty() && st.blocked(estimate, started).is_none() {
                st.take(estimate);
                return Ok((Permit { gate: self.clone(), estimate, used: None, armed: true, held: Held::Concurrency }, None));
            }
        }
        let (tx, mut rx) = oneshot::channel();
        let held = {
            let mut st = self.lock();
            let seq = st.next_seq;
            st.next_seq += 1;
            let level = st.levels.entry(priority).or_default();
            let route: Arc<str> = Arc::from(route);
            let queue = level.queues.entry(route.clone()).or_default();
            if queue.is_empty() {
                level.order.push_back(route.clone());
            }
            queue.push_back(Waiter { seq, estimate, held: Held::Concurrency, tx });
            let (_, blocked) = self.dispatch(&mut st, started);
            if let Some((held, _)) = blocked {
                // Still at the back of its route's queue, unless it was let through.
                let back = st.levels.get_mut(&priority).and_then(|l| l.queues.get_mut(&route)).and_then(VecDeque::back_mut);
                if let Some(w) = back.filter(|w| w.seq == seq) {
                    w.held = held;
                }
            }
            blocked.map(|(h, _)| h)
        };
        if let Ok(permit) = rx.try_recv() {
            return Ok((permit, None));
        }
        self.ensure_ticker();
        self.wake.notify_one();
        let held = held.unwrap_or(Held::Concurrency);
        match tokio::time::timeout(max_wait, &mut rx).await {
            Ok(Ok(permit)) => {
                let why = permit.held;
                Ok((permit, Some((why, started.elapsed()))))
            }
            Ok(Err(_)) => Err((held, started.elapsed())),
            Err(_) => {
                rx.close();
                match rx.try_recv() {
                    Ok(permit) => {
                        let why = permit.held;
                        Ok((permit, Some((why, started.elapsed()))))
                    }
                    Err(_) => Err((self.current_hold().unwrap_or(held), started.elapsed())),
                }
            }
        }
    }

    /// What holds the gate now, if anything.
    fn current_hold(&self) -> Option<Held> {
        let mut st = self.lock();
        let estimate = st.waiting().next().map_or(0, |(_, w)| w.estimate);
        st.blocked(estimate, Instant::now()).map(|(h, _)| h)
    }

    /// Lets waiters through while there is room: (`Some(t)`: look again at `t`; the reason the
    /// next one is held, if one is).
    fn dispatch(self: &Arc<Self>, st: &mut State, now: Instant) -> (Option<Instant>, Option<(Held, Option<Instant>)>) {
        loop {
            let Some(p) = st.next_level() else { return (None, None) };
            let Some(estimate) = st.levels.get_mut(&p).and_then(Level::front).map(|w| w.estimate) else { continue };
            if let Some(blocked) = st.blocked(estimate, now) {
                return (blocked.1, Some(blocked));
            }
            let Some(waiter) = st.levels.get_mut(&p).and_then(Level::pop) else { continue };
            let top = st.levels.keys().next_back().copied();
            st.top_in_a_row = if top == Some(p) && st.levels.len() > 1 { st.top_in_a_row + 1 } else { 0 };
            st.take(waiter.estimate);
            let permit = Permit { gate: self.clone(), estimate: waiter.estimate, used: None, armed: true, held: waiter.held };
            if let Err(mut permit) = waiter.tx.send(permit) {
                // Gone meanwhile: its room is given back here, under the lock already held.
                permit.armed = false;
                st.give_back(waiter.estimate, Some(0));
            }
        }
    }

    fn ensure_ticker(self: &Arc<Self>) {
        if self.ticking.swap(true, Ordering::SeqCst) {
            return;
        }
        let (gate, wake, flag) = (Arc::downgrade(self), self.wake.clone(), Ticking(self.ticking.clone()));
        tokio::spawn(tick(gate, wake, flag));
    }

    /// A 429 came: every call of this model pauses for the wait it named, or for the backoff of
    /// the 429s in a row, at most the gate's longest pause; the fleet is told, and the log. A
    /// named wait longer than that longest pause is [`Pause::refused`]: its call fails.
    pub fn rate_limited(&self, hint: Option<Wait>) -> Pause {
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
        let pause = {
            let mut st = self.lock();
            let max = st.max_pause;
            let pause = match hint {
                Some(w) => Pause { length: w.after.min(max), refused: (w.after > max).then_some(w) },
                None => {
                    let b = st.backoff.min(max);
                    st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                    Pause { length: b, refused: None }
                }
            };
            Self::pause_locked(&mut st, pause.length);
            pause
        };
        let from = hint.map_or("no hint: backoff of the 429s in a row", |w| w.from);
        let stated_s = hint.map(|w| w.after.as_secs_f64());
        tracing::warn!(model = %self.key, pause_s = pause.length.as_secs_f64(), from, stated_s, refused = pause.refused.is_some(), "a provider's 429 pauses every call of this model");
        if let Some(tx) = &self.pauses
            && !pause.length.is_zero()
        {
            let _ = tx.send((self.key.clone(), pause.length));
        }
        self.wake.notify_one();
        pause
    }

    /// Whether a 429's pause holds every call of this model now (one lock, no status built).
    pub fn is_paused(&self) -> bool {
        self.lock().paused_until.is_some_and(|u| u > Instant::now())
    }

    /// The longest pause a 429 puts on this model.
    pub fn max_pause(&self) -> Duration {
        self.lock().max_pause
    }

    fn pause_locked(st: &mut State, pause: Duration) {
        let until = Instant::now() + pause;
        st.paused_until = Some(st.paused_until.map_or(until, |u| u.max(until)));
        for level in st.levels.values_mut() {
            for w in level.queues.values_mut().flat_map(|q| q.iter_mut()) {
                w.held = Held::Paused;
            }
        }
    }

    /// A pause another replica of the fleet was told of: `remaining` from now.
    pub fn pause_from_fleet(&self, remaining: Duration) {
        let mut st = self.lock();
        let max = st.max_pause;
        Self::pause_locked(&mut st, remaining.min(max));
        drop(st);
        self.wake.notify_one();
    }

    /// A reply came: the backoff of 429s in a row starts again.
    pub fn succeeded(&self) {
        self.lock().backoff = FIRST_BACKOFF;
    }

    /// The units of the fleet's budget this replica may use now (`None`: all of the limits).
    pub fn set_granted(&self, granted: Option<u32>) {
        let mut st = self.lock();
        if st.granted != granted {
            st.granted = granted;
            st.rates(Instant::now());
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Holds this replica to at most `units` of the fleet's budget at once (a grant about to be
    /// lowered in the store); returns the calls in flight then.
    pub fn lower_to(&self, units: u32) -> u32 {
        let mut st = self.lock();
        let lowered = st.granted.map_or(units, |g| g.min(units));
        if st.granted != Some(lowered) {
            st.granted = Some(lowered);
            st.rates(Instant::now());
        }
        st.in_flight
    }

    /// (calls waiting and in flight, calls in flight, the budget's units) for the fleet.
    pub fn demand(&self) -> (u32, u32, u32) {
        let mut st = self.lock();
        let waiting = st.waiting().filter(|(_, w)| !w.tx.is_closed()).count() as u32;
        (waiting + st.in_flight, st.in_flight, st.units())
    }

    pub fn status(&self) -> GateStatus {
        let mut st = self.lock();
        let mut waiting = BTreeMap::new();
        for (route, w) in st.waiting() {
            if !w.tx.is_closed() {
                *waiting.entry(route.to_string()).or_insert(0) += 1;
            }
        }
        let now = Instant::now();
        GateStatus {
            key: self.key.clone(),
            limits: st.limits,
            in_flight: st.in_flight,
            waiting,
            share: st.fraction(),
            granted: st.granted.map(|g| (g, st.units())),
            paused_for: st.paused_until.filter(|u| *u > now).map(|u| u - now),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
        }
    }
}

/// The ticker of a gate: lets waiters through whenever room may have come.
async fn tick(gate: Weak<Gate>, wake: Arc<Notify>, _flag: Ticking) {
    loop {
        let next = {
            let Some(gate) = gate.upgrade() else { return };
            let mut st = gate.lock();
            gate.dispatch(&mut st, Instant::now()).0
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
