//! The agent cards: the fleet's (`GET /.well-known/agent-card.json`, one skill per route this
//! replica's fleet starts) and each route's (`GET /a2a/{route_id}/.well-known/agent-card.json`).
//! Public, as discovery is; the bearer scheme they state is what every call needs.
//!
//! A card's URLs are absolute: built from the request's `Host` (and `X-Forwarded-Proto`, else
//! `http`). The fleet card's interface is its first route's endpoint (JSON-RPC is per route);
//! its skills name every route, each with its own card.

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::{ApiError, AppState, ErrorCode, PathText};
use super::wire::PROTOCOL_VERSION;
use crate::catalogue::RouteEntry;

/// A route this replica starts: id, description, goal schema.
pub(super) struct Skill {
    pub id: String,
    pub description: String,
    pub schema: Option<Value>,
}

/// The routes this replica starts, in catalogue order.
pub(super) fn skills(state: &AppState) -> Vec<Skill> {
    let edition = state.runtime().current();
    edition
        .catalogue()
        .routes()
        .filter_map(|entry| match entry {
            RouteEntry::Ready(r) if edition.check_route(r.id()).is_ok() => {
                Some(Skill { id: r.id().to_owned(), description: r.description().trim().to_owned(), schema: r.goal_schema().cloned() })
            }
            _ => None,
        })
        .collect()
}

/// The base URL the client reached this service at.
fn base(headers: &HeaderMap) -> String {
    // Only a host and port: a `Host` with user info, a path or a query (`a@evil`, `x/y?#`) would
    // point the card's URLs elsewhere, so it is not taken.
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.contains('@') && h.parse::<axum::http::uri::Authority>().is_ok())
        .unwrap_or("localhost");
    let proto = match headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()) {
        Some("https") => "https",
        _ => "http",
    };
    format!("{proto}://{host}")
}

fn skill_json(s: &Skill) -> Value {
    let description = if s.description.is_empty() { format!("Runs the route `{}`.", s.id) } else { s.description.clone() };
    let schema = s.schema.clone().unwrap_or_else(|| json!({"type": "object", "additionalProperties": true}));
    json!({
        "id": s.id,
        "name": s.id,
        "description": description,
        "tags": ["fabric", "route"],
        "inputModes": ["application/json", "text/plain"],
        "outputModes": ["application/json", "text/plain"],
        "examples": [],
        // Not a field of the card's schema: the route's goal schema, which a data part must fit
        // (clients ignore fields they do not know).
        "inputSchema": schema,
    })
}

/// A card for `skills`, served at `endpoint`.
fn card(state: &AppState, name: String, description: String, endpoint: &str, skills: &[Skill]) -> Value {
    let mut card = json!({
        "name": name,
        "description": description,
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}],
        "capabilities": {"streaming": true, "pushNotifications": true, "stateTransitionHistory": true, "extendedAgentCard": false},
        "defaultInputModes": ["application/json", "text/plain"],
        "defaultOutputModes": ["application/json", "text/plain"],
        "skills": skills.iter().map(skill_json).collect::<Vec<_>>(),
    });
    if state.inner.config.token.is_some() {
        card["securitySchemes"] = json!({"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

fn json_response(v: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")], v.to_string()).into_response()
}

/// The fleet's A2A agent card (public): one skill per route this replica starts (its id,
/// description and goal schema as `inputSchema`), the first route's JSON-RPC endpoint as its
/// interface, the bearer scheme when the service has a token. docs/a2a.md.
#[utoipa::path(get, path = "/.well-known/agent-card.json", responses((status = 200, description = "An A2A 1.0 `AgentCard` (JSON)", content_type = "application/json")))]
pub(in crate::api) async fn fleet_card(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let skills = skills(&state);
    let base = base(&headers);
    let fleet = state.runtime().settings().fleet.clone();
    let name = fleet.as_deref().map_or_else(|| "fabric".to_owned(), |f| format!("fabric fleet {f}"));
    let description = "A Fabric Runtime fleet: each skill is a route, an agent of its own at /a2a/{skill_id} (its card at /a2a/{skill_id}/.well-known/agent-card.json). \
Each task is a durable run: it survives a replica's crash, asks with input-required, and is resumable.";
    let endpoint = skills.first().map_or_else(|| format!("{base}/a2a"), |s| format!("{base}/a2a/{}", s.id));
    json_response(card(&state, name, description.to_owned(), &endpoint, &skills))
}

/// One route's A2A agent card (public): its one skill, its JSON-RPC endpoint `/a2a/{route_id}`.
#[utoipa::path(get, path = "/a2a/{route_id}/.well-known/agent-card.json", params(("route_id" = String, Path, description = "A route this replica starts")),
    responses((status = 200, description = "An A2A 1.0 `AgentCard` (JSON)", content_type = "application/json"), (status = 404, description = "No route of this fleet has that id", body = super::super::ErrorBody)))]
pub(in crate::api) async fn route_card(State(state): State<AppState>, PathText(route_id): PathText, headers: HeaderMap) -> Response {
    let Some(skill) = skills(&state).into_iter().find(|s| s.id == route_id) else {
        return ApiError::new(ErrorCode::NotFound, "no route of this fleet has that id").into_response();
    };
    let endpoint = format!("{}/a2a/{}", base(&headers), skill.id);
    let description = if skill.description.is_empty() { format!("The Fabric Runtime route `{}`.", skill.id) } else { skill.description.clone() };
    json_response(card(&state, skill.id.clone(), description, &endpoint, std::slice::from_ref(&skill)))
}
