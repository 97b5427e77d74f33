//! Tasks are runs (task id = run id, context id = the run's session, else its id): a message
//! starts a run through the service's one start path ([`begin_run`]: limits, idempotency by
//! the message's id, the goal checked against the route's `goal_schema`) or answers the run's
//! question ([`reply_here`]); a task is read back from the run's record (its history from its
//! events), cancelled through [`cancel_here`], listed through the store's pages. A message's
//! push notification config becomes a config of its task ([`super::push`]).

use serde_json::{Map, Value, json};
use sha2::Digest;

use super::super::cancel::cancel_here;
use super::super::runs::{Begun, begin_run};
use super::super::{ApiError, AppState, ErrorCode, store_error};
use super::params;
use super::wire::{self, Code, RpcError};
use crate::exec::StartError;
use crate::runtime::{CancelError, ReplyError, StartRequest};
use crate::store::inbox::Queued;
use crate::store::{IdempotencyKey, RunFilter, RunId, StoredRun, StoredStatus};

/// Why a run is cancelled by `CancelTask`.
const CANCELLED: &str = "cancelled by an A2A client (CancelTask)";

/// The run of `task_id`, if it is a task of `route_id` (another route's is not found here).
pub(super) async fn load(state: &AppState, route_id: &str, task_id: &str) -> Result<StoredRun, RpcError> {
    let not_found = || RpcError::new(Code::TaskNotFound, "task not found: no task of this agent has that id");
    let Some(id) = RunId::parse(task_id) else { return Err(not_found()) };
    match state.inner.durable.store().get_run(id.as_str()).await.map_err(|e| api(store_error(e)))? {
        Some(run) if run.route_id == route_id => Ok(run),
        _ => Err(not_found()),
    }
}

/// A task's context: its run's session, else the run's id.
pub(super) fn context_of(run: &StoredRun) -> String {
    run.request.session_id.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| run.run_id.clone())
}

/// A task as A2A shows it: status (with its question or failure as an agent message), the
/// output as the artifact `output`, the history from the run's events (the last
/// `history_length` messages).
pub(super) async fn task(state: &AppState, run: &StoredRun, history_length: Option<usize>, artifacts: bool) -> Result<Value, RpcError> {
    let mut task = task_of(run, artifacts);
    let ctx = context_of(run);
    if history_length != Some(0) {
        let mut history = history(state, run, &ctx).await?;
        if let Some(n) = history_length {
            history.drain(..history.len().saturating_sub(n));
        }
        task["history"] = json!(history);
    }
    Ok(task)
}

/// A task without its history, from the run's record alone (a push delivery's snapshot too).
pub(super) fn task_of(run: &StoredRun, artifacts: bool) -> Value {
    let (id, ctx) = (run.run_id.as_str(), context_of(run));
    let view = super::super::RunView::of(run.clone());
    let agent = |seq: &str, text: &str| wire::message(&format!("{id}:{seq}"), id, &ctx, "ROLE_AGENT", vec![json!({"text": text})]);
    let mut status = json!({"state": wire::state(run.status), "timestamp": run.updated_at});
    match (&view.question, &view.error) {
        (Some(q), _) if run.status == StoredStatus::AwaitingInput => status["message"] = agent("question", q),
        (_, Some(e)) => status["message"] = agent("error", &format!("{}: {}", e.reason_class, e.message)),
        _ => {}
    }
    let mut task = json!({"id": id, "contextId": ctx, "status": status, "metadata": {"route_id": run.route_id}});
    if artifacts && let Some(output) = &view.output {
        task["artifacts"] = json!([{"artifactId": "output", "name": "output", "parts": [wire::part_of(output)]}]);
    }
    task
}

/// The messages of a run: its goal, each question and reply, its output.
async fn history(state: &AppState, run: &StoredRun, ctx: &str) -> Result<Vec<Value>, RpcError> {
    let id = run.run_id.as_str();
    let goal = Value::Object(run.request.goal.clone());
    let mut messages = vec![wire::message(&format!("{id}:0"), id, ctx, "ROLE_USER", vec![json!({"data": goal})])];
    let events = state.inner.durable.store().events_after(id, 0).await.map_err(|e| api(store_error(e)))?;
    for e in events {
        let (role, field) = match e.kind.as_str() {
            "run.awaiting_input" => ("ROLE_AGENT", "question"),
            "run.resumed" => ("ROLE_USER", "reply"),
            "run.completed" => ("ROLE_AGENT", "output"),
            _ => continue,
        };
        let body: Value = serde_json::from_str(&e.body).unwrap_or_default();
        let text = body.get(field).and_then(Value::as_str).unwrap_or_default();
        messages.push(wire::message(&format!("{id}:{}", e.seq), id, ctx, role, vec![wire::part_of(text)]));
    }
    // Messages that wait for a question (a reply taken shows as its `run.resumed` above).
    for m in state.inner.durable.queued_messages(id).await.map_err(|e| api(store_error(e)))? {
        if m.taken_at.is_none() {
            messages.push(wire::message(&m.message_id, id, ctx, "ROLE_USER", vec![json!({"text": m.text})]));
        }
    }
    Ok(messages)
}

