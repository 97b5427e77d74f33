//! Retention: ended runs older than `FABRIC_RUN_RETENTION` deleted with their events and journal
//! ([`Durable::prune`], the service's sweeper and `fabric runs prune`), and runs that awaited the
//! user longer than `FABRIC_AWAITING_RETENTION` cancelled with the reason `expired`
//! ([`Durable::expire_awaiting`]). Runs queued, running or awaiting are never deleted. The
//! schedules' fire records older than the retention go with the runs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Durable;
use super::cancelling::{CancelError, Cancelling};
use crate::events::EventSink;
use crate::store::StoreError;

/// Runs deleted per transaction: each is short, so the writers of running runs never wait long.
pub const PRUNE_BATCH: usize = 500;

/// The reason of a run cancelled because it awaited the user too long.
pub const EXPIRED_REASON: &str = "expired";

/// The stored time `age` ago.
fn cutoff(age: Duration) -> String {
    crate::events::rfc3339_at(SystemTime::now().checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH))
}

impl Durable {
    /// Deletes the ended runs whose last change is older than `older_than`, in batches of
    /// [`PRUNE_BATCH`]; returns how many. With `dry_run`, deletes nothing and counts them.
    pub async fn prune(&self, older_than: Duration, dry_run: bool) -> Result<u64, StoreError> {
        let store = &self.store;
        let before = cutoff(older_than);
        if dry_run {
            return store.prune(&before, PRUNE_BATCH, true).await;
        }
        let mut total = 0;
        loop {
            let n = store.prune(&before, PRUNE_BATCH, false).await?;
            total += n;
            if n < PRUNE_BATCH as u64 {
                self.prune_fires(older_than).await?;
                return Ok(total);
            }
            // Between batches, the writers go first.
            tokio::task::yield_now().await;
        }
    }

    /// Deletes the schedules' fire records decided longer than `older_than` ago (with the runs
    /// [`Durable::prune`] deletes), but those still to start or buffered.
    async fn prune_fires(&self, older_than: Duration) -> Result<(), StoreError> {
        let Some(fires) = self.store.schedules() else { return Ok(()) };
        let since = SystemTime::now().checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH).duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let cutoff_ms = i64::try_from(since.as_millis()).unwrap_or(i64::MAX);
        while fires.prune_fires(cutoff_ms, PRUNE_BATCH).await? == PRUNE_BATCH as u64 {
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    /// Cancels, with the reason [`EXPIRED_REASON`], the runs that have awaited the user for
    /// longer than `older_than`; returns how many. A run replied to meanwhile is left alone.
    pub async fn expire_awaiting(&self, older_than: Duration, sink: Arc<dyn EventSink>) -> Result<u64, StoreError> {
        let store = &self.store;
        let mut expired = 0;
        loop {
            let ids = store.awaiting_since(&cutoff(older_than), PRUNE_BATCH).await?;
            let full = ids.len() == PRUNE_BATCH;
            for id in ids {
                match self.cancel(&id, Some(EXPIRED_REASON), sink.clone()).await {
                    Ok(Cancelling::Ended(_)) => expired += 1,
                    // Continued by a reply meanwhile (its holder ends it): it expired too late.
                    Ok(_) | Err(CancelError::NotCancellable { .. } | CancelError::NotFound(_)) => {}
                    Err(CancelError::Store(e)) => return Err(e),
                    Err(e) => return Err(StoreError::Database(e.to_string())),
                }
            }
            if !full {
                return Ok(expired);
            }
        }
    }
}
