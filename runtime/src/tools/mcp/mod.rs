//! MCP tools: the [`McpPort`] the executor calls an MCP server's tool through, and its adapter
//! [`McpServers`], the process's one client per server declared in the catalogue (per name and
//! definition: catalogue versions that declare a server otherwise each call their own).
//!
//! A server is connected when its tools are first listed (at start-up, [`McpServers::prepare`])
//! or called; a stdio server is one child process shared by every run. A server whose
//! connection is gone (the process died, the session could not be re-established) is started
//! again by the next call, after a backoff that doubles with each failure in a row (200 ms to
//! 30 s; a call waits for it within its own timeout, else fails at once with `tool_connection`).
//! [`McpServers::stop`] ends every session at shutdown (a child process is killed with its
//! session, and when the registry is dropped). Streamable HTTP sessions that expire are
//! re-established by the transport. The sessions live on a small runtime of their own, so the
//! start-up listing can be made from a synchronous builder and calls from any runtime.

mod client;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use serde_json::{Map, Value};

use self::client::Session;
use super::ToolError;
use crate::defs::{McpListing, McpListings, McpServerDef, McpTransportDef};
use crate::failure::{BoxFuture, ReasonClass};

/// Why an MCP call or listing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// The server's definition cannot be used here (a variable unset, a header that is not one).
    #[error("{0}")]
    Config(String),
    /// The server could not be started or reached, or its connection is gone.
    #[error("{0}")]
    Connection(String),
    /// A JSON-RPC error, or a reply that is not what the protocol says.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The tool answered with `isError`: its own words.
    #[error("{0}")]
    ToolError(String),
    #[error("no result in time")]
    Timeout,
    #[error("the result is larger than {0} bytes")]
    TooLarge(usize),
}

impl McpError {
    pub fn class(&self) -> ReasonClass {
        match self {
            McpError::Config(_) | McpError::Connection(_) => ReasonClass::ToolConnection,
            McpError::Protocol(_) | McpError::ToolError(_) => ReasonClass::ToolFailed,
            McpError::Timeout => ReasonClass::ToolTimeout,
            McpError::TooLarge(_) => ReasonClass::ToolResponseTooLarge,
        }
    }
}

/// A tool's result: its text (`structuredContent` as compact JSON, else the text content).
#[derive(Debug, Clone, PartialEq)]
pub struct McpOutput {
    pub text: String,
    pub duration: Duration,
}

/// The port MCP tool calls go through. Contract: call `tool` of the server `server`, reached
/// as `transport` says (its declaration in the run's catalogue), with `args` (already checked against the tool's input schema) within `timeout`; a failure
/// carries a tool reason class (`tool_failed` for `isError` and protocol errors, `tool_timeout`,
/// `tool_connection` for a server that cannot be started or reached).
pub trait McpPort: Send + Sync {
    fn call<'a>(
        &'a self,
        server: &'a str,
        transport: &'a McpTransportDef,
        tool: &'a str,
        args: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<McpOutput, ToolError>>;
}

/// A result larger than this fails with `tool_response_too_large` (as an HTTP tool's default cap).
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;
/// How long the start-up listing of one server may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(20);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

type Vars = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The MCP servers of a process: one client each, started when first needed.
#[derive(Clone)]
pub struct McpServers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.inner.servers.lock().map(|s| s.keys().map(|(n, _)| n.clone()).collect()).unwrap_or_default();
        f.debug_struct("McpServers").field("servers", &names).finish_non_exhaustive()
    }
}

struct Inner {
    vars: Vars,
    /// The runtime the sessions live on, made with the first server.
    /// The clients' runtime, or why it could not be made (the machine refused a thread).
    rt: OnceLock<Result<tokio::runtime::Runtime, std::io::Error>>,
    /// One client per server name and definition: a catalogue version that declares a server
    /// otherwise than another gets a client of its own, so runs on each call their own.
    servers: Mutex<HashMap<(String, McpTransportDef), Arc<Server>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Its tasks (and a child process with its session) end with it, from any context.
        if let Some(Ok(rt)) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

struct Server {
    name: String,
    transport: McpTransportDef,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    /// Failed starts or lost connections in a row.
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<McpError>,
}

fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(8)).min(MAX_BACKOFF)
}

