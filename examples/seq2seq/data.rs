//! Parallel data: the synthetic translation task, tab-separated files, vocabularies and
//! batches.
//!
//! The synthetic task translates a small English-like SVO language into an invented SOV
//! language. It is built so that BLEU's partial credit matters:
//! - **reordering**: verb-final sentences, nouns before their adjectives and determiners,
//!   postpositions instead of prepositions, the prepositional phrase moved before the object;
//! - **one-to-many mappings**: verbs become a stem plus a tense particle, some nouns become
//!   two-word compounds, `this` becomes two words, objects get a case particle;
//! - **ambiguity**: several source words have two valid translations (synonyms), chosen at
//!   random with unequal probabilities in every reference. No system can predict every
//!   choice, so even a perfect model scores below 100 BLEU and earns partial credit per
//!   n-gram.
//!
//! Everything is generated from a fixed data seed, independent of the model seed, so every
//! run and every seed sees the same train, dev and test sets.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;

/// Padding id: never a real token, and the `pad_id` given to `References::from_ids`.
pub const PAD: u32 = 0;
/// Start-of-sentence id, the decoder's first input.
pub const BOS: u32 = 1;
/// End-of-sentence id, the decoder's last target.
pub const EOS: u32 = 2;
/// Unknown-token id, for source or target tokens missing from the training vocabulary.
pub const UNK: u32 = 3;
const SPECIALS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];

/// Stand-in for a space in `--char` mode, so that character sequences written as
/// whitespace-separated tokens keep their word boundaries.
pub const CHAR_SPACE: &str = "\u{2581}";

/// One sentence pair as tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub src: Vec<String>,
    pub tgt: Vec<String>,
}

/// Train, dev and test pairs.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub train: Vec<Pair>,
    pub dev: Vec<Pair>,
    pub test: Vec<Pair>,
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
pub fn read_tsv(path: &Path, mode: Tokens) -> Result<Vec<Pair>> {
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
        let pair = Pair {
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
pub fn write_tsv(path: &Path, pairs: &[Pair]) -> Result<()> {
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
        for special in SPECIALS {
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

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Ids of `tokens`; unknown tokens become [`UNK`].
    pub fn encode(&self, tokens: &[String]) -> Vec<u32> {
        tokens
            .iter()
            .map(|t| self.index.get(t).copied().unwrap_or(UNK))
            .collect()
    }

    /// Tokens of `ids` up to the first [`EOS`], skipping padding and BOS.
    pub fn decode(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .take_while(|&&id| id != EOS)
            .filter(|&&id| id != PAD && id != BOS)
            .map(|&id| self.tokens[id as usize].clone())
            .collect()
    }
}

/// A pair as ids.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub src: Vec<u32>,
    pub tgt: Vec<u32>,
}

pub fn encode_pairs(pairs: &[Pair], src_vocab: &Vocab, tgt_vocab: &Vocab) -> Vec<Encoded> {
    pairs
        .iter()
        .map(|p| Encoded {
            src: src_vocab.encode(&p.src),
            tgt: tgt_vocab.encode(&p.tgt),
        })
        .collect()
}

/// A training batch as tensors.
pub struct Batch {
    /// u32 `[B, Ts]`: source ids, right-padded with [`PAD`].
    pub src: Tensor,
    /// u32 `[B, Tt + 1]`: `BOS y_1 .. y_T`, right-padded with [`PAD`].
    pub dec_in: Tensor,
    /// u32 `[B, Tt + 1]`: `y_1 .. y_T EOS`, right-padded with [`PAD`] (the cross-entropy's
    /// `pad_id`: padding positions are not targets).
    pub dec_out: Tensor,
    /// u32 `[B, Tt]`: the reference words `y_1 .. y_T` (no EOS), right-padded with [`PAD`].
    pub refs: Tensor,
    /// u32 `[B]`: reference lengths `T` (words, no EOS).
    pub ref_len: Tensor,
}

fn pad_rows(rows: &[Vec<u32>], width: usize) -> Vec<u32> {
    let mut flat = Vec::with_capacity(rows.len() * width);
    for row in rows {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(PAD, width - row.len()));
    }
    flat
}

/// Source ids as a padded u32 `[B, Ts]` tensor.
pub fn source_tensor(examples: &[&Encoded], device: &Device) -> Result<Tensor> {
    let rows: Vec<Vec<u32>> = examples.iter().map(|e| e.src.clone()).collect();
    let width = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    Ok(Tensor::from_vec(
        pad_rows(&rows, width),
        (rows.len(), width),
        device,
    )?)
}

/// The tensors of one batch.
pub fn make_batch(examples: &[&Encoded], device: &Device) -> Result<Batch> {
    let b = examples.len();
    let t = examples.iter().map(|e| e.tgt.len()).max().unwrap_or(1);
    let dec_in: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| std::iter::once(BOS).chain(e.tgt.iter().copied()).collect())
        .collect();
    let dec_out: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| e.tgt.iter().copied().chain(std::iter::once(EOS)).collect())
        .collect();
    let refs: Vec<Vec<u32>> = examples.iter().map(|e| e.tgt.clone()).collect();
    let ref_len: Vec<u32> = examples.iter().map(|e| e.tgt.len() as u32).collect();
    Ok(Batch {
        src: source_tensor(examples, device)?,
        dec_in: Tensor::from_vec(pad_rows(&dec_in, t + 1), (b, t + 1), device)?,
        dec_out: Tensor::from_vec(pad_rows(&dec_out, t + 1), (b, t + 1), device)?,
        refs: Tensor::from_vec(pad_rows(&refs, t), (b, t), device)?,
        ref_len: Tensor::from_vec(ref_len, b, device)?,
    })
}

