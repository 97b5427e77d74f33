//! Flow control of model calls: limits per provider/model (calls in flight, requests and tokens
//! per minute), one pause of every call of a model after its 429, and fair queues per route.
//!
//! [`Flow`] holds one [`Gate`] per `provider:model` key, shared by every stack of the process
//! that calls that model; [`FlowLlm`] is the decorator that takes room at the gate before each
//! attempt goes out. In a fleet on PostgreSQL the service's flow task (`api::flow`) tells each
//! gate its share of the fleet's limits and the pauses other replicas were told of; on its own a
//! process holds the whole limits.

pub mod breaker;
pub mod gate;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

pub use breaker::{Admit, Breaker, BreakerPolicy, BreakerState, BreakerStatus};
pub use gate::{DEFAULT_MAX_PAUSE, Gate, GateStatus, MAX_PAUSE, Pause, Permit};

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass};
use crate::events::EventData;

/// Limits on one model's calls; `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_concurrency: Option<u32>,
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.max_concurrency.is_some() || self.rpm.is_some() || self.tpm.is_some()
    }

    /// These limits, each unset one taken from `under`.
    pub fn over(self, under: Limits) -> Limits {
        Limits { max_concurrency: self.max_concurrency.or(under.max_concurrency), rpm: self.rpm.or(under.rpm), tpm: self.tpm.or(under.tpm) }
    }
}

/// What held a call back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Concurrency,
    Rpm,
    Tpm,
    /// A pause after a 429 (this replica's or, in a fleet, another's).
    Paused,
}

impl Held {
    /// The wire name, in `run.llm.waiting`'s `limit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Concurrency => "concurrency",
            Held::Rpm => "rpm",
            Held::Tpm => "tpm",
            Held::Paused => "paused",
        }
    }

    /// What an operator sets to change it.
    fn what(self) -> &'static str {
        match self {
            Held::Concurrency => "FABRIC_LLM_MAX_CONCURRENCY",
            Held::Rpm => "FABRIC_LLM_RPM",
            Held::Tpm => "FABRIC_LLM_TPM",
            Held::Paused => "a pause after the provider's 429",
        }
    }
}

/// The limits in force: the defaults (`FABRIC_LLM_*`) and, per `provider:model`, the config
/// file's `[llm_limits."provider:model"]`, field by field over the defaults; and the longest
/// pause a provider's 429 may put on a model (`FABRIC_LLM_MAX_PAUSE_S`).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowPlan {
    pub default: Limits,
    pub models: BTreeMap<String, Limits>,
    pub max_pause: Duration,
    /// When the breaker of a fallback chain's model opens, and for how long
    /// (`FABRIC_LLM_BREAKER_FAILURES`, `FABRIC_LLM_BREAKER_COOLDOWN_S`).
    pub breaker: BreakerPolicy,
}

impl Default for FlowPlan {
    fn default() -> FlowPlan {
        FlowPlan { default: Limits::default(), models: BTreeMap::new(), max_pause: DEFAULT_MAX_PAUSE, breaker: BreakerPolicy::default() }
    }
}

impl FlowPlan {
    pub fn limits(&self, key: &str) -> Limits {
        self.models.get(key).map_or(self.default, |l| l.over(self.default))
    }

    pub fn any(&self) -> bool {
        self.default.any() || self.models.values().any(Limits::any)
    }
}

/// The key of a model's gate.
pub fn key_of(info: &ModelInfo) -> String {
    format!("{}:{}", info.provider, info.model)
}

/// The pauses this process's 429s put on its models, `(key, pause)`, as the fleet is told them.
pub type Pauses = mpsc::UnboundedReceiver<(Arc<str>, Duration)>;

/// A process's gates and the breakers of its chains' models, one per model key.
#[derive(Debug)]
pub struct Flow {
    plan: FlowPlan,
    gates: Mutex<BTreeMap<String, Arc<Gate>>>,
    breakers: Mutex<BTreeMap<String, Arc<Breaker>>>,
    pauses_tx: mpsc::UnboundedSender<(Arc<str>, Duration)>,
    pauses_rx: Mutex<Option<Pauses>>,
}

impl Flow {
    pub fn new(plan: FlowPlan) -> Arc<Flow> {
        let (pauses_tx, rx) = mpsc::unbounded_channel();
        Arc::new(Flow { plan, gates: Mutex::default(), breakers: Mutex::default(), pauses_tx, pauses_rx: Mutex::new(Some(rx)) })
    }

    pub fn plan(&self) -> &FlowPlan {
        &self.plan
    }

    /// The gate of the model `info` names: always for a hosted provider (its 429s pause it),
    /// for the stub or an embedder's backend only when limits apply to it.
    pub fn gate(&self, info: &ModelInfo, hosted: bool) -> Option<Arc<Gate>> {
        let key = key_of(info);
        let limits = self.plan.limits(&key);
        if !hosted && !limits.any() {
            return None;
        }
        let mut gates = self.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let gate = gates.entry(key.clone()).or_insert_with(|| Gate::new(key.into(), limits, self.plan.max_pause, Some(self.pauses_tx.clone())));
        Some(gate.clone())
    }

