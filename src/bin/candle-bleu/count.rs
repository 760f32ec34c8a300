//! The counting side of the `candle-bleu` binary: every segment's hypothesis and references
//! tokenized as sacrebleu's BLEU does (`lowercase`, then the tokenizer on the `rstrip()`ped
//! line, then `str.split()`), and its statistics counted, segment by segment, on rayon's pool.
//!
//! Each segment is handled in one pass with reused buffers and no allocation per token: the
//! hypothesis tokens are interned into segment-local ids as the tokenizer yields them (each
//! token hashed once, its bytes copied into a reused arena), the reference tokens are looked
//! up among them (0: a token the hypothesis does not hold, which can match nothing), and the
//! ids go to the library's [`InternedStatsCounter`]. No corpus-wide vocabulary is built, so
//! threads share nothing and nothing is merged but the statistics.
//!
//! Part of the binary; the fuzz target `fuzz/fuzz_targets/cli_input.rs` includes this file
//! with `#[path]` and checks it against `exact::corpus_stats` on `String` tokens.

use candle_bleu::exact::cli_support::InternedStatsCounter;
use candle_bleu::exact::tokenize::{TokenizeBuffer, Tokenizer};
use candle_bleu::exact::{BleuCounts, MetricError};
use rayon::prelude::*;

use crate::input::Corpus;

/// The hypothesis tokens of one line, interned into ids `1..=len()`: an open-addressing table
/// of `(hash, id)` with linear probing, cleared in O(1) by a generation stamp, and the token
/// bytes in one reused arena. Equal ids iff equal strings (hashes are compared first, then the
/// bytes).
#[derive(Default)]
struct LineVocab {
    /// `(hash, id, stamp)`; a slot is occupied when its stamp is `stamp`.
    slots: Vec<(u64, u32, u32)>,
    stamp: u32,
    /// `64 - log2(slots.len())`: a hash's slot is its top bits after a multiply.
    shift: u32,
    /// Per id - 1: the token's byte range in `arena`, and its hash (to grow the table).
    tokens: Vec<(u32, u32, u64)>,
    arena: Vec<u8>,
}

/// The bytes of a token of at most 16 bytes as two words that hold all of them (overlapping
/// loads, no copy): with the length, equal words iff equal bytes. Longer tokens: their first
/// and last 8 bytes.
#[inline]
fn words(bytes: &[u8]) -> (u64, u64) {
    let n = bytes.len();
    let u32_at = |i: usize| {
        u64::from(u32::from_le_bytes([
            bytes[i],
            bytes[i + 1],
            bytes[i + 2],
            bytes[i + 3],
        ]))
    };
    let u64_at = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(w)
    };
    match n {
        0 => (0, 0),
        1..=3 => (
            u64::from(bytes[0]) | u64::from(bytes[n / 2]) << 8 | u64::from(bytes[n - 1]) << 16,
            0,
        ),
        4..=7 => (u32_at(0) | u32_at(n - 4) << 32, 0),
        _ => (u64_at(0), u64_at(n - 8)),
    }
}

/// A 64-bit hash of a token's bytes: FxHash's rotate-xor-multiply over its length, its
/// [`words`] and (past 16 bytes) its middle, then a final mix so that the top bits (the slot)
/// depend on every byte.
#[inline]
fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let step = |h: u64, word: u64| (h.rotate_left(26) ^ word).wrapping_mul(K);
    let (a, b) = words(bytes);
    let mut h = step(step(bytes.len() as u64, a), b);
    if bytes.len() > 16 {
        for chunk in bytes[8..bytes.len() - 8].chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = step(h, u64::from_le_bytes(w));
        }
    }
    h ^ (h >> 29)
}

/// `a == b` without a call to `memcmp` for tokens of at most 16 bytes (nearly all).
#[inline]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && if a.len() <= 16 {
            words(a) == words(b)
        } else {
            a == b
        }
}

impl LineVocab {
    /// Empties the vocabulary, with room for `tokens` tokens at load factor <= 1/2.
    fn reset(&mut self, tokens: usize) {
        self.tokens.clear();
        self.arena.clear();
        let capacity = (2 * tokens).next_power_of_two().max(64);
        if capacity > self.slots.len() {
            self.slots = vec![(0, 0, 0); capacity];
            self.shift = 64 - capacity.trailing_zeros();
            self.stamp = 0;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.fill((0, 0, 0));
            self.stamp = 1;
        }
    }

    /// Number of distinct tokens.
    fn len(&self) -> usize {
        self.tokens.len()
    }

