//! The HTTP service (`fabric serve`): the start contract, run records, live events, replies,
//! routes, health, metrics and the OpenAPI document, over the [`Runtime`] facade.
//!
//! [`router`] builds the whole app from an [`AppState`], so tests drive it without a socket;
//! [`serve`] serves it on a listener until a shutdown future resolves, and drains;
//! every error is one JSON shape, `{"error": {"code", "message", "problems"?}}`, made in one
//! place ([`ApiError`]). The service decides nothing about runs: it parses requests, asks the
//! runtime, and answers.

mod a2a;
mod body;
mod cancel;
mod catalogue;
mod error;
mod experiments;
mod follow;
mod health;
mod inbox;
mod inspect;
mod keyed;
mod live;
pub mod loops;
mod mcp;
pub mod metrics;
pub mod openapi;
mod routes;
mod runs;
pub mod scheduler;
mod schedules;
mod server;
mod state;
mod stream;
mod sweep;
mod ui;
mod ui_stream;
mod views;
mod webhooks;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use body::{JsonBody, PathText, RunIdPath, echo_id, no_run};
pub use error::{ApiError, ErrorBody, ErrorCode, ErrorDetail};
use health::*;
pub use inspect::{RunRecord, UpdatesParams};
pub use live::{Live, LiveEvent, LiveRun};
pub use metrics::Metrics;
use routes::*;
use runs::*;
pub use server::serve;
pub use state::{ApiConfig, AppState};
use stream::*;
pub use views::{Accepted, AcceptedStatus, ListParams, ReplyBody, RouteInfo, RunError, RunPage, RunView, StartBody, WaitParam};

use crate::cancel::Cancel;
use crate::catalogue::{RouteEntry, RouteLookupError};
use crate::events::EventSink;
use crate::exec::StartError;
use crate::runtime::{AcceptError, Durable, Runtime, StartRequest, Started};
use crate::store::{IdempotencyKey, RunFilter, RunId, StoredRun, StoredStatus};

pub(super) fn start_error(e: StartError) -> ApiError {
    match e {
        StartError::UnknownRoute { route, known, .. } => {
            ApiError::new(ErrorCode::NotFound, format!("unknown route `{}`; known routes: {known}", echo_id(&route)))
        }
        StartError::WrongFleet { route, target, fleet } => {
            ApiError::new(ErrorCode::WrongFleet, format!("route `{route}` is served by fleet `{target}`; this is fleet `{fleet}`: send it to `{target}`"))
        }
        StartError::BrokenRoute { route, problems } => {
            let mut e = ApiError::new(ErrorCode::BrokenRoute, format!("route `{route}` cannot run: the catalogue has errors in it"));
            e.problems = problems.0.iter().map(ToString::to_string).collect();
            e
        }
        StartError::InvalidGoal { route, problems } => {
            let mut e = ApiError::new(ErrorCode::InvalidContent, format!("the goal does not match the `goal_schema` of route `{route}`"));
            e.problems = problems;
            e
        }
        other => ApiError::new(ErrorCode::CannotStart, other.to_string()),
    }
}

/// What went wrong with the store, as the API tells it: the store cannot take writes now
/// (`503 store_unavailable` with `Retry-After`: full, read-only, away; the client retries), or
/// another failure (`503 store_error`). The details go to the log only.
pub(super) trait StoreProblem: std::fmt::Display {
    fn unavailable(&self) -> bool {
        false
    }
}

impl StoreProblem for &str {}

impl StoreProblem for crate::store::StoreError {
    fn unavailable(&self) -> bool {
        matches!(self, crate::store::StoreError::Unavailable(_))
    }
}

/// How long a client waits before trying again while the store cannot write.
pub(super) const STORE_RETRY_AFTER_S: u64 = 2;

/// Requests refused because the store could not take writes (`fabric_store_refusals_total`).
/// One process-wide count: the store's health logs the change of state once (`store::health`),
/// and a line per refused request wrote thousands of lines a minute while a disk was full.
pub(super) static STORE_REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn store_error(e: impl StoreProblem) -> ApiError {
    if e.unavailable() {
        STORE_REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(error = %e, "run store unavailable: request refused");
        let mut refused = ApiError::new(ErrorCode::StoreUnavailable, "the run store cannot take writes now; retry shortly");
        refused.retry_after = Some(STORE_RETRY_AFTER_S);
        return refused;
    }
    tracing::error!(error = %e, "run store");
    ApiError::new(ErrorCode::StoreError, "the run store is not available")
}

