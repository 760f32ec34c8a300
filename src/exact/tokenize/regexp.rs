//! sacrebleu's `TokenizerRegexp`, the post-tokenizer that `13a` (module `v13a`) and `zh` (module
//! `zh`) share, and the one-scan token finder both use in its place.
//!
//! The four regular expressions of `TokenizerRegexp` are applied in turn with Python `re.sub`:
//!
//! 1. `([\{-\~\[-\` -\&\(-\+\:-\@\/])` -> ` \1 `
//! 2. `([^0-9])([\.,])`                -> `\1 \2 `
//! 3. `([\.,])([^0-9])`                -> ` \1 \2`
//! 4. `([0-9])(-)`                     -> `\1 \2 `
//!
//! Each pattern matches a fixed number of characters, so `re.sub` is exactly a left-to-right scan
//! that, at each position, either replaces a match and jumps past it or copies one character and
//! moves on (matches never overlap: in `a..b` the second `.` is not split from the first by
//! pass 2). Each pass below is that scan. They run on UTF-8 bytes: every class above is ASCII or
//! the complement of one (`[^0-9]`), and a multi-byte character can only take part in a match
//! through its last byte (as `\1` before an ASCII `.`/`,`) or its first (as `\2` after one), so the
//! byte scan makes the same matches and inserts the same spaces as the character scan, always
//! between whole characters.
//!
//! sacrebleu's "Chinese" character class ([`is_zh_split_char`]) lives here too: the one-scan
//! finder ([`regexp_spans`] with `ZH`) splits those characters off as `zh` does. Keeping both
//! here is what lets `v13a` and `zh` depend on this module and not on each other.

use super::python::{self, in_ranges};
use super::tables::ZH_CHINESE;

/// Whether sacrebleu's zh tokenizer treats `c` as a Chinese character (its `'\u20000'` bug
/// included: see the `zh` module): '中', and '…' (U+2026, inside sacrebleu's accidental
/// U+2001..U+2A6D range), but not 'a'.
pub(crate) fn is_zh_split_char(c: char) -> bool {
    in_ranges(ZH_CHINESE, c as u32)
}

/// The single characters pass 1 surrounds with spaces: `{|}~`, `` [\]^_` ``, space to `&`,
/// `()*+`, `:` to `@`, `/`.
const SPLIT_OFF: [bool; 128] = {
    let mut t = [false; 128];
    let ranges: [(u8, u8); 6] = [
        (b'{', b'~'),
        (b'[', b'`'),
        (b' ', b'&'),
        (b'(', b'+'),
        (b':', b'@'),
        (b'/', b'/'),
    ];
    let mut r = 0;
    while r < ranges.len() {
        let mut c = ranges[r].0;
        while c <= ranges[r].1 {
            t[c as usize] = true;
            c += 1;
        }
        r += 1;
    }
    t
};

/// Scratch buffers of the byte passes, reused across lines.
#[derive(Debug, Default, Clone)]
pub(super) struct PassBuffers {
    a: Vec<u8>,
    b: Vec<u8>,
}

/// `TokenizerRegexp.__call__` (the four passes of the module docs) on `line`, padded with one
/// space on each side when `pad` (13a pads, zh does not: in zh a leading `.5` or a final `1998.`
/// stays one token). Returns the rewritten line.
pub(super) fn regexp_passes<'b>(line: &str, pad: bool, bufs: &'b mut PassBuffers) -> &'b str {
    let PassBuffers { a, b } = bufs;
    // Pass 1: split off the single characters.
    a.clear();
    a.reserve(line.len() + line.len() / 4 + 8);
    // The padding spaces go through pass 1 too (space is in its class): "   ".
    if pad {
        a.extend_from_slice(b"   ");
    }
    for &c in line.as_bytes() {
        if c < 0x80 && SPLIT_OFF[c as usize] {
            a.extend_from_slice(&[b' ', c, b' ']);
        } else {
            a.push(c);
        }
    }
    if pad {
        a.extend_from_slice(b"   ");
    }
    // Pass 2: `([^0-9])([\.,])` -> `\1 \2 `.
    pair_pass(a, b, not_digit, is_period_comma, Spacing::AfterEach);
    // Pass 3: `([\.,])([^0-9])` -> ` \1 \2`.
    pair_pass(b, a, is_period_comma, not_digit, Spacing::BeforeEach);
    // Pass 4: `([0-9])(-)` -> `\1 \2 `.
    pair_pass(
        a,
        b,
        |c| c.is_ascii_digit(),
        |c| c == b'-',
        Spacing::AfterEach,
    );
    std::str::from_utf8(b).expect("the passes insert ASCII spaces between whole characters")
}

/// Byte classes of [`regexp_spans`].
const ORDINARY: u8 = 0;
/// ASCII Python whitespace.
const WHITESPACE: u8 = 1;
/// A pass-1 character: a token of its own.
const SPLIT: u8 = 2;
/// `.`, `,` or `-`: the piece needs passes 2 to 4.
const MARK: u8 = 3;
/// A lead byte that may start multi-byte whitespace (or, for zh, a Chinese character).
const DECODE: u8 = 4;

