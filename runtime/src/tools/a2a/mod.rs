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
    /// Set to the agent's task id once it names it, so that a caller that stops waiting (its
    /// run cancelled) can cancel the task.
    pub seen: &'a OnceLock<String>,
}

impl A2aMessage<'_> {
    /// The agent's task `task_id`, at this message's endpoint with its token.
    fn at<'b>(&'b self, task_id: &'b str) -> A2aTask<'b> {
        A2aTask { invoke: self.invoke, url: self.url, token: self.token, task_id }
    }
}

/// Where an agent's task is, to cancel it: the agent's endpoint and token, and the task.
#[derive(Debug, Clone, Copy)]
pub struct A2aTask<'a> {
    pub invoke: &'a A2aInvoke,
    pub url: &'a str,
    pub token: Option<&'a str>,
    pub task_id: &'a str,
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
    /// Asks the agent to cancel a task the caller no longer waits for (its run was cancelled),
    /// within [`CANCEL_WAIT`]: best effort, its refusal only logged (the caller's run ends
    /// cancelled either way, and an agent whose task ended answers that it cannot cancel it).
    fn cancel_task<'a>(&'a self, task: A2aTask<'a>) -> BoxFuture<'a, ()>;
}

/// How long a cancel of an agent's task may take.
pub const CANCEL_WAIT: Duration = Duration::from_secs(5);

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
        let (mut task, mut bytes) = match (self.rpc(m.at(""), "SendMessage", wire::send_params(m)).await, m.content) {
            (Ok(r), _) => r,
            // A reply sent again (after a crash) to a task that took it already: the task is
            // working or ended, so wait for it instead.
            (Err(Refusal::Rpc(e)), Content::Reply { task_id, .. }) if e.code == wire::UNSUPPORTED_OPERATION => {
                self.rpc(m.at(task_id), "GetTask", wire::get_params(task_id)).await.map_err(Refusal::into_tool)?
            }
            (Err(e), _) => return Err(e.into_tool()),
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
                    let _ = m.seen.set(task_id.clone());
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_POLL);
                    (task, bytes) = self.rpc(m.at(&task_id), "GetTask", wire::get_params(&task_id)).await.map_err(Refusal::into_tool)?;
                    continue;
                }
            };
            return Ok(A2aOutput { answer, bytes, duration: started.elapsed() });
        }
    }

    /// One JSON-RPC call: its `result`, and the size of the answer.
    async fn rpc(&self, m: A2aTask<'_>, method: &str, params: Value) -> Result<(Value, usize), Refusal> {
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
        let raw = super::read_capped(&mut response, max, m.invoke.timeout).await.map_err(Refusal::Tool)?;
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
    fn cancel_task<'a>(&'a self, task: A2aTask<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let params = serde_json::json!({"id": task.task_id});
            let why = match tokio::time::timeout(CANCEL_WAIT, self.rpc(task, "CancelTask", params)).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => e.into_tool().message,
                Err(_) => format!("no answer within {} s", CANCEL_WAIT.as_secs()),
            };
            let at = crate::redact::origin_and_path(task.url);
            tracing::warn!(agent = %at, task_id = task.task_id, error = %why, "cancelling an agent's task its caller no longer waits for");
        })
    }

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::defs::UrlTemplate;

    /// A server answering each request with the next JSON-RPC result or error of `answers`, and
    /// the methods it was asked, in order.
    async fn agent(answers: Vec<Value>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/a2a/r", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        tokio::spawn(async move {
            for answer in answers {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                // The head, then the body by its length.
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize =
                            head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())).unwrap_or(0);
                        if body.len() >= len {
                            let request: Value = serde_json::from_str(body).unwrap();
                            log.lock().unwrap().push(request["method"].as_str().unwrap().to_owned());
                            break;
                        }
                    }
                }
                let body = json!({"jsonrpc": "2.0", "id": 1})
                    .as_object()
                    .unwrap()
                    .clone()
                    .into_iter()
                    .chain(answer.as_object().unwrap().clone())
                    .collect::<Map<_, _>>();
                let body = Value::Object(body).to_string();
                let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                socket.write_all(head.as_bytes()).await.unwrap();
                socket.write_all(body.as_bytes()).await.unwrap();
            }
        });
        (url, asked)
    }

    fn invoke() -> A2aInvoke {
        let url = UrlTemplate { raw: "http://x".into(), parts: vec![] };
        A2aInvoke { url, skill: "s".into(), token_env: None, timeout: Duration::from_secs(5), max_response_bytes: 1 << 20 }
    }

    #[tokio::test]
    async fn a_working_task_is_polled_until_it_asks() {
        let working = json!({"result": {"task": {"id": "t1", "status": {"state": "TASK_STATE_WORKING"}}}});
        let still = json!({"result": {"id": "t1", "status": {"state": "TASK_STATE_WORKING"}}});
        let asks =
            json!({"result": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"parts": [{"text": "Which?"}]}}}});
        let (url, asked) = agent(vec![working, still, asks]).await;
        let args = Map::new();
        let inv = invoke();
        let m = A2aMessage { invoke: &inv, url: &url, token: None, message_id: "m1", content: Content::Start(&args), seen: &OnceLock::new() };
        let out = A2aAgents::new().send(m).await.unwrap();
        assert_eq!(out.answer, A2aAnswer::InputRequired { task_id: "t1".into(), context_id: Some("c1".into()), question: "Which?".into() });
        assert_eq!(*asked.lock().unwrap(), ["SendMessage", "GetTask", "GetTask"]);
    }

    #[tokio::test]
    async fn a_reply_the_task_took_already_reads_the_task_instead() {
        let refused = json!({"error": {"code": -32004, "message": "task t1 is working"}});
        let done = json!({"result": {"id": "t1", "status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [{"parts": [{"text": "42"}]}]}});
        let (url, asked) = agent(vec![refused, done]).await;
        let inv = invoke();
        let content = Content::Reply { task_id: "t1", context_id: None, text: "order 42" };
        let m = A2aMessage { invoke: &inv, url: &url, token: None, message_id: "m1:reply:1", content, seen: &OnceLock::new() };
        let out = A2aAgents::new().send(m).await.unwrap();
        assert_eq!(out.answer, A2aAnswer::Completed("42".into()));
        assert_eq!(*asked.lock().unwrap(), ["SendMessage", "GetTask"]);
        // A new task's message refused is the tool's error, naming the code.
        let (url, _) = agent(vec![json!({"error": {"code": -32004, "message": "no"}})]).await;
        let args = Map::new();
        let m = A2aMessage { invoke: &inv, url: &url, token: None, message_id: "m2", content: Content::Start(&args), seen: &OnceLock::new() };
        let e = A2aAgents::new().send(m).await.unwrap_err();
        assert_eq!((e.class, e.message.as_str()), (ReasonClass::ToolFailed, "the agent answered JSON-RPC error -32004: no"));
    }
}
