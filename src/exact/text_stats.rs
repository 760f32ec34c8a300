//! BLEU statistics of lines of text, tokenized as sacrebleu's BLEU tokenizes them, with no
//! allocation per token: what the `candle-bleu` command line counts a corpus with.
//!
//! Each segment is handled in one pass with reused buffers: the hypothesis tokens are interned
//! into segment-local ids as the tokenizer yields them (each token hashed once, its bytes
//! copied into a reused arena), the reference tokens are looked up among them (0: a token the
//! hypothesis does not hold, which can match nothing), and the ids go to the crate's n-gram
//! counter. No corpus-wide vocabulary is built, so counters on different threads share
//! nothing and only the statistics are summed.

use crate::ngram::{InternedMatcher, Probe, Slots};

use super::config::{check_max_order, BleuCounts, MetricError};
use super::stats::{add_lengths, grow_orders};
use super::tokenize::{TokenizeBuffer, Tokenizer};

/// How [`TextStatsCounter`] turns lines into BLEU statistics: sacrebleu's BLEU options
/// `tokenize`, `lowercase` and `max_ngram_order`. The default is sacrebleu's: `13a`, case
/// kept, 4-grams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextStatsConfig {
    /// The tokenizer (`--tokenize`).
    pub tokenizer: Tokenizer,
    /// Python's `str.lower()` before tokenizing (`--lowercase`).
    pub lowercase: bool,
    /// The largest n-gram order, in `1..=`[`MAX_ORDER`](super::MAX_ORDER)
    /// (`--max-ngram-order`).
    pub max_order: usize,
}

impl Default for TextStatsConfig {
    fn default() -> Self {
        Self {
            tokenizer: Tokenizer::V13a,
            lowercase: false,
            max_order: 4,
        }
    }
}

/// Counts the BLEU statistics of segments given as lines of text, tokenized as sacrebleu's
/// BLEU does ([`TokenizeBuffer::tokenize`]: `lowercase`, then the tokenizer on the
/// `rstrip()`ped line, then `str.split()`). The numbers are those of
/// [`segment_stats`](super::segment_stats) on the tokens as strings; the counter allocates
/// nothing per token, and its buffers are reused from segment to segment (one counter per
/// thread).
///
/// ```
/// use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
/// use candle_bleu::exact::{segment_stats, BleuCounts, TextStatsConfig, TextStatsCounter};
/// let cfg = TextStatsConfig { max_order: 2, ..TextStatsConfig::default() };
/// let mut counter = TextStatsCounter::new(cfg)?;
/// let mut stats = BleuCounts::zeros(2);
/// counter.add_segment("The cat sat.", ["The cat.", "A cat sat."], &mut stats);
/// let tok = |line: &str| tokenize(line, Tokenizer::V13a, false);
/// let words = segment_stats(&tok("The cat sat."), &[tok("The cat."), tok("A cat sat.")], 2)?;
/// assert_eq!(stats, words);
/// assert_eq!(stats.matches, [4, 3]);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub struct TextStatsCounter {
    cfg: TextStatsConfig,
    buf: TokenizeBuffer,
    vocab: LineVocab,
    hyp_ids: Vec<u32>,
    ref_ids: Vec<Vec<u32>>,
    matcher: InternedMatcher,
}

impl TextStatsCounter {
    /// A counter of segments under `cfg`.
    ///
    /// Errors: `cfg.max_order` outside `1..=`[`MAX_ORDER`](super::MAX_ORDER).
    pub fn new(cfg: TextStatsConfig) -> Result<Self, MetricError> {
        check_max_order("cfg.max_order", cfg.max_order)?;
        Ok(Self {
            cfg,
            buf: TokenizeBuffer::default(),
            vocab: LineVocab::default(),
            hyp_ids: Vec::new(),
            ref_ids: Vec::new(),
            matcher: InternedMatcher::new(),
        })
    }

    /// The counter's configuration.
    pub fn config(&self) -> &TextStatsConfig {
        &self.cfg
    }

