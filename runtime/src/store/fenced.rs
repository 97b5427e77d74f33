//! [`Fenced`]: a claimed run's journal, the store and the run's lease: every write of the run
//! carries its fencing token.

use super::{Lease, RunStore, StoreError};
use crate::exec::{Durable, JournalBatch, JournalError, RunJournal};
use crate::failure::BoxFuture;

/// A claimed run's journal: every write carries its lease's fencing token.
#[derive(Debug, Clone, Copy)]
pub struct Fenced<'a> {
    pub store: &'a dyn RunStore,
    pub lease: &'a Lease,
}

impl RunJournal for Fenced<'_> {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        debug_assert_eq!(run_id, self.lease.run_id());
        Box::pin(async move { Ok(self.store.append(self.lease, batch).await?) })
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        debug_assert_eq!(run_id, self.lease.run_id());
        Box::pin(async move { Ok(self.store.commit(self.lease, batch).await?) })
    }

    fn append_then<'a>(&'a self, run_id: &'a str, batch: JournalBatch, durable: Option<Durable>) -> BoxFuture<'a, Result<(), JournalError>> {
        debug_assert_eq!(run_id, self.lease.run_id());
        Box::pin(async move {
            match durable {
                Some(d) => Ok(self.store.append_then(self.lease, batch, d).await?),
                None => Ok(self.store.append(self.lease, batch).await?),
            }
        })
    }
}

/// The executor's view of a failed write: whether the lease is gone, in the store's words.
impl From<StoreError> for JournalError {
    fn from(e: StoreError) -> JournalError {
        match e {
            StoreError::LeaseLost(_) => JournalError::LeaseLost(e.to_string()),
            other => JournalError::Failed(other.to_string()),
        }
    }
}
