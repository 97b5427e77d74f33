//! Messages for runs that were not asking (issue 52: an A2A message to a `working` task), the
//! service's side: a message kept in the run's inbox ([`crate::runtime::Durable::queue_message`])
//! is the reply to the run's next question, continued here like any reply. Three look for it, so
//! that a message is not left waiting by a race or a crash: the replica whose segment of the run
//! just ended asking (`runs::finish`), whoever queued it when the run asked meanwhile, and every
//! replica's watcher ([`AppState::deliver_waiting_messages`]) for a run whose replica died in
//! between. The store lets one of them take each message.

use super::runs::run_segment;
use super::{ApiError, AppState, ErrorCode, no_run, start_error, store_error};
use crate::runtime::ReplyError;

/// A refused reply as the service says it.
pub(super) fn reply_error(run_id: &str, e: ReplyError) -> ApiError {
    match e {
        ReplyError::NotFound(_) => no_run(run_id),
        ReplyError::NotWaiting { .. } => ApiError::new(ErrorCode::NotWaiting, e.to_string()),
        ReplyError::Store(s) => store_error(s),
        ReplyError::Start(s) => start_error(s),
        ReplyError::VersionGone { .. } | ReplyError::NoInbox => ApiError::new(ErrorCode::CannotStart, e.to_string()),
    }
}

/// Continues run `run_id` here with the oldest message queued for it, if it asked and one
/// waits; whether it did. With no room for another run here, it does not (the watcher tries
/// again).
pub(super) async fn deliver_queued(state: &AppState, run_id: &str) -> Result<bool, ApiError> {
    let Ok(permit) = state.inner.in_flight.clone().try_acquire_owned() else { return Ok(false) };
    match state.inner.durable.claim_queued_reply(run_id).await {
        Ok(Some(claimed)) => {
            let lease = claimed.lease().clone();
            run_segment(state, &lease, permit, move |runtime, sink, cancel| async move { runtime.continue_run(claimed, sink, cancel).await });
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => Err(reply_error(run_id, e)),
    }
}

impl AppState {
    /// Runs that asked while a message waits for them, continued (any replica may; the store
    /// lets one take each message). Called by the cancel watcher at each of its polls.
    pub(super) async fn deliver_waiting_messages(&self) {
        match self.inner.durable.runs_with_waiting_messages().await {
            Ok(runs) => {
                for run_id in runs {
                    if let Err(e) = deliver_queued(self, &run_id).await {
                        tracing::warn!(run_id, error = %e.message, "continuing a run with a message queued for it");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "run store: looking for runs with messages waiting"),
        }
    }
}
