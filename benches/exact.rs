//! Exact BLEU speed (issue 2, item 5): corpus BLEU of 3000 segments of ~26 tokens, one
//! reference, in-process on `u32` ids; compared with sacrebleu (benches/exact_sacrebleu.py,
//! same corpus from the same generator) and the `bleuscore` crate.
//!
//!     cargo bench --bench exact
//!     python3 benches/exact_sacrebleu.py
//!
//! The corpus generator (splitmix64, integer operations only) is duplicated in
//! benches/exact_sacrebleu.py so both sides score the same tokens; the bench also writes the
//! corpus to target/exact_bench/{hyp,ref}.txt and prints its score, which the Python script
//! checks.

use std::hint::black_box;
use std::time::{Duration, Instant};

use candle_bleu::exact::{corpus_bleu, BleuConfig, BleuScore};

const SEGMENTS: usize = 3000;
const SEED: u64 = 2024;

/// splitmix64: tiny, portable, and easy to reproduce exactly in Python.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// 3000 segments: hypothesis of 16..=36 tokens (mean 26) over 2000 ids with a skew towards
/// small ids; the reference is the hypothesis with a quarter of its tokens replaced, a tenth
/// dropped and a twentieth followed by an inserted token, so every order has matches.
fn corpus() -> (Vec<Vec<u32>>, Vec<Vec<Vec<u32>>>) {
    let mut rng = SplitMix64(SEED);
    let token = |rng: &mut SplitMix64| {
        let a = rng.next() % 2000;
        let b = rng.next() % 2000;
        a.min(b) as u32
    };
    let mut hyps = Vec::with_capacity(SEGMENTS);
    let mut refs = Vec::with_capacity(SEGMENTS);
    for _ in 0..SEGMENTS {
        let len = 16 + (rng.next() % 21) as usize;
        let hyp: Vec<u32> = (0..len).map(|_| token(&mut rng)).collect();
        let mut reference = Vec::with_capacity(len);
        for &t in &hyp {
            match rng.next() % 20 {
                0 | 1 => {}                               // dropped
                2..=6 => reference.push(token(&mut rng)), // replaced
                19 => {
                    // kept, and a token inserted after it
                    reference.push(t);
                    reference.push(token(&mut rng));
                }
                _ => reference.push(t),
            }
        }
        hyps.push(hyp);
        refs.push(vec![reference]);
    }
    (hyps, refs)
}

fn to_text(seq: &[u32]) -> String {
    seq.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Median (and min) wall time of `f` over `runs` runs after `warmup` runs.
fn time<R>(warmup: usize, runs: usize, mut f: impl FnMut() -> R) -> (Duration, Duration) {
    for _ in 0..warmup {
        black_box(f());
    }
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            black_box(f());
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[runs / 2], times[0])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // The exact BLEU is host code on integer ids: no tensors, so no GPU and `--cpu` is moot.
    println!("device: cpu (host code)");
    let (hyps, refs) = corpus();
    let tokens: usize = hyps.iter().map(Vec::len).sum();
    println!(
        "corpus: {SEGMENTS} segments, {tokens} hypothesis tokens ({:.1} per segment), 1 reference",
        tokens as f64 / SEGMENTS as f64
    );

    // The corpus as text, for sacrebleu (benches/exact_sacrebleu.py) and bleuscore.
    let hyp_text: Vec<String> = hyps.iter().map(|h| to_text(h)).collect();
    let ref_text: Vec<String> = refs.iter().map(|r| to_text(&r[0])).collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/exact_bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hyp.txt"), hyp_text.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("ref.txt"), ref_text.join("\n") + "\n").unwrap();

    let cfg = BleuConfig::default();
    let score: BleuScore = corpus_bleu(&hyps, &refs, &cfg).unwrap();
    println!(
        "candle_bleu score = {:.17} (counts {:?}, totals {:?}, bp {}, hyp_len {}, ref_len {})",
        score.score, score.counts, score.totals, score.bp, score.hyp_len, score.ref_len
    );
    let (median, min) = time(20, 200, || corpus_bleu(&hyps, &refs, &cfg).unwrap());
    println!(
        "candle_bleu::exact::corpus_bleu (u32 ids, {} rayon threads from 512 segments on): median {:.3} ms, min {:.3} ms",
        rayon::current_num_threads(),
        ms(median),
        ms(min)
    );

    // One thread: corpus_bleu on a one-thread rayon pool.
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let single = || one_thread.install(|| corpus_bleu(&hyps, &refs, &cfg).unwrap());
    assert_eq!(single(), score);
    let (median_single, min_single) = time(20, 200, single);
    println!(
        "candle_bleu::exact::corpus_bleu (u32 ids, one thread): median {:.3} ms, min {:.3} ms",
        ms(median_single),
        ms(min_single)
    );

    if std::env::var_os("EXACT_BENCH_ORDERS").is_some() {
        for n in 1..=6 {
            let cfg = BleuConfig {
                max_order: n,
                ..BleuConfig::default()
            };
            let (median, _) = time(20, 200, || corpus_bleu(&hyps, &refs, &cfg).unwrap());
            println!("max_order {n}: median {:.3} ms", ms(median));
        }
    }
    if std::env::var_os("EXACT_BENCH_ONLY_OURS").is_some() {
        return;
    }

    // bleuscore 0.2: strings in, 13a tokenization inside (cannot be skipped), rayon over
    // segments, Hugging Face `evaluate` semantics with RefLenMethod::Closest for sacrebleu's
    // reference length.
    let refs_bs: Vec<Vec<String>> = ref_text.iter().map(|r| vec![r.clone()]).collect();
    let bs = bleuscore::compute_score(
        &refs_bs,
        &hyp_text,
        4,
        false,
        bleuscore::RefLenMethod::Closest,
    );
    println!(
        "bleuscore score = {:.17} (precisions {:?}, bp {})",
        bs.bleu * 100.0,
        bs.precisions,
        bs.brevity_penalty
    );
    let (median_bs, min_bs) = time(3, 30, || {
        bleuscore::compute_score(
            &refs_bs,
            &hyp_text,
            4,
            false,
            bleuscore::RefLenMethod::Closest,
        )
    });
    println!(
        "bleuscore::compute_score (text, 13a inside): median {:.3} ms, min {:.3} ms ({:.1}x slower than candle_bleu)",
        ms(median_bs),
        ms(min_bs),
        median_bs.as_secs_f64() / median.as_secs_f64()
    );
}
