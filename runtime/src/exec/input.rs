//! A run's input as a front end reads it from text: the goal (a JSON object) and the prefetch
//! pack (its chunks), each refused with the reason the front end shows.

use serde_json::{Map, Value};

/// Why a text is no goal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoalError {
    #[error("the goal is not valid JSON: {0}")]
    NotJson(String),
    /// The JSON kind it is instead (`an array`, `null`, ...).
    #[error("the goal must be a JSON object, got {0}")]
    NotObject(&'static str),
}

/// Why a text is no prefetch pack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefetchError {
    #[error("not valid JSON: {0}")]
    NotJson(String),
    #[error("an object pack needs a `chunks` array")]
    NoChunks,
    #[error("a prefetch pack is a JSON array of strings or {{\"chunks\": [...]}}")]
    NotAPack,
    /// The 0-based index of the first chunk that is not a string.
    #[error("chunk {0} is not a string")]
    NotAString(usize),
}

/// Checks a `--goal` value: the goal of a run must be a JSON object.
pub fn parse_goal(text: &str) -> Result<Map<String, Value>, GoalError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(GoalError::NotObject(match other {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        })),
        Err(e) => Err(GoalError::NotJson(e.to_string())),
    }
}

/// Reads a prefetch pack: a JSON array of strings, or `{"chunks": [...]}`.
pub fn parse_prefetch(text: &str) -> Result<Vec<String>, PrefetchError> {
    let v: Value = serde_json::from_str(text).map_err(|e| PrefetchError::NotJson(e.to_string()))?;
    let items = match &v {
        Value::Array(items) => items,
        Value::Object(m) => m.get("chunks").and_then(Value::as_array).ok_or(PrefetchError::NoChunks)?,
        _ => return Err(PrefetchError::NotAPack),
    };
    items.iter().enumerate().map(|(i, c)| c.as_str().map(str::to_owned).ok_or(PrefetchError::NotAString(i))).collect()
}
