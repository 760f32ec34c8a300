//! sacrebleu 2.6.0's `TercomTokenizer` (`tokenizers/tokenizer_ter.py`), its regular
//! expressions ported by hand, each as one left-to-right pass with Python `re.sub`'s
//! non-overlapping matches.

use super::config::TerConfig;
use crate::exact::tokenize::{python_lower, python_split};

/// The ASCII punctuation that `_normalize_general_and_western` surrounds with spaces: the class
/// `[{-~[-` -&(-+:-@/]`, i.e. `{ | } ~ [ \ ] ^ _ `` ` ``, space to `&`, `(` to `+`, `:` to `@`
/// and `/` (not `'`, `,`, `-`, `.` nor digits or letters).
fn is_western_punct(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

/// The characters that `_normalize_asian` surrounds with spaces: CJK Unified Ideographs and
/// Extension A, CJK Strokes, CJK Radicals Supplement, CJK Compatibility (and its ideographs and
/// forms), U+3200..U+3F22, and the Asian and full-width punctuation.
///
/// Its three kana expressions (`(^|^[\u3040-\u309f])([\u3040-\u309f]+)(?=$|^[\u3040-\u309f])`
/// and the Katakana ones) only match a string that starts with kana, and the string they see
/// always starts with the space `_normalize_general_and_western` puts first: they never match.
fn is_asian_split(c: char) -> bool {
    matches!(c,
        '\u{4e00}'..='\u{9fff}'
        | '\u{3400}'..='\u{4dbf}'
        | '\u{31c0}'..='\u{31ef}'
        | '\u{2e80}'..='\u{2eff}'
        | '\u{3300}'..='\u{33ff}'
        | '\u{f900}'..='\u{faff}'
        | '\u{fe30}'..='\u{fe4f}'
        | '\u{3200}'..='\u{3f22}')
        || is_asian_punct(c)
        || is_full_width_punct(c)
}

/// `TercomTokenizer.ASIAN_PUNCT`: `[\u3001\u3002\u3008-\u3011\u3014-\u301f\uff61-\uff65\u30fb]`.
fn is_asian_punct(c: char) -> bool {
    matches!(c,
        '\u{3001}' | '\u{3002}' | '\u{3008}'..='\u{3011}' | '\u{3014}'..='\u{301f}'
        | '\u{ff61}'..='\u{ff65}' | '\u{30fb}')
}

/// `TercomTokenizer.FULL_WIDTH_PUNCT`: `[\uff0e\uff0c\uff1f\uff1a\uff1b\uff01\uff02\uff08\uff09]`.
fn is_full_width_punct(c: char) -> bool {
    matches!(
        c,
        '\u{ff0e}'
            | '\u{ff0c}'
            | '\u{ff1f}'
            | '\u{ff1a}'
            | '\u{ff1b}'
            | '\u{ff01}'
            | '\u{ff02}'
            | '\u{ff08}'
            | '\u{ff09}'
    )
}

/// `_remove_punct`'s class `[\.,\?:;!\"\(\)]`.
fn is_removed_punct(c: char) -> bool {
    matches!(c, '.' | ',' | '?' | ':' | ';' | '!' | '"' | '(' | ')')
}

/// `re.sub` of a two-character pattern `(a)(b)` with a replacement that puts spaces around:
/// at each position, if `first(c0)` and `second(c1)`, emits `replace(c0, c1)` and skips both.
fn sub_pairs(
    text: &str,
    first: impl Fn(char) -> bool,
    second: impl Fn(char) -> bool,
    replace: impl Fn(char, char, &mut String),
) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    while i < chars.len() {
        if i + 1 < chars.len() && first(chars[i]) && second(chars[i + 1]) {
            replace(chars[i], chars[i + 1], &mut out);
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Every character `pick`ed, as `" c "`.
fn space_around(text: &str, pick: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if pick(c) {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// `_normalize_general_and_western`.
fn normalize_general_and_western(sent: &str) -> String {
    let is_digit = |c: char| c.is_ascii_digit();
    // End-of-line hyphenation, line joins, four XML entities (in this order).
    let sent = sent
        .replace("\n-", "")
        .replace('\n', " ")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">");
    let sent = format!(" {sent} ");
    let sent = space_around(&sent, is_western_punct);
    // Possessives: `'s ` anywhere, `'s$` at the end (never: the text ends with a space).
    let mut sent = sent.replace("'s ", " 's ");
    if sent.ends_with("'s") {
        sent.truncate(sent.len() - 2);
        sent.push_str(" 's");
    }
    // `([^0-9])([\.,])` -> `\1 \2 `
    let sent = sub_pairs(
        &sent,
        |c| !is_digit(c),
        |c| c == '.' || c == ',',
        |a, b, out| {
            out.push(a);
            out.push(' ');
            out.push(b);
            out.push(' ');
        },
    );
    // `([\.,])([^0-9])` -> ` \1 \2`
    let sent = sub_pairs(
        &sent,
        |c| c == '.' || c == ',',
        |c| !is_digit(c),
        |a, b, out| {
            out.push(' ');
            out.push(a);
            out.push(' ');
            out.push(b);
        },
    );
    // `([0-9])(-)` -> `\1 \2 `
    sub_pairs(
        &sent,
        is_digit,
        |c| c == '-',
        |a, b, out| {
            out.push(a);
            out.push(' ');
            out.push(b);
            out.push(' ');
        },
    )
}

/// sacrebleu's `TercomTokenizer(normalized, no_punct, asian_support, case_sensitive)(sent)`:
/// Python's `str.lower` unless `case_sensitive`; with `normalized`, the general and Western
/// normalization (line joins, XML entities, ASCII punctuation split off, possessive `'s`,
/// `.`/`,` split off unless next to a digit, `-` after a digit), and with `asian_support` too,
/// CJK characters and punctuation split off; with `no_punct`, `.,?:;!"()` removed (and with
/// `asian_support`, the Asian and full-width punctuation); then the words of `str.split()`
/// joined by single spaces.
///
/// `asian_support` alone changes nothing (as in sacrebleu).
///
/// ```
/// use candle_bleu::exact::ter::{tercom_tokenize, TerConfig};
/// let cfg = TerConfig { normalized: true, ..TerConfig::default() };
/// assert_eq!(tercom_tokenize("John's car, 1,000 &amp; more.", &cfg), "john 's car , 1,000 & more .");
/// let no_punct = TerConfig { no_punct: true, case_sensitive: true, ..TerConfig::default() };
/// assert_eq!(tercom_tokenize("Hello, (big) world!", &no_punct), "Hello big world");
/// ```
pub fn tercom_tokenize(sent: &str, cfg: &TerConfig) -> String {
    if sent.is_empty() {
        return String::new();
    }
    let mut sent = if cfg.case_sensitive {
        sent.to_owned()
    } else {
        python_lower(sent)
    };
    if cfg.normalized {
        sent = normalize_general_and_western(&sent);
        if cfg.asian_support {
            sent = space_around(&sent, is_asian_split);
        }
    }
    if cfg.no_punct {
        sent.retain(|c| !is_removed_punct(c));
        if cfg.asian_support {
            sent.retain(|c| !(is_asian_punct(c) || is_full_width_punct(c)));
        }
    }
    let mut out = String::with_capacity(sent.len());
    for word in python_split(&sent) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(asian: bool) -> TerConfig {
        TerConfig {
            normalized: true,
            asian_support: asian,
            ..TerConfig::default()
        }
    }

    #[test]
    fn western_normalization_follows_the_regexes() {
        // Values from sacrebleu 2.6.0's TercomTokenizer(normalized=True).
        let cfg = norm(false);
        assert_eq!(
            tercom_tokenize("a.b,c 1.5 2,000 x-1 1-x", &cfg),
            "a . b , c 1.5 2,000 x-1 1 - x"
        );
        assert_eq!(
            tercom_tokenize("line\n-break\nnext", &cfg),
            "linebreak next"
        );
        assert_eq!(
            tercom_tokenize("&amp;quot; &lt;a&gt;", &cfg),
            "& quot ; < a >"
        );
        assert_eq!(tercom_tokenize("it's Bob's", &cfg), "it 's bob 's");
        assert_eq!(tercom_tokenize("...", &cfg), ". . .");
    }

    #[test]
    fn asian_support_splits_cjk() {
        assert_eq!(tercom_tokenize("我爱北京。", &norm(true)), "我 爱 北 京 。");
        // asian_support alone does nothing.
        let alone = TerConfig {
            asian_support: true,
            ..TerConfig::default()
        };
        assert_eq!(tercom_tokenize("我爱北京。", &alone), "我爱北京。");
        let no_punct = TerConfig {
            no_punct: true,
            asian_support: true,
            ..TerConfig::default()
        };
        assert_eq!(tercom_tokenize("我爱北京。（你）", &no_punct), "我爱北京你");
    }
}
