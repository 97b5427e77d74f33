//! A service replica's part in its fleet's budget of model calls ([`crate::store::FleetBudget`]):
//! the heartbeat that sets each gate's share, the pauses other replicas' 429s put on a model,
//! and this replica's own 429s told to the others; the same way, the breakers of fallback
//! chains' models that open (a pause row keyed `breaker/provider:model`). Without a store that holds a fleet's budget
//! (SQLite, or no store) each process keeps the whole limits, and this does nothing.

use std::sync::Arc;
use std::time::Duration;

use super::Durable;
use crate::llm::flow::{Flow, Gate};
use crate::store::{RunStore, ShareBeat};

/// How often a replica beats while it holds what it wants, and while it wants more.
pub const BEAT: Duration = Duration::from_secs(1);
pub const HUNGRY_BEAT: Duration = Duration::from_millis(250);

impl Durable {
    /// Whether this runtime's limits are shared with a fleet through its store.
    pub fn flow_is_shared(&self) -> bool {
        self.store.fleet().is_some() && self.runtime.flow().plan().any()
    }

    /// Keeps this replica's share of the fleet's limits and the fleet's pauses, for ever (a
    /// service runs it in a task of its own, and calls [`Durable::leave_fleet`] at shutdown).
    pub async fn share_flow(self: Arc<Self>) {
        let store = self.store.clone();
        if store.fleet().is_none() {
            return;
        }
        let fleet = self.runtime.settings().fleet.clone().unwrap_or_default();
        let flow = self.runtime.flow().clone();
        let limited: Vec<Arc<Gate>> = flow.gates().into_iter().filter(|g| g.limits().any()).collect();
        // Nothing until the fleet says how much: the first beat comes at once.
        for g in &limited {
            g.set_granted(Some(0));
        }
        let beats = async {
            if !limited.is_empty() {
                beat(store.as_ref(), &fleet, &self.holder.owner, self.holder.lease, &limited, &flow).await;
            }
        };
        // In this task, not spawned: a service that aborts it stops all three.
        tokio::join!(tell_pauses(store.clone(), fleet.clone(), flow.clone()), watch_pauses(store.clone(), fleet.clone(), flow.clone()), beats);
        std::future::pending::<()>().await;
    }

    /// Gives this replica's shares back (a shutdown), so the others need not wait a lease.
    pub async fn leave_fleet(&self) {
        let Some(fleet_store) = self.store.fleet() else { return };
        let fleet = self.runtime.settings().fleet.clone().unwrap_or_default();
        if let Err(e) = fleet_store.leave(&fleet, &self.holder.owner).await {
            tracing::warn!(error = %e, "run store: giving back this replica's share of the model limits");
        }
    }
}

/// The heartbeat, for ever. A replica that cannot beat for two thirds of its lease holds no
/// share any more: the others take its units once its rows expire.
async fn beat(store: &dyn RunStore, fleet: &str, replica: &str, lease: Duration, gates: &[Arc<Gate>], flow: &Flow) {
    let Some(budget) = store.fleet() else { return };
    let mut last_ok = tokio::time::Instant::now();
    loop {
        let shares: Vec<ShareBeat> = gates
            .iter()
            .map(|g| {
                let (demand, in_flight, units) = g.demand();
                ShareBeat { key: g.key().to_string(), demand, in_flight, units, concurrency: g.limits().max_concurrency.is_some() }
            })
            .collect();
        let mut hungry = false;
        let lower = |key: &str, grant: u32| gates.iter().find(|g| **g.key() == *key).map_or(0, |g| g.lower_to(grant));
        match budget.beat(fleet, replica, lease, &shares, &lower).await {
            Ok(view) => {
                last_ok = tokio::time::Instant::now();
                for (g, (key, grant)) in gates.iter().zip(view.grants) {
                    debug_assert_eq!(**g.key(), *key);
                    g.set_granted(Some(grant));
                    let (demand, _, _) = g.demand();
                    hungry |= demand > grant;
                }
                for (key, left) in view.pauses {
                    flow.from_fleet(&key, left);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "run store: the fleet's share of the model limits");
                if last_ok.elapsed() > lease * 2 / 3 {
                    for g in gates {
                        g.set_granted(Some(0));
                    }
                }
            }
        }
        tokio::time::sleep(if hungry { HUNGRY_BEAT } else { BEAT }).await;
    }
}

/// This replica's 429s, told to the fleet.
async fn tell_pauses(store: Arc<dyn RunStore>, fleet: String, flow: Arc<Flow>) {
    let (Some(mut rx), Some(budget)) = (flow.take_pauses(), store.fleet()) else { return };
    while let Some((key, pause)) = rx.recv().await {
        if let Err(e) = budget.pause(&fleet, &key, pause).await {
            tracing::error!(error = %e, model = %key, "run store: telling the fleet of a pause after a 429");
        }
    }
}

/// Other replicas' 429s, as they record them; the beat reads them too, should the listening
/// connection be down.
async fn watch_pauses(store: Arc<dyn RunStore>, fleet: String, flow: Arc<Flow>) {
    let Some(budget) = store.fleet() else { return };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Duration)>();
    let apply = async {
        while let Some((key, left)) = rx.recv().await {
            flow.from_fleet(&key, left);
        }
    };
    let listen = async {
        loop {
            if let Err(e) = budget.watch_pauses(&fleet, tx.clone()).await {
                tracing::warn!(error = %e, "run store: listening for the fleet's pauses (the heartbeat still reads them)");
            }
            tokio::time::sleep(BEAT).await;
        }
    };
    tokio::join!(apply, listen);
}