const fn byte_classes(zh: bool) -> [u8; 256] {
    let mut t = [ORDINARY; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = if c < 128 && SPLIT_OFF[c] && c != b' ' as usize {
            SPLIT
        } else if c < 128 && python::MAY_START_WHITESPACE[c] {
            WHITESPACE
        } else if c == b'.' as usize || c == b',' as usize || c == b'-' as usize {
            MARK
        } else if python::MAY_START_WHITESPACE[c] || (zh && c >= 0xE2 && c <= 0xEF) {
            // zh: every "Chinese" code point is in U+2001..U+FFEF, a 3-byte character.
            DECODE
        } else {
            ORDINARY
        };
        c += 1;
    }
    t
}

const CLASSES_13A: [u8; 256] = byte_classes(false);
const CLASSES_ZH: [u8; 256] = byte_classes(true);

/// What starts at a byte between or inside pieces.
enum Boundary {
    /// Python whitespace of this many bytes.
    Space(usize),
    /// A character of this many bytes that is a token of its own.
    Token(usize),
    /// Neither: the byte belongs to a piece.
    Inside,
}

#[inline]
fn boundary_at<const ZH: bool>(b: &[u8], i: usize, class: u8) -> Boundary {
    match class {
        WHITESPACE => Boundary::Space(1),
        SPLIT => Boundary::Token(1),
        DECODE => {
            let len = python::whitespace_len_at(b, i);
            if len > 0 {
                return Boundary::Space(len);
            }
            if ZH && (0xE2..=0xEF).contains(&b[i]) && i + 2 < b.len() {
                let c = (u32::from(b[i] & 0x0F) << 12)
                    | (u32::from(b[i + 1] & 0x3F) << 6)
                    | u32::from(b[i + 2] & 0x3F);
                if char::from_u32(c).is_some_and(is_zh_split_char) {
                    return Boundary::Token(3);
                }
            }
            Boundary::Inside
        }
        _ => Boundary::Inside,
    }
}

/// Token spans (byte ranges of `line`) of `TokenizerRegexp` on `line` (padded with a space on
/// each side when `pad`, as 13a does) followed by `str.split()`; with `ZH`, every "Chinese" code
/// point is first surrounded by spaces, as `TokenizerZh` does. Appends to `spans`.
///
/// Same tokens as [`regexp_passes`] in one scan. Pass 1 only inserts spaces, so after it the line
/// is a sequence of whitespace-separated pieces: each pass-1 character (and zh Chinese character)
/// alone, and the maximal runs of other non-whitespace characters. Passes 2 to 4 never act across
/// pieces: a whitespace character can only be matched where the other character is `.` or `,`
/// (pass 2 `(ws)([.,])`, pass 3 `([.,])(ws)`), and such a match never consumes a character another
/// match of the same pass could have used, so a whitespace run of any length acts as one space.
/// A piece is therefore tokenized alone, with a space before it unless it starts the unpadded
/// line and after it unless it ends it; a piece without `.`, `,` or `-` is one token as is, and
/// the rest go through the literal passes on a few bytes.
pub(super) fn regexp_spans<const ZH: bool>(
    line: &str,
    pad: bool,
    spans: &mut Vec<(usize, usize)>,
    bufs: &mut PassBuffers,
) {
    let classes = if ZH { &CLASSES_ZH } else { &CLASSES_13A };
    let b = line.as_bytes();
    let n = b.len();
    let mut i = 0;
    while i < n {
        match boundary_at::<ZH>(b, i, classes[b[i] as usize]) {
            Boundary::Space(len) => {
                i += len;
                continue;
            }
            Boundary::Token(len) => {
                spans.push((i, i + len));
                i += len;
                continue;
            }
            Boundary::Inside => {}
        }
        let start = i;
        let mut marked = false;
        loop {
            while i < n && classes[b[i] as usize] == ORDINARY {
                i += 1;
            }
            if i >= n {
                break;
            }
            let class = classes[b[i] as usize];
            if class == MARK {
                marked = true;
            } else if !matches!(boundary_at::<ZH>(b, i, class), Boundary::Inside) {
                break;
            }
            i += 1;
        }
        if marked {
            split_piece(
                &b[start..i],
                start,
                start > 0 || pad,
                i < n || pad,
                spans,
                bufs,
            );
        } else {
            spans.push((start, i));
        }
    }
}

