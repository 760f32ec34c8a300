//! TER's edit count of one hypothesis against one reference: sacrebleu 2.6.0's
//! `lib_ter.translation_edit_rate` (greedy block shifts, as tercom searches them, then the
//! beam edit distance), operation for operation, on interned words (`u32` ids).
//!
//! sacrebleu caches rows of the edit-distance matrix in a trie keyed by hypothesis prefixes.
//! A row depends only on the hypothesis prefix above it and on the hypothesis length (which a
//! shift does not change), so the cache changes the time, never a value; here the rows of the
//! current hypothesis are kept and a shifted candidate recomputes only the rows below its
//! common prefix with it.

/// sacrebleu's `_MAX_SHIFT_SIZE`: the longest block shifted.
const MAX_SHIFT_SIZE: usize = 10;
/// `_MAX_SHIFT_DIST`: the largest `|start_r - start_h|` of a shifted block.
const MAX_SHIFT_DIST: usize = 50;
/// `_BEAM_WIDTH`: cells computed on each side of the pseudo-diagonal.
const BEAM_WIDTH: i64 = 25;
/// `_MAX_SHIFT_CANDIDATES`: shifted hypotheses scored per hypothesis-reference pair, at most
/// (plus those of the pair of words being tried when the limit is reached).
const MAX_SHIFT_CANDIDATES: usize = 1000;
/// `_INT_INFINITY`: the cost of a cell outside the beam.
const INF: i64 = 10_000_000_000_000_000;

/// An edit operation of the matrix, in sacrebleu's naming (rewriting the reference into the
/// hypothesis: `Del` consumes a hypothesis word, `Ins` a reference word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `' '`: the words match.
    Nop,
    /// `'s'`: substitution.
    Sub,
    /// `'i'`: a reference word only.
    Ins,
    /// `'d'`: a hypothesis word only.
    Del,
    /// `'x'`: a cell outside the beam.
    Undef,
}

/// Reusable buffers for [`translation_edit_rate`]: the traced matrix of the current hypothesis,
/// rolling rows for candidates, the alignment, the words being shifted.
#[derive(Debug, Default)]
pub(crate) struct TerScratch {
    /// Costs of the current hypothesis' matrix, `(n_h + 1) × (n_r + 1)`, row-major.
    cost: Vec<i64>,
    /// Operations of the same matrix.
    ops: Vec<Op>,
    /// Two rolling rows for a candidate's cost.
    prev: Vec<i64>,
    next: Vec<i64>,
    /// The trace (operations from the end back to the start).
    trace: Vec<Op>,
    /// `align[r]`: the hypothesis position aligned with reference word `r` (-1 before the first).
    align: Vec<i64>,
    hyp_err: Vec<bool>,
    ref_err: Vec<bool>,
    /// The current hypothesis and a shifted candidate.
    words: Vec<u32>,
    shifted: Vec<u32>,
}

/// The beam parameters of a hypothesis of `n_h` words against `n_r` reference words
/// (`length_ratio`, `beam_width`), as sacrebleu's `_edit_distance` sets them.
fn beam(n_h: usize, n_r: usize) -> (f64, i64) {
    let ratio = if n_h > 0 {
        n_r as f64 / n_h as f64
    } else {
        1.0
    };
    let width = if (BEAM_WIDTH as f64) < ratio / 2.0 {
        (ratio / 2.0 + BEAM_WIDTH as f64).ceil() as i64
    } else {
        BEAM_WIDTH
    };
    (ratio, width)
}

/// The columns `[min_j, max_j)` computed in row `i` (1-based) of `n_h` rows.
#[inline]
fn window(i: usize, n_h: usize, n_r: usize, ratio: f64, width: i64) -> (usize, usize) {
    let diag = (i as f64 * ratio).floor() as i64;
    let min_j = (diag - width).max(0) as usize;
    let max_j = if i == n_h {
        n_r + 1
    } else {
        (diag + width).min(n_r as i64 + 1).max(0) as usize
    };
    (min_j, max_j)
}

