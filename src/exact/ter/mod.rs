//! TER, the translation edit rate (Snover et al. 2006), exactly as sacrebleu 2.6.0's `TER`
//! computes it.
//!
//! TER counts the edits that turn a hypothesis into a reference (block shifts, insertions,
//! deletions and substitutions of words, each costing 1) per reference word. [`corpus_ter`]
//! and [`sentence_ter`] take detokenized text, as sacrebleu does, and [`TerConfig`] holds
//! sacrebleu's options (`TER()` is [`TerConfig::default`]).
//!
//! ```
//! use candle_bleu::exact::ter::{corpus_ter, sentence_ter, TerConfig};
//! let hyps = ["the mat the cat sat on", "hello world"];
//! let refs = [vec!["The cat sat on the mat"], vec!["hello there world"]];
//! // sacrebleu: TER().corpus_score(hyps, [[r[0] for r in refs]]): one shift and one insertion
//! let ter = corpus_ter(&hyps, &refs, TerConfig::default())?;
//! assert_eq!((ter.edits, ter.ref_len), (2.0, 9.0));
//! assert!((ter.score - 22.22222222222222).abs() < 1e-9);
//! // Case-sensitive: "The" no longer matches "the".
//! let cs = TerConfig { case_sensitive: true, ..TerConfig::default() };
//! let one = sentence_ter("the mat the cat sat on", &["The cat sat on the mat"], cs)?;
//! assert!((one.score - 33.33333333333333).abs() < 1e-9);
//! # Ok::<(), candle_bleu::exact::MetricError>(())
//! ```
//!
//! # What sacrebleu computes (and this module reproduces)
//! For each segment:
//! - **tokens**: `TercomTokenizer(line.rstrip())` ([`tercom_tokenize`]): Python's `str.lower`
//!   unless `case_sensitive`, the normalization and punctuation removal the options ask for,
//!   then `str.split()`. References go through it twice (sacrebleu's `_cache_references` and
//!   `_extract_reference_info` both preprocess them), which this module repeats;
//! - **edits against one reference** ([`translation_edit_rate`]): while the best block shift
//!   lowers the edit distance, it is made (one edit each). Candidates are the blocks of 1 to 10
//!   words that occur in both, start at most 50 positions apart, are wrong in the hypothesis
//!   and unmatched in the reference under the current alignment; each is tried at the
//!   positions aligned with its reference span, and the best is the largest gain, then the
//!   longest block, the earliest start, the earliest target (tercom's order). After 1000
//!   candidates per reference the search stops (and the shift found in that round is not
//!   made). The edit distance is a Levenshtein distance over words computed in a beam of 25
//!   around the (length-ratio) diagonal, with tercom's tie-breaking for the alignment;
//! - **statistics**: the fewest edits over the segment's references (the first on a tie), and
//!   the **mean** length of its references (`sum / count`, a float); an empty reference has
//!   length 0 and costs one edit per hypothesis word.
//!
//! A corpus sums the statistics ([`TerStats`], additive, in segment order) and scores
//! `100 · edits / ref_len` (100 if `ref_len` is 0 and `edits` is not, 0 if both are 0). A
//! sentence is a corpus of one segment.
//!
//! # Speed
//! Words are interned into segment-local ids. sacrebleu caches rows of the edit-distance
//! matrix in a trie of hypothesis prefixes; here the rows of the current hypothesis are kept
//! and a candidate shift recomputes only those below its first changed word (the same values:
//! a row depends only on the words above it). Corpora of 16 segments or more are scored on
//! rayon's pool.

mod config;
mod edit;
mod entry;
mod tokenizer;

pub use config::{TerConfig, TerScore, TerStats};
pub use entry::{
    corpus_ter, corpus_ter_stats, edit_distance, score_ter_stats, sentence_ter,
    translation_edit_rate,
};
pub use tokenizer::tercom_tokenize;
