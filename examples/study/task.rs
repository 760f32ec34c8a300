//! The study's synthetic task: a harder variant of the seq2seq example's language, built so
//! that cross-entropy does not reach the rule-based yardstick within the study's budget.
//!
//! An English-like SVO source is translated into an invented verb-final language with
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
//! - **few training pairs**: the study trains on 4 000 pairs by default.
//!
//! Everything is drawn from the data seed (independent of the model seeds). The yardstick is
//! each test source translated by these rules with every word's most probable choice.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

use crate::data::{Corpus, Pair};

const NOUNS: [&str; 24] = [
    "dog", "cat", "bird", "horse", "farmer", "teacher", "child", "king", "river", "house", "tree",
    "garden", "ship", "city", "book", "song", "stone", "queen", "wolf", "lamp", "road", "boat",
    "friend", "cook",
];
const ADJECTIVES: [&str; 10] = [
    "big", "small", "old", "young", "red", "green", "happy", "quiet", "brave", "dark",
];
/// (present, past) forms.
const VERBS: [(&str, &str); 10] = [
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

struct Lexicon {
    /// Noun stems.
    nouns: HashMap<&'static str, Entry>,
    /// Adjectives: one entry per noun class.
    adjectives: HashMap<&'static str, Vec<Entry>>,
    /// Determiners: one entry per noun class.
    determiners: HashMap<&'static str, Vec<Entry>>,
    /// Verb stems (shared by both tenses).
    verbs: HashMap<&'static str, Entry>,
    postpositions: HashMap<&'static str, Entry>,
    plural: String,
    tense: [String; 2],
    /// Verb agreement particle by subject class and number.
    agreement: Vec<[String; 2]>,
    object_marker: String,
    relative_marker: String,
}

/// Distinct invented words of two or three syllables.
fn invent_words(count: usize, rng: &mut StdRng) -> Vec<String> {
    const ONSETS: [&str; 14] = [
        "k", "t", "m", "n", "s", "r", "l", "v", "d", "b", "g", "h", "p", "z",
    ];
    const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
    let mut seen = HashSet::new();
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

fn noun_class(noun: &str) -> usize {
    NOUNS.iter().position(|&n| n == noun).unwrap_or(0) % CLASSES
}

fn build_lexicon(rng: &mut StdRng) -> Lexicon {
    let mut fresh = invent_words(200, rng).into_iter();
    let mut next = || {
        fresh
            .next()
            .expect("200 invented words suffice for the lexicon")
    };
    let mut nouns = HashMap::new();
    for (i, &noun) in NOUNS.iter().enumerate() {
        let entry = match i {
            0..=3 => Entry {
                choices: vec![(vec![next(), next()], 1.0)],
            },
            4..=9 => Entry::synonyms(next(), next(), if i % 2 == 0 { 0.6 } else { 0.7 }),
            _ => Entry::single(next()),
        };
        nouns.insert(noun, entry);
    }
    let mut adjectives = HashMap::new();
    for (i, &adjective) in ADJECTIVES.iter().enumerate() {
        let forms = (0..CLASSES)
            .map(|_| {
                if i < 2 {
                    Entry::synonyms(next(), next(), 0.65)
                } else {
                    Entry::single(next())
                }
            })
            .collect();
        adjectives.insert(adjective, forms);
    }
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
    let mut verbs = HashMap::new();
    for (i, &(present, past)) in VERBS.iter().enumerate() {
        let entry = if i < 3 {
            Entry::synonyms(next(), next(), 0.6)
        } else {
            Entry::single(next())
        };
        verbs.insert(present, entry.clone());
        verbs.insert(past, entry);
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
        determiners,
        verbs,
        postpositions,
        plural: next(),
        tense: [next(), next()],
        agreement: (0..CLASSES).map(|_| [next(), next()]).collect(),
        object_marker: next(),
        relative_marker: next(),
    }
}

/// A noun phrase of the source.
struct NounPhrase {
    determiner: &'static str,
    plural: bool,
    adjectives: Vec<&'static str>,
    noun: &'static str,
}

impl NounPhrase {
    fn sample(rng: &mut StdRng) -> Self {
        let (determiner, plural) = DETERMINERS[rng.gen_range(0..DETERMINERS.len())];
        let count = [0, 0, 1, 1, 2][rng.gen_range(0..5)];
        let mut adjectives = Vec::new();
        while adjectives.len() < count {
            let adjective = ADJECTIVES[rng.gen_range(0..ADJECTIVES.len())];
            if !adjectives.contains(&adjective) {
                adjectives.push(adjective);
            }
        }
        NounPhrase {
            determiner,
            plural,
            adjectives,
            noun: NOUNS[rng.gen_range(0..NOUNS.len())],
        }
    }

    /// `det adj* noun`, the noun with a plural `s` token when plural.
    fn source(&self) -> Vec<String> {
        let mut out = vec![self.determiner.to_string()];
        out.extend(self.adjectives.iter().map(|a| a.to_string()));
        out.push(self.noun.to_string());
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
        let class = noun_class(self.noun);
        let mut out = pick(&lexicon.nouns[self.noun]);
        if self.plural {
            out.push(lexicon.plural.clone());
        }
        for adjective in self.adjectives.iter().rev() {
            out.extend(pick(&lexicon.adjectives[adjective][class]));
        }
        out.extend(pick(&lexicon.determiners[self.determiner][class]));
        out
    }
}

struct Sentence {
    subject: NounPhrase,
    /// `that VERB NP`: a relative clause on the subject (verb key, past, object).
    relative: Option<(&'static str, bool, NounPhrase)>,
    verb: &'static str,
    is_past: bool,
    object: NounPhrase,
    adjunct: Option<(&'static str, NounPhrase)>,
}

fn sample_verb(rng: &mut StdRng) -> (&'static str, bool) {
    let (present, past) = VERBS[rng.gen_range(0..VERBS.len())];
    let is_past = rng.gen_bool(0.5);
    (if is_past { past } else { present }, is_past)
}

impl Sentence {
    fn sample(rng: &mut StdRng) -> Self {
        let subject = NounPhrase::sample(rng);
        let relative = rng.gen_bool(0.4).then(|| {
            let (verb, is_past) = sample_verb(rng);
            (verb, is_past, NounPhrase::sample(rng))
        });
        let (verb, is_past) = sample_verb(rng);
        let object = NounPhrase::sample(rng);
        let adjunct = rng.gen_bool(0.5).then(|| {
            (
                PREPOSITIONS[rng.gen_range(0..PREPOSITIONS.len())],
                NounPhrase::sample(rng),
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
    fn source(&self) -> Vec<String> {
        let mut out = self.subject.source();
        if let Some((verb, _, object)) = &self.relative {
            out.push("that".to_string());
            out.push(verb.to_string());
            out.extend(object.source());
        }
        out.push(self.verb.to_string());
        out.extend(self.object.source());
        if let Some((preposition, phrase)) = &self.adjunct {
            out.push(preposition.to_string());
            out.extend(phrase.source());
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
            out.extend(pick(&lexicon.verbs[verb]));
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
        out.extend(pick(&lexicon.verbs[self.verb]));
        out.push(lexicon.tense[usize::from(self.is_past)].clone());
        let class = noun_class(self.subject.noun);
        out.push(lexicon.agreement[class][usize::from(self.subject.plural)].clone());
        out
    }
}

/// The corpus: `train`, `dev`, `test` pairs drawn from `data_seed`, with the rule-based
/// translation of every test source (most probable choices) as `test_oracle`. Dev and test
/// sources never occur in the training set or in each other.
pub fn corpus(train: usize, dev: usize, test: usize, data_seed: u64) -> Corpus {
    let mut rng = StdRng::seed_from_u64(data_seed);
    let lexicon = build_lexicon(&mut rng);
    let mut seen = HashSet::new();
    let mut take = |n: usize, rng: &mut StdRng| {
        let mut pairs = Vec::with_capacity(n);
        let mut oracles = Vec::with_capacity(n);
        while pairs.len() < n {
            let sentence = Sentence::sample(rng);
            let src = sentence.source();
            if !seen.insert(src.join(" ")) {
                continue;
            }
            let tgt = sentence.target(&lexicon, &mut |entry| entry.sample(rng));
            oracles.push(sentence.target(&lexicon, &mut |entry| entry.best()));
            pairs.push(Pair { src, tgt });
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
