//! sacrebleu's `intl` tokenizer (`TokenizerV14International`, mteval-v14.pl), three `regex.sub`
//! passes over the line:
//!
//! 1. `(\P{N})(\p{P})` -> `\1 \2 `
//! 2. `(\p{P})(\P{N})` -> ` \1 \2`
//! 3. `(\p{S})`        -> ` \1 `
//!
//! As in [`super::v13a`], each pattern has a fixed length, so `sub` is a left-to-right scan that
//! replaces a match and skips it, or copies one character. No padding: a final `1998.` stays one
//! token (mteval-v14 behaviour kept by sacrebleu). The classes are the Unicode general categories
//! of the `regex` package that generated [`super::tables`] (not Python's `unicodedata`).

use super::python::in_ranges;
use super::tables::{REGEX_N, REGEX_P, REGEX_S};

const P: u8 = 1;
const S: u8 = 2;
const N: u8 = 4;

/// Class bits of the ASCII characters, from the same tables.
const ASCII_CLASS: [u8; 128] = {
    let mut t = [0u8; 128];
    let tables: [(&[(u32, u32)], u8); 3] = [(REGEX_P, P), (REGEX_S, S), (REGEX_N, N)];
    let mut k = 0;
    while k < tables.len() {
        let (table, bit) = tables[k];
        let mut r = 0;
        while r < table.len() && table[r].0 < 0x80 {
            let mut c = table[r].0;
            while c <= table[r].1 && c < 0x80 {
                t[c as usize] |= bit;
                c += 1;
            }
            r += 1;
        }
        k += 1;
    }
    t
};

#[inline]
fn class(c: char) -> u8 {
    let u = c as u32;
    if u < 0x80 {
        return ASCII_CLASS[u as usize];
    }
    if in_ranges(REGEX_P, u) {
        P
    } else if in_ranges(REGEX_S, u) {
        S
    } else if in_ranges(REGEX_N, u) {
        N
    } else {
        0
    }
}

/// Scratch buffers of the passes, reused across lines: characters with their class bits.
#[derive(Debug, Default, Clone)]
pub(super) struct IntlBuffers {
    a: Vec<(char, u8)>,
    b: Vec<(char, u8)>,
    out: String,
}

/// `TokenizerV14International.__call__` on a line that is already lowercased (if asked) and
/// right-stripped. Returns the rewritten line; its Python-whitespace split is the token list.
pub(super) fn tokenize_intl<'b>(line: &str, bufs: &'b mut IntlBuffers) -> &'b str {
    let IntlBuffers { a, b, out } = bufs;
    a.clear();
    a.extend(line.chars().map(|c| (c, class(c))));
    let is_p = |k: u8| k & P != 0;
    let not_n = |k: u8| k & N == 0;
    // Pass 1: `(\P{N})(\p{P})` -> `\1 \2 `.
    b.clear();
    let mut i = 0;
    while i < a.len() {
        if i + 1 < a.len() && not_n(a[i].1) && is_p(a[i + 1].1) {
            b.extend_from_slice(&[a[i], SPACE, a[i + 1], SPACE]);
            i += 2;
        } else {
            b.push(a[i]);
            i += 1;
        }
    }
    // Pass 2: `(\p{P})(\P{N})` -> ` \1 \2`.
    a.clear();
    let mut i = 0;
    while i < b.len() {
        if i + 1 < b.len() && is_p(b[i].1) && not_n(b[i + 1].1) {
            a.extend_from_slice(&[SPACE, b[i], SPACE, b[i + 1]]);
            i += 2;
        } else {
            a.push(b[i]);
            i += 1;
        }
    }
    // Pass 3: `(\p{S})` -> ` \1 `.
    out.clear();
    for &(c, k) in a.iter() {
        if k & S != 0 {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// An inserted space: no class.
const SPACE: (char, u8) = (' ', 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class('.'), P);
        assert_eq!(class('$'), S);
        assert_eq!(class('7'), N);
        assert_eq!(class('a'), 0);
        assert_eq!(class('…'), P);
        assert_eq!(class('€'), S);
        assert_eq!(class('½'), N);
        assert_eq!(class('\u{20C1}'), S); // SAUDI RIYAL SIGN, Unicode 17
    }
}
