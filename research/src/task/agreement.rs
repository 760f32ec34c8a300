//! The `study` example's language: a harder variant of [`super::reordering`], built so that
//! cross-entropy does not reach the rule-based yardstick within the study's budget.
//!
//! An English-like SVO source is translated into an invented verb-final language with
//! - **rare words**: 150 nouns, 40 adjectives and 30 verbs drawn with Zipfian frequencies, so
//!   the tail of the lexicon is seen a few times in training, or never;
//! - **agreement across the sentence**: every noun has one of three classes; adjectives and
//!   determiners take the class form of their noun (they come before the noun in the source,
//!   after it in the target), and the sentence-final verb particle agrees with the class and
//!   number of the *subject*, which opens the target sentence up to ~25 tokens earlier;
//! - **long-range reordering**: an optional relative clause on the subject
//!   (`the dog that saw a cat ...`) becomes prenominal in the target (`cat-NP ko see PAST REL
//!   dog-NP ...`), so the subject's head noun moves behind the whole clause, and the nearest
//!   noun before the verb is no longer the one it agrees with; noun phrases are mirrored,
//!   postpositions replace prepositions, the prepositional phrase moves before the object;
//! - **ambiguity**: some words have two valid translations drawn at random in every
//!   reference, `a` is dropped 30% of the time, so no system reaches 100 BLEU;
//! - **few training pairs**: the study trains on 2 000 pairs by default.
//!
//! Everything is drawn from the data seed (independent of the model seeds). The yardstick is
//! each test source translated by these rules with every word's most probable choice.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

use super::{invent_words, Entry, ONSETS};
use crate::data::tokens::{TokenCorpus, TokenPair};

/// The first source nouns; the rest of the [`NOUN_COUNT`] are invented English-like words.
const COMMON_NOUNS: [&str; 24] = [
    "dog", "cat", "bird", "horse", "farmer", "teacher", "child", "king", "river", "house", "tree",
    "garden", "ship", "city", "book", "song", "stone", "queen", "wolf", "lamp", "road", "boat",
    "friend", "cook",
];
const COMMON_ADJECTIVES: [&str; 10] = [
    "big", "small", "old", "young", "red", "green", "happy", "quiet", "brave", "dark",
];
/// (present, past) forms.
const COMMON_VERBS: [(&str, &str); 10] = [
    ("sees", "saw"),
    ("finds", "found"),
    ("carries", "carried"),
    ("follows", "followed"),
    ("helps", "helped"),
    ("paints", "painted"),
    ("watches", "watched"),
    ("builds", "built"),
    ("calls", "called"),
    ("meets", "met"),
];
const NOUN_COUNT: usize = 150;
const ADJECTIVE_COUNT: usize = 40;
const VERB_COUNT: usize = 30;
/// Zipf exponent of the word frequencies: word `r` (0-based rank) is drawn with probability
/// proportional to `1 / (r + 1)^ZIPF`, so the tail of the lexicon is rare in the training set.
const ZIPF: f64 = 1.0;
/// Determiners and whether they make the noun phrase plural.
const DETERMINERS: [(&str, bool); 5] = [
    ("the", false),
    ("a", false),
    ("this", false),
    ("these", true),
    ("some", true),
];
const PREPOSITIONS: [&str; 4] = ["near", "behind", "with", "under"];
const CLASSES: usize = 3;

/// Frequency-ranked sampling: rank `r` with probability `∝ 1 / (r + 1)^ZIPF`.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize) -> Self {
        let mut total = 0.0;
        let cumulative = (0..n)
            .map(|r| {
                total += 1.0 / ((r + 1) as f64).powf(ZIPF);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut StdRng) -> usize {
        let u = rng.gen::<f64>() * self.cumulative[self.cumulative.len() - 1];
        self.cumulative
            .partition_point(|&c| c <= u)
            .min(self.cumulative.len() - 1)
    }
}

struct Noun {
    source: String,
    class: usize,
    stem: Entry,
}

struct Adjective {
    source: String,
    /// One entry per noun class.
    forms: Vec<Entry>,
}

struct Verb {
    present: String,
    past: String,
    /// The stem, shared by both tenses.
    stem: Entry,
}

