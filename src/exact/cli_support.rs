//! Not part of the API: what the `candle-bleu` binary, the fuzz targets and the tests need
//! besides it (Python's string functions, the literal reference tokenizer, the interned
//! counter). It may change in any release.

pub use super::stats::InternedStatsCounter;
pub use super::tokenize::python::{
    is_python_whitespace, python_lower, python_lower_into, python_rstrip, python_split,
    python_strip,
};
use super::tokenize::Tokenizer;

/// The tokens of `exact::tokenize::tokenize` computed the slow, literal way (every regular
/// expression of 13a and zh applied as a whole-line pass, as sacrebleu does), for
/// differential tests of the one-scan tokenizers.
pub fn tokenize_reference(text: &str, tok: Tokenizer, lowercase: bool) -> Vec<String> {
    super::tokenize::tokenize_reference(text, tok, lowercase)
}
