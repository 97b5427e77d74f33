//! The HTTP service (`fabric serve`): the start contract, run records, live events, replies,
//! routes, health, metrics and the OpenAPI document, over the [`Runtime`] facade.
//!
//! [`router`] builds the whole app from an [`AppState`], so tests drive it without a socket;
//! [`serve`] serves it on a listener until a shutdown future resolves, and drains;
//! every error is one JSON shape, `{"error": {"code", "message", "problems"?}}`, made in one
//! place ([`ApiError`]). The service decides nothing about runs: it parses requests, asks the
//! runtime, and answers.

mod body;
mod cancel;
mod error;
mod follow;
mod inspect;
mod keyed;
mod live;
pub mod loops;
pub mod metrics;
pub mod openapi;
mod server;
mod sweep;
mod ui;
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
pub use inspect::{RunRecord, UpdatesParams};
pub use live::{Live, LiveEvent, LiveRun};
pub use metrics::Metrics;
pub use server::serve;

use crate::cancel::Cancel;
use crate::catalogue::{RouteEntry, RouteLookupError};
use crate::events::EventSink;
use crate::exec::StartError;
use crate::runtime::{AcceptError, Durable, ReplyError, Runtime, StartRequest, Started};
use crate::store::{RunFilter, RunId, StoredRun, StoredStatus};

/// The service's limits and access.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer token every endpoint but health needs; `None` only with `--no-auth`.
    pub token: Option<String>,
    /// Runs executing at once; more are refused with 429 and `Retry-After`.
    pub max_in_flight: usize,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// The largest goal (as compact JSON).
    pub max_goal_bytes: usize,
    /// The most prefetched chunks a run may be given.
    pub max_prefetch_chunks: usize,
    /// The largest prefetch, all its chunks together (their UTF-8 bytes).
    pub max_prefetch_bytes: usize,
    /// How long `?wait=true` waits before answering with the run as it stands.
    pub wait_max: Duration,
    /// Runs the store may hold `queued` (accepted while every replica was busy); past it, 429.
    /// 0: a busy service refuses new runs rather than queue them.
    pub max_queued: u64,
    /// How often this process looks for runs to claim (queued, or whose process stopped).
    pub claim_poll: Duration,
    /// How long a request's body may take to arrive, once its headers have; past it, 408.
    pub body_timeout: Duration,
    /// Event streams of one run open at once; past it, 429 `too_many_streams`.
    pub max_run_streams: usize,
    /// Run event streams open at once, all runs together; past it, 429 `too_many_streams`.
    pub max_event_streams: usize,
    /// How long [`serve`]'s shutdown lets the runs in flight finish before it hands them over.
    pub shutdown_grace: Duration,
    /// How long an event stream may wait for its client to take the next event; past it the
    /// stream ends (the client reconnects with `Last-Event-ID`). A client that keeps its
    /// connection open and reads nothing would otherwise hold its stream's place for good.
    pub stream_stall: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            token: None,
            max_in_flight: 1024,
            max_body_bytes: 1024 * 1024,
            max_goal_bytes: 256 * 1024,
            // Every model call of the run sees the prefetch: bounded like the goal, not only by
            // the body.
            max_prefetch_chunks: 256,
            max_prefetch_bytes: 256 * 1024,
            wait_max: Duration::from_secs(60),
            max_queued: 10_000,
            claim_poll: Duration::from_secs(1),
            body_timeout: Duration::from_secs(10),
            max_run_streams: 32,
            max_event_streams: 4096,
            shutdown_grace: Duration::from_secs(30),
            stream_stall: Duration::from_secs(30),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    durable: Arc<Durable>,
    config: ApiConfig,
    live: Live,
    metrics: Arc<Metrics>,
    in_flight: Arc<Semaphore>,
    /// Set when a shutdown begins: no more claims.
    stopping: std::sync::atomic::AtomicBool,
    /// Run-list streams (`/v1/runs/updates`) open at once.
    update_streams: Arc<Semaphore>,
    /// Set when a shutdown's grace period is over: every event stream ends then, with a
    /// `: shutting down` comment (a stream would otherwise hold the shutdown until its run ends).
    closing: tokio::sync::watch::Sender<bool>,
    /// One store poller per run followed through the store, shared by its streams.
    feeds: Arc<follow::Feeds>,
    /// The run event streams open, per run and in all (the caps).
    stream_slots: Arc<follow::StreamSlots>,
    /// Wakes the webhook sender: a run ended or asked here.
    webhook_wake: tokio::sync::Notify,
    /// The replica's background loops: which are down, how often each panicked.
    loops: Arc<loops::Loops>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl AppState {
    /// A service over `durable`: its runtime and its run store.
    pub fn new(durable: Arc<Durable>, config: ApiConfig) -> AppState {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        let stopping = std::sync::atomic::AtomicBool::new(false);
        let update_streams = Arc::new(Semaphore::new(inspect::MAX_UPDATE_STREAMS));
        let closing = tokio::sync::watch::channel(false).0;
        AppState {
            inner: Arc::new(Shared {
                durable,
                config,
                live: Live::default(),
                metrics: Arc::default(),
                in_flight,
                stopping,
                update_streams,
                closing,
                feeds: Arc::default(),
                stream_slots: Arc::default(),
                webhook_wake: tokio::sync::Notify::new(),
                loops: Arc::default(),
            }),
        }
    }

    /// The record of this replica's background loops (their owner, [`crate::replica::Replica`],
    /// keeps it).
    pub fn loops(&self) -> &loops::Loops {
        &self.inner.loops
    }

    /// The same record, shared with the replica's supervisors.
    pub fn loops_shared(&self) -> Arc<loops::Loops> {
        self.inner.loops.clone()
    }

    /// The runtime the service runs.
    pub fn runtime(&self) -> &Arc<Runtime> {
        self.inner.durable.runtime()
    }

    /// The runtime with its run store.
    pub fn durable(&self) -> &Arc<Durable> {
        &self.inner.durable
    }

    /// Every third of the lease, for ever, renews the leases of the runs this process executes
    /// (and stops those another process took over). A loop of the replica's
    /// ([`crate::replica::Replica`]), apart from the claims, so that slow claims never delay a
    /// renewal past the lease.
    pub async fn renew_leases(self) {
        let durable = self.inner.durable.clone();
        let held = || self.inner.live.leases();
        let never = durable
            .keep_leases(held, |leases, lost| {
                for run_id in lost {
                    // The segment that held the lost lease, not a newer one of the same run
                    // (this process may have claimed the run again meanwhile); stopped
                    // already: handed over at a shutdown.
                    let Some(token) = leases.iter().find(|l| l.run_id == run_id).map(|l| l.token) else { continue };
                    let Some(live) = self.inner.live.get(&run_id).filter(|l| l.lease().token == token && !l.is_stopped()) else { continue };
                    tracing::warn!(
                        run_id,
                        "run lease lost (another process took the run over after this one went silent past its lease); this process stops the run"
                    );
                    live.stop("lease lost");
                }
                std::future::ready(())
            })
            .await;
        match never {}
    }

    /// Every `claim_poll`, until a shutdown begins, claims what this process has room for:
    /// queued runs, and runs whose process stopped renewing (died, or stalled past its lease),
    /// which go on from their journal. A loop of the replica's.
    pub async fn claim_work(self) {
        let runtime = self.inner.durable.clone();
        let poll = self.inner.config.claim_poll.min(runtime.holder().lease / 3).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let room = self.inner.in_flight.available_permits().min(64);
            if room == 0 {
                continue;
            }
            let claimed = match runtime.claim_runs(room).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "run store: claiming runs");
                    continue;
                }
            };
            for run in claimed {
                let lease = run.lease().clone();
                let Ok(permit) = self.inner.in_flight.clone().try_acquire_owned() else {
                    // A request took the room meanwhile: let the run go for the next claim.
                    let _ = runtime.release(&lease).await;
                    continue;
                };
                // A segment of this very run still going here held the lease this claim took
                // (its process was cut off from the database past the lease): it is stopped, and
                // the run goes on from its journal in the new segment.
                if let Some(old) = self.inner.live.get(&lease.run_id).filter(|l| l.lease().token != lease.token) {
                    old.stop("taken over");
                }
                if run.is_takeover() {
                    self.inner.metrics.taken_over(run.route_id());
                    tracing::warn!(run_id = lease.run_id, claim = lease.token, "taking over a run whose process stopped; it goes on from its journal");
                } else {
                    tracing::info!(run_id = lease.run_id, "claimed a queued run");
                }
                run_segment(&self, &lease, permit, move |runtime, sink, cancel| async move { Ok(runtime.resume(run, sink, cancel).await) });
            }
        }
    }

    /// Runs executing now.
    pub fn runs_in_flight(&self) -> usize {
        self.inner.config.max_in_flight - self.inner.in_flight.available_permits()
    }

    /// Stops claiming, waits until no run executes, at most `grace`; then hands the rest over:
    /// their leases are let go, so another replica (or this one's successor) claims each at once
    /// and continues it from its journal; the work since each run's last commit is done again
    /// there. Returns how many runs were handed over.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        while self.runs_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let go first (the fence then refuses whatever the stopped segment still writes), then
        // stop: nothing of the interruption reaches the record, a client or the metrics.
        let leases = self.inner.live.leases();
        for lease in &leases {
            if let Err(e) = self.inner.durable.release(lease).await {
                tracing::error!(run_id = lease.run_id, error = %e, "run store: handing a run over");
            }
            if let Some(live) = self.inner.live.get(&lease.run_id) {
                live.stop("handed over");
            }
        }
        self.inner.durable.leave_fleet().await;
        // The streams have shown what the grace period let finish; they end now, cleanly, so
        // that their connections close and the process can stop. After a handover, a little
        // later: a stream following a handed-over run then shows its end too when the replica
        // that took it over finishes it quickly.
        if leases.is_empty() {
            self.inner.closing.send_replace(true);
        } else {
            let state = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HANDOVER_FOLLOW).await;
                state.inner.closing.send_replace(true);
            });
        }
        leases.len()
    }
}

