//! One `tools/call`: the route's run started through the service's one start path
//! ([`begin_run`]: fleet, limits, idempotency), followed to its end or its question with a
//! progress notification per stage completed, its question put to the user by elicitation
//! (the answer goes the way of `POST /v1/runs/{id}/reply`), and its end as a tool result.
//! A cancelled request cancels the run.

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, ErrorCode as McpCode,
    MetaObject, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{ElicitationMode, RequestContext};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::{Map, Value, json};

use super::super::runs::{Begun, begin_run, reply_here, view};
use super::super::{ApiError, AppState, ErrorCode, RunView, cancel, store_error};
use super::Cancelled;
use crate::runtime::StartRequest;
use crate::store::{IdempotencyKey, StoredStatus};

/// The `_meta` key of a call's idempotency key.
const IDEMPOTENCY_KEY: &str = "idempotency_key";

/// Why a run is cancelled when its MCP request is.
const REQUEST_CANCELLED: &str = "the MCP client cancelled the tool call";
/// Why a run is cancelled when the user declines its question.
const DECLINED: &str = "the user declined to answer (MCP elicitation)";

pub(super) async fn call(
    state: &AppState,
    cancelled: &Cancelled,
    params: CallToolRequestParams,
    cx: RequestContext<RoleServer>,
) -> Result<CallToolResult, McpError> {
    let route_id = params.name.to_string();
    let edition = state.runtime().current();
    let route = edition.check_route(&route_id).map_err(|e| McpError::invalid_params(format!("unknown tool `{route_id}`: {e}"), None))?.clone();
    drop(edition);
    let meta = params.meta.as_ref().map(|m| &m.0.0).filter(|m| m.contains_key(IDEMPOTENCY_KEY)).unwrap_or(&cx.meta.0.0);
    let key = match meta.get(IDEMPOTENCY_KEY) {
        None | Some(Value::Null) => None,
        Some(Value::String(k)) => Some(IdempotencyKey::parse(k).map_err(|e| McpError::invalid_params(format!("`_meta.{IDEMPOTENCY_KEY}`: {e}"), None))?),
        Some(_) => return Err(McpError::invalid_params(format!("`_meta.{IDEMPOTENCY_KEY}` must be a string"), None)),
    };
    let req = StartRequest {
        route_id: route_id.clone(),
        goal: params.arguments.unwrap_or_default(),
        model_profile: Some(route.model_profile().to_owned()),
        prefetch: Vec::new(),
        session_id: None,
        webhook_url: None,
        multitask: None,
    };
    let run_id = match begin_run(state, req, key.as_ref()).await.map_err(mcp_error)? {
        Begun::New { run_id, .. } => run_id,
        Begun::Replayed(run) => run.run_id,
    };
    let request = cx.id.to_string();
    if !cancelled.started(&request, &run_id) {
        cancel_run(state, &run_id).await;
        return Err(McpError::new(McpCode::INVALID_REQUEST, "the request was cancelled; so was its run", Some(json!({"run_id": run_id}))));
    }
    let answer = follow(state, &cx, &run_id).await;
    // Answered (or refused): a notice now cancels nothing. A request whose token fired keeps
    // its run for a notice still to come.
    if !cx.ct.is_cancelled() {
        cancelled.answered(&request);
    }
    answer
}

