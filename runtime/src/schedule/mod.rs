//! Scheduled runs (issue 50), the pure core: a schedule's timing parsed once ([`Timing`]: its
//! [`CronSpec`], IANA [`Zone`], [`Overlap`] and [`Catchup`] policies), its fire times under the
//! daylight-saving rules ([`cron`]), and [`plan`], what to do with the fires that are due at a
//! time given the schedule's live run: start, skip, buffer, cancel the live run, or record them
//! `missed` with why. No I/O and no clock of its own: the time is an argument ([`Clock`] is
//! what the service reads it from, and what tests replace).
//!
//! The store keeps schedules and their fire records; the service's `schedules` loop asks
//! [`plan`] and starts each fire's run through the same path as `POST /v1/runs`.

pub mod cron;
pub mod plan;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::{DateTime, Utc};

pub use cron::{CronError, CronSpec};
pub use plan::{Decision, Fire, Live, MissedWhy, Plan, plan};

/// The longest `catchup_window`.
pub const MAX_CATCHUP_WINDOW: Duration = Duration::from_secs(366 * 86_400);
/// The default `catchup_window`.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(86_400);
/// The most `max_catchup_runs`.
pub const MAX_CATCHUP_RUNS: u32 = 100;

/// An IANA time zone (`Europe/Berlin`; `UTC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone(chrono_tz::Tz);

impl Zone {
    pub fn utc() -> Zone {
        Zone(chrono_tz::Tz::UTC)
    }

    /// The zone an IANA name names (as the database spells it; `UTC`).
    pub fn parse(name: &str) -> Result<Zone, TimingError> {
        name.parse::<chrono_tz::Tz>().map(Zone).map_err(|_| TimingError::UnknownZone(name.chars().take(64).collect()))
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    pub(crate) fn tz(&self) -> chrono_tz::Tz {
        self.0
    }
}

/// What a fire does while the schedule's last run is still live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// No new run: the fire is recorded `skipped`.
    #[default]
    Skip,
    /// One fire waits (`buffered`) and starts when the live run ends; a fire while one waits is
    /// skipped.
    BufferOne,
    /// A new run beside the live one.
    AllowAll,
    /// The live run is cancelled, then the new one starts.
    CancelOther,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::AllowAll => "allow_all",
            Overlap::CancelOther => "cancel_other",
        }
    }

    pub fn parse(s: &str) -> Option<Overlap> {
        [Overlap::Skip, Overlap::BufferOne, Overlap::AllowAll, Overlap::CancelOther].into_iter().find(|o| o.as_str() == s)
    }
}

/// What happens to the fires that no replica started in time (an outage of the fleet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Catchup {
    /// None of them runs: each is recorded `missed`; the next fire runs as usual.
    #[default]
    None,
    /// One run, for the latest of them within `window`.
    Latest { window: Duration },
    /// The latest `max_runs` of them within `window`, never more, however long the outage.
    All { window: Duration, max_runs: u32 },
}

impl Catchup {
    /// The policy a schedule names: `none`, `latest` or `all`, with its window and bound
    /// (defaults: a day, 1 run); a bound of 0 or over [`MAX_CATCHUP_RUNS`], or a window over a
    /// year, is refused.
    pub fn parse(name: &str, window: Option<Duration>, max_runs: Option<u32>) -> Result<Catchup, TimingError> {
        let window = window.unwrap_or(DEFAULT_CATCHUP_WINDOW);
        if window.is_zero() || window > MAX_CATCHUP_WINDOW {
            return Err(TimingError::Window);
        }
        let max_runs = max_runs.unwrap_or(1);
        if !(1..=MAX_CATCHUP_RUNS).contains(&max_runs) {
            return Err(TimingError::MaxRuns(max_runs));
        }
        match name {
            "none" => Ok(Catchup::None),
            "latest" => Ok(Catchup::Latest { window }),
            "all" => Ok(Catchup::All { window, max_runs }),
            _ => Err(TimingError::Catchup(name.chars().take(64).collect())),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Catchup::None => "none",
            Catchup::Latest { .. } => "latest",
            Catchup::All { .. } => "all",
        }
    }

    /// The window (none's is the grace a fire has to be on time).
    pub fn window(&self) -> Duration {
        match self {
            Catchup::None => plan::GRACE,
            Catchup::Latest { window } | Catchup::All { window, .. } => *window,
        }
    }

    /// How many fires of a catch-up run at most.
    pub fn max_runs(&self) -> u32 {
        match self {
            Catchup::None => 0,
            Catchup::Latest { .. } => 1,
            Catchup::All { max_runs, .. } => *max_runs,
        }
    }
}

/// A schedule's timing and policies, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub cron: CronSpec,
    pub zone: Zone,
    pub overlap: Overlap,
    pub catchup: Catchup,
}

impl Timing {
    /// The first fire strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.next_after(self.zone, after)
    }
}

/// Why a schedule's timing or policy is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error("`cron`: {0}")]
    Cron(#[from] CronError),
    #[error("`timezone`: `{0}` is not an IANA time zone (such as `Europe/Berlin` or `UTC`)")]
    UnknownZone(String),
    #[error("`overlap`: `{0}` is not one of skip, buffer_one, allow_all, cancel_other")]
    Overlap(String),
    #[error("`catchup`: `{0}` is not one of none, latest, all")]
    Catchup(String),
    #[error("`catchup_window`: from 1 s to 366 days")]
    Window,
    #[error("`max_catchup_runs`: {0} is not from 1 to 100")]
    MaxRuns(u32),
}

/// Where the time comes from: the system's clock in the service, a hand-moved one in tests.
pub trait Clock: std::fmt::Debug + Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        system_now()
    }
}

pub(crate) fn system_now() -> DateTime<Utc> {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default()
}

/// A fire time as stored and as a run's idempotency key names it: RFC 3339 in UTC, to the
/// second (`2026-03-29T01:00:00Z`).
pub fn fire_time_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The idempotency key of a fire's run: `schedule:{id}:{fire_time}`.
pub fn fire_key(schedule_id: &str, t: DateTime<Utc>) -> String {
    format!("schedule:{schedule_id}:{}", fire_time_text(t))
}
