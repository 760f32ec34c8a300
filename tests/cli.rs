//! The `candle-bleu` binary against the real sacrebleu 2.6.0 command line.
//!
//! - Golden cases (tests/golden/cli/cases.json, written by tests/golden/generate_cli.py): every
//!   case runs the release binary with sacrebleu's arguments, environment and standard input in
//!   the repository root, and must print sacrebleu's standard output exactly (our extra JSON
//!   fields removed, the `version` token masked) with sacrebleu's exit status. Cases with
//!   `full` statistics also check the extra JSON fields against sacrebleu's full-precision
//!   values (1e-9 relative). BLEU, chrF and TER (`-m bleu chrf ter`, the `--chrf-*` and
//!   `--ter-*` options, `-ci`, `-pbs`, `-par`); the chrF and TER `-pbs -f json` cases are
//!   sacrebleu's output with its JSON encoder taught `numpy.float32` (sacrebleu 2.6.0 itself
//!   raises TypeError there).
//! - Malformed input: exit status 2, a message on stderr naming the file, line or counts, and
//!   nothing on stdout.
//! - Bootstrap and paired tests: structure, plausibility and determinism.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_candle-bleu");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary in the repository root with `args`, `env` and `stdin` (none: an empty,
/// closed standard input).
fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(root())
        .env_remove("SACREBLEU_FORMAT")
        .env_remove("SACREBLEU_SEED")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn candle-bleu");
    {
        let mut input = child.stdin.take().expect("stdin");
        if let Some(bytes) = stdin {
            // The binary may exit before reading everything (an argument error): ignore EPIPE.
            let _ = input.write_all(bytes);
        }
    }
    child.wait_with_output().expect("wait for candle-bleu")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[derive(Deserialize)]
struct Golden {
    sacrebleu: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    args: Vec<String>,
    exit: i32,
    stdout: String,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    full: Option<Full>,
    #[serde(default)]
    api: bool,
    #[serde(default)]
    max_order: Option<usize>,
}

#[derive(Deserialize)]
struct Full {
    score: f64,
    counts: Vec<f64>,
    totals: Vec<f64>,
    precisions: Vec<f64>,
    bp: f64,
    ratio: f64,
    sys_len: u64,
    ref_len: u64,
}

fn load() -> Golden {
    let path = root().join("tests/golden/cli/cases.json");
    let text = std::fs::read_to_string(&path).expect("read tests/golden/cli/cases.json");
    serde_json::from_str(&text).expect("parse cases.json")
}

/// Replaces the value of every `version:X` (signature) and `"version": "X"` (JSON) by `*`.
fn mask_version(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        let a = rest.find("version:");
        let b = rest.find("\"version\": \"");
        let (pos, key_len) = match (a, b) {
            (Some(a), Some(b)) if a < b => (a, "version:".len()),
            (Some(a), None) => (a, "version:".len()),
            (_, Some(b)) => (b, "\"version\": \"".len()),
            (None, None) => break,
        };
        out.push_str(&rest[..pos + key_len]);
        rest = &rest[pos + key_len..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || ".+-_".contains(c)))
            .unwrap_or(rest.len());
        out.push('*');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Our output with this tool's additions removed: the extra JSON fields after sacrebleu's
