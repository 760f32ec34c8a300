//! The expected form's matches kernels (`matches.cu`) on the emulator against their CPU kernel
//! (`ExpectedMatchesOp`): `m [B, N]` and the gradients of `X` and `U`, f32 and f64, both weight
//! shifts, orders longer than the hypothesis or the references, token matches of exact zeros and
//! ones (ties of the clip) and random ones, references wider than a block, in several thread
//! orders, each launch from the plans of `matches/launch.rs`. Then broken copies, caught.

use super::module::{EmuModule, ThreadOrder};
use super::tests::{
    assert_broken_copies_caught, close_scaled, module, run, spread, Float, Guarded,
};
use crate::loss::kernels::float::KernelFloat;
use crate::loss::kernels::matches::args::MatchArgs;
use crate::loss::kernels::matches::launch::{self, MatchInputs};
use crate::loss::kernels::matches::op::ExpectedMatchesOp;
use candle_core::{Device, Tensor, Var};

/// One case: sizes, the weights' shift, and whether the token matches are exact 0/1.
#[derive(Debug, Clone, Copy)]
struct MatchCase {
    batch: usize,
    seq: usize,
    width: usize,
    orders: usize,
    shifted: bool,
    exact: bool,
}

impl MatchCase {
    fn args(&self) -> MatchArgs {
        MatchArgs {
            batch: self.batch,
            seq: self.seq,
            width: self.width,
            orders: self.orders,
            shifted: self.shifted,
        }
    }

    /// `ν` in {0, 1} and `κ = ν · (1, 2 or 3)` per order, `[N][B · W]` each.
    fn counts(&self, seed: u64) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let cells = self.batch * self.width;
        let mut first = Vec::new();
        let mut clip = Vec::new();
        for n in 0..self.orders {
            let r = spread(cells, seed + n as u64, 1.0);
            let nu: Vec<f64> = r.iter().map(|&v| f64::from(u8::from(v > -0.4))).collect();
            clip.push(
                nu.iter()
                    .zip(&r)
                    .map(|(&f, &v)| f * (1.0 + ((v + 1.0) * 1.5).floor().min(2.0)))
                    .collect(),
            );
            first.push(nu);
        }
        (first, clip)
    }

    /// `X` and `U`: exact 0/1, or in [0, 1].
    fn inputs(&self, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let x = spread(self.batch * self.seq * self.width, seed, 1.0)
            .into_iter()
            .map(|v| {
                if self.exact {
                    f64::from(u8::from(v > 0.0))
                } else {
                    0.5 + 0.5 * v
                }
            })
            .collect();
        // Exact cases: a hard length's weights (0 or 1), so that E_j is an integer and the clip
        // ties.
        let u = spread(self.batch * self.seq, seed ^ 7, 1.0)
            .into_iter()
            .map(|v| {
                if self.exact {
                    f64::from(u8::from(v > -0.6))
                } else {
                    0.5 + 0.5 * v
                }
            })
            .collect();
        (x, u)
    }
}

fn cases() -> Vec<MatchCase> {
    let case = |batch, seq, width, orders, shifted, exact| MatchCase {
        batch,
        seq,
        width,
        orders,
        shifted,
        exact,
    };
    vec![
        case(3, 5, 7, 4, true, true),
        case(3, 5, 7, 4, false, false),
        case(2, 2, 9, 4, true, false),
        case(2, 6, 300, 3, true, true),
        case(2, 6, 300, 3, false, false),
        case(1, 1, 1, 2, true, true),
        case(2, 8, 3, 5, false, true),
    ]
}

/// The counts packed as the op and the kernels read them: `[2, N, B, W]`.
fn packed((first, clip): &(Vec<Vec<f64>>, Vec<Vec<f64>>)) -> Vec<f64> {
    first.iter().chain(clip).flatten().copied().collect()
}

/// The CPU op's `m`, the upstream gradient used, and `[dX | dU]` as `[B, S, W + 1]`.
fn cpu_side<T: Float>(
    case: &MatchCase,
    (x, u): (&[f64], &[f64]),
    counts: &[f64],
    seed: u64,
) -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let dev = Device::Cpu;
    let to = |v: &[f64]| -> Vec<T> { v.iter().map(|&a| T::from_f64(a)).collect() };
    let xv = Var::from_tensor(&Tensor::from_vec(
        to(x),
        (case.batch, case.seq, case.width),
        &dev,
    )?)?;
    let uv = Var::from_tensor(&Tensor::from_vec(to(u), (case.batch, case.seq), &dev)?)?;
    let counts = Tensor::from_vec(to(counts), (2, case.orders, case.batch, case.width), &dev)?;
    let op = ExpectedMatchesOp::new(case.args(), counts)?;
    let out = xv.as_tensor().apply_op2(uv.as_tensor(), op)?;
    let upstream: Vec<T> = to(&spread(out.elem_count(), seed ^ 3, 1.0));
    let grads = (out.clone() * Tensor::from_vec(upstream.clone(), out.shape(), &dev)?)?
        .sum_all()?
        .backward()?;
    let (s, w) = (case.seq, case.width);
    let dx: Vec<T> = grads
        .get(xv.as_tensor())
        .expect("dX")
        .flatten_all()?
        .to_vec1()?;
    let du: Vec<T> = grads
        .get(uv.as_tensor())
        .expect("dU")
        .flatten_all()?
        .to_vec1()?;
    let mut grad = Vec::with_capacity(case.batch * s * (w + 1));
    for b in 0..case.batch {
        for i in 0..s {
            grad.extend_from_slice(&dx[(b * s + i) * w..][..w]);
            grad.push(du[b * s + i]);
        }
    }
    Ok((out.flatten_all()?.to_vec1()?, upstream, grad))
}

