//! sacrebleu 2.6.0's tokenizers: exactly the tokens sacrebleu scores.
//!
//! sacrebleu's pipeline per segment is `line.lower()` (if `lowercase`), then
//! `tokenizer(line.rstrip())`, then `str.split()`; [`tokenize`] reproduces all three steps, with
//! Python's string semantics:
//!
//! - whitespace is Python's `str.isspace`: the ASCII whitespace, U+001C..U+001F (not whitespace
//!   for Rust's `char::is_whitespace`), U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
//!   U+202F, U+205F, U+3000; U+200B (zero width space) is not whitespace;
//! - lowercasing is Python's `str.lower`: full mappings ('İ' -> "i\u{307}") and the final-sigma
//!   rule, on Python's Unicode data rather than Rust's `str::to_lowercase`.
//!
//! Tokenizers ([`Tokenizer`]):
//! - `none`: whitespace split only.
//! - `13a` (default, mteval-v13a): `<skipped>`, `-\n`, `\n` and four HTML entities rewritten, then
//!   ASCII punctuation split off except `'`, `-` and `.`/`,` next to digits (module `v13a`). Non-ASCII
//!   punctuation (… “ ， «) stays attached to its word.
//! - `intl` (mteval-v14 international): Unicode punctuation split off unless between digits,
//!   symbols always (module `intl`); a sentence-final `1998.` stays one token.
//! - `char`: every non-whitespace code point is a token (code points, not graphemes).
//! - `zh`: "Chinese" code points split off, then the 13a expressions (module `zh`); includes
//!   sacrebleu's `'\u20000'` bug (U+2001..U+2A6D are split, CJK Extension B is not).
//!
//! # Unicode versions
//! The tokens depend on Unicode data, read off the generator's environment into the committed
//! `tables.rs` (`tests/golden/generate_tokenize.py` regenerates it): whitespace, `str.lower` and
//! the final-sigma classes of **Python 3.11.7 (Unicode 14.0.0)**, and the `\p{P}`, `\p{S}`,
//! `\p{N}` classes of the **`regex` package 2026.11.15 (Unicode 17.0.0)** that the `intl`
//! tokenizer uses. sacrebleu run on another Python (e.g. 3.12 has Unicode 15.0, 3.13 has 15.1)
//! or `regex` release can differ, but only on characters assigned or re-categorised between
//! those versions.
//!
//! # Speed
//! [`tokenize`] allocates a `String` per token. Scoring a corpus should reuse a
//! [`TokenizeBuffer`], whose [`TokenizeBuffer::tokenize`] returns borrowed `&str` tokens and
//! allocates nothing once its buffers have grown to the longest line.

use std::fmt;
use std::str::FromStr;

mod intl;
pub(super) mod python;
mod regexp;
#[rustfmt::skip]
mod tables;
mod v13a;
mod zh;

pub use python::is_python_whitespace;
pub(crate) use python::{
    python_lower, python_lower_into, python_rstrip, python_split, PythonSplit,
};

/// One of sacrebleu's tokenizers; parsed from and displayed as sacrebleu's `--tokenize` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tokenizer {
    /// `none`: split on whitespace only.
    None,
    /// `13a`: mteval-v13a, sacrebleu's default.
    #[default]
    V13a,
    /// `intl`: mteval-v14 international (Unicode punctuation and symbols).
    Intl,
    /// `char`: one token per non-whitespace code point.
    Char,
    /// `zh`: Chinese characters split out, then 13a.
    Zh,
}

impl Tokenizer {
    /// Every tokenizer, in sacrebleu's documentation order.
    pub const ALL: [Tokenizer; 5] = [
        Tokenizer::None,
        Tokenizer::V13a,
        Tokenizer::Intl,
        Tokenizer::Char,
        Tokenizer::Zh,
    ];

    /// sacrebleu's name of the tokenizer (`--tokenize` value and signature `tok:` field).
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::None => "none",
            Tokenizer::V13a => "13a",
            Tokenizer::Intl => "intl",
            Tokenizer::Char => "char",
            Tokenizer::Zh => "zh",
        }
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tokenizer name that is not one of `none`, `13a`, `intl`, `char`, `zh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseTokenizerError {
    /// The name as given.
    pub name: String,
}

impl fmt::Display for ParseTokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown tokenizer {:?}: expected one of none, 13a, intl, char, zh \
             (sacrebleu's ja-mecab, ko-mecab, spm and flores tokenizers are not supported)",
            self.name
        )
    }
}

impl std::error::Error for ParseTokenizerError {}

impl FromStr for Tokenizer {
    type Err = ParseTokenizerError;

    /// Exact, case-sensitive names, as sacrebleu's `--tokenize` accepts them.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Tokenizer::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| ParseTokenizerError {
                name: name.to_owned(),
            })
    }
}

/// The tokens sacrebleu 2.6.0 scores for `text`:
/// `(text.lower() if lowercase else text)`, then `tokenizer(line.rstrip())`, then `.split()`.
/// Every token is non-empty and free of Python whitespace; `""` and whitespace-only text give no
/// token. For many lines, reuse a [`TokenizeBuffer`] instead.
///
/// ```
/// use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
/// let line = "Hello, world: 1,000.5 &amp; \"more\"!";
/// assert_eq!(
///     tokenize(line, Tokenizer::V13a, false),
///     ["Hello", ",", "world", ":", "1,000.5", "&", "\"", "more", "\"", "!"]
/// );
/// assert_eq!(tokenize(line, Tokenizer::None, true)[0], "hello,");
/// assert_eq!(tokenize("中文abc", Tokenizer::Zh, false), ["中", "文", "abc"]);
/// assert_eq!(tokenize("a b", Tokenizer::Char, false), ["a", "b"]);
/// ```
pub fn tokenize(text: &str, tok: Tokenizer, lowercase: bool) -> Vec<String> {
    TokenizeBuffer::default()
        .tokenize(text, tok, lowercase)
        .map(str::to_owned)
        .collect()
}