/// How long event streams go on after a shutdown handed runs over (see [`AppState::drain`]).
const HANDOVER_FOLLOW: Duration = Duration::from_secs(3);

fn start_error(e: StartError) -> ApiError {
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
        other => ApiError::new(ErrorCode::CannotStart, other.to_string()),
    }
}

/// What went wrong with the store, as the API tells it: the store cannot take writes now
/// (`503 store_unavailable` with `Retry-After`: full, read-only, away; the client retries), or
/// another failure (`503 store_error`). The details go to the log only.
trait StoreProblem: std::fmt::Display {
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
const STORE_RETRY_AFTER_S: u64 = 2;

/// Requests refused because the store could not take writes (`fabric_store_refusals_total`).
/// One process-wide count: the store's health logs the change of state once (`store::health`),
/// and a line per refused request wrote thousands of lines a minute while a disk was full.
static STORE_REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn store_error(e: impl StoreProblem) -> ApiError {
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

/// The start contract as JSON: `{route_id, goal, model_profile, prefetch?, session_id?}`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StartBody {
    pub route_id: String,
    /// A JSON object.
    #[schema(value_type = Object)]
    pub goal: Value,
    /// A model profile of the catalogue; recorded with the run (the route's profile chooses the model).
    pub model_profile: String,
    /// Prefetched chunks every model call of the run sees.
    #[serde(default)]
    pub prefetch: Option<Vec<String>>,
    #[serde(default)]
    pub session_id: Option<String>,
    /// Where this run's ends (and questions) are posted, signed, instead of the fleet's
    /// `FABRIC_WEBHOOK_URL`; its origin must be one of `FABRIC_WEBHOOK_ALLOWED_ORIGINS`, else
    /// `422 webhook_not_allowed`.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// With a `session_id`: what this start does while another run of the session is live
    /// (running, queued or awaiting input), instead of the fleet's `FABRIC_SESSION_POLICY`:
    /// `allow` (both run), `reject` (`409 session_busy`), `enqueue` (this run waits, queued, until
    /// the live ones ended) or `interrupt` (they are cancelled, reason `interrupted_by_session`,
    /// and this run starts once they ended).
    #[serde(default)]
    pub multitask: Option<crate::config::SessionPolicy>,
}

/// A run accepted (201), or accepted again by a reply (202).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Accepted {
    pub run_id: String,
    /// `running`, or `queued` when every run slot of this process was taken (any replica with
    /// room claims it).
    pub status: AcceptedStatus,
}

