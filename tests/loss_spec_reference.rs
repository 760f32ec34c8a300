//! The crate's loss against an independent, naive `f64` reference of docs/loss.md
//! (`tests/spec_reference/`), on ~2000 deterministic random cases covering every form × length
//! model × reduction × smoothing: statistics and loss through both entry points, and the
//! logits gradient of both against central finite differences of the reference loss.

mod common;
use common::{f64_supported, test_device};

mod spec_reference;

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, BleuLossConfig, BleuLossOutput, Form, LengthModel,
    LossSmoothing, Reduction, References,
};
use candle_core::{DType, Result, Tensor, Var, D};
use rand::{rngs::StdRng, Rng, SeedableRng};
use spec_reference::*;
use std::time::Instant;

/// Number of random cases (a multiple of the 36 configuration combinations).
const CASES: usize = 36 * 56;
/// Relative tolerance of values: `|a - b| <= VALUE_TOL * (1 + |b|)`.
const VALUE_TOL: f64 = 1e-9;
/// Finite-difference step.
const EPS: f64 = 1e-6;
/// Gradient tolerance: `|g - fd| <= GRAD_ABS + GRAD_REL * |fd|`.
const GRAD_ABS: f64 = 1e-6;
const GRAD_REL: f64 = 1e-5;
/// Kink detection: a coordinate is skipped where the finite differences with `EPS` and `EPS/10`
/// differ by more than `KINK_REL * max(|fd|) + KINK_ABS`.
const KINK_REL: f64 = 1e-4;
const KINK_ABS: f64 = 1e-7;

/// How the references of a case are given to the crate.
#[derive(Clone, Debug)]
enum RefsInput {
    /// `References::from_ids` of u32 `dims` (`[B, T]` or `[B, R, T]`).
    Ids {
        dims: Vec<usize>,
        ids: Vec<u32>,
        pad: u32,
    },
    /// `References::from_matrices` of f64 `[B, T, V]` and u32 lengths `[B]`.
    Matrices {
        t: usize,
        a: Vec<f64>,
        lengths: Vec<u32>,
    },
}

/// One reproducible case.
#[derive(Clone, Debug)]
struct Case {
    index: usize,
    b: usize,
    s: usize,
    v: usize,
    /// `[b, s, v]` row-major f64 logits.
    logits: Vec<f64>,
    hyp_lengths: Option<Vec<u32>>,
    refs: RefsInput,
    cfg: RCfg,
}

impl Case {
    fn elem_refs(&self) -> Vec<ElemRefs> {
        let eos = self.cfg.length.eos();
        match &self.refs {
            RefsInput::Ids { dims, ids, pad } => {
                let (r, t) = if dims.len() == 2 {
                    (1, dims[1])
                } else {
                    (dims[1], dims[2])
                };
                (0..self.b)
                    .map(|e| {
                        let rows: Vec<Vec<u32>> = (0..r)
                            .map(|k| ids[(e * r + k) * t..(e * r + k + 1) * t].to_vec())
                            .collect();
                        id_refs(&rows, *pad, eos)
                    })
                    .collect()
            }
            RefsInput::Matrices { t, a, lengths } => (0..self.b)
                .map(|e| {
                    let rows: Vec<Vec<f64>> = (0..*t)
                        .map(|j| a[(e * t + j) * self.v..(e * t + j + 1) * self.v].to_vec())
                        .collect();
                    matrix_ref(&rows, lengths[e] as usize, eos)
                })
                .collect(),
        }
    }

    fn reference(&self, logits: &[f64]) -> RefOut {
        let p = softmax_rows(logits, self.v);
        reference_from_probs(
            &p,
            self.b,
            self.s,
            self.v,
            self.hyp_lengths.as_deref(),
            &self.elem_refs(),
            &self.cfg,
        )
    }

