//! Every route an A2A agent (issue 52): the agent cards ([`card`]) and the JSON-RPC binding at
//! `POST /a2a/{route_id}`. A task is a run ([`task`]): started through the service's one start
//! path, answered through its one reply path, cancelled through its one cancel path, streamed
//! through its one event pump ([`stream`]), so tasks survive a replica's crash and every
//! stream resumes on any replica.
//!
//! A2A 1.0's method names (`SendMessage`, `GetTask` ...) are answered in 1.0's shapes, 0.3's
//! (`message/send`, `tasks/get` ...) in 0.3's ([`wire::legacy`]). The wire forms stay in this
//! adapter. Push notification configs ([`push`]) are kept in the store and delivered through the
//! webhooks' outbox, in A2A's bodies.

pub(super) mod card;
mod params;
mod push;
mod stream;
mod task;
mod wire;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use super::{ApiError, AppState, ErrorBody, ErrorCode, PathText, waited};
pub(super) use push::delivery as push_delivery;
use wire::{Code, RpcError};

/// The cards: public, as discovery is.
pub(super) fn cards() -> Router<AppState> {
    Router::new().route("/.well-known/agent-card.json", get(card::fleet_card)).route("/a2a/{route_id}/.well-known/agent-card.json", get(card::route_card))
}

/// The JSON-RPC endpoint of each route (behind the bearer token), its body read by `read` (the
/// service's bounded read), whose refusals (too large, too slow) are told as JSON-RPC errors.
pub(super) fn rpc(read: impl FnOnce(Router<AppState>) -> Router<AppState>) -> Router<AppState> {
    read(Router::new().route("/a2a/{route_id}", post(endpoint))).layer(axum::middleware::map_response(body_refused))
}

/// A body the service would not read (`413`, `408`) as an invalid request, its status kept.
async fn body_refused(response: Response) -> Response {
    let status = response.status();
    let why = match status.as_u16() {
        413 => "the request body is larger than the service takes",
        408 => "the request body did not arrive in time",
        _ => return response,
    };
    let mut answer = reply(RpcError::new(Code::InvalidRequest, why).response(&Value::Null));
    *answer.status_mut() = status;
    answer
}

/// What a request asks, whichever version's name it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Send,
    Stream,
    Get,
    Cancel,
    Subscribe,
    List,
    PushConfig(push::Op),
    ExtendedCard,
}

/// A method's name: what it asks, and whether it is 0.3's (answered in 0.3's shapes).
fn method(name: &str) -> Option<(Method, bool)> {
    Some(match name {
        "SendMessage" => (Method::Send, false),
        "message/send" => (Method::Send, true),
        "SendStreamingMessage" => (Method::Stream, false),
        "message/stream" => (Method::Stream, true),
        "GetTask" => (Method::Get, false),
        "tasks/get" => (Method::Get, true),
        "CancelTask" => (Method::Cancel, false),
        "tasks/cancel" => (Method::Cancel, true),
        "SubscribeToTask" => (Method::Subscribe, false),
        "tasks/resubscribe" => (Method::Subscribe, true),
        "ListTasks" => (Method::List, false),
        "tasks/list" => (Method::List, true),
        "CreateTaskPushNotificationConfig" => (Method::PushConfig(push::Op::Create), false),
        "tasks/pushNotificationConfig/set" => (Method::PushConfig(push::Op::Create), true),
        "GetTaskPushNotificationConfig" => (Method::PushConfig(push::Op::Get), false),
        "tasks/pushNotificationConfig/get" => (Method::PushConfig(push::Op::Get), true),
        "ListTaskPushNotificationConfigs" => (Method::PushConfig(push::Op::List), false),
        "tasks/pushNotificationConfig/list" => (Method::PushConfig(push::Op::List), true),
        "DeleteTaskPushNotificationConfig" => (Method::PushConfig(push::Op::Delete), false),
        "tasks/pushNotificationConfig/delete" => (Method::PushConfig(push::Op::Delete), true),
        "GetExtendedAgentCard" => (Method::ExtendedCard, false),
        "agent/getAuthenticatedExtendedCard" => (Method::ExtendedCard, true),
        _ => return None,
    })
}