/// Where an accepted run stands at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedStatus {
    Running,
    Queued,
}

/// Why a run failed: its reason class, what happened, and the stage where it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunError {
    pub reason_class: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_id: Option<String>,
}

/// The parts of a stored run's result (the object `fabric run` prints) that a view shows.
#[derive(Debug, Default, Deserialize)]
struct StoredResult {
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    slots: Option<Value>,
    #[serde(default)]
    notes: Vec<String>,
    #[serde(default)]
    error: Option<RunError>,
}

/// A run: the same object as `fabric run` prints once it ended or asked (`output`, `slots`,
/// `notes`, `question`, `error`), and `created_at`/`updated_at` from the store.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub route_id: String,
    pub status: StoredStatus,
    #[serde(default)]
    pub output: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub slots: Value,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    pub created_at: String,
    pub updated_at: String,
}

impl RunView {
    /// The view of a stored run.
    pub fn of(run: StoredRun) -> RunView {
        // A result that does not read (written by no version of this runtime) shows as none.
        let recorded = run.result.filter(|r| !r.is_null());
        let has_result = recorded.is_some();
        let result: StoredResult = recorded.and_then(|r| serde_json::from_value(r).ok()).unwrap_or_default();
        // A run failed without a result of its own was ended by a claim (its process stopped).
        let error = result.error.or_else(|| {
            (run.status == StoredStatus::Failed && !has_result).then(|| RunError {
                reason_class: run.reason_class.clone().unwrap_or_else(|| "interrupted".into()),
                message: "the process running it stopped".into(),
                stage_id: None,
            })
        });
        RunView {
            run_id: run.run_id,
            route_id: run.route_id,
            status: run.status,
            output: result.output,
            slots: result.slots.unwrap_or_else(|| json!({})),
            notes: result.notes,
            question: run.question,
            error,
            created_at: run.created_at,
            updated_at: run.updated_at,
        }
    }
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `before` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The reply to a run that asked.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplyBody {
    pub message: String,
}

/// A route of the catalogue.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RouteInfo {
    pub id: String,
    /// The fleet that serves it (`activation_target`), if it names one.
    #[serde(default)]
    pub fleet: Option<String>,
    /// `workflow`, `branched`, `manifest` or `pattern1`; `broken` when it cannot run.
    pub kind: String,
    pub description: String,
    /// Whether this runtime starts it (its fleet, and not broken).
    pub runs_here: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParam {
    /// Answer with the run once it ends or asks (at most the service's wait limit).
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Runs of this route only (one with a control character names none: an empty page).
    pub route_id: Option<String>,
    /// `queued`, `running`, `completed`, `failed` or `awaiting_input`.
    pub status: Option<String>,
    /// A run id: list runs older than it (the `next` of the previous page); anything else is 400.
    pub before: Option<String>,
    /// Page size, 1 to 200 (default 50); anything else is 400.
    pub limit: Option<u32>,
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
        .route("/v1/routes", get(list_routes))
        .route("/v1/routes/{route_id}/graph.svg", get(route_graph_svg))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .layer(axum::middleware::from_fn_with_state(state.clone(), read_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), time_limit));
    let api = Router::new()
        .route("/v1/runs/{run_id}/events", get(run_events))
        .route("/v1/runs/updates", get(inspect::run_updates))
        .merge(bounded)
        .layer(axum::middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(ui::router())
        .merge(api)
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "this endpoint does not take that method") })
        .layer(axum::extract::DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        .layer(axum::middleware::from_fn(request_log))
        .with_state(state)
}

async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
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
async fn time_limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
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
async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
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
async fn request_log(request: Request, next: Next) -> Response {
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

/// The service's view of a run's end, as stored.
async fn view(state: &AppState, run_id: &str) -> Result<RunView, ApiError> {
    let store = state.inner.durable.store();
    match store.get_run(run_id).await.map_err(store_error)? {
        Some(run) => Ok(RunView::of(run)),
        None => Err(no_run(run_id)),
    }
}

fn sink_for(state: &AppState, live: &Arc<LiveRun>) -> Arc<dyn EventSink> {
    Arc::new(Segment { live: live.clone(), metrics: state.inner.metrics.clone() })
}

/// A segment's events: to the live tail and the metrics, until the segment is stopped.
struct Segment {
    live: Arc<LiveRun>,
    metrics: Arc<Metrics>,
}

impl EventSink for Segment {
    fn emit(&self, event: &crate::events::Event) {
        if !self.live.is_stopped() {
            self.live.emit(event);
            self.metrics.emit(event);
        }
    }
}

fn too_many() -> ApiError {
    let mut e = ApiError::new(ErrorCode::TooManyRuns, "the service runs as many runs as it may; retry shortly");
    e.retry_after = Some(1);
    e
}

/// A query string that does not parse is a 400 in the API's error shape.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("the query string does not parse: {}", e.body_text())))
}

