//! A JSON reader that accepts exactly what Python's `json.loads` accepts.
//!
//! The reference runtime parsed model replies with `json.loads` before Pydantic saw them, so the
//! edges matter for parity: `NaN`, `Infinity` and `-Infinity` are accepted, integers have
//! arbitrary precision, duplicate keys keep the last value, raw control characters inside strings
//! are rejected, and nothing may follow the value but whitespace.

use std::borrow::Cow;

/// A parsed value. Integers keep their exact decimal digits. Strings borrow from the text
/// unless an escape made them differ from it: a borrowed one holds no character that JSON
/// writes escaped (a quote, a backslash or a control character would have ended or broken it).
#[derive(Debug, Clone, PartialEq)]
pub enum PyJson<'a> {
    Null,
    Bool(bool),
    Int(BigInt),
    Float(f64),
    Str(Cow<'a, str>),
    List(Vec<PyJson<'a>>),
    Object(Vec<(Cow<'a, str>, PyJson<'a>)>),
}

/// An arbitrary-precision integer as sign and canonical decimal digits (no leading zeros; zero is
/// never negative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigInt {
    pub negative: bool,
    pub digits: String,
}

impl BigInt {
    pub fn new(negative: bool, digits: &str) -> BigInt {
        let trimmed = digits.trim_start_matches('0');
        let digits = if trimmed.is_empty() { "0" } else { trimmed };
        BigInt { negative: negative && digits != "0", digits: digits.to_owned() }
    }

    pub fn from_i64(n: i64) -> BigInt {
        BigInt::new(n < 0, &n.unsigned_abs().to_string())
    }

    /// The nearest `f64`, as Python's `float(int)` (correctly rounded; huge values become infinite).
    pub fn to_f64(&self) -> f64 {
        let s = if self.negative { format!("-{}", self.digits) } else { self.digits.clone() };
        s.parse::<f64>().unwrap_or(f64::NAN)
    }

    pub fn to_json_text(&self) -> String {
        if self.negative { format!("-{}", self.digits) } else { self.digits.clone() }
    }

    pub fn is_zero(&self) -> bool {
        self.digits == "0"
    }

    pub fn is_one(&self) -> bool {
        !self.negative && self.digits == "1"
    }
}

impl PyJson<'_> {
    pub fn kind(&self) -> &'static str {
        match self {
            PyJson::Null => "null",
            PyJson::Bool(_) => "boolean",
            PyJson::Int(_) => "integer",
            PyJson::Float(_) => "number",
            PyJson::Str(_) => "string",
            PyJson::List(_) => "array",
            PyJson::Object(_) => "object",
        }
    }
}

/// Why a text is not JSON, with the byte offset where reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub offset: usize,
    pub message: &'static str,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.offset)
    }
}

// Python's recursion limit makes deeply nested input fail; bound it the same way (as invalid JSON).
const MAX_DEPTH: usize = 500;

pub fn parse(text: &str) -> Result<PyJson<'_>, JsonError> {
    let mut p = Parser { text, s: text.as_bytes(), i: 0, depth: 0 };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("extra data after the value"));
    }
    Ok(v)
}

/// Reads `text` as [`parse`] does, when the value is an object keeping only the members that
/// `index` places (`out[i]`, the last of a repeated key, as a dict keeps it; the others are read
/// and dropped): a structured reply is looked up field by field, without a list of its members.
/// `Ok(Err(kind))`: valid JSON, but not an object.
pub fn parse_object_fields<'a>(
    text: &'a str,
    index: impl Fn(&str) -> Option<usize>,
    out: &mut [Option<PyJson<'a>>],
) -> Result<Result<(), &'static str>, JsonError> {
    let mut p = Parser { text, s: text.as_bytes(), i: 0, depth: 0 };
    p.ws();
    let kind = if p.s.get(p.i) == Some(&b'{') {
        p.depth = 1;
        p.members(|key, value| {
            if let Some(i) = index(&key) {
                out[i] = Some(value);
            }
        })?;
        None
    } else {
        Some(p.value()?.kind())
    };
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("extra data after the value"));
    }
    Ok(kind.map_or(Ok(()), Err))
}

