//! `exact::chrf` against sacrebleu 2.6.0: every case of tests/golden/chrf.json (written by
//! tests/golden/generate_chrf.py) through `corpus_chrf`, `corpus_chrf_stats` and
//! `sentence_chrf`: scores to 1e-9 absolute on the 0..100 scale (and in fact bit for bit), the
//! summed and per-segment statistics exactly, sacrebleu's score names, and an error where sacrebleu raised. The
//! bootstrap cases check `exact::bootstrap` on chrF statistics against sacrebleu's own
//! resampling (float32 scores, `-ci`, paired bootstrap, approximate randomization) exactly.

use std::collections::HashMap;

use candle_bleu::exact::bootstrap::{
    bootstrap_confidence, paired_approximate_randomization, paired_bootstrap, resample_scores,
    BootstrapConfig,
};
use candle_bleu::exact::chrf::{
    corpus_chrf, corpus_chrf_stats, sentence_chrf, ChrfConfig, ChrfCounts,
};
use serde_json::Value;

const GOLDEN: &str = include_str!("golden/chrf.json");
const ATOL: f64 = 1e-9;

struct Corpus {
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
}

fn load() -> (Value, HashMap<String, Corpus>) {
    let golden: Value = serde_json::from_str(GOLDEN).expect("parse chrf.json");
    assert_eq!(golden["sacrebleu"], "2.6.0");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let corpora = golden["corpora"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, c)| {
            let corpus = Corpus {
                hyps: strings(&c["hyps"]),
                refs: c["refs"].as_array().unwrap().iter().map(strings).collect(),
            };
            (name.clone(), corpus)
        })
        .collect();
    (golden, corpora)
}

fn config(v: &Value) -> ChrfConfig {
    ChrfConfig {
        char_order: v["char_order"].as_u64().unwrap() as usize,
        word_order: v["word_order"].as_u64().unwrap() as usize,
        beta: v["beta"].as_f64().unwrap(),
        lowercase: v["lowercase"].as_bool().unwrap(),
        whitespace: v["whitespace"].as_bool().unwrap(),
        eps_smoothing: v["eps_smoothing"].as_bool().unwrap(),
    }
}

