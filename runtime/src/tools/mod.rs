//! Tools: HTTP tools (the `invoke` of a capability) behind the [`HttpPort`], and in-process
//! tools registered by code that embeds the runtime ([`Tool`]). Both take a JSON arguments
//! object. The executor sees only these two small traits, so it can be tested without sockets.
//!
//! Hardened because arguments may come from a model: the URL comes only from the catalogue,
//! arguments travel only as encoded query parameters (GET) or a JSON body (POST), redirects are
//! followed only within the same origin, every call has a timeout, and the body is read up to a
//! size cap.

pub mod a2a;
mod compact;
mod http1;
pub mod mcp;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::defs::{HttpMethod, Invoke};
use crate::failure::{BoxFuture, ClientError, ReasonClass};

/// An in-process tool: a Rust function with the same input-schema contract as an HTTP tool
/// (the loop checks the arguments against the capability's `input_schema` before calling it).
/// A failure is the tool's own words ([`ToolFailure`]): the run reports it as `tool_failed`.
pub trait Tool: Send + Sync {
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, ToolFailure>>;
}

/// Why an in-process tool gave no value, in its own words (`ValueError: no adding today`): the
/// decision loop shows it to the model as a note, a workflow stage fails with it. The class is
/// always `tool_failed` (a timeout or a cancel is the executor's, not the tool's), so the message
/// is all there is to carry; a type of its own keeps the port from taking any `String`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolFailure(pub String);

impl From<String> for ToolFailure {
    fn from(message: String) -> ToolFailure {
        ToolFailure(message)
    }
}