/// Starts a run.
#[utoipa::path(post, path = "/v1/runs", request_body = StartBody, params(WaitParam, ("Idempotency-Key" = Option<String>, Header,
        description = "1 to 255 visible ASCII characters. The first start with a key starts the run; a later one with the same key and the same start contract (compared as parsed JSON) answers 200 with that run (`Idempotent-Replayed: true`, the same `Location`; with `wait=true` once it ended or asked), on any replica; another contract is `422 idempotency_key_reused`. Kept as long as its run")),
    responses(
        (status = 201, description = "Accepted; the run executes (see `Location`)", body = Accepted),
        (status = 200, description = "With `wait=true`: the run once it ended or asked. With an `Idempotency-Key` already used for this contract: that run (`Idempotent-Replayed: true`, `Location`)", body = RunView),
        (status = 404, description = "Unknown route", body = ErrorBody),
        (status = 409, description = "`wrong_fleet`: the route is served by another fleet; `session_busy`: the session has a live run and its policy is `reject` (the message names the run)", body = ErrorBody),
        (status = 413, description = "Body, goal or prefetch too large", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout (`FABRIC_BODY_TIMEOUT_S`); the connection is closed", body = ErrorBody),
        (status = 415, description = "A body not sent as `Content-Type: application/json`, or encoded (`Content-Encoding`)", body = ErrorBody),
        (status = 422, description = "Invalid body: not a JSON object, a goal that is not an object, an integer beyond 64 bits; an unknown profile; a route that cannot start (`broken_route`, `cannot_start`); `idempotency_key_reused`: the key started another contract's run; `webhook_not_allowed`: a `webhook_url` whose origin is not in `FABRIC_WEBHOOK_ALLOWED_ORIGINS`", body = ErrorBody),
        (status = 429, description = "Too many runs in flight (see `Retry-After`)", body = ErrorBody),
        (status = 400, description = "A query string that does not parse; an `Idempotency-Key` that is not 1 to 255 visible ASCII characters, or sent twice", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (with `Retry-After`): the run store cannot take writes now, nothing was recorded; `store_error`; or `timeout`", body = ErrorBody)),
    security(("bearer" = [])))]
async fn start_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    wait: Result<Query<WaitParam>, QueryRejection>,
    body: Result<JsonBody<StartBody>, ApiError>,
) -> Result<Response, ApiError> {
    let wait = query(wait)?;
    let key = keyed::idempotency_key(&headers)?;
    let config = &state.inner.config;
    let JsonBody(body) = body?;
    let Value::Object(goal) = body.goal else {
        return Err(ApiError::new(ErrorCode::InvalidContent, "`goal` must be a JSON object"));
    };
    let goal_bytes = serde_json::to_vec(&goal).map_or(0, |g| g.len());
    if goal_bytes > config.max_goal_bytes {
        return Err(ApiError::new(ErrorCode::TooLarge, format!("the goal is {goal_bytes} bytes; the limit is {}", config.max_goal_bytes)));
    }
    let prefetch = body.prefetch.unwrap_or_default();
    let prefetch_bytes: usize = prefetch.iter().map(String::len).sum();
    if prefetch.len() > config.max_prefetch_chunks || prefetch_bytes > config.max_prefetch_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!(
                "the prefetch is {} chunks, {prefetch_bytes} bytes; the limit is {} chunks, {} bytes",
                prefetch.len(),
                config.max_prefetch_chunks,
                config.max_prefetch_bytes
            ),
        ));
    }
    let req = StartRequest {
        route_id: body.route_id,
        goal,
        model_profile: Some(body.model_profile),
        prefetch,
        session_id: body.session_id,
        webhook_url: body.webhook_url,
        multitask: body.multitask,
    };
    // Room here: the run is claimed by this process as it is accepted. None: it is queued in
    // the store for any replica with room, up to the queue's bound.
    // A retry of a keyed start is answered before any bound: it starts nothing.
    if let Some(key) = &key
        && let Some(run) = state.inner.durable.store().run_of_key(key).await.map_err(store_error)?
    {
        return keyed::replayed(&state, &req, run, wait.wait).await;
    }
    let permit = state.inner.in_flight.clone().try_acquire_owned().ok();
    // A session's `enqueue` or `interrupt` start is stored queued whatever room there is (it
    // waits behind the session's live runs): the queue's bound holds for it too, or one client
    // could queue runs without end behind a run that waits on it (issue 46).
    let policy = req.multitask.unwrap_or(state.inner.durable.runtime().settings().service.session_policy);
    let queued_start = req.session_id.as_deref().is_some_and(|s| !s.is_empty())
        && matches!(policy, crate::config::SessionPolicy::Enqueue | crate::config::SessionPolicy::Interrupt);
    if permit.is_none() || queued_start {
        let store = state.inner.durable.store();
        if config.max_queued == 0 && permit.is_none() {
            return Err(too_many());
        }
        if config.max_queued == 0 {
            let why = "FABRIC_MAX_QUEUED_RUNS is 0: no run waits in the queue, and a session's `enqueue` or `interrupt` start always does";
            return Err(ApiError::new(ErrorCode::TooManyRuns, why));
        }
        if store.queued().await.map_err(store_error)? >= config.max_queued {
            let mut e = ApiError::new(ErrorCode::TooManyRuns, "the fleet's queue of runs is full; retry shortly");
            e.retry_after = Some(1);
            return Err(e);
        }
    }
    let accepted = match &key {
        None => state.inner.durable.accept(&req, permit.is_some()).await.map_err(accept_error)?,
        Some(key) => match state.inner.durable.accept_once(&req, permit.is_some(), key).await.map_err(accept_error)? {
            Started::New(accepted) => accepted,
            // Another replica's start with this key won the race.
            Started::Replayed(run) => return keyed::replayed(&state, &req, *run, wait.wait).await,
        },
    };
    let run_id = accepted.run_id.clone();
    // `interrupt`: the cancel of each live run of the session was requested with the start; it
    // ends them now (queued, awaiting; running here) or at their replica's next poll.
    // In a task of its own: a client that goes away does not stop it (and should it stop, each
    // replica's poll ends them: the requests are recorded).
    if !accepted.interrupted.is_empty() {
        let (state, olds) = (state.clone(), accepted.interrupted.clone());
        tokio::spawn(async move {
            for old in &olds {
                if let Err(e) = cancel::cancel_here(&state, old, Some(crate::config::INTERRUPTED_BY_SESSION)).await {
                    tracing::warn!(run_id = old, error = %e, "interrupting a run of the session (a replica's poll ends it)");
                }
            }
        });
    }
    let status = match (permit, accepted.lease) {
        (Some(permit), Some(lease)) => {
            let held = lease.clone();
            run_segment(&state, &held, permit, move |runtime, sink, cancel| async move { runtime.execute(&lease, &req, sink, cancel).await });
            AcceptedStatus::Running
        }
        _ => AcceptedStatus::Queued,
    };
    if wait.wait {
        return Ok(waited(&state, &run_id).await?.into_response());
    }
    let mut response = (StatusCode::CREATED, Json(Accepted { run_id: run_id.clone(), status })).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{run_id}")) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// A start refused by the facade, as the API answers it.
