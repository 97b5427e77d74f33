//! The replica's `schedules` loop (issue 50): every [`TICK`], the schedules that are due are
//! planned ([`crate::schedule::plan`]) and their fires decided in the store once across the fleet
//! (the cursor's compare-and-set); each fire to start is started through the same path as `POST
//! /v1/runs` ([`runs::begin_run`]) with the idempotency key `schedule:{id}:{fire_time}`. The
//! starts a dead replica claimed, the CLI's triggers and the buffered fires whose live run ended
//! are started here too. The time of a look is an argument ([`AppState::schedule_tick`]): the
//! loop reads the system clock, tests move their own. A schedule whose route no replica knows a
//! minute after its fire time (it left the catalogue) is paused with the reason; a replica leaves
//! the fires of another fleet's routes to that fleet. A start refused for want of room is tried
//! again after its claim. The fires are counted for `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::*;
use crate::runtime::ScheduleDef;
use crate::schedule::{Clock, Decision, Live as LiveRuns, SystemClock, fire_time_text, plan};
use crate::store::schedules::{FireEnd, NewFire, StoredSchedule};

/// How often a replica looks at the schedules: a fire starts within this of its time (and the
/// time its start takes) while a replica is up.
pub const TICK: Duration = Duration::from_millis(200);
/// How long a replica holds a fire it is starting; past it, another replica starts it.
const CLAIM_MS: i64 = 10_000;
/// The most schedules (and fires) one look handles; the rest at the next.
const BATCH: usize = 100;
/// How long after its fire time a schedule whose route no replica knows is paused.
const UNKNOWN_ROUTE_GRACE_MS: i64 = 60_000;

/// A fire to start.
struct ToStart {
    schedule_id: String,
    fire_ms: i64,
    fire_time: String,
    /// `cancel_other`: the live run to cancel first.
    cancel: Option<String>,
}

/// The lag buckets of `fabric_schedule_lag_seconds`.
const LAG_BUCKETS: [f64; 8] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// The fires this replica decided, by outcome, and the lag of the runs it started.
#[derive(Debug, Default)]
pub struct FireCounts {
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// Per bucket, then the count and the sum.
    lag: Mutex<([u64; LAG_BUCKETS.len()], u64, f64)>,
    /// The store failed the loop's last look: its errors are logged once per change of state.
    failing: std::sync::atomic::AtomicBool,
    /// The store failed the look going on.
    troubled: std::sync::atomic::AtomicBool,
}

impl FireCounts {
    /// A store failure of the loop: logged when the loop starts failing, not at every look.
    fn trouble(&self, what: &str, e: &dyn std::fmt::Display) {
        self.troubled.store(true, std::sync::atomic::Ordering::Relaxed);
        if !self.failing.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(error = %e, "schedules: {what} (logged once until the store answers again)");
        } else {
            tracing::debug!(error = %e, "schedules: {what}");
        }
    }

    /// A look begins.
    fn look(&self) {
        self.troubled.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// A look ended: without a failure, the store answers again.
    fn looked(&self) {
        if !self.troubled.load(std::sync::atomic::Ordering::Relaxed) && self.failing.swap(false, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!("schedules: the store answers again");
        }
    }

    fn count(&self, outcome: &'static str) {
        *self.outcomes.lock().unwrap_or_else(|p| p.into_inner()).entry(outcome).or_default() += 1;
    }

    fn started(&self, lag_s: f64) {
        self.count("started");
        let mut lag = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        for (i, b) in LAG_BUCKETS.iter().enumerate() {
            if lag_s <= *b {
                lag.0[i] += 1;
            }
        }
        lag.1 += 1;
        lag.2 += lag_s;
    }

    /// The Prometheus lines.
    pub(super) fn render(&self, out: &mut String) {
        out.push_str("# HELP fabric_schedule_fires_total Fire times of schedules this replica decided or started, by outcome (started, skipped, buffered, missed, failed).\n# TYPE fabric_schedule_fires_total counter\n");
        for (outcome, n) in self.outcomes.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.push_str(&format!("fabric_schedule_fires_total{{outcome=\"{outcome}\"}} {n}\n"));
        }
        out.push_str(
            "# HELP fabric_schedule_lag_seconds How long after its fire time a scheduled run was started.\n# TYPE fabric_schedule_lag_seconds histogram\n",
        );
        let lag = self.lag.lock().unwrap_or_else(|p| p.into_inner());
        for (b, n) in LAG_BUCKETS.iter().zip(lag.0) {
            out.push_str(&format!("fabric_schedule_lag_seconds_bucket{{le=\"{b}\"}} {n}\n"));
        }
        out.push_str(&format!(
            "fabric_schedule_lag_seconds_bucket{{le=\"+Inf\"}} {}\nfabric_schedule_lag_seconds_sum {}\nfabric_schedule_lag_seconds_count {}\n",
            lag.1, lag.2, lag.1
        ));
    }
}

