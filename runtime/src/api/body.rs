//! What a request gives the handlers, parsed once: a JSON body ([`JsonBody`]: declared
//! `application/json`, not encoded, an object, every integer within 64 bits) and path parameters
//! ([`PathText`], [`RunIdPath`]), each refused in the API's one error shape.

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::*;
use crate::store::RunId;

/// The most of a client's identifier an error message repeats: enough to recognise it, while a
/// refusal stays small whatever the request held.
const ECHO_MAX_CHARS: usize = 64;

/// An identifier from the request (a run id, a route id, a profile) as an error message shows it:
/// at most 64 characters, then `…`.
pub(super) fn echo_id(id: &str) -> std::borrow::Cow<'_, str> {
    match id.char_indices().nth(ECHO_MAX_CHARS) {
        Some((end, _)) => format!("{}…", &id[..end]).into(),
        None => id.into(),
    }
}

/// A path parameter as text. axum's own rejection (a segment that is not UTF-8 once
/// percent-decoded, say) is plain text; this one is the API's 400 `invalid_request`.
pub(super) struct PathText(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathText {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<PathText, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(text)) => Ok(PathText(text)),
            Err(e) => {
                // The rejection's own text repeats the segment; the message says what is wrong only.
                let why = match &e {
                    PathRejection::FailedToDeserializePathParams(f) if matches!(f.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) => {
                        "a path segment is not UTF-8 text once percent-decoded"
                    }
                    _ => "the path does not parse",
                };
                Err(ApiError::new(ErrorCode::InvalidRequest, why))
            }
        }
    }
}

/// `{run_id}` as a [`RunId`]. Anything that cannot be one names no run: 404 before any store query.
pub(super) struct RunIdPath(pub RunId);

impl<S: Send + Sync> FromRequestParts<S> for RunIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<RunIdPath, ApiError> {
        let PathText(text) = PathText::from_request_parts(parts, state).await?;
        RunId::parse(&text).map(RunIdPath).ok_or_else(|| no_run(&text))
    }
}

/// The 404 of a run that is not there (or cannot be).
pub(super) fn no_run(run_id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no run `{}`", echo_id(run_id)))
}

/// A request body of type `T`, read only when declared `application/json` (parameters allowed)
/// and not encoded (415 otherwise: the service does not guess, and does not decompress), within
/// the body limit (413); it must be a JSON object whose integers all fit 64 bits (422).
pub(super) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<JsonBody<T>, ApiError> {
        media_type(request.headers())?;
        parse_json(&body_bytes(request, state).await?).map(JsonBody)
    }
}

/// A body that may be left out: no bytes at all is `None` (whatever the headers say); any
/// other body is read as a [`JsonBody`] is.
pub(super) struct MaybeJsonBody<T>(pub Option<T>);

impl<T: DeserializeOwned> FromRequest<AppState> for MaybeJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<MaybeJsonBody<T>, ApiError> {
        let headers = request.headers().clone();
        let bytes = body_bytes(request, state).await?;
        if bytes.is_empty() {
            return Ok(MaybeJsonBody(None));
        }
        media_type(&headers)?;
        parse_json(&bytes).map(|v| MaybeJsonBody(Some(v)))
    }
}

/// The body's bytes within the body limit (413 beyond it).
async fn body_bytes(request: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let limit = state.inner.config.max_body_bytes;
    Bytes::from_request(request, state).await.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(ErrorCode::TooLarge, format!("the request body is larger than {limit} bytes")),
        _ => ApiError::new(ErrorCode::InvalidRequest, "the request body could not be read"),
    })
}

fn unsupported(message: &str) -> ApiError {
    ApiError::new(ErrorCode::UnsupportedMediaType, message)
}

/// Exactly one `Content-Type`, `application/json` in any case with any parameters; no
/// `Content-Encoding` but `identity`. The client's header values are not repeated.
fn media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    let json = match (types.next(), types.next()) {
        (Some(v), None) => v.to_str().ok().and_then(|v| v.split(';').next()).is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")),
        _ => false,
    };
    if !json {
        return Err(unsupported("the body must be JSON sent with `Content-Type: application/json`"));
    }
    let identity = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .all(|v| v.to_str().is_ok_and(|v| v.split(',').all(|coding| coding.trim().eq_ignore_ascii_case("identity"))));
    if !identity {
        return Err(unsupported("the body must not be encoded (`Content-Encoding`): the service does not decompress"));
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidContent, message)
}

/// The body as `T`. An object first: serde's derived structs would also take an array of their
/// fields in order. Then the integers: serde_json (without `arbitrary_precision`, which would
/// break the Python float formatting the record keeps) reads one past 64 bits as a float,
/// rounding it, where Python's `json` keeps it exactly; refused rather than rounded silently.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(invalid("the body must be a JSON object"));
    }
    let value = serde_json::from_slice(bytes).map_err(|e| invalid(format!("the body is not what this endpoint takes: {e}")))?;
    if let Some(path) = wide_integer(bytes) {
        return Err(invalid(format!(
            "`{}` is an integer beyond 64 bits, which cannot be kept exactly (it would be rounded); send it as a string",
            echo_id(&path)
        )));
    }
    Ok(value)
}

/// Where the scan of a value is, from the body's top: an object's key (its bytes, quotes
/// included, decoded only to name a path) or an array's index.
enum Step {
    Key(std::ops::Range<usize>),
    Index(usize),
}

