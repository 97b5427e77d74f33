//! A request's optional parameters read as their types: a field of the wrong type is the
//! protocol's invalid-params error naming it, never taken for an absent one (a `taskId` of `7`
//! would otherwise start a new task instead of answering one).

use serde_json::Value;

use super::wire::RpcError;

/// `object.key` as a string: absent, `null` or `""` is `None`.
pub(super) fn text<'a>(object: &'a Value, key: &str, path: &str) -> Result<Option<&'a str>, RpcError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.is_empty())),
        Some(_) => Err(RpcError::params(format!("`{path}.{key}` must be a string"))),
    }
}

/// `object.key` as a boolean: absent or `null` is `None`.
pub(super) fn flag(object: &Value, key: &str, path: &str) -> Result<Option<bool>, RpcError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(RpcError::params(format!("`{path}.{key}` must be true or false"))),
    }
}

/// `object.key` as an object: absent or `null` is `None`.
pub(super) fn object<'a>(object: &'a Value, key: &str, path: &str) -> Result<Option<&'a Value>, RpcError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(_) => Err(RpcError::params(format!("`{path}.{key}` must be an object"))),
    }
}

/// A time as RFC 3339 with any offset (`Z`, `+05:00`), in milliseconds since the epoch.
pub(super) fn time_ms(t: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(t).ok().map(|d| d.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_of_another_type_is_refused_naming_it_and_absent_ones_are_none() {
        let m = json!({"taskId": 7, "contextId": "", "configuration": "x", "returnImmediately": "true"});
        assert!(text(&m, "taskId", "params.message").unwrap_err().message.contains("`params.message.taskId` must be a string"));
        assert_eq!(text(&m, "contextId", "p").unwrap(), None);
        assert_eq!(text(&m, "nope", "p").unwrap(), None);
        assert!(object(&m, "configuration", "params").is_err());
        assert!(flag(&m, "returnImmediately", "params.configuration").is_err());
        assert_eq!(flag(&json!({"b": false}), "b", "p").unwrap(), Some(false));
    }

    #[test]
    fn times_with_any_offset_compare_as_instants() {
        assert_eq!(time_ms("2026-01-01T05:00:00+05:00"), time_ms("2026-01-01T00:00:00Z"));
        assert_eq!(time_ms("2026-01-01T00:00:00.000Z"), Some(1_767_225_600_000));
        assert_eq!(time_ms("2026-01-01 00:00:00"), None);
        assert_eq!(time_ms("2026-01-01T00:00:00ZZZZ"), None);
    }
}