impl Server {
    /// The session, started (again) if needed; waits for a pending restart up to `deadline`.
    async fn session(&self, vars: &Vars, deadline: Instant) -> Result<Arc<Session>, McpError> {
        let mut state = self.state.lock().await;
        if let Some(s) = &state.session {
            if !s.is_closed() {
                return Ok(s.clone());
            }
            tracing::warn!(target: "fabric::mcp", server = %self.name, "the MCP server's connection is gone; starting it again");
            state.session = None;
            state.failures += 1;
            state.retry_at = Some(Instant::now() + backoff(state.failures));
        }
        if let Some(at) = state.retry_at {
            if at > deadline {
                let why = state.last_error.as_ref().map_or_else(|| "its connection was lost".to_owned(), ToString::to_string);
                return Err(McpError::Connection(format!(
                    "MCP server `{}` is down, next start in {} ms ({why})",
                    self.name,
                    at.saturating_duration_since(Instant::now()).as_millis()
                )));
            }
            tokio::time::sleep_until(at.into()).await;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = match tokio::time::timeout(left, client::connect(&self.name, &self.transport, &**vars, MAX_RESULT_BYTES)).await {
            Ok(r) => r,
            Err(_) => Err(McpError::Connection(format!("MCP server `{}` did not start in time", self.name))),
        };
        match outcome {
            Ok(session) => {
                tracing::info!(target: "fabric::mcp", server = %self.name, "MCP server connected");
                let session = Arc::new(session);
                *state = State { session: Some(session.clone()), ..State::default() };
                Ok(session)
            }
            Err(e) => {
                state.failures += 1;
                state.retry_at = Some(Instant::now() + backoff(state.failures));
                state.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// The session is gone: the next call starts the server again (after the backoff).
    async fn lost(&self, session: &Arc<Session>, why: &McpError) {
        let mut state = self.state.lock().await;
        if state.session.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
            state.session = None;
            state.failures += 1;
            state.retry_at = Some(Instant::now() + backoff(state.failures));
            state.last_error = Some(why.clone());
        }
    }

    async fn call(&self, vars: &Vars, tool: &str, args: &Map<String, Value>, timeout: Duration) -> Result<String, McpError> {
        let deadline = Instant::now() + timeout;
        let session = self.session(vars, deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = match tokio::time::timeout(left, session.call(tool, args, MAX_RESULT_BYTES)).await {
            Ok(r) => r,
            Err(_) => Err(McpError::Timeout),
        };
        if let Err(e @ McpError::Connection(_)) = &outcome {
            self.lost(&session, e).await;
        }
        outcome
    }

    async fn list(&self, vars: &Vars) -> Result<Vec<crate::defs::McpToolDef>, McpError> {
        let session = self.session(vars, Instant::now() + LIST_TIMEOUT).await?;
        match tokio::time::timeout(LIST_TIMEOUT, session.list()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => {
                if matches!(e, McpError::Connection(_)) {
                    self.lost(&session, &e).await;
                }
                Err(e)
            }
            Err(_) => Err(McpError::Timeout),
        }
    }

    async fn stop(&self) {
        if let Some(session) = self.state.lock().await.session.take() {
            session.close();
        }
    }
}

impl McpServers {
    /// `vars` resolves the `${VAR}`s of the servers' definitions (when each is started).
    pub fn new(vars: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> McpServers {
        McpServers { inner: Arc::new(Inner { vars: Arc::new(vars), rt: OnceLock::new(), servers: Mutex::new(HashMap::new()) }) }
    }

    fn rt(&self) -> Result<&tokio::runtime::Runtime, McpError> {
        let rt = self.inner.rt.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("fabric-mcp").enable_all().build());
        rt.as_ref().map_err(|e| McpError::Connection(format!("the MCP clients' runtime could not be started: {e}")))
    }

    /// The client of `name` as `transport` declares it, made (not yet started) when new.
    fn server(&self, name: &str, transport: &McpTransportDef) -> Option<Arc<Server>> {
        let mut map = self.inner.servers.lock().ok()?;
        let key = (name.to_owned(), transport.clone());
        Some(map.entry(key).or_insert_with(|| Arc::new(Server { name: name.to_owned(), transport: transport.clone(), state: Default::default() })).clone())
    }

    /// Takes the servers a catalogue declares (one client per name and definition), connects
    /// each and lists its tools: what hydration reads. Blocks (on a thread of its own) up to
    /// [`LIST_TIMEOUT`] when a server does not answer (they are listed at once).
    pub fn prepare(&self, defs: &IndexMap<String, McpServerDef>) -> McpListings {
        let servers: Vec<Arc<Server>> = defs.iter().filter_map(|(name, def)| self.server(name, &def.transport)).collect();
        if servers.is_empty() {
            return McpListings::new();
        }
        let vars = self.inner.vars.clone();
        let rt = match self.rt() {
            Ok(rt) => rt,
            Err(e) => return servers.iter().map(|s| (s.name.clone(), McpListing::Unavailable(e.to_string()))).collect(),
        };
        let listed = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    rt.block_on(async {
                        // All at once: a server that does not answer costs one timeout, not one each.
                        let lists = servers.iter().map(|s| async {
                            let listing = match s.list(&vars).await {
                                Ok(tools) => McpListing::Tools(tools),
                                Err(e) => McpListing::Unavailable(e.to_string()),
                            };
                            (s.name.clone(), listing)
                        });
                        futures_util::future::join_all(lists).await.into_iter().collect::<McpListings>()
                    })
                })
                .join()
        });
        listed.unwrap_or_default()
    }