/// A route as an A2A agent: one JSON-RPC 2.0 request (A2A 1.0 method names answered in 1.0's
/// shapes, 0.3's in 0.3's; a batch is refused: A2A defines none). Errors are JSON-RPC errors
/// with the protocol's codes, in a 200. docs/a2a.md.
#[utoipa::path(post, path = "/a2a/{route_id}", params(("route_id" = String, Path, description = "A route this replica starts"),
        ("A2A-Version" = Option<String>, Header, description = "`1.0` or `0.3` (none: 0.3); another is `VersionNotSupportedError` (-32009)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "`SubscribeToTask`: resume after this event (the SSE `id`, the run event's `seq`)")),
    request_body(content = Object, description = "A JSON-RPC 2.0 request: `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask`, `ListTasks`, `CreateTaskPushNotificationConfig`, `GetTaskPushNotificationConfig`, `ListTaskPushNotificationConfigs`, `DeleteTaskPushNotificationConfig` (or `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`, `tasks/resubscribe`, `tasks/list`, `tasks/pushNotificationConfig/set`, `.../get`, `.../list`, `.../delete`)", content_type = "application/json"),
    responses((status = 200, description = "A JSON-RPC response (`application/json`), or for `SendStreamingMessage` and `SubscribeToTask` `text/event-stream` of JSON-RPC responses (a `Task`, then status and artifact updates; each SSE `id` a run event's `seq`)", content_type = "application/json"),
        (status = 404, description = "No route of this fleet has that id", body = ErrorBody), (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 413, description = "The body is larger than the limit: a JSON-RPC error `-32600`, id `null` (`408` likewise for a body that did not arrive in time)")),
    security(("bearer" = [])))]
pub(in crate::api) async fn endpoint(State(state): State<AppState>, PathText(route_id): PathText, headers: HeaderMap, body: Bytes) -> Response {
    if !card::skills(&state).iter().any(|s| s.id == route_id) {
        return ApiError::new(ErrorCode::NotFound, "no route of this fleet has that id: no agent here").into_response();
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return reply(RpcError::new(Code::Parse, "the body is not JSON").response(&Value::Null)),
    };
    let id = request.get("id").filter(|i| echoable(i)).cloned().unwrap_or(Value::Null);
    match call(&state, &route_id, &headers, &request, &id).await {
        Ok(Answer::Json(v)) => reply(v),
        Ok(Answer::Stream(r)) => r,
        // A streaming method's error is a stream of that one response, which is what its
        // client reads.
        Err(e) if request.get("method").and_then(Value::as_str).and_then(method).is_some_and(|(m, _)| matches!(m, Method::Stream | Method::Subscribe)) => {
            let event = axum::response::sse::Event::default().data(e.response(&id).to_string());
            axum::response::sse::Sse::new(futures_util::stream::iter([Ok::<_, std::convert::Infallible>(event)])).into_response()
        }
        Err(e) => reply(e.response(&id)),
    }
}

