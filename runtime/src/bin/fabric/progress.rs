//! Live progress of `fabric run` on a terminal: one line per stage, with model-call timings.

use std::sync::Mutex;
use std::time::Instant;

use fabric::events::{Event, EventData, EventSink};

use crate::term::say;

/// Live progress on a terminal: one line per stage, with model-call timings.
#[derive(Default)]
pub struct Progress {
    started: Mutex<Option<Instant>>,
}

impl EventSink for Progress {
    fn emit(&self, e: &Event) {
        let stage = e.stage_id.as_deref().unwrap_or("");
        let indent = if e.parent_run_id.is_some() { "    " } else { "" };
        // Durations with one decimal; a count the provider did not report is left blank.
        let ms = |d: &f64| format!("{d:.1}");
        let line = match &e.data {
            EventData::RunStarted { path, .. } => {
                if let Ok(mut s) = self.started.lock() {
                    s.get_or_insert_with(Instant::now);
                }
                format!("{indent}▶ {} ({path} path)", e.route_id)
            }
            EventData::StageStarted { llm_role, .. } => format!("{indent}  • {stage} [{llm_role}] …"),
            EventData::LlmCompleted { duration_ms, tokens } => {
                let (input, output) = tokens.map_or((String::new(), String::new()), |t| (t.input.to_string(), t.output.to_string()));
                format!("{indent}      model {} ms, {input} → {output} tokens", ms(duration_ms))
            }
            EventData::LlmFailed { reason_class, message, .. } => format!("{indent}      model failed: {reason_class} ({message})"),
            EventData::ToolCompleted { tool, status, duration_ms, .. } => format!("{indent}      tool {tool} HTTP {status} in {} ms", ms(duration_ms)),
            EventData::ToolFailed { tool, reason_class, .. } => format!("{indent}      tool {tool} failed: {reason_class}"),
            EventData::StageCompleted { duration_ms, .. } => format!("{indent}  ✓ {stage} {} ms", ms(duration_ms)),
            EventData::StageFailed { reason_class, .. } => format!("{indent}  ✗ {stage}: {reason_class}"),
            EventData::RunCompleted { duration_ms, .. } => format!("{indent}✔ completed in {} ms", ms(duration_ms)),
            EventData::RunFailed { reason_class, message, .. } => format!("{indent}✘ failed: {reason_class} — {message}"),
            EventData::RunCancelled { reason, .. } => format!("{indent}✘ cancelled: {reason}"),
            _ => return,
        };
        say(line);
    }
}
