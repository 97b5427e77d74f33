//! Structured output with the reference's exact semantics.
//!
//! A raw model reply goes through three steps, each matching the Python runtime byte for byte:
//! [`pyjson`] reads it as `json.loads` would; [`validate`] coerces it as a Pydantic v2 model in
//! lax mode would (unknown keys ignored, optional fields `null`); [`decode_reply`] serialises it
//! as `model_dump_json()` does (schema key order, Python-style floats) and unwraps text envelopes.
//! The executor, every backend and `fabric validate` share this one path.

mod number;
pub mod pyjson;
pub mod scan;
mod schema;

pub use schema::{Field, FieldType, FlatSchema, PropertyError, Scalar, SchemaError};

use pyjson::{BigInt, PyJson};

/// Why a reply was refused. Both are final: a retry of the same prompt would not fix them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    InvalidJson(String),
    SchemaValidation(String),
}

impl DecodeError {
    pub fn reason_class(&self) -> &'static str {
        match self {
            DecodeError::InvalidJson(_) => "invalid_json",
            DecodeError::SchemaValidation(_) => "schema_validation",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            DecodeError::InvalidJson(d) | DecodeError::SchemaValidation(d) => d,
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason_class(), self.detail())
    }
}

/// A validated reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// `model_dump_json()` of the validated model.
    pub compact: String,
    /// The string of a text envelope (`text` first, else `message`), when it holds one.
    pub unwrapped: Option<String>,
}

impl Decoded {
    /// What the stage stores in its slot and appends to notes.
    pub fn slot_value(&self) -> &str {
        self.unwrapped.as_deref().unwrap_or(&self.compact)
    }
}

