//! What to do at a time with the fires of a schedule that are due ([`plan`]): a pure function of
//! the schedule's [`Timing`], its cursor (the first fire not decided yet), the time and its live
//! run ([`Live`]), returning one typed [`Decision`] per fire time and the next cursor.
//!
//! First the catch-up policy chooses which due fires may run (`none`: those found within
//! [`GRACE`] of their time; `latest`: the newest within the window; `all`: the newest
//! `max_runs` within the window); every other one is `missed`, with why. Then the overlap policy
//! decides each chosen fire in order against the live run (and the runs started before it in
//! the same plan): start, skip, buffer one, or cancel the live run and start.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Catchup, Overlap, Timing};

/// A fire found this long after its time at most is on time (the service looks every 200 ms);
/// later, it was missed by the fleet, and the catch-up policy decides.
pub const GRACE: Duration = Duration::from_secs(10);
/// The most fires one plan looks at, newest first; older ones are recorded as one `missed`
/// fire (at the cursor) that names the last of them.
pub const SCAN_LIMIT: usize = 200;

/// The schedule's runs as they are at the time of the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    /// The schedule's last run, when it is still live (queued, running, awaiting input).
    pub run: Option<String>,
    /// A fire waits for that run to end (`buffer_one`).
    pub buffered: bool,
}

/// Why a fire was not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissedWhy {
    /// Found past the grace with `catchup: none`.
    Late { lag: Duration },
    /// Older than the catch-up window.
    OutsideWindow { window: Duration },
    /// A later fire of the same catch-up ran (`latest`, or `all` past `max_runs`).
    LaterRan { max_runs: u32 },
    /// This fire and every one through `through` were too far behind to be looked at one by one.
    Behind { through: DateTime<Utc> },
}

impl std::fmt::Display for MissedWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissedWhy::Late { lag } => write!(f, "no replica started it in time (found {}s late) and `catchup` is `none`", lag.as_secs()),
            MissedWhy::OutsideWindow { window } => write!(f, "older than `catchup_window` ({}s) when a replica found it", window.as_secs()),
            MissedWhy::LaterRan { max_runs: 1 } => write!(f, "a later missed fire ran instead (one catch-up run)"),
            MissedWhy::LaterRan { max_runs } => write!(f, "later missed fires ran instead (`max_catchup_runs`: {max_runs})"),
            MissedWhy::Behind { through } => write!(
                f,
                "this fire and every one through {} were more than {SCAN_LIMIT} fires behind when a replica found them",
                super::fire_time_text(*through)
            ),
        }
    }
}

/// What one fire does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A run starts.
    Start,
    /// The live run `cancel` is cancelled, then a run starts (`cancel_other`).
    CancelAndStart { cancel: String },
    /// No run (`skip`, or `buffer_one` with a fire waiting already).
    Skip { why: String },
    /// It waits for the live run to end (`buffer_one`).
    Buffer,
    /// Not run: the catch-up policy left it out.
    Missed { why: MissedWhy },
}

impl Decision {
    /// The fire record's outcome: `started`, `skipped`, `buffered`, `missed`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Start | Decision::CancelAndStart { .. } => "started",
            Decision::Skip { .. } => "skipped",
            Decision::Buffer => "buffered",
            Decision::Missed { .. } => "missed",
        }
    }

    /// Why, for the record (none for a start).
    pub fn why(&self) -> Option<String> {
        match self {
            Decision::Start => None,
            Decision::CancelAndStart { cancel } => Some(format!("cancelled the live run {cancel} (overlap `cancel_other`)")),
            Decision::Skip { why } => Some(why.clone()),
            Decision::Buffer => Some("waits for the live run to end (overlap `buffer_one`)".into()),
            Decision::Missed { why } => Some(why.to_string()),
        }
    }
}

/// One fire time and what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    pub at: DateTime<Utc>,
    pub decision: Decision,
}

/// A plan: the decided fires, oldest first, and the next cursor (the first fire after the time;
/// `None` when the expression fires no more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub fires: Vec<Fire>,
    pub next: Option<DateTime<Utc>>,
}

