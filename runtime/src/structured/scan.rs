//! Byte scans of short texts, eight bytes at a time (SWAR: plain `u64` arithmetic, exact per
//! byte, no `unsafe`): where a JSON string's plain run ends, whether a string needs escaping,
//! whether a note is already one compact line. Every model reply, structured output and note
//! goes through them; most are tens of bytes, too short for a vectorised search to pay for its
//! setup, and past a first stretch the long ones go to `memchr`.

const ONES: u64 = 0x0101_0101_0101_0101;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// 0x80 in each byte of `x` that is zero, 0 in the others (exact: no carry crosses a byte).
fn zero_bytes(x: u64) -> u64 {
    !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7)
}

/// 0x80 in each byte below `n` (`n` ≤ 0x80), 0 in the others.
fn bytes_below(x: u64, n: u8) -> u64 {
    !(((x & LOW7).wrapping_add(ONES * u64::from(0x80 - n))) | x) & HIGHS
}

/// 0x80 in each byte above 0x7e (DEL and every non-ASCII byte), 0 in the others.
fn bytes_above_tilde(x: u64) -> u64 {
    ((x & LOW7).wrapping_add(ONES) | x) & HIGHS
}

/// 0x80 in each byte equal to `b`.
fn bytes_equal(x: u64, b: u8) -> u64 {
    zero_bytes(x ^ (ONES * u64::from(b)))
}

/// 0x80 in each byte that ends a JSON string's plain run: `"`, `\` or a control character.
fn run_enders(x: u64) -> u64 {
    bytes_equal(x, b'"') | bytes_equal(x, b'\\') | bytes_below(x, 0x20)
}

fn word(chunk: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(chunk);
    u64::from_le_bytes(b)
}

/// The last 0..8 bytes as a word, the rest of it `fill` (a text's tail gets one word's test
/// instead of a loop over its bytes).
fn tail_word(rest: &[u8], fill: u8) -> u64 {
    let mut b = [fill; 8];
    b[..rest.len()].copy_from_slice(rest);
    u64::from_le_bytes(b)
}

/// Where the first stretch scanned eight bytes at a time ends: past it `memchr` is faster.
const SHORT: usize = 64;

/// The index of the first `"`, `\` or control character of `bytes` (its length if none).
pub fn plain_run(bytes: &[u8]) -> usize {
    let head = &bytes[..bytes.len().min(SHORT)];
    let mut chunks = head.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let m = run_enders(word(chunk));
        if m != 0 {
            return at + (m.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() || bytes.len() < SHORT {
        // Filled with zeros, which end a run: the first ender is a real one, or the first fill
        // byte, which is where the text ends.
        let m = run_enders(tail_word(rest, 0));
        return at + ((m.trailing_zeros() / 8) as usize).min(rest.len());
    }
    let Some(tail) = bytes.get(SHORT..) else { return bytes.len() };
    let end = memchr::memchr2(b'"', b'\\', tail).unwrap_or(tail.len());
    SHORT + tail[..end].iter().position(|&b| b < 0x20).unwrap_or(end)
}

/// Whether a string needs escaping in JSON (a quote, a backslash or a control character).
pub fn needs_json_escape(bytes: &[u8]) -> bool {
    plain_run(bytes) < bytes.len()
}

/// Printable ASCII only (no control character, no DEL, nothing above), and no space followed
/// by another: one compact line, as a note is once its whitespace runs are collapsed.
pub fn is_compact_ascii(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    // Whether the byte before the current word was a space (a pair may straddle two words).
    let mut space_before = false;
    for chunk in &mut chunks {
        let x = word(chunk);
        if bytes_below(x, 0x20) | bytes_above_tilde(x) != 0 {
            return false;
        }
        let spaces = bytes_equal(x, b' ');
        // A space whose next byte (one byte up in the little-endian word) is a space too.
        if spaces & (spaces >> 8) != 0 || (space_before && spaces & 0x80 != 0) {
            return false;
        }
        space_before = spaces >> 56 != 0;
    }
    let rest = chunks.remainder();
    if rest.is_empty() {
        return true;
    }
    // Filled with `x`, which is printable and no space: only the real bytes can fail.
    let x = tail_word(rest, b'x');
    let spaces = bytes_equal(x, b' ');
    bytes_below(x, 0x20) | bytes_above_tilde(x) == 0 && spaces & (spaces >> 8) == 0 && !(space_before && spaces & 0x80 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_runs_end_where_a_quote_backslash_or_control_is() {
        for len in [0, 1, 7, 8, 9, 31, 63, 64, 65, 200] {
            let plain = "a".repeat(len);
            assert_eq!(plain_run(plain.as_bytes()), len);
            for stop in ["\"", "\\", "\n", "\u{1}", "\u{1f}"] {
                for at in [0, len / 2, len] {
                    let text = format!("{}{stop}{}", &plain[..at], &plain[at..]);
                    assert_eq!(plain_run(text.as_bytes()), at, "{len} {stop:?} at {at}");
                }
            }
        }
        // Non-ASCII, DEL and space are plain; a control before a later quote ends the run first.
        assert_eq!(plain_run("é ü 😀 \u{7f} ~".as_bytes()), "é ü 😀 \u{7f} ~".len());
        let text = format!("{}\u{1f}{}\"", "b".repeat(80), "c".repeat(10));
        assert_eq!(plain_run(text.as_bytes()), 80);
        // Every byte value, at every place of a word.
        for b in 0u8..=255 {
            for at in 0..16 {
                let mut text = vec![b'x'; 16];
                text[at] = b;
                let ends = b == b'"' || b == b'\\' || b < 0x20;
                assert_eq!(plain_run(&text), if ends { at } else { 16 }, "byte {b:#x} at {at}");
            }
        }
    }

    #[test]
    fn compact_lines_are_recognised_exactly() {
        let slow = |t: &[u8]| t.iter().all(|b| (0x20..=0x7e).contains(b)) && !t.windows(2).any(|w| w == b"  ");
        for b in 0u8..=255 {
            for at in 0..17 {
                let mut text = vec![b'x'; 17];
                text[at] = b;
                assert_eq!(is_compact_ascii(&text), slow(&text), "byte {b:#x} at {at}");
            }
        }
        // Pairs of spaces at every place, inside a word and across two.
        for at in 0..23 {
            let mut text = vec![b'y'; 24];
            text[at] = b' ';
            text[at + 1] = b' ';
            assert!(!is_compact_ascii(&text), "pair at {at}");
            text[at + 1] = b'y';
            assert!(is_compact_ascii(&text), "single at {at}");
        }
        assert!(is_compact_ascii(b""));
    }
}
