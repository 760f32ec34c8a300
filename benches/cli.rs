//! Whole-process speed of the `candle-bleu` binary, timed from spawn to exit, on two generated
//! corpora, against sacrebleu's in-process `corpus_score` on the same files
//! (benches/cli_sacrebleu.py):
//!
//! - english-like: 3000 segments (~26 tokens each) from a 3000-word
//!   vocabulary of syllable words, one reference;
//! - zipf (a held-out corpus of another shape): 3000 segments of ~180 bytes from a
//!   5000-word vocabulary with Zipf frequencies, two references (module [`zipf`]);
//! - chrF: 3000 segments of 15-35 words, one reference, scored with `-m chrf` (chrF) and
//!   `-m chrf -cw 2` (chrF++) against sacrebleu's `CHRF().corpus_score` and
//!   `CHRF(word_order=2).corpus_score` (module [`chrf_corpus`]).
//!
//! ```text
//! cargo bench --features cli --bench cli  # writes target/cli_bench/{ref,hyp,sys2}.txt,
//!                                          # target/cli_bench/zipf/{hyp,sys2,ref1,ref2}.txt
//!                                          # and target/cli_bench/chrf/{ref,hyp,sys2}.txt
//! python3 benches/cli_sacrebleu.py  # sacrebleu in-process, and the binary, alternating
//! ```
//!
//! Both corpora come from fixed splitmix64 streams, so every run scores the same text.
//! `CLI_BENCH_RUNS` sets the number of runs, `CLI_BENCH_ONLY=zipf|english|chrf` one corpus.

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

/// A held-out corpus of another shape: 3000 segments of ~180 bytes, a
/// 5000-word vocabulary of random letter strings drawn with Zipf frequencies (`P(rank k) ∝
/// 1/k`), and two references per segment. Each reference and the hypothesis are independent
/// perturbations of one hidden sentence, so the references disagree with each other as well.
pub mod zipf {
    use super::SplitMix64;
    use std::path::{Path, PathBuf};

    pub const SEGMENTS: usize = 3000;
    pub const VOCABULARY: usize = 5000;
    const SEED: u64 = 0x5EED_2026;

    /// `VOCABULARY` distinct lowercase words of 2..=9 letters (a letter-frequency-like draw).
    fn vocabulary(rng: &mut SplitMix64) -> Vec<String> {
        const LETTERS: &[u8] = b"eeeeeeeetttttaaaaoooiiinnnsssrrhhlldcumfpgwybvkxjqz";
        let mut seen = std::collections::HashSet::new();
        let mut words = Vec::with_capacity(VOCABULARY);
        while words.len() < VOCABULARY {
            let len = 2 + rng.below(8);
            let w: String = (0..len)
                .map(|_| LETTERS[rng.below(LETTERS.len())] as char)
                .collect();
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        words
    }

    /// Cumulative Zipf weights `Σ_{j<=k} 1/j`, for inverse-CDF draws.
    fn zipf_cdf() -> Vec<f64> {
        let mut acc = 0.0;
        (1..=VOCABULARY)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect()
    }

    fn draw<'a>(rng: &mut SplitMix64, cdf: &[f64], vocab: &'a [String]) -> &'a str {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * cdf[cdf.len() - 1];
        &vocab[cdf.partition_point(|&c| c < u).min(vocab.len() - 1)]
    }

    /// A hidden sentence of about 180 bytes: Zipf words, a comma now and then, a capital first
    /// letter and final punctuation.
    fn sentence(rng: &mut SplitMix64, cdf: &[f64], vocab: &[String]) -> Vec<String> {
        let target = 150 + rng.below(61);
        let mut words: Vec<String> = Vec::new();
        let mut bytes = 0;
        while bytes < target {
            let mut w = draw(rng, cdf, vocab).to_owned();
            if rng.below(15) == 0 {
                w.push(',');
            }
            bytes += w.len() + 1;
            words.push(w);
        }
        words[0] = words[0][..1].to_uppercase() + &words[0][1..];
        words
            .last_mut()
            .unwrap()
            .push(['.', '.', '?', '!'][rng.below(4)]);
        words
    }

    /// Each word kept (80%), replaced by a Zipf draw (10%), dropped (5%) or followed by an
    /// inserted one (5%).
    fn perturb(rng: &mut SplitMix64, words: &[String], cdf: &[f64], vocab: &[String]) -> String {
        let mut out: Vec<&str> = Vec::with_capacity(words.len() + 4);
        for w in words {
            match rng.below(20) {
                0..=15 => out.push(w),
                16 | 17 => out.push(draw(rng, cdf, vocab)),
                18 => {}
                _ => {
                    out.push(w);
                    out.push(draw(rng, cdf, vocab));
                }
            }
        }
        out.join(" ")
    }

    /// Writes hyp.txt, sys2.txt, ref1.txt and ref2.txt into `dir`; returns their paths.
    pub fn write_corpus(dir: &Path) -> [PathBuf; 4] {
        let mut rng = SplitMix64(SEED);
        let vocab = vocabulary(&mut rng);
        let cdf = zipf_cdf();
        let mut texts = [String::new(), String::new(), String::new(), String::new()];
        for _ in 0..SEGMENTS {
            let s = sentence(&mut rng, &cdf, &vocab);
            for text in texts.iter_mut() {
                text.push_str(&perturb(&mut rng, &s, &cdf, &vocab));
                text.push('\n');
            }
        }
        std::fs::create_dir_all(dir).expect("create target/cli_bench/zipf");
        let paths = ["hyp.txt", "sys2.txt", "ref1.txt", "ref2.txt"].map(|n| dir.join(n));
        for (path, text) in paths.iter().zip(texts) {
            std::fs::write(path, text).expect("write corpus");
        }
        paths
    }
}