impl TerScratch {
    /// Fills the traced matrix of `self.words` against `r` and returns its edit distance
    /// (sacrebleu's `BeamEditDistance.__call__` without the cache).
    fn traced_distance(&mut self, r: &[u32]) -> i64 {
        let n_h = self.words.len();
        let n_r = r.len();
        let w = n_r + 1;
        let (ratio, width) = beam(n_h, n_r);
        self.cost.clear();
        self.cost.resize((n_h + 1) * w, INF);
        self.ops.clear();
        self.ops.resize((n_h + 1) * w, Op::Undef);
        for j in 0..w {
            self.cost[j] = j as i64;
            self.ops[j] = Op::Ins;
        }
        for i in 1..=n_h {
            let (min_j, max_j) = window(i, n_h, n_r, ratio, width);
            let h = self.words[i - 1];
            let above = (i - 1) * w;
            for j in min_j..max_j {
                let at = i * w + j;
                if j == 0 {
                    self.cost[at] = self.cost[above] + 1;
                    self.ops[at] = Op::Del;
                    continue;
                }
                let (sub_cost, sub_op) = if h == r[j - 1] {
                    (0, Op::Nop)
                } else {
                    (1, Op::Sub)
                };
                // Tercom's preference: match/substitution, then (flipped) deletion, insertion;
                // a later operation must be strictly cheaper.
                let options = [
                    (self.cost[above + j - 1] + sub_cost, sub_op),
                    (self.cost[above + j] + 1, Op::Del),
                    (self.cost[at - 1] + 1, Op::Ins),
                ];
                for (c, op) in options {
                    if self.cost[at] > c {
                        self.cost[at] = c;
                        self.ops[at] = op;
                    }
                }
            }
        }
        // The trace, from (n_h, n_r) back to (0, 0).
        self.trace.clear();
        let (mut i, mut j) = (n_h, n_r);
        while i > 0 || j > 0 {
            let op = self.ops[i * w + j];
            self.trace.push(op);
            match op {
                Op::Nop | Op::Sub => {
                    i -= 1;
                    j -= 1;
                }
                Op::Ins => j -= 1,
                Op::Del => i -= 1,
                // sacrebleu raises here; the beam always leaves a path, so this is not reached.
                Op::Undef => break,
            }
        }
        self.cost[n_h * w + n_r]
    }

    /// sacrebleu's `trace_to_alignment(_flip_trace(trace))`: `align`, `ref_err`, `hyp_err`.
    fn alignment(&mut self, n_h: usize, n_r: usize) {
        self.align.clear();
        self.align.resize(n_r, -1);
        self.hyp_err.clear();
        self.ref_err.clear();
        let (mut pos_h, mut pos_r) = (-1i64, -1i64);
        for &op in self.trace.iter().rev() {
            match op {
                Op::Nop | Op::Sub => {
                    pos_h += 1;
                    pos_r += 1;
                    self.align[pos_r as usize] = pos_h;
                    let err = op == Op::Sub;
                    self.hyp_err.push(err);
                    self.ref_err.push(err);
                }
                // A hypothesis word only ('d', flipped to 'i').
                Op::Del => {
                    pos_h += 1;
                    self.hyp_err.push(true);
                }
                // A reference word only ('i', flipped to 'd').
                Op::Ins => {
                    pos_r += 1;
                    self.align[pos_r as usize] = pos_h;
                    self.ref_err.push(true);
                }
                Op::Undef => {}
            }
        }
        // Only an incomplete trace (not reached) leaves these short.
        self.hyp_err.resize(n_h, true);
        self.ref_err.resize(n_r, true);
    }