impl AppState {
    /// For ever, until a shutdown begins: one look at the schedules every [`TICK`]. Returns at
    /// once on a store without schedules.
    pub async fn fire_schedules(self) {
        if self.inner.durable.store().schedules().is_none() {
            return;
        }
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            self.schedule_tick(SystemClock.now()).await;
        }
    }

    /// One look at the schedules at `now`: the due fires decided, and every fire to start
    /// started (awaited); how many runs it started.
    pub async fn schedule_tick(&self, now: DateTime<Utc>) -> usize {
        let Ok(store) = self.inner.durable.schedule_store() else { return 0 };
        // While the store takes no writes (its health says so at once), nothing can be decided.
        if self.inner.durable.store().health().is_err() {
            return 0;
        }
        let now_ms = now.timestamp_millis();
        self.inner.fires.look();
        let mut starts = Vec::new();
        match store.due_schedules(now_ms, BATCH).await {
            // Each schedule's decision at once: a hundred due at the top of the hour start within the second.
            Ok(due) => starts.extend(futures_util::future::join_all(due.into_iter().map(|s| self.decide(s, now))).await.into_iter().flatten()),
            Err(e) => self.inner.fires.trouble("reading the due schedules", &e),
        }
        match store.buffered_fires(BATCH).await {
            Ok(buffered) => {
                for f in buffered {
                    let live = match store.get_schedule(&f.schedule_id).await {
                        Ok(Some(s)) => self.live_run(s.last_run_id.as_deref()).await,
                        _ => continue,
                    };
                    if live.is_none() && store.unbuffer(&f.schedule_id, f.fire_ms, now_ms + CLAIM_MS).await.unwrap_or(false) {
                        starts.push(ToStart { schedule_id: f.schedule_id, fire_ms: f.fire_ms, fire_time: f.fire_time, cancel: None });
                    }
                }
            }
            Err(e) => self.inner.fires.trouble("reading the buffered fires", &e),
        }
        match store.claim_starts(now_ms, now_ms + CLAIM_MS, BATCH).await {
            Ok(claimed) => {
                starts.extend(claimed.into_iter().map(|f| ToStart { schedule_id: f.schedule_id, fire_ms: f.fire_ms, fire_time: f.fire_time, cancel: None }))
            }
            Err(e) => self.inner.fires.trouble("claiming fires to start", &e),
        }
        let started = futures_util::future::join_all(starts.into_iter().map(|s| self.start_fire(s, now))).await.into_iter().filter(|s| *s).count();
        self.inner.fires.looked();
        started
    }

    /// The schedule's last run, when it is still live (queued, running, or awaiting input).
    async fn live_run(&self, run_id: Option<&str>) -> Option<String> {
        let run = self.inner.durable.store().get_run(run_id?).await.ok()??;
        (run.status.is_pending() || run.status == StoredStatus::AwaitingInput).then_some(run.run_id)
    }

    /// Plans a due schedule's fires and records them (if no other replica did first); the fires
    /// to start.
    async fn decide(&self, s: StoredSchedule, now: DateTime<Utc>) -> Vec<ToStart> {
        let durable = &self.inner.durable;
        let Ok(store) = durable.schedule_store() else { return Vec::new() };
        let (id, cursor_ms) = (s.id.clone(), s.next_fire_ms.unwrap_or(i64::MAX));
        let def: ScheduleDef = match serde_json::from_value(s.body.clone()) {
            Ok(def) => def,
            Err(e) => return self.pause(s, &format!("its stored definition does not read: {e}")).await,
        };
        let edition = durable.runtime().current();
        match edition.check_route(&def.route_id) {
            // A route of another fleet: its replicas decide its fires.
            Err(StartError::WrongFleet { .. }) => return Vec::new(),
            // Unknown here: a replica on a newer catalogue (a rolling deploy) decides its fires;
            // when none did within a minute of its time, the route left the catalogue.
            Err(StartError::UnknownRoute { .. }) if now.timestamp_millis() - cursor_ms < UNKNOWN_ROUTE_GRACE_MS => return Vec::new(),
            Err(StartError::UnknownRoute { .. }) => {
                let why = format!("route `{}` is not in the catalogue (paused by the service; resume it once the route is back)", def.route_id);
                return self.pause(s, &why).await;
            }
            // A broken route or the like: each fire records why it did not start.
            _ => {}
        }
        let timing = match def.timing() {
            Ok(t) => t,
            Err(e) => return self.pause(s, &e.to_string()).await,
        };
        let live = match timing.overlap {
            crate::schedule::Overlap::AllowAll => LiveRuns::default(),
            overlap => {
                let recent = store.fires(&id, 20).await.unwrap_or_default();
                let buffered = recent.iter().any(|f| f.outcome == "buffered");
                // A fire another replica is starting now is a live run too (not yet recorded), but
                // for `cancel_other`, which needs a run to cancel.
                let starting = recent.iter().find(|f| f.outcome == "starting").filter(|_| overlap != crate::schedule::Overlap::CancelOther);
                let run = match self.live_run(s.last_run_id.as_deref()).await {
                    Some(run) => Some(run),
                    None => starting.map(|f| format!("of the fire at {}, being started,", f.fire_time)),
                };
                LiveRuns { run, buffered }
            }
        };
        let Some(cursor) = DateTime::from_timestamp_millis(cursor_ms) else { return Vec::new() };
        let planned = plan(&timing, Some(cursor), now, &live);
        let starting = |d: &Decision| matches!(d, Decision::Start | Decision::CancelAndStart { .. });
        let fires: Vec<NewFire> = planned
            .fires
            .iter()
            .map(|f| NewFire {
                fire_ms: f.at.timestamp_millis(),
                fire_time: fire_time_text(f.at),
                outcome: if starting(&f.decision) { "starting" } else { f.decision.outcome() },
                why: f.decision.why(),
                manual: false,
                claim_until: if starting(&f.decision) { now.timestamp_millis() + CLAIM_MS } else { 0 },
            })
            .collect();
        match store.decide(&id, cursor_ms, planned.next.map(|t| t.timestamp_millis()), &fires).await {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(e) => {
                self.inner.fires.trouble("recording fires", &e);
                return Vec::new();
            }
        }
        let mut out = Vec::new();
        for (f, new) in planned.fires.into_iter().zip(fires) {
            match f.decision {
                Decision::Start => out.push(ToStart { schedule_id: id.clone(), fire_ms: new.fire_ms, fire_time: new.fire_time, cancel: None }),
                Decision::CancelAndStart { cancel } => {
                    out.push(ToStart { schedule_id: id.clone(), fire_ms: new.fire_ms, fire_time: new.fire_time, cancel: Some(cancel) })
                }
                other => {
                    tracing::info!(schedule = id, fire_time = new.fire_time, outcome = other.outcome(), why = new.why, "schedule fire not run");
                    self.inner.fires.count(other.outcome());
                }
            }
        }
        out
    }

    async fn pause(&self, s: StoredSchedule, why: &str) -> Vec<ToStart> {
        tracing::warn!(schedule = s.id, why, "schedules: a schedule paused");
        if let Err(e) = self.inner.durable.pause_schedule(s, why).await {
            self.inner.fires.trouble("pausing a schedule", &e);
        }
        Vec::new()
    }

    /// Starts a fire's run (cancelling the live one first under `cancel_other`) and records it;
    /// whether a run started.
    async fn start_fire(&self, f: ToStart, now: DateTime<Utc>) -> bool {
        let durable = &self.inner.durable;
        let Ok(store) = durable.schedule_store() else { return false };
        let def = match store.get_schedule(&f.schedule_id).await {
            Ok(Some(s)) => serde_json::from_value::<ScheduleDef>(s.body).ok(),
            // Deleted meanwhile: nothing to start.
            Ok(None) => return false,
            Err(e) => {
                self.inner.fires.trouble("reading a schedule to start its fire", &e);
                return false;
            }
        };
        if let Some(old) = &f.cancel
            && let Err(e) = cancel::cancel_here(self, old, Some("cancelled by the next fire of its schedule (overlap `cancel_other`)")).await
        {
            tracing::warn!(run_id = old, error = %e, "schedules: cancelling the live run of a schedule");
        }
        let begun = match (def, IdempotencyKey::parse(&format!("schedule:{}:{}", f.schedule_id, f.fire_time))) {
            (Some(def), Ok(key)) => match runs::begin_run(self, def.start(), Some(&key)).await {
                // No room now (the fleet's queue is full, the store cannot take writes): the fire
                // stays `starting`, and a replica starts it when its claim ends.
                Err(e) if matches!(e.code, ErrorCode::TooManyRuns | ErrorCode::StoreUnavailable | ErrorCode::StoreError) => {
                    tracing::warn!(
                        schedule = f.schedule_id,
                        fire_time = f.fire_time,
                        why = e.message,
                        "schedules: a fire's run could not start now; it is tried again"
                    );
                    return false;
                }
                begun => begun.map_err(|e| e.message),
            },
            (None, _) => Err("its stored definition does not read".to_owned()),
            (_, Err(e)) => Err(format!("its idempotency key: {e}")),
        };
        let run_id = match begun {
            Ok(Begun::New { run_id, .. }) => run_id,
            Ok(Begun::Replayed(run)) => run.run_id,
            Err(why) => {
                tracing::warn!(schedule = f.schedule_id, fire_time = f.fire_time, why, "schedules: a fire's run was refused");
                self.inner.fires.count("failed");
                if let Err(e) = store.record_fire(&f.schedule_id, f.fire_ms, FireEnd::Failed { why: &why }).await {
                    self.inner.fires.trouble("recording a failed fire", &e);
                }
                return false;
            }
        };
        let lag_ms = (now.timestamp_millis() - f.fire_ms).max(0);
        self.inner.fires.started(lag_ms as f64 / 1000.0);
        if let Err(e) = store.record_fire(&f.schedule_id, f.fire_ms, FireEnd::Started { run_id: &run_id, lag_ms }).await {
            // The run is there under its key: a replica that claims the fire again finds it.
            self.inner.fires.trouble("recording a started fire", &e);
        }
        true
    }
}