fn ints(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn every_case_matches_sacrebleu() {
    let (golden, corpora) = load();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 400, "only {} cases", cases.len());
    let mut failures = Vec::new();
    let (mut checked, mut bit_exact, mut worst) = (0usize, 0usize, 0.0f64);
    let mut compare = |name: &str, got: f64, want: f64, failures: &mut Vec<String>| {
        checked += 1;
        bit_exact += usize::from(got == want);
        worst = worst.max((got - want).abs());
        let close = (got - want).abs() <= ATOL; // false for NaN
        if !close {
            failures.push(format!("{name}: score {got} vs sacrebleu {want}"));
        }
    };
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let cfg = config(&case["config"]);
        let corpus = &corpora[case["corpus"].as_str().unwrap()];
        if case.get("error").is_some() {
            if corpus_chrf(&corpus.hyps, &corpus.refs, cfg).is_ok() {
                failures.push(format!("{name}: sacrebleu raised, we returned a score"));
            }
            continue;
        }
        match case["level"].as_str().unwrap() {
            "corpus" => {
                let got = match corpus_chrf(&corpus.hyps, &corpus.refs, cfg) {
                    Ok(got) => got,
                    Err(e) => {
                        failures.push(format!("{name}: error {e}"));
                        continue;
                    }
                };
                compare(
                    name,
                    got.score,
                    case["score"].as_f64().unwrap(),
                    &mut failures,
                );
                if got.counts.to_sacrebleu_vec() != ints(&case["stats"]) {
                    failures.push(format!("{name}: summed statistics differ"));
                }
                if got.name() != case["name_sacrebleu"].as_str().unwrap() {
                    failures.push(format!("{name}: name {}", got.name()));
                }
                // The configuration by reference (the other calls pass it by value).
                let cfg_ref: &ChrfConfig = &cfg;
                let segments = corpus_chrf_stats(&corpus.hyps, &corpus.refs, cfg_ref).unwrap();
                let want: Vec<Vec<u64>> = case["segment_stats"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(ints)
                    .collect();
                let got_segments: Vec<Vec<u64>> =
                    segments.iter().map(ChrfCounts::to_sacrebleu_vec).collect();
                if got_segments != want {
                    let i = (0..want.len())
                        .find(|&i| got_segments.get(i) != Some(&want[i]))
                        .unwrap_or(0);
                    failures.push(format!(
                        "{name}: segment {i} statistics {:?} vs sacrebleu {:?} (hyp {:?}, refs {:?})",
                        got_segments.get(i),
                        want[i],
                        corpus.hyps[i],
                        corpus.refs[i]
                    ));
                }
                let sum: ChrfCounts = segments.iter().sum();
                if sum != got.counts {
                    failures.push(format!("{name}: per-segment statistics do not sum"));
                }
            }
            "sentence" => {
                for (i, want) in floats(&case["scores"]).into_iter().enumerate() {
                    match sentence_chrf(&corpus.hyps[i], &corpus.refs[i], cfg) {
                        Ok(got) => compare(&format!("{name}[{i}]"), got.score, want, &mut failures),
                        Err(e) => failures.push(format!("{name}[{i}]: error {e}")),
                    }
                }
            }
            other => panic!("unknown level {other}"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{checked} scores, {bit_exact} bit for bit, largest difference {worst:e}");
    // Every operation is sacrebleu's, in its order: the scores are its bits, not just close.
    assert_eq!(bit_exact, checked, "largest difference {worst:e}");
}

#[test]
fn bootstrap_matches_sacrebleu_resampling() {
    let (golden, corpora) = load();
    let cases = golden["bootstrap"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let cfg = config(&case["config"]);
        let seed = case["seed"].as_u64().unwrap();
        let stats = |key: &str| {
            let c = &corpora[case[key].as_str().unwrap()];
            corpus_chrf_stats(&c.hyps, &c.refs, cfg).unwrap()
        };
        let (base, sys) = (stats("baseline"), stats("system"));
        let what = format!("{cfg:?} seed {seed}");
        let samples = |n_samples| BootstrapConfig { n_samples, seed };
        // sacrebleu's resample scores are float32 values.
        assert_eq!(case["resample_types"], serde_json::json!(["float32"]));
        assert_eq!(
            resample_scores(&base, &cfg, &samples(200)).unwrap(),
            floats(&case["resample_200"]),
            "{what}"
        );
        let ci = bootstrap_confidence(&base, &cfg, &samples(200)).unwrap();
        assert_eq!(ci.score, case["ci"]["score"].as_f64().unwrap(), "{what}");
        assert_eq!(ci.mean, case["ci"]["mean"].as_f64().unwrap(), "{what}");
        assert_eq!(ci.ci, case["ci"]["ci"].as_f64().unwrap(), "{what}");
        let bs = &case["paired_bs_200"];
        let (bl, result) = paired_bootstrap(&base, &sys, &cfg, &samples(200)).unwrap();
        assert_eq!(bl.mean, bs["baseline_mean"].as_f64().unwrap(), "{what}");
        assert_eq!(bl.ci, bs["baseline_ci"].as_f64().unwrap(), "{what}");
        assert_eq!(result.score, bs["score"].as_f64().unwrap(), "{what}");
        assert_eq!(result.p_value, bs["p_value"].as_f64().unwrap(), "{what}");
        let conf = result.confidence.unwrap();
        assert_eq!(conf.mean, bs["mean"].as_f64().unwrap(), "{what}");
        assert_eq!(conf.ci, bs["ci"].as_f64().unwrap(), "{what}");
        let ar = &case["paired_ar_300"];
        let result = paired_approximate_randomization(&base, &sys, &cfg, &samples(300)).unwrap();
        assert_eq!(result.score, ar["score"].as_f64().unwrap(), "{what}");
        assert_eq!(result.p_value, ar["p_value"].as_f64().unwrap(), "{what}");
    }
}
