//! The user message every model call receives, built from run state.

use serde_json::{Map, Value};

/// Longest note kept, in characters; longer ones are cut and end with `…`.
pub const NOTE_MAX_CHARS: usize = 600;

/// A stage's note: `{stage_id}: {value}`, compressed.
pub fn stage_note(stage_id: &str, value: &str) -> String {
    let mut text = String::with_capacity(stage_id.len() + 2 + value.len());
    text.push_str(stage_id);
    text.push_str(": ");
    text.push_str(value);
    // Most notes are already one line of ASCII words with single spaces: kept as they are.
    if is_compact_ascii(&text) { text } else { compress_note(&text) }
}

/// One line, whitespace runs collapsed, at most [`NOTE_MAX_CHARS`] characters.
pub fn compress_note(text: &str) -> String {
    // Most notes are already one line of ASCII words with single spaces: copied as they are.
    if is_compact_ascii(text) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len().min(NOTE_MAX_CHARS * 4));
    let mut count = 0;
    for word in text.split_whitespace() {
        let needed = word.chars().count() + usize::from(count > 0);
        if count + needed > NOTE_MAX_CHARS {
            let room = NOTE_MAX_CHARS.saturating_sub(count + 1 + usize::from(count > 0));
            if count > 0 && room > 0 {
                out.push(' ');
            }
            out.extend(word.chars().take(room));
            out.push('…');
            return out;
        }
        if count > 0 {
            out.push(' ');
        }
        out.push_str(word);
        count += needed;
    }
    out
}

/// ASCII without control characters, no space at either end or next to another, and short
/// enough: what [`compress_note`] would return unchanged.
fn is_compact_ascii(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() > NOTE_MAX_CHARS || bytes.first() == Some(&b' ') || bytes.last() == Some(&b' ') {
        return false;
    }
    crate::structured::scan::is_compact_ascii(bytes)
}

/// The goal as the user message shows it: compact JSON, as `serde_json::to_string` writes it
/// (strings escaped by the same rules, without its serializer's per-byte table walk); once per
/// run, not once per call.
pub fn goal_json(goal: &Map<String, Value>) -> String {
    let mut out = String::with_capacity(64);
    write_object(&mut out, goal);
    out
}

fn write_object(out: &mut String, map: &Map<String, Value>) {
    out.push('{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        crate::structured::push_json_string(out, k);
        out.push(':');
        write_value(out, v);
    }
    out.push('}');
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::String(s) => crate::structured::push_json_string(out, s),
        Value::Object(map) => write_object(out, map),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        // null, booleans and numbers: serde_json's own text.
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `goal:` line, then `packed chunks:` (only with a prefetch pack), then `prior stage outputs:`
/// (only with notes); one `- ` item per line. `goal_json` is [`goal_json`] of the run's goal.
pub fn user_message(goal_json: &str, chunks: &[String], notes: &[String]) -> String {
    let mut out = String::new();
    write_user_message(&mut out, goal_json, chunks, notes);
    out
}

/// [`user_message`] into `out` (cleared first), so that a run reuses one buffer for its calls.
pub fn write_user_message(out: &mut String, goal_json: &str, chunks: &[String], notes: &[String]) {
    out.clear();
    // What this message takes (a chunk is written compressed: at most NOTE_MAX_CHARS characters
    // of up to four bytes), and at least 512: the messages of a run grow by a note per stage, and
    // one buffer serves them all.
    let chunk_bytes: usize = chunks.iter().map(|c| c.len().min(NOTE_MAX_CHARS * 4) + 3).sum();
    let want = goal_json.len() + 64 + chunk_bytes + notes.iter().map(|n| n.len() + 3).sum::<usize>();
    out.reserve(want.max(512));
    out.push_str("goal: ");
    out.push_str(goal_json);
    if !chunks.is_empty() {
        out.push_str("\npacked chunks:");
        for c in chunks {
            out.push_str("\n- ");
            out.push_str(&compress_note(c));
        }
    }
    if !notes.is_empty() {
        out.push_str("\nprior stage outputs:");
        for n in notes {
            out.push_str("\n- ");
            out.push_str(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_shape() {
        let goal: Map<String, Value> = serde_json::from_str(r#"{"ticket":"charged twice","n":2}"#).unwrap();
        let goal = goal_json(&goal);
        assert_eq!(user_message(&goal, &[], &[]), r#"goal: {"ticket":"charged twice","n":2}"#);
        assert_eq!(
            user_message(&goal, &["kb  article\n1".into()], &["intake: {\"a\":1}".into()]),
            "goal: {\"ticket\":\"charged twice\",\"n\":2}\npacked chunks:\n- kb article 1\nprior stage outputs:\n- intake: {\"a\":1}"
        );
    }

    #[test]
    fn a_large_prefetch_chunk_does_not_size_the_buffer() {
        let chunk = "word ".repeat(400_000);
        let mut out = String::new();
        write_user_message(&mut out, "{}", &[chunk], &[]);
        assert!(out.len() < 2 * NOTE_MAX_CHARS, "{}", out.len());
        assert!(out.capacity() < 64 * 1024, "a 2 MB chunk made a {}-byte buffer", out.capacity());
    }

    #[test]
    fn the_goal_is_written_as_serde_json_writes_it() {
        let goals = [
            r#"{}"#,
            r#"{"ticket":"I was charged twice","n":2,"x":1.5,"big":12345678901234567890,"neg":-0.0}"#,
            r#"{"q":"quote \" backslash \\ tab \t nl \n ctl \u0001 del \u007f é 😀 \u2028"}"#,
            r#"{"nested":{"a":[1,"two",null,true,false,{"b":[]}],"e":{}},"k\"ey":"v"}"#,
        ];
        for text in goals {
            let goal: Map<String, Value> = serde_json::from_str(text).unwrap();
            assert_eq!(goal_json(&goal), serde_json::to_string(&goal).unwrap(), "{text}");
        }
    }

    #[test]
    fn notes_are_one_line_and_bounded() {
        assert_eq!(compress_note("a \n\t b   c"), "a b c");
        let long = "word ".repeat(500);
        let n = compress_note(&long);
        assert_eq!(n.chars().count(), NOTE_MAX_CHARS);
        assert!(n.ends_with('…'));
        let one = "x".repeat(2000);
        assert_eq!(compress_note(&one).chars().count(), NOTE_MAX_CHARS);
        // The copy-through path and the word-by-word one agree on their borders.
        for text in ["a b", " a b", "a b ", "a  b", "a\u{7f}b", "a\u{a0}b", "é b", "x"] {
            let slow: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(compress_note(text), slow.join(" "), "{text:?}");
        }
        assert_eq!(compress_note(&"y".repeat(600)), "y".repeat(600));
        assert_eq!(compress_note(&"y".repeat(601)).chars().count(), NOTE_MAX_CHARS);
    }
}
