//! The closed set of failure classes, the boxed future every port returns, and the error of an
//! HTTP client that cannot be built.
//!
//! A leaf: runs, stages, model calls and tools all report through [`ReasonClass`], so it sits
//! below every module that fails (docs/events.md lists the set). The tools and the model port
//! each build an HTTP client, and the runtime's builder reports either failure as one error:
//! [`ClientError`] is here, where both see it.

use std::future::Future;
use std::pin::Pin;

/// An HTTP client that could not be built (its TLS roots or resolver failed to start): a
/// start-up error, never a fallback to a client without its policy (redirects, timeouts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot build the HTTP client of {of}: {message}")]
pub struct ClientError {
    /// Whose client: `the tools`, `the model providers`.
    pub of: &'static str,
    /// reqwest's words.
    pub message: String,
}

/// The future an object-safe port method returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The closed set of failure classes (docs/events.md). Runs, stages, model calls and tools all
/// report one of these as `reason_class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonClass {
    /// The reply is not JSON where a structured reply was asked for.
    InvalidJson,
    /// The reply is JSON but does not satisfy the output schema.
    SchemaValidation,
    Timeout,
    Connection,
    RateLimited,
    ServerError,
    /// Any other 4xx from a provider.
    ClientError,
    /// A provider reply we could not read (wrong shape, refusal, empty).
    ProviderError,
    /// The seeded stub was asked more often than its script allows (strict mode).
    StubScriptExhausted,
    /// A text-protocol decision (`CALL`/`ASK`/`DONE`) that does not parse.
    InvalidDecision,
    UnknownTool,
    /// The decision loop: the model's tool arguments do not match the tool's input schema (noted; the loop goes on).
    InvalidToolArguments,
    LoopBudgetExceeded,
    ToolTimeout,
    ToolConnection,
    ToolHttpStatus,
    /// An in-process tool returned an error.
    ToolFailed,
    ToolResponseTooLarge,
    NoBranchMatched,
    ChildRunFailed,
    /// The run was stopped from outside without being cancelled (a signal, a service shutdown).
    Interrupted,
    /// The run was cancelled on request (`POST /v1/runs/{id}/cancel`, `fabric runs cancel`, a
    /// Python `CancelToken`): its terminal status is `cancelled`.
    Cancelled,
    /// The run's record could not be written to the run store; the run stops there.
    StoreError,
    /// A replay (`fabric replay`) reached a model call or a tool call its journal has no entry
    /// for: nothing is asked, the call fails.
    ReplayDiverged,
    /// An A2A agent called as a tool ended its task `failed`, `canceled` or `rejected` (or asks
    /// for authentication): its reason is the message.
    AgentTaskFailed,
}

impl ReasonClass {
    /// Every class, in the order of docs/events.md's table.
    pub const ALL: [ReasonClass; 25] = [
        ReasonClass::InvalidJson,
        ReasonClass::SchemaValidation,
        ReasonClass::Timeout,
        ReasonClass::Connection,
        ReasonClass::RateLimited,
        ReasonClass::ServerError,
        ReasonClass::ClientError,
        ReasonClass::ProviderError,
        ReasonClass::StubScriptExhausted,
        ReasonClass::InvalidDecision,
        ReasonClass::UnknownTool,
        ReasonClass::InvalidToolArguments,
        ReasonClass::LoopBudgetExceeded,
        ReasonClass::ToolTimeout,
        ReasonClass::ToolConnection,
        ReasonClass::ToolHttpStatus,
        ReasonClass::ToolFailed,
        ReasonClass::ToolResponseTooLarge,
        ReasonClass::NoBranchMatched,
        ReasonClass::ChildRunFailed,
        ReasonClass::Interrupted,
        ReasonClass::Cancelled,
        ReasonClass::StoreError,
        ReasonClass::ReplayDiverged,
        ReasonClass::AgentTaskFailed,
    ];

