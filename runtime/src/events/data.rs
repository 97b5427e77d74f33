//! What each event type carries: [`EventKind`], the closed set of types, and [`EventData`], one
//! variant per type with its fields, serialised in the order docs/events.md lists them (the wire
//! is that order, byte for byte; `tests/e2e/events.rs` pins it).
//!
//! Names from closed sets the module cannot import (it is a leaf: reason classes, route paths,
//! node kinds, roles, HTTP methods) are their wire names, `&'static str`.

use crate::failure::ReasonClass;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

/// The closed set of event types (docs/events.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    RunStarted,
    StageStarted,
    StageCompleted,
    StageFailed,
    LlmStarted,
    LlmWaiting,
    LlmRetrying,
    LlmDelta,
    LlmRestarted,
    LlmFallback,
    LlmCompleted,
    LlmFailed,
    ToolStarted,
    ToolCompleted,
    ToolFailed,
    RunCompleted,
    RunFailed,
    RunAwaitingInput,
    RunResumed,
    RunCancelled,
    CatalogueMoved,
}

impl EventKind {
    pub const ALL: [EventKind; 21] = [
        EventKind::RunStarted,
        EventKind::StageStarted,
        EventKind::StageCompleted,
        EventKind::StageFailed,
        EventKind::LlmStarted,
        EventKind::LlmWaiting,
        EventKind::LlmRetrying,
        EventKind::LlmDelta,
        EventKind::LlmRestarted,
        EventKind::LlmFallback,
        EventKind::LlmCompleted,
        EventKind::LlmFailed,
        EventKind::ToolStarted,
        EventKind::ToolCompleted,
        EventKind::ToolFailed,
        EventKind::RunCompleted,
        EventKind::RunFailed,
        EventKind::RunAwaitingInput,
        EventKind::RunResumed,
        EventKind::RunCancelled,
        EventKind::CatalogueMoved,
    ];

    /// The wire name, the event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run.started",
            EventKind::StageStarted => "run.stage.started",
            EventKind::StageCompleted => "run.stage.completed",
            EventKind::StageFailed => "run.stage.failed",
            EventKind::LlmStarted => "run.llm.started",
            EventKind::LlmWaiting => "run.llm.waiting",
            EventKind::LlmRetrying => "run.llm.retrying",
            EventKind::LlmDelta => "run.llm.delta",
            EventKind::LlmRestarted => "run.llm.restarted",
            EventKind::LlmFallback => "run.llm.fallback",
            EventKind::LlmCompleted => "run.llm.completed",
            EventKind::LlmFailed => "run.llm.failed",
            EventKind::ToolStarted => "run.tool.started",
            EventKind::ToolCompleted => "run.tool.completed",
            EventKind::ToolFailed => "run.tool.failed",
            EventKind::RunCompleted => "run.completed",
            EventKind::RunFailed => "run.failed",
            EventKind::RunAwaitingInput => "run.awaiting_input",
            EventKind::RunResumed => "run.resumed",
            EventKind::RunCancelled => "run.cancelled",
            EventKind::CatalogueMoved => "run.catalogue_moved",
        }
    }

    /// The kind of a wire name (events read back from a store or a stream).
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// A run's last event: completed, failed, cancelled or awaiting input.
    pub fn ends_run(self) -> bool {
        matches!(self, EventKind::RunCompleted | EventKind::RunFailed | EventKind::RunCancelled | EventKind::RunAwaitingInput)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the wire name: `event.kind == "run.completed"`.
impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A model call's token counts, when the provider reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

/// What a tool call answered: an HTTP status, or `"ok"` from an in-process or MCP tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStatus {
    Http(u16),
    InProcess,
}

impl std::fmt::Display for ToolStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolStatus::Http(code) => write!(f, "{code}"),
            ToolStatus::InProcess => f.write_str("ok"),
        }
    }
}