/// What a message did: the run it started or continued, and the last event before it (a
/// stream of it shows what comes after).
pub(super) struct Sent {
    pub run_id: String,
    pub after: u64,
}

/// `SendMessage`: a message with a `taskId` answers that task's question; any other starts a
/// run of `route_id` (once per `messageId`).
pub(super) async fn send(state: &AppState, route_id: &str, params: &Value, legacy: bool) -> Result<Sent, RpcError> {
    let message = params.get("message").filter(|m| m.is_object()).ok_or_else(|| RpcError::params("`params.message` must be a message object"))?;
    let message_id = match message.get("messageId") {
        Some(Value::String(m)) if !m.is_empty() => m.as_str(),
        _ => return Err(RpcError::params("`params.message.messageId` must be a non-empty string")),
    };
    match message.get("role").and_then(Value::as_str) {
        Some("ROLE_USER" | "user") => {}
        _ => return Err(RpcError::params("`params.message.role` must be ROLE_USER (a client's message)")),
    }
    let parts = match message.get("parts") {
        Some(Value::Array(p)) if !p.is_empty() => wire::read_parts(p),
        _ => return Err(RpcError::params("`params.message.parts` must be a non-empty array of parts")),
    };
    let limit = state.inner.config.max_goal_bytes;
    if parts.largest > limit {
        return Err(RpcError::params(format!("a part is {} bytes; the limit is {limit}", parts.largest)).with_data(json!({"limit": limit})));
    }
    // A push notification config checked before anything starts: a refused URL starts nothing.
    let push = super::push::of_send(state, params)?;
    if let Some(task_id) = params::text(message, "taskId", "params.message")? {
        let sent = answer(state, route_id, task_id, message_id, parts).await?;
        super::push::keep(state, &sent.run_id, push, legacy).await?;
        return Ok(sent);
    }
    let edition = state.runtime().current();
    let route = edition.check_route(route_id).map_err(|e| api(super::super::start_error(e)))?.clone();
    drop(edition);
    let goal = goal(parts, route.goal_schema())?;
    let context = params::text(message, "contextId", "params.message")?.map(str::to_owned);
    let req = StartRequest {
        route_id: route_id.to_owned(),
        goal,
        model_profile: Some(route.model_profile().to_owned()),
        prefetch: Vec::new(),
        session_id: context,
        webhook_url: None,
        multitask: None,
    };
    let key = key(route_id, message_id)?;
    let run_id = match begin_run(state, req, Some(&key)).await.map_err(api)? {
        Begun::New { run_id, .. } => run_id,
        Begun::Replayed(run) => run.run_id,
    };
    // Kept once the run is (a send repeated after a crash keeps it then: the message's config
    // without an id has the task's id, so a repeat keeps no second one).
    super::push::keep(state, &run_id, push, legacy).await?;
    Ok(Sent { run_id, after: 0 })
}

