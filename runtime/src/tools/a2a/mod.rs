//! Other agents as tools: the [`A2aPort`] the executor sends an A2A message through, and its
//! adapter [`A2aAgents`] (A2A 1.0 JSON-RPC over HTTP: `SendMessage`, then `GetTask` polls until
//! the task ends or asks). The wire is small JSON, read by [`wire`] with types of its own: the
//! service's A2A server (`api::a2a`) is a higher layer and not imported here.
//!
//! Hardened as HTTP tools are: the endpoint comes only from the catalogue, no redirect is followed
//! (the bearer token would go with it), the answer is read up to `max_response_bytes`, and the
//! whole exchange (the send, every poll, a slow drip) ends by `timeout_ms`. The token is sent as a
//! header only, never shown: errors name the endpoint's origin and path.

mod wire;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};

use super::ToolError;
use crate::defs::A2aInvoke;
use crate::failure::{BoxFuture, ClientError, ReasonClass};

/// What a message carries: the tool's arguments (a new task), or the user's reply to a task that
/// asked (with its ids, as the agent gave them).
#[derive(Debug, Clone, Copy)]
pub enum Content<'a> {
    Start(&'a Map<String, Value>),
    Reply { task_id: &'a str, context_id: Option<&'a str>, text: &'a str },
}

/// One message to an agent: where (the endpoint resolved from the catalogue), with which token,
/// under which `messageId` (derived from the run, so a message sent again after a crash starts no
/// second task on an agent that treats it as an idempotency key).
#[derive(Debug, Clone, Copy)]
pub struct A2aMessage<'a> {
    pub invoke: &'a A2aInvoke,
    pub url: &'a str,
    pub token: Option<&'a str>,
    pub message_id: &'a str,
    pub content: Content<'a>,
}