/// The kernels' `m` and `[dX | dU]` on the emulator.
fn emulated<T: Float>(
    module: &EmuModule,
    case: &MatchCase,
    (x, u, counts): (&[T], &[T], &[T]),
    upstream: &[T],
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<T>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let args = case.args();
    let nan = T::from_f64(f64::NAN);
    let mut x = Guarded::new("token matches", x);
    let mut u = Guarded::new("weights", u);
    let mut counts = Guarded::new("counts", counts);
    let mut out = Guarded::filled("matches", case.batch * case.orders, nan);
    let mut work = Guarded::filled("forward workspace", args.workspace_len(false), nan);
    let inputs = MatchInputs {
        token_match: x.ptr(),
        weights: u.ptr(),
        counts: counts.ptr(),
    };
    let plan = launch::matches_fwd(T::KIND, &args, inputs, (out.ptr(), work.ptr())).map_err(e)?;
    run(module, &plan, order)?;
    let mut grad_out = Guarded::new("grad_out", upstream);
    let mut grad = Guarded::filled("grad", case.batch * case.seq * (case.width + 1), nan);
    let mut back_work = Guarded::filled("backward workspace", args.workspace_len(true), nan);
    let inputs = MatchInputs {
        token_match: x.ptr(),
        weights: u.ptr(),
        counts: counts.ptr(),
    };
    let plan = launch::matches_bwd(
        T::KIND,
        &args,
        inputs,
        (grad_out.ptr(), grad.ptr(), back_work.ptr()),
    )
    .map_err(e)?;
    run(module, &plan, order)?;
    for buffer in [&x, &u, &counts, &out, &work, &grad_out, &grad, &back_work] {
        buffer.check_guards()?;
    }
    Ok((out.payload().to_vec(), grad.payload().to_vec()))
}

fn check<T: Float + KernelFloat>(
    module: &EmuModule,
    case: &MatchCase,
    seed: u64,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let (x, u) = case.inputs(seed);
    let counts = packed(&case.counts(seed));
    let (want, upstream, want_grad) =
        cpu_side::<T>(case, (&x, &u), &counts, seed).map_err(|e| e.to_string())?;
    let to = |v: &[f64]| -> Vec<T> { v.iter().map(|&a| T::from_f64(a)).collect() };
    let (x, u, packed) = (to(&x), to(&u), to(&counts));
    let rtol = if T::KIND == crate::loss::kernels::launch::FloatKind::F64 {
        1e-12
    } else {
        2e-5
    };
    for &order in orders {
        let what = format!("{case:?}, {:?}, {order:?}", T::KIND);
        let (got, grad) = emulated(module, case, (&x, &u, &packed), &upstream, order)?;
        // m sums its columns in another order (a block sum): scaled by the row's size.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if !close_scaled(g.to_f64(), w.to_f64(), rtol, case.width as f64) {
                return Err(format!("{what}: m[{i}] on the emulator {g:?}, CPU {w:?}"));
            }
        }
        for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
            if !close_scaled(g.to_f64(), w.to_f64(), rtol, 1.0) {
                return Err(format!(
                    "{what}: gradient[{i}] on the emulator {g:?}, CPU {w:?}"
                ));
            }
        }
    }
    Ok(())
}

fn check_all(module: &EmuModule, orders: &[ThreadOrder]) -> Result<(), String> {
    for (i, case) in cases().iter().enumerate() {
        check::<f64>(module, case, i as u64, orders)?;
        check::<f32>(module, case, i as u64, orders)?;
    }
    Ok(())
}

#[test]
fn the_matches_kernels_match_the_cpu_kernel_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

#[test]
fn broken_copies_of_the_matches_kernels_are_caught() {
    let mutants = [
        (
            "a tie of the clip given the whole gradient",
            "    return node == clip ? T(0.5) : T(1);",
            "    return T(1);",
        ),
        (
            "the barrier before the rows sum dE removed",
            "        __syncthreads();  // every dE_j before the rows sum them\n",
            "",
        ),
        (
            "the weights unshifted",
            "    return d.shifted ? start + order - 1 : start;",
            "    return start;",
        ),
        (
            "the gradient not passed down to M_{n-1}",
            "                    pending[i * w + j] = g * xb[at_row * w + at_col];",
            "                    pending[i * w + j] = g;",
        ),
    ];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(3)];
    assert_broken_copies_caught("matches", &mutants, |module| check_all(module, &orders));
}
