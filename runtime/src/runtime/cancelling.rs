//! Cancel on request: what [`Durable::cancel`] does with a run wherever it stands, and how a
//! process that executes runs finds the requests made elsewhere ([`Durable::cancel_requests`]).
//!
//! The request is recorded in the store first, so that it holds across processes: a queued or
//! awaiting run is claimed by the requester in the same statement and ended here at once; a
//! running one is ended by its holder, which looks for requests on its runs every second (and
//! `fabric run --store` at each lease beat); a run whose holder died with a request on it is
//! ended `cancelled` by whoever claims it next, without a walk ([`Durable::resume`]).

use std::sync::Arc;

use super::Durable;
use crate::events::EventSink;
use crate::exec::RunResult;
use crate::store::{CancelAsk, Fenced, Lease, StoreError};

/// The longest reason a cancel request may give, in bytes.
pub const MAX_CANCEL_REASON: usize = 1024;

/// The reason when a request gives none.
pub const DEFAULT_CANCEL_REASON: &str = "cancelled by request";

/// The reason a request gives, trimmed, or [`DEFAULT_CANCEL_REASON`] when it gives none.
fn cancel_reason(given: Option<&str>) -> &str {
    given.map(str::trim).filter(|r| !r.is_empty()).unwrap_or(DEFAULT_CANCEL_REASON)
}

/// What a cancel request did.
#[derive(Debug)]
pub enum Cancelling {
    /// The run was queued or awaiting input: it ended here, `cancelled` (its end is recorded).
    Ended(Box<RunResult>),
    /// The run is running: the request is recorded, and the process that executes it ends it
    /// (within a second of polling, at once when it is this one) with `reason`, the request's as
    /// stored (the first one made).
    Requested { reason: String },
    /// The run was cancelled already: nothing changed.
    Already,
}

/// Why a run could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no run `{0}`")]
    NotFound(String),
    /// It ended otherwise: a completed or failed run stays as it ended.
    #[error("run `{run_id}` is {status}: only a queued, running or awaiting run can be cancelled")]
    NotCancellable { run_id: String, status: &'static str },
    /// The reason is longer than [`MAX_CANCEL_REASON`], or holds a NUL (no store column takes
    /// one as text).
    #[error("{0}")]
    BadReason(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Durable {
    /// Cancels `run_id` with `reason` (or [`DEFAULT_CANCEL_REASON`]): see the module. A run that
    /// ends here sends its `run.cancelled` event to `sink` too.
    pub async fn cancel(&self, run_id: &str, reason: Option<&str>, sink: Arc<dyn EventSink>) -> Result<Cancelling, CancelError> {
        let reason = cancel_reason(reason);
        if reason.len() > MAX_CANCEL_REASON {
            return Err(CancelError::BadReason(format!("the reason has {} bytes; at most {MAX_CANCEL_REASON} are kept", reason.len())));
        }
        if let Some(at) = reason.find('\0') {
            return Err(CancelError::BadReason(format!("the reason holds a NUL character (at byte {at}), which the run store cannot keep")));
        }
        let store = self.store.as_ref();
        match store.request_cancel(run_id, reason, &self.holder).await? {
            CancelAsk::Claimed { lease, route_id, reason } => Ok(Cancelling::Ended(Box::new(self.end_cancelled(&lease, &route_id, &reason, sink).await?))),
            CancelAsk::Requested { reason } => Ok(Cancelling::Requested { reason }),
            CancelAsk::AlreadyCancelled => Ok(Cancelling::Already),
            CancelAsk::Ended(status) => Err(CancelError::NotCancellable { run_id: run_id.to_owned(), status: status.as_str() }),
            CancelAsk::NotFound => Err(CancelError::NotFound(run_id.to_owned())),
        }
    }

    /// Ends a run this process claimed with a cancel request on it, without a walk: `cancelled`,
    /// keeping what its journal holds. When its record cannot be read or written the claim is
    /// let go, so whoever claims the run next ends it (the request stays in the store).
    pub(super) async fn end_cancelled(&self, lease: &Lease, route_id: &str, reason: &str, sink: Arc<dyn EventSink>) -> Result<RunResult, StoreError> {
        let store = &self.store;
        let history = match super::durable::read_history(store.as_ref(), lease.run_id()).await {
            Ok(h) => h,
            Err(e) => {
                let _ = store.release(lease).await;
                return Err(e);
            }
        };
        let result = self.runtime.current().runner().end_cancelled(route_id, history, reason, sink, &Fenced { store: store.as_ref(), lease }).await;
        if result.status() != crate::exec::RunStatus::Cancelled {
            let _ = store.release(lease).await;
            let why = result.error().map(|e| e.message.clone()).unwrap_or_default();
            return Err(StoreError::Database(why));
        }
        Ok(result)
    }

    /// The runs this process executes that someone asked to cancel, with each request's reason:
    /// the caller cancels each one's segment with [`crate::cancel::CancelHandle::cancel_run`].
    pub async fn cancel_requests(&self) -> Result<Vec<(Lease, String)>, StoreError> {
        self.store.cancel_requests(&self.holder).await
    }

    /// Queued or awaiting runs with a cancel request no one acted on (see
    /// [`crate::store::RunStore::pending_cancels`]), to end with [`Durable::cancel`].
    pub async fn pending_cancels(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.store.pending_cancels(64).await
    }
}
