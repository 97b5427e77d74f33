//! A tool's JSON response made compact in one pass, without building a `serde_json::Value`.
//!
//! Why: a tool call's answer becomes text for a note or a prompt, and the round trip through a
//! `Value` (a map, a key and a string per member, a vector per array, then a second walk to
//! write it) was most of the allocations of a loopback tool call; under many concurrent calls
//! those allocations, freed on another worker thread, cost more than the parse. Here the
//! deserializer drives `serde_json`'s own serializer directly, so every scalar is written by the
//! same code as `Value::to_string` writes it (the same escapes, the same float digits), and the
//! input is accepted or refused by the same parser (the same nesting limit, trailing text an
//! error). The differences a `Value` makes are detected, and then the `Value` path is taken: a
//! key repeated in an object (the map keeps the first place and the last value), and an object
//! whose first key is one of serde_json's private tokens (with its `raw_value` feature, which
//! other crates of the build turn on, `{"$serde_json::private::RawValue":"[1, 2]"}` is `[1,2]`).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;

use serde::Serializer as _;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};

/// `serde_json::from_str::<Value>(raw)` then `to_string()`, exactly: `None` when `raw` is not
/// JSON. (An object repeating a key, or opening with one of serde_json's private tokens, is
/// handed to that very expression.)
pub(super) fn compact_json(raw: &str) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let to_value = Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(raw);
    match (Writer { out: &mut out, to_value: &to_value }).deserialize(&mut de).and_then(|()| de.end()) {
        // Only serde_json's serializer and the punctuation here wrote `out`: UTF-8.
        Ok(()) => String::from_utf8(out).ok(),
        Err(_) if to_value.get() => serde_json::from_str::<serde_json::Value>(raw).ok().map(|v| v.to_string()),
        Err(_) => None,
    }
}

/// First keys with which serde_json's `Value` reads an object as something other than a map.
const PRIVATE_TOKENS: [&str; 2] = ["$serde_json::private::RawValue", "$serde_json::private::Number"];

/// Keys of one object compared one by one up to this many (kept on the stack); past it, hashed.
const LINEAR_KEYS: usize = 8;

/// Writes one JSON value compactly into `out` as it is read; `to_value` is set when an object
/// repeats a key or opens with a private token (the value is then refused, for the caller to
/// take the `Value` path).
struct Writer<'o> {
    out: &'o mut Vec<u8>,
    to_value: &'o Cell<bool>,
}

impl Writer<'_> {
    fn ser(&mut self) -> serde_json::Serializer<&mut Vec<u8>> {
        serde_json::Serializer::new(&mut *self.out)
    }

    fn inner(&mut self) -> Writer<'_> {
        Writer { out: &mut *self.out, to_value: self.to_value }
    }
}

fn written<E: serde::de::Error>(r: Result<(), serde_json::Error>) -> Result<(), E> {
    // Writing into a vector does not fail; were it to, the value is refused, not cut short.
    r.map_err(E::custom)
}

