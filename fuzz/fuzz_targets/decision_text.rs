//! The text-protocol parser (`CALL` / `ASK` / `DONE`) never panics, and what it accepts is well formed.
#![no_main]

use fabric::agent::decision::{parse_text_protocol, Action};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(d) = parse_text_protocol(text) {
        match d.action {
            Action::ToolCall => {
                let name = d.tool_name.expect("a tool call has a tool name");
                assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
            }
            Action::Ask => assert!(!d.message.expect("an ask has a question").is_empty()),
            Action::Done => assert!(d.message.is_some()),
        }
    }
});