struct Lexicon {
    nouns: Vec<Noun>,
    adjectives: Vec<Adjective>,
    verbs: Vec<Verb>,
    /// Determiners: one entry per noun class.
    determiners: HashMap<&'static str, Vec<Entry>>,
    postpositions: HashMap<&'static str, Entry>,
    plural: String,
    tense: [String; 2],
    /// Verb agreement particle by subject class and number.
    agreement: Vec<[String; 2]>,
    object_marker: String,
    relative_marker: String,
    noun_ranks: Zipf,
    adjective_ranks: Zipf,
    verb_ranks: Zipf,
}

/// Distinct invented English-like source words (closed syllables), none in `taken`.
fn invent_source_words(count: usize, taken: &HashSet<String>, rng: &mut StdRng) -> Vec<String> {
    const ONSETS: [&str; 12] = [
        "b", "bl", "d", "f", "gr", "j", "pl", "st", "tr", "w", "sn", "cr",
    ];
    const VOWELS: [&str; 6] = ["a", "e", "i", "o", "u", "oo"];
    const CODAS: [&str; 6] = ["n", "m", "t", "ck", "sh", "rd"];
    let mut seen = taken.clone();
    let mut words = Vec::with_capacity(count);
    while words.len() < count {
        let word = format!(
            "{}{}{}",
            ONSETS[rng.gen_range(0..ONSETS.len())],
            VOWELS[rng.gen_range(0..VOWELS.len())],
            CODAS[rng.gen_range(0..CODAS.len())]
        );
        if seen.insert(word.clone()) {
            words.push(word);
        }
    }
    words
}

fn build_lexicon(rng: &mut StdRng) -> Lexicon {
    let mut fresh = invent_words(1000, &ONSETS, rng).into_iter();
    let mut next = || {
        fresh
            .next()
            .expect("1000 invented words suffice for the lexicon")
    };
    let mut taken: HashSet<String> = COMMON_NOUNS
        .iter()
        .chain(&COMMON_ADJECTIVES)
        .map(|w| w.to_string())
        .chain(
            COMMON_VERBS
                .iter()
                .flat_map(|(a, b)| [a.to_string(), b.to_string()]),
        )
        .chain(DETERMINERS.iter().map(|(d, _)| d.to_string()))
        .chain(PREPOSITIONS.iter().map(|p| p.to_string()))
        .chain(["that".to_string(), "s".to_string()])
        .collect();
    let invented = invent_source_words(
        NOUN_COUNT + ADJECTIVE_COUNT + VERB_COUNT
            - COMMON_NOUNS.len()
            - COMMON_ADJECTIVES.len()
            - COMMON_VERBS.len(),
        &taken,
        rng,
    );
    taken.extend(invented.iter().cloned());
    let mut invented = invented.into_iter();
    let mut source = || invented.next().expect("enough invented source words");

    let noun_sources: Vec<String> = COMMON_NOUNS
        .iter()
        .map(|w| w.to_string())
        .chain((COMMON_NOUNS.len()..NOUN_COUNT).map(|_| source()))
        .collect();
    let nouns = noun_sources
        .into_iter()
        .enumerate()
        .map(|(i, source)| {
            // One noun in ten is a two-word compound, one in four has two synonyms.
            let stem = match i % 20 {
                0 | 10 => Entry {
                    choices: vec![(vec![next(), next()], 1.0)],
                },
                1 | 5 | 9 | 13 | 17 => {
                    Entry::synonyms(next(), next(), if i % 2 == 0 { 0.6 } else { 0.7 })
                }
                _ => Entry::single(next()),
            };
            Noun {
                source,
                class: rng.gen_range(0..CLASSES),
                stem,
            }
        })
        .collect();
    let adjective_sources: Vec<String> = COMMON_ADJECTIVES
        .iter()
        .map(|w| w.to_string())
        .chain((COMMON_ADJECTIVES.len()..ADJECTIVE_COUNT).map(|_| source()))
        .collect();
    let adjectives = adjective_sources
        .into_iter()
        .enumerate()
        .map(|(i, source)| Adjective {
            source,
            forms: (0..CLASSES)
                .map(|_| {
                    if i % 5 == 1 {
                        Entry::synonyms(next(), next(), 0.65)
                    } else {
                        Entry::single(next())
                    }
                })
                .collect(),
        })
        .collect();
    let verb_forms: Vec<(String, String)> = COMMON_VERBS
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .chain((COMMON_VERBS.len()..VERB_COUNT).map(|_| {
            let stem = source();
            (format!("{stem}s"), format!("{stem}ed"))
        }))
        .collect();
    let verbs = verb_forms
        .into_iter()
        .enumerate()
        .map(|(i, (present, past))| Verb {
            present,
            past,
            stem: if i % 4 == 0 {
                Entry::synonyms(next(), next(), 0.6)
            } else {
                Entry::single(next())
            },
        })
        .collect();
    let mut determiners = HashMap::new();
    for &(determiner, _) in &DETERMINERS {
        let forms = (0..CLASSES)
            .map(|_| match determiner {
                "a" => Entry {
                    choices: vec![(vec![next()], 0.7), (vec![], 0.3)],
                },
                "this" => Entry {
                    choices: vec![(vec![next(), next()], 1.0)],
                },
                _ => Entry::single(next()),
            })
            .collect();
        determiners.insert(determiner, forms);
    }
    let mut postpositions = HashMap::new();
    for (i, &preposition) in PREPOSITIONS.iter().enumerate() {
        let entry = if i == 2 {
            Entry::synonyms(next(), next(), 0.5)
        } else {
            Entry::single(next())
        };
        postpositions.insert(preposition, entry);
    }
    Lexicon {
        nouns,
        adjectives,
        verbs,
        determiners,
        postpositions,
        plural: next(),
        tense: [next(), next()],
        agreement: (0..CLASSES).map(|_| [next(), next()]).collect(),
        object_marker: next(),
        relative_marker: next(),
        noun_ranks: Zipf::new(NOUN_COUNT),
        adjective_ranks: Zipf::new(ADJECTIVE_COUNT),
        verb_ranks: Zipf::new(VERB_COUNT),
    }
}