/// An event's type-specific fields (docs/events.md), one variant per [`EventKind`].
#[derive(Debug, Clone, PartialEq)]
pub enum EventData {
    RunStarted {
        model_profile: String,
        /// `workflow`, `branched`, `manifest` or `pattern1`.
        path: &'static str,
        prefetch_chunks: usize,
        /// The workflow or manifest (none for a decision loop).
        source: Option<String>,
        activation_target: Option<String>,
    },
    StageStarted {
        llm_role: &'static str,
        stage_idx: u32,
        /// `task`, `child_run`, `appended_synthesis`, `decision` or `tool`.
        kind: &'static str,
    },
    StageCompleted {
        duration_ms: f64,
        output: String,
        output_chars: usize,
    },
    StageFailed {
        reason_class: ReasonClass,
        message: String,
        duration_ms: f64,
    },
    LlmStarted {
        provider: String,
        model: String,
        turn: u32,
        structured: bool,
    },
    /// A call waited for room at its model's gate (`limit`: what held it).
    LlmWaiting {
        limit: &'static str,
        waited_ms: u64,
    },
    LlmRetrying {
        attempt: u32,
        delay_ms: u64,
        reason_class: ReasonClass,
        message: String,
    },
    /// A piece of the reply's text as the model writes it (`llm::stream`).
    LlmDelta {
        turn: u32,
        /// The attempt the text is of (1 for the first; a retry's text starts again).
        attempt: u32,
        /// Its number within the attempt, from 0.
        index: u32,
        text: String,
    },
    /// The call's text starts again (a new attempt after one that showed text): drop it.
    LlmRestarted {
        turn: u32,
        attempt: u32,
    },
    /// A fallback chain moves on from one model to the next (`llm::fallback`).
    LlmFallback {
        /// `provider:model` of each.
        from: String,
        to: String,
        /// Why, from `llm::fallback::Reason` (`unavailable`, `circuit_open`, ...).
        reason: &'static str,
        /// The class of the failure it moves on from (of the failures that opened the breaker,
        /// `rate_limited` for a paused model).
        reason_class: ReasonClass,
    },
    LlmCompleted {
        duration_ms: f64,
        tokens: Option<Tokens>,
    },
    LlmFailed {
        reason_class: ReasonClass,
        message: String,
        duration_ms: f64,
        /// The reply that came but could not be used, capped.
        reply: Option<String>,
    },
    ToolStarted {
        tool: String,
        /// MCP tools only: the server (`mcp_servers`) whose tool `tool` is.
        mcp_server: Option<String>,
        /// `GET`, `POST`, `in_process` or `mcp`.
        method: &'static str,
        /// HTTP tools only, shown without query or credentials.
        url: Option<String>,
    },
    ToolCompleted {
        tool: String,
        mcp_server: Option<String>,
        status: ToolStatus,
        bytes: usize,
        duration_ms: f64,
    },
    ToolFailed {
        tool: String,
        mcp_server: Option<String>,
        reason_class: ReasonClass,
        message: String,
    },
    RunCompleted {
        /// `null` on the wire when no stage gave an output.
        output: Option<String>,
        duration_ms: f64,
    },
    RunFailed {
        reason_class: ReasonClass,
        message: String,
        /// None for a recovered run given up without a walk.
        duration_ms: Option<f64>,
        /// Every decision of a decision loop that ran out of steps.
        decisions: Option<Value>,
    },
    RunAwaitingInput {
        question: String,
        duration_ms: f64,
    },
    RunResumed {
        reply: String,
    },
    RunCancelled {
        /// Why, as the request gave it (or the default `cancelled by request`).
        reason: String,
        /// None for a run ended without a walk (queued, awaiting input, or taken over).
        duration_ms: Option<f64>,
    },
    /// A run taken up again (after a crash, by another replica, after a reply) goes on on
    /// another catalogue version than the one it recorded: `FABRIC_RESUME_ON=current`, or its
    /// own version could not be rebuilt here.
    CatalogueMoved {
        /// The version it recorded; none for a run accepted before versions were kept.
        from: Option<String>,
        to: String,
        reason: String,
    },
}

