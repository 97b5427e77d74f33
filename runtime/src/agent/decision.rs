//! The model's decision in the Mode 1 loop, read from native structured output (live providers)
//! or from the older `CALL` / `ASK` / `DONE` text protocol (the seeded stub).
//!
//! A decision is an inert proposal: a tool call names a tool and carries arguments; nothing runs
//! until the loop has checked the name against the hydrated tool list and the arguments against
//! the tool's input schema.

use serde_json::{Map, Value, json};

use crate::llm::{LlmError, ReasonClass};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    ToolCall,
    Ask,
    Done,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::ToolCall => "tool_call",
            Action::Ask => "ask",
            Action::Done => "done",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentDecision {
    pub action: Action,
    /// Set for `tool_call`.
    pub tool_name: Option<String>,
    /// The tool's arguments (`{}` when none were given).
    pub arguments: Map<String, Value>,
    /// The question (`ask`) or the answer (`done`).
    pub message: Option<String>,
}

impl AgentDecision {
    pub fn to_json(&self) -> Value {
        json!({"action": self.action.as_str(), "tool_name": self.tool_name, "arguments": self.arguments, "message": self.message})
    }
}

/// What the decision node asks the model for: the `AgentDecision` schema, with the hydrated
/// tool names as the enum of `tool_name` so that constrained decoding cannot invent a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionSpec {
    pub tools: Vec<String>,
    pub schema: Value,
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

    fn check_tool(&self, d: AgentDecision) -> Result<AgentDecision, LlmError> {
        match &d.tool_name {
            Some(t) if d.action == Action::ToolCall && !self.tools.contains(t) => Err(LlmError::new(
                ReasonClass::UnknownTool,
                format!("the model called `{t}`, which is not one of this route's tools ({})", self.tools.join(", ")),
            )),
            _ => Ok(d),
        }
    }

    /// Reads a native structured decision (JSON).
    pub fn parse_json(&self, raw: &str) -> Result<AgentDecision, LlmError> {
        let v: Value = serde_json::from_str(raw.trim()).map_err(|e| LlmError::new(ReasonClass::InvalidJson, e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| LlmError::new(ReasonClass::SchemaValidation, "a decision must be a JSON object"))?;
        let bad = |why: String| LlmError::new(ReasonClass::SchemaValidation, why);
        let text = |k: &str| -> Result<Option<String>, LlmError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(bad(format!("`{k}` must be a string, got {other}"))),
            }
        };
        let action = match obj.get("action").and_then(Value::as_str) {
            Some("tool_call") => Action::ToolCall,
            Some("ask") => Action::Ask,
            Some("done") => Action::Done,
            other => return Err(bad(format!("`action` must be tool_call, ask or done, got {}", other.map_or("nothing".into(), |s| format!("`{s}`"))))),
        };
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
        let d = AgentDecision { action, tool_name: text("tool_name")?.filter(|s| !s.is_empty()), arguments, message: text("message")? };
        validate_shape(&d).map_err(bad)?;
        self.check_tool(d)
    }

    /// Reads the text protocol: `CALL <tool> <json object>`, `ASK <question>`, `DONE <answer>`.
    pub fn parse_text(&self, raw: &str) -> Result<AgentDecision, LlmError> {
        parse_text_protocol(raw).map_err(|why| LlmError::new(ReasonClass::InvalidDecision, why)).and_then(|d| self.check_tool(d))
    }
}

fn validate_shape(d: &AgentDecision) -> Result<(), String> {
    match d.action {
        Action::ToolCall if d.tool_name.is_none() => Err("a tool_call needs `tool_name`".into()),
        Action::Ask if d.message.as_deref().is_none_or(|m| m.trim().is_empty()) => Err("an ask needs a `message` (the question)".into()),
        Action::Done if d.message.is_none() => Err("a done needs a `message` (the answer)".into()),
        _ => Ok(()),
    }
}

/// Strict reader of the text protocol. The keyword is upper case and alone on the first word;
/// a tool name is letters, digits, `_`, `-`, `.`; `CALL` arguments are one JSON object and
/// nothing after it; an `ASK` needs a question. Anything else is refused with the reason.
pub fn parse_text_protocol(raw: &str) -> Result<AgentDecision, String> {
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
                return Err("malformed CALL: no tool name".into());
            }
            if !tool.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
                return Err(format!("malformed CALL: `{tool}` is not a tool name"));
            }
            if args.is_empty() {
                return Err(format!("malformed CALL {tool}: no arguments (write {{}} for none)"));
            }
            let arguments = match serde_json::from_str::<Value>(args) {
                Ok(Value::Object(m)) => m,
                Ok(_) => return Err(format!("malformed CALL {tool}: the arguments must be a JSON object")),
                Err(e) => return Err(format!("malformed CALL {tool}: the arguments are not valid JSON ({e})")),
            };
            Ok(AgentDecision { action: Action::ToolCall, tool_name: Some(tool.to_owned()), arguments, message: None })
        }
        "ASK" if !rest.is_empty() => Ok(AgentDecision { action: Action::Ask, tool_name: None, arguments: Map::new(), message: Some(rest.to_owned()) }),
        "ASK" => Err("malformed ASK: no question".into()),
        "DONE" => Ok(AgentDecision { action: Action::Done, tool_name: None, arguments: Map::new(), message: Some(rest.to_owned()) }),
        "" => Err("empty reply: expected CALL, ASK or DONE".into()),
        other => {
            let shown: String = other.chars().take(40).collect();
            Err(format!("expected CALL, ASK or DONE, got `{shown}`"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_protocol() {
        let d = parse_text_protocol("CALL add {\"a\":2,\"b\":3}").unwrap();
        assert_eq!((d.action, d.tool_name.as_deref(), d.arguments.len()), (Action::ToolCall, Some("add"), 2));
        let d = parse_text_protocol("  CALL kb_search{\"q\": \"refund\"}\n").unwrap();
        assert_eq!(d.tool_name.as_deref(), Some("kb_search"));
        assert_eq!(parse_text_protocol("ASK Which order?").unwrap().message.as_deref(), Some("Which order?"));
        assert_eq!(parse_text_protocol("DONE 12").unwrap().message.as_deref(), Some("12"));
        assert_eq!(parse_text_protocol("DONE\nline one\nline two").unwrap().message.as_deref(), Some("line one\nline two"));
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
        assert_eq!(spec.parse_json(r#"{"action":"tool_call","tool_name":"add","arguments":{"a":1,"b":2}}"#).unwrap().arguments.len(), 2);
        assert_eq!(spec.parse_json(r#"{"action":"done","message":"3"}"#).unwrap().message.as_deref(), Some("3"));
        assert_eq!(spec.parse_json(r#"{"action":"tool_call","tool_name":"rm","arguments":{}}"#).unwrap_err().class, ReasonClass::UnknownTool);
        assert_eq!(spec.parse_json(r#"{"action":"dance"}"#).unwrap_err().class, ReasonClass::SchemaValidation);
        assert_eq!(spec.parse_json(r#"{"action":"ask"}"#).unwrap_err().class, ReasonClass::SchemaValidation);
        assert_eq!(spec.parse_json("nope").unwrap_err().class, ReasonClass::InvalidJson);
        assert_eq!(spec.parse_text("CALL rm {}").unwrap_err().class, ReasonClass::UnknownTool);
        assert_eq!(spec.parse_text("CALL add").unwrap_err().class, ReasonClass::InvalidDecision);
    }
}
