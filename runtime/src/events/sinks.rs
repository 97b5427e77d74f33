//! The sinks every front end composes: none ([`NullSink`]), JSON lines ([`JsonLinesSink`]),
//! memory ([`MemorySink`]) and several at once ([`FanOut`]).

use std::io::Write;
use std::sync::{Arc, Mutex};

use super::{Event, EventSink};

/// Drops everything (benchmarks without event output).
#[derive(Debug, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _: &Event) {}

    fn enabled(&self) -> bool {
        false
    }
}

/// JSON lines to a writer (a file, or stderr for `--events-out -`).
///
/// A write that fails does not fail the run (its result still goes to stdout), but it is never
/// silent: the first error is kept, nothing more is written after it, and [`JsonLinesSink::failure`]
/// tells the caller that the record is incomplete.
pub struct JsonLinesSink {
    out: Mutex<(Box<dyn Write + Send>, Option<String>)>,
}

impl std::fmt::Debug for JsonLinesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonLinesSink")
    }
}

impl JsonLinesSink {
    pub fn new(out: Box<dyn Write + Send>) -> JsonLinesSink {
        JsonLinesSink { out: Mutex::new((out, None)) }
    }

    /// The first write error, with how many events were lost up to now; `None` when every
    /// event was written.
    pub fn failure(&self) -> Option<String> {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }
}

impl EventSink for JsonLinesSink {
    fn emit(&self, event: &Event) {
        let mut line = Vec::with_capacity(256);
        event.write_json_line(&mut line);
        let mut guard = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let (out, failed) = &mut *guard;
        if failed.is_none()
            && let Err(e) = out.write_all(&line).and_then(|_| out.flush())
        {
            *failed = Some(format!("writing event {} ({}) failed: {e}; later events were not written", event.seq, event.kind.as_str()));
        }
    }
}

/// Keeps events in memory (tests, the service later).
#[derive(Debug, Default)]
pub struct MemorySink {
    events: Mutex<Vec<Event>>,
}

impl MemorySink {
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl EventSink for MemorySink {
    fn emit(&self, event: &Event) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event.clone());
        }
    }
}

/// Sends each event to several sinks.
pub struct FanOut(pub Vec<Arc<dyn EventSink>>);

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FanOut({})", self.0.len())
    }
}

impl EventSink for FanOut {
    fn emit(&self, event: &Event) {
        for s in &self.0 {
            s.emit(event);
        }
    }

    fn recorded(&self, run_id: &str, through: u64) {
        for s in &self.0 {
            s.recorded(run_id, through);
        }
    }

    fn follows_record(&self) -> bool {
        self.0.iter().any(|s| s.follows_record())
    }
}
