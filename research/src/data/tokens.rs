//! Token-level parallel text: whitespace or character tokens, tab-separated files, and
//! vocabularies with the four special ids first ([`PAD`], [`BOS`], [`EOS`], [`UNK`]). The
//! synthetic tasks of the `seq2seq` and `study` examples and `seq2seq --train/--dev/--test`
//! files come as [`TokenPair`]s; [`super::batch`] turns their ids into tensors.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;

use super::special::{BOS, EOS, PAD, SPECIAL_TOKENS, UNK};

/// Stand-in for a space in `--char` mode, so that character sequences written as
/// whitespace-separated tokens keep their word boundaries.
pub const CHAR_SPACE: &str = "\u{2581}";

/// One sentence pair as tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenPair {
    /// Source tokens.
    pub src: Vec<String>,
    /// Target tokens.
    pub tgt: Vec<String>,
}

/// Train, dev and test pairs as tokens.
#[derive(Debug, Clone)]
pub struct TokenCorpus {
    /// Training pairs.
    pub train: Vec<TokenPair>,
    /// Development pairs.
    pub dev: Vec<TokenPair>,
    /// Test pairs.
    pub test: Vec<TokenPair>,
    /// For the synthetic task: each test source translated by the task's rules with the most
    /// probable choice of every word (no model). A yardstick, not an upper bound on BLEU.
    pub test_oracle: Option<Vec<Vec<String>>>,
}

/// How a line of a parallel file becomes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// Split on whitespace.
    Whitespace,
    /// One token per character; spaces become [`CHAR_SPACE`].
    Char,
}

/// Tokens of one side of a line.
pub fn tokenize(text: &str, mode: Tokens) -> Vec<String> {
    match mode {
        Tokens::Whitespace => text.split_whitespace().map(str::to_string).collect(),
        Tokens::Char => {
            let words: Vec<&str> = text.split_whitespace().collect();
            let mut tokens = Vec::new();
            for (w, word) in words.iter().enumerate() {
                if w > 0 {
                    tokens.push(CHAR_SPACE.to_string());
                }
                tokens.extend(word.chars().map(|c| c.to_string()));
            }
            tokens
        }
    }
}

/// Reads a tab-separated parallel file: `source<TAB>target` on every non-empty line.
pub fn read_tsv(path: &Path, mode: Tokens) -> Result<Vec<TokenPair>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read parallel file {}", path.display()))?;
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((src, tgt)) = line.split_once('\t') else {
            bail!(
                "{}:{}: expected `source<TAB>target`, found no tab",
                path.display(),
                number + 1
            );
        };
        let pair = TokenPair {
            src: tokenize(src, mode),
            tgt: tokenize(tgt, mode),
        };
        if pair.src.is_empty() || pair.tgt.is_empty() {
            bail!("{}:{}: empty source or target", path.display(), number + 1);
        }
        pairs.push(pair);
    }
    if pairs.is_empty() {
        bail!("{} holds no sentence pairs", path.display());
    }
    Ok(pairs)
}

/// Writes pairs as a tab-separated file (tokens joined by spaces).
pub fn write_tsv(path: &Path, pairs: &[TokenPair]) -> Result<()> {
    let mut text = String::new();
    for pair in pairs {
        text.push_str(&pair.src.join(" "));
        text.push('\t');
        text.push_str(&pair.tgt.join(" "));
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// A token vocabulary with the four special ids first.
#[derive(Debug, Clone)]
pub struct Vocab {
    tokens: Vec<String>,
    index: HashMap<String, u32>,
}

impl Vocab {
    /// The vocabulary of every token in `sequences`, in order of first appearance.
    pub fn build<'a>(sequences: impl IntoIterator<Item = &'a Vec<String>>) -> Self {
        let mut vocab = Vocab {
            tokens: Vec::new(),
            index: HashMap::new(),
        };
        for special in SPECIAL_TOKENS {
            vocab.insert(special);
        }
        for sequence in sequences {
            for token in sequence {
                vocab.insert(token);
            }
        }
        vocab
    }

    fn insert(&mut self, token: &str) {
        if !self.index.contains_key(token) {
            self.index
                .insert(token.to_string(), self.tokens.len() as u32);
            self.tokens.push(token.to_string());
        }
    }

    /// Number of tokens, the special ones included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true: the special tokens are always there.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Ids of `tokens`; unknown tokens become [`UNK`].
    pub fn encode(&self, tokens: &[String]) -> Vec<u32> {
        tokens
            .iter()
            .map(|t| self.index.get(t).copied().unwrap_or(UNK))
            .collect()
    }

    /// Tokens of `ids` up to the first [`EOS`], skipping padding and BOS. Errors: an id
    /// outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<String>> {
        ids.iter()
            .take_while(|&&id| id != EOS)
            .filter(|&&id| id != PAD && id != BOS)
            .map(|&id| match self.tokens.get(id as usize) {
                Some(token) => Ok(token.clone()),
                None => bail!(
                    "id {id} is outside the vocabulary (size {})",
                    self.tokens.len()
                ),
            })
            .collect()
    }
}

/// Writes one segment a line, tokens joined by spaces (the hypothesis and reference files
/// the examples write: `sacrebleu REF -i HYP --tokenize none` scores them).
pub fn write_lines(path: &Path, segments: &[Vec<String>]) -> Result<()> {
    let mut text = String::new();
    for segment in segments {
        text.push_str(&segment.join(" "));
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