    /// The edit distance of `self.shifted` against `r`, reusing the rows of the current
    /// hypothesis' matrix above the first word where the two differ.
    fn candidate_distance(&mut self, r: &[u32]) -> i64 {
        let n_h = self.shifted.len();
        let n_r = r.len();
        let w = n_r + 1;
        let prefix = self
            .words
            .iter()
            .zip(&self.shifted)
            .take_while(|(a, b)| a == b)
            .count();
        if prefix == n_h {
            return self.cost[n_h * w + n_r];
        }
        let (ratio, width) = beam(n_h, n_r);
        self.prev.clear();
        self.prev
            .extend_from_slice(&self.cost[prefix * w..(prefix + 1) * w]);
        self.next.resize(w, INF);
        for i in prefix + 1..=n_h {
            let (min_j, max_j) = window(i, n_h, n_r, ratio, width);
            let h = self.shifted[i - 1];
            self.next.fill(INF);
            for j in min_j..max_j {
                if j == 0 {
                    self.next[0] = self.prev[0] + 1;
                    continue;
                }
                let sub = self.prev[j - 1] + i64::from(h != r[j - 1]);
                let best = sub.min(self.prev[j] + 1).min(self.next[j - 1] + 1);
                if best < self.next[j] {
                    self.next[j] = best;
                }
            }
            std::mem::swap(&mut self.prev, &mut self.next);
        }
        self.prev[n_r]
    }

    /// sacrebleu's `_shift`: the best shift of the current hypothesis (`self.words`) and its
    /// gain in edit distance, trying candidates until `checked` reaches the limit. Returns
    /// `(gain, checked, pre_score)`; the shifted words are left in `self.shifted` when a shift
    /// was found.
    fn best_shift(&mut self, r: &[u32], mut checked: usize) -> (Option<i64>, usize, i64) {
        let pre_score = self.traced_distance(r);
        let n_h = self.words.len();
        let n_r = r.len();
        self.alignment(n_h, n_r);
        // (gain, length, -start_h, -idx) compared as sacrebleu's tuples; equal tuples are the
        // same shift, so the shifted words never decide.
        let mut best: Option<(i64, usize, i64, i64)> = None;
        'pairs: for start_h in 0..n_h {
            for start_r in 0..n_r {
                if start_r.abs_diff(start_h) > MAX_SHIFT_DIST {
                    continue;
                }
                let mut length = 0;
                while length < MAX_SHIFT_SIZE && self.words[start_h + length] == r[start_r + length]
                {
                    length += 1;
                    checked =
                        self.try_pair(r, start_h, start_r, length, pre_score, checked, &mut best);
                    if checked >= MAX_SHIFT_CANDIDATES {
                        break 'pairs;
                    }
                    if n_h == start_h + length || n_r == start_r + length {
                        break;
                    }
                }
            }
        }
        match best {
            None => (None, checked, pre_score),
            Some((gain, length, neg_start, neg_idx)) => {
                perform_shift(
                    &self.words,
                    (-neg_start) as usize,
                    length,
                    (-neg_idx) as usize,
                    &mut self.shifted,
                );
                (Some(gain), checked, pre_score)
            }
        }
    }

    /// The body of sacrebleu's loop over `_find_shifted_pairs` for one matching block
    /// `words[start_h..][..length] == r[start_r..][..length]`: its candidate target positions,
    /// each scored and compared with `best`. Returns the updated count of candidates.
    #[allow(clippy::too_many_arguments)]
    fn try_pair(
        &mut self,
        r: &[u32],
        start_h: usize,
        start_r: usize,
        length: usize,
        pre_score: i64,
        mut checked: usize,
        best: &mut Option<(i64, usize, i64, i64)>,
    ) -> usize {
        // Only shift a block that is wrong in the hypothesis and not matched at its target.
        if !self.hyp_err[start_h..(start_h + length).min(self.hyp_err.len())]
            .iter()
            .any(|&e| e)
        {
            return checked;
        }
        if !self.ref_err[start_r..(start_r + length).min(self.ref_err.len())]
            .iter()
            .any(|&e| e)
        {
            return checked;
        }
        // Not within the block itself.
        let a = self.align[start_r];
        if start_h as i64 <= a && a < (start_h + length) as i64 {
            return checked;
        }
        let mut prev_idx: i64 = -1;
        for offset in -1..length as i64 {
            let at = start_r as i64 + offset;
            let idx = if at == -1 {
                0
            } else if (at as usize) < self.align.len() {
                self.align[at as usize] + 1
            } else {
                break;
            };
            if idx == prev_idx {
                continue;
            }
            prev_idx = idx;
            let words = std::mem::take(&mut self.shifted);
            let mut shifted = words;
            perform_shift(&self.words, start_h, length, idx as usize, &mut shifted);
            self.shifted = shifted;
            let gain = pre_score - self.candidate_distance(r);
            let candidate = (gain, length, -(start_h as i64), -idx);
            checked += 1;
            if best.is_none_or(|b| candidate > b) {
                *best = Some(candidate);
            }
        }
        checked
    }
}

