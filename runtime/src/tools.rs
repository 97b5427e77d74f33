//! Tools: HTTP tools (the `invoke` of a capability) behind the [`HttpPort`], and in-process
//! tools registered by code that embeds the runtime ([`Tool`]). Both take a JSON arguments
//! object. The executor sees only these two small traits, so it can be tested without sockets.
//!
//! Hardened because arguments may come from a model: the URL comes only from the catalogue,
//! arguments travel only as encoded query parameters (GET) or a JSON body (POST), redirects are
//! followed only within the same origin, every call has a timeout, and the body is read up to a
//! size cap.

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::defs::{HttpMethod, Invoke};
use crate::failure::{BoxFuture, ReasonClass};

/// An in-process tool: a Rust function with the same input-schema contract as an HTTP tool
/// (the loop checks the arguments against the capability's `input_schema` before calling it).
pub trait Tool: Send + Sync {
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, String>>;
}

/// The port HTTP tool calls go through. Contract: call `url` (already resolved from the
/// catalogue, never from model output) the way `invoke` says, with `args` as query parameters
/// (GET) or a JSON body (POST), within its timeout and size cap; a failure carries a tool reason
/// class and a message that never contains the URL's query or credentials.
pub trait HttpPort: Send + Sync {
    fn call<'a>(&'a self, invoke: &'a Invoke, url: &'a str, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

/// Wraps a plain function as a [`Tool`].
pub struct FnTool<F>(pub F);

impl<F> std::fmt::Debug for FnTool<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnTool")
    }
}

impl<F> Tool for FnTool<F>
where
    F: Fn(&Map<String, Value>) -> Result<Value, String> + Send + Sync,
{
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { (self.0)(args) })
    }
}

/// The built-in `add` tool of the `fabric` binary: `{a, b}` → `{"sum": a + b}`.
pub fn builtin_add() -> std::sync::Arc<dyn Tool> {
    std::sync::Arc::new(FnTool(|args: &Map<String, Value>| {
        let num = |k: &str| args.get(k).and_then(Value::as_f64).ok_or_else(|| format!("`{k}` must be a number"));
        let sum = num("a")? + num("b")?;
        if !sum.is_finite() {
            return Err("the sum is too large to represent".into());
        }
        // Whole sums print as integers (`5`, not `5.0`), as a person would write them.
        Ok(if sum.fract() == 0.0 && sum.abs() < 9e15 { serde_json::json!({"sum": sum as i64}) } else { serde_json::json!({"sum": sum}) })
    }))
}

#[derive(Debug, Clone)]
pub struct HttpTools {
    client: reqwest::Client,
    /// Bounds the requests in flight to one origin, so bursts reuse pooled connections
    /// instead of opening one connection per request.
    per_origin: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Semaphore>>>>,
    /// Tool URLs as resolved from the catalogue, parsed once: parsing a URL (its host above all)
    /// cost more than the rest of a loopback call.
    targets: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Target>>>>,
}

