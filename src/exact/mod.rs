//! Exact (discrete) BLEU that reproduces sacrebleu 2.6 and NLTK 3.10 to the last digit.
//!
//! SKELETON: types and signatures are fixed (issue 2); bodies are being written.

use std::hash::Hash;

pub mod tokenize;

pub use tokenize::{tokenize, Tokenizer};

/// Errors of the exact BLEU: each names the offending argument and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum BleuError {
    /// A malformed argument: which one, and what is wrong with it.
    InvalidArgument {
        argument: &'static str,
        message: String,
    },
}

impl std::fmt::Display for BleuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BleuError::InvalidArgument { argument, message } => {
                write!(f, "invalid `{argument}`: {message}")
            }
        }
    }
}

impl std::error::Error for BleuError {}

/// Smoothing of zero n-gram precisions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Smoothing {
    None,
    Floor(f64),
    AddK(f64),
    Exp,
    /// NLTK `SmoothingFunction().methodK`, K in 0..=7; the whole computation follows NLTK.
    Nltk(u8),
}

#[derive(Debug, Clone, PartialEq)]
pub struct BleuConfig {
    pub max_order: usize,
    pub weights: Option<Vec<f64>>,
    pub smoothing: Smoothing,
    pub effective_order: bool,
}

impl Default for BleuConfig {
    fn default() -> Self {
        Self {
            max_order: 4,
            weights: None,
            smoothing: Smoothing::Exp,
            effective_order: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BleuStats {
    pub matches: Vec<u64>,
    pub totals: Vec<u64>,
    pub hyp_len: u64,
    pub ref_len: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    pub bleu: f64,
    pub precisions: Vec<f64>,
    pub bp: f64,
    pub ratio: f64,
    pub hyp_len: u64,
    pub ref_len: u64,
}

pub fn corpus_bleu<T: Eq + Hash>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    cfg: &BleuConfig,
) -> Result<BleuScore, BleuError> {
    let _ = (hyps, refs, cfg);
    todo!("exact::corpus_bleu")
}

pub fn sentence_bleu<T: Eq + Hash>(
    hyp: &[T],
    refs: &[Vec<T>],
    cfg: &BleuConfig,
) -> Result<BleuScore, BleuError> {
    let _ = (hyp, refs, cfg);
    todo!("exact::sentence_bleu")
}
