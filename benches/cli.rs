//! Whole-process speed of the `candle-bleu` binary (issue 2, item 4): corpus BLEU with 13a on
//! 3000 generated English-like segments (~26 tokens each), one reference, timed from spawn to
//! exit, against sacrebleu's in-process `corpus_bleu` on the same files
//! (benches/cli_sacrebleu.py).
//!
//!     cargo bench --features cli --bench cli   # writes target/cli_bench/{ref,hyp,sys2}.txt
//!     python3 benches/cli_sacrebleu.py   # sacrebleu in-process, and the binary, back to back
//!
//! The corpus comes from a fixed splitmix64 stream, so every run scores the same text.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SEGMENTS: usize = 3000;
const SEED: u64 = 4242;

/// splitmix64.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const SYLLABLES: [&str; 32] = [
    "ta", "ren", "mo", "li", "ka", "sen", "do", "ver", "an", "tis", "po", "nu", "gar", "el", "ri",
    "som", "be", "lan", "chi", "or", "ful", "pe", "dra", "kin", "ast", "mi", "vo", "ther", "qua",
    "zen", "ho", "bri",
];

/// A vocabulary of 3000 words of 1-3 syllables, with a few function words first (drawn most).
fn vocabulary(rng: &mut SplitMix64) -> Vec<String> {
    let mut words: Vec<String> = [
        "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "was", "on", "with", "as",
        "by", "at", "from", "this", "be", "not",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    while words.len() < 3000 {
        let n = 1 + rng.below(3);
        let w: String = (0..n)
            .map(|_| SYLLABLES[rng.below(SYLLABLES.len())])
            .collect();
        words.push(w);
    }
    words
}

/// A skewed word draw (the minimum of two uniform draws favours the first words).
fn word<'a>(rng: &mut SplitMix64, vocab: &'a [String]) -> &'a str {
    let a = rng.below(vocab.len());
    let b = rng.below(vocab.len());
    &vocab[a.min(b)]
}

/// One detokenized sentence of 14..=34 words with commas, a number now and then, quotes or
/// parentheses, and final punctuation.
fn sentence(rng: &mut SplitMix64, vocab: &[String]) -> Vec<String> {
    let n = 14 + rng.below(21);
    let mut words: Vec<String> = Vec::with_capacity(n + 4);
    for i in 0..n {
        let mut w = match rng.below(40) {
            0 => format!("{}.{}", rng.below(100), rng.below(10)),
            1 => format!("{},{:03}", 1 + rng.below(9), rng.below(1000)),
            _ => word(rng, vocab).to_owned(),
        };
        if i == 0 {
            w = w[..1].to_uppercase() + &w[1..];
        }
        if i + 1 < n && rng.below(12) == 0 {
            w.push(',');
        }
        words.push(w);
    }
    match rng.below(10) {
        0 => {
            let k = rng.below(n - 2) + 1;
            words[k] = format!("({}", words[k]);
            words[k + 1].push(')');
        }
        1 => {
            let k = rng.below(n - 2) + 1;
            words[k] = format!("\"{}", words[k]);
            words[k + 1].push('"');
        }
        _ => {}
    }
    let end = [".", ".", ".", "?", "!"][rng.below(5)];
    if let Some(last) = words.last_mut() {
        last.push_str(end);
    }
    words
}

/// The hypothesis: each word kept (76%), replaced (12%), dropped (6%) or followed by an
/// inserted word (6%).
fn perturb(rng: &mut SplitMix64, words: &[String], vocab: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(words.len() + 4);
    for w in words {
        match rng.below(50) {
            0..=37 => out.push(w.clone()),
            38..=43 => out.push(word(rng, vocab).to_owned()),
            44..=46 => {}
            _ => {
                out.push(w.clone());
                out.push(word(rng, vocab).to_owned());
            }
        }
    }
    out
}

/// Writes ref.txt, hyp.txt and sys2.txt into `dir`; returns their paths.
fn write_corpus(dir: &Path) -> [PathBuf; 3] {
    let mut rng = SplitMix64(SEED);
    let vocab = vocabulary(&mut rng);
    let (mut refs, mut hyps, mut sys2) = (String::new(), String::new(), String::new());
    for _ in 0..SEGMENTS {
        let s = sentence(&mut rng, &vocab);
        refs.push_str(&s.join(" "));
        refs.push('\n');
        hyps.push_str(&perturb(&mut rng, &s, &vocab).join(" "));
        hyps.push('\n');
        sys2.push_str(&perturb(&mut rng, &s, &vocab).join(" "));
        sys2.push('\n');
    }
    std::fs::create_dir_all(dir).expect("create target/cli_bench");
    let paths = ["ref.txt", "hyp.txt", "sys2.txt"].map(|n| dir.join(n));
    for (path, text) in paths.iter().zip([refs, hyps, sys2]) {
        std::fs::write(path, text).expect("write corpus");
    }
    paths
}

/// Median, minimum and 90th percentile of `runs` spawns of the binary with `args`.
fn time_process(bin: &str, args: &[&str], runs: usize) -> (Duration, Duration, Duration, String) {
    let run = || {
        let start = Instant::now();
        let out = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run candle-bleu");
        let elapsed = start.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (elapsed, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (_, output) = run();
    for _ in 0..3 {
        run();
    }
    let mut times: Vec<Duration> = (0..runs).map(|_| run().0).collect();
    times.sort();
    (times[runs / 2], times[0], times[runs * 9 / 10], output)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_candle-bleu");
    // The CLI's exact BLEU is host code on strings: no tensors, so no GPU and `--cpu` is moot.
    println!("device: cpu (host code)");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/cli_bench");
    let [r, h, s2] = write_corpus(&dir);
    let (r, h, s2) = (
        r.to_string_lossy().into_owned(),
        h.to_string_lossy().into_owned(),
        s2.to_string_lossy().into_owned(),
    );
    let runs: usize = std::env::var("CLI_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    println!("candle-bleu whole process, {SEGMENTS} segments, one reference ({runs} runs each)");
    let cases: [(&str, Vec<&str>, usize); 6] = [
        ("13a (default)", vec![&r, "-i", &h, "-f", "text"], runs),
        (
            "13a, RAYON_NUM_THREADS=1",
            vec![&r, "-i", &h, "-f", "text"],
            runs,
        ),
        (
            "none",
            vec![&r, "-i", &h, "-tok", "none", "-f", "text"],
            runs,
        ),
        ("13a -lc", vec![&r, "-i", &h, "-lc", "-f", "text"], runs),
        (
            "13a -ci (1000 resamples)",
            vec![&r, "-i", &h, "-ci", "-f", "text"],
            runs / 4,
        ),
        (
            "13a -pbs, 2 systems (1000 resamples)",
            vec![&r, "-i", &h, &s2, "-pbs", "-f", "json"],
            runs / 4,
        ),
    ];
    for (k, (name, args, n)) in cases.iter().enumerate() {
        if k == 1 {
            std::env::set_var("RAYON_NUM_THREADS", "1");
        } else {
            std::env::remove_var("RAYON_NUM_THREADS");
        }
        let (median, min, p90, out) = time_process(bin, args, (*n).max(5));
        println!(
            "  {name:<38} median {:7.2} ms  min {:7.2} ms  p90 {:7.2} ms",
            ms(median),
            ms(min),
            ms(p90)
        );
        if k == 0 {
            println!("    {}", out.trim_end());
        }
    }
    println!("sacrebleu on the same files: python3 benches/cli_sacrebleu.py");
}
