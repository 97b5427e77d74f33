//! Prometheus metrics of the service, counted from the events runs emit (an [`EventSink`]):
//! runs started and finished by route and status, stage and model-call latency histograms,
//! retries, tokens in and out, runs in flight.
//! Hand-written, not prometheus-client: docs/performance.md, "Why /metrics is hand-written".

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::events::{Event, EventData, EventSink, Tokens};
use crate::runtime::{BreakerStatus, GateStatus};

/// Histogram buckets in seconds (stages and model calls: milliseconds to minutes).
const BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if seconds <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Debug, Default)]
struct Counts {
    started: BTreeMap<String, u64>,
    finished: BTreeMap<(String, String), u64>,
    stage_seconds: BTreeMap<String, Histogram>,
    llm_seconds: BTreeMap<String, Histogram>,
    /// How long model calls waited for room at their model's gate, by route.
    wait_seconds: BTreeMap<String, Histogram>,
    retries: BTreeMap<String, u64>,
    tokens_in: BTreeMap<String, u64>,
    tokens_out: BTreeMap<String, u64>,
    taken_over: BTreeMap<String, u64>,
    /// Ended runs this process's sweeper deleted (retention).
    pruned: u64,
    /// Webhook attempts this process made, by outcome (`delivered`, `retrying`, `failed`).
    webhooks: BTreeMap<&'static str, u64>,
    /// Fallbacks of model chains, by (from, to, reason).
    fallbacks: BTreeMap<(String, String, &'static str), u64>,
}

const NO_TOKENS: Tokens = Tokens { input: 0, output: 0 };

impl Counts {
    fn model_call(&mut self, route: String, duration_ms: f64, tokens: Tokens) {
        self.llm_seconds.entry(route.clone()).or_default().observe(duration_ms / 1000.0);
        // Saturating: a provider reporting absurd counts must not overflow the total.
        let total = self.tokens_in.entry(route.clone()).or_default();
        *total = total.saturating_add(tokens.input);
        let total = self.tokens_out.entry(route).or_default();
        *total = total.saturating_add(tokens.output);
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    counts: Mutex<Counts>,
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl EventSink for Metrics {
    fn emit(&self, e: &Event) {
        // Child runs are counted as runs of their own routes.
        let route = e.route_id.to_string();
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let finished = |c: &mut Counts, route: String, status: &str| *c.finished.entry((route, status.to_owned())).or_default() += 1;
        match &e.data {
            EventData::RunStarted { .. } => *c.started.entry(route).or_default() += 1,
            EventData::RunCompleted { .. } => finished(&mut c, route, "completed"),
            EventData::RunFailed { .. } => finished(&mut c, route, "failed"),
            EventData::RunAwaitingInput { .. } => finished(&mut c, route, "awaiting_input"),
            EventData::RunCancelled { .. } => finished(&mut c, route, "cancelled"),
            EventData::StageCompleted { duration_ms, .. } | EventData::StageFailed { duration_ms, .. } => {
                c.stage_seconds.entry(route).or_default().observe(duration_ms / 1000.0);
            }
            EventData::LlmCompleted { duration_ms, tokens } => c.model_call(route, *duration_ms, tokens.unwrap_or(NO_TOKENS)),
            // A failed call reports no tokens.
            EventData::LlmFailed { duration_ms, .. } => c.model_call(route, *duration_ms, NO_TOKENS),
            EventData::LlmRetrying { .. } => *c.retries.entry(route).or_default() += 1,
            EventData::LlmFallback { from, to, reason, .. } => *c.fallbacks.entry((from.clone(), to.clone(), reason)).or_default() += 1,
            EventData::LlmWaiting { waited_ms, .. } => c.wait_seconds.entry(route).or_default().observe(*waited_ms as f64 / 1000.0),
            _ => {}
        }
    }
}

impl Metrics {
    /// A run of `route` this process took over from one that stopped.
    pub fn taken_over(&self, route: &str) {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()).taken_over.entry(route.to_owned()).or_default() += 1;
    }

    /// `n` ended runs this process's sweeper deleted.
    pub fn pruned(&self, n: u64) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.pruned = c.pruned.saturating_add(n);
    }

    /// A webhook attempt this process made: `delivered`, `retrying` (failed, tried again
    /// later) or `failed` (the last attempt failed).
    pub fn webhook(&self, outcome: &'static str) {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()).webhooks.entry(outcome).or_default() += 1;
    }

