//! What the tests that run research examples share.

use std::path::Path;
use std::process::Command;

/// `cargo run --example <name> -- <args>` in this test binary's profile, target directory and
/// features, from the workspace root: the same package selection as the workspace's
/// `cargo test` (both default members), so the same feature unification, and `cargo run`
/// reuses this build instead of compiling another.
pub fn example_command(name: &str, args: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("research/ is inside the workspace");
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(workspace)
        .args(["run", "--quiet", "--example", name]);
    // The features this test was built with: `cargo run` then reuses this build of the crate
    // instead of compiling another.
    let features: Vec<&str> = [
        ("cli", cfg!(feature = "cli")),
        ("cuda", cfg!(feature = "cuda")),
        ("cudnn", cfg!(feature = "cudnn")),
        ("metal", cfg!(feature = "metal")),
        ("mkl", cfg!(feature = "mkl")),
        ("accelerate", cfg!(feature = "accelerate")),
        ("mpi", cfg!(feature = "mpi")),
        ("nccl", cfg!(feature = "nccl")),
    ]
    .into_iter()
    .filter_map(|(feature, on)| on.then_some(feature))
    .collect();
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => command.arg("--release"),
        Some("debug") | None => command.args(["--profile", "test"]),
        Some(custom) => command.args(["--profile", custom]),
    };
    if let Some(target_dir) = profile_dir.parent() {
        if target_dir.join("CACHEDIR.TAG").exists() {
            command.arg("--target-dir").arg(target_dir);
        }
    }
    command.arg("--").args(args);
    command
}

/// Runs `cargo run --example <name> -- <args>` ([`example_command`]): whether it succeeded,
/// its stdout and its stderr.
#[allow(dead_code)]
pub fn run_example(name: &str, args: &[&str]) -> (bool, String, String) {
    let output = example_command(name, args)
        .output()
        .expect("cannot start cargo run");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Checks that a real-data study's `run` (a results.json row) reports the BLEU (13a), chrF,
/// length ratio and signature of its hypotheses `hyps` against `references`, as the crate's
/// exact scorer computes them (sacrebleu's defaults).
#[allow(dead_code)]
pub fn check_13a_scores(run: &serde_json::Value, hyps: &[String], references: &[String]) {
    use candle_bleu::exact::chrf::{corpus_chrf, ChrfConfig};
    use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
    use candle_bleu::exact::{corpus_bleu, BleuConfig};
    assert_eq!(hyps.len(), references.len(), "{run}");
    let ref_tokens: Vec<Vec<Vec<String>>> = references
        .iter()
        .map(|r| vec![tokenize(r, Tokenizer::V13a, false)])
        .collect();
    let ref_text: Vec<Vec<String>> = references.iter().map(|r| vec![r.clone()]).collect();
    let hyp_tokens: Vec<Vec<String>> = hyps
        .iter()
        .map(|h| tokenize(h, Tokenizer::V13a, false))
        .collect();
    let bleu = corpus_bleu(&hyp_tokens, &ref_tokens, &BleuConfig::default()).unwrap();
    let chrf = corpus_chrf(hyps, &ref_text, ChrfConfig::default()).unwrap();
    assert_eq!(run["test_bleu"].as_f64().unwrap(), bleu.score, "{run}");
    assert_eq!(run["test_chrf"].as_f64().unwrap(), chrf.score, "{run}");
    assert_eq!(
        run["test_length_ratio"].as_f64().unwrap(),
        bleu.ratio,
        "{run}"
    );
    assert_eq!(
        run["bleu_signature"],
        "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    );
}

/// Checks a synthetic study's `results.json` in `out`: a `runs` array whose every run names
/// its test hypotheses and references by paths relative to `out` that exist, carries
/// sacrebleu's `tok:none` signature, and whose `test_bleu` equals the crate's exact corpus BLEU
/// (`candle_bleu::exact`, sacrebleu's defaults, tokenizer `none`) of those files. Returns the
/// parsed results.
#[allow(dead_code)]
pub fn check_rescorable_results(out: &Path) -> serde_json::Value {
    use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
    use candle_bleu::exact::{corpus_bleu, BleuConfig};
    let text = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("no results.json in {}: {e}", out.display()));
    let results: serde_json::Value = serde_json::from_str(&text).expect("results.json is JSON");
    let runs = results["runs"].as_array().expect("a `runs` array");
    assert!(!runs.is_empty(), "no runs in {}", out.display());
    let read = |name: &str| -> Vec<Vec<String>> {
        assert!(
            Path::new(name).is_relative(),
            "{name}: paths must be relative to results.json"
        );
        std::fs::read_to_string(out.join(name))
            .unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
            .lines()
            .map(|l| tokenize(l, Tokenizer::None, false))
            .collect()
    };
    for run in runs {
        assert!(run["objective"].is_string(), "{run}");
        assert!(run["seed"].as_u64().is_some(), "{run}");
        assert_eq!(
            run["signature"], "nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:2.6.0",
            "{run}"
        );
        let hyps = read(run["test_hyp"].as_str().expect("test_hyp"));
        let refs = read(run["test_ref"].as_str().expect("test_ref"));
        assert_eq!(hyps.len(), refs.len(), "{run}");
        let wrapped: Vec<Vec<Vec<String>>> = refs.into_iter().map(|r| vec![r]).collect();
        let rescored = corpus_bleu(&hyps, &wrapped, &BleuConfig::default())
            .expect("BLEU of the written files")
            .score;
        let reported = run["test_bleu"].as_f64().expect("test_bleu");
        assert_eq!(rescored, reported, "{run}: rescored {rescored}");
    }
    results
}
