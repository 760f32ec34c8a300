//! Python `str` semantics that sacrebleu's pipeline relies on: `str.isspace` (the separators of
//! `str.split()` and `str.rstrip()`/`strip()`) and `str.lower` (full lowercase mapping plus the
//! final-sigma rule), on the Unicode data of the Python that generated `tables.rs`.

use super::tables::{PY_CASED, PY_CASE_IGNORABLE, PY_LOWER, PY_WHITESPACE};

/// Whether `table` (sorted, disjoint, inclusive ranges) holds `c`.
pub(super) fn in_ranges(table: &[(u32, u32)], c: u32) -> bool {
    let i = table.partition_point(|&(_, end)| end < c);
    i < table.len() && table[i].0 <= c
}

/// Python's `chr(c).isspace()`: the ASCII whitespace plus U+001C..U+001F (which Rust's
/// `char::is_whitespace` does not count), U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
/// U+2029, U+202F, U+205F, U+3000.
///
/// The separators of every tokenizer's `str.split()` and of sacrebleu's `rstrip()`: text split
/// or stripped with it (`line.trim_end_matches(is_python_whitespace)` is Python's
/// `line.rstrip()`) is split or stripped as sacrebleu does.
///
/// ```
/// use candle_bleu::exact::tokenize::is_python_whitespace;
/// assert!(is_python_whitespace('\u{1c}') && !'\u{1c}'.is_whitespace());
/// assert!(!is_python_whitespace('\u{200b}'));
/// assert_eq!("a b\u{3000}\u{1f}".trim_end_matches(is_python_whitespace), "a b");
/// ```
#[inline]
pub fn is_python_whitespace(c: char) -> bool {
    let c = c as u32;
    if c < 0x80 {
        return ASCII_WHITESPACE[c as usize];
    }
    PY_WHITESPACE.binary_search(&c).is_ok()
}

const ASCII_WHITESPACE: [bool; 128] = {
    let mut t = [false; 128];
    let mut i = 0;
    while i < PY_WHITESPACE.len() {
        if PY_WHITESPACE[i] < 0x80 {
            t[PY_WHITESPACE[i] as usize] = true;
        }
        i += 1;
    }
    t
};

/// Bytes that may start Python whitespace: the ASCII whitespace and the lead bytes of the
/// multi-byte whitespace characters (0xC2, 0xE1, 0xE2, 0xE3). Every other byte is inside a token.
pub(super) const MAY_START_WHITESPACE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 128 {
        t[i] = ASCII_WHITESPACE[i];
        i += 1;
    }
    t[0xC2] = true;
    t[0xE1] = true;
    t[0xE2] = true;
    t[0xE3] = true;
    t
};

/// Length in bytes of the Python-whitespace character starting at `bytes[i]`, or 0 if none does.
/// `bytes` is valid UTF-8 and `i` a character boundary; multi-byte whitespace is matched on its
/// UTF-8 encoding, so ASCII text never decodes a character.
#[inline(always)]
pub(super) fn whitespace_len_at(bytes: &[u8], i: usize) -> usize {
    let b = bytes[i];
    if b < 0x80 {
        return ASCII_WHITESPACE[b as usize] as usize;
    }
    let at = |k: usize| bytes.get(i + k).copied().unwrap_or(0);
    let is_ws = match b {
        // U+0085, U+00A0
        0xC2 => matches!(at(1), 0x85 | 0xA0),
        // U+1680
        0xE1 => at(1) == 0x9A && at(2) == 0x80,
        // U+2000..U+200A, U+2028, U+2029, U+202F; U+205F
        0xE2 => match at(1) {
            0x80 => matches!(at(2), 0x80..=0x8A | 0xA8 | 0xA9 | 0xAF),
            0x81 => at(2) == 0x9F,
            _ => false,
        },
        // U+3000
        0xE3 => at(1) == 0x80 && at(2) == 0x80,
        _ => false,
    };
    if is_ws {
        if b == 0xC2 {
            2
        } else {
            3
        }
    } else {
        0
    }
}

/// Python's `str.split()` with no argument: the maximal runs of non-whitespace characters, in
/// order (leading/trailing whitespace yields nothing, so `""` and `"  "` give no token).
pub fn python_split(text: &str) -> PythonSplit<'_> {
    PythonSplit { text, pos: 0 }
}

/// Iterator returned by [`python_split`]; yields sub-slices of the input.
#[derive(Debug, Clone)]
pub struct PythonSplit<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Iterator for PythonSplit<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let mut i = self.pos;
        // Skip separators.
        loop {
            let Some(&b) = bytes.get(i) else {
                self.pos = i;
                return None;
            };
            if b < 0x80 {
                if !ASCII_WHITESPACE[b as usize] {
                    break;
                }
                i += 1;
            } else {
                match whitespace_len_at(bytes, i) {
                    0 => break,
                    n => i += n,
                }
            }
        }
        let start = i;
        // A token runs to the next separator. Continuation bytes never start whitespace, and a
        // multi-byte character that is not whitespace is stepped over byte by byte.
        loop {
            i = next_whitespace_candidate(bytes, i);
            if i >= bytes.len() || whitespace_len_at(bytes, i) > 0 {
                break;
            }
            i += 1;
        }
        self.pos = i;
        Some(&self.text[start..i])
    }
}