/// Why a scan stopped early.
enum Stop {
    /// An integer no `i64` or `u64` holds, at this path.
    Wide,
    /// Not JSON after all (the caller parsed it first, so never).
    Malformed,
}

/// The JSON path (`goal.n`, `goal.items[2]`, `goal["a b"]`) of the first integer of `json` that
/// fits neither `i64` nor `u64`. `json` was read by serde_json already: it is valid and nested at
/// most 128 deep (its recursion limit), which bounds this scan's recursion too.
fn wide_integer(json: &[u8]) -> Option<String> {
    let mut scan = Scan { s: json, i: 0, path: Vec::new() };
    match scan.value() {
        Err(Stop::Wide) => Some(scan.path_text()),
        Ok(()) | Err(Stop::Malformed) => None,
    }
}

struct Scan<'a> {
    s: &'a [u8],
    i: usize,
    path: Vec<Step>,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Result<(), Stop> {
        self.ws();
        match self.peek().ok_or(Stop::Malformed)? {
            b'{' => {
                self.i += 1;
                loop {
                    self.ws();
                    match self.peek() {
                        Some(b'}') => break,
                        Some(b'"') => {}
                        _ => return Err(Stop::Malformed),
                    }
                    let key = self.string()?;
                    self.ws();
                    if self.peek() != Some(b':') {
                        return Err(Stop::Malformed);
                    }
                    self.i += 1;
                    self.path.push(Step::Key(key));
                    self.value()?;
                    self.path.pop();
                    if !self.next_or_end(b'}')? {
                        return Ok(());
                    }
                }
                self.i += 1;
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(());
                }
                let mut index = 0;
                loop {
                    self.path.push(Step::Index(index));
                    self.value()?;
                    self.path.pop();
                    if !self.next_or_end(b']')? {
                        return Ok(());
                    }
                    index += 1;
                }
            }
            b'"' => {
                self.string()?;
            }
            b'-' | b'0'..=b'9' => self.number()?,
            // `true`, `false`, `null`.
            _ => {
                let start = self.i;
                while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
                    self.i += 1;
                }
                if self.i == start {
                    return Err(Stop::Malformed);
                }
            }
        }
        Ok(())
    }

    /// After a member: `,` (true: another follows) or the closing byte (consumed; false).
    fn next_or_end(&mut self, close: u8) -> Result<bool, Stop> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                Ok(true)
            }
            Some(b) if b == close => {
                self.i += 1;
                Ok(false)
            }
            _ => Err(Stop::Malformed),
        }
    }

    /// A string from its opening quote; returns its bytes, quotes included.
    fn string(&mut self) -> Result<std::ops::Range<usize>, Stop> {
        let start = self.i;
        self.i += 1;
        loop {
            match self.peek().ok_or(Stop::Malformed)? {
                b'"' => {
                    self.i += 1;
                    return Ok(start..self.i);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    fn number(&mut self) -> Result<(), Stop> {
        let start = self.i;
        let mut integer = true;
        while let Some(b) = self.peek() {
            match b {
                b'0'..=b'9' | b'-' | b'+' => {}
                b'.' | b'e' | b'E' => integer = false,
                _ => break,
            }
            self.i += 1;
        }
        // Only integer tokens: a float (`1.5`, `1e30`) is a float in Python too.
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| Stop::Malformed)?;
        let fits = if text.starts_with('-') { text.parse::<i64>().is_ok() } else { text.parse::<u64>().is_ok() };
        if integer && !fits { Err(Stop::Wide) } else { Ok(()) }
    }

    /// The path so far as text: `.key` for a plain key, `["key"]` (JSON) for any other, `[n]`.
    fn path_text(&self) -> String {
        let mut out = String::new();
        for step in &self.path {
            match step {
                Step::Key(range) => {
                    let key: String = serde_json::from_slice(&self.s[range.clone()]).unwrap_or_default();
                    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                        if !out.is_empty() {
                            out.push('.');
                        }
                        out.push_str(&key);
                    } else {
                        out.push('[');
                        out.push_str(&serde_json::to_string(&key).unwrap_or_default());
                        out.push(']');
                    }
                }
                Step::Index(n) => out.push_str(&format!("[{n}]")),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{echo_id, wide_integer};

    #[test]
    fn integers_past_64_bits_are_found_with_their_path() {
        for (json, path) in [
            (r#"{"goal": {"n": 123456789012345678901234567890}}"#, Some("goal.n")),
            (r#"{"goal": {"a": [1, {"b": -9223372036854775809}]}}"#, Some("goal.a[1].b")),
            (r#"{"goal": {"a b": [18446744073709551616]}}"#, Some(r#"goal["a b"][0]"#)),
            (r#"{"k\"ey": {"x\u0041": 99999999999999999999}}"#, Some(r#"["k\"ey"].xA"#)),
            (r#"{"goal": {"max": 18446744073709551615, "min": -9223372036854775808, "f": 1e400, "g": 1.5e30}}"#, None),
            (r#"{"s": "123456789012345678901234567890", "t": [true, false, null, []], "u": {}}"#, None),
        ] {
            assert_eq!(wide_integer(json.as_bytes()).as_deref(), path, "{json}");
        }
    }

    #[test]
    fn echoed_ids_are_cut_at_64_characters() {
        assert_eq!(echo_id("short"), "short");
        assert_eq!(echo_id(&"x".repeat(64)), "x".repeat(64));
        assert_eq!(echo_id(&"é".repeat(5000)), format!("{}…", "é".repeat(64)));
    }
}