/// The app: every route, authentication, the request log.
pub fn router(state: AppState) -> Router {
    // Every request but an event stream ends within the wait limit plus a margin.
    let bounded = Router::new()
        .route("/v1/runs", post(start_run).get(list_runs))
        .route("/v1/runs/{run_id}", get(get_run))
        .route("/v1/runs/{run_id}/record", get(inspect::run_record))
        .route("/v1/runs/{run_id}/reply", post(reply))
        .route("/v1/runs/{run_id}/cancel", post(cancel::cancel_run))
        .route("/v1/runs/{run_id}/webhooks", get(webhooks::run_webhooks))
        .route("/v1/schedules", post(schedules::create_schedule).get(schedules::list_schedules))
        .route("/v1/schedules/{id}", get(schedules::get_schedule).patch(schedules::patch_schedule).delete(schedules::delete_schedule))
        .route("/v1/schedules/{id}/trigger", post(schedules::trigger_schedule))
        .route("/v1/schedules/{id}/fires", get(schedules::schedule_fires))
        .route("/v1/routes", get(list_routes))
        .route("/v1/catalogue", get(catalogue::catalogue_info))
        .route("/v1/catalogue/reload", post(catalogue::reload))
        .route("/v1/catalogue/diff", get(catalogue::catalogue_diff))
        .route("/v1/routes/{route_id}/graph.svg", get(route_graph_svg))
        .route("/v1/experiments", get(experiments::list_experiments))
        .route("/v1/experiments/{experiment_id}", get(experiments::get_experiment))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .layer(axum::middleware::from_fn_with_state(state.clone(), read_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), time_limit));
    // `/mcp`: Streamable HTTP, whose responses may be event streams (no time limit); a body
    // read like any other.
    let mcp = Router::new().route_service("/mcp", mcp::service(&state)).layer(axum::middleware::from_fn_with_state(state.clone(), read_body));
    // `/a2a/{route_id}`: JSON-RPC, whose answers may be event streams (no time limit).
    let a2a = a2a::rpc(|r| r.layer(axum::middleware::from_fn_with_state(state.clone(), read_body)));
    let api = Router::new()
        .route("/v1/runs/{run_id}/events", get(run_events))
        .merge(mcp)
        .merge(a2a)
        .route("/v1/runs/updates", get(inspect::run_updates))
        .merge(bounded)
        .layer(axum::middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(ui::router())
        .merge(a2a::cards())
        .merge(api)
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "this endpoint does not take that method") })
        .layer(axum::extract::DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        .layer(axum::middleware::from_fn(request_log))
        .with_state(state)
}

pub(super) async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.inner.config.token {
        // Exactly one `Authorization` header, scheme `Bearer` in any case (RFC 7235).
        let mut headers = request.headers().get_all(header::AUTHORIZATION).iter();
        let given = match (headers.next(), headers.next()) {
            (Some(v), None) => v.to_str().ok().and_then(|v| v.split_once(' ')).filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, t)| t),
            _ => None,
        };
        // `subtle`: a compare whose time says nothing about the token (the lengths aside).
        if !given.is_some_and(|g| bool::from(subtle::ConstantTimeEq::ct_eq(g.trim().as_bytes(), token.as_bytes()))) {
            let mut e = ApiError::new(ErrorCode::Unauthorized, "a valid `Authorization: Bearer <token>` header is required").into_response();
            e.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return e;
        }
    }
    next.run(request).await
}

/// The time a request may take (reading its body included): the wait limit plus 15 s.
pub(super) async fn time_limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit = state.inner.config.wait_max + Duration::from_secs(15);
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(ErrorCode::Timeout, format!("the request took longer than {} s", limit.as_secs())).into_response(),
    }
}

/// Reads the request's body whole, within the body timeout and the body limit, before the
/// handler sees it: hyper bounds only the headers' arrival, so a body trickled a byte at a time
/// (or a chunked one that never ends) would hold a connection and a task for as long as its
/// sender likes. Past the timeout: 408, and the connection is closed (the rest of the body is
/// never read).
pub(super) async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    use futures_util::StreamExt;
    let (parts, body) = request.into_parts();
    let limit = state.inner.config.max_body_bytes;
    let timeout = state.inner.config.body_timeout;
    let read = async {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| ApiError::new(ErrorCode::InvalidRequest, "the request body could not be read"))?;
            if bytes.len() + chunk.len() > limit {
                return Err(ApiError::new(ErrorCode::TooLarge, format!("the request body is larger than {limit} bytes")));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(e)) => e.into_response(),
        Err(_) => {
            let secs = timeout.as_secs_f64();
            let mut response = ApiError::new(ErrorCode::RequestTimeout, format!("the request body did not arrive within {secs} s")).into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// One line per request: its id, method, path (never the query), status and duration.
pub(super) async fn request_log(request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| uuid::Uuid::now_v7().to_string(), str::to_owned);
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let mut response = next.run(request).await;
    let status = response.status().as_u16();
    tracing::info!(request_id = %id, method = %method, path = %path, status, duration_ms = started.elapsed().as_secs_f64() * 1000.0, "request");
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

pub(super) fn too_many() -> ApiError {
    let mut e = ApiError::new(ErrorCode::TooManyRuns, "the service runs as many runs as it may; retry shortly");
    e.retry_after = Some(1);
    e
}

/// A query string that does not parse is a 400 in the API's error shape.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("the query string does not parse: {}", e.body_text())))
}
