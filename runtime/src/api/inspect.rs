//! What the run inspector (`/ui/`) reads besides the run endpoints: the run list's changes as
//! Server-Sent Events, and a run's stored journal (prompts, user messages, replies as received).

use super::*;

/// How often the run-list stream reads the store.
const UPDATES_POLL: Duration = Duration::from_millis(500);
/// How long one run-list stream lasts; the client reconnects (a bound, like every request).
const UPDATES_MAX_AGE: Duration = Duration::from_secs(30 * 60);
/// Run-list streams open at once; past it, 429.
pub(super) const MAX_UPDATE_STREAMS: usize = 64;
/// How many of the newest runs a stream watches.
const UPDATES_WINDOW: u32 = 200;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UpdatesParams {
    /// Runs of this route only (one with a control character names none: a stream of nothing).
    pub route_id: Option<String>,
    /// `queued`, `running`, `completed`, `failed` or `awaiting_input`.
    pub status: Option<String>,
    /// How many of the newest runs the stream sends first (0 to 200, default 50).
    pub limit: Option<u32>,
}

/// The run list's changes as Server-Sent Events: first the newest runs (oldest of them first),
/// then every run that is new or whose status or `updated_at` changed, each as a `run` event whose
/// `data` is the run (as `GET /v1/runs/{id}`). The store is read every 500 ms; the newest 200 runs
/// (of the filter) are watched. A comment every 15 s keeps the connection open; the stream ends
/// after 30 minutes (reconnect), and at the end of a shutdown's grace period with a `: shutting down` comment.
#[utoipa::path(get, path = "/v1/runs/updates", params(UpdatesParams),
    responses((status = 200, description = "`text/event-stream`; `event: run`, `data` a run", content_type = "text/event-stream"),
        (status = 400, description = "A query string that does not parse", body = ErrorBody), (status = 422, description = "An unknown status", body = ErrorBody),
        (status = 429, description = "Too many run-list streams open", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn run_updates(
    State(state): State<AppState>,
    p: Result<Query<UpdatesParams>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let p = query(p)?;
    let status = parse_status(p.status.as_deref())?;
    let first = p.limit.unwrap_or(50).min(UPDATES_WINDOW) as usize;
    let store = state.inner.durable.store().clone();
    let permit = state.inner.update_streams.clone().try_acquire_owned().map_err(|_| {
        let mut e = ApiError::new(ErrorCode::TooManyStreams, "too many run-list streams are open; retry shortly");
        e.retry_after = Some(5);
        e
    })?;
    // A filter that can name no route is a stream of nothing, which never asks the store.
    let reads_store = !p.route_id.as_deref().is_some_and(names_no_route);
    let filter = RunFilter { route_id: p.route_id, status, before: None, limit: UPDATES_WINDOW };
    // The first read answers errors as errors; later ones end the stream.
    let initial = if reads_store { store.list_runs(&filter).await.map_err(store_error)? } else { Vec::new() };
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    let stall = state.inner.config.stream_stall;
    tokio::spawn(async move {
        let _permit = permit;
        let until = Instant::now() + UPDATES_MAX_AGE;
        let mut seen: std::collections::HashMap<String, (StoredStatus, String)> = std::collections::HashMap::new();
        let mut id = 0u64;
        let mut runs = initial;
        let mut started = false;
        loop {
            let mut changed = Vec::new();
            // Only the window's runs are remembered: a long stream over a busy store would
            // otherwise keep every run it ever saw.
            seen.retain(|id, _| runs.iter().any(|r| r.run_id == *id));
            for run in runs {
                let key = (run.status, run.updated_at.clone());
                match seen.insert(run.run_id.clone(), key.clone()) {
                    Some(old) if old == key => {}
                    _ => changed.push(run),
                }
            }
            if !started {
                // Only the newest `first` of the window at the start.
                changed.truncate(first);
                started = true;
            }
            // Oldest first, so a client that prepends keeps the newest on top.
            for run in changed.into_iter().rev() {
                id += 1;
                let Ok(data) = serde_json::to_string(&RunView::of(run)) else { continue };
                // A client that reads nothing ends its stream after `stall`, and the stream's
                // age is kept even while a send waits.
                let sent = tokio::time::timeout_at(until.into(), send_within(&tx, SseEvent::default().id(id.to_string()).event("run").data(data), stall));
                if !matches!(sent.await, Ok(true)) {
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(UPDATES_POLL) => {}
                _ = tx.closed() => return,
            }
            // A shutdown ends the stream at the end of its grace period (`until_closing`), with
            // the runs that finished during it shown.
            if Instant::now() >= until {
                return;
            }
            runs = match if reads_store { store.list_runs(&filter).await } else { Ok(Vec::new()) } {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "run store: the run-list stream ends");
                    return;
                }
            };
        }
    });
    Ok(Sse::new(until_closing(&state, rx)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// A run's record: the start contract as accepted and its journal, in order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunRecord {
    pub run_id: String,
    pub route_id: String,
    pub status: StoredStatus,
    /// The start contract: `{route_id, goal, model_profile, prefetch, session_id}`.
    #[schema(value_type = Object)]
    pub request: Value,
    /// The journal: `{"entry": "model_reply", stage_id, turn, system, user, raw, value}` (a model
    /// call: the resolved prompt, the user message, the reply as received, the value taken from
    /// it), `{"entry": "stage_completed", stage_id, value, note}`, `{"entry": "note", note}`,
    /// `{"entry": "user_reply", message, note}`, `{"entry": "tool_asked", stage_id, call, asked,
    /// task_id, context_id, question}` (an A2A agent's question the run asked, and its task).
    /// Written with each committed stage: a stage that failed, or one in flight, has no entry yet.
    #[schema(value_type = Vec<Object>)]
    pub entries: Vec<Value>,
}

/// A run's record: its start contract and its stored journal (what each model call was asked
/// and answered, each completed stage's value, the notes and replies).
#[utoipa::path(get, path = "/v1/runs/{run_id}/record", params(("run_id" = String, Path, description = RUN_ID_PARAM)),
    responses((status = 200, body = RunRecord), (status = 404, body = ErrorBody), (status = 400, description = PATH_400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn run_record(State(state): State<AppState>, RunIdPath(run_id): RunIdPath) -> Result<Json<RunRecord>, ApiError> {
    let store = state.inner.durable.store();
    let Some(run) = store.get_run(run_id.as_str()).await.map_err(store_error)? else {
        return Err(no_run(run_id.as_str()));
    };
    let entries = store.journal(run_id.as_str()).await.map_err(store_error)?;
    let entries = entries.iter().filter_map(|e| serde_json::to_value(e).ok()).collect();
    let mut request = run.request;
    // A webhook URL's credentials and query may be secret: the record shows where, not them.
    request.webhook_url = request.webhook_url.map(|url| crate::redact::origin_and_path(&url));
    let request = serde_json::to_value(request).unwrap_or(Value::Null);
    Ok(Json(RunRecord { run_id: run.run_id, route_id: run.route_id, status: run.status, request, entries }))
}
