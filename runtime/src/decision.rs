//! The model's decision in the decision loop, read from native structured output
//! (live providers) or from the older `CALL` / `ASK` / `DONE` text protocol (the seeded stub).
//!
//! A leaf decoder beside [`crate::structured`]: it returns its own [`DecisionError`], which the
//! model port maps to a reason class. A decision is an inert proposal: a tool call names a tool
//! of the route's list and carries arguments; nothing runs until the loop has checked the
//! arguments against the tool's input schema.

use serde_json::{Map, Value, json};

/// One decision: each action carries exactly what it needs, so a tool call without a tool or an
/// ask without a question cannot be represented.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentDecision {
    /// Call `tool` (one of the route's tools) with `arguments`.
    /// The arguments are boxed: a decision moves through every layer of the model stack.
    ToolCall { tool: String, arguments: Box<Map<String, Value>> },
    /// Stop and ask the user (the run then awaits input).
    Ask { question: String },
    /// Finish with the answer.
    Done { answer: String },
}

impl AgentDecision {
    pub fn action(&self) -> &'static str {
        match self {
            AgentDecision::ToolCall { .. } => "tool_call",
            AgentDecision::Ask { .. } => "ask",
            AgentDecision::Done { .. } => "done",
        }
    }

    /// The decision as events and slots show it: the `AgentDecision` JSON shape.
    pub fn to_json(&self) -> Value {
        let (tool, arguments, message) = match self {
            AgentDecision::ToolCall { tool, arguments } => (Some(tool.as_str()), (**arguments).clone(), None),
            AgentDecision::Ask { question } => (None, Map::new(), Some(question.as_str())),
            AgentDecision::Done { answer } => (None, Map::new(), Some(answer.as_str())),
        };
        json!({"action": self.action(), "tool_name": tool, "arguments": arguments, "message": message})
    }
}

/// Why a reply is not a usable decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionErrorKind {
    /// A native reply that is not JSON.
    InvalidJson,
    /// JSON, but not a well-formed decision (no action, a tool call without a tool ...).
    Shape,
    /// A text-protocol reply that is not a well-formed `CALL`/`ASK`/`DONE` line.
    Malformed,
    /// A tool call naming a tool the route does not have.
    UnknownTool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecisionError {
    pub kind: DecisionErrorKind,
    pub message: String,
}

fn fail(kind: DecisionErrorKind, message: impl Into<String>) -> DecisionError {
    DecisionError { kind, message: message.into() }
}

/// What the decision node asks the model for: the `AgentDecision` schema, with the route's tool
/// names as the enum of `tool_name` so that constrained decoding cannot invent a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionSpec {
    tools: Vec<String>,
    schema: Value,
}

impl DecisionSpec {
    pub fn new(tools: Vec<String>) -> DecisionSpec {
        let schema = json!({
            "type": "object",
            "description": "The next step: call one tool, ask the user one question, or finish with the answer.",
            "properties": {
                "action": {"type": "string", "enum": ["tool_call", "ask", "done"]},
                "tool_name": {"type": "string", "enum": tools, "description": "The tool to call, for action tool_call."},
                "arguments": {"type": "object", "description": "The tool's arguments, matching its input schema, for action tool_call."},
                "message": {"type": "string", "description": "The question for action ask, or the final answer for action done."}
            },
            "required": ["action"]
        });
        DecisionSpec { tools, schema }
    }