impl EventData {
    pub fn kind(&self) -> EventKind {
        match self {
            EventData::RunStarted { .. } => EventKind::RunStarted,
            EventData::StageStarted { .. } => EventKind::StageStarted,
            EventData::StageCompleted { .. } => EventKind::StageCompleted,
            EventData::StageFailed { .. } => EventKind::StageFailed,
            EventData::LlmStarted { .. } => EventKind::LlmStarted,
            EventData::LlmWaiting { .. } => EventKind::LlmWaiting,
            EventData::LlmRetrying { .. } => EventKind::LlmRetrying,
            EventData::LlmDelta { .. } => EventKind::LlmDelta,
            EventData::LlmRestarted { .. } => EventKind::LlmRestarted,
            EventData::LlmFallback { .. } => EventKind::LlmFallback,
            EventData::LlmCompleted { .. } => EventKind::LlmCompleted,
            EventData::LlmFailed { .. } => EventKind::LlmFailed,
            EventData::ToolStarted { .. } => EventKind::ToolStarted,
            EventData::ToolCompleted { .. } => EventKind::ToolCompleted,
            EventData::ToolFailed { .. } => EventKind::ToolFailed,
            EventData::RunCompleted { .. } => EventKind::RunCompleted,
            EventData::RunFailed { .. } => EventKind::RunFailed,
            EventData::RunAwaitingInput { .. } => EventKind::RunAwaitingInput,
            EventData::RunResumed { .. } => EventKind::RunResumed,
            EventData::RunCancelled { .. } => EventKind::RunCancelled,
            EventData::CatalogueMoved { .. } => EventKind::CatalogueMoved,
        }
    }

    /// The duration the event reports, for the types that carry one.
    pub fn duration_ms(&self) -> Option<f64> {
        match self {
            EventData::StageCompleted { duration_ms, .. }
            | EventData::StageFailed { duration_ms, .. }
            | EventData::LlmCompleted { duration_ms, .. }
            | EventData::LlmFailed { duration_ms, .. }
            | EventData::ToolCompleted { duration_ms, .. }
            | EventData::RunCompleted { duration_ms, .. }
            | EventData::RunAwaitingInput { duration_ms, .. } => Some(*duration_ms),
            EventData::RunFailed { duration_ms, .. } | EventData::RunCancelled { duration_ms, .. } => *duration_ms,
            _ => None,
        }
    }
}

