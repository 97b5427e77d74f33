//! Run events: one JSON object per thing that happened, in order, with a per-run `seq`.
//!
//! Every event has `type`, `run_id`, `route_id`, `seq`, `ts` and, where one applies,
//! `stage_id` and `parent_run_id`; the rest of its fields depend on the type (docs/events.md).
//! Events are serialised once, by the sink that writes them. Their fields are typed, one
//! [`EventData`] variant per type (`data`), and serialised in wire order.

mod continuing;
mod data;
mod sinks;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

pub use data::{EventData, EventKind, Tokens, ToolStatus};
pub use sinks::{FanOut, JsonLinesSink, MemorySink, NullSink};

#[derive(Debug, Clone)]
pub struct Event {
    /// `data.kind()`, which `RunEvents` sets it from: a field, so that the many readers that
    /// only filter by type need not match on `data`.
    pub kind: EventKind,
    pub run_id: Arc<str>,
    pub route_id: Arc<str>,
    pub seq: u64,
    pub ts: String,
    pub stage_id: Option<String>,
    pub parent_run_id: Option<Arc<str>>,
    pub data: EventData,
}

impl Event {
    /// Appends the event as one line of compact JSON, without building an intermediate value.
    pub fn write_json_line(&self, out: &mut Vec<u8>) {
        fn string(out: &mut Vec<u8>, s: &str) {
            let _ = serde_json::to_writer(&mut *out, s);
        }
        out.extend_from_slice(b"{\"type\":");
        string(out, self.kind.as_str());
        out.extend_from_slice(b",\"run_id\":");
        string(out, &self.run_id);
        out.extend_from_slice(b",\"route_id\":");
        string(out, &self.route_id);
        out.extend_from_slice(b",\"seq\":");
        out.extend_from_slice(self.seq.to_string().as_bytes());
        out.extend_from_slice(b",\"ts\":");
        string(out, &self.ts);
        if let Some(s) = &self.stage_id {
            out.extend_from_slice(b",\"stage_id\":");
            string(out, s);
        }
        if let Some(p) = &self.parent_run_id {
            out.extend_from_slice(b",\"parent_run_id\":");
            string(out, p);
        }
        // The fields' object, written in place: its `{` becomes the comma after the common
        // fields, its `}` closes the event (an empty object is taken back).
        let at = out.len();
        let _ = serde_json::to_writer(&mut *out, &self.data);
        if out.len() - at <= 2 {
            out.truncate(at);
            out.push(b'}');
        } else {
            out[at] = b',';
        }
        out.push(b'\n');
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::with_capacity(16);
        m.insert("type".into(), self.kind.as_str().into());
        m.insert("run_id".into(), Value::String(self.run_id.to_string()));
        m.insert("route_id".into(), Value::String(self.route_id.to_string()));
        m.insert("seq".into(), self.seq.into());
        m.insert("ts".into(), self.ts.clone().into());
        if let Some(s) = &self.stage_id {
            m.insert("stage_id".into(), s.clone().into());
        }
        if let Some(p) = &self.parent_run_id {
            m.insert("parent_run_id".into(), Value::String(p.to_string()));
        }
        if let Ok(Value::Object(fields)) = serde_json::to_value(&self.data) {
            m.extend(fields);
        }
        Value::Object(m)
    }
}

/// Where events go. Implementations must be cheap and must not block for long.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event);

    /// False when events are dropped anyway: emitters then skip building them.
    fn enabled(&self) -> bool {
        true
    }

    /// The events of `run_id` up to `through` are durable in its record (a journalled run's
    /// events go to the store in batches, after the sink saw them; this comes once the batch
    /// committed, [`RunEvents::on_durable`]).
    fn recorded(&self, _run_id: &str, _through: u64) {}

    /// Whether [`EventSink::recorded`] matters to this sink (a live tail that shows a model's
    /// text once it is durable): only then does a run's journal wait to tell it.
    fn follows_record(&self) -> bool {
        false
    }
}