    /// The schema sent to providers that decode natively.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    pub fn tools(&self) -> &[String] {
        &self.tools
    }

    fn check_tool(&self, d: AgentDecision) -> Result<AgentDecision, DecisionError> {
        match &d {
            AgentDecision::ToolCall { tool, .. } if !self.tools.contains(tool) => Err(fail(
                DecisionErrorKind::UnknownTool,
                format!("the model called `{}`, which is not one of this route's tools ({})", shorten(tool), self.tools.join(", ")),
            )),
            _ => Ok(d),
        }
    }

    /// Reads a native structured decision (JSON).
    pub fn parse_json(&self, raw: &str) -> Result<AgentDecision, DecisionError> {
        let v: Value = serde_json::from_str(raw.trim()).map_err(|e| fail(DecisionErrorKind::InvalidJson, e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| fail(DecisionErrorKind::Shape, "a decision must be a JSON object"))?;
        let bad = |why: String| fail(DecisionErrorKind::Shape, why);
        let text = |k: &str| -> Result<Option<String>, DecisionError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(bad(format!("`{k}` must be a string, got {other}"))),
            }
        };
        let decision = match obj.get("action").and_then(Value::as_str) {
            Some("tool_call") => {
                let tool = text("tool_name")?.filter(|s| !s.is_empty()).ok_or_else(|| bad("a tool_call needs `tool_name`".into()))?;
                let arguments = match obj.get("arguments") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(m)) => m.clone(),
                    Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                        // Some models send the arguments as a JSON string; accept it when it is an object.
                        Ok(Value::Object(m)) => m,
                        _ => return Err(bad("`arguments` must be an object".into())),
                    },
                    Some(_) => return Err(bad("`arguments` must be an object".into())),
                };
                AgentDecision::ToolCall { tool, arguments: Box::new(arguments) }
            }
            Some("ask") => {
                let question = text("message")?.filter(|m| !m.trim().is_empty()).ok_or_else(|| bad("an ask needs a `message` (the question)".into()))?;
                AgentDecision::Ask { question }
            }
            Some("done") => AgentDecision::Done { answer: text("message")?.ok_or_else(|| bad("a done needs a `message` (the answer)".into()))? },
            other => return Err(bad(format!("`action` must be tool_call, ask or done, got {}", other.map_or("nothing".into(), |s| format!("`{s}`"))))),
        };
        self.check_tool(decision)
    }

    /// Reads the text protocol: `CALL <tool> <json object>`, `ASK <question>`, `DONE <answer>`.
    pub fn parse_text(&self, raw: &str) -> Result<AgentDecision, DecisionError> {
        parse_text_protocol(raw).and_then(|d| self.check_tool(d))
    }
}

/// Strict reader of the text protocol. The keyword is upper case and alone on the first word;
/// a tool name is letters, digits, `_`, `-`, `.`; `CALL` arguments are one JSON object and
/// nothing after it; an `ASK` needs a question. Anything else is refused, `Malformed`, with the
/// reason.
pub fn parse_text_protocol(raw: &str) -> Result<AgentDecision, DecisionError> {
    let text = raw.trim();
    let (keyword, rest) = match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], text[i..].trim_start()),
        None => (text, ""),
    };
    match keyword {
        "CALL" => {
            let (tool, args) = match rest.find(|c: char| c.is_whitespace() || c == '{') {
                Some(i) => (&rest[..i], rest[i..].trim()),
                None => (rest, ""),
            };
            if tool.is_empty() {
                return Err(fail(DecisionErrorKind::Malformed, "malformed CALL: no tool name"));
            }
            let shown = shorten(tool);
            if !tool.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
                return Err(fail(DecisionErrorKind::Malformed, format!("malformed CALL: `{shown}` is not a tool name")));
            }
            if args.is_empty() {
                return Err(fail(DecisionErrorKind::Malformed, format!("malformed CALL {shown}: no arguments (write {{}} for none)")));
            }
            let arguments = match serde_json::from_str::<Value>(args) {
                Ok(Value::Object(m)) => m,
                Ok(_) => return Err(fail(DecisionErrorKind::Malformed, format!("malformed CALL {shown}: the arguments must be a JSON object"))),
                Err(e) => return Err(fail(DecisionErrorKind::Malformed, format!("malformed CALL {shown}: the arguments are not valid JSON ({e})"))),
            };
            Ok(AgentDecision::ToolCall { tool: tool.to_owned(), arguments: Box::new(arguments) })
        }
        "ASK" if !rest.is_empty() => Ok(AgentDecision::Ask { question: rest.to_owned() }),
        "ASK" => Err(fail(DecisionErrorKind::Malformed, "malformed ASK: no question")),
        "DONE" => Ok(AgentDecision::Done { answer: rest.to_owned() }),
        "" => Err(fail(DecisionErrorKind::Malformed, "empty reply: expected CALL, ASK or DONE")),
        other => {
            let shown: String = other.chars().take(40).collect();
            Err(fail(DecisionErrorKind::Malformed, format!("expected CALL, ASK or DONE, got `{shown}`")))
        }
    }
}