fn accept_error(e: AcceptError) -> ApiError {
    match e {
        AcceptError::Start(s) => start_error(s),
        AcceptError::UnknownProfile(p) => ApiError::new(ErrorCode::InvalidContent, format!("model profile `{}` is not defined", echo_id(&p))),
        AcceptError::Store(s) => store_error(s),
        AcceptError::NotClaimed => store_error("the run could not be claimed"),
        e @ AcceptError::KeyReused { .. } => ApiError::new(ErrorCode::IdempotencyKeyReused, e.to_string()),
        AcceptError::WebhookNotAllowed(e @ crate::config::WebhookRefused::Invalid) => ApiError::new(ErrorCode::InvalidContent, e.to_string()),
        AcceptError::WebhookNotAllowed(e) => ApiError::new(ErrorCode::WebhookNotAllowed, e.to_string()),
        AcceptError::SessionBusy { session, run_id } => ApiError::new(
            ErrorCode::SessionBusy,
            format!("session `{}` has a live run, {run_id}; its policy (multitask `reject`) refuses another until it ends", echo_id(&session)),
        ),
        e @ AcceptError::BadSession(_) => ApiError::new(ErrorCode::InvalidContent, e.to_string()),
    }
}

/// Executes a run segment (a start, or a reply's continuation) in the background while holding
/// its permit; its events go to the live tail and the metrics; its end to [`finish`].
fn run_segment<F, Fut>(state: &AppState, lease: &crate::store::Lease, permit: tokio::sync::OwnedSemaphorePermit, segment: F) -> Arc<LiveRun>
where
    F: FnOnce(Arc<Durable>, Arc<dyn EventSink>, Cancel) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<crate::runtime::RunOutcome, StartError>> + Send,
{
    let live = state.inner.live.begin(lease);
    let (task_state, task_live) = (state.clone(), live.clone());
    tokio::spawn(async move {
        let _permit = permit;
        let sink = sink_for(&task_state, &task_live);
        let outcome = segment(task_state.inner.durable.clone(), sink, task_live.cancel_token()).await;
        finish(&task_state, &task_live, outcome.map(|o| o.result)).await;
    });
    live
}

/// Ends a live segment with the run's stored view (its record is complete by now).
async fn finish(state: &AppState, live: &LiveRun, outcome: Result<crate::exec::RunResult, StartError>) {
    let run_id = live.lease().run_id.as_str();
    if let Err(e) = &outcome {
        tracing::warn!(run_id, error = %e, "run did not start");
    }
    if let Ok(r) = &outcome
        && !live.is_stopped()
        && let Some(e) = r.error().filter(|e| e.reason_class == crate::failure::ReasonClass::StoreError)
    {
        tracing::error!(run_id, error = %e.message, "run record");
        // Its end is not recorded: let it go, so a process (this one, or another) takes it over
        // from its journal at once. A lease already lost is not this process's to let go (the
        // store checks the token).
        if let Err(e) = state.inner.durable.release(live.lease()).await {
            tracing::error!(run_id, error = %e, "run store: letting a run go");
        }
    }
    // A cancel requested while the run ran, which asked before this replica saw the request (an
    // interrupting start of its session, say), ends it now rather than leave it asking.
    if let Ok(Some(run)) = state.inner.durable.store().get_run(run_id).await
        && run.status == StoredStatus::AwaitingInput
        && let Some(reason) = run.cancel_reason
        && let Err(e) = cancel::cancel_here(state, run_id, Some(&reason)).await
    {
        tracing::warn!(run_id, error = %e, "ending a run that asked after its cancel was requested");
    }
    let stored = view(state, run_id).await.ok().and_then(|v| serde_json::to_value(v).ok()).unwrap_or(Value::Null);
    state.inner.live.finish(live, stored);
    state.wake_webhooks();
}

use follow::FOLLOW_POLL;