/// (from `"counts"` to the closing brace) and, for `--max-ngram-order` cases, the `ngram`
/// signature field and JSON key.
fn strip_extras(ours: &str, max_order: Option<usize>) -> String {
    let mut s = ours.to_owned();
    if let Some(start) = s.find(",\n \"counts\": [") {
        if let Some(end) = s[start..].find("\n}") {
            s.replace_range(start..start + end, "");
        }
    }
    if let Some(n) = max_order.filter(|&n| n != 4) {
        s = s.replace(&format!("|ngram:{n}"), "");
        s = s.replace(&format!(",\n \"ngram\": \"{n}\""), "");
    }
    s
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Checks the extra JSON fields against sacrebleu's full-precision statistics.
fn check_full(name: &str, ours: &str, full: &Full, failures: &mut Vec<String>) {
    let v: Value = match serde_json::from_str(ours) {
        Ok(v) => v,
        Err(e) => {
            failures.push(format!("{name}: output is not JSON ({e})"));
            return;
        }
    };
    let nums = |key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let mut bad = |what: &str, ok: bool| {
        if !ok {
            failures.push(format!("{name}: {what} differs from sacrebleu's"));
        }
    };
    let vec_close =
        |a: &[f64], b: &[f64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| close(*x, *y));
    bad("counts", vec_close(&nums("counts"), &full.counts));
    bad("totals", vec_close(&nums("totals"), &full.totals));
    bad(
        "precisions",
        vec_close(&nums("precisions"), &full.precisions),
    );
    bad("bp", v["bp"].as_f64().is_some_and(|x| close(x, full.bp)));
    bad(
        "ratio",
        v["ratio"].as_f64().is_some_and(|x| close(x, full.ratio)),
    );
    bad("hyp_len", v["hyp_len"].as_u64() == Some(full.sys_len));
    bad("ref_len", v["ref_len"].as_u64() == Some(full.ref_len));
    bad(
        "score",
        v["score"]
            .as_f64()
            .is_some_and(|x| (x - full.score).abs() <= 0.05 + 1e-9),
    );
}

#[test]
fn golden_cases_match_sacrebleu() {
    let golden = load();
    assert_eq!(golden.sacrebleu, "2.6.0");
    assert!(
        golden.cases.len() >= 100,
        "only {} cases",
        golden.cases.len()
    );
    let mut failures = Vec::new();
    for case in &golden.cases {
        let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = case
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let out = run(&args, &env, case.stdin.as_deref().map(str::as_bytes));
        let code = out.status.code().unwrap_or(-1);
        if code != case.exit {
            failures.push(format!(
                "{}: exit {code}, sacrebleu {}; stderr: {}",
                case.name,
                case.exit,
                stderr(&out)
            ));
            continue;
        }
        let ours = stdout(&out);
        let got = mask_version(&strip_extras(&ours, case.max_order));
        let want = mask_version(&case.stdout);
        if got != want {
            failures.push(format!(
                "{}{}: stdout differs\n--- sacrebleu\n{want}--- candle-bleu\n{got}",
                case.name,
                if case.api { " (api)" } else { "" }
            ));
            continue;
        }
        if let Some(full) = &case.full {
            check_full(&case.name, &ours, full, &mut failures);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        golden.cases.len(),
        failures.join("\n")
    );
}

/// A fresh temporary directory for one test.
fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "candle-bleu-cli-{}-{}-{tag}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write temp file");
    path.to_string_lossy().into_owned()
}

/// Asserts exit status 2, nothing on stdout, and every `needle` in the message on stderr.
fn assert_fails(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(
        out.stdout.is_empty(),
        "stdout not empty: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in stderr: {err}");
    }
    assert!(!err.contains("panicked"), "panic: {err}");
}

#[test]
fn mismatched_line_counts() {
    let d = temp_dir("count");
    let r = write(&d, "ref.txt", b"a b c\nd e f\ng h\n");
    let h = write(&d, "hyp.txt", b"a b c\nd e f\n");
    assert_fails(
        &run(&[&r, "-i", &h], &[], None),
        &["hyp.txt", "2 line(s)", "ref.txt", "3 line(s)"],
    );
    // The second reference file is the short one.
    let r2 = write(&d, "ref2.txt", b"a b c\n");
    let h3 = write(&d, "hyp3.txt", b"a\nb\nc\n");
    assert_fails(
        &run(&[&r, &r2, "-i", &h3], &[], None),
        &["ref2.txt", "1 line(s)", "3 line(s)"],
    );
    // Standard input.
    assert_fails(
        &run(&[&r], &[], Some(b"a\n")),
        &["<stdin>", "1 line(s)", "3 line(s)"],
    );
    // A CRLF file has as many lines as its LF twin; a lone CR does not end a file line.
    let crlf = write(&d, "crlf.txt", b"a b c\r\nd e f\r\ng h\r\n");
    assert_eq!(run(&[&r, "-i", &crlf], &[], None).status.code(), Some(0));
    let cr = write(&d, "cr.txt", b"a b c\rd e f\rg h\n");
    assert_fails(&run(&[&r, "-i", &cr], &[], None), &["cr.txt", "1 line(s)"]);
}

