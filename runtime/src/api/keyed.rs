//! Idempotent starts (`Idempotency-Key`): the header parsed once, and the answer to a retry, which
//! is the run the first start with the key accepted (`200`, `Idempotent-Replayed: true`, the same
//! `Location`), or `422 idempotency_key_reused` when the retry's start contract is another.

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, ErrorCode, RunView, waited};
use crate::runtime::{AcceptError, StartRequest};
use crate::store::{IdempotencyKey, StoredRun};

const HEADER: &str = "idempotency-key";

/// The request's idempotency key, if it sends one: 400 for one that is not 1 to 255 visible
/// ASCII characters, or for two of them.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let bad = |why: String| ApiError::new(ErrorCode::InvalidRequest, format!("`Idempotency-Key`: {why}"));
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(bad("sent more than once".into()));
    }
    // Not echoed: the message says what is wrong, not what was sent.
    let text = value.to_str().map_err(|_| bad("an idempotency key is visible ASCII (`!` to `~`)".into()))?;
    IdempotencyKey::parse(text).map(Some).map_err(|e| bad(e.to_string()))
}

/// The run a start's key accepted already, when `req` is the start contract it was accepted
/// with; `422 idempotency_key_reused` when it is another.
pub(super) fn same_start(state: &AppState, req: &StartRequest, run: StoredRun) -> Result<StoredRun, ApiError> {
    if !state.inner.durable.same_start(&run.request, req) {
        let e = AcceptError::KeyReused { run_id: run.run_id };
        return Err(ApiError::new(ErrorCode::IdempotencyKeyReused, e.to_string()));
    }
    Ok(run)
}

/// The answer to a start whose key accepted `run` already: that run (once it ended or asked,
/// with `wait`), `Idempotent-Replayed: true` and its `Location`.
pub(super) async fn replayed(state: &AppState, run: StoredRun, wait: bool) -> Result<Response, ApiError> {
    let location = format!("/v1/runs/{}", run.run_id);
    let view = if wait { waited(state, &run.run_id).await? } else { Json(RunView::of(run)) };
    let mut response = (StatusCode::OK, view).into_response();
    let headers = response.headers_mut();
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    if let Ok(v) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, v);
    }
    Ok(response)
}
