//! `SendStreamingMessage` and `SubscribeToTask`: the task first, then the run's events as A2A
//! stream responses over Server-Sent Events, through the service's one event pump (the store,
//! the live tail, or the run's shared poller when another replica executes it), each SSE `id`
//! the run event's `seq`, so a client that reconnects (to any replica) with `Last-Event-ID`
//! gets every event after it, once. The stream ends with the task's end or its question.
//!
//! What the events become: `run.started`, `run.resumed` and each stage's start and end a
//! `working` status update; a model's text (`run.llm.delta`) an artifact `text:{stage}:{turn}`
//! appended to as it is written (`run.llm.restarted`: replaced); `run.completed` the artifact
//! `output`, then `completed`; `run.awaiting_input` `input-required` with the question;
//! `run.failed`, `run.cancelled` `failed`, `canceled`. Each carries `metadata.fabric` (`seq`, `event`).

use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::AppState;
use super::super::stream::{Frames, Out, spawn_pump, until_closing};
use super::task;
use super::wire::{self, Code, RpcError};

/// The run's events as one request's stream responses.
struct A2aFrames {
    request: Value,
    task: String,
    context: String,
    legacy: bool,
    ended: bool,
    /// The run's last event when the stream began: a question before it was answered since
    /// (what follows it is the run going on), so a stream that replays it goes on past it.
    known: u64,
}

impl A2aFrames {
    fn frame(&self, result: Value) -> SseEvent {
        let result = if self.legacy { wire::legacy(result) } else { result };
        SseEvent::default().data(wire::success(&self.request, result).to_string())
    }

    fn status(&self, state: &str, text: Option<&str>, ts: Option<&str>, meta: Value) -> Value {
        let message =
            text.map(|t| wire::message(&format!("{}:{}", self.task, meta["fabric"]["seq"]), &self.task, &self.context, "ROLE_AGENT", vec![json!({"text": t})]));
        wire::status_update(&self.task, &self.context, state, message, ts, meta)
    }
}

impl Frames for A2aFrames {
    fn push(&mut self, seq: u64, kind: &str, json: &str) -> Vec<SseEvent> {
        let e: Value = serde_json::from_str(json).unwrap_or_default();
        let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
        let mut meta = json!({"fabric": {"seq": seq, "event": kind}});
        if let Some(stage) = e.get("stage_id") {
            meta["fabric"]["stage_id"] = stage.clone();
        }
        let ts = s("ts");
        let (task, ctx) = (self.task.clone(), self.context.clone());
        let results = match kind {
            "run.started" | "run.resumed" | "run.stage.started" | "run.stage.completed" => {
                vec![self.status("TASK_STATE_WORKING", None, ts.as_deref(), meta)]
            }
            "run.llm.delta" | "run.llm.restarted" => {
                let stage = s("stage_id").unwrap_or_default();
                let turn = e.get("turn").and_then(Value::as_u64).unwrap_or(0);
                let text = s("text").unwrap_or_default();
                let append = kind == "run.llm.delta" && e.get("index").and_then(Value::as_u64).unwrap_or(0) > 0;
                let artifact = json!({"artifactId": format!("text:{stage}:{turn}"), "name": "text", "parts": [{"text": text}]});
                vec![wire::artifact_update(&task, &ctx, artifact, append, false, meta)]
            }
            "run.completed" => {
                let output = s("output").unwrap_or_default();
                let artifact = json!({"artifactId": "output", "name": "output", "parts": [wire::part_of(&output)]});
                vec![wire::artifact_update(&task, &ctx, artifact, false, true, meta.clone()), self.status("TASK_STATE_COMPLETED", None, ts.as_deref(), meta)]
            }
            "run.awaiting_input" => vec![self.status("TASK_STATE_INPUT_REQUIRED", s("question").as_deref(), ts.as_deref(), meta)],
            "run.failed" => {
                let why = format!("{}: {}", s("reason_class").unwrap_or_default(), s("message").unwrap_or_default());
                vec![self.status("TASK_STATE_FAILED", Some(&why), ts.as_deref(), meta)]
            }
            "run.cancelled" => vec![self.status("TASK_STATE_CANCELED", s("reason").as_deref(), ts.as_deref(), meta)],
            _ => Vec::new(),
        };
        self.ended = matches!(kind, "run.completed" | "run.failed" | "run.cancelled") || (kind == "run.awaiting_input" && seq >= self.known);
        let n = results.len();
        // The event's `seq` on its last frame only: a client that resumes after it has them all.
        results.into_iter().enumerate().map(|(i, r)| if i + 1 == n { self.frame(r).id(seq.to_string()) } else { self.frame(r) }).collect()
    }

    fn ended(&self) -> bool {
        self.ended
    }
}

/// Where a resumed stream starts: after `Last-Event-ID`, if the client sent one.
pub(super) fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, RpcError> {
    match headers.get("last-event-id") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| *n <= i64::MAX as u64)
            .map(Some)
            .ok_or_else(|| RpcError::new(Code::InvalidRequest, "`Last-Event-ID` must be the `seq` of an event (a whole number)")),
    }
}

/// The stream of task `run_id` for request `request`: the task (as it stands, or in `first`
/// state: a message's stream starts where its events do), then its events after `after`.
pub(super) async fn stream(
    state: &AppState,
    route_id: &str,
    request: Value,
    run_id: &str,
    after: u64,
    first: Option<&str>,
    legacy: bool,
) -> Result<Response, RpcError> {
    let run = task::load(state, route_id, run_id).await?;
    let config = &state.inner.config;
    let slot = state.inner.stream_slots.take(run_id, config.max_run_streams, config.max_event_streams).ok_or_else(|| {
        RpcError::new(Code::Internal, "too many event streams are open (of this task, or in all); retry shortly").with_data(json!({"retry_after_s": 5}))
    })?;
    let mut snapshot = task::task(state, &run, Some(0), first.is_none()).await?;
    if let Some(state) = first {
        snapshot["status"] = json!({"state": state});
    }
    let known = run.next_seq.saturating_sub(1);
    let frames = A2aFrames { request, task: run.run_id.clone(), context: task::context_of(&run), legacy, ended: false, known };
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    // The task as it stands first (no `id`: it is no event of the run).
    let first = frames.frame(json!({"task": snapshot}));
    if tx.send(first).await.is_err() {
        return Err(RpcError::new(Code::Internal, "the stream closed"));
    }
    let out = Out { tx, stall: config.stream_stall, frames: Some(Box::new(frames)) };
    spawn_pump(state, run.run_id.clone(), after, out, slot);
    Ok(Sse::new(until_closing(state, rx)).keep_alive(KeepAlive::default()).into_response())
}
