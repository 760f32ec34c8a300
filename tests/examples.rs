//! The examples `quickstart` and `gradcheck` run to completion (exit status 0)
//! and print what they promise. Each runs as a subprocess through `cargo run --example`, in the
//! profile and target directory of this test binary, so it is rebuilt if stale (a no-op after a
//! full `cargo test`, which builds the examples).

use std::path::Path;
use std::process::{Command, Output};

/// `cargo run --example <name> -- <args>` with this test's profile and target directory;
/// panics with the example's output unless it exits with status 0.
fn run_example(name: &str, args: &[&str]) -> String {
    let exe = std::env::current_exe().expect("the test executable's path");
    // <target dir>/<profile dir>/deps/<this test>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["run", "--quiet", "--example", name]);
    // The features this test was built with (`--features cli`, `cuda`, ...): `cargo run` then
    // reuses this build of the crate instead of compiling another, and runs on the same device.
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
        // `cargo test` builds everything in the `test` profile, whose directory is `debug`.
        Some("debug") | None => command.args(["--profile", "test"]),
        Some(custom) => command.args(["--profile", custom]),
    };
    if let Some(target_dir) = profile_dir.parent() {
        if target_dir.join("CACHEDIR.TAG").exists() {
            command.arg("--target-dir").arg(target_dir);
        }
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .arg("--")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot start `cargo run --example {name}`: {e}"));
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "example {name} {args:?} exited with {status}\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&stderr)
    );
    stdout
}

/// The line of `output` that starts with `prefix` (after leading spaces).
fn line<'a>(output: &'a str, prefix: &str) -> &'a str {
    output
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{output}"))
}

/// The number after `label` in `text`.
fn number_after(text: &str, label: &str) -> f64 {
    let rest = &text[text
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {text:?}"))
        + label.len()..];
    rest.split_whitespace()
        .next()
        .map(|w| w.trim_end_matches(','))
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {text:?}"))
}

#[test]
fn quickstart_trains_and_all_reduced_statistics_give_the_full_batch_loss() {
    let out = run_example("quickstart", &[]);
    let loss = number_after(line(&out, "loss = -log BLEU"), "loss = -log BLEU =");
    assert!(loss.is_finite() && loss > 0.0, "{out}");
    // Soft statistics of sentence 0: 4 orders, totals S - n + 1 = 6, 5, 4, 3.
    let sentence = line(&out, "sentence 0: matches");
    assert!(sentence.ends_with("totals [6.0, 5.0, 4.0, 3.0]"), "{out}");
    let norm = number_after(line(&out, "gradient norm"), "gradient norm =");
    assert!(norm.is_finite() && norm > 0.0, "{out}");
    // Training on CE + λ·BLEU lowers both.
    let (first, last) = (line(&out, "step  0:"), line(&out, "step 30:"));
    assert!(
        number_after(last, "-log BLEU") < number_after(first, "-log BLEU"),
        "{out}"
    );
    assert!(
        number_after(last, "cross-entropy") < number_after(first, "cross-entropy"),
        "{out}"
    );
    let reduced = line(&out, "data parallel: all-reduced loss");
    let (all_reduced, full) = (
        number_after(reduced, "all-reduced loss"),
        number_after(reduced, "full-batch loss"),
    );
    assert!(
        (all_reduced - full).abs() <= 1e-5 * full.abs().max(1.0),
        "{out}"
    );
    let diff = number_after(line(&out, "data parallel: worker 0"), "max abs diff");
    assert!(diff <= 1e-6, "{out}");
}

#[test]
fn gradcheck_passes_every_configuration_and_catches_softmax_last_dim() {
    let out = run_example("gradcheck", &["--max-coordinates", "6", "--seed", "1"]);
    // 3 forms × 3 length models × 2 reductions × 2 smoothings, two paths each.
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with("  pass") || l.ends_with("  FAIL"))
        .filter(|l| !l.starts_with("config"))
        .collect();
    assert_eq!(rows.len(), 72, "{out}");
    assert!(rows.iter().all(|r| r.ends_with("pass")), "{out}");
    assert!(
        rows.iter()
            .all(|r| r.split_whitespace().nth(2) == Some("6")),
        "{out}"
    );
    line(&out, "all 72 loss gradient checks passed");
    let last_dim = line(&out, "candle_nn::ops::softmax_last_dim:");
    assert!(
        last_dim.contains("FAILED") && last_dim.contains("NO gradient"),
        "{out}"
    );
    for passing in [
        "candle_nn::ops::softmax(x, D::Minus1): passed",
        "log-sum-exp by hand: passed",
        "Tensor::log_sum_exp: passed",
    ] {
        line(&out, passing);
    }
}
