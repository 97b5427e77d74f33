//! Number coercions and formatting as pydantic-core does them.

use super::pyjson::BigInt;

/// Appends a float the way `model_dump_json()` writes it: shortest round-trip digits, plain
/// notation for decimal exponents -5..=15 (`1.0`, `0.00001`), scientific otherwise with a signed
/// exponent (`1e+16`, `1.5e-7`); infinities and NaN become `null`.
pub fn push_float(buf: &mut String, f: f64) {
    if !f.is_finite() {
        buf.push_str("null");
        return;
    }
    let mut ryu_buf = ryu::Buffer::new();
    let text = ryu_buf.format_finite(f);
    match text.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => {
            buf.push_str(mantissa);
            buf.push_str("e+");
            buf.push_str(exp);
        }
        _ => buf.push_str(text),
    }
}

/// Removes `_` separators, allowed only between two digits (as Python's numeric literals).
fn strip_underscores(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    for (idx, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            let before = idx > 0 && bytes[idx - 1].is_ascii_digit();
            let after = bytes.get(idx + 1).is_some_and(u8::is_ascii_digit);
            if !(before && after) {
                return None;
            }
        } else {
            out.push(b as char);
        }
    }
    Some(out)
}

/// A string to float in lax mode: surrounding whitespace ignored, Python float syntax
/// (underscores, `inf`, `nan`), ASCII digits only.
pub fn parse_float_str(s: &str) -> Option<f64> {
    let s = s.trim();
    if !s.is_ascii() {
        return None;
    }
    let s = strip_underscores(s)?;
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(&s);
    let lower = unsigned.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        let v = if lower == "nan" { f64::NAN } else { f64::INFINITY };
        return Some(if s.starts_with('-') { -v } else { v });
    }
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits_ok = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if int_part.is_empty() && frac_part.is_empty() || !digits_ok(int_part) || !digits_ok(frac_part) {
        return None;
    }
    if let Some(exp) = exponent {
        let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
        if exp.is_empty() || !digits_ok(exp) {
            return None;
        }
    }
    s.parse::<f64>().ok()
}

/// A string to int in lax mode: whitespace ignored, optional sign, digits with `_` separators,
/// and an optional fraction made only of zeros (`"7.0"` is 7, `"7.5"` and `"7."` are refused).
pub fn parse_int_str(s: &str) -> Option<BigInt> {
    let s = s.trim();
    if !s.is_ascii() {
        return None;
    }
    let s = strip_underscores(s)?;
    let negative = s.starts_with('-');
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(&s);
    let int_part = match unsigned.split_once('.') {
        Some((i, f)) if !f.is_empty() && f.bytes().all(|b| b == b'0') => i,
        Some(_) => return None,
        None => unsigned,
    };
    if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(BigInt::new(negative, int_part))
}

/// A float to int: only whole values within the 64-bit range.
pub fn float_to_int(f: f64) -> Option<i64> {
    // 2^63 is exactly representable; the valid range is [-2^63, 2^63).
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (f.is_finite() && f.fract() == 0.0 && (-LIMIT..LIMIT).contains(&f)).then_some(f as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(f: f64) -> String {
        let mut s = String::new();
        push_float(&mut s, f);
        s
    }

    #[test]
    fn floats_format_like_pydantic() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e20, "1e+20"),
            (1.5e-7, "1.5e-7"),
            (1e-5, "0.00001"),
            (1e-6, "1e-6"),
            (2.5e-5, "0.000025"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (-0.0, "-0.0"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (f64::INFINITY, "null"),
        ] {
            assert_eq!(fmt(f), want, "{f:e}");
        }
    }

    #[test]
    fn lax_strings() {
        assert_eq!(parse_float_str(" 2.5 "), Some(2.5));
        assert_eq!(parse_float_str("1_000"), Some(1000.0));
        assert_eq!(parse_float_str("7."), Some(7.0));
        assert_eq!(parse_float_str(".5"), Some(0.5));
        assert!(parse_float_str("-inf").is_some_and(|f| f == f64::NEG_INFINITY));
        for bad in ["", "abc", "0x10", "1__0", "_1", "1 0", "١٢", "12abc", "+-1", "1,5", "."] {
            assert_eq!(parse_float_str(bad), None, "{bad}");
        }
        assert_eq!(parse_int_str(" 7.0 ").map(|n| n.to_json_text()), Some("7".into()));
        assert_eq!(parse_int_str("1_0.0").map(|n| n.to_json_text()), Some("10".into()));
        assert_eq!(parse_int_str("-0").map(|n| n.to_json_text()), Some("0".into()));
        for bad in ["7.5", "7.", ".0", "1e2", "", "+-1"] {
            assert_eq!(parse_int_str(bad), None, "{bad}");
        }
        assert_eq!(float_to_int(9.2e18), Some(9_200_000_000_000_000_000));
        assert_eq!(float_to_int(9.3e18), None);
        assert_eq!(float_to_int(-0.0), Some(0));
    }
}
