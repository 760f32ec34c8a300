//! chrF's statistics of one segment: the character and word n-grams of a line (sacrebleu's
//! whitespace removal and punctuation splitting), interned into segment-local ids, and their
//! clipped matches against the best of the segment's references ([`ChrfCounter`]).

use rustc_hash::FxHashMap;

use super::config::{ChrfConfig, ChrfCounts};
use super::score::f_score;
use crate::exact::tokenize::{is_python_whitespace, python_lower_into};
use crate::ngram::{IdTable, InternedMatcher};

/// ASCII's punctuation (Python's `string.punctuation`), sacrebleu's `CHRF._PUNCTS`.
fn is_punct(b: u8) -> bool {
    b.is_ascii_punctuation()
}

/// One pass over a line: calls `on_char(c)` for every character that enters the character
/// n-grams (all of them with `keep_whitespace`, else those that are not Python whitespace),
/// and, with `words`, appends the byte ranges of sacrebleu's `_remove_punctuation(line)`: the
/// words of `line.split()`, with one ASCII punctuation character split off the end, else off
/// the start, of words of two or more code points. ASCII is handled byte by byte.
fn scan(
    text: &str,
    keep_whitespace: bool,
    mut words: Option<&mut Vec<(u32, u32)>>,
    mut on_char: impl FnMut(char),
) {
    let bytes = text.as_bytes();
    // The current word: its start and its number of code points.
    let mut word: Option<(usize, usize)> = None;
    let close = |start: usize, chars: usize, end: usize, out: &mut Vec<(u32, u32)>| {
        let (s, e) = (start as u32, end as u32);
        if chars == 1 {
            out.push((s, e));
        } else if is_punct(bytes[end - 1]) {
            out.extend_from_slice(&[(s, e - 1), (e - 1, e)]);
        } else if is_punct(bytes[start]) {
            out.extend_from_slice(&[(s, s + 1), (s + 1, e)]);
        } else {
            out.push((s, e));
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (c, len) = if b < 0x80 {
            (b as char, 1)
        } else {
            let c = text[i..].chars().next().unwrap_or('\u{fffd}');
            (c, c.len_utf8())
        };
        let space = is_python_whitespace(c);
        if !space || keep_whitespace {
            on_char(c);
        }
        if let Some(out) = words.as_deref_mut() {
            match (space, word) {
                (true, Some((start, chars))) => {
                    close(start, chars, i, out);
                    word = None;
                }
                (false, Some((start, chars))) => word = Some((start, chars + 1)),
                (false, None) => word = Some((i, 1)),
                (true, None) => {}
            }
        }
        i += len;
    }
    if let (Some(out), Some((start, chars))) = (words, word) {
        close(start, chars, bytes.len(), out);
    }
}

/// Segment-local character ids: ASCII in a direct array, the rest in a hashed table.
struct CharIds {
    ascii: [u32; 128],
    other: IdTable,
    vocab: u32,
}

impl CharIds {
    fn new() -> Self {
        Self {
            ascii: [0; 128],
            other: IdTable::default(),
            vocab: 0,
        }
    }

    /// Forgets every id; room for a line of `bytes` bytes.
    fn reset(&mut self, bytes: usize) {
        self.ascii = [0; 128];
        self.other.reset(bytes);
        self.vocab = 0;
    }

    /// The id of `c`, a new one (`vocab + 1`) if it has none.
    #[inline]
    fn intern(&mut self, c: char) -> u32 {
        let vocab = &mut self.vocab;
        if (c as u32) < 128 {
            let slot = &mut self.ascii[c as usize];
            if *slot == 0 {
                *vocab += 1;
                *slot = *vocab;
            }
            *slot
        } else {
            self.other.get_or_insert(u64::from(c), || {
                *vocab += 1;
                *vocab
            })
        }
    }

    /// The id of `c`, 0 if it has none.
    #[inline]
    fn get(&self, c: char) -> u32 {
        if (c as u32) < 128 {
            self.ascii[c as usize]
        } else {
            self.other.get(u64::from(c))
        }
    }
}

/// Counts chrF statistics segment by segment, reusing its buffers and tables.
pub(crate) struct ChrfCounter {
    cfg: ChrfConfig,
    factor: f64,
    hyp_text: String,
    ref_text: String,
    char_ids: CharIds,
    hyp_chars: Vec<u32>,
    ref_chars: Vec<u32>,
    hyp_spans: Vec<(u32, u32)>,
    ref_spans: Vec<(u32, u32)>,
    hyp_words: Vec<u32>,
    ref_words: Vec<u32>,
    matcher: InternedMatcher,
    matches: Vec<u64>,
    current: ChrfCounts,
    best: ChrfCounts,
}

impl ChrfCounter {
    /// A counter for a validated `cfg`.
    pub(crate) fn new(cfg: &ChrfConfig) -> Self {
        let orders = cfg.orders();
        Self {
            cfg: *cfg,
            factor: cfg.beta * cfg.beta,
            hyp_text: String::new(),
            ref_text: String::new(),
            char_ids: CharIds::new(),
            hyp_chars: Vec::new(),
            ref_chars: Vec::new(),
            hyp_spans: Vec::new(),
            ref_spans: Vec::new(),
            hyp_words: Vec::new(),
            ref_words: Vec::new(),
            matcher: InternedMatcher::new(),
            matches: vec![0; orders],
            current: ChrfCounts::zeros(orders),
            best: ChrfCounts::zeros(orders),
        }
    }

    /// Adds the statistics of `hyp` against its best reference among `refs` to `out` (which
    /// holds `cfg.orders()` orders). A segment without a reference adds nothing (the public
    /// functions reject it first).
    pub(crate) fn add_segment<'r>(
        &mut self,
        hyp: &str,
        refs: impl IntoIterator<Item = &'r str>,
        out: &mut ChrfCounts,
    ) {
        let Self {
            cfg,
            factor,
            hyp_text,
            ref_text,
            char_ids,
            hyp_chars,
            ref_chars,
            hyp_spans,
            ref_spans,
            hyp_words,
            ref_words,
            matcher,
            matches,
            current,
            best,
        } = self;
        let (char_order, word_order) = (cfg.char_order, cfg.word_order);
        let hyp: &str = if cfg.lowercase {
            hyp_text.clear();
            python_lower_into(hyp, hyp_text);
            hyp_text
        } else {
            hyp
        };
        // Characters (segment-local ids 1..=char_vocab) and words, in one pass.
        char_ids.reset(hyp.len());
        hyp_chars.clear();
        hyp_spans.clear();
        scan(
            hyp,
            cfg.whitespace,
            (word_order > 0).then_some(&mut *hyp_spans),
            |c| {
                if char_order > 0 {
                    hyp_chars.push(char_ids.intern(c));
                }
            },
        );
        let char_vocab = char_ids.vocab;
        // Words: segment-local ids 1..=word_vocab.
        let mut word_ids: FxHashMap<&str, u32> = FxHashMap::default();
        hyp_words.clear();
        if word_order > 0 {
            word_ids.reserve(hyp_spans.len());
            for &(s, e) in hyp_spans.iter() {
                let next = word_ids.len() as u32 + 1;
                let id = *word_ids.entry(&hyp[s as usize..e as usize]).or_insert(next);
                hyp_words.push(id);
            }
        }
        let word_vocab = word_ids.len() as u32;
        let mut best_score = -1.0f64;
        let mut any = false;
        for reference in refs {
            let reference: &str = if cfg.lowercase {
                ref_text.clear();
                python_lower_into(reference, ref_text);
                ref_text
            } else {
                reference
            };
            matches.fill(0);
            ref_chars.clear();
            ref_spans.clear();
            scan(
                reference,
                cfg.whitespace,
                (word_order > 0).then_some(&mut *ref_spans),
                |c| {
                    if char_order > 0 {
                        ref_chars.push(char_ids.get(c));
                    }
                },
            );
            let ref_char_len = ref_chars.len();
            if char_order > 0 {
                matcher.add_clipped_matches(
                    hyp_chars,
                    std::slice::from_ref(ref_chars),
                    char_vocab,
                    char_order,
                    &mut matches[..char_order],
                );
            }
            let mut ref_word_len = 0usize;
            if word_order > 0 {
                ref_words.clear();
                ref_words.extend(ref_spans.iter().map(|&(s, e)| {
                    word_ids
                        .get(&reference[s as usize..e as usize])
                        .copied()
                        .unwrap_or(0)
                }));
                ref_word_len = ref_words.len();
                matcher.add_clipped_matches(
                    hyp_words,
                    std::slice::from_ref(ref_words),
                    word_vocab,
                    word_order,
                    &mut matches[char_order..],
                );
            }
            let lengths = (0..char_order)
                .map(|i| (hyp_chars.len(), ref_char_len, i))
                .chain((0..word_order).map(|i| (hyp_words.len(), ref_word_len, i)));
            for (k, (h, r, i)) in lengths.enumerate() {
                let hyp_n = h.saturating_sub(i) as u64;
                let ref_n = r.saturating_sub(i) as u64;
                current.hyp_ngrams[k] = if ref_n > 0 { hyp_n } else { 0 };
                current.ref_ngrams[k] = ref_n;
                current.matches[k] = matches[k];
            }
            let score = f_score(
                &current.hyp_ngrams,
                &current.ref_ngrams,
                &current.matches,
                *factor,
                cfg.eps_smoothing,
            );
            if score > best_score {
                best_score = score;
                std::mem::swap(best, current);
            }
            any = true;
        }
        if any {
            *out += &*best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        let mut spans = Vec::new();
        scan(text, false, Some(&mut spans), |_| {});
        spans
            .iter()
            .map(|&(s, e)| &text[s as usize..e as usize])
            .collect()
    }

    #[test]
    fn punctuation_splitting_follows_sacrebleu() {
        // sacrebleu's CHRF()._remove_punctuation on the same strings.
        assert_eq!(
            words("(hi) \"ok\" a , x. .y ..  é! ¡no"),
            ["(hi", ")", "\"ok", "\"", "a", ",", "x", ".", ".", "y", ".", ".", "é", "!", "¡no"]
        );
        assert_eq!(words("  "), Vec::<&str>::new());
    }

    #[test]
    fn counter_keeps_the_best_reference_and_zeroes_orders_it_lacks() {
        let cfg = ChrfConfig::default();
        let mut counter = ChrfCounter::new(&cfg);
        let mut a = ChrfCounts::zeros(6);
        counter.add_segment("abc", ["xyz", "abc", "abc"], &mut a);
        assert_eq!(a.matches, [3, 2, 1, 0, 0, 0]);
        assert_eq!(a.hyp_ngrams, [3, 2, 1, 0, 0, 0]);
        // A reference shorter than an order zeroes the hypothesis count of that order.
        let mut b = ChrfCounts::zeros(6);
        counter.add_segment("abcd", ["ab"], &mut b);
        assert_eq!(b.hyp_ngrams, [4, 3, 0, 0, 0, 0]);
        assert_eq!(b.ref_ngrams, [2, 1, 0, 0, 0, 0]);
    }
}
