//! Cancel on request (`POST /v1/runs/{run_id}/cancel`) and the watch that makes a request made on
//! any replica reach the one that executes the run: every [`CANCEL_POLL`] each replica asks the
//! store for the requests on its runs and cancels their segments (a request made here reaches a
//! segment here at once), and ends queued or awaiting runs whose request no one acted on.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::body::{MaybeJsonBody, RunIdPath, no_run};
use super::{ApiError, AppState, ErrorBody, ErrorCode, RUN_ID_PARAM, RunView, store_error, view};
use crate::runtime::{CancelError, Cancelling};

/// How often a replica looks for cancel requests on the runs it executes (at most; a third of
/// the lease when that is shorter).
pub const CANCEL_POLL: Duration = Duration::from_secs(1);

/// A cancel request's body (optional: no body cancels with the default reason).
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why (at most 1,024 bytes): it is the run's `error.message` and the `run.cancelled` event's
    /// `reason`. Default `cancelled by request`.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Cancels a run: queued or awaiting input, it ends now; running, on any replica, it ends
/// within about a second, its model or tool call in flight aborted. The answer is the run as it
/// stands (`202`), or as it was cancelled before (`200`).
#[utoipa::path(post, path = "/v1/runs/{run_id}/cancel", request_body(content = CancelBody, description = "Optional"),
    params(("run_id" = String, Path, description = RUN_ID_PARAM)),
    responses((status = 202, description = "Cancelled now (queued or awaiting input), or requested (running: it ends within about a second)", body = RunView),
        (status = 200, description = "Cancelled already", body = RunView), (status = 404, body = ErrorBody),
        (status = 409, description = "`not_cancellable`: the run completed or failed", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, description = "A body not sent as `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "A body that is not `{reason}`, a reason over 1,024 bytes or with a NUL", body = ErrorBody),
        (status = 400, description = "A path that does not parse", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn cancel_run(
    State(state): State<AppState>,
    RunIdPath(run_id): RunIdPath,
    body: Result<MaybeJsonBody<CancelBody>, ApiError>,
) -> Result<Response, ApiError> {
    let MaybeJsonBody(body) = body?;
    let reason = body.unwrap_or_default().reason;
    let run_id = run_id.as_str();
    let status = match cancel_here(&state, run_id, reason.as_deref()).await {
        Ok(Cancelling::Ended(_) | Cancelling::Requested { .. }) => StatusCode::ACCEPTED,
        Ok(Cancelling::Already) => StatusCode::OK,
        Err(CancelError::NotFound(_)) => return Err(no_run(run_id)),
        Err(e @ CancelError::NotCancellable { .. }) => return Err(ApiError::new(ErrorCode::NotCancellable, e.to_string())),
        Err(e @ CancelError::BadReason(_)) => return Err(ApiError::new(ErrorCode::InvalidContent, e.to_string())),
        Err(CancelError::Store(e)) => return Err(store_error(e)),
    };
    Ok((status, Json(view(&state, run_id).await?)).into_response())
}

/// Cancels a run ([`crate::runtime::Durable::cancel`]); one executed here is cancelled at once,
/// not at the next poll, with the reason the store keeps (the first request's), as the poll
/// would.
pub(super) async fn cancel_here(state: &AppState, run_id: &str, reason: Option<&str>) -> Result<Cancelling, CancelError> {
    let done = state.inner.durable.cancel(run_id, reason, state.inner.metrics.clone()).await?;
    if let Cancelling::Requested { reason } = &done
        && let Some(live) = state.inner.live.get(run_id).filter(|l| !l.is_stopped())
    {
        live.cancel(reason);
    }
    Ok(done)
}

impl AppState {
    /// For ever: every [`CANCEL_POLL`], the cancel requests on the runs this replica executes
    /// cancel their segments (each ends `cancelled`, its call in flight aborted).
    pub async fn watch_cancels(self) {
        let runtime = self.inner.durable.clone();
        let mut tick = tokio::time::interval(CANCEL_POLL.min(runtime.holder().lease / 3));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Requests on runs not running, no one acted on: end them (any replica may; the
            // store lets one claim each).
            match runtime.pending_cancels().await {
                Ok(pending) => {
                    for (run_id, reason) in pending {
                        if let Err(e) = cancel_here(&self, &run_id, Some(&reason)).await {
                            tracing::warn!(run_id, error = %e, "ending a run with a cancel request on it");
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "run store: looking for cancel requests on runs not running"),
            }
            self.deliver_waiting_messages().await;
            if self.inner.live.is_empty() {
                continue;
            }
            match runtime.cancel_requests().await {
                Ok(asked) => {
                    for (lease, reason) in asked {
                        if let Some(live) = self.inner.live.get(lease.run_id()).filter(|l| *l.lease() == lease && !l.is_stopped()) {
                            live.cancel(&reason);
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "run store: looking for cancel requests"),
            }
        }
    }
}
