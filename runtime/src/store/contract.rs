//! The start contract of a run ([`StartRequest`]): what a front end asks to start, what the store
//! keeps with the run (its `request`) and reads back typed, and what a run taken over, continued
//! or replayed starts from again.

use serde_json::{Map, Value};

use crate::exec::RunRequest;

/// The start contract of a run, as a service accepts it: `{route_id, goal, model_profile,
/// prefetch?, session_id?, webhook_url?}`. `model_profile` must name a defined profile and is
/// recorded with the run; the route's own profile decides the model (as in the Python runtime).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StartRequest {
    pub route_id: String,
    pub goal: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Where this run's ends are posted, instead of the fleet's `FABRIC_WEBHOOK_URL`: its origin
    /// must be one of `FABRIC_WEBHOOK_ALLOWED_ORIGINS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// What this start does while its session has a live run, instead of the fleet's
    /// `FABRIC_SESSION_POLICY` (only with a `session_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multitask: Option<crate::config::SessionPolicy>,
}

impl StartRequest {
    /// The run this contract starts.
    pub fn run_request(&self) -> RunRequest {
        RunRequest { route_id: self.route_id.clone(), goal: self.goal.clone(), prefetch: self.prefetch.clone() }
    }
}