/// Reads, validates and serialises one raw reply against a bindable schema.
pub fn decode_reply(schema: &FlatSchema, raw: &str) -> Result<Decoded, DecodeError> {
    let fields = schema.fields();
    // The reply's value of each field (most schemas have a few: no list is allocated for them).
    let mut few: [Option<PyJson<'_>>; 8] = Default::default();
    let mut many = Vec::new();
    let found: &mut [Option<PyJson<'_>>] = if fields.len() <= few.len() {
        &mut few[..fields.len()]
    } else {
        many.resize(fields.len(), None);
        &mut many
    };
    let index = |key: &str| fields.iter().position(|f| f.name() == key);
    match pyjson::parse_object_fields(raw, index, found) {
        Err(e) => return Err(DecodeError::InvalidJson(e.to_string())),
        Ok(Err(kind)) => return Err(DecodeError::SchemaValidation(format!("expected an object, got {kind}"))),
        Ok(Ok(())) => {}
    }
    let mut compact = String::with_capacity(raw.len() + 16);
    compact.push('{');
    let mut text: Option<String> = None;
    let mut message: Option<String> = None;
    let mut problems = Vec::new();
    for (idx, field) in schema.fields().iter().enumerate() {
        if idx > 0 {
            compact.push(',');
        }
        // Written once, when the schema was read.
        compact.push_str(field.name_json());
        compact.push(':');
        match validate(field, found[idx].as_ref()) {
            Ok(out) => {
                if let Out::Str(s, _) = &out {
                    match field.name() {
                        "text" => text = Some((*s).to_owned()),
                        "message" => message = Some((*s).to_owned()),
                        _ => {}
                    }
                }
                out.write(&mut compact);
            }
            Err(why) => problems.push(format!("`{}`: {why}", field.name())),
        }
    }
    compact.push('}');
    if !problems.is_empty() {
        return Err(DecodeError::SchemaValidation(problems.join("; ")));
    }
    let unwrapped = if schema.is_text_envelope() { text.or(message) } else { None };
    Ok(Decoded { compact, unwrapped })
}

/// A validated field value, ready to serialise; strings and enum members borrowed from the
/// parsed reply and the schema (nothing is copied before it is written out).
enum Out<'a> {
    Null,
    Bool(bool),
    Int(BigInt),
    Float(f64),
    /// A string, and whether it is plain: borrowed from the reply as it was written, so with
    /// nothing to escape (no scan needed).
    Str(&'a str, bool),
    /// An enum member, serialised as written in the schema.
    Json(&'a serde_json::Value),
    List(Vec<Out<'a>>),
}

impl Out<'_> {
    fn write(&self, buf: &mut String) {
        match self {
            Out::Null => buf.push_str("null"),
            Out::Bool(b) => buf.push_str(if *b { "true" } else { "false" }),
            Out::Int(n) => buf.push_str(&n.to_json_text()),
            Out::Float(f) => number::push_float(buf, *f),
            Out::Str(s, true) => push_quoted(buf, s),
            Out::Str(s, false) => push_json_string(buf, s),
            Out::Json(v) => match v {
                serde_json::Value::Number(n) if n.is_f64() => number::push_float(buf, n.as_f64().unwrap_or(f64::NAN)),
                serde_json::Value::String(s) => push_json_string(buf, s),
                other => buf.push_str(&other.to_string()),
            },
            Out::List(items) => {
                buf.push('[');
                for (idx, item) in items.iter().enumerate() {
                    if idx > 0 {
                        buf.push(',');
                    }
                    item.write(buf);
                }
                buf.push(']');
            }
        }
    }
}

/// `s` in quotes, as it is: a string known to need no escape.
fn push_quoted(buf: &mut String, s: &str) {
    buf.reserve(s.len() + 2);
    buf.push('"');
    buf.push_str(s);
    buf.push('"');
}

pub(crate) fn push_json_string(buf: &mut String, s: &str) {
    // Escaped exactly as serde_json and pydantic-core do: `"`, `\`, and controls below 0x20
    // (`\b \t \n \f \r` short, the others `\u00xx`); everything else as it is. Written in
    // place: every structured reply goes through here, field by field.
    // Most strings have nothing to escape.
    if !scan::needs_json_escape(s.as_bytes()) {
        push_quoted(buf, s);
        return;
    }
    buf.reserve(s.len() + 2);
    buf.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        buf.push_str(&s[start..i]);
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            buf.push_str("\\u00");
            buf.push(char::from(HEX[usize::from(b >> 4)]));
            buf.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            buf.push_str(short);
        }
        start = i + 1;
    }
    buf.push_str(&s[start..]);
    buf.push('"');
}

/// Why one reply field does not validate, in Pydantic's words (shown after the field's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum FieldError {
    #[error("field required")]
    Required,
    #[error("input should not be null")]
    Null,
    /// The kind of JSON value the field got instead.
    #[error("input should be a valid list, got {0}")]
    NotAList(&'static str),
    /// What the field takes, and the kind of value it got.
    #[error("input should be {want}, got {got}")]
    Wrong { want: &'static str, got: &'static str },
    #[error("the integer is too large to convert to float")]
    TooLargeForFloat,
    #[error("`{0}` is not a valid number")]
    NotANumber(String),
    #[error("{0} is not a whole number within range")]
    NotWhole(f64),
    #[error("`{0}` is not a valid integer")]
    NotAnInteger(String),
    #[error("`{0}` is not a valid boolean")]
    NotABoolean(String),
    /// The enum's members.
    #[error("input should be one of {}", serde_json::Value::Array(.0.clone()))]
    NotAMember(Vec<serde_json::Value>),
}

fn validate<'a>(field: &'a Field, value: Option<&'a PyJson>) -> Result<Out<'a>, FieldError> {
    match value {
        None | Some(PyJson::Null) if !field.required => Ok(Out::Null),
        None => Err(FieldError::Required),
        Some(PyJson::Null) => Err(FieldError::Null),
        Some(v) => match &field.ty {
            FieldType::Scalar(s) => scalar(s, v),
            FieldType::Array(s) => match v {
                PyJson::List(items) => items.iter().map(|item| scalar(s, item)).collect::<Result<Vec<_>, _>>().map(Out::List),
                other => Err(FieldError::NotAList(other.kind())),
            },
        },
    }
}