/// Reusable scratch space for tokenizing many lines without allocating per line or per token.
///
/// ```
/// use candle_bleu::exact::tokenize::{TokenizeBuffer, Tokenizer};
/// let mut buf = TokenizeBuffer::default();
/// let tokens: Vec<&str> = buf.tokenize("Hello, world!", Tokenizer::V13a, false).collect();
/// assert_eq!(tokens, ["Hello", ",", "world", "!"]);
/// ```
#[derive(Debug, Default, Clone)]
pub struct TokenizeBuffer {
    lowered: String,
    unescaped: String,
    spans: Vec<(usize, usize)>,
    passes: regexp::PassBuffers,
    intl: intl::IntlBuffers,
}

impl TokenizeBuffer {
    /// Same tokens as [`tokenize`], borrowed from `text` or from this buffer (valid until its next
    /// use).
    pub fn tokenize<'a>(
        &'a mut self,
        text: &'a str,
        tok: Tokenizer,
        lowercase: bool,
    ) -> Tokens<'a> {
        let TokenizeBuffer {
            lowered,
            unescaped,
            spans,
            passes,
            intl,
        } = self;
        let text: &'a str = if lowercase {
            lowered.clear();
            python_lower_into(text, lowered);
            lowered
        } else {
            text
        };
        let line = python_rstrip(text);
        spans.clear();
        let inner = match tok {
            Tokenizer::None => TokensInner::Split(python_split(line)),
            Tokenizer::Char => TokensInner::Chars { text: line, pos: 0 },
            Tokenizer::V13a => {
                let line = v13a::unescape_13a(line, unescaped);
                regexp::regexp_spans::<false>(line, true, spans, passes);
                TokensInner::Spans {
                    text: line,
                    spans: spans.iter(),
                }
            }
            Tokenizer::Zh => {
                let line = zh::zh_spans(line, spans, passes);
                TokensInner::Spans {
                    text: line,
                    spans: spans.iter(),
                }
            }
            Tokenizer::Intl => TokensInner::Split(python_split(intl::tokenize_intl(line, intl))),
        };
        Tokens { inner }
    }
}

/// The reference implementation of [`tokenize`]: the same tokens, computed the slow, literal
/// way, every regular expression of 13a and zh applied as a whole-line pass, as sacrebleu
/// does (for none, char and intl it is [`tokenize`]). [`tokenize`] and
/// [`TokenizeBuffer::tokenize`] scan a line once instead; the golden tests and the fuzz target
/// check them against this one. Use [`tokenize`] to score.
///
/// ```
/// use candle_bleu::exact::tokenize::{tokenize, tokenize_reference, Tokenizer};
/// let line = "Hello, world &amp; \"friends\"! 3.14";
/// assert_eq!(tokenize_reference(line, Tokenizer::V13a, true), tokenize(line, Tokenizer::V13a, true));
/// ```
pub fn tokenize_reference(text: &str, tok: Tokenizer, lowercase: bool) -> Vec<String> {
    let text = if lowercase {
        python_lower(text)
    } else {
        text.to_owned()
    };
    let line = python_rstrip(&text);
    let mut passes = regexp::PassBuffers::default();
    let mut spaced = String::new();
    let out = match tok {
        Tokenizer::V13a => v13a::tokenize_13a_reference(line, &mut passes),
        Tokenizer::Zh => zh::tokenize_zh_reference(line, &mut spaced, &mut passes),
        _ => return tokenize(line, tok, false),
    };
    python_split(out).map(str::to_owned).collect()
}

/// Iterator over the tokens of one line, from [`TokenizeBuffer::tokenize`].
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    inner: TokensInner<'a>,
}

#[derive(Debug, Clone)]
enum TokensInner<'a> {
    Split(PythonSplit<'a>),
    /// 13a and zh: byte ranges of `text`.
    Spans {
        text: &'a str,
        spans: std::slice::Iter<'a, (usize, usize)>,
    },
    /// `char`: each non-whitespace code point of `text[pos..]`.
    Chars {
        text: &'a str,
        pos: usize,
    },
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        match &mut self.inner {
            TokensInner::Split(split) => split.next(),
            TokensInner::Spans { text, spans } => {
                spans.next().map(|&(start, end)| &text[start..end])
            }
            TokensInner::Chars { text, pos } => {
                let (i, c) = text[*pos..]
                    .char_indices()
                    .find(|&(_, c)| !is_python_whitespace(c))?;
                let start = *pos + i;
                *pos = start + c.len_utf8();
                Some(&text[start..*pos])
            }
        }
    }
}