/// The run once it ended or asked, or as it stands after the wait limit: followed live when
/// this process executes it, through the store otherwise.
async fn waited(state: &AppState, run_id: &str) -> Result<Json<RunView>, ApiError> {
    let deadline = Instant::now() + state.inner.config.wait_max;
    loop {
        if let Some(live) = state.inner.live.get(run_id) {
            let _ = tokio::time::timeout_at(deadline.into(), live.wait()).await;
        }
        let v = view(state, run_id).await?;
        if !v.status.is_pending() || Instant::now() >= deadline {
            return Ok(Json(v));
        }
        // Not executing here: the run's shared poller (one per run, however many wait on it or
        // stream it), until it ends or asks, or this process executes it; the store is read
        // again then. Each waiter polling the store itself cost five reads a second.
        let store = state.inner.durable.store().clone();
        let mut feed = state.inner.feeds.follow(store, run_id);
        let moved = feed.state.wait_for(|s| s.ended || state.inner.live.get(run_id).is_some());
        if !matches!(tokio::time::timeout_at(deadline.into(), moved).await, Ok(Ok(_))) {
            // The poller stopped (a store error: read the store once more) or the wait is over.
            tokio::time::sleep(FOLLOW_POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }
}

/// A run: the result object once it ended or asked.
#[utoipa::path(get, path = "/v1/runs/{run_id}", params(("run_id" = String, Path, description = RUN_ID_PARAM)),
    responses((status = 200, body = RunView), (status = 404, body = ErrorBody), (status = 400, description = PATH_400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
async fn get_run(State(state): State<AppState>, RunIdPath(run_id): RunIdPath) -> Result<Json<RunView>, ApiError> {
    view(&state, run_id.as_str()).await.map(Json)
}

/// The OpenAPI description of every `{run_id}`.
const RUN_ID_PARAM: &str = "The run id: a lowercase hyphenated UUID; anything else names no run (404)";
/// The OpenAPI description of a path's 400.
const PATH_400: &str = "A path that does not parse (not UTF-8 once percent-decoded)";

/// Runs, newest first, paged.
#[utoipa::path(get, path = "/v1/runs", params(ListParams), responses((status = 200, body = RunPage), (status = 400, description = "A query string that does not parse, a `before` that is no run id, a `limit` outside 1 to 200", body = ErrorBody), (status = 422, description = "An unknown status", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
async fn list_runs(State(state): State<AppState>, p: Result<Query<ListParams>, QueryRejection>) -> Result<Json<RunPage>, ApiError> {
    let p = query(p)?;
    let status = parse_status(p.status.as_deref())?;
    let limit = match p.limit {
        None => 50,
        Some(l @ 1..=200) => l,
        Some(_) => return Err(ApiError::new(ErrorCode::InvalidRequest, "`limit` must be 1 to 200")),
    };
    let before = match p.before.as_deref().map(RunId::parse) {
        None => None,
        Some(Some(id)) => Some(id),
        Some(None) => return Err(ApiError::new(ErrorCode::InvalidRequest, "`before` must be a run id (the `next` of a page)")),
    };
    if p.route_id.as_deref().is_some_and(names_no_route) {
        return Ok(Json(RunPage { runs: Vec::new(), next: None }));
    }
    let filter = RunFilter { route_id: p.route_id, status, before: before.map(|b| b.as_str().to_owned()), limit: limit + 1 };
    let store = state.inner.durable.store();
    let mut runs: Vec<RunView> = store.list_runs(&filter).await.map_err(store_error)?.into_iter().map(RunView::of).collect();
    let next = (runs.len() > limit as usize).then(|| {
        runs.truncate(limit as usize);
        runs.last().map(|r| r.run_id.clone())
    });
    Ok(Json(RunPage { runs, next: next.flatten() }))
}

/// A `route_id` filter that can name no route (a NUL or another control character: no catalogue
/// id has one), answered as empty without asking the store (PostgreSQL refuses a NUL outright).
fn names_no_route(route_id: &str) -> bool {
    route_id.chars().any(char::is_control)
}

/// A `status` query parameter: one of the stored statuses.
fn parse_status(status: Option<&str>) -> Result<Option<StoredStatus>, ApiError> {
    status
        .map(|s| {
            StoredStatus::parse(s).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidContent,
                    format!("`status` `{}` is not one of queued, running, completed, failed, awaiting_input, cancelled", echo_id(s)),
                )
            })
        })
        .transpose()
}

/// A run's events as Server-Sent Events: from the start, or after `Last-Event-ID`; live until
/// the run ends or asks (or a shutdown's grace period is over: then a `: shutting down` comment
/// ends it). Each event's id is its `seq`.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", params(("run_id" = String, Path, description = RUN_ID_PARAM), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq (0 to 9223372036854775807)")),
    responses((status = 200, description = "`text/event-stream`; `data` is the event JSON, `event` its type", content_type = "text/event-stream"), (status = 400, description = "A `Last-Event-ID` that is not a seq, or a path that does not parse", body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, description = "Too many event streams open, of this run (32) or in all (4096); see `Retry-After`", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn run_events(
    State(state): State<AppState>,
    RunIdPath(run_id): RunIdPath,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let run_id = run_id.as_str().to_owned();
    let after: u64 = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            // A seq is an integer column of the store: past its range, no event is after it.
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "`Last-Event-ID` must be the `seq` of an event (a whole number)"))?,
    };
    let store = state.inner.durable.store().clone();
    if store.get_run(&run_id).await.map_err(store_error)?.is_none() {
        return Err(no_run(&run_id));
    }
    let config = &state.inner.config;
    let slot = state.inner.stream_slots.take(&run_id, config.max_run_streams, config.max_event_streams).ok_or_else(|| {
        let mut e = ApiError::new(ErrorCode::TooManyStreams, "too many event streams are open (of this run, or in all); retry shortly");
        e.retry_after = Some(5);
        e
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    let follower = state.clone();
    // The stream's slot is given back when the client goes, whatever the task waits on then (a
    // live run's next event, a poller's next read): hyper drops the body, `rx` with it, as soon
    // as it reads the connection's end, and `closed` fires. Waiting only on sends held the slot
    // of a gone client for as long as its run made no event (issue 46).
    let gone = tx.clone();
    let stall = config.stream_stall;
    let stream = async move {
        let sse = |seq: u64, kind: &str, json: &str| SseEvent::default().id(seq.to_string()).event(kind).data(json);
        let mut last = after;
        loop {
            // The live segment first, then the record: an event is in one or the other (a
            // segment leaves the registry only after its last commit).
            let live = follower.inner.live.get(&run_id);
            // Not executing here: the run's shared poller, joined before the store is read, so
            // that what is written meanwhile comes through it.
            let feed = live.is_none().then(|| follower.inner.feeds.follow(store.clone(), &run_id));
            let status = match store.get_run(&run_id).await {
                Ok(Some(run)) => run.status,
                _ => return,
            };
            let Ok(stored) = store.events_after(&run_id, last).await else { return };
            for e in stored {
                last = e.seq;
                if !send_within(&tx, sse(e.seq, &e.kind, &e.body), stall).await {
                    return;
                }
            }
            if let Some(live) = live {
                let mut ticks = live.subscribe();
                loop {
                    let (events, ended) = live.events_after(last);
                    for e in events {
                        last = e.seq;
                        if !send_within(&tx, sse(e.seq, e.kind, &e.json), stall).await {
                            return;
                        }
                    }
                    // Ended: every event of the segment was in that read.
                    if ended {
                        break;
                    }
                    let _ = ticks.changed().await;
                }
                // A segment that ended without recording its end (its lease was lost, its write
                // failed) streamed events the store does not hold; whoever continues the run
                // writes its own from the last recorded one, and the stream goes on from there
                // (those `seq`s come again, with what the run actually did).
                if let Ok(Some(run)) = store.get_run(&run_id).await
                    && run.status.is_pending()
                    && let Ok(next) = store.next_seq(&run_id).await
                {
                    last = last.min(next.saturating_sub(1));
                }
                continue;
            }
            // Not executing here: queued, or executed by another replica; followed through the
            // shared poller until it ends or asks, or until this process executes it.
            if !status.is_pending() {
                return;
            }
            let Some(mut feed) = feed else { continue };
            match follow_feed(&follower, &run_id, &mut feed, &mut last, &tx, &*store, stall).await {
                Followed::Ended => return,
                Followed::Again => continue,
            }
        }
    };
    tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            () = stream => {}
            () = gone.closed() => {}
        }
    });
    Ok(Sse::new(until_closing(&state, rx)).keep_alive(KeepAlive::default()))
}

