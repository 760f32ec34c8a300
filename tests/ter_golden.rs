//! `exact::ter` against sacrebleu 2.6.0: every case of tests/golden/ter.json (written by
//! tests/golden/generate_ter.py) through `corpus_ter`, `corpus_ter_stats` and `sentence_ter`:
//! scores, edits and reference lengths to 1e-9 (and in fact bit for bit), per segment and
//! summed. The bootstrap cases check `exact::bootstrap` on TER statistics against sacrebleu's
//! own resampling (float32 scores, `-ci`, paired bootstrap, approximate randomization).

use std::collections::HashMap;

use candle_bleu::exact::bootstrap::{
    bootstrap_confidence, paired_approximate_randomization, paired_bootstrap, resample_scores,
    BootstrapConfig,
};
use candle_bleu::exact::ter::{
    corpus_ter, corpus_ter_stats, score_ter_stats, sentence_ter, TerConfig, TerStats,
};
use serde_json::Value;

const GOLDEN: &str = include_str!("golden/ter.json");
const ATOL: f64 = 1e-9;

struct Corpus {
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
}

fn load() -> (Value, HashMap<String, Corpus>) {
    let golden: Value = serde_json::from_str(GOLDEN).expect("parse ter.json");
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

fn config(v: &Value) -> TerConfig {
    TerConfig {
        normalized: v["normalized"].as_bool().unwrap(),
        no_punct: v["no_punct"].as_bool().unwrap(),
        asian_support: v["asian_support"].as_bool().unwrap(),
        case_sensitive: v["case_sensitive"].as_bool().unwrap(),
    }
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Compares scores, counting how many are bit for bit sacrebleu's.
#[derive(Default)]
struct Compare {
    failures: Vec<String>,
    checked: usize,
    bit_exact: usize,
    worst: f64,
}

impl Compare {
    fn value(&mut self, what: &str, got: f64, want: f64) {
        self.checked += 1;
        self.bit_exact += usize::from(got == want);
        self.worst = self.worst.max((got - want).abs());
        if (got - want).abs() > ATOL || got.is_nan() {
            self.failures
                .push(format!("{what}: {got} vs sacrebleu {want}"));
        }
    }
}

#[test]
fn every_case_matches_sacrebleu() {
    let (golden, corpora) = load();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 500, "only {} cases", cases.len());
    let mut cmp = Compare::default();
    let mut configs = std::collections::HashSet::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let cfg = config(&case["config"]);
        configs.insert(format!("{cfg:?}"));
        let corpus = &corpora[case["corpus"].as_str().unwrap()];
        match case["level"].as_str().unwrap() {
            "corpus" => {
                let got = corpus_ter(&corpus.hyps, &corpus.refs, cfg).unwrap();
                cmp.value(
                    &format!("{name} score"),
                    got.score,
                    case["score"].as_f64().unwrap(),
                );
                cmp.value(
                    &format!("{name} edits"),
                    got.edits,
                    case["edits"].as_f64().unwrap(),
                );
                cmp.value(
                    &format!("{name} ref_len"),
                    got.ref_len,
                    case["ref_len"].as_f64().unwrap(),
                );
                let cfg_ref: &TerConfig = &cfg;
                let segments = corpus_ter_stats(&corpus.hyps, &corpus.refs, cfg_ref).unwrap();
                let want = case["segment_stats"].as_array().unwrap();
                assert_eq!(segments.len(), want.len(), "{name}");
                for (i, (s, w)) in segments.iter().zip(want).enumerate() {
                    let w = floats(w);
                    if s.edits != w[0] || s.ref_len != w[1] {
                        cmp.failures.push(format!(
                            "{name}: segment {i} {s:?} vs sacrebleu {w:?} (hyp {:?}, refs {:?})",
                            corpus.hyps[i], corpus.refs[i]
                        ));
                    }
                }
                let sum: TerStats = segments.iter().sum();
                let from_sum = score_ter_stats(&sum).unwrap();
                if from_sum != got {
                    cmp.failures.push(format!(
                        "{name}: {from_sum:?} from the summed segments vs {got:?}"
                    ));
                }
            }
            "sentence" => {
                for (i, want) in case["scores"].as_array().unwrap().iter().enumerate() {
                    let want = floats(want);
                    let got = sentence_ter(&corpus.hyps[i], &corpus.refs[i], cfg).unwrap();
                    cmp.value(&format!("{name}[{i}] score"), got.score, want[0]);
                    cmp.value(&format!("{name}[{i}] edits"), got.edits, want[1]);
                    cmp.value(&format!("{name}[{i}] ref_len"), got.ref_len, want[2]);
                }
            }
            other => panic!("unknown level {other}"),
        }
    }
    assert_eq!(configs.len(), 16, "every option combination");
    assert!(
        cmp.failures.is_empty(),
        "{} failures:\n{}",
        cmp.failures.len(),
        cmp.failures.join("\n")
    );
    println!(
        "{} values, {} bit for bit, largest difference {:e}",
        cmp.checked, cmp.bit_exact, cmp.worst
    );
    // Every operation is sacrebleu's, in its order: the values are its bits.
    assert_eq!(
        cmp.bit_exact, cmp.checked,
        "largest difference {:e}",
        cmp.worst
    );
}

#[test]
fn bootstrap_matches_sacrebleu_resampling() {
    let (golden, corpora) = load();
    let cases = golden["bootstrap"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let cfg = config(&case["config"]);
        let seed = case["seed"].as_u64().unwrap();
        let stats = |key: &str| {
            let c = &corpora[case[key].as_str().unwrap()];
            corpus_ter_stats(&c.hyps, &c.refs, cfg).unwrap()
        };
        let (base, sys) = (stats("baseline"), stats("system"));
        let what = format!("{cfg:?} seed {seed}");
        let samples = |n_samples| BootstrapConfig { n_samples, seed };
        // sacrebleu's resample scores are float32 values (float32 sums of the statistics).
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

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let cfg = TerConfig::default();
    let argument = |e: candle_bleu::exact::MetricError| match e {
        candle_bleu::exact::MetricError::InvalidArgument { argument, .. } => argument,
    };
    // Ragged: one reference list for two hypotheses.
    let e = corpus_ter(&["a", "b"], &[vec!["a"]], cfg).unwrap_err();
    assert_eq!(argument(e), "refs");
    // A segment without a reference.
    let e = corpus_ter_stats(&["a"], &[vec![]], cfg).unwrap_err();
    assert_eq!(argument(e), "refs");
    // No segment (sacrebleu raises IndexError).
    let none: [&str; 0] = [];
    let e = corpus_ter(&none, &[], cfg).unwrap_err();
    assert_eq!(argument(e), "hyps");
    assert!(corpus_ter_stats(&none, &[], cfg).unwrap().is_empty());
    let e = sentence_ter("a", &[] as &[&str], cfg).unwrap_err();
    assert_eq!(argument(e), "refs");
    for bad in [
        TerStats {
            edits: -1.0,
            ref_len: 1.0,
        },
        TerStats {
            edits: 1.5,
            ref_len: 1.0,
        },
        TerStats {
            edits: 1.0,
            ref_len: f64::NAN,
        },
        TerStats {
            edits: f64::INFINITY,
            ref_len: 1.0,
        },
    ] {
        assert_eq!(
            argument(score_ter_stats(&bad).unwrap_err()),
            "stats",
            "{bad:?}"
        );
    }
    let e = resample_scores(
        &[TerStats {
            edits: 0.5,
            ref_len: 1.0,
        }],
        &cfg,
        &BootstrapConfig::default(),
    )
    .unwrap_err();
    assert_eq!(argument(e), "stats");
}
