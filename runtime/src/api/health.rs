//! Health and description: `/healthz`, `/readyz` (the store and the replica's loops),
//! `/metrics` (Prometheus text) and `/openapi.json`.

use super::*;

/// Whether the process is up (no authentication).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "`{\"status\": \"ok\"}`")))]
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the database: under a probe's usual one-second timeout.
pub(super) const READY_WITHIN: Duration = Duration::from_millis(900);

/// Whether the service can take runs: catalogue loaded, store reachable (no authentication).
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "Ready"), (status = 503, description = "`store_unavailable`: the run store cannot take writes now, or did not answer within a second; `not_ready`: a background loop the replica needs (lease renewal, claims) panicked and waits to restart", body = ErrorBody)))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let runtime = &state.inner.durable;
    let store = runtime.store();
    // Not ready while writes fail (known without I/O), nor when the database does not answer
    // within the second a probe waits.
    store.health().map_err(store_error)?;
    // A loop the replica needs (lease renewal, claims) that panicked and waits to restart.
    let down = state.inner.loops.down();
    if !down.is_empty() {
        let why = format!("background loops restarting after a panic: {}", down.join(", "));
        return Err(ApiError::new(ErrorCode::NotReady, why));
    }
    // The fleet's backlog: runs no replica has claimed yet (a route no replica serves, or every
    // replica busy).
    let asked = async {
        store.ping().await?;
        store.queued().await
    };
    let queued = tokio::time::timeout(READY_WITHIN, asked)
        .await
        .map_err(|_| store_error(crate::store::StoreError::Unavailable(format!("no answer within {} ms", READY_WITHIN.as_millis()))))?
        .map_err(store_error)?;
    let ready = runtime.runtime().catalogue().routes().filter(|r| matches!(r, RouteEntry::Ready(_))).count();
    Ok(Json(json!({"status": "ready", "routes_ready": ready, "runs_in_flight": state.runs_in_flight(), "runs_queued": queued})))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text exposition 0.0.4", content_type = "text/plain"), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let mut text =
        state.inner.metrics.render(state.runs_in_flight(), &state.inner.durable.runtime().flow_status(), &state.inner.durable.runtime().breaker_status());
    state.inner.loops.render(&mut text);
    state.inner.fires.render(&mut text);
    state.inner.reloads.render(state.runtime().current().version().as_str(), &mut text);
    // The event streams' share of the load: streams open, and the store pollers they share.
    text.push_str(&format!(
        "# HELP fabric_event_streams Run event streams open.\n# TYPE fabric_event_streams gauge\nfabric_event_streams {}\n",
        state.inner.stream_slots.open()
    ));
    text.push_str(&format!(
        "# HELP fabric_store_refusals_total Requests refused (503 store_unavailable) while the run store could not take writes.\n# TYPE fabric_store_refusals_total counter\nfabric_store_refusals_total {}\n",
        STORE_REFUSALS.load(std::sync::atomic::Ordering::Relaxed)
    ));
    text.push_str(&format!(
        "# HELP fabric_event_stream_pollers Store pollers of runs followed through the store (one per run, shared by its streams).\n# TYPE fabric_event_stream_pollers gauge\nfabric_event_stream_pollers {}\n",
        state.inner.feeds.len()
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "The OpenAPI 3.1 document"), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn openapi_json() -> Json<Value> {
    Json(openapi::document())
}