    /// Every gate, by key.
    pub fn gates(&self) -> Vec<Arc<Gate>> {
        self.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }

    /// The breaker of the model `key` (`provider:model`), shared by every chain that has it; its
    /// openings go to the fleet with the pauses, under [`breaker::FLEET_PREFIX`].
    pub fn breaker(&self, key: &str) -> Arc<Breaker> {
        let mut breakers = self.breakers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = breakers.entry(key.to_owned()).or_insert_with(|| Breaker::new(key.into(), self.plan.breaker, Some(self.pauses_tx.clone())));
        b.clone()
    }

    /// Every breaker, by key.
    pub fn breakers(&self) -> Vec<Arc<Breaker>> {
        self.breakers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }

    /// A pause or a breaker's opening the fleet was told of (`key` as [`Flow::take_pauses`]
    /// gives it): applied to this process's gate or breaker of that model, if it has one.
    pub fn from_fleet(&self, key: &str, left: Duration) {
        if let Some(model) = key.strip_prefix(breaker::FLEET_PREFIX) {
            let b = self.breakers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(model).cloned();
            if let Some(b) = b {
                b.open_from_fleet(left);
            }
        } else if let Some(g) = self.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).cloned() {
            g.pause_from_fleet(left);
        }
    }

    /// The pauses this process's 429s caused, `(key, pause)`, for the fleet (taken once).
    pub fn take_pauses(&self) -> Option<Pauses> {
        self.pauses_rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// Takes room at the gate before each attempt; a 429 pauses the gate.
#[derive(Debug)]
pub struct FlowLlm<L> {
    inner: L,
    gate: Option<Arc<Gate>>,
    /// The longest a call waits for room: the call's own timeout.
    max_wait: Duration,
}

impl<L: Llm> FlowLlm<L> {
    pub fn new(inner: L, gate: Option<Arc<Gate>>, max_wait: Duration) -> FlowLlm<L> {
        FlowLlm { inner, gate, max_wait }
    }

    async fn gated(&self, gate: &Arc<Gate>, req: &LlmRequest<'_>) -> Result<LlmReply, LlmError> {
        // About four bytes a token, as the providers' own rules of thumb say; the reply's usage
        // corrects it.
        let estimate = (req.system.len() + req.user.len()).div_ceil(4) as u64;
        let mut permit = match gate.acquire(req.route_id, req.priority, estimate, self.max_wait).await {
            Ok((permit, waited)) => {
                if let Some((held, waited)) = waited {
                    req.events.emit(Some(req.stage_id), || EventData::LlmWaiting { limit: held.as_str(), waited_ms: waited.as_millis() as u64 });
                }
                permit
            }
            Err((held, waited)) => {
                req.events.emit(Some(req.stage_id), || EventData::LlmWaiting { limit: held.as_str(), waited_ms: waited.as_millis() as u64 });
                let message = format!(
                    "waited {:.1} s for room to call {} (held by {}), longer than the call's timeout of {} s",
                    waited.as_secs_f64(),
                    gate.key(),
                    held.what(),
                    self.max_wait.as_secs()
                );
                return Err(LlmError::new(ReasonClass::RateLimited, message));
            }
        };
        let mut result = self.inner.call(req).await;
        match &mut result {
            Ok(reply) => {
                if let Some(u) = reply.meta.usage {
                    permit.used(u.total());
                }
                gate.succeeded();
            }
            // Paused before the permit goes back: no call of this model goes out meanwhile.
            Err(e) if e.class == ReasonClass::RateLimited => {
                if let Some(named) = gate.rate_limited(e.retry_after).refused {
                    // Waiting that long is the operator's to allow, not the provider's to impose.
                    e.give_up = true;
                    e.message = format!(
                        "{}: {} asked to wait {} ({}), longer than the longest pause allowed ({} s, FABRIC_LLM_MAX_PAUSE_S); the call fails now instead",
                        e.message,
                        gate.key(),
                        stated(named.after),
                        named.from,
                        gate.max_pause().as_secs_f64()
                    );
                }
            }
            Err(e) => {
                if let Some(u) = e.reply.as_ref().and_then(|m| m.usage) {
                    permit.used(u.total());
                }
            }
        }
        drop(permit);
        result
    }
}

/// A provider's stated wait in words: read up to a day, so a day means "a day or more".
fn stated(after: Duration) -> String {
    if after >= crate::llm::providers::MAX_RETRY_AFTER { "a day or more".to_owned() } else { format!("{:.1} s", after.as_secs_f64()) }
}

impl<L: Llm> Llm for FlowLlm<L> {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(self.call(req))
    }

    async fn call<'a>(&'a self, req: &'a LlmRequest<'a>) -> Result<LlmReply, LlmError> {
        match &self.gate {
            None => self.inner.call(req).await,
            Some(gate) => self.gated(gate, req).await,
        }
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}

#[cfg(test)]
mod tests;