/// The fires of `timing` due at `now` from `cursor` on (`cursor` included), decided.
pub fn plan(timing: &Timing, cursor: Option<DateTime<Utc>>, now: DateTime<Utc>, live: &Live) -> Plan {
    let Some(cursor) = cursor.filter(|c| *c <= now) else {
        return Plan { fires: Vec::new(), next: cursor };
    };
    let next = timing.next_after(now);
    // The due fires, newest first, up to the scan limit.
    let mut due = Vec::new();
    let mut t = timing.cron.first_from(timing.zone, now).filter(|t| *t <= now).or_else(|| timing.cron.previous_before(timing.zone, now));
    while let Some(at) = t.filter(|at| *at >= cursor) {
        if due.len() == SCAN_LIMIT {
            break;
        }
        due.push(at);
        t = timing.cron.previous_before(timing.zone, at);
    }
    let mut fires = Vec::new();
    if let Some(through) = t.filter(|at| *at >= cursor) {
        fires.push(Fire { at: cursor, decision: Decision::Missed { why: MissedWhy::Behind { through } } });
    }
    due.reverse();
    let chosen = choose(timing.catchup, &due, now);
    // `cancel_other` with several chosen: only the newest runs (each would cancel the one before).
    let newest = chosen.iter().rposition(Option::is_none).filter(|_| timing.overlap == Overlap::CancelOther);
    let mut live_run = live.run.clone();
    let mut started = false;
    let mut buffered = live.buffered;
    for (i, (at, why)) in due.iter().zip(chosen).enumerate() {
        let decision = match why {
            Some(why) => Decision::Missed { why },
            None if newest.is_some_and(|newest| i < newest) => {
                Decision::Skip { why: "a later fire of the same catch-up ran instead (overlap `cancel_other`)".into() }
            }
            None => overlap(timing.overlap, &mut live_run, &mut started, &mut buffered),
        };
        fires.push(Fire { at: *at, decision });
    }
    Plan { fires, next }
}

/// For each due fire (oldest first): `None` when the catch-up policy lets it run, else why not.
fn choose(catchup: Catchup, due: &[DateTime<Utc>], now: DateTime<Utc>) -> Vec<Option<MissedWhy>> {
    let lag = |at: &DateTime<Utc>| (now - *at).to_std().unwrap_or_default();
    let window = catchup.window();
    let in_window = due.iter().filter(|at| lag(at) <= window).count();
    let runs = match catchup {
        Catchup::None => in_window,
        _ => in_window.min(catchup.max_runs() as usize),
    };
    // The newest `runs` of those in the window run.
    let first_run = due.len().saturating_sub(runs);
    due.iter()
        .enumerate()
        .map(|(i, at)| match catchup {
            _ if i >= first_run => None,
            Catchup::None => Some(MissedWhy::Late { lag: lag(at) }),
            _ if lag(at) > window => Some(MissedWhy::OutsideWindow { window }),
            _ => Some(MissedWhy::LaterRan { max_runs: catchup.max_runs() }),
        })
        .collect()
}

/// The overlap policy's decision for a fire the catch-up policy lets run.
fn overlap(policy: Overlap, live_run: &mut Option<String>, started: &mut bool, buffered: &mut bool) -> Decision {
    let busy = live_run.is_some() || *started;
    let decision = match (policy, busy) {
        (_, false) | (Overlap::AllowAll, true) => Decision::Start,
        (Overlap::Skip, true) => Decision::Skip {
            why: match live_run {
                Some(run) => format!("the schedule's run {run} is still live (overlap `skip`)"),
                None => "a run of the same catch-up is still live (overlap `skip`)".into(),
            },
        },
        (Overlap::BufferOne, true) if !*buffered => {
            *buffered = true;
            Decision::Buffer
        }
        (Overlap::BufferOne, true) => Decision::Skip { why: "a fire waits for the live run already (overlap `buffer_one`)".into() },
        (Overlap::CancelOther, true) => match live_run.take() {
            Some(cancel) => Decision::CancelAndStart { cancel },
            None => Decision::Start,
        },
    };
    if matches!(decision, Decision::Start | Decision::CancelAndStart { .. }) {
        *started = true;
    }
    decision
}