/// How following a run through its shared poller stopped.
enum Followed {
    /// The run ended or asked and every event of it was sent; or the client went.
    Ended,
    /// Read the store again: the run executes here now, or this stream fell behind the poller,
    /// or the poller stopped (a store error).
    Again,
}

/// What became of one event handed on by a poller.
enum Sent {
    /// Sent, or one this stream had already.
    Ok,
    /// Not the next `seq`: the events in between are read from the store.
    Gap,
    /// The client went.
    Gone,
}

/// Sends an event a poller handed on, if it is the next one (`seq` right after `last`).
async fn send_next(e: &crate::store::StoredEvent, last: &mut u64, tx: &tokio::sync::mpsc::Sender<SseEvent>, stall: Duration) -> Sent {
    if e.seq > last.saturating_add(1) {
        return Sent::Gap;
    }
    send_after(e, last, tx, stall).await
}

/// Sends an event read from the store (the record: whatever its `seq`s), if it is after `last`.
async fn send_after(e: &crate::store::StoredEvent, last: &mut u64, tx: &tokio::sync::mpsc::Sender<SseEvent>, stall: Duration) -> Sent {
    if e.seq <= *last {
        return Sent::Ok;
    }
    *last = e.seq;
    if send_within(tx, SseEvent::default().id(e.seq.to_string()).event(&e.kind).data(&e.body), stall).await { Sent::Ok } else { Sent::Gone }
}

/// Hands an event to a stream's body; false when the client went, or took nothing for `stall`
/// (its connection open, its reading stopped: the stream ends, and its place is given back).
pub(super) async fn send_within(tx: &tokio::sync::mpsc::Sender<SseEvent>, event: SseEvent, stall: Duration) -> bool {
    matches!(tokio::time::timeout(stall, tx.send(event)).await, Ok(Ok(())))
}

/// Sends a run's events as its shared poller hands them on, each once and in order, until the
/// run ends or asks (then every event of it was sent).
async fn follow_feed(
    state: &AppState,
    run_id: &str,
    feed: &mut follow::Follower,
    last: &mut u64,
    tx: &tokio::sync::mpsc::Sender<SseEvent>,
    store: &dyn crate::store::RunStore,
    stall: Duration,
) -> Followed {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    loop {
        tokio::select! {
            biased;
            _ = tx.closed() => return Followed::Ended,
            e = feed.events.recv() => match e {
                Ok(e) => match send_next(&e, last, tx, stall).await {
                    Sent::Ok => {}
                    Sent::Gone => return Followed::Ended,
                    // This stream joined between the poller's reads: the store has the rest.
                    Sent::Gap => {
                        let Ok(stored) = store.events_after(run_id, *last).await else { return Followed::Ended };
                        for e in stored {
                            if let Sent::Gone = send_after(&e, last, tx, stall).await {
                                return Followed::Ended;
                            }
                        }
                    }
                },
                Err(RecvError::Lagged(_) | RecvError::Closed) => return Followed::Again,
            },
            changed = feed.state.changed() => {
                if changed.is_err() {
                    return Followed::Again;
                }
                let now = *feed.state.borrow_and_update();
                if state.inner.live.get(run_id).is_some() {
                    return Followed::Again;
                }
                // What the poller handed on so far; then the store for what it handed on before
                // this stream joined it (or between its first read and this stream's own), so no
                // event waits for the next one to be seen.
                loop {
                    match feed.events.try_recv() {
                        Ok(e) => match send_next(&e, last, tx, stall).await {
                            Sent::Ok => {}
                            Sent::Gap => break,
                            Sent::Gone => return Followed::Ended,
                        },
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                        Err(TryRecvError::Lagged(_)) => return Followed::Again,
                    }
                }
                if *last < now.last {
                    let Ok(stored) = store.events_after(run_id, *last).await else { return Followed::Ended };
                    for e in stored {
                        if let Sent::Gone = send_after(&e, last, tx, stall).await {
                            return Followed::Ended;
                        }
                    }
                }
                // Ended or asked: every event of it was at most `now.last`, and is sent.
                if now.ended {
                    return Followed::Ended;
                }
            }
        }
    }
}

/// An event stream's events until the feeding task ends it, or until a shutdown's grace period
/// is over: then one last `: shutting down` comment (a whole SSE block, so a client sees a clean
/// end, not a chunk cut in the middle) and the end of the body.
fn until_closing(state: &AppState, rx: tokio::sync::mpsc::Receiver<SseEvent>) -> impl Stream<Item = Result<SseEvent, Infallible>> + use<> {
    let closing = state.inner.closing.subscribe();
    futures_util::stream::unfold(Some((rx, closing)), |open| async move {
        let (mut rx, mut closing) = open?;
        let next = tokio::select! {
            biased;
            // Err: the state is gone, which is a shutdown too.
            _ = closing.wait_for(|c| *c) => None,
            e = rx.recv() => Some(e),
        };
        match next {
            None => Some((Ok(SseEvent::default().comment("shutting down")), None)),
            Some(e) => e.map(|e| (Ok(e), Some((rx, closing)))),
        }
    })
}