struct Parser<'a> {
    /// The text, for slicing runs of a string out without validating them again.
    text: &'a str,
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, message: &'static str) -> JsonError {
        JsonError { offset: self.i, message }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<PyJson<'a>, JsonError> {
        match self.s.get(self.i) {
            None => Err(self.err("expecting a value")),
            Some(b'{') => self.nested(Self::object),
            Some(b'[') => self.nested(Self::list),
            Some(b'"') => Ok(PyJson::Str(self.string()?)),
            Some(b'n') if self.eat("null") => Ok(PyJson::Null),
            Some(b't') if self.eat("true") => Ok(PyJson::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(PyJson::Bool(false)),
            Some(b'N') if self.eat("NaN") => Ok(PyJson::Float(f64::NAN)),
            Some(b'I') if self.eat("Infinity") => Ok(PyJson::Float(f64::INFINITY)),
            Some(b'-') if self.s[self.i..].starts_with(b"-Infinity") => {
                self.i += "-Infinity".len();
                Ok(PyJson::Float(f64::NEG_INFINITY))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.err("expecting a value")),
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Result<PyJson<'a>, JsonError>) -> Result<PyJson<'a>, JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        let v = f(self);
        self.depth -= 1;
        v
    }

    fn object(&mut self) -> Result<PyJson<'a>, JsonError> {
        let mut entries: Vec<(Cow<'a, str>, PyJson<'a>)> = Vec::new();
        self.members(|key, value| {
            // dict semantics: a repeated key keeps its first position and takes the last value.
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => entries.push((key, value)),
            }
        })?;
        Ok(PyJson::Object(entries))
    }

    /// Reads an object's members (the reader is at its `{`), handing each to `each` in order.
    fn members(&mut self, mut each: impl FnMut(Cow<'a, str>, PyJson<'a>)) -> Result<(), JsonError> {
        self.i += 1;
        self.ws();
        if self.eat("}") {
            return Ok(());
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(self.err("expecting a property name in double quotes"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(":") {
                return Err(self.err("expecting ':' delimiter"));
            }
            self.ws();
            let value = self.value()?;
            each(key, value);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
                return Ok(());
            }
            return Err(self.err("expecting ',' delimiter"));
        }
    }

    fn list(&mut self) -> Result<PyJson<'a>, JsonError> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(PyJson::List(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("]") {
                return Ok(PyJson::List(items));
            }
            return Err(self.err("expecting ',' delimiter"));
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.s.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<PyJson<'a>, JsonError> {
        let start = self.i;
        let negative = self.eat("-");
        let int_start = self.i;
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("expecting a value")),
        }
        let int_end = self.i;
        let mut is_float = false;
        if self.s.get(self.i) == Some(&b'.') && matches!(self.s.get(self.i + 1), Some(b'0'..=b'9')) {
            self.i += 1;
            self.digits();
            is_float = true;
        }
        if let Some(b'e' | b'E') = self.s.get(self.i) {
            let save = self.i;
            self.i += 1;
            if let Some(b'+' | b'-') = self.s.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                self.i = save; // `1e` is the number 1 followed by junk, as in Python
            } else {
                is_float = true;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| self.err("invalid number"))?;
        if is_float {
            // Rust's parser rounds correctly and overflows to infinity, like Python's float().
            text.parse::<f64>().map(PyJson::Float).map_err(|_| self.err("invalid number"))
        } else {
            let digits = std::str::from_utf8(&self.s[int_start..int_end]).map_err(|_| self.err("invalid number"))?;
            Ok(PyJson::Int(BigInt::new(negative, digits)))
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let chunk = self.s.get(self.i..self.i + 4).ok_or_else(|| self.err("invalid \\uXXXX escape"))?;
        let text = std::str::from_utf8(chunk).map_err(|_| self.err("invalid \\uXXXX escape"))?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.err("invalid \\uXXXX escape"));
        }
        self.i += 4;
        u32::from_str_radix(text, 16).map_err(|_| self.err("invalid \\uXXXX escape"))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            // The next quote, backslash or control character: where the run of plain text ends.
            self.i += super::scan::plain_run(&self.s[self.i..]);
            // The input is a &str and the run ends at an ASCII byte (or the end): a char boundary.
            let run = self.text.get(start..self.i).ok_or_else(|| self.err("invalid UTF-8"))?;
            match self.s.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    if out.is_empty() {
                        // No escape before: the common case, the text itself.
                        return Ok(Cow::Borrowed(run));
                    }
                    out.push_str(run);
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    out.push_str(run);
                    self.i += 1;
                    let esc = *self.s.get(self.i).ok_or_else(|| self.err("unterminated string"))?;
                    self.i += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) && self.s[self.i..].starts_with(b"\\u") {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                } else {
                                    self.i = save;
                                    hi
                                }
                            } else {
                                hi
                            };
                            // A lone surrogate is legal for Python but cannot be serialised back to
                            // UTF-8 by the reference either; we reject it as invalid JSON.
                            out.push(char::from_u32(code).ok_or_else(|| self.err("lone surrogate in string"))?);
                        }
                        _ => return Err(self.err("invalid escape")),
                    }
                }
                Some(_) => return Err(self.err("invalid control character in string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_fields_are_read_as_a_dict_keeps_them() {
        let names = ["a", "b"];
        let index = |k: &str| names.iter().position(|n| *n == k);
        let mut out = [None, None];
        let text = r#" {"a": 1, "x": {"deep": [1, 2]}, "a": "last", "b": null} "#;
        assert_eq!(parse_object_fields(text, index, &mut out), Ok(Ok(())));
        assert_eq!(out, [Some(PyJson::Str("last".into())), Some(PyJson::Null)]);
        // Not an object, but JSON: its kind; not JSON: the same error as `parse`.
        let mut out = [None, None];
        assert_eq!(parse_object_fields("[1]", index, &mut out), Ok(Err("array")));
        for bad in [r#"{"a": 1,}"#, r#"{"a": 1} x"#, "{", &format!("{}1{}", "{\"a\":[".repeat(600), "]}".repeat(600))] {
            assert_eq!(parse_object_fields(bad, index, &mut [None, None]).err(), parse(bad).err(), "{bad}");
        }
    }

    #[test]
    fn python_extensions_and_edges() {
        assert_eq!(parse("NaN").map(|v| matches!(v, PyJson::Float(f) if f.is_nan())), Ok(true));
        assert_eq!(parse("-Infinity"), Ok(PyJson::Float(f64::NEG_INFINITY)));
        assert_eq!(parse("1e309"), Ok(PyJson::Float(f64::INFINITY)));
        assert_eq!(parse("-0"), Ok(PyJson::Int(BigInt::new(false, "0"))));
        assert_eq!(parse("123456789012345678901234567890"), Ok(PyJson::Int(BigInt::new(false, "123456789012345678901234567890"))));
        assert_eq!(
            parse(r#"{"a":1,"b":2,"a":3}"#),
            Ok(PyJson::Object(vec![("a".into(), PyJson::Int(BigInt::from_i64(3))), ("b".into(), PyJson::Int(BigInt::from_i64(2)))]))
        );
        assert_eq!(parse(r#""\ud83d\ude00""#), Ok(PyJson::Str("😀".into())));
        assert!(parse("\"a\u{1}\"").is_err());
        assert!(parse("").is_err());
        assert!(parse("{} x").is_err());
        assert!(parse("01").is_err());
        assert!(parse("[1,]").is_err());
        assert!(parse(&"[".repeat(10_000)).is_err());
    }
}
