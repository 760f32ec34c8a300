//! Golden vectors from sacrebleu 2.6.0 and NLTK 3.10.4 (tests/golden/generate_scores.py):
//! every case through `corpus_bleu` / `sentence_bleu`, floats to 1e-12 relative, integer
//! statistics exactly, and an error wherever the reference implementation raised.

use std::hash::Hash;

use candle_bleu::exact::{
    corpus_bleu, sentence_bleu, BleuConfig, BleuScore, MetricError, SmoothMethod,
};
use serde_json::Value;

const GOLDEN: &str = include_str!("golden/scores.json");
const RTOL: f64 = 1e-12;

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= RTOL * a.abs().max(b.abs())
}

fn config(case: &Value) -> BleuConfig {
    let max_order = case["max_order"].as_u64().unwrap() as usize;
    let weights = case["weights"]
        .as_array()
        .map(|w| w.iter().map(|x| x.as_f64().unwrap()).collect());
    let smoothing = if case["impl"] == "nltk" {
        SmoothMethod::Nltk(case["smooth"].as_u64().unwrap() as u8)
    } else {
        let value = case["smooth_value"].as_f64();
        match case["smooth"].as_str().unwrap() {
            "none" => SmoothMethod::None,
            "floor" => SmoothMethod::Floor(value.unwrap_or(0.1)),
            "add-k" => SmoothMethod::AddK(value.unwrap_or(1.0)),
            "exp" => SmoothMethod::Exp,
            other => panic!("unknown smoothing {other}"),
        }
    };
    BleuConfig {
        max_order,
        weights,
        smoothing,
        effective_order: case["effective_order"].as_bool().unwrap(),
    }
}

fn tokens<T>(v: &Value, token: &dyn Fn(&Value) -> T) -> Vec<T> {
    v.as_array().unwrap().iter().map(token).collect()
}

fn corpus<T>(input: &Value, token: &dyn Fn(&Value) -> T) -> (Vec<Vec<T>>, Vec<Vec<Vec<T>>>) {
    let hyps = input["hyps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| tokens(h, token))
        .collect();
    let refs = input["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rs| {
            rs.as_array()
                .unwrap()
                .iter()
                .map(|r| tokens(r, token))
                .collect()
        })
        .collect();
    (hyps, refs)
}

