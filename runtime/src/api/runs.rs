//! The runs resource: `POST /v1/runs` (a start, with its idempotency key and `wait`), `GET
//! /v1/runs/{id}`, `GET /v1/runs` (pages), `POST /v1/runs/{id}/reply`; a run segment executed
//! in the background under its permit, and its end.

use super::*;

/// The service's view of a run's end, as stored.
pub(super) async fn view(state: &AppState, run_id: &str) -> Result<RunView, ApiError> {
    let store = state.inner.durable.store();
    match store.get_run(run_id).await.map_err(store_error)? {
        Some(run) => Ok(RunView::of(run)),
        None => Err(no_run(run_id)),
    }
}

pub(super) fn sink_for(state: &AppState, live: &Arc<LiveRun>) -> Arc<dyn EventSink> {
    Arc::new(Segment { live: live.clone(), metrics: state.inner.metrics.clone() })
}

/// A segment's events: to the live tail and the metrics, until the segment is stopped.
pub(super) struct Segment {
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

    fn recorded(&self, run_id: &str, through: u64) {
        self.live.recorded(run_id, through);
    }

    fn follows_record(&self) -> bool {
        true
    }
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
        (status = 422, description = "Invalid body: not a JSON object, a goal that is not an object, an integer beyond 64 bits; a goal that does not match the route's `goal_schema` (`problems`: each mismatch, the JSON Pointer of the value at fault first); an unknown profile; a route that cannot start (`broken_route`, `cannot_start`); `idempotency_key_reused`: the key started another contract's run; `webhook_not_allowed`: a `webhook_url` whose origin is not in `FABRIC_WEBHOOK_ALLOWED_ORIGINS`", body = ErrorBody),
        (status = 429, description = "Too many runs in flight (see `Retry-After`)", body = ErrorBody),
        (status = 400, description = "A query string that does not parse; an `Idempotency-Key` that is not 1 to 255 visible ASCII characters, or sent twice", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (with `Retry-After`): the run store cannot take writes now, nothing was recorded; `store_error`; or `timeout`", body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn start_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    wait: Result<Query<WaitParam>, QueryRejection>,
    body: Result<JsonBody<StartBody>, ApiError>,
) -> Result<Response, ApiError> {
    let wait = query(wait)?;
    let key = keyed::idempotency_key(&headers)?;
    let JsonBody(body) = body?;
    let Value::Object(goal) = body.goal else {
        return Err(ApiError::new(ErrorCode::InvalidContent, "`goal` must be a JSON object"));
    };
    let req = StartRequest {
        route_id: body.route_id,
        goal,
        model_profile: Some(body.model_profile),
        prefetch: body.prefetch.unwrap_or_default(),
        session_id: body.session_id,
        webhook_url: body.webhook_url,
        multitask: body.multitask,
    };
    let (run_id, status) = match begin_run(&state, req, key.as_ref()).await? {
        Begun::New { run_id, status } => (run_id, status),
        Begun::Replayed(run) => return keyed::replayed(&state, *run, wait.wait).await,
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

/// What a start did: a new run (executing here, or queued for any replica with room), or the
/// run an idempotency key accepted before, for the same start contract.
pub(super) enum Begun {
    New { run_id: String, status: AcceptedStatus },
    Replayed(Box<StoredRun>),
}

/// A start as every front door of the service makes it (`POST /v1/runs`, an MCP tool call): the
/// bounds of its goal and prefetch, the run of its idempotency key (`422
/// idempotency_key_reused` for another contract), the bounds of the runs in flight and of the
/// queue, the accept (every start check), and the run's first segment here when there is room.
pub(super) async fn begin_run(state: &AppState, req: StartRequest, key: Option<&IdempotencyKey>) -> Result<Begun, ApiError> {
    let config = &state.inner.config;
    let goal_bytes = serde_json::to_vec(&req.goal).map_or(0, |g| g.len());
    if goal_bytes > config.max_goal_bytes {
        return Err(ApiError::new(ErrorCode::TooLarge, format!("the goal is {goal_bytes} bytes; the limit is {}", config.max_goal_bytes)));
    }
    let prefetch = &req.prefetch;
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
    // Room here: the run is claimed by this process as it is accepted. None: it is queued in
    // the store for any replica with room, up to the queue's bound.
    // A retry of a keyed start is answered before any bound: it starts nothing.
    if let Some(key) = key
        && let Some(run) = state.inner.durable.store().run_of_key(key).await.map_err(store_error)?
    {
        return keyed::same_start(state, &req, run).map(|run| Begun::Replayed(Box::new(run)));
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
    let accepted = match key {
        None => state.inner.durable.accept(&req, permit.is_some()).await.map_err(accept_error)?,
        Some(key) => match state.inner.durable.accept_once(&req, permit.is_some(), key).await.map_err(accept_error)? {
            Started::New(accepted) => accepted,
            // Another replica's start with this key won the race.
            Started::Replayed(run) => return Ok(Begun::Replayed(run)),
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
            let edition = accepted.edition.clone();
            run_segment(state, &held, permit, move |runtime, sink, cancel| async move { runtime.execute(&lease, &req, &edition, sink, cancel).await });
            AcceptedStatus::Running
        }
        _ => AcceptedStatus::Queued,
    };
    Ok(Begun::New { run_id, status })
}

/// A start refused by the facade, as the API answers it.
pub(super) fn accept_error(e: AcceptError) -> ApiError {
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
pub(super) fn run_segment<F, Fut>(state: &AppState, lease: &crate::store::Lease, permit: tokio::sync::OwnedSemaphorePermit, segment: F) -> Arc<LiveRun>
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
pub(super) async fn finish(state: &AppState, live: &LiveRun, outcome: Result<crate::exec::RunResult, StartError>) {
    let run_id = live.lease().run_id();
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
    let viewed = view(state, run_id).await.ok();
    let asked = viewed.as_ref().is_some_and(|v| v.status == StoredStatus::AwaitingInput);
    let stored = viewed.and_then(|v| serde_json::to_value(v).ok()).unwrap_or(Value::Null);
    state.inner.live.finish(live, stored);
    state.wake_webhooks();
    // A message queued while it ran answers its question now (after its segment is over here).
    if asked && let Err(e) = super::inbox::deliver_queued(state, run_id).await {
        tracing::warn!(run_id, error = %e.message, "continuing a run with a message queued for it");
    }
}

use follow::FOLLOW_POLL;

/// The run once it ended or asked, or as it stands after the wait limit: followed live when
/// this process executes it, through the store otherwise.
pub(super) async fn waited(state: &AppState, run_id: &str) -> Result<Json<RunView>, ApiError> {
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
pub(super) async fn get_run(State(state): State<AppState>, RunIdPath(run_id): RunIdPath) -> Result<Json<RunView>, ApiError> {
    view(&state, run_id.as_str()).await.map(Json)
}

/// The OpenAPI description of every `{run_id}`.
pub(super) const RUN_ID_PARAM: &str = "The run id: a lowercase hyphenated UUID; anything else names no run (404)";
/// The OpenAPI description of a path's 400.
pub(super) const PATH_400: &str = "A path that does not parse (not UTF-8 once percent-decoded)";

/// Runs, newest first, paged.
#[utoipa::path(get, path = "/v1/runs", params(ListParams), responses((status = 200, body = RunPage), (status = 400, description = "A query string that does not parse, a `before` that is no run id, a `limit` outside 1 to 200", body = ErrorBody), (status = 422, description = "An unknown status", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn list_runs(State(state): State<AppState>, p: Result<Query<ListParams>, QueryRejection>) -> Result<Json<RunPage>, ApiError> {
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
pub(super) fn names_no_route(route_id: &str) -> bool {
    route_id.chars().any(char::is_control)
}

/// A `status` query parameter: one of the stored statuses.
pub(super) fn parse_status(status: Option<&str>) -> Result<Option<StoredStatus>, ApiError> {
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

/// Continues a run that asked: the reply becomes a note the next decision sees.
#[utoipa::path(post, path = "/v1/runs/{run_id}/reply", request_body = ReplyBody, params(("run_id" = String, Path, description = RUN_ID_PARAM), WaitParam),
    responses((status = 202, body = Accepted), (status = 200, description = "With `wait=true`", body = RunView), (status = 404, body = ErrorBody),
        (status = 409, description = "The run is not awaiting the user, or its route is now served by another fleet", body = ErrorBody), (status = 413, body = ErrorBody), (status = 408, description = "The body did not arrive within the body timeout", body = ErrorBody), (status = 415, description = "A body not sent as `Content-Type: application/json`, or encoded (`Content-Encoding`)", body = ErrorBody), (status = 422, description = "An invalid body (not an object, an empty message), or the run's route cannot run now", body = ErrorBody), (status = 429, body = ErrorBody), (status = 400, description = "A query string or a path that does not parse", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn reply(
    State(state): State<AppState>,
    RunIdPath(run_id): RunIdPath,
    wait: Result<Query<WaitParam>, QueryRejection>,
    body: Result<JsonBody<ReplyBody>, ApiError>,
) -> Result<Response, ApiError> {
    let wait = query(wait)?;
    let JsonBody(body) = body?;
    let run_id = run_id.as_str().to_owned();
    reply_here(&state, &run_id, body.message).await?;
    if wait.wait {
        return Ok(waited(&state, &run_id).await?.into_response());
    }
    Ok((StatusCode::ACCEPTED, Json(Accepted { run_id, status: AcceptedStatus::Running })).into_response())
}

/// Continues a run that asked with `message`, executing here (the same path for `POST
/// /v1/runs/{id}/reply` and an MCP client's answer to an elicitation).
pub(super) async fn reply_here(state: &AppState, run_id: &str, message: String) -> Result<(), ApiError> {
    if message.len() > state.inner.config.max_goal_bytes {
        return Err(ApiError::new(ErrorCode::TooLarge, "the reply is too large"));
    }
    // An empty reply answers nothing: the run would go on with a note that says nothing.
    if message.trim().is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidContent, "the reply's `message` is empty"));
    }
    let permit = state.inner.in_flight.clone().try_acquire_owned().map_err(|_| too_many())?;
    let claimed = state.inner.durable.claim_reply(run_id, message).await.map_err(|e| super::inbox::reply_error(run_id, e))?;
    let lease = claimed.lease().clone();
    run_segment(state, &lease, permit, move |runtime, sink, cancel| async move { runtime.continue_run(claimed, sink, cancel).await });
    Ok(())
}
