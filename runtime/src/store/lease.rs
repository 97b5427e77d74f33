//! Who holds a run: a [`Holder`] (this process as claims name it), the [`Lease`] of a claimed
//! run (its fencing token, made by the store only), a [`Claimed`] run, and [`Fenced`], a claimed
//! run's journal (a store and the lease every write carries).

use super::{StoreError, StoredRun};

/// Who claims runs: this process's name in the store and how long its leases last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Unique per process (a new one at every start).
    pub owner: String,
    /// How long a claim lasts without a heartbeat (`FABRIC_RUN_LEASE_S`).
    pub lease: std::time::Duration,
}

impl Holder {
    /// A new holder name for this process.
    pub fn new(lease: std::time::Duration) -> Holder {
        Holder { owner: uuid::Uuid::now_v7().to_string(), lease }
    }

    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX / 4)
    }
}

/// A run's lease as its holder has it: the fencing token its writes carry. Made by the store
/// only (a claim, a create, a reply's claim, a cancel's claim), so a lease names a claim that
/// was made; its holder reads it and hands it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    run_id: String,
    token: i64,
}

impl Lease {
    pub(crate) fn new(run_id: impl Into<String>, token: i64) -> Lease {
        Lease { run_id: run_id.into(), token }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// How many times the run was claimed, this claim included: its writes' fencing token.
    pub fn token(&self) -> i64 {
        self.token
    }
}

/// A run this process claimed (queued, or whose holder's lease expired).
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The claim: the run's id and the fencing token its writes carry now.
    pub lease: Lease,
    pub route_id: String,
    /// A cancel request's reason, read apart from the run: a run whose row does not read ends
    /// `cancelled` all the same when someone asked.
    pub cancel_reason: Option<String>,
    /// The run as stored, or why its row does not read: the claimer ends it with that reason
    /// (one row that does not read never holds up the others).
    pub run: Result<StoredRun, StoreError>,
}