#[test]
fn num_refs_with_wrong_number_of_tabs() {
    let d = temp_dir("nr");
    let r = write(&d, "refs.tsv", b"a b\ta c\nd e\td f\ng h\n");
    let h = write(&d, "hyp.txt", b"a b\nd e\ng h\n");
    assert_fails(
        &run(&[&r, "-i", &h, "--num-refs", "2"], &[], None),
        &["refs.tsv", "line 3", "expected 2", "found 1"],
    );
    // A trailing empty reference: sacrebleu's rstrip() eats its tab, so the line is short.
    let r = write(&d, "refs2.tsv", b"a b\ta c\nd e\t\n");
    let h = write(&d, "hyp2.txt", b"a b\nd e\n");
    assert_fails(
        &run(&[&r, "-i", &h, "-nr", "2"], &[], None),
        &["line 2", "found 1"],
    );
    // --num-refs with two reference files.
    assert_fails(
        &run(&[&r, &r, "-i", &h, "-nr", "2"], &[], None),
        &["--num-refs"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-nr", "0"], &[], None),
        &["--num-refs"],
    );
    // A huge --num-refs fails on the first line (no allocation of a billion streams).
    assert_fails(
        &run(&[&r, "-i", &h, "-nr", "1000000000"], &[], None),
        &["line 1", "expected 1000000000"],
    );
}

#[test]
fn invalid_utf8_is_reported_with_file_and_line() {
    let d = temp_dir("utf8");
    let r = write(&d, "ref.txt", b"a b\nc d\ne f\n");
    let bad = write(&d, "bad.txt", b"a b\nc \xff d\ne f\n");
    assert_fails(
        &run(&[&r, "-i", &bad], &[], None),
        &["bad.txt", "line 2", "invalid UTF-8"],
    );
    assert_fails(
        &run(&[&bad, "-i", &r], &[], None),
        &["bad.txt", "line 2", "invalid UTF-8"],
    );
    // A truncated multi-byte character at the very end, and an encoded surrogate.
    let trunc = write(&d, "trunc.txt", b"a b\nc d\ne \xe2\x82");
    assert_fails(
        &run(&[&r, "-i", &trunc], &[], None),
        &["trunc.txt", "line 3"],
    );
    let surrogate = write(&d, "sur.txt", b"\xed\xa0\x80\nc d\ne f\n");
    assert_fails(
        &run(&[&r, "-i", &surrogate], &[], None),
        &["sur.txt", "line 1"],
    );
    assert_fails(
        &run(&[&r], &[], Some(b"a b\n\xc3\x28\ne f\n")),
        &["<stdin>", "line 2"],
    );
}

#[test]
fn empty_inputs() {
    let d = temp_dir("empty");
    let r = write(&d, "ref.txt", b"a b\n");
    let empty = write(&d, "empty.txt", b"");
    assert_fails(
        &run(&[&r, "-i", &empty], &[], None),
        &["empty.txt", "empty"],
    );
    assert_fails(
        &run(&[&empty, "-i", &r], &[], None),
        &["empty.txt", "empty"],
    );
    assert_fails(&run(&[&r], &[], Some(b"")), &["<stdin>", "empty"]);
    assert_fails(&run(&[&r], &[], None), &["<stdin>", "empty"]);
    // A file holding one newline has one (empty) line: that is not an error.
    let nl = write(&d, "nl.txt", b"\n");
    let out = run(&[&r, "-i", &nl, "-b"], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "0.0\n");
}

#[test]
fn unreadable_files_and_bad_arguments() {
    let d = temp_dir("args");
    let r = write(&d, "ref.txt", b"a b c\n");
    let h = write(&d, "hyp.txt", b"a b c\n");
    let missing = d.join("missing.txt").to_string_lossy().into_owned();
    assert_fails(
        &run(&[&missing, "-i", &h], &[], None),
        &["reference file", "missing.txt"],
    );
    assert_fails(
        &run(&[&r, "-i", &missing], &[], None),
        &["hypothesis file", "missing.txt"],
    );
    let dir = d.to_string_lossy().into_owned();
    assert_fails(&run(&[&dir, "-i", &h], &[], None), &["reference file"]);
    let gz = write(&d, "ref.txt.gz", b"\x1f\x8b");
    assert_fails(&run(&[&gz, "-i", &h], &[], None), &["gzip"]);
    assert_fails(
        &run(&[&r, "-i", &h, "-tok", "nope"], &[], None),
        &["--tokenize", "nope"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "--tokenize", "ja-mecab"], &[], None),
        &["ja-mecab", "not supported"],
    );
    assert_fails(&run(&[&r, "-i", &h, "--bogus"], &[], None), &["--bogus"]);
    assert_fails(
        &run(&[&r, "-i", &h, "-s", "laplace"], &[], None),
        &["laplace"],
    );
    assert_fails(&run(&[&r, "-i", &h, "-w", "-1"], &[], None), &["--width"]);
    assert_fails(&run(&[&r, "-i", &h, "-w", "x"], &[], None), &["x"]);
    assert_fails(
        &run(&[&r, "-i", &h, "-s", "floor", "-sv", "-0.5"], &[], None),
        &["--smooth-value"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "--max-ngram-order", "0"], &[], None),
        &["--max-ngram-order"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "ter", "chrf", "-sl"], &[], None),
        &["--sentence-level", "one metric"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "ter", "--ter-bogus"], &[], None),
        &["--ter-bogus"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "bleu", "rouge"], &[], None),
        &["--metrics", "rouge"],
    );
    // chrF's options: no n-gram order at all, negative orders, beta below 1, several metrics
    // at sentence level.
    assert_fails(
        &run(
            &[&r, "-i", &h, "-m", "chrf", "-cc", "0", "-cw", "0"],
            &[],
            None,
        ),
        &["--chrf-char-order", "--chrf-word-order"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "chrf", "-cw", "-1"], &[], None),
        &["--chrf-word-order", "-1"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "chrf", "--chrf-beta", "0"], &[], None),
        &["--chrf-beta", "0"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-m", "bleu", "chrf", "-sl"], &[], None),
        &["--sentence-level", "one metric"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-e", "latin-1"], &[], None),
        &["--encoding"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-t", "wmt14"], &[], None),
        &["--test-set"],
    );
    assert_fails(&run(&["-i", &h], &[], None), &["reference"]);
    assert_fails(
        &run(&[&r, "-i", &h, "-sl", "-ci"], &[], None),
        &["--sentence-level"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-pbs"], &[], None),
        &["several systems"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, &r, "-ci"], &[], None),
        &["--confidence"],
    );
    assert_fails(&run(&[&r, "-i", &h, &h], &[], None), &["twice"]);
    assert_fails(
        &run(&[&r, "-i", &h, "-pbs", "-par"], &[], None),
        &["--paired-bs"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-ci"], &[("SACREBLEU_SEED", "-3")], None),
        &["SACREBLEU_SEED"],
    );
    assert_fails(
        &run(&[&r, "-i", &h, "-ci", "-cin", "100000000000"], &[], None),
        &["--confidence-n"],
    );
    // Standard input with a changing number of tab-separated systems.
    assert_fails(
        &run(&[&r, &r], &[], Some(b"a\tb\nc\n")),
        &["<stdin>", "line 2"],
    );
}

#[test]
fn help_and_version_exit_zero() {
    let out = run(&["--help"], &[], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("--tokenize"));
    let out = run(&["--version"], &[], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("sacrebleu 2.6.0"));
}

fn sample(name: &str) -> String {
    format!("data/sample.{name}.txt")
}

#[test]
fn confidence_interval_structure() {
    let (r, h) = (sample("ref"), sample("hyp"));
    let out = run(&[&r, "-i", &h, "-ci", "-w", "4"], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let score = v["score"].as_f64().expect("score");
    let mean = v["confidence_mean"].as_f64().expect("mean");
    let ci = v["confidence_var"].as_f64().expect("ci");
    assert!(ci > 0.0 && ci < 20.0, "ci {ci}");
    assert!((mean - score).abs() <= ci, "{score} outside {mean} ± {ci}");
    assert!(v["signature"]
        .as_str()
        .is_some_and(|s| s.contains("bs:1000|seed:12345")));
    // Deterministic: the same bytes twice; another seed, other resamples.
    let again = run(&[&r, "-i", &h, "-ci", "-w", "4"], &[], None);
    assert_eq!(out.stdout, again.stdout);
    let seeded = run(
        &[&r, "-i", &h, "-ci", "-w", "4"],
        &[("SACREBLEU_SEED", "99")],
        None,
    );
    assert_ne!(out.stdout, seeded.stdout);
}

#[test]
fn paired_test_structure() {
    let (r, h, s2) = (sample("ref"), sample("hyp"), sample("sys2"));
    for flag in ["-pbs", "-par"] {
        let out = run(
            &[&r, "-i", &h, &s2, flag, "-pbsn", "200", "-parn", "300"],
            &[],
            None,
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        let rows = v.as_array().expect("a list of systems");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["system"], format!("Baseline: {h}"));
        assert!(rows[0]["BLEU"]["p_value"].is_null());
        let p = rows[1]["BLEU"]["p_value"].as_f64().expect("p-value");
        assert!(p > 0.0 && p <= 1.0, "{p}");
        if flag == "-pbs" {
            let sys = &rows[1]["BLEU"];
            let (score, mean, ci) = (
                sys["score"].as_f64().unwrap_or(f64::NAN),
                sys["mean"].as_f64().unwrap_or(f64::NAN),
                sys["ci"].as_f64().unwrap_or(f64::NAN),
            );
            assert!((mean - score).abs() <= ci, "{score} outside {mean} ± {ci}");
        }
        let again = run(
            &[&r, "-i", &h, &s2, flag, "-pbsn", "200", "-parn", "300"],
            &[],
            None,
        );
        assert_eq!(out.stdout, again.stdout, "{flag} is not deterministic");
    }
    // A system against itself: p = 1/(n+1) (nothing differs by more than 0).
    let d = temp_dir("self");
    let bytes = std::fs::read(root().join(&h)).expect("read sample");
    let copy = write(&d, "copy.txt", &bytes);
    for flag in ["-pbs", "-par"] {
        let out = run(
            &[&r, "-i", &h, &copy, flag, "-pbsn", "99", "-parn", "99"],
            &[],
            None,
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        assert_eq!(v[1]["BLEU"]["p_value"].as_f64(), Some(0.01), "{flag}");
    }
}

#[test]
fn max_ngram_order_spellings_agree() {
    let (r, h) = (sample("ref"), sample("hyp"));
    let a = run(
        &[&r, "-i", &h, "--max-ngram-order", "2", "-f", "text"],
        &[],
        None,
    );
    let b = run(
        &[&r, "-i", &h, "--bleu-max-ngram-order=2", "-f", "text"],
        &[],
        None,
    );
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    assert!(stdout(&a).contains("|ngram:2|"));
    let four = run(
        &[&r, "-i", &h, "--max-ngram-order", "4", "-f", "text"],
        &[],
        None,
    );
    let default = run(&[&r, "-i", &h, "-f", "text"], &[], None);
    assert_eq!(four.stdout, default.stdout);
}

#[test]
fn abbreviations_and_attached_values() {
    let (r, h) = (sample("ref"), sample("hyp"));
    let a = run(
        &[&r, "-i", &h, "-tok", "intl", "-lc", "-f", "text"],
        &[],
        None,
    );
    for args in [
        vec![r.as_str(), "-i", &h, "-tok=intl", "-lc", "-ftext"],
        vec![
            r.as_str(),
            "-i",
            &h,
            "--tok",
            "intl",
            "--lower",
            "--format=text",
        ],
    ] {
        let b = run(&args, &[], None);
        assert_eq!(a.stdout, b.stdout, "{args:?}: {}", stderr(&b));
    }
}