fn scalar<'a>(ty: &'a Scalar, v: &'a PyJson) -> Result<Out<'a>, FieldError> {
    let wrong = |want: &'static str| Err(FieldError::Wrong { want, got: v.kind() });
    match ty {
        Scalar::String => match v {
            PyJson::Str(s) => Ok(Out::Str(s, matches!(s, std::borrow::Cow::Borrowed(_)))),
            _ => wrong("a valid string"),
        },
        Scalar::Number => match v {
            PyJson::Float(f) => Ok(Out::Float(*f)),
            // Python's `float(int)` overflows instead of giving infinity (a float literal such as
            // `1e400` is infinity already, and is kept).
            PyJson::Int(n) => Some(n.to_f64()).filter(|f| f.is_finite()).map(Out::Float).ok_or(FieldError::TooLargeForFloat),
            PyJson::Bool(b) => Ok(Out::Float(if *b { 1.0 } else { 0.0 })),
            PyJson::Str(s) => number::parse_float_str(s).map(Out::Float).ok_or_else(|| FieldError::NotANumber(s.to_string())),
            _ => wrong("a valid number"),
        },
        Scalar::Integer => match v {
            PyJson::Int(n) => Ok(Out::Int(n.clone())),
            PyJson::Float(f) => number::float_to_int(*f).map(|n| Out::Int(BigInt::from_i64(n))).ok_or(FieldError::NotWhole(*f)),
            PyJson::Bool(b) => Ok(Out::Int(BigInt::from_i64(i64::from(*b)))),
            PyJson::Str(s) => number::parse_int_str(s).map(Out::Int).ok_or_else(|| FieldError::NotAnInteger(s.to_string())),
            _ => wrong("a valid integer"),
        },
        Scalar::Boolean => match v {
            PyJson::Bool(b) => Ok(Out::Bool(*b)),
            PyJson::Int(n) if n.is_zero() || n.is_one() => Ok(Out::Bool(n.is_one())),
            PyJson::Float(f) if *f == 0.0 || *f == 1.0 => Ok(Out::Bool(*f == 1.0)),
            PyJson::Str(s) => match s.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "y" | "t" | "1" => Ok(Out::Bool(true)),
                "false" | "no" | "off" | "n" | "f" | "0" => Ok(Out::Bool(false)),
                _ => Err(FieldError::NotABoolean(s.to_string())),
            },
            _ => wrong("a valid boolean"),
        },
        Scalar::Enum(members) => members.iter().find(|m| enum_matches(m, v)).map(Out::Json).ok_or_else(|| FieldError::NotAMember(members.clone())),
    }
}

/// `Literal[...]` membership as Python's `==` decides it: strings only equal strings, while
/// numbers and booleans compare by value (`true` and `1.0` both match a member `1`).
fn enum_matches(member: &serde_json::Value, v: &PyJson) -> bool {
    use serde_json::Value as J;
    let member_number = match member {
        J::Number(n) => n.as_f64(),
        J::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    };
    let value_number = match v {
        PyJson::Int(n) => Some(n.to_f64()),
        PyJson::Float(f) => Some(*f),
        PyJson::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    };
    match (member, v) {
        (J::String(m), PyJson::Str(s)) => m == s,
        (J::Null, PyJson::Null) => true,
        _ => matches!((member_number, value_number), (Some(a), Some(b)) if a == b),
    }
}

#[cfg(test)]
mod tests {
    use super::push_json_string;

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut samples: Vec<String> = (0u8..0x80).map(|b| format!("a{}b", char::from(b))).collect();
        samples.extend(["", "plain", "é ü \u{2028} \u{7f} 😀", "\"\\\"", "\u{0}\u{1f}\n"].map(String::from));
        for s in samples {
            let mut ours = String::new();
            push_json_string(&mut ours, &s);
            assert_eq!(ours, serde_json::to_string(&s).unwrap(), "{s:?}");
        }
    }
}