/// The run of a call followed to its end or its question, its questions put to the user.
async fn follow(state: &AppState, cx: &RequestContext<RoleServer>, run_id: &str) -> Result<CallToolResult, McpError> {
    let mut follower = Follower { state, run_id, progress: cx.meta.get_progress_token().map(|t| (cx.peer.clone(), t)), last: 0, stages: 0 };
    let elicit = cx.peer.supported_elicitation_modes().contains(&ElicitationMode::Form);
    loop {
        let run = tokio::select! {
            run = follower.until_it_stops() => run?,
            () = cx.ct.cancelled() => return Err(stopped(run_id)),
        };
        let (StoredStatus::AwaitingInput, Some(question), true) = (run.status, run.question.clone(), elicit) else { return Ok(answer(run)) };
        let asked = tokio::select! {
            asked = cx.peer.create_elicitation(question_form(question)) => asked,
            () = cx.ct.cancelled() => return Err(stopped(run_id)),
        };
        match asked {
            Ok(ElicitResult { action: ElicitationAction::Accept, content: Some(content), .. })
                if content.get("answer").and_then(Value::as_str).is_some_and(|a| !a.trim().is_empty()) =>
            {
                let text = content.get("answer").and_then(Value::as_str).unwrap_or_default().to_owned();
                reply_here(state, run_id, text).await.map_err(mcp_error)?;
            }
            // The user said no: the run cannot go on without the answer, and nobody waits on it.
            Ok(ElicitResult { action: ElicitationAction::Decline, .. }) => {
                if let Err(e) = cancel::cancel_here(state, run_id, Some(DECLINED)).await {
                    tracing::warn!(run_id, error = %e, "cancelling a run whose question was declined");
                }
            }
            // Dismissed, answered with nothing, or the client could not ask: the run stays
            // asking, and the call says how to answer it.
            Ok(_) | Err(_) => return Ok(answer(view(state, run_id).await.map_err(mcp_error)?)),
        }
    }
}

/// A run followed until it ends or asks, with a progress notification per stage it completes.
struct Follower<'a> {
    state: &'a AppState,
    run_id: &'a str,
    progress: Option<(Peer<RoleServer>, ProgressToken)>,
    /// The last event seen.
    last: u64,
    /// Stages completed so far (the progress).
    stages: u32,
}

impl Follower<'_> {
    /// The run once it ended or asked: followed live while this process executes it, through
    /// the store otherwise (queued, or executed by another replica).
    async fn until_it_stops(&mut self) -> Result<RunView, McpError> {
        loop {
            // The live segment first, then the record: an event is in one or the other.
            let live = self.state.inner.live.get(self.run_id);
            let store = self.state.inner.durable.store();
            for e in store.events_after(self.run_id, self.last).await.map_err(|e| mcp_error(store_error(e)))? {
                self.event(e.seq, &e.kind, &e.body).await;
            }
            if let Some(live) = live {
                let mut ticks = live.subscribe();
                loop {
                    let (events, ended) = live.events_after(self.last);
                    for e in events {
                        self.event(e.seq, e.kind, &e.json).await;
                    }
                    if ended || ticks.changed().await.is_err() {
                        break;
                    }
                }
            }
            let run = view(self.state, self.run_id).await.map_err(mcp_error)?;
            if !run.status.is_pending() {
                return Ok(run);
            }
            if self.state.inner.live.get(self.run_id).is_none() {
                tokio::time::sleep(super::super::follow::FOLLOW_POLL).await;
            }
        }
    }

    async fn event(&mut self, seq: u64, kind: &str, json: &str) {
        self.last = self.last.max(seq);
        let Some((peer, token)) = &self.progress else { return };
        if kind != "run.stage.completed" {
            return;
        }
        self.stages += 1;
        let stage = serde_json::from_str::<Value>(json).ok().and_then(|e| e.get("stage_id").and_then(Value::as_str).map(str::to_owned)).unwrap_or_default();
        let note = ProgressNotificationParam::new(token.clone(), f64::from(self.stages)).with_message(format!("stage `{stage}` completed"));
        // A client that went away is the request's cancel to notice, not this note's.
        let _ = peer.notify_progress(note).await;
    }
}

/// The question as a form of one string field, `answer`.
fn question_form(question: String) -> ElicitRequestParams {
    let requested_schema = ElicitationSchema::builder().required_string_property("answer", |s| s.title("Answer")).build_unchecked();
    ElicitRequestParams::FormElicitationParams { meta: None, message: question, requested_schema }
}

