//! Scheduled runs through the facade (issue 50): a schedule's definition ([`ScheduleDef`], what
//! clients send and the store keeps) checked like a start (route, goal against its schema,
//! profile, webhook URL) and its timing parsed ([`crate::schedule::Timing`]) before it is
//! stored; the reads, the changes (pause, resume, a new definition), a fire now (`trigger`).
//! Shared by the service, the CLI and Python; the service's `schedules` loop fires them.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::{AcceptError, Durable, StartRequest};
use crate::schedule::{Catchup, CronSpec, Overlap, Timing, TimingError, Zone, fire_time_text};
use crate::store::StoreError;
use crate::store::schedules::{FireRecord, NewFire, ScheduleStore, StoredSchedule};

/// A schedule's definition: the start contract of each fire's run and when it fires.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDef {
    pub route_id: String,
    /// A JSON object, checked against the route's `goal_schema`.
    #[schema(value_type = Object)]
    pub goal: Map<String, Value>,
    #[serde(default = "default_profile")]
    pub model_profile: String,
    /// 5 fields (minute hour day-of-month month day-of-week) or 6 (a second first); `@daily` and
    /// the like.
    pub cron: String,
    /// An IANA time zone the expression is read in.
    #[serde(default = "utc")]
    pub timezone: String,
    #[serde(default)]
    pub overlap: Overlap,
    /// `none`, `latest` or `all`.
    #[serde(default = "no_catchup")]
    pub catchup: String,
    /// How old a missed fire may be and still run (`30m`, `6h`, `2d`); default a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_window: Option<String>,
    /// With `catchup: all`: the most missed fires that run (1 to 100; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_catchup_runs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
}

fn default_profile() -> String {
    "default".into()
}

fn utc() -> String {
    "UTC".into()
}

fn no_catchup() -> String {
    "none".into()
}

impl ScheduleDef {
    /// Its timing and policies, parsed.
    pub fn timing(&self) -> Result<Timing, TimingError> {
        let window = match &self.catchup_window {
            Some(w) => Some(humantime::parse_duration(w).map_err(|_| TimingError::Window)?),
            None => None,
        };
        Ok(Timing {
            cron: CronSpec::parse(&self.cron)?,
            zone: Zone::parse(&self.timezone)?,
            overlap: self.overlap,
            catchup: Catchup::parse(&self.catchup, window, self.max_catchup_runs)?,
        })
    }

    /// The start contract of each fire's run.
    pub fn start(&self) -> StartRequest {
        StartRequest {
            route_id: self.route_id.clone(),
            goal: self.goal.clone(),
            model_profile: Some(self.model_profile.clone()),
            session_id: self.session_id.clone(),
            webhook_url: self.webhook_url.clone(),
            ..StartRequest::default()
        }
    }
}