/// A parsed tool URL and its origin's gate.
#[derive(Debug)]
struct Target {
    url: reqwest::Url,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Parsed tool URLs kept at most; past it the cache starts again (URLs come from the catalogue
/// and its variables, so there are few, but a variable may change).
const MAX_TARGETS: usize = 1024;

/// Same-origin redirects a tool call follows at most.
pub const MAX_REDIRECTS: usize = 5;

/// Requests in flight to one tool origin at most; more wait for a free connection.
pub const MAX_IN_FLIGHT_PER_ORIGIN: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub status: u16,
    /// Compact JSON when the body is JSON, else the body text.
    pub text: String,
    pub bytes: usize,
    pub duration: Duration,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {message}", class.as_str())]
pub struct ToolError {
    pub class: ReasonClass,
    pub message: String,
}

/// The longest request URL a GET tool call may make (what HTTP clients and most servers accept);
/// arguments that would make a longer one are refused before anything is sent.
pub const MAX_URL_BYTES: usize = 16 * 1024;

impl HttpTools {
    /// Fails only when the HTTP client cannot be built (a start-up error, never a fallback to a
    /// client without the redirect policy).
    pub fn new() -> Result<HttpTools, String> {
        let client = reqwest::Client::builder()
            // Followed by `send` itself, within the origin (see there).
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(MAX_IN_FLIGHT_PER_ORIGIN)
            .build()
            .map_err(|e| format!("cannot build the HTTP client of the tools: {e}"))?;
        Ok(HttpTools { client, per_origin: Default::default(), targets: Default::default() })
    }

    /// The parsed target of a resolved tool URL, from the cache or parsed now.
    fn target(&self, url: &str) -> Result<std::sync::Arc<Target>, ToolError> {
        if let Some(t) = self.targets.lock().unwrap_or_else(|p| p.into_inner()).get(url) {
            return Ok(t.clone());
        }
        // The URL may hold a key (`?api_key=${KB_KEY}`): messages show its origin and path only.
        let shown = display_url(url);
        let parsed =
            reqwest::Url::parse(url).map_err(|e| ToolError { class: ReasonClass::ToolConnection, message: format!("invalid tool URL `{shown}`: {e}") })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ToolError { class: ReasonClass::ToolConnection, message: format!("tool URL `{shown}` is not http(s)") });
        }
        let origin = format!("{}://{}:{}", parsed.scheme(), parsed.host_str().unwrap_or_default(), parsed.port_or_known_default().unwrap_or(0));
        let gate = {
            let mut map = self.per_origin.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(origin).or_insert_with(|| std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT_PER_ORIGIN))).clone()
        };
        let target = std::sync::Arc::new(Target { url: parsed, gate });
        let mut targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        if targets.len() >= MAX_TARGETS {
            targets.clear();
        }
        targets.insert(url.to_owned(), target.clone());
        Ok(target)
    }

    /// Calls `url` (already resolved from the catalogue) with `args`.
    pub async fn send(&self, invoke: &Invoke, url: &str, args: &Map<String, Value>) -> Result<ToolOutput, ToolError> {
        let started = Instant::now();
        let target = self.target(url)?;
        let mut parsed = target.url.clone();
        match invoke.method {
            HttpMethod::Get => {
                if !args.is_empty() {
                    let mut pairs = parsed.query_pairs_mut();
                    for (k, v) in args {
                        match v {
                            Value::Array(items) => {
                                for i in items {
                                    pairs.append_pair(k, &scalar_text(i));
                                }
                            }
                            other => {
                                pairs.append_pair(k, &scalar_text(other));
                            }
                        }
                    }
                }
                if parsed.as_str().len() > MAX_URL_BYTES {
                    return Err(ToolError {
                        class: ReasonClass::InvalidToolArguments,
                        message: format!(
                            "the arguments make a GET request URL of {} bytes; the limit is {MAX_URL_BYTES} (a tool taking large arguments should use method POST)",
                            parsed.as_str().len()
                        ),
                    });
                }
            }
            HttpMethod::Post => {}
        }
        let _permit =
            target.gate.clone().acquire_owned().await.map_err(|_| ToolError { class: ReasonClass::ToolConnection, message: "tool client closed".into() })?;
        // Redirects are followed here rather than by the client: its redirect layer parses every
        // request's URL again, which was a fifth of a loopback call. The rules are the same:
        // within the first URL's origin only, at most MAX_REDIRECTS, and the timeout covers all.
        let deadline = started + invoke.timeout;
        let mut post = invoke.method == HttpMethod::Post;
        let mut hops = 0;
        let mut response = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let request = if post { self.client.post(parsed.clone()).json(args) } else { self.client.get(parsed.clone()) };
            let response = request.timeout(left).send().await.map_err(|e| classify(e, invoke.timeout))?;
            let status = response.status().as_u16();
            let location = response.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok());
            let Some(location) = location.filter(|_| matches!(status, 301 | 302 | 303 | 307 | 308)) else { break response };
            let next = parsed
                .join(location)
                .map_err(|_| ToolError { class: ReasonClass::ToolConnection, message: format!("HTTP {status}: a redirect to an invalid URL") })?;
            let same_origin = next.scheme() == target.url.scheme()
                && next.host_str() == target.url.host_str()
                && next.port_or_known_default() == target.url.port_or_known_default();
            if !same_origin {
                // Where it pointed, by origin only: the query may hold a key.
                let to = display_url(next.as_str());
                return Err(ToolError { class: ReasonClass::ToolConnection, message: format!("HTTP {status}: redirect to another origin refused ({to})") });
            }
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(ToolError { class: ReasonClass::ToolConnection, message: format!("too many redirects (more than {MAX_REDIRECTS})") });
            }
            // As browsers and HTTP clients do: 301/302/303 go on as a GET without the body.
            if matches!(status, 301..=303) {
                post = false;
            }
            parsed = next;
        };
        let status = response.status().as_u16();
        if response.content_length().is_some_and(|n| n as usize > invoke.max_response_bytes) {
            return Err(too_large(invoke.max_response_bytes));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| classify(e, invoke.timeout))? {
            if body.len() + chunk.len() > invoke.max_response_bytes {
                return Err(too_large(invoke.max_response_bytes));
            }
            body.extend_from_slice(&chunk);
        }
        let raw = String::from_utf8_lossy(&body);
        if !(200..300).contains(&status) {
            let excerpt: String = raw.chars().take(200).collect();
            return Err(ToolError { class: ReasonClass::ToolHttpStatus, message: format!("HTTP {status}: {}", excerpt.trim()) });
        }
        let text = match serde_json::from_str::<Value>(&raw) {
            Ok(v) => v.to_string(),
            Err(_) => raw.trim().to_owned(),
        };
        Ok(ToolOutput { status, text, bytes: body.len(), duration: started.elapsed() })
    }
}

