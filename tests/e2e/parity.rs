//! Structured output agrees byte for byte with the Python reference (Pydantic v2).

use fabric::structured::{FlatSchema, decode_reply};
use serde_json::Value;

use crate::support::fixtures;

fn check_file(name: &str) -> usize {
    let text = std::fs::read_to_string(fixtures().join("parity").join(name)).unwrap();
    let mut checked = 0;
    for (idx, line) in text.lines().enumerate() {
        let case: Value = serde_json::from_str(line).unwrap();
        let schema = FlatSchema::from_json(&case["schema"]).unwrap_or_else(|e| panic!("{name}:{}: schema not bindable: {e}", idx + 1));
        let raw = case["raw"].as_str().unwrap();
        let got = decode_reply(&schema, raw);
        match (case.get("error").and_then(Value::as_str), got) {
            (Some(want), Err(e)) => assert_eq!(e.reason_class(), want, "{name}:{}: raw {raw:?}", idx + 1),
            (Some(want), Ok(d)) => panic!("{name}:{}: raw {raw:?}: want error {want}, got {}", idx + 1, d.compact),
            (None, Err(e)) => panic!("{name}:{}: raw {raw:?}: want {}, got error {e}", idx + 1, case["compact"]),
            (None, Ok(d)) => {
                assert_eq!(d.compact, case["compact"].as_str().unwrap(), "{name}:{}: raw {raw:?}", idx + 1);
                assert_eq!(d.unwrapped.as_deref(), case.get("unwrapped").and_then(Value::as_str), "{name}:{}: unwrapped, raw {raw:?}", idx + 1);
            }
        }
        checked += 1;
    }
    checked
}

#[test]
fn shared_structured_vectors() {
    assert_eq!(check_file("structured.jsonl"), 31);
}

#[test]
fn extra_structured_vectors() {
    assert!(check_file("structured-extra.jsonl") > 100);
}

/// `fabric validate` goes through the same code path: every shared vector, through the binary.
#[test]
fn validate_command_agrees_with_every_vector() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixtures().join("parity/structured.jsonl")).unwrap();
    for (idx, line) in text.lines().enumerate() {
        let case: Value = serde_json::from_str(line).unwrap();
        let schema_path = dir.path().join("schema.json");
        let reply_path = dir.path().join("reply.txt");
        std::fs::write(&schema_path, case["schema"].to_string()).unwrap();
        std::fs::write(&reply_path, case["raw"].as_str().unwrap()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabric")).arg("validate").arg("--schema").arg(&schema_path).arg(&reply_path).output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let want = match case.get("error").and_then(Value::as_str) {
            Some(class) => {
                assert_eq!(out.status.code(), Some(1), "line {}", idx + 1);
                class.to_owned()
            }
            None => {
                assert_eq!(out.status.code(), Some(0), "line {}", idx + 1);
                case.get("unwrapped").and_then(Value::as_str).unwrap_or_else(|| case["compact"].as_str().unwrap()).to_owned()
            }
        };
        assert_eq!(stdout, format!("{want}\n"), "line {}", idx + 1);
    }
}
