//! The fault plan of one seed: how likely each fault is (drawn from the seed), and which ones
//! happen. Every decision is a pure function of the seed, the site and how many times that
//! site was asked before, so leaving one fault out (shrinking) changes no other decision.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// The rates of one seed, each from 0 up to its cap: some seeds have no faults of a kind.
#[derive(Debug, Clone)]
pub struct Rates {
    pub llm: f64,
    pub tool: f64,
    pub store: f64,
    pub lease_jump: f64,
    pub crash: bool,
    pub reply_twice: f64,
    pub reply_wrong_run: f64,
}

#[derive(Debug)]
pub struct Faults {
    pub seed: u64,
    pub rates: Rates,
    /// Fault ids left out (shrinking).
    disabled: BTreeSet<String>,
    asked: Mutex<HashMap<String, u64>>,
    /// The faults that happened, in order: `site#n kind`.
    injected: Mutex<Vec<String>>,
}

/// SplitMix64: a good 64-bit mix of one number.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash(text: &str) -> u64 {
    // FNV-1a: stable across builds and platforms (std's hasher is not).
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Faults {
    pub fn new(seed: u64, disabled: BTreeSet<String>) -> Faults {
        let unit = |k: u64| (mix(seed ^ mix(k)) >> 11) as f64 / (1u64 << 53) as f64;
        let rates = Rates {
            llm: unit(1) * 0.35,
            tool: unit(2) * 0.35,
            store: unit(3) * 0.08,
            lease_jump: unit(4) * 0.03,
            crash: unit(5) < 0.5,
            reply_twice: unit(6) * 0.5,
            reply_wrong_run: unit(7) * 0.3,
        };
        Faults { seed, rates, disabled, asked: Mutex::new(HashMap::new()), injected: Mutex::new(Vec::new()) }
    }

    /// The next draw of `site`, uniform in [0, 1), and its fault id.
    pub fn draw(&self, site: &str) -> (f64, String) {
        let mut asked = self.asked.lock().unwrap();
        let n = asked.entry(site.to_owned()).or_default();
        let id = format!("{site}#{n}");
        *n += 1;
        let x = mix(self.seed ^ hash(&id));
        ((x >> 11) as f64 / (1u64 << 53) as f64, id)
    }

    /// A whole number in [0, n) for `site` (no fault: a choice of the world, e.g. a decision).
    pub fn pick(&self, site: &str, n: usize) -> usize {
        let (x, _) = self.draw(site);
        ((x * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Whether a fault of `rate` happens at `site` now; one of `kinds` (equally likely) if so.
    pub fn fault<T: Copy + std::fmt::Debug>(&self, site: &str, rate: f64, kinds: &[T]) -> Option<T> {
        let (x, id) = self.draw(site);
        if x >= rate || kinds.is_empty() || self.disabled.contains(&id) {
            return None;
        }
        let kind = kinds[((x / rate * kinds.len() as f64) as usize).min(kinds.len() - 1)];
        self.injected.lock().unwrap().push(format!("{id} {kind:?}"));
        Some(kind)
    }

    /// The faults that happened, in order (`site#n kind`).
    pub fn injected(&self) -> Vec<String> {
        self.injected.lock().unwrap().clone()
    }
}