fn score<T: Eq + Hash + Sync>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    sentence: bool,
    cfg: &BleuConfig,
) -> Result<BleuScore, MetricError> {
    if sentence {
        sentence_bleu(&hyps[0], &refs[0], cfg)
    } else {
        corpus_bleu(hyps, refs, cfg)
    }
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Differences between `got` and the expected output, as text; empty when they agree.
fn compare(case: &Value, got: &BleuScore) -> Vec<String> {
    let exp = &case["expected"];
    let nltk = case["impl"] == "nltk";
    let mut diffs = Vec::new();
    let mut scalar = |what: &str, want: f64, have: f64| {
        if !close(want, have) {
            diffs.push(format!("{what}: want {want:e}, got {have:e}"));
        }
    };
    if nltk {
        scalar("bleu", exp["bleu"].as_f64().unwrap(), got.bleu);
    } else {
        scalar("score", exp["score"].as_f64().unwrap(), got.score);
        scalar("bleu", exp["score"].as_f64().unwrap() / 100.0, got.bleu);
    }
    scalar("bp", exp["bp"].as_f64().unwrap(), got.bp);
    scalar("ratio", exp["ratio"].as_f64().unwrap(), got.ratio);
    let precisions = if nltk {
        &got.precisions
    } else {
        &got.precisions_pct
    };
    let want = floats(&exp["precisions"]);
    if want.len() != precisions.len() || !want.iter().zip(precisions).all(|(a, b)| close(*a, *b)) {
        diffs.push(format!("precisions: want {want:?}, got {precisions:?}"));
    }
    for (what, want, have) in [
        ("counts", floats(&exp["counts"]), &got.counts),
        ("totals", floats(&exp["totals"]), &got.totals),
    ] {
        // Integer statistics (and add-k's float counts, computed the same way) exactly.
        if &want != have {
            diffs.push(format!("{what}: want {want:?}, got {have:?}"));
        }
    }
    if exp["hyp_len"].as_u64().unwrap() != got.hyp_len {
        diffs.push(format!(
            "hyp_len: want {}, got {}",
            exp["hyp_len"], got.hyp_len
        ));
    }
    if exp["ref_len"].as_u64().unwrap() != got.ref_len {
        diffs.push(format!(
            "ref_len: want {}, got {}",
            exp["ref_len"], got.ref_len
        ));
    }
    diffs
}

#[test]
fn golden_sacrebleu_and_nltk() {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    assert_eq!(golden["sacrebleu"], "2.6.0");
    assert_eq!(golden["nltk"], "3.10.4");
    let inputs = golden["inputs"].as_array().unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 500, "only {} golden cases", cases.len());

    let mut failures = Vec::new();
    let (mut checked, mut errors) = (0, 0);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let cfg = config(case);
        let input = &inputs[case["input"].as_u64().unwrap() as usize];
        let sentence = case["level"] == "sentence";
        let result = if input["tokens"] == "ids" {
            let (h, r) = corpus(input, &|t| t.as_u64().unwrap());
            score(&h, &r, sentence, &cfg)
        } else {
            let (h, r) = corpus(input, &|t| t.as_str().unwrap().to_string());
            score(&h, &r, sentence, &cfg)
        };
        match (case.get("error"), result) {
            (Some(exception), Ok(got)) => failures.push(format!(
                "{name}: the reference raised {exception}, we returned {got:?}"
            )),
            (Some(_), Err(e)) => {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
            (None, Err(e)) => failures.push(format!("{name}: unexpected error {e}")),
            (None, Ok(got)) => {
                let diffs = compare(case, &got);
                if !diffs.is_empty() {
                    failures.push(format!("{name}: {}", diffs.join("; ")));
                }
                checked += 1;
            }
        }
    }
    let shown: Vec<&String> = failures.iter().take(25).collect();
    assert!(
        failures.is_empty(),
        "{} of {} golden cases differ:\n{:#?}",
        failures.len(),
        cases.len(),
        shown
    );
    eprintln!(
        "{checked} golden cases scored, {errors} rejected as the reference implementation does"
    );
    assert!(
        checked >= 500 && errors >= 10,
        "{checked} scored, {errors} errors"
    );
}

/// The worked examples printed in the seeds, as printed.
#[test]
fn seed_examples_as_printed() {
    fn split(s: &'static str) -> Vec<&'static str> {
        s.split_whitespace().collect()
    }
    let hyp = split(
        "It is a guide to action which ensures that the military always obeys the commands of the party",
    );
    let refs = vec![
        split("It is a guide to action that ensures that the military will forever heed Party commands"),
        split("It is the guiding principle which guarantees the military forces always being under the command of the Party"),
        split("It is the practical guide for the army always to heed the directions of the party"),
    ];
    let nltk = BleuConfig::nltk(0);
    assert_eq!(
        sentence_bleu(&hyp, &refs, &nltk).unwrap().bleu,
        0.5045666840058485
    );

    let cand = split("this is a test");
    let bleu2 = BleuConfig {
        weights: Some(vec![0.5, 0.5, 0.0, 0.0]),
        ..BleuConfig::nltk(0)
    };
    let small = vec![split("this is small test")];
    assert_eq!(
        sentence_bleu(&cand, &small, &bleu2).unwrap().bleu,
        0.49999999999999994
    );
    let test_refs = vec![split("this is a test"), vec!["this", "istest"]];
    assert_eq!(sentence_bleu(&cand, &test_refs, &nltk).unwrap().bleu, 1.0);
}
