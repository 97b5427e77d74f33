//! The text a user reads in a decision as the decision is written: the question of an `ask`, the
//! answer of a `done`. A decision is not prose but a JSON object (`{"action": "done", "message":
//! "..."}`, from a provider that decodes natively) or a line of the text protocol (`DONE ...`,
//! the stub's and the text-only providers'); streaming it raw would show a watcher the envelope.
//! [`DecisionText`] reads the reply's pieces as they come and passes on only the decoded text of
//! the top-level `message` string (JSON) or what follows `ASK`/`DONE` (text protocol), so the
//! deltas of a decision concatenate to exactly the question or answer the decision holds.
//!
//! A `tool_call` shows nothing (its text protocol keyword is `CALL`; in JSON it has no
//! `message`). A JSON object that puts `message` before `action` shows the message as it comes,
//! whatever the action turns out to be: the schema gives `message` to `ask` and `done` only.

/// Keys longer than this are never `message`: what is kept of a key stops here.
const MAX_KEY: usize = 16;

/// The reader of one attempt's decision text.
#[derive(Debug, Default)]
pub struct DecisionText {
    mode: Mode,
}

#[derive(Debug, Default)]
enum Mode {
    /// Nothing but whitespace yet.
    #[default]
    Start,
    /// The text protocol's keyword, as read so far.
    Keyword(String),
    /// After `ASK` or `DONE`: the text, whitespace held back until more text follows it (the
    /// protocol trims the reply, so trailing whitespace is not part of the answer).
    Text {
        started: bool,
        held: String,
    },
    Json(Json),
    /// Nothing more is shown (a `CALL`, an unknown keyword, the end of the JSON object).
    Off,
}

#[derive(Debug, Default)]
struct Json {
    depth: u32,
    /// At depth 1, a string now is a key (after `{` or `,`), not a value (after `:`).
    expect_key: bool,
    /// The last key read at depth 1.
    key: String,
    string: Option<Str>,
}

/// A string being read: what it is, and where its escape stands.
#[derive(Debug)]
struct Str {
    role: Role,
    escape: Escape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    Message,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    /// `\u` and the hex digits so far (count, value), and a high surrogate waiting for its pair.
    Unicode(u8, u32, Option<u32>),
    /// A high surrogate was read; a `\uXXXX` low surrogate may follow.
    Surrogate(u32),
    /// The backslash after a high surrogate.
    SurrogateBackslash(u32),
}

impl DecisionText {
    /// Reads `piece`, appending the text it shows to `out`.
    pub fn feed(&mut self, piece: &str, out: &mut String) {
        for c in piece.chars() {
            self.char(c, out);
        }
    }

    fn char(&mut self, c: char, out: &mut String) {
        match &mut self.mode {
            Mode::Start if c.is_whitespace() => {}
            Mode::Start if c == '{' => self.mode = Mode::Json(Json { depth: 1, expect_key: true, ..Json::default() }),
            Mode::Start => self.mode = Mode::Keyword(c.to_string()),
            Mode::Keyword(k) if c.is_whitespace() => {
                self.mode = if k == "ASK" || k == "DONE" { Mode::Text { started: false, held: String::new() } } else { Mode::Off };
            }
            Mode::Keyword(k) if k.len() < 4 => k.push(c),
            Mode::Keyword(_) => self.mode = Mode::Off,
            Mode::Text { started: false, .. } if c.is_whitespace() => {}
            Mode::Text { started, held } => {
                *started = true;
                if c.is_whitespace() {
                    held.push(c);
                } else {
                    out.push_str(held);
                    held.clear();
                    out.push(c);
                }
            }
            Mode::Json(j) => {
                if j.char(c, out) {
                    self.mode = Mode::Off;
                }
            }
            Mode::Off => {}
        }
    }
}

