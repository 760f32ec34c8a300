//! `exact::tokenize` against sacrebleu 2.6.0: every case of tests/golden/tokenize.json (written by
//! tests/golden/generate_tokenize.py) must give exactly sacrebleu's token list, for every
//! tokenizer, with and without lowercasing, through both `tokenize` and a reused
//! `TokenizeBuffer`.

use candle_bleu::exact::tokenize::{tokenize, tokenize_reference, TokenizeBuffer, Tokenizer};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Golden {
    meta: BTreeMap<String, String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    /// Key: tokenizer name, with `+lc` when lowercased.
    tokens: BTreeMap<String, Vec<String>>,
}

fn settings(key: &str) -> (Tokenizer, bool) {
    let (name, lowercase) = match key.strip_suffix("+lc") {
        Some(name) => (name, true),
        None => (key, false),
    };
    (name.parse().expect("golden tokenizer name"), lowercase)
}

/// Checks every case; returns the number of (input, setting) pairs compared.
fn check_all(golden: &Golden) -> usize {
    let mut buf = TokenizeBuffer::default();
    let mut failures = Vec::new();
    let mut compared = 0;
    for case in &golden.cases {
        for (key, expected) in &case.tokens {
            let (tok, lowercase) = settings(key);
            let got = tokenize(&case.text, tok, lowercase);
            let reused: Vec<&str> = buf.tokenize(&case.text, tok, lowercase).collect();
            let literal = tokenize_reference(&case.text, tok, lowercase);
            if &got != expected || reused != *expected || literal != *expected {
                failures.push(format!(
                    "{key} on {:?}:\n  sacrebleu {expected:?}\n  ours      {got:?}\n  \
                     buffer    {reused:?}\n  literal   {literal:?}",
                    case.text
                ));
            }
            compared += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} mismatches, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    compared
}

#[test]
fn every_golden_case_matches_sacrebleu() {
    let golden: Golden = serde_json::from_str(include_str!("golden/tokenize.json")).unwrap();
    assert_eq!(golden.meta["sacrebleu"], "2.6.0");
    assert!(golden.cases.len() >= 700, "{} cases", golden.cases.len());
    let compared = check_all(&golden);
    assert_eq!(compared, golden.cases.len() * 10);
}

#[test]
fn golden_covers_every_setting() {
    let golden: Golden = serde_json::from_str(include_str!("golden/tokenize.json")).unwrap();
    for case in &golden.cases {
        let mut keys: Vec<&str> = case.tokens.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "13a", "13a+lc", "char", "char+lc", "intl", "intl+lc", "none", "none+lc", "zh",
                "zh+lc"
            ]
        );
    }
}

/// A larger random differential run: `generate_tokenize.py --big N FILE`, then
/// `TOKENIZE_BIG=FILE cargo test --release --test tokenize_golden -- --ignored`.
#[test]
#[ignore = "needs a file written by generate_tokenize.py --big"]
fn differential_big() {
    let path = std::env::var("TOKENIZE_BIG").expect("set TOKENIZE_BIG to the --big output file");
    let golden: Golden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let compared = check_all(&golden);
    eprintln!("{compared} comparisons");
}

/// The one-scan 13a and zh tokenizers against the literal whole-line regex passes, on random
/// strings dense in the characters the passes act on.
#[test]
fn one_scan_equals_literal_passes() {
    let alphabet: Vec<char> = "a1.,- .,-9\t(\u{a0}\u{3000}\u{2001}\u{2026}中\u{20000}é&;<>\n"
        .chars()
        .collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut buf = TokenizeBuffer::default();
    for _ in 0..100_000 {
        let len = (next() % 14) as usize;
        let text: String = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        for tok in [Tokenizer::V13a, Tokenizer::Zh] {
            let fast: Vec<&str> = buf.tokenize(&text, tok, false).collect();
            assert_eq!(
                fast,
                tokenize_reference(&text, tok, false),
                "{tok} on {text:?}"
            );
        }
    }
}

#[test]
fn names_round_trip_and_errors_name_the_value() {
    for tok in Tokenizer::ALL {
        assert_eq!(tok.to_string().parse::<Tokenizer>().unwrap(), tok);
    }
    assert_eq!(Tokenizer::default(), Tokenizer::V13a);
    assert_eq!("13a".parse::<Tokenizer>().unwrap(), Tokenizer::V13a);
    let err = "ja-mecab".parse::<Tokenizer>().unwrap_err();
    assert_eq!(err.name, "ja-mecab");
    assert!(err.to_string().contains("\"ja-mecab\""), "{err}");
    assert!("13A".parse::<Tokenizer>().is_err());
    assert!("".parse::<Tokenizer>().is_err());
}

#[test]
fn worked_examples() {
    let t = |s: &str, tok: Tokenizer| tokenize(s, tok, false);
    assert_eq!(
        t("Hello, world! It's 1,000.50$.", Tokenizer::V13a),
        ["Hello", ",", "world", "!", "It's", "1,000.50", "$", "."]
    );
    // 13a pads the line, so a final "1998." splits; intl does not pad.
    assert_eq!(t("In 1998.", Tokenizer::V13a), ["In", "1998", "."]);
    assert_eq!(t("In 1998.", Tokenizer::Intl), ["In", "1998."]);
    assert_eq!(t("don't", Tokenizer::Intl), ["don", "'", "t"]);
    assert_eq!(
        t("&amp;lt; &amp;quot;", Tokenizer::V13a),
        ["<", "&", "quot", ";"]
    );
    // The '\u20000' bug: '…' (U+2026) is "Chinese", CJK Extension B is not.
    assert_eq!(t("好…\u{20000}x", Tokenizer::Zh), ["好", "…", "\u{20000}x"]);
    assert_eq!(t("e\u{301}!", Tokenizer::Char), ["e", "\u{301}", "!"]);
    assert_eq!(t("a\u{1c}b", Tokenizer::None), ["a", "b"]);
    assert_eq!(tokenize("İΣ", Tokenizer::Char, true), ["i", "\u{307}", "ς"]);
}