/// The fields as one JSON object, in wire order; an absent optional field is left out (but an
/// absent run output is `null`, as it always was).
impl Serialize for EventData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self {
            EventData::RunStarted { model_profile, path, prefetch_chunks, source, activation_target } => {
                m.serialize_entry("model_profile", model_profile)?;
                m.serialize_entry("path", path)?;
                m.serialize_entry("prefetch_chunks", prefetch_chunks)?;
                if let Some(source) = source {
                    m.serialize_entry("source", source)?;
                }
                if let Some(target) = activation_target {
                    m.serialize_entry("activation_target", target)?;
                }
            }
            EventData::StageStarted { llm_role, stage_idx, kind } => {
                m.serialize_entry("llm_role", llm_role)?;
                m.serialize_entry("stage_idx", stage_idx)?;
                m.serialize_entry("kind", kind)?;
            }
            EventData::StageCompleted { duration_ms, output, output_chars } => {
                m.serialize_entry("duration_ms", duration_ms)?;
                m.serialize_entry("output", output)?;
                m.serialize_entry("output_chars", output_chars)?;
            }
            EventData::StageFailed { reason_class, message, duration_ms } => {
                m.serialize_entry("reason_class", reason_class.as_str())?;
                m.serialize_entry("message", message)?;
                m.serialize_entry("duration_ms", duration_ms)?;
            }
            EventData::LlmStarted { provider, model, turn, structured } => {
                m.serialize_entry("provider", provider)?;
                m.serialize_entry("model", model)?;
                m.serialize_entry("turn", turn)?;
                m.serialize_entry("structured", structured)?;
            }
            EventData::LlmWaiting { limit, waited_ms } => {
                m.serialize_entry("limit", limit)?;
                m.serialize_entry("waited_ms", waited_ms)?;
            }
            EventData::LlmRetrying { attempt, delay_ms, reason_class, message } => {
                m.serialize_entry("attempt", attempt)?;
                m.serialize_entry("delay_ms", delay_ms)?;
                m.serialize_entry("reason_class", reason_class.as_str())?;
                m.serialize_entry("message", message)?;
            }
            EventData::LlmDelta { turn, attempt, index, text } => {
                m.serialize_entry("turn", turn)?;
                m.serialize_entry("attempt", attempt)?;
                m.serialize_entry("index", index)?;
                m.serialize_entry("text", text)?;
            }
            EventData::LlmRestarted { turn, attempt } => {
                m.serialize_entry("turn", turn)?;
                m.serialize_entry("attempt", attempt)?;
            }
            EventData::LlmFallback { from, to, reason, reason_class } => {
                m.serialize_entry("from", from)?;
                m.serialize_entry("to", to)?;
                m.serialize_entry("reason", reason)?;
                m.serialize_entry("reason_class", reason_class.as_str())?;
            }
            EventData::LlmCompleted { duration_ms, tokens } => {
                m.serialize_entry("duration_ms", duration_ms)?;
                if let Some(t) = tokens {
                    m.serialize_entry("input_tokens", &t.input)?;
                    m.serialize_entry("output_tokens", &t.output)?;
                }
            }
            EventData::LlmFailed { reason_class, message, duration_ms, reply } => {
                m.serialize_entry("reason_class", reason_class.as_str())?;
                m.serialize_entry("message", message)?;
                m.serialize_entry("duration_ms", duration_ms)?;
                if let Some(reply) = reply {
                    m.serialize_entry("reply", reply)?;
                }
            }
            EventData::ToolStarted { tool, mcp_server, method, url } => {
                m.serialize_entry("tool", tool)?;
                if let Some(server) = mcp_server {
                    m.serialize_entry("mcp_server", server)?;
                }
                m.serialize_entry("method", method)?;
                if let Some(url) = url {
                    m.serialize_entry("url", url)?;
                }
            }
            EventData::ToolCompleted { tool, mcp_server, status, bytes, duration_ms } => {
                m.serialize_entry("tool", tool)?;
                if let Some(server) = mcp_server {
                    m.serialize_entry("mcp_server", server)?;
                }
                match status {
                    ToolStatus::Http(code) => m.serialize_entry("status", code)?,
                    ToolStatus::InProcess => m.serialize_entry("status", "ok")?,
                }
                m.serialize_entry("bytes", bytes)?;
                m.serialize_entry("duration_ms", duration_ms)?;
            }
            EventData::ToolFailed { tool, mcp_server, reason_class, message } => {
                m.serialize_entry("tool", tool)?;
                if let Some(server) = mcp_server {
                    m.serialize_entry("mcp_server", server)?;
                }
                m.serialize_entry("reason_class", reason_class.as_str())?;
                m.serialize_entry("message", message)?;
            }
            EventData::RunCompleted { output, duration_ms } => {
                m.serialize_entry("output", output)?;
                m.serialize_entry("duration_ms", duration_ms)?;
            }
            EventData::RunFailed { reason_class, message, duration_ms, decisions } => {
                m.serialize_entry("reason_class", reason_class.as_str())?;
                m.serialize_entry("message", message)?;
                if let Some(d) = duration_ms {
                    m.serialize_entry("duration_ms", d)?;
                }
                if let Some(decisions) = decisions {
                    m.serialize_entry("decisions", decisions)?;
                }
            }
            EventData::RunAwaitingInput { question, duration_ms } => {
                m.serialize_entry("question", question)?;
                m.serialize_entry("duration_ms", duration_ms)?;
            }
            EventData::RunResumed { reply } => m.serialize_entry("reply", reply)?,
            EventData::RunCancelled { reason, duration_ms } => {
                m.serialize_entry("reason_class", "cancelled")?;
                m.serialize_entry("reason", reason)?;
                if let Some(d) = duration_ms {
                    m.serialize_entry("duration_ms", d)?;
                }
            }
            EventData::CatalogueMoved { from, to, reason } => {
                m.serialize_entry("from", from)?;
                m.serialize_entry("to", to)?;
                m.serialize_entry("reason", reason)?;
            }
        }
        m.end()
    }
}