/// sacrebleu's `_perform_shift`: `words` with the block `words[start..start + length]` moved
/// to `target`, written to `out`.
fn perform_shift(words: &[u32], start: usize, length: usize, target: usize, out: &mut Vec<u32>) {
    let n = words.len();
    // Python slices clamp their bounds.
    let s = |a: usize, b: usize| &words[a.min(n)..b.min(n).max(a.min(n))];
    out.clear();
    if target < start {
        out.extend_from_slice(s(0, target));
        out.extend_from_slice(s(start, start + length));
        out.extend_from_slice(s(target, start));
        out.extend_from_slice(s(start + length, n));
    } else if target > start + length {
        out.extend_from_slice(s(0, start));
        out.extend_from_slice(s(start + length, target));
        out.extend_from_slice(s(start, start + length));
        out.extend_from_slice(s(target, n));
    } else {
        out.extend_from_slice(s(0, start));
        out.extend_from_slice(s(start + length, length + target));
        out.extend_from_slice(s(start, start + length));
        out.extend_from_slice(s(length + target, n));
    }
}

/// sacrebleu's `translation_edit_rate(words_hyp, words_ref)`: the number of edits (shifts plus
/// the edit distance after them) and the reference length. An empty reference costs one edit
/// per hypothesis word.
pub(crate) fn translation_edit_rate(h: &[u32], r: &[u32], scratch: &mut TerScratch) -> (u64, u64) {
    if r.is_empty() {
        return (h.len() as u64, 0);
    }
    scratch.words.clear();
    scratch.words.extend_from_slice(h);
    let mut shifts = 0u64;
    let mut checked = 0;
    let distance = loop {
        let (gain, now, pre_score) = scratch.best_shift(r, checked);
        checked = now;
        // The last `_shift`'s starting distance is that of the final hypothesis.
        match gain {
            Some(gain) if checked < MAX_SHIFT_CANDIDATES && gain > 0 => {
                shifts += 1;
                std::mem::swap(&mut scratch.words, &mut scratch.shifted);
            }
            _ => break pre_score,
        }
    };
    (shifts + distance as u64, r.len() as u64)
}

/// sacrebleu's `BeamEditDistance` of `h` against `r` without shifts (the beam edit distance).
pub(crate) fn beam_edit_distance(h: &[u32], r: &[u32], scratch: &mut TerScratch) -> u64 {
    scratch.words.clear();
    scratch.words.extend_from_slice(h);
    scratch.traced_distance(r) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ter(h: &[u32], r: &[u32]) -> (u64, u64) {
        translation_edit_rate(h, r, &mut TerScratch::default())
    }

    #[test]
    fn perform_shift_matches_python_slices() {
        let w = [0, 1, 2, 3, 4, 5];
        let mut out = Vec::new();
        // Block [3, 4] to the front.
        perform_shift(&w, 3, 2, 0, &mut out);
        assert_eq!(out, [3, 4, 0, 1, 2, 5]);
        // Block [0, 1] to before 4.
        perform_shift(&w, 0, 2, 4, &mut out);
        assert_eq!(out, [2, 3, 0, 1, 4, 5]);
        // Target inside the block's span: sacrebleu's third branch.
        perform_shift(&w, 1, 2, 2, &mut out);
        assert_eq!(out, [0, 3, 1, 2, 4, 5]);
        perform_shift(&w, 4, 2, 5, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_block_move_is_one_shift() {
        // sacrebleu: translation_edit_rate("d e a b c".split(), "a b c d e".split()) == (1, 5)
        assert_eq!(ter(&[3, 4, 0, 1, 2], &[0, 1, 2, 3, 4]), (1, 5));
        assert_eq!(ter(&[], &[0, 1]), (2, 2));
        assert_eq!(ter(&[0, 1], &[]), (2, 0));
        assert_eq!(ter(&[0, 1, 2], &[0, 1, 2]), (0, 3));
    }
}