    /// The class of a wire name (`invalid_json`), as a stored run or a reply names it.
    pub fn parse(name: &str) -> Option<ReasonClass> {
        ReasonClass::ALL.into_iter().find(|c| c.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonClass::InvalidJson => "invalid_json",
            ReasonClass::SchemaValidation => "schema_validation",
            ReasonClass::Timeout => "timeout",
            ReasonClass::Connection => "connection",
            ReasonClass::RateLimited => "rate_limited",
            ReasonClass::ServerError => "server_error",
            ReasonClass::ClientError => "client_error",
            ReasonClass::ProviderError => "provider_error",
            ReasonClass::StubScriptExhausted => "stub_script_exhausted",
            ReasonClass::InvalidDecision => "invalid_decision",
            ReasonClass::UnknownTool => "unknown_tool",
            ReasonClass::InvalidToolArguments => "invalid_tool_arguments",
            ReasonClass::LoopBudgetExceeded => "loop_budget_exceeded",
            ReasonClass::ToolTimeout => "tool_timeout",
            ReasonClass::ToolConnection => "tool_connection",
            ReasonClass::ToolHttpStatus => "tool_http_status",
            ReasonClass::ToolFailed => "tool_failed",
            ReasonClass::ToolResponseTooLarge => "tool_response_too_large",
            ReasonClass::NoBranchMatched => "no_branch_matched",
            ReasonClass::ChildRunFailed => "child_run_failed",
            ReasonClass::Interrupted => "interrupted",
            ReasonClass::Cancelled => "cancelled",
            ReasonClass::StoreError => "store_error",
            ReasonClass::ReplayDiverged => "replay_diverged",
            ReasonClass::AgentTaskFailed => "agent_task_failed",
        }
    }

    /// Transient failures a retry may fix; everything else fails at once.
    pub fn is_retryable(self) -> bool {
        matches!(self, ReasonClass::Timeout | ReasonClass::Connection | ReasonClass::RateLimited | ReasonClass::ServerError)
    }
}

impl std::fmt::Display for ReasonClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ReasonClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ReasonClass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ReasonClass::parse(&name).ok_or_else(|| serde::de::Error::custom(format_args!("`{name}` is no reason class")))
    }
}

/// Lets callers and tests compare with the wire name: `class == "invalid_json"`.
impl PartialEq<&str> for ReasonClass {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::ReasonClass;

    #[test]
    fn every_class_is_listed_once_and_reads_back() {
        for (i, c) in ReasonClass::ALL.into_iter().enumerate() {
            assert_eq!(ReasonClass::parse(c.as_str()), Some(c));
            assert!(!ReasonClass::ALL[..i].contains(&c), "{c} twice");
            assert_eq!(serde_json::from_value::<ReasonClass>(serde_json::json!(c.as_str())).unwrap(), c);
        }
        assert_eq!(ReasonClass::parse("nope"), None);
        assert!(serde_json::from_value::<ReasonClass>(serde_json::json!("nope")).unwrap_err().to_string().contains("`nope` is no reason class"));
    }

    #[test]
    fn all_lists_every_class_in_order() {
        // Exhaustive: a new class does not compile here until it is given its place, and the
        // loop below fails until `ALL` lists it there (a stored class `ALL` lacks would not read).
        let place = |c: ReasonClass| match c {
            ReasonClass::InvalidJson => 0,
            ReasonClass::SchemaValidation => 1,
            ReasonClass::Timeout => 2,
            ReasonClass::Connection => 3,
            ReasonClass::RateLimited => 4,
            ReasonClass::ServerError => 5,
            ReasonClass::ClientError => 6,
            ReasonClass::ProviderError => 7,
            ReasonClass::StubScriptExhausted => 8,
            ReasonClass::InvalidDecision => 9,
            ReasonClass::UnknownTool => 10,
            ReasonClass::InvalidToolArguments => 11,
            ReasonClass::LoopBudgetExceeded => 12,
            ReasonClass::ToolTimeout => 13,
            ReasonClass::ToolConnection => 14,
            ReasonClass::ToolHttpStatus => 15,
            ReasonClass::ToolFailed => 16,
            ReasonClass::ToolResponseTooLarge => 17,
            ReasonClass::NoBranchMatched => 18,
            ReasonClass::ChildRunFailed => 19,
            ReasonClass::Interrupted => 20,
            ReasonClass::Cancelled => 21,
            ReasonClass::StoreError => 22,
            ReasonClass::ReplayDiverged => 23,
            ReasonClass::AgentTaskFailed => 24,
        };
        for (i, c) in ReasonClass::ALL.into_iter().enumerate() {
            assert_eq!(place(c), i, "{c}");
        }
    }
}
