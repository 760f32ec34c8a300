//! The `seq2seq` example's language: a small English-like SVO language into an invented SOV
//! language, built so that BLEU's partial credit matters:
//! - **reordering**: verb-final sentences, nouns before their adjectives and determiners,
//!   postpositions instead of prepositions, the prepositional phrase moved before the object;
//! - **one-to-many mappings**: verbs become a stem plus a tense particle, some nouns become
//!   two-word compounds, `this` becomes two words, objects get a case particle;
//! - **ambiguity**: several source words have two valid translations (synonyms), chosen at
//!   random with unequal probabilities in every reference. No system can predict every
//!   choice, so even a perfect model scores below 100 BLEU and earns partial credit per
//!   n-gram.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

use super::{invent_words, Entry, ONSETS};
use crate::data::tokens::{TokenCorpus, TokenPair};

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

/// The bilingual lexicon of the synthetic task.
struct Lexicon {
    words: HashMap<&'static str, Entry>,
    /// Tense particles (present, past).
    tense: (String, String),
    /// Object case particle.
    object_marker: String,
}

fn build_lexicon(rng: &mut StdRng) -> Lexicon {
    let mut fresh = invent_words(80, &ONSETS[..12], rng).into_iter();
    let mut next = || {
        fresh
            .next()
            .expect("80 invented words suffice for the lexicon")
    };
    let mut words = HashMap::new();
    // Nouns: 0-3 are compounds (one-to-many), 4-8 have synonyms, the rest map one-to-one.
    for (i, &noun) in NOUNS.iter().enumerate() {
        let entry = match i {
            0..=3 => Entry {
                choices: vec![(vec![next(), next()], 1.0)],
            },
            4..=8 => Entry::synonyms(next(), next(), if i % 2 == 0 { 0.6 } else { 0.7 }),
            _ => Entry::single(next()),
        };
        words.insert(noun, entry);
    }
    for (i, &adjective) in ADJECTIVES.iter().enumerate() {
        let entry = if i < 3 {
            Entry::synonyms(next(), next(), 0.6)
        } else {
            Entry::single(next())
        };
        words.insert(adjective, entry);
    }
    // Verbs: both forms share the stem; 0-1 have synonymous stems. The tense particle is
    // added by the sentence rule.
    for (i, &(present, past)) in VERBS.iter().enumerate() {
        let entry = if i < 2 {
            Entry::synonyms(next(), next(), 0.6)
        } else {
            Entry::single(next())
        };
        words.insert(present, entry.clone());
        words.insert(past, entry);
    }
    words.insert("the", Entry::single(next()));
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
    words.insert("near", Entry::single(next()));
    words.insert("behind", Entry::single(next()));
    words.insert("with", Entry::synonyms(next(), next(), 0.5));
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
fn synthetic_pair(lexicon: &Lexicon, rng: &mut StdRng) -> (TokenPair, Vec<String>) {
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
    let pair = TokenPair {
        src: src.into_iter().map(str::to_string).collect(),
        tgt,
    };
    (pair, oracle)
}

/// The synthetic corpus: `train`, `dev` and `test` pairs from the fixed data seed.
/// Dev and test sources never occur in the training set.
pub fn corpus(train: usize, dev: usize, test: usize, data_seed: u64) -> TokenCorpus {
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
    TokenCorpus {
        train,
        dev,
        test,
        test_oracle: Some(test_oracle),
    }
}
