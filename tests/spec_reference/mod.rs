//! A naive, independent reference of docs/loss.md (the differentiable BLEU loss), written from the
//! document's text alone in plain `f64` loops: no candle, no shared code with `src/loss/`.
#![allow(dead_code)]

use std::cell::RefCell;

/// Which side of each `min`/guard the reference took (counted only while `recording` is set):
/// evidence that the random cases reach every branch.
#[derive(Clone, Debug, Default)]
pub struct Branches {
    pub recording: bool,
    /// Expected form: `κ_j` (clip) vs `ν_j Σ_i M u` (expected count), both positive.
    pub expected_clip: usize,
    pub expected_count: usize,
    /// Paired form: clipped vs unclipped, both positive.
    pub paired_clipped: usize,
    pub paired_unclipped: usize,
    /// Lower bound: `1` vs `κ/(1 + E - a)`, with `a > 0`.
    pub lower_one: usize,
    pub lower_ratio: usize,
    /// Orders skipped for `t_n = 0`; precisions floored at `1e-30`.
    pub zero_total: usize,
    pub floored: usize,
    /// Brevity: `C < 1` branch; a negative penalty; a tie between reference lengths.
    pub beta_below_one: usize,
    pub beta_negative: usize,
    pub ref_len_tie: usize,
}

thread_local! {
    pub static BRANCHES: RefCell<Branches> = RefCell::new(Branches::default());
}

fn count(f: impl FnOnce(&mut Branches) -> &mut usize) {
    BRANCHES.with(|b| {
        let mut b = b.borrow_mut();
        if b.recording {
            *f(&mut b) += 1;
        }
    });
}