/// The chrF corpus (held out from the golden vectors): 3000 segments of 15..=35 words, one
/// reference, written by its own splitmix64 stream. Words are syllable strings from a
/// 4000-word vocabulary with some accented letters, capitalised names, numbers, hyphens and
/// attached punctuation, so that character and word n-grams both matter.
pub mod chrf_corpus {
    use super::SplitMix64;
    use std::path::{Path, PathBuf};

    pub const SEGMENTS: usize = 3000;
    const SEED: u64 = 0xC4F2_2026;
    const SYLLABLES: [&str; 40] = [
        "ta", "ren", "mo", "li", "ka", "sen", "do", "ver", "an", "tis", "po", "nu", "gar", "el",
        "ri", "som", "be", "lan", "chi", "or", "ful", "pe", "dra", "kin", "ast", "mi", "vo",
        "ther", "qua", "zen", "ho", "bri", "é", "ün", "ña", "ço", "ste", "wa", "gli", "ex",
    ];

    /// `w` with its first character upper-cased.
    fn capitalise(w: &str) -> String {
        let mut chars = w.chars();
        chars.next().map_or_else(String::new, |c| {
            c.to_uppercase().chain(chars).collect::<String>()
        })
    }

    fn vocabulary(rng: &mut SplitMix64) -> Vec<String> {
        let mut words: Vec<String> = [
            "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "was", "on", "with",
            "as", "by", "at", "from", "this", "be", "not", "we", "they", "which", "have",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        while words.len() < 4000 {
            let n = 1 + rng.below(4);
            let mut w: String = (0..n)
                .map(|_| SYLLABLES[rng.below(SYLLABLES.len())])
                .collect();
            if rng.below(12) == 0 {
                w = capitalise(&w);
            }
            words.push(w);
        }
        words
    }

    fn word(rng: &mut SplitMix64, vocab: &[String]) -> String {
        let a = rng.below(vocab.len());
        let b = rng.below(vocab.len());
        match rng.below(60) {
            0 => format!("{}", rng.below(2030)),
            1 => format!("{}.{}%", rng.below(100), rng.below(10)),
            2 => format!("{}-{}", vocab[a], vocab[b]),
            _ => vocab[a.min(b)].clone(),
        }
    }

    fn sentence(rng: &mut SplitMix64, vocab: &[String]) -> Vec<String> {
        let n = 15 + rng.below(21);
        let mut words: Vec<String> = (0..n).map(|_| word(rng, vocab)).collect();
        words[0] = capitalise(&words[0]);
        for w in words.iter_mut().take(n - 1) {
            match rng.below(16) {
                0 => w.push(','),
                1 => w.push(';'),
                _ => {}
            }
        }
        if rng.below(6) == 0 {
            let k = 1 + rng.below(n - 3);
            words[k] = format!("({}", words[k]);
            words[k + 1].push(')');
        } else if rng.below(6) == 0 {
            let k = 1 + rng.below(n - 3);
            words[k] = format!("\u{201c}{}", words[k]);
            words[k + 1].push('\u{201d}');
        }
        words[n - 1].push(['.', '.', '.', '?', '!'][rng.below(5)]);
        words
    }

    /// Each word kept (76%), replaced (10%), dropped (5%), followed by an inserted word (5%)
    /// or re-cased (4%).
    fn perturb(rng: &mut SplitMix64, words: &[String], vocab: &[String]) -> String {
        let mut out: Vec<String> = Vec::with_capacity(words.len() + 4);
        for w in words {
            match rng.below(50) {
                0..=37 => out.push(w.clone()),
                38..=42 => out.push(word(rng, vocab)),
                43 | 44 => {}
                45..=47 => {
                    out.push(w.clone());
                    out.push(word(rng, vocab));
                }
                _ => out.push(w.to_uppercase()),
            }
        }
        out.join(" ")
    }

    /// Writes ref.txt, hyp.txt and sys2.txt into `dir`; returns their paths.
    pub fn write_corpus(dir: &Path) -> [PathBuf; 3] {
        let mut rng = SplitMix64(SEED);
        let vocab = vocabulary(&mut rng);
        let mut texts = [String::new(), String::new(), String::new()];
        for _ in 0..SEGMENTS {
            let s = sentence(&mut rng, &vocab);
            texts[0].push_str(&s.join(" "));
            texts[0].push('\n');
            for text in texts[1..].iter_mut() {
                text.push_str(&perturb(&mut rng, &s, &vocab));
                text.push('\n');
            }
        }
        std::fs::create_dir_all(dir).expect("create target/cli_bench/chrf");
        let paths = ["ref.txt", "hyp.txt", "sys2.txt"].map(|n| dir.join(n));
        for (path, text) in paths.iter().zip(texts) {
            std::fs::write(path, text).expect("write corpus");
        }
        paths
    }
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

/// A timed case: its name, the binary's arguments, the number of runs.
type Case<'a> = (&'a str, Vec<&'a str>, usize);

fn main() {
    let bin = env!("CARGO_BIN_EXE_candle-bleu");
    // The CLI's exact BLEU is host code on strings: no tensors, so no GPU and `--cpu` is moot.
    println!("device: cpu (host code)");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/cli_bench");
    let [r, h, s2] = write_corpus(&dir);
    let [zh, zs2, zr1, zr2] = zipf::write_corpus(&dir.join("zipf"));
    let [cr, ch, cs2] = chrf_corpus::write_corpus(&dir.join("chrf"));
    let path = |p: &PathBuf| p.to_string_lossy().into_owned();
    let (r, h, s2) = (path(&r), path(&h), path(&s2));
    let (zh, zs2, zr1, zr2) = (path(&zh), path(&zs2), path(&zr1), path(&zr2));
    let (cr, ch, cs2) = (path(&cr), path(&ch), path(&cs2));
    let runs: usize = std::env::var("CLI_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // `CLI_BENCH_ONLY=zipf` (or `english`) runs one corpus's cases.
    let only = std::env::var("CLI_BENCH_ONLY").unwrap_or_default();
    println!("candle-bleu whole process ({runs} runs each; median, min, p90)");
    let english: [(&str, Vec<&str>, usize); 6] = [
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
    let zipf_cases: [(&str, Vec<&str>, usize); 5] = [
        (
            "zipf, 2 refs, -tok none",
            vec![&zr1, &zr2, "-i", &zh, "-tok", "none", "-f", "text"],
            runs,
        ),
        (
            "zipf, 2 refs, 13a",
            vec![&zr1, &zr2, "-i", &zh, "-f", "text"],
            runs,
        ),
        (
            "zipf, 1 ref, -tok none",
            vec![&zr1, "-i", &zh, "-tok", "none", "-f", "text"],
            runs,
        ),
        (
            "zipf, 1 ref, 13a",
            vec![&zr1, "-i", &zh, "-f", "text"],
            runs,
        ),
        (
            "zipf, 2 refs, 13a, 2 systems",
            vec![&zr1, &zr2, "-i", &zh, &zs2, "-f", "text"],
            runs,
        ),
    ];
    let chrf_cases: [(&str, Vec<&str>, usize); 7] = [
        (
            "chrF (-m chrf)",
            vec![&cr, "-i", &ch, "-m", "chrf", "-f", "text"],
            runs,
        ),
        (
            "chrF++ (-m chrf -cw 2)",
            vec![&cr, "-i", &ch, "-m", "chrf", "-cw", "2", "-f", "text"],
            runs,
        ),
        (
            "chrF, RAYON_NUM_THREADS=1",
            vec![&cr, "-i", &ch, "-m", "chrf", "-f", "text"],
            runs,
        ),
        (
            "chrF++, RAYON_NUM_THREADS=1",
            vec![&cr, "-i", &ch, "-m", "chrf", "-cw", "2", "-f", "text"],
            runs,
        ),
        (
            "BLEU and chrF (-m bleu chrf)",
            vec![&cr, "-i", &ch, "-m", "bleu", "chrf", "-f", "text"],
            runs,
        ),
        (
            "chrF -ci (1000 resamples)",
            vec![&cr, "-i", &ch, "-m", "chrf", "-ci", "-f", "text"],
            runs / 4,
        ),
        (
            "chrF++ -pbs, 2 systems (1000 resamples)",
            vec![
                &cr, "-i", &ch, &cs2, "-m", "chrf", "-cw", "2", "-pbs", "-f", "text",
            ],
            runs / 4,
        ),
    ];
    let mut groups: Vec<(String, &[Case])> = Vec::new();
    if only.is_empty() || only == "english" {
        groups.push((
            format!("english-like corpus: {SEGMENTS} segments, 3000 words, one reference"),
            &english,
        ));
    }
    if only.is_empty() || only == "zipf" {
        groups.push((
            format!(
                "zipf corpus: {} segments of ~180 bytes, {}-word Zipf vocabulary, two references",
                zipf::SEGMENTS,
                zipf::VOCABULARY
            ),
            &zipf_cases,
        ));
    }
    if only.is_empty() || only == "chrf" {
        groups.push((
            format!(
                "chrF corpus: {} segments of 15-35 words, one reference",
                chrf_corpus::SEGMENTS
            ),
            &chrf_cases,
        ));
    }
    for (title, cases) in groups {
        println!("{title}");
        for (name, args, n) in cases {
            if name.contains("RAYON_NUM_THREADS=1") {
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
            println!("    {}", out.trim_end());
        }
    }
    println!("sacrebleu on the same files: python3 benches/cli_sacrebleu.py");
}
