//! The seq2seq example end to end: `--quick` writes a `results.json` whose every run is
//! re-scorable from the hypothesis and reference files it names, with the protocol's fields.

mod common;
use common::{check_rescorable_results, example_command};
use std::path::PathBuf;

#[test]
fn quick_seq2seq_writes_results_that_its_files_reproduce() {
    let out: PathBuf =
        std::env::temp_dir().join(format!("candle-bleu-seq2seq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = example_command(
        "seq2seq",
        &["--quick", "--out", out.to_str().expect("a UTF-8 temp path")],
    )
    .output()
    .expect("cannot start cargo run");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "seq2seq --quick exited with {}\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("| objective | test BLEU"), "{stdout}");
    let results = check_rescorable_results(&out);
    assert!(results.get("partial").is_none(), "the final results.json");
    let runs = results["runs"].as_array().unwrap();
    let objectives: Vec<&str> = runs
        .iter()
        .map(|r| r["objective"].as_str().unwrap())
        .collect();
    assert_eq!(objectives, ["ce", "ce+bleu"]);
    let config = &results["config"];
    assert_eq!(config["label_smoothing"], 0.1);
    assert!((config["dropout"].as_f64().unwrap() - 0.1).abs() < 1e-6);
    let bleu_start = config["bleu_start"].as_u64().unwrap();
    let steps = config["steps"].as_u64().unwrap();
    for run in runs {
        // The dev-selected checkpoint lies in the selection window and is the best there.
        let step = run["selected_step"].as_u64().unwrap();
        assert!((bleu_start + 1..=steps).contains(&step), "{run}");
        assert!(run["dev_bleu"].as_f64().unwrap() >= run["last_dev_bleu"].as_f64().unwrap());
    }
    std::fs::remove_dir_all(&out).unwrap();
}