/// An endless stream of shuffled training batches, reproducible from a seed.
pub struct Batches {
    order: Vec<usize>,
    position: usize,
    batch_size: usize,
    rng: StdRng,
}

impl Batches {
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_ba7c);
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut rng);
        Batches {
            order,
            position: 0,
            batch_size: batch_size.min(len).max(1),
            rng,
        }
    }

    /// Indices of the next batch; reshuffles at the end of each epoch.
    pub fn next_indices(&mut self) -> Vec<usize> {
        if self.position + self.batch_size > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.position = 0;
        }
        let batch = self.order[self.position..self.position + self.batch_size].to_vec();
        self.position += self.batch_size;
        batch
    }
}

// ---------------------------------------------------------------------------------------
// The synthetic task.
// ---------------------------------------------------------------------------------------

const NOUNS: [&str; 16] = [
    "dog", "cat", "bird", "horse", "farmer", "teacher", "child", "king", "river", "house", "tree",
    "garden", "ship", "city", "book", "song",
];
const ADJECTIVES: [&str; 8] = [
    "big", "small", "old", "young", "red", "green", "happy", "quiet",
];
/// (present, past) forms.
const VERBS: [(&str, &str); 8] = [
    ("sees", "saw"),
    ("finds", "found"),
    ("carries", "carried"),
    ("follows", "followed"),
    ("helps", "helped"),
    ("paints", "painted"),
    ("watches", "watched"),
    ("builds", "built"),
];
const DETERMINERS: [&str; 3] = ["the", "a", "this"];
const PREPOSITIONS: [&str; 3] = ["near", "behind", "with"];

/// Translation choices of one source word: each a token sequence with a probability.
#[derive(Debug, Clone)]
struct Entry {
    choices: Vec<(Vec<String>, f64)>,
}