/// An id answered as it came: a string, or an integer that is one exactly (a fraction, an
/// exponent or a number past 64 bits would come back as another number).
fn echoable(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

enum Answer {
    Json(Value),
    Stream(Response),
}

fn reply(v: Value) -> Response {
    axum::Json(v).into_response()
}

async fn call(state: &AppState, route_id: &str, headers: &HeaderMap, request: &Value, id: &Value) -> Result<Answer, RpcError> {
    let Value::Object(o) = request else {
        let what = if request.is_array() { "a batch: A2A defines no batches; send one request per call" } else { "not a JSON-RPC request object" };
        return Err(RpcError::new(Code::InvalidRequest, format!("the body is {what}")));
    };
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(RpcError::new(Code::InvalidRequest, "`jsonrpc` must be \"2.0\""));
    }
    if o.get("id").is_some_and(|i| !(echoable(i) || i.is_null())) {
        return Err(RpcError::new(Code::InvalidRequest, "`id` must be a string, an integer of at most 64 bits or null"));
    }
    let Some(name) = o.get("method").and_then(Value::as_str) else { return Err(RpcError::new(Code::InvalidRequest, "`method` must be a string")) };
    let Some((method, legacy)) = method(name) else { return Err(RpcError::new(Code::MethodNotFound, format!("no method `{}` here", super::echo_id(name)))) };
    let params = match o.get("params") {
        None | Some(Value::Null) => &Value::Object(serde_json::Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err(RpcError::params("`params` must be an object")),
    };
    version(headers)?;
    let json = |v: Value| Ok(Answer::Json(wire::success(id, if legacy { wire::legacy(v) } else { v })));
    match method {
        Method::Send => {
            let sent = task::send(state, route_id, params, legacy).await?;
            let config = params::object(params, "configuration", "params")?.unwrap_or(&Value::Null);
            let immediately = params::flag(config, "returnImmediately", "params.configuration")? == Some(true)
                || params::flag(config, "blocking", "params.configuration")? == Some(false);
            if !immediately {
                let _ = waited(state, &sent.run_id).await.map_err(task::api)?;
            }
            let run = task::load(state, route_id, &sent.run_id).await?;
            json(serde_json::json!({"task": task::task(state, &run, task::history_length(params)?, true).await?}))
        }
        Method::Stream => {
            let sent = task::send(state, route_id, params, legacy).await?;
            Ok(Answer::Stream(
                stream::stream(
                    state,
                    route_id,
                    id.clone(),
                    &sent.run_id,
                    sent.after,
                    Some(if sent.after == 0 { "TASK_STATE_SUBMITTED" } else { "TASK_STATE_WORKING" }),
                    legacy,
                )
                .await?,
            ))
        }
        Method::Subscribe => {
            let run = task::load(state, route_id, task::id_param(params)?).await?;
            let after = match stream::last_event_id(headers)? {
                Some(after) => after,
                None if !run.status.is_pending() && run.status != crate::store::StoredStatus::AwaitingInput => {
                    return Err(RpcError::new(
                        Code::UnsupportedOperation,
                        "the task ended: there is nothing to subscribe to (send `Last-Event-ID` to read its last events)",
                    ));
                }
                None => run.next_seq.saturating_sub(1),
            };
            Ok(Answer::Stream(stream::stream(state, route_id, id.clone(), &run.run_id, after, None, legacy).await?))
        }
        Method::Get => json(task::get(state, route_id, params).await?),
        Method::Cancel => json(task::cancel(state, route_id, params).await?),
        Method::List => json(task::list(state, route_id, params).await?),
        // Answered in its own version's shapes (0.3's config nests, 1.0's is flat).
        Method::PushConfig(op) => Ok(Answer::Json(wire::success(id, push::call(state, route_id, op, params, legacy).await?))),
        Method::ExtendedCard => Err(RpcError::new(Code::ExtendedCardNotConfigured, "this agent has no extended card")),
    }
}

/// The `A2A-Version` a request asks for: none (0.3), 0.3 or 1.0 (patch numbers ignored).
fn version(headers: &HeaderMap) -> Result<(), RpcError> {
    let Some(v) = headers.get("a2a-version") else { return Ok(()) };
    let v = v.to_str().unwrap_or("?").trim();
    let mut parts = v.split('.');
    let major_minor = (parts.next(), parts.next());
    match major_minor {
        (Some(""), None) | (Some("0"), Some("3")) | (Some("1"), Some("0")) => Ok(()),
        _ => Err(RpcError::new(Code::VersionNotSupported, format!("A2A-Version `{}` is not served here: 0.3 and 1.0 are", super::echo_id(v)))
            .with_data(serde_json::json!({"supported": ["0.3", "1.0"]}))),
    }
}