/// The tool result of a run that ended or asked (or, at worst, still runs).
fn answer(run: RunView) -> CallToolResult {
    let mut meta = Map::new();
    meta.insert("run_id".into(), json!(run.run_id));
    meta.insert("status".into(), json!(run.status));
    let mut result = match run.status {
        StoredStatus::Completed => {
            let output = run.output.unwrap_or_default();
            let structured = serde_json::from_str::<Value>(&output).ok().filter(Value::is_object);
            let mut r = CallToolResult::success(vec![ContentBlock::text(output)]);
            r.structured_content = structured;
            r
        }
        StoredStatus::AwaitingInput => {
            let question = run.question.unwrap_or_default();
            let reply = format!("/v1/runs/{}/reply", run.run_id);
            let text = format!(
                "The run awaits input. Its question: {question}\nAnswer it with `POST {reply}` and the body {{\"message\": \"<your answer>\"}} (run {}).",
                run.run_id
            );
            meta.insert("awaiting_input".into(), json!(true));
            meta.insert("question".into(), json!(question));
            meta.insert("reply".into(), json!(reply));
            CallToolResult::success(vec![ContentBlock::text(text)])
        }
        StoredStatus::Failed | StoredStatus::Cancelled => {
            let (class, message, stage) = match run.error {
                Some(e) => (e.reason_class, e.message, e.stage_id),
                None => (format!("{:?}", run.status).to_lowercase(), String::new(), None),
            };
            let text = format!("The run {} ({class}): {message}", if run.status == StoredStatus::Cancelled { "was cancelled" } else { "failed" });
            meta.insert("reason_class".into(), json!(class));
            if let Some(stage) = stage {
                meta.insert("stage_id".into(), json!(stage));
            }
            CallToolResult::error(vec![ContentBlock::text(text)])
        }
        StoredStatus::Queued | StoredStatus::Running => CallToolResult::success(vec![ContentBlock::text(format!("The run {} is still going.", run.run_id))]),
    };
    result.meta = Some(MetaObject(meta));
    result
}

/// A request whose token fired: cancelled by its client (whose notice cancels the run,
/// [`super::Fabric::on_cancelled`]), or its session or stream ended, after which the run goes on
/// (a retry with the same idempotency key finds it). Nobody reads this answer.
fn stopped(run_id: &str) -> McpError {
    McpError::new(McpCode::INVALID_REQUEST, "the request was cancelled or its session ended", Some(json!({"run_id": run_id})))
}

/// Cancels the run of a request the client cancelled.
pub(super) async fn cancel_run(state: &AppState, run_id: &str) {
    if let Err(e) = cancel::cancel_here(state, run_id, Some(REQUEST_CANCELLED)).await {
        tracing::warn!(run_id, error = %e, "cancelling the run of a cancelled MCP request");
    }
}

/// A refusal of the service as an MCP error: what the client got wrong is `invalid_params`
/// (a goal that does not match the route's schema, with the located problems), what may pass
/// (too many runs, the store unable to write) an internal error that says when to retry.
fn mcp_error(e: ApiError) -> McpError {
    let mut data = json!({"code": e.code.as_str()});
    if !e.problems.is_empty() {
        data["problems"] = json!(e.problems);
    }
    let message = match e.retry_after {
        Some(s) => {
            data["retry_after_s"] = json!(s);
            format!("{}; retry the call in {s} s", e.message)
        }
        None => e.message.clone(),
    };
    let message = if e.problems.is_empty() { message } else { format!("{message}: {}", e.problems.join("; ")) };
    match e.code {
        ErrorCode::InvalidContent | ErrorCode::InvalidRequest | ErrorCode::TooLarge | ErrorCode::NotFound | ErrorCode::WrongFleet | ErrorCode::BrokenRoute => {
            McpError::invalid_params(message, Some(data))
        }
        ErrorCode::IdempotencyKeyReused | ErrorCode::SessionBusy | ErrorCode::NotWaiting | ErrorCode::CannotStart => {
            McpError::invalid_request(message, Some(data))
        }
        _ => McpError::internal_error(message, Some(data)),
    }
}