impl<'de> DeserializeSeed<'de> for Writer<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Writer<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: serde::de::Error>(mut self, v: bool) -> Result<(), E> {
        written(self.ser().serialize_bool(v))
    }
    fn visit_i64<E: serde::de::Error>(mut self, v: i64) -> Result<(), E> {
        written(self.ser().serialize_i64(v))
    }
    fn visit_u64<E: serde::de::Error>(mut self, v: u64) -> Result<(), E> {
        written(self.ser().serialize_u64(v))
    }
    fn visit_f64<E: serde::de::Error>(mut self, v: f64) -> Result<(), E> {
        // As `Value` keeps it: a float that is no JSON number becomes null.
        if v.is_finite() { written(self.ser().serialize_f64(v)) } else { written(self.ser().serialize_unit()) }
    }
    fn visit_str<E: serde::de::Error>(mut self, v: &str) -> Result<(), E> {
        written(self.ser().serialize_str(v))
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        written(self.ser().serialize_unit())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.out.push(b'[');
        let mut first = true;
        loop {
            let at = self.out.len();
            if !first {
                self.out.push(b',');
            }
            if seq.next_element_seed(self.inner())?.is_none() {
                // No element after all: the comma goes.
                self.out.truncate(at);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.out.push(b'{');
        let mut few: [Cow<'de, str>; LINEAR_KEYS] = Default::default();
        let mut count = 0;
        let mut many: HashSet<Cow<'de, str>, foldhash::fast::RandomState> = HashSet::default();
        while let Some(key) = map.next_key_seed(Key)? {
            let repeated = if count < LINEAR_KEYS {
                let seen = few[..count].contains(&key);
                few[count] = key.clone();
                seen
            } else {
                if many.is_empty() {
                    many.extend(few.iter().cloned());
                }
                !many.insert(key.clone())
            };
            // serde_json's `Value` reads an object whose first key is one of its private tokens
            // as something else (with the `raw_value` feature, which crates beside this one turn
            // on: the member's string parsed as JSON): that object goes the `Value` way too.
            if repeated || (count == 0 && PRIVATE_TOKENS.contains(&&*key)) {
                self.to_value.set(true);
                return Err(A::Error::custom("an object repeats a key, or is one of serde_json's tokens"));
            }
            if count > 0 {
                self.out.push(b',');
            }
            count += 1;
            written::<A::Error>(self.ser().serialize_str(&key))?;
            self.out.push(b':');
            map.next_value_seed(self.inner())?;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// An object key, borrowed from the input unless an escape changed it.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::compact_json;

    fn reference(raw: &str) -> Option<String> {
        serde_json::from_str::<serde_json::Value>(raw).ok().map(|v| v.to_string())
    }

    #[test]
    fn the_same_text_as_a_value_round_trip() {
        let cases = [
            r#"{"hits":[{"id":1,"title":"Result for q"}]}"#,
            " { \"a\" : [ 1 , 2.50 , -0 , -0.0 , 1e5 , 1E-7 , 12345678901234567890 , -9223372036854775808 ] } ",
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"k":{"x":1,"x":2},"y":[{"z":1,"z":{"w":2}}]}"#,
            r#""\u00e9\ud83d\ude00\n\t\"\\\/\u0001""#,
            r#"{"\u0061":1,"a":2}"#,
            r#"{"é":"\u00e9","\n":null}"#,
            "[]",
            "{}",
            "[[],{},[{}]]",
            "true",
            "null",
            "1.7976931348623157e308",
            "5e-324",
            "0.1",
            "123456789.123456789",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1e400",
            "\"\\ud800\"",
            "[1] x",
            "",
            "nul",
            "NaN",
            "\"a\u{1}\"",
            "[1,2",
            // serde_json's private tokens as a first key (`raw_value` is on in this build).
            r#"{"$serde_json::private::RawValue":"[1, 2]"}"#,
            r#"[{"$serde_json::private::RawValue":"{\"a\":1}"}]"#,
            r#"{"$serde_json::private::Raw\u0056alue":"true"}"#,
            r#"{"$serde_json::private::RawValue":1}"#,
            r#"{"$serde_json::private::RawValue":"1","b":2}"#,
            r#"{"a":1,"$serde_json::private::RawValue":"1"}"#,
            r#"{"$serde_json::private::Number":"1"}"#,
        ];
        for raw in cases {
            assert_eq!(compact_json(raw), reference(raw), "{raw:?}");
        }
        // Many keys (the hashed check) with a repeat far in, and without one.
        let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        for raw in [format!("{{{}}}", many.join(",")), format!("{{{},\"k3\":true}}", many.join(","))] {
            assert_eq!(compact_json(&raw), reference(&raw), "{raw}");
        }
        // Nesting past serde_json's limit is refused by both.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(compact_json(&deep), None);
        assert_eq!(reference(&deep), None);
    }

    /// Random JSON-ish texts (valid and broken, repeated keys, escapes, numbers, whitespace):
    /// the one-pass path answers exactly what the `Value` round trip answers.
    #[test]
    fn random_texts_agree_with_a_value_round_trip() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        const ATOMS: &[&str] = &[
            "0",
            "-0",
            "1",
            "-17",
            "3.25",
            "1e3",
            "-2.5E-3",
            "18446744073709551615",
            "18446744073709551616",
            "true",
            "false",
            "null",
            "\"\"",
            "\"a\"",
            "\"\\u00e9\"",
            "\"\\n\\\"\"",
            "\"é€😀\"",
            "\"\\ud83d\\ude00\"",
            "01",
            "1.",
            "\"\\x\"",
        ];
        const KEYS: &[&str] = &["\"a\"", "\"b\"", "\"\\u0061\"", "\"é\"", "\"\"", "\"c d\""];
        fn value(next: &mut impl FnMut(u64) -> u64, out: &mut String, depth: u32) {
            let ws = |next: &mut dyn FnMut(u64) -> u64, out: &mut String| {
                if next(4) == 0 {
                    out.push_str([" ", "\n", "\t ", "\r\n"][next(4) as usize]);
                }
            };
            match if depth > 4 { 0 } else { next(3) } {
                0 => out.push_str(ATOMS[next(ATOMS.len() as u64) as usize]),
                1 => {
                    out.push('[');
                    for i in 0..next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        ws(next, out);
                        value(next, out, depth + 1);
                    }
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    for i in 0..next(5) {
                        if i > 0 {
                            out.push(',');
                        }
                        ws(next, out);
                        out.push_str(KEYS[next(KEYS.len() as u64) as usize]);
                        out.push(':');
                        value(next, out, depth + 1);
                    }
                    out.push('}');
                }
            }
        }
        let (mut valid, mut repeats) = (0, 0);
        for _ in 0..20_000 {
            let mut raw = String::new();
            value(&mut next, &mut raw, 0);
            // Now and then a broken text: a character dropped, or something after the value.
            match next(10) {
                0 if !raw.is_empty() => {
                    let at = next(raw.len() as u64) as usize;
                    if raw.is_char_boundary(at) && raw.is_char_boundary(at + 1) {
                        raw.remove(at);
                    }
                }
                1 => raw.push_str([" ", " x", ",", "]"][next(4) as usize]),
                _ => {}
            }
            let expected = reference(&raw);
            valid += usize::from(expected.is_some());
            repeats += usize::from(expected.is_some() && serde_json::from_str::<serde_json::Value>(&raw).is_ok_and(|_| has_repeat(&raw)));
            assert_eq!(compact_json(&raw), expected, "{raw:?}");
        }
        // The texts cover both sides: refused ones, and accepted ones with repeated keys.
        assert!(valid > 5_000 && valid < 19_000, "{valid} of 20,000 valid");
        assert!(repeats > 500, "{repeats} with a repeated key");
    }

    /// Whether the one-pass writer gave the text to `Value` (for the generated texts, which hold
    /// no private token: a repeated key).
    fn has_repeat(raw: &str) -> bool {
        let to_value = std::cell::Cell::new(false);
        let mut out = Vec::new();
        let mut de = serde_json::Deserializer::from_str(raw);
        let _ = serde::de::DeserializeSeed::deserialize(super::Writer { out: &mut out, to_value: &to_value }, &mut de);
        to_value.get()
    }
}