    /// Ends every session (a stdio server's process with it). A later call starts it again.
    pub async fn stop(&self) {
        let Some(Ok(rt)) = self.inner.rt.get() else { return };
        let servers: Vec<Arc<Server>> = self.inner.servers.lock().map(|m| m.values().cloned().collect()).unwrap_or_default();
        let done = rt.spawn(async move {
            for s in servers {
                s.stop().await;
            }
        });
        let _ = done.await;
    }
}

/// Aborts a task on the sessions' runtime when the call waiting for it is dropped (a cancelled run).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl McpPort for McpServers {
    fn call<'a>(
        &'a self,
        server: &'a str,
        transport: &'a McpTransportDef,
        tool: &'a str,
        args: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<McpOutput, ToolError>> {
        Box::pin(async move {
            let started = Instant::now();
            let Some(s) = self.server(server, transport) else {
                return Err(ToolError { class: ReasonClass::ToolConnection, message: format!("MCP server `{server}` has no client in this process") });
            };
            let (vars, tool_name, args) = (self.inner.vars.clone(), tool.to_owned(), args.clone());
            let outcome = match self.rt() {
                Ok(rt) => {
                    let mut task = AbortOnDrop(rt.spawn(async move { s.call(&vars, &tool_name, &args, timeout).await }));
                    match (&mut task.0).await {
                        Ok(r) => r,
                        Err(e) => Err(McpError::Connection(format!("the MCP call ended unexpectedly: {e}"))),
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(text) => Ok(McpOutput { text, duration: started.elapsed() }),
                Err(e @ McpError::Timeout) => Err(ToolError { class: e.class(), message: format!("no result within {} ms", timeout.as_millis()) }),
                Err(e) => Err(ToolError { class: e.class(), message: e.to_string() }),
            }
        })
    }
}
