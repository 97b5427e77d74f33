//! What the service tells of its replica's background loops: which are down now (a loop the
//! replica needs that is down makes `/readyz` 503) and how many times each panicked
//! (`fabric_background_panics_total{loop}`). The loops themselves are owned and restarted by
//! [`crate::replica::Replica`]; this is only their record, which the handlers read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// The loops' record.
#[derive(Debug, Default)]
pub struct Loops {
    down: Mutex<BTreeSet<&'static str>>,
    panics: Mutex<BTreeMap<&'static str, u64>>,
}

impl Loops {
    /// `name` panicked: counted, and down until [`Loops::up`].
    pub fn panicked(&self, name: &'static str) {
        *self.panics.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_default() += 1;
        self.down.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
    }

    /// `name` runs again.
    pub fn up(&self, name: &'static str) {
        self.down.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// The loops down now, by name.
    pub fn down(&self) -> Vec<&'static str> {
        self.down.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }

    /// Panics so far, by loop.
    pub fn panics(&self) -> BTreeMap<&'static str, u64> {
        self.panics.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The Prometheus lines of the panics.
    pub(super) fn render(&self, out: &mut String) {
        out.push_str("# HELP fabric_background_panics_total Panics of a replica's background loops (each restarted), by loop.\n# TYPE fabric_background_panics_total counter\n");
        for (name, n) in self.panics() {
            out.push_str(&format!("fabric_background_panics_total{{loop=\"{name}\"}} {n}\n"));
        }
    }
}