    /// The Prometheus text exposition (version 0.0.4), with the runs executing now and the
    /// models' gates as they are now.
    pub fn render(&self, in_flight: usize, gates: &[GateStatus], breakers: &[BreakerStatus]) -> String {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, rows: &BTreeMap<String, u64>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (route, v) in rows {
                let _ = writeln!(out, "{name}{{route=\"{}\"}} {v}", label(route));
            }
        };
        counter(&mut out, "fabric_runs_started_total", "Runs started, by route.", &c.started);
        let _ = writeln!(out, "# HELP fabric_runs_finished_total Runs that ended or asked, by route and status.\n# TYPE fabric_runs_finished_total counter");
        for ((route, status), v) in &c.finished {
            let _ = writeln!(out, "fabric_runs_finished_total{{route=\"{}\",status=\"{status}\"}} {v}", label(route));
        }
        let histogram = |out: &mut String, name: &str, help: &str, rows: &BTreeMap<String, Histogram>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (route, h) in rows {
                let route = label(route);
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"{b}\"}} {}", h.counts[i]);
                }
                let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", h.sum);
                let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {}", h.count);
            }
        };
        histogram(&mut out, "fabric_stage_duration_seconds", "Stage durations, by route.", &c.stage_seconds);
        histogram(&mut out, "fabric_model_call_duration_seconds", "Model-call durations (all attempts), by route.", &c.llm_seconds);
        counter(&mut out, "fabric_model_retries_total", "Model-call retries, by route.", &c.retries);
        histogram(&mut out, "fabric_model_wait_seconds", "How long model calls waited for room under the model limits or a pause, by route.", &c.wait_seconds);
        gate_metrics(&mut out, gates);
        let _ = writeln!(
            out,
            "# HELP fabric_model_fallbacks_total Model calls a fallback chain moved on from, by model moved from and to, and reason.\n\
             # TYPE fabric_model_fallbacks_total counter"
        );
        for ((from, to, reason), v) in &c.fallbacks {
            let _ = writeln!(out, "fabric_model_fallbacks_total{{from=\"{}\",to=\"{}\",reason=\"{reason}\"}} {v}", label(from), label(to));
        }
        breaker_metrics(&mut out, breakers);
        counter(&mut out, "fabric_model_input_tokens_total", "Tokens sent to models, by route.", &c.tokens_in);
        counter(&mut out, "fabric_model_output_tokens_total", "Tokens received from models, by route.", &c.tokens_out);
        counter(&mut out, "fabric_runs_taken_over_total", "Runs this process took over from a process that stopped, by route.", &c.taken_over);
        let _ = writeln!(
            out,
            "# HELP fabric_runs_pruned_total Ended runs this process deleted past FABRIC_RUN_RETENTION.\n# TYPE fabric_runs_pruned_total counter\nfabric_runs_pruned_total {}",
            c.pruned
        );
        let _ = writeln!(
            out,
            "# HELP fabric_webhook_deliveries_total Webhook attempts this process made, by outcome (delivered, retrying, failed).\n\
             # TYPE fabric_webhook_deliveries_total counter"
        );
        for (outcome, v) in &c.webhooks {
            let _ = writeln!(out, "fabric_webhook_deliveries_total{{outcome=\"{outcome}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP fabric_runs_in_flight Runs executing now.\n# TYPE fabric_runs_in_flight gauge\nfabric_runs_in_flight {in_flight}");
        out
    }
}

/// The breakers of chains' models: the state (0 closed, 1 open, 2 half-open) and the openings.
fn breaker_metrics(out: &mut String, breakers: &[BreakerStatus]) {
    let _ = writeln!(
        out,
        "# HELP fabric_model_breaker_state The breaker of a fallback chain's model: 0 closed, 1 open (skipped), 2 half-open (one call tries it).\n\
         # TYPE fabric_model_breaker_state gauge"
    );
    for b in breakers {
        let _ = writeln!(out, "fabric_model_breaker_state{{model=\"{}\"}} {}", label(&b.key), b.state.gauge());
    }
    let _ = writeln!(
        out,
        "# HELP fabric_model_breaker_opened_total Times a model's breaker opened, here or told by the fleet.\n# TYPE fabric_model_breaker_opened_total counter"
    );
    for b in breakers {
        let _ = writeln!(out, "fabric_model_breaker_opened_total{{model=\"{}\"}} {}", label(&b.key), b.opened);
    }
}

/// The gates' own figures: calls waiting by route, 429s by provider, and per model the calls in
/// flight and this replica's share of the fleet's limits.
fn gate_metrics(out: &mut String, gates: &[GateStatus]) {
    let mut waiting: BTreeMap<&str, u32> = BTreeMap::new();
    let mut limited: BTreeMap<&str, u64> = BTreeMap::new();
    for g in gates {
        for (route, n) in &g.waiting {
            *waiting.entry(route).or_default() += n;
        }
        *limited.entry(g.key.split_once(':').map_or(&*g.key, |(p, _)| p)).or_default() += g.rate_limited;
    }
    let _ = writeln!(out, "# HELP fabric_model_calls_waiting Model calls waiting for room now, by route.\n# TYPE fabric_model_calls_waiting gauge");
    for (route, n) in waiting {
        let _ = writeln!(out, "fabric_model_calls_waiting{{route=\"{}\"}} {n}", label(route));
    }
    let _ = writeln!(out, "# HELP fabric_model_rate_limited_total 429s from model providers, by provider.\n# TYPE fabric_model_rate_limited_total counter");
    for (provider, n) in limited {
        let _ = writeln!(out, "fabric_model_rate_limited_total{{provider=\"{}\"}} {n}", label(provider));
    }
    let _ = writeln!(out, "# HELP fabric_model_calls_in_flight Model calls in flight now, by model.\n# TYPE fabric_model_calls_in_flight gauge");
    for g in gates {
        let _ = writeln!(out, "fabric_model_calls_in_flight{{model=\"{}\"}} {}", label(&g.key), g.in_flight);
    }
    let _ = writeln!(
        out,
        "# HELP fabric_model_fleet_share This replica's share of the model's limits (1: all of them; a fleet on PostgreSQL shares them).\n\
         # TYPE fabric_model_fleet_share gauge"
    );
    for g in gates.iter().filter(|g| g.limits.any()) {
        let _ = writeln!(out, "fabric_model_fleet_share{{model=\"{}\"}} {}", label(&g.key), g.share);
    }
}
