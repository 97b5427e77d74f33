//! JSON text re-written as it streams, in the form the journal keeps it: what
//! `serde_json::Value::to_string` writes for the same JSON (no whitespace, strings escaped as
//! serde escapes them, numbers as serde writes them).
//!
//! Anthropic's forced tool sends the stage's answer as pieces of JSON text spaced as the model
//! wrote them, while the reply read whole (and journalled) is the compact JSON of the tool's
//! input. Re-written piece by piece, the pieces a watcher sees join into that compact JSON.
//! (One case still differs: an object naming a key twice, which the value keeps once.)

use serde_json::Value;

#[derive(Debug, Default)]
pub(crate) struct CompactJson {
    in_string: bool,
    /// An escape inside a string, from its backslash (a surrogate pair's two halves together).
    escape: String,
    /// A number or a literal outside strings.
    token: String,
}

impl CompactJson {
    /// The compact text of `piece`, as far as it can be written yet (a number or an escape cut
    /// by the piece's end waits for the next).
    pub(crate) fn feed(&mut self, piece: &str) -> String {
        let mut out = String::new();
        for c in piece.chars() {
            if self.in_string {
                self.string_char(c, &mut out);
            } else if c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.') {
                self.token.push(c);
            } else {
                self.flush_token(&mut out);
                match c {
                    ' ' | '\t' | '\n' | '\r' => {}
                    '"' => {
                        self.in_string = true;
                        out.push('"');
                    }
                    _ => out.push(c),
                }
            }
        }
        out
    }

    /// The end of the text: what still waits (a number at the very end).
    pub(crate) fn end(&mut self) -> String {
        let mut out = String::new();
        self.flush_token(&mut out);
        out.push_str(&std::mem::take(&mut self.escape));
        out
    }

    fn flush_token(&mut self, out: &mut String) {
        let token = std::mem::take(&mut self.token);
        match serde_json::from_str::<Value>(&token) {
            Ok(v) => out.push_str(&v.to_string()),
            // Not JSON: the whole reply will fail to parse; shown as it came.
            Err(_) => out.push_str(&token),
        }
    }

    fn string_char(&mut self, c: char, out: &mut String) {
        if self.escape.is_empty() {
            match c {
                '\\' => self.escape.push(c),
                '"' => {
                    self.in_string = false;
                    out.push(c);
                }
                c => write_escaped(&c.to_string(), out),
            }
            return;
        }
        self.escape.push(c);
        let e = self.escape.as_str();
        let complete = !c.is_ascii()
            || match e.len() {
                2 => c != 'u',
                // A high surrogate waits for its low half (`\uD83D\uDE00`).
                6 => !matches!(u16::from_str_radix(&e[2..6], 16), Ok(0xD800..=0xDBFF)),
                7 => c != '\\',
                8 => c != 'u',
                12 => true,
                _ => false,
            };
        if complete {
            let escape = std::mem::take(&mut self.escape);
            match serde_json::from_str::<String>(&format!("\"{escape}\"")) {
                Ok(text) => write_escaped(&text, out),
                Err(_) => out.push_str(&escape),
            }
        }
    }
}

/// `text` inside a JSON string, escaped as serde_json escapes it.
fn write_escaped(text: &str, out: &mut String) {
    let quoted = Value::String(text.to_owned()).to_string();
    out.push_str(&quoted[1..quoted.len() - 1]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_join_into_the_compact_json_of_the_value() {
        let text = "{ \"a\" : 1.50, \"b\\u00e9\\/\": [true , null, -2E2, 10],\n \"c\": \"x\\ty \\ud83d\\ude00 \\\"q\\\" é\", \"d\": {}}";
        let want = serde_json::from_str::<Value>(text).unwrap().to_string();
        for size in 1..=text.len() {
            let mut json = CompactJson::default();
            let mut shown = String::new();
            let bytes = text.as_bytes();
            let mut start = 0;
            while start < bytes.len() {
                let mut end = (start + size).min(bytes.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                shown.push_str(&json.feed(&text[start..end]));
                start = end;
            }
            shown.push_str(&json.end());
            assert_eq!(shown, want, "pieces of {size}");
        }
    }
}