impl HttpPort for HttpTools {
    fn call<'a>(&'a self, invoke: &'a Invoke, url: &'a str, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.send(invoke, url, args))
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn too_large(limit: usize) -> ToolError {
    ToolError { class: ReasonClass::ToolResponseTooLarge, message: format!("response is larger than the {limit}-byte limit") }
}

fn classify(e: reqwest::Error, timeout: Duration) -> ToolError {
    if e.is_timeout() {
        ToolError { class: ReasonClass::ToolTimeout, message: format!("no response within {} ms", timeout.as_millis()) }
    } else {
        // The full error chain names the cause (refused, DNS, redirect refused ...); never the
        // URL, whose query may hold a key.
        let e = e.without_url();
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        ToolError { class: ReasonClass::ToolConnection, message }
    }
}

/// A URL for events and messages: scheme, host and path, never credentials or the query.
pub fn display_url(url: &str) -> String {
    crate::redact::origin_and_path(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defs::UrlTemplate;

    fn invoke(method: HttpMethod) -> Invoke {
        let url = UrlTemplate { raw: "http://127.0.0.1:9/t".into(), parts: vec![] };
        Invoke { url, method, timeout: Duration::from_secs(1), max_response_bytes: 1024, query_param: "q".into() }
    }

    #[tokio::test]
    async fn oversized_get_arguments_are_refused_before_sending() {
        let tools = HttpTools::new().unwrap();
        let args: Map<String, Value> = serde_json::json!({"q": "x".repeat(MAX_URL_BYTES)}).as_object().unwrap().clone();
        // Port 9 is closed: had anything been sent, the error would be a connection error.
        let e = tools.send(&invoke(HttpMethod::Get), "http://127.0.0.1:9/t?api_key=SECRET", &args).await.unwrap_err();
        assert_eq!(e.class, ReasonClass::InvalidToolArguments);
        assert!(!e.message.contains("SECRET"));
        let e = tools.send(&invoke(HttpMethod::Get), "ftp://127.0.0.1/t?api_key=SECRET", &Map::new()).await.unwrap_err();
        assert_eq!(e.class, ReasonClass::ToolConnection);
        assert!(!e.message.contains("SECRET"), "{}", e.message);
    }

    #[tokio::test]
    async fn the_add_tool() {
        let add = builtin_add();
        let call = |a: Value, b: Value| {
            let args = serde_json::json!({"a": a, "b": b}).as_object().unwrap().clone();
            let add = add.clone();
            async move { add.call(&args).await }
        };
        assert_eq!(call(2.into(), 3.into()).await.unwrap(), serde_json::json!({"sum": 5}));
        assert_eq!(call(0.5.into(), 0.25.into()).await.unwrap(), serde_json::json!({"sum": 0.75}));
        assert!(call("two".into(), 3.into()).await.unwrap_err().contains("`a` must be a number"));
    }

    #[test]
    fn arguments_become_text_for_query_strings() {
        assert_eq!(scalar_text(&Value::Null), "");
        assert_eq!(scalar_text(&serde_json::json!("a b")), "a b");
        assert_eq!(scalar_text(&serde_json::json!(1.5)), "1.5");
        assert_eq!(display_url("http://u:p@h:1/x?k=v"), "http://h:1/x");
    }
}