/// Why a schedule is refused or not found.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(transparent)]
    Timing(#[from] TimingError),
    #[error(transparent)]
    Start(#[from] AcceptError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the definition does not read: {0}")]
    Definition(String),
    #[error("this run store keeps no schedules")]
    NoSchedules,
    #[error("no schedule `{0}`")]
    NotFound(String),
}

/// A schedule as the API, the CLI and Python show it: its definition, state and next fires.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct ScheduleView {
    pub id: String,
    #[serde(flatten)]
    pub def: ScheduleDef,
    pub paused: bool,
    /// Why the service paused it (its route left the catalogue), when it did.
    pub paused_reason: Option<String>,
    /// `api`, or `catalogue` (declared by its route).
    pub origin: String,
    /// Its next fire times (RFC 3339, UTC): the first not decided yet, then the two after it.
    pub next_fires: Vec<String>,
    pub last_run_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl ScheduleView {
    /// The view of a stored schedule (its definition read back typed).
    pub fn of(s: StoredSchedule) -> Result<ScheduleView, ScheduleError> {
        let def: ScheduleDef = serde_json::from_value(s.body).map_err(|e| ScheduleError::Definition(e.to_string()))?;
        let mut next_fires = Vec::new();
        if let (Some(ms), Ok(timing)) = (s.next_fire_ms, def.timing()) {
            let mut at = DateTime::from_timestamp_millis(ms);
            while let Some(t) = at.filter(|_| next_fires.len() < 3) {
                next_fires.push(fire_time_text(t));
                at = timing.next_after(t);
            }
        }
        Ok(ScheduleView {
            id: s.id,
            def,
            paused: s.paused,
            paused_reason: s.paused_reason,
            origin: s.origin,
            next_fires,
            last_run_id: s.last_run_id,
            created_at: s.created_at,
            updated_at: s.updated_at,
        })
    }
}

/// The longest schedule id a client may name.
const MAX_ID: usize = 200;

impl Durable {
    /// The store's schedules.
    pub fn schedule_store(&self) -> Result<&dyn ScheduleStore, ScheduleError> {
        self.store.schedules().ok_or(ScheduleError::NoSchedules)
    }

    /// Every check of a schedule's definition: its timing, and its start contract as a start's.
    pub fn check_schedule(&self, def: &ScheduleDef) -> Result<Timing, ScheduleError> {
        let timing = def.timing()?;
        self.check_start(&def.start(), &self.runtime.current())?;
        Ok(timing)
    }

    /// Stores a new schedule (`id`, or a new one), checked; it fires from `now` on.
    pub async fn create_schedule(
        &self,
        id: Option<&str>,
        def: &ScheduleDef,
        paused: bool,
        origin: &str,
        now: DateTime<Utc>,
    ) -> Result<ScheduleView, ScheduleError> {
        let timing = self.check_schedule(def)?;
        let id = match id {
            Some(id) if id.is_empty() || id.len() > MAX_ID || id.contains('\0') => {
                return Err(ScheduleError::Definition("a schedule id is 1 to 200 bytes".into()));
            }
            Some(id) => id.to_owned(),
            None => format!("sch_{}", uuid::Uuid::now_v7().simple()),
        };
        let row = StoredSchedule {
            id: id.clone(),
            route_id: def.route_id.clone(),
            body: serde_json::to_value(def).map_err(|e| ScheduleError::Definition(e.to_string()))?,
            origin: origin.to_owned(),
            paused,
            paused_reason: None,
            next_fire_ms: timing.next_after(now).map(|t| t.timestamp_millis()),
            last_run_id: None,
            created_at: String::new(),
            updated_at: String::new(),
        };
        if !self.schedule_store()?.create_schedule(&row).await? {
            return Err(ScheduleError::Definition(format!("schedule `{id}` exists already")));
        }
        self.schedule(&id).await
    }

    /// A stored schedule.
    pub async fn stored_schedule(&self, id: &str) -> Result<StoredSchedule, ScheduleError> {
        self.schedule_store()?.get_schedule(id).await?.ok_or_else(|| ScheduleError::NotFound(id.chars().take(MAX_ID).collect()))
    }

    pub async fn schedule(&self, id: &str) -> Result<ScheduleView, ScheduleError> {
        ScheduleView::of(self.stored_schedule(id).await?)
    }

    /// Every schedule, by id (a row whose definition does not read is left out, and logged).
    pub async fn schedules(&self, limit: usize) -> Result<Vec<ScheduleView>, ScheduleError> {
        let rows = self.schedule_store()?.list_schedules(limit).await?;
        Ok(rows.into_iter().filter_map(|s| ScheduleView::of(s).inspect_err(|e| tracing::error!(error = %e, "a stored schedule")).ok()).collect())
    }

    /// Changes a schedule: `patch` is a JSON object of the definition's fields to replace, and
    /// `paused`. A new expression or zone, or a resume, fires from `now` on (the fires of a pause
    /// are not caught up).
    pub async fn patch_schedule(&self, id: &str, patch: &Map<String, Value>, now: DateTime<Utc>) -> Result<ScheduleView, ScheduleError> {
        let mut row = self.stored_schedule(id).await?;
        let old: ScheduleDef = serde_json::from_value(row.body.clone()).map_err(|e| ScheduleError::Definition(e.to_string()))?;
        let mut body = row.body.as_object().cloned().unwrap_or_default();
        let mut paused = row.paused;
        for (k, v) in patch {
            match (k.as_str(), v) {
                ("paused", Value::Bool(p)) => paused = *p,
                ("paused", _) => return Err(ScheduleError::Definition("`paused` is true or false".into())),
                (_, Value::Null) => drop(body.remove(k)),
                _ => drop(body.insert(k.clone(), v.clone())),
            }
        }
        let def: ScheduleDef = serde_json::from_value(Value::Object(body)).map_err(|e| ScheduleError::Definition(e.to_string()))?;
        let timing = self.check_schedule(&def)?;
        if def.cron != old.cron || def.timezone != old.timezone || (row.paused && !paused) {
            row.next_fire_ms = timing.next_after(now).map(|t| t.timestamp_millis());
        }
        if !paused {
            row.paused_reason = None;
        }
        row.body = serde_json::to_value(&def).map_err(|e| ScheduleError::Definition(e.to_string()))?;
        row.route_id = def.route_id;
        row.paused = paused;
        if !self.schedule_store()?.update_schedule(&row).await? {
            return Err(ScheduleError::NotFound(id.to_owned()));
        }
        self.schedule(id).await
    }

    /// Pauses a schedule the service cannot fire (its route left the catalogue), saying why.
    pub async fn pause_schedule(&self, mut row: StoredSchedule, reason: &str) -> Result<(), ScheduleError> {
        row.paused = true;
        row.paused_reason = Some(reason.to_owned());
        self.schedule_store()?.update_schedule(&row).await?;
        Ok(())
    }

    pub async fn delete_schedule(&self, id: &str) -> Result<(), ScheduleError> {
        match self.schedule_store()?.delete_schedule(id).await? {
            true => Ok(()),
            false => Err(ScheduleError::NotFound(id.chars().take(MAX_ID).collect())),
        }
    }

    /// Fires a schedule now, whatever its expression and even paused: a `starting` fire at `now`
    /// that a replica of the fleet starts at once (the same path as a fire whose replica died).
    pub async fn trigger_schedule(&self, id: &str, now: DateTime<Utc>) -> Result<FireRecord, ScheduleError> {
        let row = self.stored_schedule(id).await?;
        let def: ScheduleDef = serde_json::from_value(row.body).map_err(|e| ScheduleError::Definition(e.to_string()))?;
        self.check_schedule(&def)?;
        let store = self.schedule_store()?;
        // To the millisecond: a fire time (and run key) of its own, apart from the expression's.
        let at = now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let fire = NewFire { fire_ms: now.timestamp_millis(), fire_time: at, outcome: "starting", why: None, manual: true, claim_until: 0 };
        if !store.add_fire(id, &fire).await? {
            return Err(ScheduleError::Definition("a fire of this schedule at this very millisecond exists already; trigger again".into()));
        }
        let fires = store.fires(id, 50).await?;
        fires.into_iter().find(|f| f.fire_ms == fire.fire_ms).ok_or_else(|| ScheduleError::NotFound(id.to_owned()))
    }

    /// A schedule's fire records, newest first.
    pub async fn schedule_fires(&self, id: &str, limit: usize) -> Result<Vec<FireRecord>, ScheduleError> {
        self.stored_schedule(id).await?;
        Ok(self.schedule_store()?.fires(id, limit).await?)
    }
}
