//! The counting side of the `candle-bleu` binary: every segment's statistics counted by the
//! library's [`TextStatsCounter`] (sacrebleu's BLEU tokenization, no allocation per token),
//! segment by segment, one counter per chunk of segments on rayon's pool.
//!
//! Part of the binary; the fuzz target `fuzz/fuzz_targets/cli_input.rs` includes this file
//! with `#[path]` and checks it against `exact::corpus_stats` on `String` tokens.

use candle_bleu::exact::{BleuCounts, MetricError, TextStatsConfig, TextStatsCounter};
use rayon::prelude::*;

use crate::input::Corpus;

/// Segments of at least this many lines are counted on rayon's pool.
const PARALLEL_MIN_SEGMENTS: usize = 512;

/// How to tokenize and count a corpus.
#[derive(Debug, Clone, Copy)]
pub struct Counting(pub TextStatsConfig);

impl Counting {
    /// Segment ranges for the threads: everything at once below [`PARALLEL_MIN_SEGMENTS`],
    /// else about four chunks per thread (of at least 128 segments) so that a slow chunk does
    /// not hold up the others.
    fn chunks(n: usize) -> Vec<std::ops::Range<usize>> {
        let threads = rayon::current_num_threads();
        let size = if n < PARALLEL_MIN_SEGMENTS || threads < 2 {
            n.max(1)
        } else {
            n.div_ceil(4 * threads).max(128)
        };
        (0..n.div_ceil(size))
            .map(|c| c * size..((c + 1) * size).min(n))
            .collect()
    }

    /// Per-segment statistics of system `system` (sacrebleu's segment statistics: what the
    /// bootstrap resamples and `--sentence-level` scores).
    pub fn segment_stats(
        &self,
        corpus: &Corpus<'_>,
        system: usize,
    ) -> Result<Vec<BleuCounts>, MetricError> {
        let hyps = &corpus.systems[system].1;
        let chunks: Vec<Vec<BleuCounts>> = Self::chunks(hyps.len())
            .into_par_iter()
            .map(|range| {
                let mut counter = TextStatsCounter::new(self.0)?;
                Ok(range
                    .map(|i| {
                        let mut stats = BleuCounts::zeros(self.0.max_order);
                        counter.add_segment(hyps[i], corpus.refs.iter().map(|r| r[i]), &mut stats);
                        stats
                    })
                    .collect())
            })
            .collect::<Result<_, MetricError>>()?;
        Ok(chunks.into_iter().flatten().collect())
    }

    /// Summed statistics of system `system` (what its corpus score is computed from).
    pub fn stats_sum(&self, corpus: &Corpus<'_>, system: usize) -> Result<BleuCounts, MetricError> {
        let hyps = &corpus.systems[system].1;
        let sums: Vec<BleuCounts> = Self::chunks(hyps.len())
            .into_par_iter()
            .map(|range| {
                let mut counter = TextStatsCounter::new(self.0)?;
                let mut sum = BleuCounts::zeros(self.0.max_order);
                for i in range {
                    counter.add_segment(hyps[i], corpus.refs.iter().map(|r| r[i]), &mut sum);
                }
                Ok(sum)
            })
            .collect::<Result<_, MetricError>>()?;
        Ok(sums.into_iter().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{read_corpus, HypInput, Source};
    use candle_bleu::exact::corpus_stats;
    use candle_bleu::exact::tokenize::{tokenize, Tokenizer};

    /// Large enough for the parallel path; 13a with entities, lowercase, three references with
    /// tokens of their own, empty lines.
    #[test]
    fn counts_equal_the_string_statistics() {
        let line = |i: usize, salt: usize| -> String {
            if (i + salt).is_multiple_of(97) {
                return String::new();
            }
            (0..3 + (i * 7 + salt) % 23)
                .map(|k| match (i + k * salt + k) % 11 {
                    0 => "The".to_owned(),
                    1 => "&amp;".to_owned(),
                    2 => format!("w{}", (i + k) % 13),
                    3 => format!("x{},", (i * k) % 5),
                    4 => "ΣΑΣ".to_owned(),
                    _ => format!("v{}", (k + salt) % 9),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        // A reference: the hypothesis with every fifth-or-so word replaced from another line.
        let reference = |i: usize, salt: usize| -> String {
            let other = line(i + 1, salt);
            let other: Vec<&str> = other.split(' ').collect();
            line(i, 1)
                .split(' ')
                .enumerate()
                .map(|(k, w)| {
                    if (k * salt + i).is_multiple_of(5) {
                        other[k % other.len()]
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let n = 1500;
        let text = |salt: usize| -> String {
            (0..n)
                .map(|i| if salt == 1 { line(i, 1) } else { reference(i, salt) } + "\n")
                .collect()
        };
        let (hyp, r1, r2, r3) = (text(1), text(2), text(3), text(4));
        let refs = [
            Source {
                name: "r1",
                bytes: r1.as_bytes(),
            },
            Source {
                name: "r2",
                bytes: r2.as_bytes(),
            },
            Source {
                name: "r3",
                bytes: r3.as_bytes(),
            },
        ];
        let hyps = [Source {
            name: "h",
            bytes: hyp.as_bytes(),
        }];
        let corpus = read_corpus(&refs, HypInput::Files(&hyps), 1).unwrap();
        for (tok, lowercase) in [
            (Tokenizer::V13a, false),
            (Tokenizer::None, true),
            (Tokenizer::Intl, false),
        ] {
            let counting = Counting(TextStatsConfig {
                tokenizer: tok,
                lowercase,
                max_order: 4,
            });
            let sum = counting.stats_sum(&corpus, 0).unwrap();
            let segments = counting.segment_stats(&corpus, 0).unwrap();
            assert_eq!(segments.len(), n);
            assert_eq!(segments.iter().sum::<BleuCounts>(), sum);
            let words = |l: &str| tokenize(l, tok, lowercase);
            let hyps: Vec<Vec<String>> = corpus.systems[0].1.iter().map(|l| words(l)).collect();
            let refs: Vec<Vec<Vec<String>>> = (0..n)
                .map(|i| corpus.refs.iter().map(|r| words(r[i])).collect())
                .collect();
            let strings: BleuCounts = corpus_stats(&hyps, &refs, 4).unwrap().iter().sum();
            assert_eq!(sum, strings, "{tok:?}");
            assert!(
                sum.matches[3] > 0 && sum.matches[0] < sum.totals[0],
                "{sum:?}"
            );
        }
    }
}
