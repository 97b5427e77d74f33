//! Live progress of `fabric run` on a terminal: one line per stage, with model-call timings.

use std::sync::Mutex;
use std::time::Instant;

use fabric::events::{Event, EventKind, EventSink};

use crate::term::say;

/// Live progress on a terminal: one line per stage, with model-call timings.
#[derive(Default)]
pub struct Progress {
    started: Mutex<Option<Instant>>,
}

impl EventSink for Progress {
    fn emit(&self, e: &Event) {
        let get = |k: &str| match e.data.get(k) {
            None => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) if n.is_f64() => format!("{:.1}", n.as_f64().unwrap_or_default()),
            Some(v) => v.to_string(),
        };
        let stage = e.stage_id.as_deref().unwrap_or("");
        let indent = if e.parent_run_id.is_some() { "    " } else { "" };
        let line = match e.kind {
            EventKind::RunStarted => {
                if let Ok(mut s) = self.started.lock() {
                    s.get_or_insert_with(Instant::now);
                }
                format!("{indent}▶ {} ({} path)", e.route_id, get("path"))
            }
            EventKind::StageStarted => format!("{indent}  • {stage} [{}] …", get("llm_role")),
            EventKind::LlmCompleted => format!("{indent}      model {} ms, {} → {} tokens", get("duration_ms"), get("input_tokens"), get("output_tokens")),
            EventKind::LlmFailed => format!("{indent}      model failed: {} ({})", get("reason_class"), get("message")),
            EventKind::ToolCompleted => format!("{indent}      tool {} HTTP {} in {} ms", get("tool"), get("status"), get("duration_ms")),
            EventKind::ToolFailed => format!("{indent}      tool {} failed: {}", get("tool"), get("reason_class")),
            EventKind::StageCompleted => format!("{indent}  ✓ {stage} {} ms", get("duration_ms")),
            EventKind::StageFailed => format!("{indent}  ✗ {stage}: {}", get("reason_class")),
            EventKind::RunCompleted => format!("{indent}✔ completed in {} ms", get("duration_ms")),
            EventKind::RunFailed => format!("{indent}✘ failed: {} — {}", get("reason_class"), get("message")),
            _ => return,
        };
        say(line);
    }
}