/// The idempotency key of a message: `a2a:{route}:{messageId}`, or its SHA-256 when that is no
/// key (too long, not visible ASCII).
fn key(route_id: &str, message_id: &str) -> Result<IdempotencyKey, RpcError> {
    let plain = format!("a2a:{route_id}:{message_id}");
    IdempotencyKey::parse(&plain).or_else(|_| {
        let digest = sha2::Sha256::digest(plain.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        IdempotencyKey::parse(&format!("a2a-sha256:{hex}")).map_err(|e| RpcError::new(Code::Internal, e.to_string()))
    })
}

/// A message to a task that has not ended: kept in the run's inbox (once per `messageId`) as the
/// reply to its question, now if it asks, else its next one; continued here when it asks.
async fn answer(state: &AppState, route_id: &str, task_id: &str, message_id: &str, parts: wire::Parts) -> Result<Sent, RpcError> {
    let run = load(state, route_id, task_id).await?;
    let text = match (parts.text, parts.data) {
        (Some(t), _) => t,
        (None, Some(d)) => d.to_string(),
        (None, None) => return Err(no_usable_part()),
    };
    if text.trim().is_empty() {
        return Err(RpcError::params("the message's text is empty: it would answer nothing"));
    }
    // Each part is checked alone before; the reply is all of them, bounded as a goal is.
    let limit = state.inner.config.max_goal_bytes;
    if text.len() > limit {
        return Err(RpcError::params(format!("the message is {} bytes; the limit is {limit}", text.len())).with_data(json!({"limit": limit})));
    }
    let ended = |status: Option<StoredStatus>| {
        let state = status.map_or("TASK_STATE_UNSPECIFIED", wire::state);
        RpcError::new(Code::UnsupportedOperation, format!("task {task_id} ended: a terminal task takes no more messages")).with_data(json!({"state": state}))
    };
    if !run.status.is_pending() && run.status != StoredStatus::AwaitingInput {
        return Err(ended(Some(run.status)));
    }
    let after = run.next_seq.saturating_sub(1);
    match state.inner.durable.queue_message(&run.run_id, message_id, &text).await {
        Ok(Queued::Queued | Queued::Again) => {}
        Ok(Queued::Ended(status)) => return Err(ended(status)),
        Ok(Queued::Reused) => {
            return Err(RpcError::params(format!("messageId `{}` was sent to this task before with another text", super::super::echo_id(message_id))));
        }
        Ok(Queued::Full) => {
            let most = crate::store::inbox::MAX_WAITING;
            return Err(RpcError::params(format!("{most} messages wait for this task's next questions already; send more once it asks"))
                .with_data(json!({"waiting": most})));
        }
        Err(ReplyError::Start(StartError::NotResumable { .. })) => {
            return Err(RpcError::new(Code::UnsupportedOperation, format!("task {task_id} takes no messages after the first: its route never asks")));
        }
        Err(e) => return Err(api(super::super::inbox::reply_error(&run.run_id, e))),
    }
    // Asking now (or since): answered at once. Else its next question takes it.
    super::super::inbox::deliver_queued(state, &run.run_id).await.map_err(api)?;
    Ok(Sent { run_id: run.run_id, after })
}

fn no_usable_part() -> RpcError {
    RpcError::new(Code::ContentTypeNotSupported, "the message has no text or data part (files and URLs are not read)")
}

/// A message's goal: its first data part (an object), else its text: a JSON object as it is;
/// else, for a goal schema with one string property, that property; else `{"message": text}`.
fn goal(parts: wire::Parts, schema: Option<&Value>) -> Result<Map<String, Value>, RpcError> {
    if let Some(data) = parts.data {
        return match data {
            Value::Object(goal) => Ok(goal),
            _ => Err(RpcError::params("a data part's `data` must be a JSON object (the goal)")),
        };
    }
    let Some(text) = parts.text else { return Err(no_usable_part()) };
    if let Ok(Value::Object(goal)) = serde_json::from_str::<Value>(&text) {
        return Ok(goal);
    }
    let strings: Vec<&String> = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.iter().filter(|(_, v)| v.get("type").and_then(Value::as_str) == Some("string")).map(|(k, _)| k).collect())
        .unwrap_or_default();
    let field = match strings.as_slice() {
        [one] => (*one).clone(),
        _ => "message".to_owned(),
    };
    Ok(Map::from_iter([(field, Value::String(text))]))
}

/// `CancelTask`: the run cancelled (at once when queued or asking; within a second when running).
pub(super) async fn cancel(state: &AppState, route_id: &str, params: &Value) -> Result<Value, RpcError> {
    let run = load(state, route_id, id_param(params)?).await?;
    match cancel_here(state, &run.run_id, Some(CANCELLED)).await {
        Ok(crate::runtime::Cancelling::Already) => return Err(RpcError::new(Code::TaskNotCancelable, format!("task {} was canceled already", run.run_id))),
        Ok(_) => {}
        Err(e @ CancelError::NotCancellable { .. }) => return Err(RpcError::new(Code::TaskNotCancelable, e.to_string())),
        Err(CancelError::NotFound(_)) => return Err(RpcError::new(Code::TaskNotFound, "no task of this agent has that id")),
        Err(CancelError::Store(e)) => return Err(api(store_error(e))),
        Err(e @ CancelError::BadReason(_)) => return Err(RpcError::new(Code::Internal, e.to_string())),
    }
    // A running run ends within about a second (at once when it runs here): its end is answered.
    let _ = super::super::waited(state, &run.run_id).await;
    let run = load(state, route_id, &run.run_id).await?;
    task(state, &run, None, true).await
}

/// `GetTask`: the task, its history cut to `historyLength`.
pub(super) async fn get(state: &AppState, route_id: &str, params: &Value) -> Result<Value, RpcError> {
    let run = load(state, route_id, id_param(params)?).await?;
    task(state, &run, history_length(params)?, true).await
}