/// A duration for an event: it reads the clock only when the run's events go somewhere (a run
/// without a consumer asks the clock for nothing).
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Option<Instant>);

impl Stopwatch {
    /// The time since it started; zero when events are not emitted.
    pub fn elapsed(&self) -> Duration {
        self.0.map(|t| t.elapsed()).unwrap_or_default()
    }
}

/// The emitter of one run: stamps ids, sequence numbers and timestamps.
pub struct RunEvents {
    run_id: Arc<str>,
    route_id: Arc<str>,
    parent_run_id: Option<Arc<str>>,
    seq: AtomicU64,
    sink: Arc<dyn EventSink>,
    enabled: bool,
    /// Events since the last [`RunEvents::take_recorded`], when the run is journalled.
    recorded: Option<Mutex<Vec<Event>>>,
    /// While a recovered run replays what its journal holds, its events were already recorded:
    /// nothing is emitted (and no `seq` is used) until the replay catches up.
    muted: std::sync::atomic::AtomicBool,
    /// A recovered run's call whose start its last holder recorded (see
    /// [`RunEvents::continue_call`]); `continuing` says whether one is set, read on every event.
    continuing: std::sync::atomic::AtomicBool,
    through: Mutex<Option<continuing::Through>>,
}

impl std::fmt::Debug for RunEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunEvents({})", self.run_id)
    }
}

impl RunEvents {
    /// `route_id` as a `&str`, or the route's own `Arc<str>` (shared, not copied).
    pub fn new(run_id: &str, route_id: impl Into<Arc<str>>, parent_run_id: Option<&str>, sink: Arc<dyn EventSink>) -> RunEvents {
        let enabled = sink.enabled();
        RunEvents {
            run_id: run_id.into(),
            route_id: route_id.into(),
            parent_run_id: parent_run_id.map(Into::into),
            seq: AtomicU64::new(0),
            sink,
            enabled,
            recorded: None,
            muted: std::sync::atomic::AtomicBool::new(false),
            continuing: std::sync::atomic::AtomicBool::new(false),
            through: Mutex::new(None),
        }
    }

    /// Starts timing something whose duration an event will carry.
    pub fn stopwatch(&self) -> Stopwatch {
        Stopwatch(self.enabled.then(Instant::now))
    }

    /// Stops (or resumes) emitting: see the `muted` field.
    pub fn set_muted(&self, muted: bool) {
        self.muted.store(muted, Ordering::Relaxed);
    }

    /// Emits `data` even while muted: something new said before a muted walk (a run continued
    /// after a reply, whose workflow walks again from its journal to the stage that asked).
    pub fn emit_new(&self, stage_id: Option<&str>, data: impl FnOnce() -> EventData) {
        let muted = self.muted.swap(false, Ordering::Relaxed);
        self.emit(stage_id, data);
        self.muted.store(muted, Ordering::Relaxed);
    }

    /// Also keeps every event until [`RunEvents::take_recorded`] (a journalled run), numbering
    /// from `first_seq` (a run continued after it asked goes on where it stopped).
    pub fn recording(mut self, first_seq: u64) -> RunEvents {
        self.recorded = Some(Mutex::new(Vec::new()));
        self.enabled = true;
        self.seq = AtomicU64::new(first_seq.saturating_sub(1));
        self
    }

    /// Numbers events from `first_seq` (a run continued after it asked, without a journal).
    pub fn numbered_from(mut self, first_seq: u64) -> RunEvents {
        self.seq = AtomicU64::new(first_seq.saturating_sub(1));
        self
    }

    /// The events recorded since the last call (empty when the run is not journalled). Their
    /// sink is told they are recorded by [`RunEvents::on_durable`]'s signal, once they are.
    pub fn take_recorded(&self) -> Vec<Event> {
        self.recorded.as_ref().map(|r| std::mem::take(&mut *r.lock().unwrap_or_else(|p| p.into_inner()))).unwrap_or_default()
    }

