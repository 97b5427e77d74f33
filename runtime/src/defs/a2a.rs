//! A capability's A2A agent as decoded (`invoke: {a2a, skill, ...}`, `loader::a2a`): beside the
//! other definitions, in a file of its own so `defs.rs` stays one screenful of kinds.

use std::time::Duration;

use super::UrlTemplate;

/// A capability's call of another agent over the Agent2Agent protocol (`invoke: {a2a, skill,
/// token_env, timeout_ms, max_response_bytes}`, `loader::a2a`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aInvoke {
    /// The agent's JSON-RPC endpoint (a fleet's route: `https://HOST/a2a/ROUTE`). Taken as it
    /// is, not read from a card: a card could name another origin, which the token would follow.
    pub url: UrlTemplate,
    /// The skill asked for (sent in the message's metadata).
    pub skill: String,
    /// The variable holding the bearer token sent to the agent; the token is never in a file.
    pub token_env: Option<String>,
    /// How long one message may take, its polls included, until the task ends or asks.
    pub timeout: Duration,
    /// The largest answer read.
    pub max_response_bytes: usize,
}