/// A noun phrase of the source (indices into the lexicon).
struct NounPhrase {
    determiner: &'static str,
    plural: bool,
    adjectives: Vec<usize>,
    noun: usize,
}

impl NounPhrase {
    fn sample(lexicon: &Lexicon, rng: &mut StdRng) -> Self {
        let (determiner, plural) = DETERMINERS[rng.gen_range(0..DETERMINERS.len())];
        let count = [0, 0, 1, 1, 2][rng.gen_range(0..5)];
        let mut adjectives = Vec::new();
        while adjectives.len() < count {
            let adjective = lexicon.adjective_ranks.sample(rng);
            if !adjectives.contains(&adjective) {
                adjectives.push(adjective);
            }
        }
        NounPhrase {
            determiner,
            plural,
            adjectives,
            noun: lexicon.noun_ranks.sample(rng),
        }
    }

    /// `det adj* noun`, the noun followed by a plural `s` token when plural.
    fn source(&self, lexicon: &Lexicon) -> Vec<String> {
        let mut out = vec![self.determiner.to_string()];
        out.extend(
            self.adjectives
                .iter()
                .map(|&a| lexicon.adjectives[a].source.clone()),
        );
        out.push(lexicon.nouns[self.noun].source.clone());
        if self.plural {
            out.push("s".to_string());
        }
        out
    }

    /// Mirrored: `noun [PL] adj* (inner first) det`, adjectives and determiner in the noun's
    /// class form.
    fn target(
        &self,
        lexicon: &Lexicon,
        pick: &mut dyn FnMut(&Entry) -> Vec<String>,
    ) -> Vec<String> {
        let noun = &lexicon.nouns[self.noun];
        let mut out = pick(&noun.stem);
        if self.plural {
            out.push(lexicon.plural.clone());
        }
        for &adjective in self.adjectives.iter().rev() {
            out.extend(pick(&lexicon.adjectives[adjective].forms[noun.class]));
        }
        out.extend(pick(&lexicon.determiners[self.determiner][noun.class]));
        out
    }
}