/// Passes 2 to 4 on one piece (bytes `offset..offset + piece.len()` of the line: no whitespace,
/// no pass-1 character), with one space of context before it if `space_before` and after it if
/// `space_after`; appends the spans of the resulting tokens.
///
/// Direct rules, equivalent to the passes (checked against [`split_piece_literal`]):
/// - pass 4 `([0-9])(-)`: every `-` right after a digit becomes a token. Passes 2 and 3 never put
///   a space between a digit and a `-`, and pass 4 matches cannot overlap.
/// - passes 2 and 3 act only on runs of `.`/`,` and the characters around them, and runs never
///   interact (a character between two runs is never consumed by a match that would decide the
///   next run). A lone `.`/`,` becomes a token unless both of its neighbours are digits or the
///   line's unpadded ends (`1,000`, `3.5`; zh's final `1998.`): with a non-digit before it pass 2
///   isolates it; otherwise pass 3 does when a non-digit follows.
/// - runs of two or more (`...`, `.,`) go through the literal passes.
fn split_piece(
    piece: &[u8],
    offset: usize,
    space_before: bool,
    space_after: bool,
    spans: &mut Vec<(usize, usize)>,
    bufs: &mut PassBuffers,
) {
    let first_span = spans.len();
    let len = piece.len();
    let mut token_start = 0;
    for (k, &c) in piece.iter().enumerate() {
        let isolate = match c {
            b'.' | b',' => {
                if k + 1 < len && is_period_comma(piece[k + 1]) {
                    spans.truncate(first_span);
                    split_piece_literal(piece, offset, space_before, space_after, spans, bufs);
                    return;
                }
                let digit_or_end_before = if k == 0 {
                    !space_before
                } else {
                    piece[k - 1].is_ascii_digit()
                };
                let digit_or_end_after = if k + 1 == len {
                    !space_after
                } else {
                    piece[k + 1].is_ascii_digit()
                };
                !(digit_or_end_before && digit_or_end_after)
            }
            b'-' => k > 0 && piece[k - 1].is_ascii_digit(),
            _ => false,
        };
        if isolate {
            if token_start < k {
                spans.push((offset + token_start, offset + k));
            }
            spans.push((offset + k, offset + k + 1));
            token_start = k + 1;
        }
    }
    if token_start < len {
        spans.push((offset + token_start, offset + len));
    }
}

/// Passes 2 to 4 applied literally to one piece (see [`split_piece`]).
fn split_piece_literal(
    piece: &[u8],
    offset: usize,
    space_before: bool,
    space_after: bool,
    spans: &mut Vec<(usize, usize)>,
    bufs: &mut PassBuffers,
) {
    let PassBuffers { a, b } = bufs;
    a.clear();
    if space_before {
        a.push(b' ');
    }
    a.extend_from_slice(piece);
    if space_after {
        a.push(b' ');
    }
    pair_pass(a, b, not_digit, is_period_comma, Spacing::AfterEach);
    pair_pass(b, a, is_period_comma, not_digit, Spacing::BeforeEach);
    pair_pass(
        a,
        b,
        |c| c.is_ascii_digit(),
        |c| c == b'-',
        Spacing::AfterEach,
    );
    // `b` is the piece with spaces inserted: walk it, counting the piece's own bytes.
    let mut at = offset;
    let mut token_start = None;
    for &c in b.iter() {
        if c == b' ' {
            if let Some(s) = token_start.take() {
                spans.push((s, at));
            }
        } else {
            token_start.get_or_insert(at);
            at += 1;
        }
    }
    if let Some(s) = token_start {
        spans.push((s, at));
    }
}

/// `[\.,]`
fn is_period_comma(c: u8) -> bool {
    c == b'.' || c == b','
}

/// `[^0-9]`
fn not_digit(c: u8) -> bool {
    !c.is_ascii_digit()
}

/// Where a two-character replacement puts its spaces.
#[derive(Clone, Copy)]
enum Spacing {
    /// `\1 \2 `
    AfterEach,
    /// ` \1 \2`
    BeforeEach,
}

/// `re.sub` of a two-character pattern `(first)(second)`: scan left to right; at a match write the
/// replacement and skip both characters, else copy one.
#[inline]
fn pair_pass(
    src: &[u8],
    dst: &mut Vec<u8>,
    first: impl Fn(u8) -> bool,
    second: impl Fn(u8) -> bool,
    spacing: Spacing,
) {
    dst.clear();
    dst.reserve(src.len() + src.len() / 4 + 8);
    let mut i = 0;
    while i < src.len() {
        let c = src[i];
        if i + 1 < src.len() && first(c) && second(src[i + 1]) {
            let d = src[i + 1];
            match spacing {
                Spacing::AfterEach => dst.extend_from_slice(&[c, b' ', d, b' ']),
                Spacing::BeforeEach => dst.extend_from_slice(&[b' ', c, b' ', d]),
            }
            i += 2;
        } else {
            dst.push(c);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_off_set_is_the_regex_class() {
        let expected = "{|}~[\\]^_` !\"#$%&()*+:;<=>?@/";
        for c in 0u8..128 {
            assert_eq!(SPLIT_OFF[c as usize], expected.contains(c as char), "{c}");
        }
    }

    #[test]
    fn the_u20000_bug() {
        assert!(!is_zh_split_char('\u{2000}'));
        assert!(is_zh_split_char('\u{2001}'));
        assert!(is_zh_split_char('…'));
        assert!(is_zh_split_char('\u{2A6D}'));
        assert!(!is_zh_split_char('\u{2A6E}'));
        assert!(!is_zh_split_char('\u{20000}'));
        assert!(is_zh_split_char('中'));
        assert!(is_zh_split_char('，'));
        assert!(!is_zh_split_char('a'));
    }
}