/// Continues a run that asked: the reply becomes a note the next decision sees.
#[utoipa::path(post, path = "/v1/runs/{run_id}/reply", request_body = ReplyBody, params(("run_id" = String, Path, description = RUN_ID_PARAM), WaitParam),
    responses((status = 202, body = Accepted), (status = 200, description = "With `wait=true`", body = RunView), (status = 404, body = ErrorBody),
        (status = 409, description = "The run is not awaiting the user, or its route is now served by another fleet", body = ErrorBody), (status = 413, body = ErrorBody), (status = 408, description = "The body did not arrive within the body timeout", body = ErrorBody), (status = 415, description = "A body not sent as `Content-Type: application/json`, or encoded (`Content-Encoding`)", body = ErrorBody), (status = 422, description = "An invalid body (not an object, an empty message), or the run's route cannot run now", body = ErrorBody), (status = 429, body = ErrorBody), (status = 400, description = "A query string or a path that does not parse", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn reply(
    State(state): State<AppState>,
    RunIdPath(run_id): RunIdPath,
    wait: Result<Query<WaitParam>, QueryRejection>,
    body: Result<JsonBody<ReplyBody>, ApiError>,
) -> Result<Response, ApiError> {
    let wait = query(wait)?;
    let JsonBody(body) = body?;
    if body.message.len() > state.inner.config.max_goal_bytes {
        return Err(ApiError::new(ErrorCode::TooLarge, "the reply is too large"));
    }
    // An empty reply answers nothing: the run would go on with a note that says nothing.
    if body.message.trim().is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidContent, "the reply's `message` is empty"));
    }
    let run_id = run_id.as_str().to_owned();
    let permit = state.inner.in_flight.clone().try_acquire_owned().map_err(|_| too_many())?;
    let claimed = state.inner.durable.claim_reply(&run_id, body.message).await.map_err(|e| match e {
        ReplyError::NotFound(_) => no_run(&run_id),
        ReplyError::NotWaiting { .. } => ApiError::new(ErrorCode::NotWaiting, e.to_string()),
        ReplyError::Store(s) => store_error(s),
        ReplyError::Start(s) => start_error(s),
    })?;
    let lease = claimed.lease().clone();
    run_segment(&state, &lease, permit, move |runtime, sink, cancel| async move { runtime.continue_run(claimed, sink, cancel).await });
    if wait.wait {
        return Ok(waited(&state, &run_id).await?.into_response());
    }
    Ok((StatusCode::ACCEPTED, Json(Accepted { run_id, status: AcceptedStatus::Running })).into_response())
}

/// The routes of the catalogue.
#[utoipa::path(get, path = "/v1/routes", responses((status = 200, body = [RouteInfo]), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
async fn list_routes(State(state): State<AppState>) -> Json<Vec<RouteInfo>> {
    let runtime = state.runtime();
    let routes = runtime
        .catalogue()
        .routes()
        .map(|entry| match entry {
            RouteEntry::Ready(r) => RouteInfo {
                id: r.id().to_owned(),
                fleet: r.activation_target().map(str::to_owned),
                kind: r.path().as_str().to_owned(),
                description: r.description().to_owned(),
                runs_here: runtime.check_route(r.id()).is_ok(),
            },
            RouteEntry::Broken(b) => RouteInfo { id: b.id.clone(), fleet: None, kind: "broken".into(), description: String::new(), runs_here: false },
        })
        .collect();
    Json(routes)
}

/// A route's graph as a self-contained SVG 1.1 document: stages, roles, prompt references, edges and their conditions.
// Served with `nosniff` and a CSP that allows nothing but inline styling, so the picture stays a
// picture even when opened on its own; everything from the catalogue in it is escaped.
#[utoipa::path(get, path = "/v1/routes/{route_id}/graph.svg", params(("route_id" = String, Path, description = "The route id")),
    responses((status = 200, description = "The graph, SVG 1.1", content_type = "image/svg+xml", body = String,
        headers(("x-content-type-options" = String, description = "`nosniff`"), ("content-security-policy" = String, description = "`default-src 'none'; style-src 'unsafe-inline'`"))), (status = 404, description = "Unknown route", body = ErrorBody),
        (status = 422, description = "A broken route", body = ErrorBody), (status = 400, description = PATH_400, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
async fn route_graph_svg(State(state): State<AppState>, PathText(route_id): PathText) -> Result<Response, ApiError> {
    let route = state.inner.durable.runtime().catalogue().route(&route_id).map_err(|e| match e {
        RouteLookupError::Unknown { known, .. } => {
            ApiError::new(ErrorCode::NotFound, format!("unknown route `{}`; known routes: {}", echo_id(&route_id), crate::catalogue::name_list(&known)))
        }
        RouteLookupError::Broken(b) => {
            let mut e = ApiError::new(ErrorCode::BrokenRoute, format!("route `{}` cannot run: the catalogue has errors in it", echo_id(&route_id)));
            e.problems = b.problems.iter().flat_map(|d| d.to_string().lines().map(|l| l.trim().to_owned()).collect::<Vec<_>>()).collect();
            e
        }
    })?;
    let headers = [
        (header::CONTENT_TYPE, "image/svg+xml"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CONTENT_SECURITY_POLICY, "default-src 'none'; style-src 'unsafe-inline'"),
    ];
    Ok((headers, crate::svg::render_svg(route)).into_response())
}

/// Whether the process is up (no authentication).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "`{\"status\": \"ok\"}`")))]
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the database: under a probe's usual one-second timeout.
const READY_WITHIN: Duration = Duration::from_millis(900);

/// Whether the service can take runs: catalogue loaded, store reachable (no authentication).
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "Ready"), (status = 503, description = "`store_unavailable`: the run store cannot take writes now, or did not answer within a second; `not_ready`: a background loop the replica needs (lease renewal, claims) panicked and waits to restart", body = ErrorBody)))]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
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
async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.inner.metrics.render(state.runs_in_flight(), &state.inner.durable.runtime().flow_status());
    state.inner.loops.render(&mut text);
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
async fn openapi_json() -> Json<Value> {
    Json(openapi::document())
}
