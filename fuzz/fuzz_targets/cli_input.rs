//! Fuzzes the `candle-bleu` command line's input handling and counting (the binary's modules
//! `src/bin/candle-bleu/input.rs` and `count.rs`, included below with `#[path]`: they belong to
//! the binary, not to the library's API) on arbitrary bytes: no panic on any input; errors only
//! for what `input` documents; the statistics counted on segment-local ids equal those of
//! `exact::corpus_stats` on the tokens as strings; the summed and per-segment statistics
//! agree; scores are finite and in 0..=100 (+1 ulp); bootstrap p-values are in (0, 1].
//!
//! Input layout: byte 0 picks the options (tokenizer, lowercase, standard input or files,
//! number of reference files, `--num-refs`, smoothing, max order); the rest is cut at the
//! first two `0x00` bytes into the hypothesis input and one or two reference files.
#![no_main]

#[path = "../../src/bin/candle-bleu/count.rs"]
mod count;
#[path = "../../src/bin/candle-bleu/input.rs"]
mod input;

use candle_bleu::exact::bootstrap::{bootstrap_confidence, paired_bootstrap_many, BootstrapConfig};
use count::Counting;
use input::{file_lines, read_corpus, universal_lines, HypInput, InputError, Source};
use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
use candle_bleu::exact::{
    corpus_stats, score_from_stats, BleuConfig, BleuCounts, SmoothMethod, TextStatsConfig,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&opts, rest)) = data.split_first() else {
        return;
    };
    let tok = Tokenizer::ALL[(opts % 5) as usize];
    let lowercase = opts & 0x08 != 0;
    let use_stdin = opts & 0x10 != 0;
    let two_ref_files = opts & 0x20 != 0;
    let num_refs = if two_ref_files {
        1
    } else {
        1 + ((opts >> 6) % 3) as usize
    };
    let smoothing = match (opts >> 6) & 3 {
        0 => SmoothMethod::Exp,
        1 => SmoothMethod::Floor(0.1),
        2 => SmoothMethod::AddK(1.0),
        _ => SmoothMethod::None,
    };
    let max_order = 1 + (opts as usize >> 5) % 5;

    let mut parts = rest.splitn(3, |&b| b == 0);
    let hyp = parts.next().unwrap_or(&[]);
    let ref1 = parts.next().unwrap_or(&[]);
    let ref2 = parts.next().unwrap_or(&[]);

    // Line splitting invariants.
    if let Ok(lines) = file_lines("f", ref1) {
        let newlines = ref1.iter().filter(|&&b| b == b'\n').count();
        let expected = newlines + usize::from(!ref1.is_empty() && ref1.last() != Some(&b'\n'));
        assert_eq!(lines.len(), expected);
    }
    if let Ok(text) = std::str::from_utf8(hyp) {
        for line in universal_lines(text) {
            assert!(!line.contains('\n') && !line.contains('\r'));
        }
    }

    let hyp_files = [Source {
        name: "hyp",
        bytes: hyp,
    }];
    let refs_two = [
        Source {
            name: "ref1",
            bytes: ref1,
        },
        Source {
            name: "ref2",
            bytes: ref2,
        },
    ];
    let refs: &[Source] = if two_ref_files {
        &refs_two
    } else {
        &refs_two[..1]
    };
    let input = if use_stdin {
        HypInput::Stdin(hyp)
    } else {
        HypInput::Files(&hyp_files)
    };
    let corpus = match read_corpus(refs, input, num_refs) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.to_string();
            if let InputError::LineCount {
                hyp_lines,
                ref_lines,
                ..
            } = e
            {
                assert_ne!(hyp_lines, ref_lines);
            }
            return;
        }
    };
    let n = corpus.refs.first().map_or(0, Vec::len);
    assert!(n > 0);
    for (_, lines) in &corpus.systems {
        assert_eq!(lines.len(), n);
    }
    let counting = Counting(TextStatsConfig {
        tokenizer: tok,
        lowercase,
        max_order,
    });
    let cfg = BleuConfig {
        max_order,
        weights: None,
        smoothing,
        effective_order: opts & 1 != 0,
    };

    let mut per_system = Vec::new();
    for s in 0..corpus.systems.len() {
        let sum = counting.stats_sum(&corpus, s).expect("valid max_order");
        let segs = counting.segment_stats(&corpus, s).expect("valid max_order");
        let seg_sum: BleuCounts = segs.iter().sum();
        assert_eq!(sum, seg_sum);

        // The same statistics from the tokens as strings.
        let hyps: Vec<Vec<String>> = corpus.systems[s]
            .1
            .iter()
            .map(|l| tokenize(l, tok, lowercase))
            .collect();
        let refs: Vec<Vec<Vec<String>>> = (0..n)
            .map(|i| {
                corpus
                    .refs
                    .iter()
                    .map(|r| tokenize(r[i], tok, lowercase))
                    .collect()
            })
            .collect();
        let strings: BleuCounts = corpus_stats(&hyps, &refs, max_order)
            .expect("valid corpus")
            .iter()
            .sum();
        assert_eq!(sum, strings, "interned ids and strings disagree");

        let score = score_from_stats(&sum, &cfg).expect("valid config");
        assert!(score.score.is_finite() && (0.0..=100.00000000000006).contains(&score.score));
        per_system.push(segs);
    }

    // Bootstrap on small corpora (a few resamples).
    if n <= 64 {
        let c = bootstrap_confidence(&per_system[0], &cfg, &BootstrapConfig { n_samples: 5, seed: 12345 }).expect("bootstrap");
        assert!(c.lower <= c.upper && c.ci >= 0.0 && c.mean.is_finite());
        if per_system.len() > 1 {
            let others: Vec<&[BleuCounts]> = per_system[1..].iter().map(Vec::as_slice).collect();
            let (_, results) =
                paired_bootstrap_many(&per_system[0], &others, &cfg, &BootstrapConfig { n_samples: 5, seed: 1 }).expect("paired");
            for r in results {
                assert!(r.p_value > 0.0 && r.p_value <= 1.0);
            }
        }
    }
});
