//! A2A's wire forms, built and read here only: JSON-RPC 2.0 envelopes and errors (the protocol's
//! codes), the 1.0 ProtoJSON shapes of tasks, messages, parts, artifacts and stream responses,
//! and the 0.3 shapes an older client's method names are answered in ([`legacy`]).
//!
//! Serde types of our own rather than the official `a2a-lf` crate: it speaks 1.0 only, and the
//! same task is answered in both versions here; the shapes are few and built from a run's view.

use serde_json::{Map, Value, json};

use crate::store::StoredStatus;

/// The protocol version the cards state (the `a2a-sdk` 1.x and the TCK's).
pub(super) const PROTOCOL_VERSION: &str = "1.0";

/// JSON-RPC's and A2A's error codes (A2A 1.0, section 5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    Parse = -32700,
    InvalidRequest = -32600,
    MethodNotFound = -32601,
    InvalidParams = -32602,
    Internal = -32603,
    TaskNotFound = -32001,
    TaskNotCancelable = -32002,
    UnsupportedOperation = -32004,
    ContentTypeNotSupported = -32005,
    ExtendedCardNotConfigured = -32007,
    VersionNotSupported = -32009,
}

/// A JSON-RPC error: its code, message and data.
#[derive(Debug)]
pub(super) struct RpcError {
    pub code: Code,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidParams, message)
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// The error response to request `id`.
    pub fn response(&self, id: &Value) -> Value {
        let mut error = json!({"code": self.code as i64, "message": self.message});
        if let Some(d) = &self.data {
            error["data"] = d.clone();
        }
        json!({"jsonrpc": "2.0", "id": id, "error": error})
    }
}

/// The success response to request `id`.
pub(super) fn success(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A run's status as a task state (1.0 names).
pub(super) fn state(status: StoredStatus) -> &'static str {
    match status {
        StoredStatus::Queued => "TASK_STATE_SUBMITTED",
        StoredStatus::Running => "TASK_STATE_WORKING",
        StoredStatus::AwaitingInput => "TASK_STATE_INPUT_REQUIRED",
        StoredStatus::Completed => "TASK_STATE_COMPLETED",
        StoredStatus::Failed => "TASK_STATE_FAILED",
        StoredStatus::Cancelled => "TASK_STATE_CANCELED",
    }
}

/// A task state (either version's name) as the run status it filters on.
pub(super) fn status_of(state: &str) -> Option<StoredStatus> {
    let name = state.trim_start_matches("TASK_STATE_").to_ascii_lowercase().replace('_', "-");
    Some(match name.as_str() {
        "submitted" => StoredStatus::Queued,
        "working" => StoredStatus::Running,
        "input-required" => StoredStatus::AwaitingInput,
        "completed" => StoredStatus::Completed,
        "failed" => StoredStatus::Failed,
        "canceled" | "cancelled" => StoredStatus::Cancelled,
        _ => return None,
    })
}

/// A part of a message or an artifact: a JSON object is a data part, anything else text.
pub(super) fn part_of(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => json!({"data": v, "mediaType": "application/json"}),
        _ => json!({"text": text}),
    }
}

/// A message: `role` `ROLE_USER` or `ROLE_AGENT`.
pub(super) fn message(id: &str, task: &str, context: &str, role: &str, parts: Vec<Value>) -> Value {
    json!({"messageId": id, "taskId": task, "contextId": context, "role": role, "parts": parts})
}

/// A status update of a stream.
pub(super) fn status_update(task: &str, context: &str, state: &str, message: Option<Value>, ts: Option<&str>, meta: Value) -> Value {
    let mut status = json!({"state": state});
    if let Some(ts) = ts {
        status["timestamp"] = json!(ts);
    }
    if let Some(m) = message {
        status["message"] = m;
    }
    json!({"statusUpdate": {"taskId": task, "contextId": context, "status": status, "metadata": meta}})
}

/// An artifact update of a stream.
pub(super) fn artifact_update(task: &str, context: &str, artifact: Value, append: bool, last: bool, meta: Value) -> Value {
    json!({"artifactUpdate": {"taskId": task, "contextId": context, "artifact": artifact, "append": append, "lastChunk": last, "metadata": meta}})
}

/// A value of the 1.0 shapes in the 0.3 ones: `kind`s, lowercase states and roles, parts with
/// their kind, a stream response or a send's answer unwrapped (with `final` on a status update).
pub(super) fn legacy(value: Value) -> Value {
    match value {
        Value::Object(mut o) => {
            for (wrapper, kind) in [("task", "task"), ("message", "message"), ("statusUpdate", "status-update"), ("artifactUpdate", "artifact-update")] {
                if o.len() == 1
                    && let Some(Value::Object(inner)) = o.remove(wrapper)
                {
                    let mut inner = legacy_object(inner);
                    inner.insert("kind".into(), json!(kind));
                    if kind == "status-update" {
                        let state = inner.get("status").and_then(|s| s.get("state")).and_then(Value::as_str).unwrap_or_default();
                        inner.insert("final".into(), json!(!matches!(state, "submitted" | "working")));
                    }
                    return Value::Object(inner);
                }
            }
            Value::Object(legacy_object(o))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(legacy).collect()),
        other => other,
    }
}

fn legacy_object(o: Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    let is_part = o.contains_key("text") || (o.contains_key("data") && !o.contains_key("taskId"));
    for (k, v) in o {
        let v = match (k.as_str(), v) {
            ("state", Value::String(s)) => json!(s.trim_start_matches("TASK_STATE_").to_ascii_lowercase().replace('_', "-")),
            ("role", Value::String(s)) => json!(s.trim_start_matches("ROLE_").to_ascii_lowercase()),
            ("data", v) if is_part => v,
            (_, v @ (Value::Object(_) | Value::Array(_))) => legacy(v),
            (_, v) => v,
        };
        out.insert(k, v);
    }
    if is_part {
        out.insert("kind".into(), json!(if out.contains_key("text") { "text" } else { "data" }));
        out.remove("mediaType");
    }
    if out.contains_key("messageId") && out.contains_key("parts") {
        out.insert("kind".into(), json!("message"));
    }
    if out.contains_key("status") && out.contains_key("id") && !out.contains_key("kind") {
        out.insert("kind".into(), json!("task"));
    }
    out
}

/// What a message's parts give: the text of its text parts (joined by new lines), its first
/// data part, whether it had a part of another kind (a file, a URL, raw bytes), and the size of
/// its largest part.
#[derive(Debug, Default)]
pub(super) struct Parts {
    pub text: Option<String>,
    pub data: Option<Value>,
    pub other: bool,
    pub largest: usize,
}

/// Reads a message's parts, of either version (`{"text": ...}`, `{"kind": "text", "text": ...}`,
/// `{"data": ...}`, `{"kind": "data", "data": ...}`).
pub(super) fn read_parts(parts: &[Value]) -> Parts {
    let mut out = Parts::default();
    for part in parts {
        let size = serde_json::to_vec(part).map_or(0, |b| b.len());
        out.largest = out.largest.max(size);
        if let Some(t) = part.get("text").and_then(Value::as_str) {
            match &mut out.text {
                Some(text) => {
                    text.push('\n');
                    text.push_str(t);
                }
                None => out.text = Some(t.to_owned()),
            }
        } else if let Some(d) = part.get("data") {
            if out.data.is_none() {
                out.data = Some(d.clone());
            }
        } else {
            out.other = true;
        }
    }
    out
}