/// The floor of `p̃_n` before the log (docs/loss.md, §10.3 Guards).
pub const FLOOR: f64 = 1e-30;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RForm {
    Expected,
    Paired,
    LowerBound,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RLength {
    Given,
    NotEos(usize),
    SoftEos(usize),
}

impl RLength {
    pub fn eos(self) -> Option<usize> {
        match self {
            RLength::Given => None,
            RLength::NotEos(e) | RLength::SoftEos(e) => Some(e),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RReduction {
    Corpus,
    SentenceMean,
}

#[derive(Clone, Debug)]
pub struct RCfg {
    pub max_order: usize,
    pub weights: Option<Vec<f64>>,
    pub form: RForm,
    pub length: RLength,
    pub reduction: RReduction,
    /// `Some(k)`: `AddK(k)`; `None`: no smoothing.
    pub add_k: Option<f64>,
}

impl RCfg {
    pub fn weights(&self) -> Vec<f64> {
        match &self.weights {
            Some(w) => w.clone(),
            None => vec![1.0 / self.max_order as f64; self.max_order],
        }
    }
}

/// The references of one batch element as the reference sees them, after padding and EOS are
/// cut off.
#[derive(Clone, Debug)]
pub enum ElemRefs {
    /// Token ids, one `Vec` per reference (possibly empty after EOS truncation).
    Ids(Vec<Vec<u32>>),
    /// Matrices: references → rows → `V` values.
    Matrices(Vec<Vec<Vec<f64>>>),
}

impl ElemRefs {
    pub fn lengths(&self) -> Vec<usize> {
        match self {
            ElemRefs::Ids(r) => r.iter().map(|x| x.len()).collect(),
            ElemRefs::Matrices(r) => r.iter().map(|x| x.len()).collect(),
        }
    }
}

/// Statistics of one element.
#[derive(Clone, Debug)]
pub struct ElemStats {
    pub matches: Vec<f64>,
    pub totals: Vec<f64>,
    pub hyp_len: f64,
    pub ref_len: f64,
}

/// Outputs for a batch.
#[derive(Clone, Debug)]
pub struct RefOut {
    pub loss: f64,
    pub stats: Vec<ElemStats>,
}

/// Row-wise softmax of `[rows, v]` logits.
pub fn softmax_rows(logits: &[f64], v: usize) -> Vec<f64> {
    let mut out = vec![0.0; logits.len()];
    for (row, o) in logits.chunks(v).zip(out.chunks_mut(v)) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut sum = 0.0;
        for (x, y) in row.iter().zip(o.iter_mut()) {
            *y = (x - max).exp();
            sum += *y;
        }
        for y in o.iter_mut() {
            *y /= sum;
        }
    }
    out
}

/// Index of the first maximum.
pub fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Id references of one element: `rows` are the padded rows (each of length `T`); trailing
/// `pad` is padding, an all-padding row is no reference; under an EOS model a reference ends at
/// its first EOS id.
pub fn id_refs(rows: &[Vec<u32>], pad: u32, eos: Option<usize>) -> ElemRefs {
    let mut refs = Vec::new();
    for row in rows {
        let mut len = row.len();
        while len > 0 && row[len - 1] == pad {
            len -= 1;
        }
        if len == 0 {
            continue;
        }
        let mut seq = row[..len].to_vec();
        if let Some(e) = eos {
            if let Some(pos) = seq.iter().position(|&t| t as usize == e) {
                seq.truncate(pos);
            }
        }
        refs.push(seq);
    }
    ElemRefs::Ids(refs)
}

/// A matrix reference of one element: its first `len` rows; under an EOS model it ends before
/// its first row whose argmax is the EOS column.
pub fn matrix_ref(rows: &[Vec<f64>], len: usize, eos: Option<usize>) -> ElemRefs {
    let mut r: Vec<Vec<f64>> = rows[..len].to_vec();
    if let Some(e) = eos {
        if let Some(pos) = r.iter().position(|row| argmax(row) == e) {
            r.truncate(pos);
        }
    }
    ElemRefs::Matrices(vec![r])
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The reference length closest to `c`; ties go to the shorter one.
pub fn closest_ref_len(lengths: &[usize], c: f64) -> f64 {
    let mut best: Option<usize> = None;
    for &r in lengths {
        best = match best {
            None => Some(r),
            Some(b) => {
                let (dr, db) = ((r as f64 - c).abs(), (b as f64 - c).abs());
                if dr == db && r != b {
                    count(|x| &mut x.ref_len_tie);
                }
                if dr < db || (dr == db && r < b) {
                    Some(r)
                } else {
                    Some(b)
                }
            }
        };
    }
    best.expect("an element without references") as f64
}

/// Statistics of one element. `p` is `[s, v]` row-major probabilities, `len` the hard length
/// (`Given`/`NotEos`; `s` when none was given).
pub fn element_stats(
    p: &[f64],
    s: usize,
    v: usize,
    len: usize,
    refs: &ElemRefs,
    cfg: &RCfg,
) -> ElemStats {
    let pr = |i: usize| &p[i * v..(i + 1) * v];
    // Cumulative survival s_i = Π_{k<=i} (1 - P[k, eos]).
    let surv: Vec<f64> = match cfg.length.eos() {
        Some(e) => {
            let mut acc = 1.0;
            (0..s)
                .map(|i| {
                    acc *= 1.0 - pr(i)[e];
                    acc
                })
                .collect()
        }
        None => vec![1.0; s],
    };
    let surv_at = |i: isize| if i < 0 { 1.0 } else { surv[i as usize] };
    // Length weights h_i.
    let h: Vec<f64> = (0..s)
        .map(|i| match cfg.length {
            RLength::Given => f64::from(u8::from(i < len)),
            RLength::NotEos(e) => f64::from(u8::from(i < len)) * (1.0 - pr(i)[e]),
            RLength::SoftEos(_) => surv[i],
        })
        .collect();
    let c: f64 = h.iter().sum();

    // References laid end to end: (reference index, offset) per position.
    let ref_lens = refs.lengths();
    let mut positions: Vec<(usize, usize)> = Vec::new();
    for (r, &l) in ref_lens.iter().enumerate() {
        for o in 0..l {
            positions.push((r, o));
        }
    }

    let mut matches = Vec::new();
    let mut totals = Vec::new();
    for n in 1..=cfg.max_order {
        let starts: Vec<usize> = if s >= n {
            (0..=s - n).collect()
        } else {
            vec![]
        };
        let u: Vec<f64> = starts
            .iter()
            .map(|&i| match cfg.length {
                RLength::Given | RLength::NotEos(_) => f64::from(u8::from(i + n - 1 < len)),
                RLength::SoftEos(_) => surv_at(i as isize - 1),
            })
            .collect();
        let g: Vec<f64> = starts
            .iter()
            .map(|&i| match cfg.length {
                RLength::Given => f64::from(u8::from(i + n - 1 < len)),
                RLength::NotEos(_) => (0..n).map(|k| h[i + k]).product(),
                RLength::SoftEos(_) => surv[i + n - 1],
            })
            .collect();
        let t_n: f64 = g.iter().sum();

        // Reference n-gram starts lying inside their reference (e_j = 1); others contribute 0.
        let js: Vec<(usize, usize)> = positions
            .iter()
            .cloned()
            .filter(|&(r, o)| o + n <= ref_lens[r])
            .collect();
        // ν_j, κ_j.
        let (nu, kappa): (Vec<f64>, Vec<f64>) = match refs {
            ElemRefs::Ids(rs) => {
                let gram = |(r, o): (usize, usize)| &rs[r][o..o + n];
                let mut nu = Vec::new();
                let mut kappa = Vec::new();
                for (jj, &j) in js.iter().enumerate() {
                    let first = !js[..jj].iter().any(|&j2| gram(j2) == gram(j));
                    let clip = rs
                        .iter()
                        .map(|seq| {
                            if seq.len() < n {
                                0
                            } else {
                                (0..=seq.len() - n)
                                    .filter(|&o| &seq[o..o + n] == gram(j))
                                    .count()
                            }
                        })
                        .max()
                        .unwrap_or(0);
                    let nuj = f64::from(u8::from(first));
                    nu.push(nuj);
                    kappa.push(nuj * clip as f64);
                }
                (nu, kappa)
            }
            ElemRefs::Matrices(rs) => {
                let y = |(r, o): (usize, usize), (r2, o2): (usize, usize)| -> f64 {
                    (0..n)
                        .map(|k| dot(&rs[r][o + k], &rs[r2][o2 + k]))
                        .product()
                };
                let mut nu = Vec::new();
                let mut kappa = Vec::new();
                for (jj, &j) in js.iter().enumerate() {
                    let nuj: f64 = js[..jj].iter().map(|&j2| 1.0 - y(j, j2)).product();
                    let best = (0..rs.len())
                        .map(|r| {
                            js.iter()
                                .filter(|&&(r2, _)| r2 == r)
                                .map(|&j2| y(j, j2))
                                .sum::<f64>()
                        })
                        .fold(0.0, f64::max);
                    nu.push(nuj);
                    kappa.push(nuj * best);
                }
                (nu, kappa)
            }
        };
        // Token match X and n-gram match M[j][i].
        let x = |(r, o): (usize, usize), i: usize| -> f64 {
            match refs {
                ElemRefs::Ids(rs) => pr(i)[rs[r][o] as usize],
                ElemRefs::Matrices(rs) => dot(&rs[r][o], pr(i)),
            }
        };
        let m: Vec<Vec<f64>> = js
            .iter()
            .map(|&(r, o)| {
                starts
                    .iter()
                    .map(|&i| (0..n).map(|k| x((r, o + k), i + k)).product())
                    .collect()
            })
            .collect();

        let m_n: f64 = match cfg.form {
            RForm::Expected => (0..js.len())
                .map(|j| {
                    let expected: f64 = (0..starts.len()).map(|ii| m[j][ii] * u[ii]).sum();
                    if kappa[j] > 0.0 && nu[j] * expected > 0.0 {
                        if kappa[j] < nu[j] * expected {
                            count(|x| &mut x.expected_clip);
                        } else {
                            count(|x| &mut x.expected_count);
                        }
                    }
                    kappa[j].min(nu[j] * expected)
                })
                .sum(),
            RForm::LowerBound => {
                let mut total = 0.0;
                for j in 0..js.len() {
                    let a: Vec<f64> = (0..starts.len()).map(|ii| u[ii] * m[j][ii]).collect();
                    let e: f64 = a.iter().sum();
                    for &aji in &a {
                        if aji > 0.0 {
                            if kappa[j] / (1.0 + e - aji) < 1.0 {
                                count(|x| &mut x.lower_ratio);
                            } else {
                                count(|x| &mut x.lower_one);
                            }
                        }
                        total += aji * (kappa[j] / (1.0 + e - aji)).min(1.0);
                    }
                }
                total
            }
            RForm::Paired => {
                let z = |i: usize, i2: usize| -> f64 {
                    (0..n).map(|k| dot(pr(i + k), pr(i2 + k))).product()
                };
                let ns = starts.len();
                let mut mu = vec![0.0; ns];
                let mut cnt = vec![0.0; ns];
                for ii in 0..ns {
                    let i = starts[ii];
                    let mut prod = u[ii];
                    for i2 in 0..ii {
                        prod *= 1.0 - z(i, starts[i2]) * u[i2];
                    }
                    mu[ii] = prod;
                    let sum: f64 = (0..ns).map(|i2| z(i, starts[i2]) * u[i2]).sum();
                    cnt[ii] = prod * sum;
                }
                let mut total = 0.0;
                for j in 0..js.len() {
                    for ii in 0..ns {
                        let clipped = m[j][ii] * kappa[j] * mu[ii];
                        let unclipped = m[j][ii] * cnt[ii] * nu[j];
                        if clipped > 0.0 && unclipped > 0.0 {
                            if clipped < unclipped {
                                count(|x| &mut x.paired_clipped);
                            } else {
                                count(|x| &mut x.paired_unclipped);
                            }
                        }
                        total += clipped.min(unclipped);
                    }
                }
                total
            }
        };
        matches.push(m_n);
        totals.push(t_n);
    }
    let ref_len = closest_ref_len(&ref_lens, c);
    ElemStats {
        matches,
        totals,
        hyp_len: c,
        ref_len,
    }
}

/// The log brevity penalty with its linear continuation below one token.
pub fn beta(c: f64, l: f64) -> f64 {
    if c < 1.0 {
        count(|x| &mut x.beta_below_one);
    }
    if l > c {
        count(|x| &mut x.beta_negative);
    }
    if c >= 1.0 {
        (1.0 - l / c).min(0.0)
    } else {
        (1.0 - 2.0 * l + l * c).min(0.0)
    }
}

/// `log BLEU` from summed statistics.
pub fn log_bleu(m: &[f64], t: &[f64], c: f64, l: f64, cfg: &RCfg) -> f64 {
    let w = cfg.weights();
    let mut out = beta(c, l);
    for n in 0..cfg.max_order {
        if t[n] == 0.0 {
            count(|x| &mut x.zero_total);
            continue;
        }
        let p = match cfg.add_k {
            Some(k) if n >= 1 => (m[n] + k) / (t[n] + k),
            _ => m[n] / t[n],
        };
        if p < FLOOR {
            count(|x| &mut x.floored);
        }
        out += w[n] * p.max(FLOOR).ln();
    }
    out
}

/// The loss from per-element statistics.
pub fn loss_from(stats: &[ElemStats], cfg: &RCfg) -> f64 {
    match cfg.reduction {
        RReduction::Corpus => {
            let nn = cfg.max_order;
            let mut m = vec![0.0; nn];
            let mut t = vec![0.0; nn];
            let (mut c, mut l) = (0.0, 0.0);
            for st in stats {
                for n in 0..nn {
                    m[n] += st.matches[n];
                    t[n] += st.totals[n];
                }
                c += st.hyp_len;
                l += st.ref_len;
            }
            -log_bleu(&m, &t, c, l, cfg)
        }
        RReduction::SentenceMean => {
            let sum: f64 = stats
                .iter()
                .map(|st| -log_bleu(&st.matches, &st.totals, st.hyp_len, st.ref_len, cfg))
                .sum();
            sum / stats.len() as f64
        }
    }
}

/// The whole loss for `[b, s, v]` probabilities.
pub fn reference_from_probs(
    p: &[f64],
    b: usize,
    s: usize,
    v: usize,
    lens: Option<&[u32]>,
    refs: &[ElemRefs],
    cfg: &RCfg,
) -> RefOut {
    let stats: Vec<ElemStats> = (0..b)
        .map(|e| {
            let len = lens.map_or(s, |l| l[e] as usize);
            element_stats(&p[e * s * v..(e + 1) * s * v], s, v, len, &refs[e], cfg)
        })
        .collect();
    RefOut {
        loss: loss_from(&stats, cfg),
        stats,
    }
}

/// §1 statistics of a hard hypothesis against id references (for checking the reference).
pub fn exact_stats(hyp: &[u32], refs: &[Vec<u32>], max_order: usize) -> ElemStats {
    let count = |seq: &[u32], g: &[u32]| -> usize {
        if seq.len() < g.len() {
            0
        } else {
            (0..=seq.len() - g.len())
                .filter(|&o| &seq[o..o + g.len()] == g)
                .count()
        }
    };
    let mut matches = Vec::new();
    let mut totals = Vec::new();
    for n in 1..=max_order {
        let mut seen: Vec<&[u32]> = Vec::new();
        let mut m = 0usize;
        if hyp.len() >= n {
            for o in 0..=hyp.len() - n {
                let g = &hyp[o..o + n];
                if seen.contains(&g) {
                    continue;
                }
                seen.push(g);
                let clip = refs.iter().map(|r| count(r, g)).max().unwrap_or(0);
                m += count(hyp, g).min(clip);
            }
        }
        matches.push(m as f64);
        totals.push((hyp.len() + 1).saturating_sub(n) as f64);
    }
    let lens: Vec<usize> = refs.iter().map(|r| r.len()).collect();
    ElemStats {
        matches,
        totals,
        hyp_len: hyp.len() as f64,
        ref_len: closest_ref_len(&lens, hyp.len() as f64),
    }
}