/// Model text quoted in a message, cut to 80 characters: a reply may be megabytes long.
fn shorten(text: &str) -> String {
    const MAX: usize = 80;
    if text.chars().count() <= MAX { text.to_owned() } else { format!("{}…", text.chars().take(MAX).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_protocol() {
        let d = parse_text_protocol("CALL add {\"a\":2,\"b\":3}").unwrap();
        assert!(matches!(&d, AgentDecision::ToolCall { tool, arguments } if tool == "add" && arguments.len() == 2));
        let d = parse_text_protocol("  CALL kb_search{\"q\": \"refund\"}\n").unwrap();
        assert!(matches!(&d, AgentDecision::ToolCall { tool, .. } if tool == "kb_search"));
        assert_eq!(parse_text_protocol("ASK Which order?").unwrap(), AgentDecision::Ask { question: "Which order?".into() });
        assert_eq!(parse_text_protocol("DONE 12").unwrap(), AgentDecision::Done { answer: "12".into() });
        assert_eq!(parse_text_protocol("DONE\nline one\nline two").unwrap(), AgentDecision::Done { answer: "line one\nline two".into() });
        for bad in [
            "",
            "CALL",
            "CALL add",
            "CALL add [1]",
            "CALL add {\"a\":",
            "CALL add {} trailing",
            "CALL a/b {}",
            "ASK",
            "call add {}",
            "DONEX 1",
            "Sure! CALL add {}",
        ] {
            assert!(parse_text_protocol(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_decisions_are_checked() {
        let spec = DecisionSpec::new(vec!["add".into()]);
        let d = spec.parse_json(r#"{"action":"tool_call","tool_name":"add","arguments":{"a":1,"b":2}}"#).unwrap();
        assert!(matches!(d, AgentDecision::ToolCall { ref arguments, .. } if arguments.len() == 2));
        assert_eq!(spec.parse_json(r#"{"action":"done","message":"3"}"#).unwrap(), AgentDecision::Done { answer: "3".into() });
        let kind = |raw: &str| spec.parse_json(raw).unwrap_err().kind;
        assert_eq!(kind(r#"{"action":"tool_call","tool_name":"rm","arguments":{}}"#), DecisionErrorKind::UnknownTool);
        assert_eq!(kind(r#"{"action":"tool_call","arguments":{}}"#), DecisionErrorKind::Shape);
        assert_eq!(kind(r#"{"action":"dance"}"#), DecisionErrorKind::Shape);
        assert_eq!(kind(r#"{"action":"ask"}"#), DecisionErrorKind::Shape);
        assert_eq!(kind(r#"{"action":"ask","message":" "}"#), DecisionErrorKind::Shape);
        assert_eq!(kind("nope"), DecisionErrorKind::InvalidJson);
        assert_eq!(spec.parse_text("CALL rm {}").unwrap_err().kind, DecisionErrorKind::UnknownTool);
        assert_eq!(spec.parse_text("CALL add").unwrap_err().kind, DecisionErrorKind::Malformed);
        let long = format!("CALL {} {{}}", "x".repeat(100_000));
        assert!(spec.parse_text(&long).unwrap_err().message.len() < 300, "a model's text is cut in messages");
        let json = AgentDecision::Ask { question: "Which?".into() }.to_json();
        assert_eq!(json, json!({"action": "ask", "tool_name": null, "arguments": {}, "message": "Which?"}));
    }
}
