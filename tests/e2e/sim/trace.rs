//! The trace of one seed: what the world did and what the system answered, one line each, in
//! order. The same seed gives the same trace byte for byte (wall-clock fields left out).

use std::sync::Mutex;

use serde_json::Value;

#[derive(Debug, Default)]
pub struct Trace(Mutex<Vec<String>>);

impl Trace {
    pub fn log(&self, line: impl Into<String>) {
        self.0.lock().unwrap().push(line.into());
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// An event's JSON without what the wall clock decides (its time, durations): those come from
/// the machine, not from the seed.
pub fn normalized(mut event: Value) -> Value {
    if let Some(m) = event.as_object_mut() {
        for k in ["ts", "duration_ms", "elapsed_ms"] {
            m.remove(k);
        }
    }
    event
}
