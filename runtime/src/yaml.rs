//! A YAML document as a tree of located nodes, and the small decoding vocabulary the loaders use.
//!
//! Catalogue files are decoded by hand from this tree rather than with `#[derive(Deserialize)]`:
//! serde stops at the first problem and loses the position of most of them, while an author wants
//! every problem of every file, each with `path:line:col`.

use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::diag::{Diagnostics, Pos};

#[derive(Debug, Clone)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub struct Key {
    pub pos: Pos,
    pub name: String,
}

fn pos_of(loc: &serde_saphyr::Location) -> Pos {
    Pos { line: loc.line().min(u32::MAX as u64) as u32, col: loc.column().min(u32::MAX as u64) as u32 }
}

struct RawValue(Value);

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawValue;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<RawValue, E> {
                Ok(RawValue(Value::Null))
            }
            fn visit_none<E>(self) -> Result<RawValue, E> {
                Ok(RawValue(Value::Null))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawValue, D::Error> {
                RawValue::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<RawValue, E> {
                Ok(RawValue(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<RawValue, E> {
                Ok(RawValue(Value::Int(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RawValue, E> {
                Ok(RawValue(Value::UInt(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RawValue, E> {
                Ok(RawValue(Value::Float(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<RawValue, E> {
                Ok(RawValue(Value::Str(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<RawValue, E> {
                Ok(RawValue(Value::Str(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<RawValue, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element::<Spanned<RawValue>>()? {
                    items.push(node_of(item));
                }
                Ok(RawValue(Value::Seq(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<RawValue, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = a.next_key::<Spanned<String>>()? {
                    let value = a.next_value::<Spanned<RawValue>>()?;
                    entries.push((Key { pos: pos_of(&key.referenced), name: key.value }, node_of(value)));
                }
                Ok(RawValue(Value::Map(entries)))
            }
        }
        d.deserialize_any(V)
    }
}

fn node_of(s: Spanned<RawValue>) -> Node {
    Node { pos: pos_of(&s.referenced), value: s.value.0 }
}

/// Parses one YAML document. A syntax error becomes one located diagnostic and `None`.
pub fn parse(path: &Path, text: &str, diags: &mut Diagnostics) -> Option<Node> {
    if text.trim().is_empty() {
        return Some(Node { pos: Pos { line: 1, col: 1 }, value: Value::Map(Vec::new()) });
    }
    // strict booleans: `yes`/`no`/`on` stay strings, as YAML 1.2 says; duplicate keys are errors.
    let options = serde_saphyr::options! { strict_booleans: true };
    match serde_saphyr::from_str_with_options::<Spanned<RawValue>>(text, options) {
        Ok(root) => Some(node_of(root)),
        Err(err) => {
            let pos = err.location().map(|l| pos_of(&l)).unwrap_or(Pos::FILE);
            diags.error(path, pos, format!("invalid YAML: {}", yaml_message(&err)));
            None
        }
    }
}

/// The parser's message without its own `line N column M:` prefix and source snippet.
fn yaml_message(err: &serde_saphyr::Error) -> String {
    // One line: the parser may wrap long messages.
    let full = err.without_snippet().to_string().split_whitespace().collect::<Vec<_>>().join(" ");
    let first = full.strip_prefix("error:").unwrap_or(&full).trim();
    // "line 3 column 4: illegal placement of ':' indicator" -> "illegal placement of ':' indicator"
    let msg = match first.strip_prefix("line ").and_then(|rest| rest.split_once(": ")) {
        Some((_, msg)) => msg,
        None => first,
    };
    // The position is already in front of the message; drop the parser's own copy of it.
    let is_position = |tail: &str| {
        tail.strip_prefix(" at line ")
            .and_then(|t| t.split_once(", column "))
            .is_some_and(|(l, c)| !l.is_empty() && !c.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) && c.bytes().all(|b| b.is_ascii_digit()))
    };
    let msg = match msg.rfind(" at line ") {
        Some(at) if is_position(&msg[at..]) => &msg[..at],
        _ => msg,
    };
    plain_words(msg)
}

/// The parser's messages that speak of its own internals, said in an author's words.
fn plain_words(msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("duplicate mapping key") {
        let key = rest.strip_prefix(": ").and_then(|r| r.split(", set DuplicateKeyPolicy").next()).filter(|k| !k.is_empty());
        return match key {
            Some(k) => format!("duplicate key `{k}`: a key may appear once in a mapping"),
            None => "duplicate key: a key may appear once in a mapping".into(),
        };
    }
    if let Some(breach) = msg.strip_prefix("budget breached: ") {
        // `Depth { depth: 65 }` → what the limit is about.
        let kind = breach.split([' ', '{']).next().unwrap_or_default();
        let what = match kind {
            "Depth" => "it nests mappings and lists too deeply",
            "Aliases" | "Anchors" | "AliasAnchorRatio" | "MergeKeys" => "it uses too many anchors, aliases or merge keys",
            "Events" | "Nodes" | "Documents" => "it has too many values",
            "ScalarBytes" | "CommentBytes" => "its text is too large",
            _ => "it exceeds the parser's limits",
        };
        // Keep where an alias was defined and used: that is where the author must look.
        let places: String = breach.split_once('}').map_or("", |(_, tail)| tail).split('(').skip(1).map(|p| format!(" ({}", p.trim_end())).collect();
        return format!("the file is refused: {what} (a limit that protects the runtime from hostile files){places}");
    }
    msg.to_owned()
}

impl Value {
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::UInt(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// Decoding context: the file being read and where its problems go.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub path: &'a Path,
    pub diags: &'a mut Diagnostics,
}

impl Ctx<'_> {
    pub fn error(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.error(self.path, pos, message);
    }

    pub fn warning(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.warning(self.path, pos, message);
    }

    /// A string value, or a located "expected a string" error.
    pub fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            other => {
                self.error(node.pos, format!("{what} must be a string, found {}", other.kind()));
                None
            }
        }
    }

    /// A non-empty identifier: letters, digits, `_`, `-`, `.`.
    pub fn ident(&mut self, node: &Node, what: &str) -> Option<String> {
        let s = self.string(node, what)?;
        if is_ident(&s) {
            Some(s)
        } else {
            self.error(node.pos, format!("{what} `{s}` is not a valid name (letters, digits, `_`, `-`, `.`)"));
            None
        }
    }

    pub fn bool(&mut self, node: &Node, what: &str) -> Option<bool> {
        match node.value {
            Value::Bool(b) => Some(b),
            ref other => {
                self.error(node.pos, format!("{what} must be true or false, found {}", other.kind()));
                None
            }
        }
    }

    /// A whole number within `min..=max`.
    pub fn uint(&mut self, node: &Node, what: &str, min: u64, max: u64) -> Option<u64> {
        let n = match node.value {
            Value::UInt(n) => Some(n),
            Value::Int(n) => u64::try_from(n).ok().or(Some(0)).filter(|_| n >= 0),
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                let found = match &node.value {
                    Value::Int(n) => n.to_string(),
                    Value::UInt(n) => n.to_string(),
                    other => other.kind().to_owned(),
                };
                self.error(node.pos, format!("{what} must be a whole number from {min} to {max}, found {found}"));
                None
            }
        }
    }

    /// Opens a mapping for field-by-field reading; `None` (with an error) when it is not one.
    pub fn map<'n>(&mut self, node: &'n Node, what: &str) -> Option<Fields<'n>> {
        match &node.value {
            Value::Map(entries) => Some(Fields { pos: node.pos, entries, used: vec![false; entries.len()], known: Vec::new(), what: what.to_owned() }),
            other => {
                self.error(node.pos, format!("{what} must be a mapping, found {}", other.kind()));
                None
            }
        }
    }

    pub fn seq<'n>(&mut self, node: &'n Node, what: &str) -> Option<&'n [Node]> {
        match &node.value {
            Value::Seq(items) => Some(items),
            other => {
                self.error(node.pos, format!("{what} must be a list, found {}", other.kind()));
                None
            }
        }
    }
}

pub fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// A mapping being read field by field; [`Fields::finish`] reports the keys nobody asked for.
#[derive(Debug)]
pub struct Fields<'n> {
    pub pos: Pos,
    entries: &'n [(Key, Node)],
    used: Vec<bool>,
    known: Vec<&'static str>,
    what: String,
}

impl<'n> Fields<'n> {
    pub fn get(&mut self, name: &'static str) -> Option<&'n Node> {
        self.known.push(name);
        let idx = self.entries.iter().position(|(k, _)| k.name == name)?;
        self.used[idx] = true;
        Some(&self.entries[idx].1)
    }

    /// A field that must be present; a missing one is reported at the mapping.
    pub fn require(&mut self, ctx: &mut Ctx<'_>, name: &'static str) -> Option<&'n Node> {
        let node = self.get(name);
        if node.is_none() {
            ctx.error(self.pos, format!("{} is missing the required field `{name}`", self.what));
        }
        node
    }

    /// Reports every key that no `get`/`require` asked for.
    pub fn finish(self, ctx: &mut Ctx<'_>) {
        for (idx, (key, _)) in self.entries.iter().enumerate() {
            if !self.used[idx] {
                ctx.error(key.pos, format!("unknown field `{}` in {}; expected one of: {}", key.name, self.what, self.known.join(", ")));
            }
        }
    }
}

/// The entries of a mapping used as a dictionary (`routes:`, `capabilities:` ...), keys checked as names.
pub fn entries<'n>(ctx: &mut Ctx<'_>, node: &'n Node, what: &str) -> Vec<(&'n Key, &'n Node)> {
    match &node.value {
        Value::Map(entries) => entries
            .iter()
            .filter(|(key, _)| {
                let ok = is_ident(&key.name);
                if !ok {
                    ctx.error(key.pos, format!("{what} name `{}` is not a valid name (letters, digits, `_`, `-`, `.`)", key.name));
                }
                ok
            })
            .map(|(k, v)| (k, v))
            .collect(),
        Value::Null => Vec::new(),
        other => {
            ctx.error(node.pos, format!("`{what}` section must be a mapping of names to definitions, found {}", other.kind()));
            Vec::new()
        }
    }
}

/// Converts a subtree to JSON (for schemas). Key order is kept as written.
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(n) => J::from(*n),
        Value::UInt(n) => J::from(*n),
        Value::Float(f) => serde_json::Number::from_f64(*f).map(J::Number).unwrap_or(J::Null),
        Value::Str(s) => J::String(s.clone()),
        Value::Seq(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => J::Object(entries.iter().map(|(k, v)| (k.name.clone(), to_json(v))).collect()),
    }
}