impl Json {
    /// Reads one character; true at the end of the object.
    fn char(&mut self, c: char, out: &mut String) -> bool {
        if let Some(s) = &mut self.string {
            let role = s.role;
            match s.escape {
                Escape::None => match c {
                    '\\' => s.escape = Escape::Backslash,
                    '"' => self.string = None,
                    c => self.text(role, c, out),
                },
                Escape::Backslash => {
                    s.escape = Escape::None;
                    let decoded = match c {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'u' => {
                            s.escape = Escape::Unicode(0, 0, None);
                            return false;
                        }
                        // `"`, `\`, `/` and anything invalid stand for themselves.
                        c => c,
                    };
                    self.text(role, decoded, out);
                }
                Escape::Surrogate(high) => {
                    if c == '\\' {
                        s.escape = Escape::SurrogateBackslash(high);
                    } else {
                        s.escape = Escape::None;
                        self.text(role, char::REPLACEMENT_CHARACTER, out);
                        return self.char(c, out);
                    }
                }
                Escape::SurrogateBackslash(high) => {
                    if c == 'u' {
                        s.escape = Escape::Unicode(0, 0, Some(high));
                    } else {
                        s.escape = Escape::Backslash;
                        self.text(role, char::REPLACEMENT_CHARACTER, out);
                        return self.char(c, out);
                    }
                }
                Escape::Unicode(n, value, high) => {
                    let Some(digit) = c.to_digit(16) else {
                        s.escape = Escape::None;
                        self.text(role, char::REPLACEMENT_CHARACTER, out);
                        return self.char(c, out);
                    };
                    let value = value * 16 + digit;
                    if n < 3 {
                        s.escape = Escape::Unicode(n + 1, value, high);
                        return false;
                    }
                    s.escape = Escape::None;
                    match (high, value) {
                        (Some(h), 0xDC00..=0xDFFF) => {
                            let c = 0x10000 + ((h - 0xD800) << 10) + (value - 0xDC00);
                            self.text(role, char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER), out);
                        }
                        (high, 0xD800..=0xDBFF) => {
                            if high.is_some() {
                                self.text(role, char::REPLACEMENT_CHARACTER, out);
                            }
                            if let Some(s) = &mut self.string {
                                s.escape = Escape::Surrogate(value);
                            }
                        }
                        (high, value) => {
                            if high.is_some() {
                                self.text(role, char::REPLACEMENT_CHARACTER, out);
                            }
                            self.text(role, char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER), out);
                        }
                    }
                }
            }
            return false;
        }
        match c {
            '"' => {
                let role = match (self.depth, self.expect_key) {
                    (1, true) => {
                        self.key.clear();
                        Role::Key
                    }
                    (1, false) if self.key == "message" => Role::Message,
                    _ => Role::Other,
                };
                self.string = Some(Str { role, escape: Escape::None });
            }
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            ':' if self.depth == 1 => self.expect_key = false,
            ',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
        false
    }

    fn text(&mut self, role: Role, c: char, out: &mut String) {
        match role {
            Role::Key if self.key.len() < MAX_KEY => self.key.push(c),
            Role::Message => out.push(c),
            Role::Key | Role::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{AgentDecision, DecisionSpec};

    /// The text shown for `raw` fed in pieces of `size` characters.
    fn shown(raw: &str, size: usize) -> String {
        let mut d = DecisionText::default();
        let mut out = String::new();
        let chars: Vec<char> = raw.chars().collect();
        for piece in chars.chunks(size.max(1)) {
            d.feed(&piece.iter().collect::<String>(), &mut out);
        }
        out
    }

    fn message_of(d: AgentDecision) -> String {
        match d {
            AgentDecision::Ask { question } => question,
            AgentDecision::Done { answer } => answer,
            AgentDecision::ToolCall { .. } => String::new(),
        }
    }

    #[test]
    fn the_shown_text_is_the_decisions_message_in_any_cut() {
        let spec = DecisionSpec::new(vec!["lookup".into()]);
        let json = [
            r#"{"action": "done", "message": "The order ships \"today\".\nTrack it: a\/b \u00e9 \ud83d\ude00 end "}"#,
            r#"  {"message":"Which order?","action":"ask"}"#,
            r#"{"action":"tool_call","tool_name":"lookup","arguments":{"message":"not shown","x":[1,{"message":"no"}]}}"#,
            r#"{"action":"done","arguments":{},"message":"tab\there"}"#,
        ];
        let text = ["DONE   The answer is 42.  \n", "  ASK Which order?\nThe blue one? ", "CALL lookup {\"q\": \"DONE x\"}", "DONE"];
        for size in [1, 2, 3, 7, 1000] {
            for raw in json {
                assert_eq!(shown(raw, size), message_of(spec.parse_json(raw).unwrap()), "{raw} in pieces of {size}");
            }
            for raw in text {
                assert_eq!(shown(raw, size), message_of(spec.parse_text(raw).unwrap()), "{raw} in pieces of {size}");
            }
        }
    }

    #[test]
    fn what_is_not_a_decision_shows_nothing_and_a_bad_escape_shows_a_replacement() {
        assert_eq!(shown("Sure! DONE maybe", 3), "");
        assert_eq!(shown("[\"message\", \"x\"]", 2), "");
        assert_eq!(shown(r#"{"message":"a\ud83db\uZZ"}"#, 1), "a\u{fffd}b\u{fffd}ZZ");
        assert_eq!(shown(r#"{"message":"one"} {"message":"two"}"#, 4), "one");
    }
}
