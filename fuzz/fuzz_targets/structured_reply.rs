//! Reading a model reply against a flat schema never panics (Python-compatible JSON reader,
//! lax coercions, float formatting).
#![no_main]

use fabric::structured::{decode_reply, FlatSchema};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else { return };
    let schema = serde_json::json!({"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "number"}, "i": {"type": "integer"}, "b": {"type": "boolean"},
        "e": {"enum": ["a", 1, true]}, "l": {"type": "array", "items": {"type": "integer"}}}, "required": ["s"]});
    let flat = FlatSchema::from_json(&schema).unwrap();
    if let Ok(d) = decode_reply(&flat, raw) {
        // What we produce is JSON a strict parser accepts.
        serde_json::from_str::<serde_json::Value>(&d.compact).expect("compact output is valid JSON");
    }
});
