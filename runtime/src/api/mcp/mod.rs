//! The routes as MCP tools at `/mcp` (Streamable HTTP, through the official SDK `rmcp`): one tool
//! per route this replica's fleet serves (the routes `GET /v1/routes` says run here), named by
//! its id, described by its description, its input schema the route's `goal_schema` (else any
//! object). A `tools/call` is a start through the service's one start path ([`call`]).
//!
//! The MCP wire types stay in this adapter. Sessions (`Mcp-Session-Id`) live in this replica's
//! memory; the runs they start are in the store like any other. The protocol versions served
//! are those with the `initialize` handshake (up to 2025-11-25): a client that probes for
//! 2026-07-28 (no handshake, no server-to-client requests, so no elicitation as this adapter
//! does it) is told so and falls back to the handshake (docs/mcp-server.md).

mod call;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};

use super::AppState;
use crate::catalogue::RouteEntry;

/// The longest tool name MCP allows: a route whose id is longer is not offered as a tool (a
/// route id is otherwise a valid MCP tool name as it is: ASCII letters, digits, `_`, `-`, `.`).
const MAX_TOOL_NAME: usize = 128;

/// The `/mcp` endpoint over `state`: a tower service to mount in the router (behind the bearer
/// token). With a token, any `Host` is served (the token is what a DNS-rebinding page lacks);
/// without one (`--no-auth`, loopback only), only loopback `Host`s, as the SDK does by default.
/// Its sessions and streams end when the service's drain closes the event streams.
pub(super) fn service(state: &AppState) -> StreamableHttpService<Fabric, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default().with_max_request_body_bytes(state.inner.config.max_body_bytes);
    if state.inner.config.token.is_some() {
        config = config.disable_allowed_hosts();
    }
    let stop = config.cancellation_token.clone();
    let mut closing = state.inner.closing.subscribe();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = closing.wait_for(|closed| *closed).await;
            stop.cancel();
        });
    }
    let state = state.clone();
    let session = move || Ok(Fabric { state: state.clone(), cancelled: Arc::default() });
    StreamableHttpService::new(session, LocalSessionManager::default().into(), config)
}

/// The MCP server of one session: the service's state, the requests its client cancelled.
#[derive(Clone)]
pub(super) struct Fabric {
    state: AppState,
    cancelled: Arc<Cancelled>,
}

/// The runs of a session's calls, by request id, for its client's `notifications/cancelled`. A
/// request's token fires then, and also when its session ends (the client's `DELETE`, the SDK's
/// idle timeout, a shutdown) or its response stream goes: only a notice cancels its run, whenever
/// it comes (before the run is accepted, while the call waits, after the call gave up).
#[derive(Debug, Default)]
pub(super) struct Cancelled {
    calls: Mutex<Calls>,
}

#[derive(Debug, Default)]
struct Calls {
    /// The run each call started (kept after a call whose token fired, for a late notice).
    runs: HashMap<String, String>,
    /// Requests cancelled before their run was accepted.
    early: HashSet<String>,
}

/// The most calls a session keeps track of (one whose token fired is kept until the session
/// ends, or until this many are).
const MAX_CALLS: usize = 1024;

impl Cancelled {
    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Request `id` started `run_id`; false when the client cancelled it already (cancel it).
    pub(super) fn started(&self, id: &str, run_id: &str) -> bool {
        let mut calls = self.calls();
        if calls.early.remove(id) {
            return false;
        }
        if calls.runs.len() >= MAX_CALLS {
            calls.runs.clear();
        }
        calls.runs.insert(id.to_owned(), run_id.to_owned());
        true
    }

    /// Request `id` answered: no notice can cancel its run any more.
    pub(super) fn answered(&self, id: &str) {
        self.calls().runs.remove(id);
    }

    /// The client cancelled request `id`: the run to cancel, if it has one yet.
    fn noticed(&self, id: String) -> Option<String> {
        let mut calls = self.calls();
        let run = calls.runs.remove(&id);
        if run.is_none() {
            if calls.early.len() >= MAX_CALLS {
                calls.early.clear();
            }
            calls.early.insert(id);
        }
        run
    }
}

impl Fabric {
    /// The tools: the routes of the catalogue version in force that start here, in catalogue order.
    fn tools(&self) -> Vec<Tool> {
        let edition = self.state.runtime().current();
        edition
            .catalogue()
            .routes()
            .filter_map(|entry| match entry {
                RouteEntry::Ready(r) if r.id().len() <= MAX_TOOL_NAME && edition.check_route(r.id()).is_ok() => {
                    Some(tool(r.id(), r.description(), r.goal_schema()))
                }
                _ => None,
            })
            .collect()
    }
}

/// A route as a tool: its id, its description, its goal's schema (or any object).
fn tool(id: &str, description: &str, goal_schema: Option<&Value>) -> Tool {
    let schema = match goal_schema {
        Some(Value::Object(s)) => s.clone(),
        _ => free_object(),
    };
    let description = if description.trim().is_empty() { format!("Runs the route `{id}`.") } else { description.trim().to_owned() };
    Tool::new(id.to_owned(), description, Arc::new(schema))
}

/// The input schema of a route without a `goal_schema`: any object (the goal).
fn free_object() -> JsonObject {
    match json!({"type": "object", "additionalProperties": true}) {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    }
}

impl ServerHandler for Fabric {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("fabric", env!("CARGO_PKG_VERSION"));
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.instructions = Some(INSTRUCTIONS.to_owned());
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(&self, _request: Option<PaginatedRequestParams>, _cx: RequestContext<RoleServer>) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult { tools: self.tools(), ..Default::default() })
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(&self, request: CallToolRequestParams, cx: RequestContext<RoleServer>) -> Result<CallToolResponse, McpError> {
        call::call(&self.state, &self.cancelled, request, cx).await.map(CallToolResponse::Complete)
    }

    async fn on_cancelled(&self, notice: CancelledNotificationParam, _cx: NotificationContext<RoleServer>) {
        if let Some(run_id) = notice.request_id.and_then(|id| self.cancelled.noticed(id.to_string())) {
            call::cancel_run(&self.state, &run_id).await;
        }
    }
}

/// What the server tells a client at the handshake.
const INSTRUCTIONS: &str = "Each tool runs one route of this Fabric Runtime fleet; its arguments are the run's goal. \
A call answers with the run's output (and `structuredContent` when the output is a JSON object); `_meta.run_id` names the run. \
A run that asks a question uses elicitation when the client supports it; otherwise the call answers with the question and the run id. \
Send `_meta.idempotency_key` to make a retried call start the run once.";