    #[inline]
    fn slot(&self, hash: u64) -> usize {
        (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn token(&self, id: u32) -> &[u8] {
        let (start, end, _) = self.tokens[id as usize - 1];
        &self.arena[start as usize..end as usize]
    }

    /// The id of `token`, 0 if it is not in the vocabulary.
    #[inline]
    fn get(&self, token: &str) -> u32 {
        let bytes = token.as_bytes();
        let hash = hash_bytes(bytes);
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(hash);
        loop {
            let (h, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                return 0;
            }
            if h == hash && bytes_eq(self.token(id), bytes) {
                return id;
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The id of `token`, adding it if it is new.
    #[inline]
    fn intern(&mut self, token: &str) -> u32 {
        let bytes = token.as_bytes();
        let hash = hash_bytes(bytes);
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(hash);
        loop {
            let (h, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                break;
            }
            if h == hash && bytes_eq(self.token(id), bytes) {
                return id;
            }
            slot = (slot + 1) & mask;
        }
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        self.tokens.push((start, self.arena.len() as u32, hash));
        let id = self.tokens.len() as u32;
        self.slots[slot] = (hash, id, self.stamp);
        if 2 * self.tokens.len() > self.slots.len() {
            self.grow();
        }
        id
    }

    /// Doubles the table and re-inserts every token (a line longer than any before).
    fn grow(&mut self) {
        let capacity = 2 * self.slots.len();
        self.slots = vec![(0, 0, 0); capacity];
        self.shift = 64 - capacity.trailing_zeros();
        self.stamp = 1;
        let mask = capacity - 1;
        for (k, &(_, _, hash)) in self.tokens.iter().enumerate() {
            let mut slot = self.slot(hash);
            while self.slots[slot].2 == self.stamp {
                slot = (slot + 1) & mask;
            }
            self.slots[slot] = (hash, k as u32 + 1, self.stamp);
        }
    }
}

/// What one thread needs to count segments: tokenizer buffers, the line vocabulary, id buffers
/// and the library's counter, all reused from segment to segment.
struct SegmentCounter {
    tok: Tokenizer,
    lowercase: bool,
    buf: TokenizeBuffer,
    vocab: LineVocab,
    hyp_ids: Vec<u32>,
    ref_ids: Vec<Vec<u32>>,
    counter: InternedStatsCounter,
}

impl SegmentCounter {
    fn new(
        tok: Tokenizer,
        lowercase: bool,
        max_order: usize,
        refs: usize,
    ) -> Result<Self, MetricError> {
        Ok(Self {
            tok,
            lowercase,
            buf: TokenizeBuffer::default(),
            vocab: LineVocab::default(),
            hyp_ids: Vec::new(),
            ref_ids: vec![Vec::new(); refs],
            counter: InternedStatsCounter::new(max_order)?,
        })
    }

    /// Adds the statistics of `hyp` against `refs` (one line per reference stream) to `stats`.
    fn add_segment<'r>(
        &mut self,
        hyp: &str,
        refs: impl Iterator<Item = &'r str>,
        stats: &mut BleuCounts,
    ) -> Result<(), MetricError> {
        self.vocab.reset(hyp.len() / 4 + 8);
        self.hyp_ids.clear();
        for token in self.buf.tokenize(hyp, self.tok, self.lowercase) {
            self.hyp_ids.push(self.vocab.intern(token));
        }
        for (ids, line) in self.ref_ids.iter_mut().zip(refs) {
            ids.clear();
            ids.extend(
                self.buf
                    .tokenize(line, self.tok, self.lowercase)
                    .map(|token| self.vocab.get(token)),
            );
        }
        self.counter
            .add_segment(&self.hyp_ids, &self.ref_ids, self.vocab.len() as u32, stats)
    }
}

/// Segments of at least this many lines are counted on rayon's pool.
const PARALLEL_MIN_SEGMENTS: usize = 512;

/// How to tokenize and count a corpus.
#[derive(Debug, Clone, Copy)]
pub struct Counting {
    pub tok: Tokenizer,
    pub lowercase: bool,
    /// Largest n-gram order, in `1..=exact::MAX_ORDER`.
    pub max_order: usize,
}

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
                let mut counter = SegmentCounter::new(
                    self.tok,
                    self.lowercase,
                    self.max_order,
                    corpus.refs.len(),
                )?;
                range
                    .map(|i| {
                        let mut stats = BleuCounts::zeros(self.max_order);
                        counter.add_segment(
                            hyps[i],
                            corpus.refs.iter().map(|r| r[i]),
                            &mut stats,
                        )?;
                        Ok(stats)
                    })
                    .collect()
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
                let mut counter = SegmentCounter::new(
                    self.tok,
                    self.lowercase,
                    self.max_order,
                    corpus.refs.len(),
                )?;
                let mut sum = BleuCounts::zeros(self.max_order);
                for i in range {
                    counter.add_segment(hyps[i], corpus.refs.iter().map(|r| r[i]), &mut sum)?;
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
    use candle_bleu::exact::tokenize::tokenize;

    #[test]
    fn line_vocab_interns_exactly_and_grows() {
        let mut vocab = LineVocab::default();
        vocab.reset(1);
        // Tokens of every length up to 40 bytes, some sharing their first and last 8 bytes.
        let tokens: Vec<String> = (0..300)
            .map(|i| {
                let len = 1 + i % 40;
                let mut t: String = (0..len)
                    .map(|k| (b'a' + ((i / 40 + k) % 3) as u8) as char)
                    .collect();
                if len > 16 {
                    t.replace_range(8..9, &((i % 7) as u8 + b'0').to_string());
                }
                t
            })
            .collect();
        let ids: Vec<u32> = tokens.iter().map(|t| vocab.intern(t)).collect();
        for (t, &id) in tokens.iter().zip(&ids) {
            assert_eq!(vocab.get(t), id, "{t}");
            assert_eq!(vocab.token(id), t.as_bytes());
        }
        let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
        assert_eq!(vocab.len(), distinct.len());
        assert_eq!(vocab.get("zzz"), 0);
        assert_eq!(vocab.get(""), 0);
        vocab.reset(4);
        assert_eq!(vocab.get(&tokens[0]), 0, "reset forgets");
    }

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
            let counting = Counting {
                tok,
                lowercase,
                max_order: 4,
            };
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
