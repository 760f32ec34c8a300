//! sacrebleu's `zh` tokenizer (`TokenizerZh`): `line.strip()`, a space on each side of every
//! "Chinese" code point, then the `TokenizerRegexp` passes that 13a also uses (module `regexp`)
//! without 13a's padding, `<skipped>` removal or entity unescaping.
//!
//! "Chinese" is sacrebleu's `_UCODE_RANGES`, compared as Python strings: the entries written
//! `'\u20000'` and `'\u2a6d6'` (meant as CJK Extension B, U+20000..U+2A6D6) are the two-character
//! strings U+2000 '0' and U+2A6D '6', so the range really holds U+2001..=U+2A6D (general
//! punctuation such as — … “ ”, currency, arrows, mathematical operators) while Extension B is
//! not split. The same happens to `'\u2f800'`..`'\u2fa1d'` (U+2F81..=U+2FA1, inside the Kangxi
//! radicals anyway). `tables::ZH_CHINESE` holds the resulting code points, read off
//! sacrebleu itself.

use super::python::python_strip;
use super::regexp::{is_zh_split_char, regexp_passes, regexp_spans, PassBuffers};

/// `TokenizerZh.__call__` then `str.split()`, on a line that is already lowercased (if asked) and
/// right-stripped: appends the token spans to `spans` and returns the text they index (`line`
/// stripped).
pub(super) fn zh_spans<'a>(
    line: &'a str,
    spans: &mut Vec<(usize, usize)>,
    bufs: &mut PassBuffers,
) -> &'a str {
    let line = python_strip(line);
    regexp_spans::<true>(line, false, spans, bufs);
    line
}

/// `TokenizerZh.__call__` the literal way (spaces around Chinese characters, then the four
/// passes). Returns the rewritten line; its Python-whitespace split is the token list. The
/// reference that [`zh_spans`] is tested against.
pub(super) fn tokenize_zh_reference<'b>(
    line: &str,
    spaced: &mut String,
    bufs: &'b mut PassBuffers,
) -> &'b str {
    let line = python_strip(line);
    spaced.clear();
    for c in line.chars() {
        if is_zh_split_char(c) {
            spaced.push(' ');
            spaced.push(c);
            spaced.push(' ');
        } else {
            spaced.push(c);
        }
    }
    regexp_passes(spaced, false, bufs)
}
