//! The text-protocol parser (`CALL` / `ASK` / `DONE`) never panics, and what it accepts is well formed.
#![no_main]

use fabric::decision::{AgentDecision, parse_text_protocol};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(d) = parse_text_protocol(text) {
        match d {
            AgentDecision::ToolCall { tool, .. } => {
                assert!(!tool.is_empty() && tool.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
            }
            AgentDecision::Ask { question } => assert!(!question.is_empty()),
            AgentDecision::Done { .. } => {}
        }
    }
});
