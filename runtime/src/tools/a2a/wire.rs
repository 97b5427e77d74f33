//! The A2A wire as the client needs it: the params of `SendMessage` and `GetTask` (1.0 shapes),
//! a JSON-RPC answer read into its result or its error, and a task read into where it stands
//! (1.0's `TASK_STATE_*` and 0.3's lowercase states alike, a `task` wrapper or a bare task, a
//! direct `message` answer as a completed one).

use serde_json::{Value, json};

use super::{A2aMessage, Content};

/// The protocol's `UnsupportedOperationError`: what a message to a task that no longer asks gets.
pub(super) const UNSUPPORTED_OPERATION: i64 = -32004;

/// The longest piece of an agent's own words an error repeats.
const SHOWN: usize = 500;

pub(super) fn send_params(m: &A2aMessage<'_>) -> Value {
    let skill = json!({"skill": m.invoke.skill});
    let message = match m.content {
        Content::Start(args) => json!({
            "messageId": m.message_id, "role": "ROLE_USER",
            "parts": [{"data": args, "mediaType": "application/json"}], "metadata": skill,
        }),
        Content::Reply { task_id, context_id, text } => {
            let mut message = json!({"messageId": m.message_id, "role": "ROLE_USER", "taskId": task_id, "parts": [{"text": text}], "metadata": skill});
            if let Some(c) = context_id {
                message["contextId"] = json!(c);
            }
            message
        }
    };
    json!({"message": message, "configuration": {"returnImmediately": false}, "metadata": skill})
}

pub(super) fn get_params(task_id: &str) -> Value {
    json!({"id": task_id, "historyLength": 0})
}

/// A JSON-RPC error an agent answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSON-RPC error {code}: {message}")]
pub(super) struct RpcError {
    pub code: i64,
    pub message: String,
}

/// Why an answer gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ReplyError {
    #[error("the agent's answer is not JSON")]
    NotJson,
    #[error("the agent's answer is no JSON-RPC response (neither `result` nor `error`)")]
    NotRpc,
    #[error("the agent answered {0}")]
    Rpc(RpcError),
}

/// A task that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum TaskError {
    #[error("the agent's result is neither a task nor a message")]
    NotTask,
    #[error("the agent's task has no `id`")]
    NoId,
    #[error("the agent's task is in a state A2A does not define: `{0}`")]
    UnknownState(String),
}

/// The `result` of a JSON-RPC answer.
pub(super) fn result(raw: &[u8]) -> Result<Value, ReplyError> {
    let Ok(Value::Object(mut answer)) = serde_json::from_slice::<Value>(raw) else { return Err(ReplyError::NotJson) };
    if let Some(e) = answer.get("error") {
        let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = shown(e.get("message").and_then(Value::as_str).unwrap_or("(no message)"));
        return Err(ReplyError::Rpc(RpcError { code, message }));
    }
    answer.remove("result").ok_or(ReplyError::NotRpc)
}

/// Where a task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reading {
    Completed(String),
    InputRequired {
        task_id: String,
        context_id: Option<String>,
        question: String,
    },
    /// Failed, canceled, rejected (or asking for authentication): the agent's reason, if any.
    Ended {
        state: String,
        why: String,
    },
    Working {
        task_id: String,
    },
}

pub(super) fn read_task(result: &Value) -> Result<Reading, TaskError> {
    let message = result.get("message").or_else(|| (result.get("kind").and_then(Value::as_str) == Some("message")).then_some(result));
    if let Some(m) = message {
        return Ok(Reading::Completed(parts_text(m.get("parts"))));
    }
    let task = result.get("task").unwrap_or(result);
    let status = task.get("status").ok_or(TaskError::NotTask)?;
    let raw = status.get("state").and_then(Value::as_str).unwrap_or_default();
    let state = raw.trim_start_matches("TASK_STATE_").to_ascii_lowercase().replace('_', "-");
    let said = || status.get("message").map(|m| parts_text(m.get("parts"))).unwrap_or_default();
    let id = || task.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned).ok_or(TaskError::NoId);
    Ok(match state.as_str() {
        "completed" => {
            let parts: Vec<&Value> = task
                .get("artifacts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|a| a.get("parts"))
                .flat_map(|p| p.as_array().into_iter().flatten())
                .collect();
            Reading::Completed(if parts.is_empty() { said() } else { join(&parts) })
        }
        "input-required" => {
            let question = Some(said()).filter(|q| !q.is_empty()).unwrap_or_else(|| "The agent asks for more input.".to_owned());
            let context_id = task.get("contextId").and_then(Value::as_str).map(str::to_owned);
            Reading::InputRequired { task_id: id()?, context_id, question }
        }
        "failed" | "canceled" | "cancelled" | "rejected" | "auth-required" => Reading::Ended { state, why: shown(&said()) },
        "submitted" | "working" => Reading::Working { task_id: id()? },
        _ => return Err(TaskError::UnknownState(shown(raw))),
    })
}

/// A message's or artifact's parts as one text: a lone data part's value as compact JSON, else
/// each part's text (a data part's JSON) on a line of its own; files are not read.
fn parts_text(parts: Option<&Value>) -> String {
    join(&parts.and_then(Value::as_array).map(|p| p.iter().collect::<Vec<_>>()).unwrap_or_default())
}

fn join(parts: &[&Value]) -> String {
    let text = |p: &Value| match (p.get("text").and_then(Value::as_str), p.get("data")) {
        (Some(t), _) => Some(t.to_owned()),
        (None, Some(d)) => Some(d.to_string()),
        _ => None,
    };
    parts.iter().filter_map(|p| text(p)).collect::<Vec<_>>().join("\n")
}

/// An agent's words, cut to [`SHOWN`] characters.
fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_read_in_either_version() {
        let done = json!({"task": {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [{"parts": [{"data": {"a": 1}}]}]}});
        assert_eq!(read_task(&done), Ok(Reading::Completed(r#"{"a":1}"#.into())));
        let asked = json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "input-required", "message": {"parts": [{"kind": "text", "text": "Which?"}]}}});
        assert_eq!(read_task(&asked), Ok(Reading::InputRequired { task_id: "t".into(), context_id: Some("c".into()), question: "Which?".into() }));
        let failed = json!({"id": "t", "status": {"state": "TASK_STATE_FAILED", "message": {"parts": [{"text": "no"}]}}});
        assert_eq!(read_task(&failed), Ok(Reading::Ended { state: "failed".into(), why: "no".into() }));
        assert_eq!(read_task(&json!({"message": {"parts": [{"text": "hi"}, {"data": [1]}]}})), Ok(Reading::Completed("hi\n[1]".into())));
        assert_eq!(read_task(&json!({"status": {"state": "TASK_STATE_WORKING"}})), Err(TaskError::NoId));
        assert_eq!(read_task(&json!({"id": "t", "status": {"state": "dancing"}})), Err(TaskError::UnknownState("dancing".into())));
        assert_eq!(read_task(&json!([1])), Err(TaskError::NotTask));
    }

    #[test]
    fn answers_read_into_results_or_errors() {
        assert_eq!(result(br#"{"jsonrpc":"2.0","id":1,"result":{"x":1}}"#), Ok(json!({"x": 1})));
        assert_eq!(result(b"<html>"), Err(ReplyError::NotJson));
        assert_eq!(result(br#"{"jsonrpc":"2.0"}"#), Err(ReplyError::NotRpc));
        let e = result(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no task"}}"#).unwrap_err();
        assert_eq!(e.to_string(), "the agent answered JSON-RPC error -32001: no task");
        assert_eq!(shown(&"é".repeat(600)).chars().count(), SHOWN + 1);
    }
}