    /// Adds the statistics of the segment `hyp` against `refs` (one line per reference) to
    /// `stats`, which is grown to `cfg.max_order` orders if it holds fewer: clipped matches,
    /// totals, the hypothesis length and the closest reference length (see
    /// [`segment_stats`](super::segment_stats)). A segment without a reference adds its
    /// totals and length, reference length 0 and no match.
    pub fn add_segment<'r>(
        &mut self,
        hyp: &str,
        refs: impl IntoIterator<Item = &'r str>,
        stats: &mut BleuCounts,
    ) {
        let TextStatsConfig {
            tokenizer,
            lowercase,
            max_order,
        } = self.cfg;
        self.vocab.reset(hyp.len() / 4 + 8);
        self.hyp_ids.clear();
        for token in self.buf.tokenize(hyp, tokenizer, lowercase) {
            self.hyp_ids.push(self.vocab.intern(token));
        }
        let mut n_refs = 0;
        for line in refs {
            if n_refs == self.ref_ids.len() {
                self.ref_ids.push(Vec::new());
            }
            let ids = &mut self.ref_ids[n_refs];
            ids.clear();
            ids.extend(
                self.buf
                    .tokenize(line, tokenizer, lowercase)
                    .map(|token| self.vocab.get(token)),
            );
            n_refs += 1;
        }
        let refs = &self.ref_ids[..n_refs];
        grow_orders(stats, max_order);
        // The ids are made above: hypothesis ids 1..=vocab, reference ids 0..=vocab.
        self.matcher.add_clipped_matches(
            &self.hyp_ids,
            refs,
            self.vocab.len() as u32,
            max_order,
            &mut stats.matches,
        );
        add_lengths(
            stats,
            max_order,
            self.hyp_ids.len(),
            refs.iter().map(Vec::len),
        );
    }
}

/// The hypothesis tokens of one line, interned into ids `1..=len()`: the crate's open
/// addressing ([`Slots`]) keyed by a hash of the token's bytes, and the token bytes in one
/// reused arena. Equal ids iff equal strings (hashes are compared first, then the bytes).
#[derive(Default)]
struct LineVocab {
    slots: Slots,
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
        self.slots.reset(tokens, 64);
    }

    /// Number of distinct tokens.
    fn len(&self) -> usize {
        self.tokens.len()
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
        match self
            .slots
            .probe(hash_bytes(bytes), |id, _| bytes_eq(self.token(id), bytes))
        {
            Probe::Found(id) => id,
            Probe::Vacant(_) => 0,
        }
    }

    /// The id of `token`, adding it if it is new.
    #[inline]
    fn intern(&mut self, token: &str) -> u32 {
        let bytes = token.as_bytes();
        let hash = hash_bytes(bytes);
        let slot = match self
            .slots
            .probe(hash, |id, _| bytes_eq(self.token(id), bytes))
        {
            Probe::Found(id) => return id,
            Probe::Vacant(slot) => slot,
        };
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        self.tokens.push((start, self.arena.len() as u32, hash));
        let id = self.tokens.len() as u32;
        self.slots.fill(slot, hash, id);
        if 2 * self.tokens.len() > self.slots.capacity() {
            // A line longer than any before: double the table.
            let entries = self.tokens.iter().zip(1..).map(|(&(_, _, h), id)| (h, id));
            self.slots.rebuild(2 * self.slots.capacity(), entries);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::tokenize::tokenize;
    use crate::exact::{corpus_stats, MAX_ORDER};

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

    /// Every tokenizer, lowercase or not, several references (a varying number of them), empty
    /// lines: the statistics of the tokens as strings.
    #[test]
    fn counts_equal_the_string_statistics() {
        let lines = [
            "The cat sat on the mat.",
            "the CAT sat &amp; sat",
            "",
            "ΣΑΣ σας Σ. İstanbul",
            "a b a b a b",
            "  trailing\u{3000}",
            "猫が座った。 a 1,000.5",
        ];
        for tokenizer in Tokenizer::ALL {
            for lowercase in [false, true] {
                let cfg = TextStatsConfig {
                    tokenizer,
                    lowercase,
                    max_order: 4,
                };
                let mut counter = TextStatsCounter::new(cfg).unwrap();
                let tok = |l: &str| tokenize(l, tokenizer, lowercase);
                let mut hyps = Vec::new();
                let mut refs = Vec::new();
                let mut per_segment = Vec::new();
                for (i, hyp) in lines.iter().enumerate() {
                    let these: Vec<&str> = (0..1 + i % 3).map(|k| lines[(i + k + 1) % 7]).collect();
                    let mut stats = BleuCounts::default();
                    counter.add_segment(hyp, these.iter().copied(), &mut stats);
                    per_segment.push(stats);
                    hyps.push(tok(hyp));
                    refs.push(these.iter().map(|l| tok(l)).collect::<Vec<_>>());
                }
                let want = corpus_stats(&hyps, &refs, 4).unwrap();
                assert_eq!(per_segment, want, "{tokenizer:?} lowercase {lowercase}");
            }
        }
    }

    #[test]
    fn max_order_is_checked() {
        for max_order in [0, MAX_ORDER + 1] {
            let cfg = TextStatsConfig {
                max_order,
                ..TextStatsConfig::default()
            };
            match TextStatsCounter::new(cfg) {
                Err(MetricError::InvalidArgument { argument, message }) => {
                    assert_eq!(argument, "cfg.max_order");
                    assert!(message.contains(&max_order.to_string()), "{message}");
                }
                other => panic!("max_order {max_order}: {:?}", other.map(|_| ())),
            }
        }
    }
}