    /// What tells the sink that `taken` (from [`RunEvents::take_recorded`]) is durable: called
    /// once its write committed, so a live watcher is shown a model's text only once a takeover
    /// would find it too. `None` when there is nothing to tell, or no sink follows the record
    /// (the journal then need not wait for the commit to tell it).
    pub fn on_durable(&self, taken: &[Event]) -> Option<Box<dyn FnOnce() + Send>> {
        let through = taken.last()?.seq;
        if !self.sink.follows_record() {
            return None;
        }
        let (sink, run_id) = (self.sink.clone(), self.run_id.clone());
        Some(Box::new(move || sink.recorded(&run_id, through)))
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn route_id(&self) -> &str {
        &self.route_id
    }

    pub fn sink(&self) -> &Arc<dyn EventSink> {
        &self.sink
    }

    /// Emits one event. `data` builds its type and fields; it is not called when the sink
    /// drops events, so a run without an event consumer pays nothing for them (the check is
    /// inlined at every call site).
    #[inline]
    /// Whether anyone watches the run as it goes: a sink that takes its events (a journal that
    /// only records them does not count).
    pub fn watched(&self) -> bool {
        self.sink.enabled()
    }

    pub fn emit(&self, stage_id: Option<&str>, data: impl FnOnce() -> EventData) {
        if !self.enabled || self.muted.load(Ordering::Relaxed) {
            return;
        }
        let data = data();
        if self.continuing.load(Ordering::Relaxed) && self.continued(stage_id, &data) {
            return;
        }
        self.send(stage_id, data);
    }

    fn send(&self, stage_id: Option<&str>, data: EventData) {
        let event = Event {
            kind: data.kind(),
            run_id: self.run_id.clone(),
            route_id: self.route_id.clone(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            ts: rfc3339_now(),
            stage_id: stage_id.map(str::to_owned),
            parent_run_id: self.parent_run_id.clone(),
            data,
        };
        self.sink.emit(&event);
        if let Some(recorded) = &self.recorded {
            recorded.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        }
    }
}

/// A UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (sortable as text).
pub fn rfc3339_at(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}Z", civil_seconds(d.as_secs() as i64), d.subsec_millis())
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_now() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    // The date and time of day change once a second; events come thousands of times a second.
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let secs = now.as_secs();
    SECOND.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.0 != secs {
            *cache = (secs, civil_seconds(secs as i64));
        }
        let mut out = String::with_capacity(24);
        out.push_str(&cache.1);
        let ms = now.subsec_millis();
        out.push('.');
        out.push(char::from(b'0' + (ms / 100) as u8));
        out.push(char::from(b'0' + (ms / 10 % 10) as u8));
        out.push(char::from(b'0' + (ms % 10) as u8));
        out.push('Z');
        out
    })
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time (Howard Hinnant's civil_from_days).
fn civil_seconds(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_lines_match_the_value_form() {
        let e = super::Event {
            kind: super::EventKind::StageCompleted,
            run_id: "r".into(),
            route_id: "x\"y".into(),
            seq: 3,
            ts: "2026-11-29T00:00:00.000Z".into(),
            stage_id: Some("intake".into()),
            parent_run_id: None,
            data: super::EventData::StageCompleted { duration_ms: 1.5, output: "a\nb".into(), output_chars: 3 },
        };
        let mut line = Vec::new();
        e.write_json_line(&mut line);
        assert_eq!(String::from_utf8(line).unwrap(), format!("{}\n", e.to_json()));
    }

    #[test]
    fn kinds_round_trip() {
        for k in super::EventKind::ALL {
            assert_eq!(super::EventKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(super::EventKind::parse("run.exploded"), None);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_seconds(0), "1970-01-01T00:00:00");
        assert_eq!(super::civil_seconds(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(super::civil_seconds(1_796_083_199), "2026-11-30T23:59:59");
    }

    #[test]
    fn timestamp_shape() {
        let ts = super::rfc3339_now();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.starts_with("20") && ts.ends_with('Z'));
    }
}