    fn crate_cfg(&self) -> BleuLossConfig {
        let c = &self.cfg;
        BleuLossConfig {
            max_order: c.max_order,
            weights: c.weights.clone(),
            form: match c.form {
                RForm::Expected => Form::Expected,
                RForm::Paired => Form::Paired,
                RForm::LowerBound => Form::LowerBound,
            },
            length: match c.length {
                RLength::Given => LengthModel::Given,
                RLength::NotEos(e) => LengthModel::NotEos { eos_id: e as u32 },
                RLength::SoftEos(e) => LengthModel::SoftEos { eos_id: e as u32 },
            },
            reduction: match c.reduction {
                RReduction::Corpus => Reduction::Corpus,
                RReduction::SentenceMean => Reduction::SentenceMean,
            },
            smoothing: match c.add_k {
                None => LossSmoothing::None,
                Some(k) => LossSmoothing::AddK(k),
            },
            ..Default::default()
        }
    }

    fn crate_refs(&self) -> Result<References> {
        let dev = &test_device();
        match &self.refs {
            RefsInput::Ids { dims, ids, pad } => {
                References::from_ids(&Tensor::from_vec(ids.clone(), dims.as_slice(), dev)?, *pad)
            }
            RefsInput::Matrices { t, a, lengths } => References::from_matrices(
                &Tensor::from_vec(a.clone(), (self.b, *t, self.v), dev)?,
                &Tensor::from_vec(lengths.clone(), self.b, dev)?,
            ),
        }
    }
}

/// What the crate returned through one entry point.
struct CrateOut {
    loss: f64,
    matches: Vec<f64>,
    totals: Vec<f64>,
    hyp_len: Vec<f64>,
    ref_len: Vec<f64>,
    grad: Vec<f64>,
}