struct Sentence {
    subject: NounPhrase,
    /// `that VERB NP`: a relative clause on the subject (verb, past, object).
    relative: Option<(usize, bool, NounPhrase)>,
    verb: usize,
    is_past: bool,
    object: NounPhrase,
    adjunct: Option<(&'static str, NounPhrase)>,
}

impl Sentence {
    fn sample(lexicon: &Lexicon, rng: &mut StdRng) -> Self {
        let subject = NounPhrase::sample(lexicon, rng);
        let relative = rng.gen_bool(0.4).then(|| {
            let verb = lexicon.verb_ranks.sample(rng);
            (verb, rng.gen_bool(0.5), NounPhrase::sample(lexicon, rng))
        });
        let verb = lexicon.verb_ranks.sample(rng);
        let is_past = rng.gen_bool(0.5);
        let object = NounPhrase::sample(lexicon, rng);
        let adjunct = rng.gen_bool(0.5).then(|| {
            (
                PREPOSITIONS[rng.gen_range(0..PREPOSITIONS.len())],
                NounPhrase::sample(lexicon, rng),
            )
        });
        Sentence {
            subject,
            relative,
            verb,
            is_past,
            object,
            adjunct,
        }
    }

    /// `SUBJ [that VERB NP] VERB OBJ [PREP NP]`.
    fn source(&self, lexicon: &Lexicon) -> Vec<String> {
        let verb_form = |verb: usize, is_past: bool| {
            let verb = &lexicon.verbs[verb];
            if is_past {
                verb.past.clone()
            } else {
                verb.present.clone()
            }
        };
        let mut out = self.subject.source(lexicon);
        if let Some((verb, is_past, object)) = &self.relative {
            out.push("that".to_string());
            out.push(verb_form(*verb, *is_past));
            out.extend(object.source(lexicon));
        }
        out.push(verb_form(self.verb, self.is_past));
        out.extend(self.object.source(lexicon));
        if let Some((preposition, phrase)) = &self.adjunct {
            out.push(preposition.to_string());
            out.extend(phrase.source(lexicon));
        }
        out
    }

    /// `[NP ko VERB TENSE REL] SUBJ [NP POSTP] OBJ ko VERB TENSE AGR(subject)`.
    fn target(
        &self,
        lexicon: &Lexicon,
        pick: &mut dyn FnMut(&Entry) -> Vec<String>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        if let Some((verb, is_past, object)) = &self.relative {
            out.extend(object.target(lexicon, pick));
            out.push(lexicon.object_marker.clone());
            out.extend(pick(&lexicon.verbs[*verb].stem));
            out.push(lexicon.tense[usize::from(*is_past)].clone());
            out.push(lexicon.relative_marker.clone());
        }
        out.extend(self.subject.target(lexicon, pick));
        if let Some((preposition, phrase)) = &self.adjunct {
            out.extend(phrase.target(lexicon, pick));
            out.extend(pick(&lexicon.postpositions[preposition]));
        }
        out.extend(self.object.target(lexicon, pick));
        out.push(lexicon.object_marker.clone());
        out.extend(pick(&lexicon.verbs[self.verb].stem));
        out.push(lexicon.tense[usize::from(self.is_past)].clone());
        let class = lexicon.nouns[self.subject.noun].class;
        out.push(lexicon.agreement[class][usize::from(self.subject.plural)].clone());
        out
    }
}

/// The corpus: `train`, `dev`, `test` pairs drawn from `data_seed`, with the rule-based
/// translation of every test source (most probable choices) as `test_oracle`. Dev and test
/// sources never occur in the training set or in each other; the test and dev sets depend only
/// on their own sizes and the seed, not on `train`.
pub fn corpus(train: usize, dev: usize, test: usize, data_seed: u64) -> TokenCorpus {
    let mut rng = StdRng::seed_from_u64(data_seed);
    let lexicon = build_lexicon(&mut rng);
    let mut seen = HashSet::new();
    let mut take = |n: usize, rng: &mut StdRng| {
        let mut pairs = Vec::with_capacity(n);
        let mut oracles = Vec::with_capacity(n);
        while pairs.len() < n {
            let sentence = Sentence::sample(&lexicon, rng);
            let src = sentence.source(&lexicon);
            if !seen.insert(src.join(" ")) {
                continue;
            }
            let tgt = sentence.target(&lexicon, &mut |entry| entry.sample(rng));
            oracles.push(sentence.target(&lexicon, &mut |entry| entry.best()));
            pairs.push(TokenPair { src, tgt });
        }
        (pairs, oracles)
    };
    // Test and dev first, so that they do not change with the training set's size.
    let (test, test_oracle) = take(test, &mut rng);
    let (dev, _) = take(dev, &mut rng);
    let (train, _) = take(train, &mut rng);
    TokenCorpus {
        train,
        dev,
        test,
        test_oracle: Some(test_oracle),
    }
}