/// The first index `>= i` whose byte may start Python whitespace ([`MAY_START_WHITESPACE`]),
/// or `bytes.len()`. Eight bytes at a time: every ASCII whitespace byte is below 0x21 and
/// every multi-byte one starts at or above 0x80, so a word with neither is skipped whole.
#[inline]
fn next_whitespace_candidate(bytes: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        // Bytes below 0x21 (exact for the lowest flagged byte: a borrow only moves upwards)
        // or at or above 0x80.
        let flagged = (word.wrapping_sub(ONES * 0x21) & !word & HIGH) | (word & HIGH);
        if flagged == 0 {
            i += 8;
            continue;
        }
        let k = i + (flagged.trailing_zeros() / 8) as usize;
        if MAY_START_WHITESPACE[bytes[k] as usize] {
            return k;
        }
        // A control character or a byte of a non-whitespace character: go on after it.
        i = k + 1;
    }
    while i < bytes.len() && !MAY_START_WHITESPACE[bytes[i] as usize] {
        i += 1;
    }
    i
}

/// Python's `str.rstrip()`: drops trailing Python whitespace.
pub fn python_rstrip(text: &str) -> &str {
    text.trim_end_matches(is_python_whitespace)
}

/// Python's `str.strip()`: drops leading and trailing Python whitespace.
pub fn python_strip(text: &str) -> &str {
    text.trim_matches(is_python_whitespace)
}

/// Python's `str.lower()`, appended to `out`: the full lowercase mapping of every code point
/// (U+0130 'İ' becomes "i\u{307}"), and U+03A3 'Σ' becomes final 'ς' when preceded by a cased
/// letter and not followed by one (skipping case-ignorable code points both ways), else 'σ'.
/// Unicode data: the Python that generated `tables.rs`, not Rust's `str::to_lowercase`.
pub fn python_lower_into(text: &str, out: &mut String) {
    if text.is_ascii() {
        let start = out.len();
        out.push_str(text);
        out[start..].make_ascii_lowercase();
        return;
    }
    for (i, c) in text.char_indices() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
        } else if c == '\u{3A3}' {
            out.push(if is_final_sigma(text, i) {
                '\u{3C2}'
            } else {
                '\u{3C3}'
            });
        } else {
            match PY_LOWER.binary_search_by_key(&(c as u32), |&(k, _)| k) {
                Ok(k) => out.push_str(PY_LOWER[k].1),
                Err(_) => out.push(c),
            }
        }
    }
}

/// Python's `str.lower()` as a new string. See [`python_lower_into`].
pub fn python_lower(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    python_lower_into(text, &mut out);
    out
}

fn is_case_ignorable(c: char) -> bool {
    in_ranges(PY_CASE_IGNORABLE, c as u32)
}

fn is_cased(c: char) -> bool {
    in_ranges(PY_CASED, c as u32)
}

/// CPython's `handle_capital_sigma` for the 'Σ' at byte `i` of `text`:
/// `\p{cased} \p{case-ignorable}* Σ !(\p{case-ignorable}* \p{cased})`.
fn is_final_sigma(text: &str, i: usize) -> bool {
    let before = text[..i].chars().rev().find(|&c| !is_case_ignorable(c));
    if !before.is_some_and(is_cased) {
        return false;
    }
    let after = text[i + '\u{3A3}'.len_utf8()..]
        .chars()
        .find(|&c| !is_case_ignorable(c));
    !after.is_some_and(is_cased)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_whitespace_matches_the_table() {
        let mut buf = [0u8; 4];
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let s = c.encode_utf8(&mut buf);
            let expected = if PY_WHITESPACE.contains(&(c as u32)) {
                s.len()
            } else {
                0
            };
            assert_eq!(
                whitespace_len_at(s.as_bytes(), 0),
                expected,
                "U+{:04X}",
                c as u32
            );
            assert_eq!(is_python_whitespace(c), expected > 0, "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn split_uses_python_separators() {
        let tokens: Vec<_> =
            python_split("\u{1c}a\u{1f}b\u{a0}c\u{3000}d\u{85} e\u{200b}f ").collect();
        assert_eq!(tokens, ["a", "b", "c", "d", "e\u{200b}f"]);
        assert_eq!(python_split("").count(), 0);
        assert_eq!(python_split(" \t\n").count(), 0);
    }

    #[test]
    fn word_scan_finds_the_first_candidate() {
        // Every position of every byte value that may start whitespace, behind ASCII letters
        // and behind non-ASCII characters (whose bytes are flagged but are not candidates).
        for b in 0u8..=255 {
            for at in 0..20 {
                for filler in [b'a', 0xC3] {
                    let mut bytes = vec![filler; 24];
                    if filler == 0xC3 {
                        for k in (1..24).step_by(2) {
                            bytes[k] = 0xA9; // "é" repeated
                        }
                    }
                    bytes[at] = b;
                    let want = (0..bytes.len())
                        .find(|&k| MAY_START_WHITESPACE[bytes[k] as usize])
                        .unwrap_or(bytes.len());
                    assert_eq!(next_whitespace_candidate(&bytes, 0), want, "{b:#x} at {at}");
                }
            }
        }
    }

    #[test]
    fn lower_follows_python() {
        assert_eq!(python_lower("İ"), "i\u{307}");
        assert_eq!(python_lower("ΟΔΥΣΣΕΥΣ"), "οδυσσευς");
        assert_eq!(python_lower("Σ"), "σ");
        assert_eq!(python_lower("ΑΣ\u{345}"), "ας\u{345}");
        assert_eq!(python_lower("ΑΣ'Α"), "ασ'α");
        // Unicode 16 letters that Python 3.11 (Unicode 14) leaves alone, unlike Rust 1.95.
        assert_eq!(python_lower("\u{A7CB}"), "\u{A7CB}");
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(python_rstrip(" a\u{1c}\u{a0}\t"), " a");
        assert_eq!(python_strip("\u{3000}a b\u{85}"), "a b");
    }
}
