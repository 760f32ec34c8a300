//! The synthetic translation tasks of the `seq2seq` and `study` examples: an English-like SVO
//! source language into an invented verb-final target language, with word choices drawn at
//! random in every reference so that no system reaches 100 BLEU and BLEU's partial credit per
//! n-gram matters.
//!
//! - [`reordering`] (`seq2seq`): a 16-noun lexicon; reordering, one-to-many mappings and
//!   synonyms;
//! - [`agreement`] (`study`): a harder variant with a Zipfian 150-noun lexicon, noun classes
//!   that adjectives, determiners and the verb agree with, and relative clauses.
//!
//! Each corpus is drawn from a data seed independent of the model seeds, so every run and
//! every seed sees the same train, dev and test sets; each test source also gets its
//! rule-based translation with every word's most probable choice (`test_oracle`).

use rand::rngs::StdRng;
use rand::Rng;
use std::collections::HashSet;

pub mod agreement;
pub mod reordering;

/// Translation choices of one source word: token sequences with probabilities.
#[derive(Debug, Clone)]
struct Entry {
    choices: Vec<(Vec<String>, f64)>,
}

impl Entry {
    fn single(word: String) -> Self {
        Entry {
            choices: vec![(vec![word], 1.0)],
        }
    }

    fn synonyms(a: String, b: String, p: f64) -> Self {
        Entry {
            choices: vec![(vec![a], p), (vec![b], 1.0 - p)],
        }
    }

    /// The most probable choice (the first among equals).
    fn best(&self) -> Vec<String> {
        let mut best = &self.choices[0];
        for choice in &self.choices[1..] {
            if choice.1 > best.1 {
                best = choice;
            }
        }
        best.0.clone()
    }

    fn sample(&self, rng: &mut StdRng) -> Vec<String> {
        let mut u: f64 = rng.gen();
        for (tokens, p) in &self.choices {
            if u < *p {
                return tokens.clone();
            }
            u -= p;
        }
        self.choices[self.choices.len() - 1].0.clone()
    }
}

/// The consonants that open the invented target words' syllables; [`reordering`] uses the
/// first 12, [`agreement`] all 14.
const ONSETS: [&str; 14] = [
    "k", "t", "m", "n", "s", "r", "l", "v", "d", "b", "g", "h", "p", "z",
];

/// `count` distinct invented target words of two or three syllables, each syllable one of
/// `onsets` and a vowel.
fn invent_words(count: usize, onsets: &[&str], rng: &mut StdRng) -> Vec<String> {
    const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
    let mut seen = HashSet::new();
    let mut words = Vec::with_capacity(count);
    while words.len() < count {
        let syllables = if rng.gen_bool(0.3) { 3 } else { 2 };
        let word: String = (0..syllables)
            .map(|_| {
                format!(
                    "{}{}",
                    onsets[rng.gen_range(0..onsets.len())],
                    VOWELS[rng.gen_range(0..VOWELS.len())]
                )
            })
            .collect();
        if seen.insert(word.clone()) {
            words.push(word);
        }
    }
    words
}