/// `ListTasks`: this agent's tasks, newest first, paged by `pageToken` (the last task's id).
pub(super) async fn list(state: &AppState, route_id: &str, params: &Value) -> Result<Value, RpcError> {
    let size = match params.get("pageSize") {
        None | Some(Value::Null) => 50,
        Some(v) => v.as_u64().filter(|n| (1..=100).contains(n)).ok_or_else(|| RpcError::params("`pageSize` must be 1 to 100"))? as u32,
    };
    let status = match params::text(params, "status", "params")?.filter(|s| *s != "TASK_STATE_UNSPECIFIED") {
        None => None,
        Some(s) => Some(wire::status_of(s).ok_or_else(|| RpcError::params(format!("`status` `{s}` is not a task state")))?),
    };
    let before = match params::text(params, "pageToken", "params")? {
        None => None,
        Some(t) => Some(RunId::parse(t).ok_or_else(|| RpcError::params("`pageToken` must be a `nextPageToken`"))?.as_str().to_owned()),
    };
    let context = params::text(params, "contextId", "params")?;
    let since = match params::text(params, "statusTimestampAfter", "params")? {
        None => None,
        Some(t) => Some(params::time_ms(t).ok_or_else(|| RpcError::params("`statusTimestampAfter` must be an RFC 3339 timestamp"))?),
    };
    let updated = |r: &StoredRun| params::time_ms(&r.updated_at);
    let history = history_length(params)?.or(Some(0));
    let artifacts = params::flag(params, "includeArtifacts", "params")?.unwrap_or(false);
    // Read at most `LIST_READ` runs: `totalSize` counts up to it, and the filters the store has
    // no column for (context, time) are applied here.
    let filter = RunFilter { route_id: Some(route_id.to_owned()), status, before, limit: LIST_READ };
    let runs = state.inner.durable.store().list_runs(&filter).await.map_err(|e| api(store_error(e)))?;
    let matching: Vec<&StoredRun> =
        runs.iter().filter(|r| context.is_none_or(|c| context_of(r) == c) && since.is_none_or(|t| updated(r).is_some_and(|u| u > t))).collect();
    let page = &matching[..matching.len().min(size as usize)];
    let next = if matching.len() > page.len() { page.last().map(|r| r.run_id.clone()).unwrap_or_default() } else { String::new() };
    let mut tasks = Vec::new();
    for run in page {
        tasks.push(task(state, run, history, artifacts).await?);
    }
    Ok(json!({"tasks": tasks, "nextPageToken": next, "pageSize": page.len(), "totalSize": matching.len()}))
}

/// The most runs `ListTasks` reads (and `totalSize` counts).
const LIST_READ: u32 = 2000;

/// A request's task id: `id` (1.0 and 0.3).
pub(super) fn id_param(params: &Value) -> Result<&str, RpcError> {
    params.get("id").and_then(Value::as_str).ok_or_else(|| RpcError::params("`params.id` (the task id) is required"))
}

/// A request's `historyLength` (at its top or in its `configuration`).
pub(super) fn history_length(params: &Value) -> Result<Option<usize>, RpcError> {
    let v = params.get("historyLength").or_else(|| params.get("configuration").and_then(|c| c.get("historyLength")));
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| RpcError::params("`historyLength` must be a whole number")),
    }
}

/// A refusal of the service as the protocol's error: what the client sent wrong is invalid
/// params (a goal that does not fit the route's schema: `data.problems`, each with its JSON
/// path), what may pass an internal error that says when to retry.
pub(super) fn api(e: ApiError) -> RpcError {
    let mut data = json!({"code": e.code.as_str()});
    if !e.problems.is_empty() {
        data["problems"] = json!(e.problems);
    }
    if let Some(s) = e.retry_after {
        data["retry_after_s"] = json!(s);
    }
    let message = if e.problems.is_empty() { e.message.clone() } else { format!("{}: {}", e.message, e.problems.join("; ")) };
    let code = match e.code {
        ErrorCode::InvalidContent
        | ErrorCode::InvalidRequest
        | ErrorCode::TooLarge
        | ErrorCode::IdempotencyKeyReused
        | ErrorCode::SessionBusy
        | ErrorCode::WebhookNotAllowed => Code::InvalidParams,
        ErrorCode::NotFound => Code::TaskNotFound,
        ErrorCode::NotWaiting => Code::UnsupportedOperation,
        _ => Code::Internal,
    };
    RpcError::new(code, message).with_data(data)
}