impl From<&str> for ToolFailure {
    fn from(message: &str) -> ToolFailure {
        ToolFailure(message.to_owned())
    }
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
    F: Fn(&Map<String, Value>) -> Result<Value, ToolFailure> + Send + Sync,
{
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, ToolFailure>> {
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
    /// Each tool origin's limit of requests in flight (so bursts reuse kept-alive connections
    /// instead of opening one connection per request) and its idle connections.
    origins: Arc<Mutex<HashMap<String, Arc<Origin>, foldhash::fast::RandomState>>>,
    /// Tool URLs as resolved from the catalogue, parsed once: parsing a URL (its host above all)
    /// cost more than the rest of a loopback call. Keyed by catalogue text (no flooding to fear).
    targets: Arc<Mutex<HashMap<String, Arc<Target>, foldhash::fast::RandomState>>>,
    /// Plain-HTTP calls go over kept-alive HTTP/1.1 connections of our own ([`http1`]), unless
    /// a proxy is configured; HTTPS and proxied calls go through `client`.
    lean: bool,
}

/// One request and its response as `send` needs them: the status, a redirect's `Location`, the
/// body (read up to the cap).
#[derive(Debug)]
struct Exchanged {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

/// A parsed tool URL and its origin.
#[derive(Debug)]
struct Target {
    url: reqwest::Url,
    origin: Arc<Origin>,
}

/// One tool origin (scheme, host, port): at most [`MAX_IN_FLIGHT_PER_ORIGIN`] requests in
/// flight, and the plain-HTTP connections kept alive to it.
#[derive(Debug)]
struct Origin {
    gate: tokio::sync::Semaphore,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<http1::Conn>>,
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
    pub fn new() -> Result<HttpTools, ClientError> {
        let client = reqwest::Client::builder()
            // Followed by `send` itself, within the origin (see there).
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(MAX_IN_FLIGHT_PER_ORIGIN)
            .build()
            .map_err(|e| ClientError { of: "the tools", message: e.to_string() })?;
        // reqwest honours the proxy variables; the lean path has no proxy support, so it stands
        // aside whenever one of them is set.
        let proxied = ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"].iter().any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
        Ok(HttpTools { client, origins: Default::default(), targets: Default::default(), lean: !proxied })
    }

    /// One request, its response read whole (up to `max` bytes), by `deadline`.
    async fn exchange(
        &self,
        origin: &Origin,
        post: bool,
        url: &reqwest::Url,
        args: &Map<String, Value>,
        deadline: tokio::time::Instant,
        invoke: &Invoke,
    ) -> Result<Exchanged, ToolError> {
        let max = invoke.max_response_bytes;
        if self.lean && lean_takes(url) {
            let body = if post { serde_json::to_vec(args).unwrap_or_default() } else { Vec::new() };
            return match tokio::time::timeout_at(deadline, origin.exchange(url, post, &body, max)).await {
                Ok(r) => r,
                Err(_) => Err(ToolError { class: ReasonClass::ToolTimeout, message: format!("no response within {} ms", invoke.timeout.as_millis()) }),
            };
        }
        let request = if post { self.client.post(url.clone()).json(args) } else { self.client.get(url.clone()) };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut response = request.timeout(left).send().await.map_err(|e| classify(e, invoke.timeout))?;
        let status = response.status().as_u16();
        let location = response.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).map(str::to_owned);
        let body = read_capped(&mut response, max, invoke.timeout).await?;
        Ok(Exchanged { status, location, body })
    }

    /// The parsed target of a resolved tool URL, from the cache or parsed now.
    fn target(&self, url: &str) -> Result<Arc<Target>, ToolError> {
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
        let origin = {
            let mut map = self.origins.lock().unwrap_or_else(|p| p.into_inner());
            let new = || Arc::new(Origin { gate: tokio::sync::Semaphore::new(MAX_IN_FLIGHT_PER_ORIGIN), idle: Mutex::new(Vec::new()) });
            map.entry(origin).or_insert_with(new).clone()
        };
        let target = Arc::new(Target { url: parsed, origin });
        let mut targets = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        if targets.len() >= MAX_TARGETS {
            targets.clear();
        }
        targets.insert(url.to_owned(), target.clone());
        Ok(target)
    }

    /// Calls `url` (already resolved from the catalogue) with `args`.
    pub async fn send(&self, invoke: &Invoke, url: &str, args: &Map<String, Value>) -> Result<ToolOutput, ToolError> {
        // The runtime's clock (tokio's), as its timers use it: a paused test clock stays one clock.
        let started = tokio::time::Instant::now();
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
        let _permit = target.origin.gate.acquire().await.map_err(|_| ToolError { class: ReasonClass::ToolConnection, message: "tool client closed".into() })?;
        // Redirects are followed here rather than by the client: its redirect layer parses every
        // request's URL again, which was a fifth of a loopback call. The rules are the same:
        // within the first URL's origin only, at most MAX_REDIRECTS, and the timeout covers all.
        // The timeout starts once the origin has room for the request, as it always did: a
        // burst queued behind the per-origin limit waits for its turn, not against its timeout.
        let deadline = tokio::time::Instant::now() + invoke.timeout;
        let mut post = invoke.method == HttpMethod::Post;
        let mut hops = 0;
        let exchanged = loop {
            let exchanged = self.exchange(&target.origin, post, &parsed, args, deadline, invoke).await?;
            let status = exchanged.status;
            let Some(location) = exchanged.location.as_deref().filter(|_| matches!(status, 301 | 302 | 303 | 307 | 308)) else { break exchanged };
            // A `Location` that is no URL: the redirect response itself is the answer (a 3xx,
            // so `tool_http_status`), as an HTTP client reports it.
            let Ok(next) = parsed.join(location) else { break exchanged };
            let same_origin = next.scheme() == target.url.scheme()
                && next.host_str() == target.url.host_str()
                && next.port_or_known_default() == target.url.port_or_known_default();
            if !same_origin {
                // Where it pointed, by origin only (the path and query may hold what no note
                // and no prompt should).
                let to = format!("{}://{}", next.scheme(), next.host_str().unwrap_or_default());
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
        let Exchanged { status, body, .. } = exchanged;
        let raw = String::from_utf8_lossy(&body);
        if !(200..300).contains(&status) {
            let excerpt: String = raw.chars().take(200).collect();
            return Err(ToolError { class: ReasonClass::ToolHttpStatus, message: format!("HTTP {status}: {}", excerpt.trim()) });
        }
        let text = compact::compact_json(&raw).unwrap_or_else(|| raw.trim().to_owned());
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

/// A response's body, read up to `max` bytes (a declared or a streamed length past it is
/// `tool_response_too_large` before more is read).
pub(super) async fn read_capped(response: &mut reqwest::Response, max: usize, timeout: Duration) -> Result<Vec<u8>, ToolError> {
    if response.content_length().is_some_and(|n| n as usize > max) {
        return Err(too_large(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| classify(e, timeout))? {
        if body.len() + chunk.len() > max {
            return Err(too_large(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

pub(super) fn too_large(limit: usize) -> ToolError {
    ToolError { class: ReasonClass::ToolResponseTooLarge, message: format!("response is larger than the {limit}-byte limit") }
}

/// Whether a URL can go over the tool client's own HTTP/1.1 connections: plain HTTP without
/// credentials in it (those go through reqwest, which sends them as Basic auth).
fn lean_takes(url: &reqwest::Url) -> bool {
    url.scheme() == "http" && url.username().is_empty() && url.password().is_none()
}

/// How long an idle connection is kept: past it, it is closed at the next use of its origin
/// (a server, NAT or load balancer may have dropped it silently; most keep idle ones 60 s).
const IDLE_MAX: Duration = Duration::from_secs(30);

/// Plain HTTP/1.1 to a tool origin over connections kept alive and reused ([`http1`]), driven
/// by the task that makes the call (no connection task: the socket's readiness wakes the run
/// waiting on it). Behaviour is the general client's: the same headers (`accept: */*`,
/// `content-type` for JSON), the timeout around the whole exchange (in `exchange`), the body
/// cap, no redirect of its own, idle connections let go after [`IDLE_MAX`], and a request sent
/// again on a new connection only when not a byte of it was written on the kept-alive one
/// (found closed when taken, or refusing the first write), so nothing runs twice.
impl Origin {
    /// The most recently used idle connection that is still open; those idle too long go.
    fn take(&self) -> Option<http1::Conn> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        Self::expire(&mut idle, now);
        // Nobody read from it while it was idle: what the server sent meanwhile, a close above
        // all, is seen now, before a request is written to a dead connection.
        std::iter::from_fn(|| idle.pop()).find(|c| c.alive(now))
    }

    fn give_back(&self, mut conn: http1::Conn) {
        let now = Instant::now();
        conn.idle_since = now;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        Self::expire(&mut idle, now);
        if idle.len() < MAX_IN_FLIGHT_PER_ORIGIN {
            idle.push(conn);
        }
    }

    /// Closes the connections idle for longer than [`IDLE_MAX`] (the oldest are first).
    fn expire(idle: &mut Vec<http1::Conn>, now: Instant) {
        let stale = idle.iter().take_while(|c| now.saturating_duration_since(c.idle_since) >= IDLE_MAX).count();
        idle.drain(..stale);
    }

    async fn connect(url: &reqwest::Url, port: u16) -> Result<http1::Conn, ToolError> {
        let failed = |e: &dyn std::fmt::Display| ToolError { class: ReasonClass::ToolConnection, message: format!("cannot connect: {e}") };
        let addresses: Vec<std::net::SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![(ip, port).into()],
            Some(url::Host::Ipv6(ip)) => vec![(ip, port).into()],
            Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port)).await.map_err(|e| failed(&e))?.collect(),
            None => return Err(failed(&"the URL has no host")),
        };
        // One address after the other; all but the last get a short while, so that an address
        // that swallows connections (a blackholed IPv6 route) does not take the whole timeout.
        let mut last = None;
        for (i, address) in addresses.iter().enumerate() {
            let attempt = tokio::net::TcpStream::connect(address);
            let outcome = if i + 1 < addresses.len() {
                tokio::time::timeout(Duration::from_millis(300), attempt).await.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            } else {
                attempt.await
            };
            match outcome {
                Ok(stream) => {
                    // Requests are small and answered at once: no Nagle delay.
                    let _ = stream.set_nodelay(true);
                    return Ok(http1::Conn::new(stream));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => failed(&e),
            None => failed(&"the host name resolves to no address"),
        })
    }

    async fn exchange(&self, url: &reqwest::Url, post: bool, body: &[u8], max: usize) -> Result<Exchanged, ToolError> {
        let port = url.port_or_known_default().unwrap_or(80);
        let request = http1::request(post, url.path(), url.query(), url.host_str().unwrap_or_default(), url.port(), body);
        let done = |conn: http1::Conn, r: http1::Response| {
            if r.reusable {
                self.give_back(conn);
            }
            Exchanged { status: r.status, location: r.location, body: r.body }
        };
        if let Some(mut conn) = self.take() {
            match conn.exchange(&request, max).await {
                Ok(r) => return Ok(done(conn, r)),
                // Closed before a byte of the request was written: a new connection below.
                Err(http1::Failed::NotSent) => {}
                Err(http1::Failed::Error(e)) => return Err(e),
            }
        }
        let mut conn = Self::connect(url, port).await?;
        match conn.exchange(&request, max).await {
            Ok(r) => Ok(done(conn, r)),
            Err(http1::Failed::NotSent) => {
                Err(ToolError { class: ReasonClass::ToolConnection, message: "the connection closed before the request was sent".into() })
            }
            Err(http1::Failed::Error(e)) => Err(e),
        }
    }
}

pub(super) fn classify(e: reqwest::Error, timeout: Duration) -> ToolError {
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

    /// A loopback server speaking just enough HTTP/1.1: it answers `answers` requests on each
    /// connection (keep-alive, or `Connection: close` with `close`), then closes it; it counts
    /// connections and returns each request's head.
    async fn raw_server(
        answers: usize,
        close: bool,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let heads: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen, count) = (heads.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    for _ in 0..answers {
                        let Some(head) = http1::tests::read_head(&mut socket).await else { return };
                        seen.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                        let body = r#"{"ok":true}"#;
                        let connection = if close { "Connection: close\r\n" } else { "" };
                        let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{connection}\r\n{body}", body.len());
                        let _ = socket.write_all(reply.as_bytes()).await;
                    }
                    // Gone, as an idle timeout would close it.
                });
            }
        });
        (url, heads, connections)
    }

    #[tokio::test]
    async fn plain_http_calls_reuse_connections_and_survive_their_closing() {
        let tools = HttpTools::new().unwrap();
        let args: Map<String, Value> = serde_json::json!({"q": "a b&c"}).as_object().unwrap().clone();
        // Kept alive: three calls, one connection; the request as a general client sends it.
        let (url, heads, connections) = raw_server(usize::MAX, false).await;
        for _ in 0..3 {
            let out = tools.send(&invoke(HttpMethod::Get), &format!("{url}/search"), &args).await.unwrap();
            assert_eq!((out.status, out.text.as_str()), (200, r#"{"ok":true}"#));
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1, "one kept-alive connection");
        let head = heads.lock().unwrap()[0].to_lowercase();
        assert!(head.starts_with("get /search?q=a+b%26c http/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {}\r\n", url.trim_start_matches("http://"))), "{head}");
        // The server closes each connection after one answer, without saying so: the next call
        // finds its kept-alive connection dead and goes on over a new one.
        let (url, _, connections) = raw_server(1, false).await;
        for _ in 0..3 {
            let out = tools.send(&invoke(HttpMethod::Post), &format!("{url}/add"), &args).await.unwrap();
            assert_eq!(out.status, 200);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 3);
        // `Connection: close`: never reused.
        let (url, heads, connections) = raw_server(1, true).await;
        for _ in 0..2 {
            tools.send(&invoke(HttpMethod::Post), &format!("{url}/add"), &args).await.unwrap();
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
        let head = heads.lock().unwrap()[0].to_lowercase();
        assert!(head.starts_with("post /add http/1.1\r\n") && head.contains("content-type: application/json\r\n"), "{head}");
    }

    /// Reads one request head (and a body of its `content-length`) from a raw socket.
    async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let head = http1::tests::read_head(socket).await?;
        let head = String::from_utf8_lossy(&head).to_lowercase();
        let length = head.lines().find_map(|l| l.strip_prefix("content-length: ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0);
        let mut body = vec![0u8; length];
        socket.read_exact(&mut body).await.ok()?;
        Some(format!("{head}{}", String::from_utf8_lossy(&body)))
    }

    #[tokio::test]
    async fn a_request_the_server_read_is_never_sent_twice() {
        use tokio::io::AsyncWriteExt;
        // The server answers the first request of a connection, reads the second, and closes the
        // connection without answering it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/add", listener.local_addr().unwrap());
        let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let Some(first) = read_request(&mut socket).await else { return };
                    log.lock().unwrap().push(first);
                    let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").await;
                    if let Some(second) = read_request(&mut socket).await {
                        log.lock().unwrap().push(second);
                    }
                });
            }
        });
        let tools = HttpTools::new().unwrap();
        let first: Map<String, Value> = serde_json::json!({"q": "first"}).as_object().unwrap().clone();
        let second: Map<String, Value> = serde_json::json!({"q": "second"}).as_object().unwrap().clone();
        tools.send(&invoke(HttpMethod::Post), &url, &first).await.unwrap();
        let e = tools.send(&invoke(HttpMethod::Post), &url, &second).await.unwrap_err();
        assert_eq!(e.class, ReasonClass::ToolConnection, "{e:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let seen = seen.lock().unwrap();
        assert_eq!(seen.iter().filter(|r| r.ends_with(r#"{"q":"second"}"#)).count(), 1, "sent once: {seen:?}");
    }

    #[tokio::test]
    async fn credentials_in_a_tool_url_go_as_basic_auth() {
        let (url, heads, _) = raw_server(usize::MAX, false).await;
        let with_credentials = url.replace("http://", "http://us%20er:p%40ss@");
        let tools = HttpTools::new().unwrap();
        tools.send(&invoke(HttpMethod::Get), &format!("{with_credentials}/x"), &Map::new()).await.unwrap();
        let head = heads.lock().unwrap()[0].to_lowercase();
        assert!(head.contains("authorization: basic dxmgzxi6cebzcw==\r\n"), "{head}");
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
        assert!(call("two".into(), 3.into()).await.unwrap_err().0.contains("`a` must be a number"));
    }

    #[test]
    fn arguments_become_text_for_query_strings() {
        assert_eq!(scalar_text(&Value::Null), "");
        assert_eq!(scalar_text(&serde_json::json!("a b")), "a b");
        assert_eq!(scalar_text(&serde_json::json!(1.5)), "1.5");
        assert_eq!(display_url("http://u:p@h:1/x?k=v"), "http://h:1/x");
    }
}