/// Where the agent's task stands when the tool stops waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum A2aAnswer {
    /// Completed: its artifacts (a data part's object as compact JSON, else the text).
    Completed(String),
    /// `input-required`: the agent's question, and the task the reply must go to.
    InputRequired { task_id: String, context_id: Option<String>, question: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aOutput {
    pub answer: A2aAnswer,
    /// The size of the last answer read.
    pub bytes: usize,
    pub duration: Duration,
}

/// The port A2A tool calls go through. Contract: send `message` to its endpoint and wait, within
/// its invoke's timeout, until the task is completed (its artifacts) or input-required (its
/// question); a task that failed, was canceled or rejected is `agent_task_failed`, a JSON-RPC
/// error `tool_failed` naming its code, no answer in time `tool_timeout`, an endpoint that cannot
/// be reached `tool_connection`, an HTTP status not 2xx `tool_http_status`, an answer over the
/// cap `tool_response_too_large`. No message names the token.
pub trait A2aPort: Send + Sync {
    fn send<'a>(&'a self, message: A2aMessage<'a>) -> BoxFuture<'a, Result<A2aOutput, ToolError>>;
}

/// The first wait between polls of a task that is still working; it doubles up to [`MAX_POLL`].
const FIRST_POLL: Duration = Duration::from_millis(100);
const MAX_POLL: Duration = Duration::from_secs(2);

/// The A2A client of the process: one HTTP client (kept-alive connections, no redirects), built
/// at the first call (most runtimes call no agent, and building one costs milliseconds).
#[derive(Debug, Clone, Default)]
pub struct A2aAgents {
    client: Arc<OnceLock<Result<reqwest::Client, ClientError>>>,
}

impl A2aAgents {
    pub fn new() -> A2aAgents {
        A2aAgents::default()
    }

    fn client(&self) -> Result<&reqwest::Client, ToolError> {
        let built = self.client.get_or_init(|| {
            reqwest::Client::builder()
                // A redirect would carry the bearer token to wherever it points.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| ClientError { of: "the A2A tools", message: e.to_string() })
        });
        built.as_ref().map_err(|e| ToolError { class: ReasonClass::ToolConnection, message: e.to_string() })
    }

    async fn exchange(&self, m: &A2aMessage<'_>) -> Result<A2aOutput, ToolError> {
        let started = tokio::time::Instant::now();
        let (mut task, mut bytes) = match self.rpc(m, "SendMessage", wire::send_params(m)).await {
            Ok(r) => r,
            // A reply sent again (after a crash) to a task that took it already: the task is
            // working or ended, so wait for it instead.
            Err(Refusal::Rpc(e)) if e.code == wire::UNSUPPORTED_OPERATION && matches!(m.content, Content::Reply { .. }) => {
                let Content::Reply { task_id, .. } = m.content else { unreachable!("matched above") };
                self.rpc(m, "GetTask", wire::get_params(task_id)).await.map_err(Refusal::into_tool)?
            }
            Err(e) => return Err(e.into_tool()),
        };
        let mut wait = FIRST_POLL;
        loop {
            let reading = wire::read_task(&task).map_err(|e| ToolError { class: ReasonClass::ToolFailed, message: e.to_string() })?;
            let answer = match reading {
                wire::Reading::Completed(text) => A2aAnswer::Completed(text),
                wire::Reading::InputRequired { task_id, context_id, question } => A2aAnswer::InputRequired { task_id, context_id, question },
                wire::Reading::Ended { state, why } => {
                    let why = if why.is_empty() { String::new() } else { format!(": {why}") };
                    return Err(ToolError { class: ReasonClass::AgentTaskFailed, message: format!("the agent's task ended {state}{why}") });
                }
                wire::Reading::Working { task_id } => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_POLL);
                    (task, bytes) = self.rpc(m, "GetTask", wire::get_params(&task_id)).await.map_err(Refusal::into_tool)?;
                    continue;
                }
            };
            return Ok(A2aOutput { answer, bytes, duration: started.elapsed() });
        }
    }

    /// One JSON-RPC call: its `result`, and the size of the answer.
    async fn rpc(&self, m: &A2aMessage<'_>, method: &str, params: Value) -> Result<(Value, usize), Refusal> {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut request = self.client().map_err(Refusal::Tool)?.post(m.url).header("A2A-Version", "1.0").json(&body);
        if let Some(token) = m.token {
            request = request.bearer_auth(token);
        }
        let max = m.invoke.max_response_bytes;
        let mut response = request.send().await.map_err(|e| Refusal::Tool(super::classify(e, m.invoke.timeout)))?;
        let status = response.status().as_u16();
        let shown = crate::redact::origin_and_path(m.url);
        if (300..400).contains(&status) {
            let message = format!("HTTP {status} from `{shown}`: redirects are not followed (the token would go with them)");
            return Err(Refusal::Tool(ToolError { class: ReasonClass::ToolHttpStatus, message }));
        }
        if !(200..300).contains(&status) {
            return Err(Refusal::Tool(ToolError { class: ReasonClass::ToolHttpStatus, message: format!("HTTP {status} from `{shown}`") }));
        }
        if response.content_length().is_some_and(|n| n as usize > max) {
            return Err(Refusal::Tool(super::too_large(max)));
        }
        let mut raw = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| Refusal::Tool(super::classify(e, m.invoke.timeout)))? {
            if raw.len() + chunk.len() > max {
                return Err(Refusal::Tool(super::too_large(max)));
            }
            raw.extend_from_slice(&chunk);
        }
        wire::result(&raw).map(|v| (v, raw.len())).map_err(|e| match e {
            wire::ReplyError::Rpc(rpc) => Refusal::Rpc(rpc),
            other => Refusal::Tool(ToolError { class: ReasonClass::ToolFailed, message: other.to_string() }),
        })
    }
}

/// Why a call got no result: a JSON-RPC error (which a resent reply may meet), or anything else.
enum Refusal {
    Rpc(wire::RpcError),
    Tool(ToolError),
}

impl Refusal {
    fn into_tool(self) -> ToolError {
        match self {
            Refusal::Rpc(e) => ToolError { class: ReasonClass::ToolFailed, message: format!("the agent answered {e}") },
            Refusal::Tool(e) => e,
        }
    }
}

impl A2aPort for A2aAgents {
    fn send<'a>(&'a self, message: A2aMessage<'a>) -> BoxFuture<'a, Result<A2aOutput, ToolError>> {
        Box::pin(async move {
            let timeout = message.invoke.timeout;
            match tokio::time::timeout(timeout, self.exchange(&message)).await {
                Ok(r) => r,
                Err(_) => Err(ToolError {
                    class: ReasonClass::ToolTimeout,
                    message: format!("the agent's task did not end or ask within {} ms", timeout.as_millis()),
                }),
            }
        })
    }
}