fn flat(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// Runs the crate on `case`: through `softmax` + `bleu_loss` or through `bleu_loss_from_logits`.
fn run_crate(case: &Case, from_logits: bool) -> Result<CrateOut> {
    let dev = &test_device();
    let var = Var::from_vec(case.logits.clone(), (case.b, case.s, case.v), dev)?;
    let lengths = match &case.hyp_lengths {
        Some(l) => Some(Tensor::from_vec(l.clone(), case.b, dev)?),
        None => None,
    };
    let refs = case.crate_refs()?;
    let cfg = case.crate_cfg();
    let out: BleuLossOutput = if from_logits {
        bleu_loss_from_logits(var.as_tensor(), lengths.as_ref(), &refs, &cfg)?
    } else {
        let probs = candle_nn::ops::softmax(var.as_tensor(), D::Minus1)?;
        bleu_loss(&probs, lengths.as_ref(), &refs, &cfg)?
    };
    let grads = out.loss.backward()?;
    let grad = match grads.get(var.as_tensor()) {
        Some(g) => flat(g)?,
        None => vec![0.0; case.logits.len()],
    };
    Ok(CrateOut {
        loss: out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        matches: flat(&out.stats.matches)?,
        totals: flat(&out.stats.totals)?,
        hyp_len: flat(&out.stats.hyp_len)?,
        ref_len: flat(&out.stats.ref_len)?,
        grad,
    })
}

// ---------------------------------------------------------------------------------------------
// Random cases.

fn uniform(rng: &mut StdRng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.gen::<f64>()
}

/// A random token: mostly from a small alphabet (to get repeats and matches), sometimes EOS.
fn token(rng: &mut StdRng, alphabet: usize, v: usize, eos: usize) -> u32 {
    if rng.gen_bool(0.12) {
        eos as u32
    } else {
        rng.gen_range(0..alphabet.min(v)) as u32
    }
}

fn gen_case(rng: &mut StdRng, index: usize) -> Case {
    let combo = index % 36;
    let form = [RForm::Expected, RForm::Paired, RForm::LowerBound][combo % 3];
    let b = rng.gen_range(1..=3);
    let s = rng.gen_range(1..=6);
    let v = rng.gen_range(3..=8);
    let eos = rng.gen_range(0..v);
    let length = match (combo / 3) % 3 {
        0 => RLength::Given,
        1 => RLength::NotEos(eos),
        _ => RLength::SoftEos(eos),
    };
    let reduction = [RReduction::Corpus, RReduction::SentenceMean][(combo / 9) % 2];
    // `combo < 36`: `combo / 18` is 0 or 1.
    let add_k = match combo / 18 {
        0 => None,
        _ => Some([1.0, 1.0, 1.0, 0.5, 0.1, 2.0, 0.0][rng.gen_range(0..7)]),
    };
    let max_order = rng.gen_range(1..=4);
    let weights = rng.gen_bool(0.3).then(|| {
        let mut w: Vec<f64> = (0..max_order).map(|_| uniform(rng, 0.0, 1.0)).collect();
        if max_order > 1 && rng.gen_bool(0.3) {
            let k = rng.gen_range(0..max_order);
            w[k] = 0.0;
        }
        w
    });
    let cfg = RCfg {
        max_order,
        weights,
        form,
        length,
        reduction,
        add_k,
    };
    let alphabet = rng.gen_range(2..=v);

    // References.
    let t = rng.gen_range(1..=6);
    let refs = if rng.gen_bool(0.25) {
        let mut a = vec![0.0; b * t * v];
        let lengths: Vec<u32> = (0..b).map(|_| rng.gen_range(1..=t) as u32).collect();
        let soft = rng.gen_bool(0.5);
        for row in a.chunks_mut(v) {
            let tok = token(rng, alphabet, v, eos) as usize;
            if soft && rng.gen_bool(0.7) {
                let scale = uniform(rng, 0.2, 2.0);
                let l: Vec<f64> = (0..v)
                    .map(|k| uniform(rng, -1.0, 1.0) * scale + if k == tok { 1.5 } else { 0.0 })
                    .collect();
                row.copy_from_slice(&softmax_rows(&l, v));
            } else {
                row[tok] = 1.0;
            }
        }
        RefsInput::Matrices { t, a, lengths }
    } else {
        let r = if rng.gen_bool(0.35) {
            None
        } else {
            Some(rng.gen_range(1..=3))
        };
        let rr = r.unwrap_or(1);
        let pad = if rng.gen_bool(0.8) {
            0
        } else {
            rng.gen_range(0..v) as u32
        };
        let mut ids = vec![pad; b * rr * t];
        for e in 0..b {
            for k in 0..rr {
                let row = &mut ids[(e * rr + k) * t..(e * rr + k + 1) * t];
                let real = if rng.gen_bool(0.15) {
                    0
                } else {
                    rng.gen_range(1..=t)
                };
                for x in row.iter_mut().take(real) {
                    *x = token(rng, alphabet, v, eos);
                }
            }
            // At least one reference per element: a non-padding last token somewhere.
            let element = &ids[e * rr * t..(e + 1) * rr * t];
            if element.iter().all(|&x| x == pad) {
                ids[e * rr * t] = (pad + 1) % v as u32;
            }
        }
        let dims = match r {
            None => vec![b, t],
            Some(r) => vec![b, r, t],
        };
        RefsInput::Ids { dims, ids, pad }
    };

    // Hypothesis logits: random, at a random scale, often nudged towards reference tokens.
    let scale = uniform(rng, 0.1f64.ln(), 5.0f64.ln()).exp();
    let mut logits: Vec<f64> = (0..b * s * v)
        .map(|_| uniform(rng, -1.0, 1.0) * scale)
        .collect();
    if rng.gen_bool(0.6) {
        for row in logits.chunks_mut(v) {
            if rng.gen_bool(0.7) {
                let tok = rng.gen_range(0..alphabet);
                row[tok] += uniform(rng, 0.0, 3.0);
            }
        }
    }
    if length != RLength::Given && rng.gen_bool(0.3) {
        for row in logits.chunks_mut(v) {
            if rng.gen_bool(0.3) {
                row[eos] += uniform(rng, 0.0, 3.0);
            }
        }
    }
    let hyp_lengths = match length {
        RLength::SoftEos(_) => None,
        _ if rng.gen_bool(0.3) => None,
        _ => Some((0..b).map(|_| rng.gen_range(0..=s) as u32).collect()),
    };
    Case {
        index,
        b,
        s,
        v,
        logits,
        hyp_lengths,
        refs,
        cfg,
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison.

fn rel_err(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / (1.0 + b.abs())
    }
}

#[derive(Default, Debug)]
struct MaxErrors {
    loss: f64,
    matches: f64,
    totals: f64,
    hyp_len: f64,
    ref_len: f64,
    /// `|g - fd| / (1 + |fd|)` over the checked, unskipped coordinates.
    grad: f64,
}

/// Central finite difference of the reference loss in coordinate `k`.
fn fd(case: &Case, k: usize, eps: f64) -> f64 {
    let mut x = case.logits.clone();
    x[k] = case.logits[k] + eps;
    let plus = case.reference(&x).loss;
    x[k] = case.logits[k] - eps;
    let minus = case.reference(&x).loss;
    (plus - minus) / (2.0 * eps)
}

/// Checks one case through both entry points; returns error messages (empty when it passes).
fn check_case(
    case: &Case,
    check_grad: bool,
    max: &mut MaxErrors,
    checked: &mut usize,
    skipped: &mut usize,
) -> Vec<String> {
    let mut errors = Vec::new();
    BRANCHES.with(|b| b.borrow_mut().recording = true);
    let want = case.reference(&case.logits);
    BRANCHES.with(|b| b.borrow_mut().recording = false);
    let want_m: Vec<f64> = want.stats.iter().flat_map(|s| s.matches.clone()).collect();
    let want_t: Vec<f64> = want.stats.iter().flat_map(|s| s.totals.clone()).collect();
    let want_c: Vec<f64> = want.stats.iter().map(|s| s.hyp_len).collect();
    let want_l: Vec<f64> = want.stats.iter().map(|s| s.ref_len).collect();
    // Finite differences once per case, shared by both entry points.
    let fds: Option<Vec<(f64, bool)>> = check_grad.then(|| {
        (0..case.logits.len())
            .map(|k| {
                let f1 = fd(case, k, EPS);
                let f2 = fd(case, k, EPS / 10.0);
                let kink = (f1 - f2).abs() > KINK_REL * f1.abs().max(f2.abs()) + KINK_ABS;
                (f1, kink)
            })
            .collect()
    });
    for from_logits in [false, true] {
        let path = if from_logits {
            "bleu_loss_from_logits"
        } else {
            "bleu_loss(softmax)"
        };
        let got = match run_crate(case, from_logits) {
            Ok(g) => g,
            Err(e) => {
                errors.push(format!("{path}: error {e}"));
                continue;
            }
        };
        let mut cmp = |what: &str, got: &[f64], want: &[f64], slot: &mut f64| {
            if got.len() != want.len() {
                errors.push(format!(
                    "{path}: {what} has {} entries, want {}",
                    got.len(),
                    want.len()
                ));
                return;
            }
            for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
                let err = rel_err(g, w);
                if err.is_nan() || err > VALUE_TOL {
                    errors.push(format!("{path}: {what}[{k}] = {g:e}, reference {w:e}"));
                }
                if err.is_finite() {
                    *slot = slot.max(err);
                }
            }
        };
        cmp("loss", &[got.loss], &[want.loss], &mut max.loss);
        cmp("matches", &got.matches, &want_m, &mut max.matches);
        cmp("totals", &got.totals, &want_t, &mut max.totals);
        cmp("hyp_len", &got.hyp_len, &want_c, &mut max.hyp_len);
        cmp("ref_len", &got.ref_len, &want_l, &mut max.ref_len);
        if let Some(fds) = &fds {
            for (k, (&g, &(f, kink))) in got.grad.iter().zip(fds).enumerate() {
                *checked += 1;
                if kink {
                    *skipped += 1;
                    continue;
                }
                let bad = !g.is_finite() || (g - f).abs() > GRAD_ABS + GRAD_REL * f.abs();
                if bad {
                    errors.push(format!(
                        "{path}: d loss / d logits[{}, {}, {}] = {g:e}, finite difference {f:e}",
                        k / (case.s * case.v),
                        (k / case.v) % case.s,
                        k % case.v
                    ));
                }
                max.grad = max.grad.max((g - f).abs() / (1.0 + f.abs()));
            }
        }
    }
    errors
}

/// A printable description of a case and what the reference computes for it.
fn describe(case: &Case) -> String {
    let want = case.reference(&case.logits);
    format!(
        "case {}: {:?}\n  crate config: {:?}\n  B={} S={} V={}\n  logits = {:?}\n  \
         hyp_lengths = {:?}\n  refs = {:?}\n  references as the reference sees them: {:?}\n  \
         reference: loss {:e}, stats {:?}",
        case.index,
        case.cfg,
        case.crate_cfg(),
        case.b,
        case.s,
        case.v,
        case.logits,
        case.hyp_lengths,
        case.refs,
        case.elem_refs(),
        want.loss,
        want.stats
    )
}

#[test]
fn crate_matches_the_spec_reference() {
    if !f64_supported("crate_matches_the_spec_reference") {
        return;
    }
    let start = Instant::now();
    let mut rng = StdRng::seed_from_u64(0x5bec_b1e0);
    let mut max = MaxErrors::default();
    let (mut checked, mut skipped) = (0usize, 0usize);
    let mut grad_cases = 0usize;
    let mut combos_with_grad = [0usize; 36];
    let mut failures: Vec<String> = Vec::new();
    let mut failed_cases = 0usize;
    let mut matrix_cases = 0usize;
    for index in 0..CASES {
        let case = gen_case(&mut rng, index);
        if matches!(case.refs, RefsInput::Matrices { .. }) {
            matrix_cases += 1;
        }
        // Every case gets its gradient checked (the whole run takes a few seconds); to thin
        // this out, keep whole rounds of the 36 combinations, e.g. `(index / 36) % 4 == 0`.
        let check_grad = true;
        if check_grad {
            grad_cases += 1;
            combos_with_grad[index % 36] += 1;
        }
        let errors = check_case(&case, check_grad, &mut max, &mut checked, &mut skipped);
        if !errors.is_empty() {
            failed_cases += 1;
            if failures.len() < 8 {
                failures.push(format!("{}\n  {}", describe(&case), errors.join("\n  ")));
            }
        }
    }
    eprintln!(
        "{CASES} cases ({matrix_cases} with matrix references), {grad_cases} with gradient \
         checks, {checked} gradient coordinates checked, {skipped} skipped at kinks, \
         {:.1} s\nmax errors: {max:?}\nbranches reached: {:?}",
        start.elapsed().as_secs_f64(),
        BRANCHES.with(|b| b.borrow().clone())
    );
    assert!(combos_with_grad.iter().all(|&n| n > 0));
    assert!(
        failures.is_empty(),
        "{failed_cases} of {CASES} cases disagree with the docs/loss.md reference; the first ones:\n\n{}",
        failures.join("\n\n")
    );
    assert!(
        (skipped as f64) < 0.05 * checked as f64,
        "{skipped} of {checked} gradient coordinates skipped at kinks"
    );
}

// ---------------------------------------------------------------------------------------------
// Checks of the reference itself.

/// At one-hot inputs with `Given` lengths every form of the reference gives the §1 statistics.
#[test]
fn the_reference_is_exact_at_one_hot_inputs() {
    if !f64_supported("the_reference_is_exact_at_one_hot_inputs") {
        return;
    }
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..3000 {
        let v = rng.gen_range(2..=6);
        let s = rng.gen_range(1..=7);
        let len = rng.gen_range(0..=s);
        let max_order = rng.gen_range(1..=5);
        let hyp: Vec<u32> = (0..s).map(|_| rng.gen_range(0..v) as u32).collect();
        let nrefs = rng.gen_range(1..=3);
        let refs: Vec<Vec<u32>> = (0..nrefs)
            .map(|_| {
                let l = rng.gen_range(0..=7);
                (0..l).map(|_| rng.gen_range(0..v) as u32).collect()
            })
            .collect();
        let mut p = vec![0.0; s * v];
        for (i, &tok) in hyp.iter().enumerate() {
            p[i * v + tok as usize] = 1.0;
        }
        let want = exact_stats(&hyp[..len], &refs, max_order);
        for form in [RForm::Expected, RForm::Paired, RForm::LowerBound] {
            let cfg = RCfg {
                max_order,
                weights: None,
                form,
                length: RLength::Given,
                reduction: RReduction::Corpus,
                add_k: None,
            };
            let got = element_stats(&p, s, v, len, &ElemRefs::Ids(refs.clone()), &cfg);
            // The lower bound sums `c` shares `κ/c`: exact up to rounding.
            for (x, y) in got.matches.iter().zip(&want.matches) {
                assert!(
                    (x - y).abs() <= 1e-12 * (1.0 + y),
                    "{form:?} {hyp:?} {len} {refs:?}: {:?} vs {:?}",
                    got.matches,
                    want.matches
                );
            }
            assert_eq!(got.totals, want.totals);
            assert_eq!(got.hyp_len, want.hyp_len);
            assert_eq!(got.ref_len, want.ref_len);
        }
    }
}

/// The count-based `ν`, `κ` of id references equal the `Y` formula on their one-hot matrices
/// (several references, every form and length model, soft hypotheses).
#[test]
fn the_reference_id_counts_equal_the_y_formula() {
    if !f64_supported("the_reference_id_counts_equal_the_y_formula") {
        return;
    }
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..1500 {
        let v = rng.gen_range(2..=6);
        let s = rng.gen_range(1..=6);
        let max_order = rng.gen_range(1..=4);
        let eos = rng.gen_range(0..v);
        let nrefs = rng.gen_range(1..=3);
        let refs: Vec<Vec<u32>> = (0..nrefs)
            .map(|_| {
                let l = rng.gen_range(0..=6);
                (0..l).map(|_| rng.gen_range(0..v) as u32).collect()
            })
            .collect();
        let one_hot: Vec<Vec<Vec<f64>>> = refs
            .iter()
            .map(|r| {
                r.iter()
                    .map(|&tok| {
                        let mut row = vec![0.0; v];
                        row[tok as usize] = 1.0;
                        row
                    })
                    .collect()
            })
            .collect();
        let logits: Vec<f64> = (0..s * v).map(|_| uniform(&mut rng, -2.0, 2.0)).collect();
        let p = softmax_rows(&logits, v);
        for form in [RForm::Expected, RForm::Paired, RForm::LowerBound] {
            for length in [RLength::Given, RLength::NotEos(eos), RLength::SoftEos(eos)] {
                let cfg = RCfg {
                    max_order,
                    weights: None,
                    form,
                    length,
                    reduction: RReduction::Corpus,
                    add_k: None,
                };
                let len = rng.gen_range(0..=s);
                let a = element_stats(&p, s, v, len, &ElemRefs::Ids(refs.clone()), &cfg);
                let b = element_stats(&p, s, v, len, &ElemRefs::Matrices(one_hot.clone()), &cfg);
                for (x, y) in a.matches.iter().zip(&b.matches) {
                    assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
                }
                assert_eq!(a.totals, b.totals);
                assert_eq!(a.ref_len, b.ref_len);
            }
        }
    }
}