impl Entry {
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

/// The bilingual lexicon of the synthetic task.
struct Lexicon {
    words: HashMap<&'static str, Entry>,
    /// Tense particles (present, past).
    tense: (String, String),
    /// Object case particle.
    object_marker: String,
}

/// Invented target words: distinct two-syllable words from a fixed syllable set.
fn invent_words(count: usize, rng: &mut StdRng) -> Vec<String> {
    const ONSETS: [&str; 12] = ["k", "t", "m", "n", "s", "r", "l", "v", "d", "b", "g", "h"];
    const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
    let mut seen = std::collections::HashSet::new();
    let mut words = Vec::with_capacity(count);
    while words.len() < count {
        let syllables = if rng.gen_bool(0.3) { 3 } else { 2 };
        let word: String = (0..syllables)
            .map(|_| {
                format!(
                    "{}{}",
                    ONSETS[rng.gen_range(0..ONSETS.len())],
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

fn build_lexicon(rng: &mut StdRng) -> Lexicon {
    let mut fresh = invent_words(80, rng).into_iter();
    let mut next = || {
        fresh
            .next()
            .expect("80 invented words suffice for the lexicon")
    };
    let mut words = HashMap::new();
    let single = |w: String| Entry {
        choices: vec![(vec![w], 1.0)],
    };
    let synonyms = |a: String, b: String, p: f64| Entry {
        choices: vec![(vec![a], p), (vec![b], 1.0 - p)],
    };
    // Nouns: 0-3 are compounds (one-to-many), 4-8 have synonyms, the rest map one-to-one.
    for (i, &noun) in NOUNS.iter().enumerate() {
        let entry = match i {
            0..=3 => Entry {
                choices: vec![(vec![next(), next()], 1.0)],
            },
            4..=8 => synonyms(next(), next(), if i % 2 == 0 { 0.6 } else { 0.7 }),
            _ => single(next()),
        };
        words.insert(noun, entry);
    }
    for (i, &adjective) in ADJECTIVES.iter().enumerate() {
        let entry = if i < 3 {
            synonyms(next(), next(), 0.6)
        } else {
            single(next())
        };
        words.insert(adjective, entry);
    }
    // Verbs: both forms share the stem; 0-1 have synonymous stems. The tense particle is
    // added by the sentence rule.
    for (i, &(present, past)) in VERBS.iter().enumerate() {
        let entry = if i < 2 {
            synonyms(next(), next(), 0.6)
        } else {
            single(next())
        };
        words.insert(present, entry.clone());
        words.insert(past, entry);
    }
    words.insert("the", single(next()));
    words.insert(
        "a",
        Entry {
            choices: vec![(vec![next()], 0.7), (vec![], 0.3)],
        },
    );
    words.insert(
        "this",
        Entry {
            choices: vec![(vec![next(), next()], 1.0)],
        },
    );
    words.insert("near", single(next()));
    words.insert("behind", single(next()));
    words.insert("with", synonyms(next(), next(), 0.5));
    Lexicon {
        words,
        tense: (next(), next()),
        object_marker: next(),
    }
}

/// A noun phrase: source tokens and the lexicon keys to translate, target order reversed.
fn noun_phrase(rng: &mut StdRng) -> Vec<&'static str> {
    let mut phrase = vec![DETERMINERS[rng.gen_range(0..DETERMINERS.len())]];
    let adjectives = [0, 0, 1, 1, 2][rng.gen_range(0..5)];
    let mut used = Vec::new();
    while used.len() < adjectives {
        let adjective = ADJECTIVES[rng.gen_range(0..ADJECTIVES.len())];
        if !used.contains(&adjective) {
            used.push(adjective);
        }
    }
    phrase.extend(used);
    phrase.push(NOUNS[rng.gen_range(0..NOUNS.len())]);
    phrase
}

fn translate_phrase(
    phrase: &[&str],
    lexicon: &Lexicon,
    pick: &mut dyn FnMut(&Entry) -> Vec<String>,
) -> Vec<String> {
    // Target noun phrases are mirrored: noun, adjectives (inner first), determiner.
    phrase
        .iter()
        .rev()
        .flat_map(|w| pick(&lexicon.words[w]))
        .collect()
}

/// The structure of a source sentence.
struct Sentence {
    subject: Vec<&'static str>,
    verb: &'static str,
    is_past: bool,
    object: Vec<&'static str>,
    adjunct: Option<(&'static str, Vec<&'static str>)>,
}

/// Target: SUBJ [PP-NP POSTP] OBJ ko VERB TENSE, each word's translation from `pick`.
fn translate(
    sentence: &Sentence,
    lexicon: &Lexicon,
    pick: &mut dyn FnMut(&Entry) -> Vec<String>,
) -> Vec<String> {
    let mut tgt = translate_phrase(&sentence.subject, lexicon, pick);
    if let Some((preposition, phrase)) = &sentence.adjunct {
        tgt.extend(translate_phrase(phrase, lexicon, pick));
        tgt.extend(pick(&lexicon.words[preposition]));
    }
    tgt.extend(translate_phrase(&sentence.object, lexicon, pick));
    tgt.push(lexicon.object_marker.clone());
    tgt.extend(pick(&lexicon.words[sentence.verb]));
    tgt.push(if sentence.is_past {
        lexicon.tense.1.clone()
    } else {
        lexicon.tense.0.clone()
    });
    tgt
}

/// A sampled pair and the oracle translation of its source.
fn synthetic_pair(lexicon: &Lexicon, rng: &mut StdRng) -> (Pair, Vec<String>) {
    let subject = noun_phrase(rng);
    let object = noun_phrase(rng);
    let (present, past) = VERBS[rng.gen_range(0..VERBS.len())];
    let is_past = rng.gen_bool(0.5);
    let verb = if is_past { past } else { present };
    let adjunct = rng.gen_bool(0.5).then(|| {
        (
            PREPOSITIONS[rng.gen_range(0..PREPOSITIONS.len())],
            noun_phrase(rng),
        )
    });
    let sentence = Sentence {
        subject,
        verb,
        is_past,
        object,
        adjunct,
    };

    let mut src: Vec<&str> = sentence.subject.clone();
    src.push(verb);
    src.extend(&sentence.object);
    if let Some((preposition, phrase)) = &sentence.adjunct {
        src.push(preposition);
        src.extend(phrase);
    }
    let tgt = translate(&sentence, lexicon, &mut |entry| entry.sample(rng));
    let oracle = translate(&sentence, lexicon, &mut |entry| entry.best());
    let pair = Pair {
        src: src.into_iter().map(str::to_string).collect(),
        tgt,
    };
    (pair, oracle)
}

/// The synthetic corpus: `train`, `dev` and `test` pairs from the fixed data seed.
/// Dev and test sources never occur in the training set.
pub fn synthetic_corpus(train: usize, dev: usize, test: usize, data_seed: u64) -> Corpus {
    let mut rng = StdRng::seed_from_u64(data_seed);
    let lexicon = build_lexicon(&mut rng);
    let mut seen_sources = std::collections::HashSet::new();
    let mut take = |n: usize, rng: &mut StdRng| {
        let mut pairs = Vec::with_capacity(n);
        let mut oracles = Vec::with_capacity(n);
        while pairs.len() < n {
            let (pair, oracle) = synthetic_pair(&lexicon, rng);
            if seen_sources.insert(pair.src.join(" ")) {
                pairs.push(pair);
                oracles.push(oracle);
            }
        }
        (pairs, oracles)
    };
    let (train, _) = take(train, &mut rng);
    let (dev, _) = take(dev, &mut rng);
    let (test, test_oracle) = take(test, &mut rng);
    Corpus {
        train,
        dev,
        test,
        test_oracle: Some(test_oracle),
    }
}
