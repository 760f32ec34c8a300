//! The score's CUDA kernels (`score.cu`) on the emulator against its CPU kernel (`ScoreOp`): the
//! loss of `[K, 2N + 2]` rows and their gradient, f32 and f64, every order from 1 to 8, with and
//! without BLEU+1's constant, uneven weights, rows at every guard and tie (the brevity penalty's
//! kink `C = L`, fewer than one token, statistics below `tiny`, a precision at and under the
//! floor, no n-grams, an empty row), and more rows than a block's threads, in several thread
//! orders, each launch from the plans of `score/launch.rs`. Then broken copies of the kernels,
//! caught.

use super::module::{EmuModule, ThreadOrder};
use super::tests::{
    assert_broken_copies_caught, close_scaled, module, run, spread, Float, Guarded,
};
use crate::loss::kernels::float::KernelFloat;
use crate::loss::kernels::score::args::ScoreArgs;
use crate::loss::kernels::score::launch::{self, SCORE_MAX_ORDER};
use crate::loss::kernels::score::op::ScoreOp;

/// `K` rows of `N` orders: hand-made rows at every guard and tie first, then random ones.
fn rows(orders: usize, count: usize, seed: u64) -> Vec<f64> {
    let tiny = f32::MIN_POSITIVE as f64;
    let width = 2 * orders + 2;
    let mut out = Vec::with_capacity(count * width);
    let noise = spread(count * width, seed, 1.0);
    for r in 0..count {
        let u = |i: usize| 0.5 + 0.5 * noise[r * width + i]; // in [0, 1]
        let hyp_len = match r % 7 {
            0 => 0.0,
            1 => 0.6,
            _ => 1.0 + 25.0 * u(2 * orders),
        };
        let ref_len = match r % 5 {
            0 => hyp_len, // the kink
            1 => 3.0,
            _ => 1.0 + 25.0 * u(2 * orders + 1),
        };
        let mut row = vec![0.0; width];
        for n in 0..orders {
            let total = (hyp_len - n as f64).max(0.0);
            row[orders + n] = total;
            row[n] = match (r + n) % 6 {
                0 => 0.0,
                1 => tiny / 4.0,
                2 => total * 1e-31, // under the floor
                3 => total,
                _ => total * u(n),
            };
        }
        if r % 11 == 4 {
            row[orders] = tiny / 2.0; // a total below tiny
        }
        row[2 * orders] = hyp_len;
        row[2 * orders + 1] = ref_len;
        out.extend(row);
    }
    out
}

/// The settings: `N` orders, BLEU+1 or none, uniform or uneven weights.
fn args(orders: usize, additive: f64, uneven: bool) -> ScoreArgs {
    let weights = if uneven {
        let raw: Vec<f64> = (1..=orders).map(|n| n as f64).collect();
        let sum: f64 = raw.iter().sum();
        raw.into_iter().map(|w| w / sum).collect()
    } else {
        vec![1.0 / orders as f64; orders]
    };
    ScoreArgs {
        orders,
        additive,
        weights,
        tiny: f32::MIN_POSITIVE as f64,
        log_floor: 1e-30f64.ln(),
    }
}

/// The kernels' loss and gradient on the emulator, as the CUDA op runs them.
fn emulated<T: Float>(
    module: &EmuModule,
    args: &ScoreArgs,
    (rows, grad_out): (&[T], T),
    order: ThreadOrder,
) -> Result<(T, Vec<T>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let count = rows.len() / args.columns();
    let nan = T::from_f64(f64::NAN);
    let mut x = Guarded::new("rows", rows);
    let mut out = Guarded::filled("loss", 1, nan);
    let plan = launch::score_fwd(T::KIND, args, count, (x.ptr(), out.ptr())).map_err(e)?;
    run(module, &plan, order)?;
    let mut upstream = Guarded::new("grad_out", &[grad_out]);
    let mut grad = Guarded::filled("grad", rows.len(), nan);
    let plan = launch::score_bwd(T::KIND, args, count, (x.ptr(), upstream.ptr(), grad.ptr()))
        .map_err(e)?;
    run(module, &plan, order)?;
    for buffer in [&x, &out, &upstream, &grad] {
        buffer.check_guards()?;
    }
    Ok((out.payload()[0], grad.payload().to_vec()))
}

fn check<T: Float + KernelFloat>(
    module: &EmuModule,
    args: &ScoreArgs,
    rows: &[f64],
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let rows: Vec<T> = rows.iter().map(|&v| T::from_f64(v)).collect();
    let op = ScoreOp::new(args.clone()).map_err(|e| e.to_string())?;
    let grad_out = T::from_f64(0.75);
    let want = op.cpu_forward(&rows).to_f64();
    let want_grad = op.cpu_backward(&rows, grad_out);
    let rtol = if T::KIND == crate::loss::kernels::launch::FloatKind::F64 {
        1e-13
    } else {
        1e-5
    };
    let count = rows.len() / args.columns();
    for &order in orders {
        let what = format!(
            "N = {}, k = {}, K = {count}, {:?}, {order:?}",
            args.orders,
            args.additive,
            T::KIND
        );
        let (loss, grad) = emulated(module, args, (&rows, grad_out), order)?;
        // The rows' terms are summed in another order: scaled by the largest term's size.
        if !close_scaled(loss.to_f64(), want, rtol, 100.0) {
            return Err(format!("{what}: loss on the emulator {loss:?}, CPU {want}"));
        }
        for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
            if !close_scaled(g.to_f64(), w.to_f64(), rtol, 0.0) {
                return Err(format!(
                    "{what}: gradient[{i}] on the emulator {g:?}, CPU {w:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Every order, both smoothings, both weightings, at 1, 13 and 300 rows (more than a block).
fn check_all(module: &EmuModule, orders: &[ThreadOrder]) -> Result<(), String> {
    for n in 1..=SCORE_MAX_ORDER {
        for (additive, uneven) in [(0.0, false), (1.0, true)] {
            let args = args(n, additive, uneven);
            for count in [1, 13, 300] {
                let rows = rows(n, count, (n * 1000 + count) as u64);
                check::<f64>(module, &args, &rows, orders)?;
                check::<f32>(module, &args, &rows, orders)?;
            }
        }
    }
    Ok(())
}

#[test]
fn the_score_kernels_match_the_cpu_kernel_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

#[test]
fn the_kernels_highest_order_is_the_launch_plans() {
    assert_eq!(
        module().define("SCORE_MAX_ORDER"),
        Some(SCORE_MAX_ORDER as i64)
    );
}

#[test]
fn broken_copies_of_the_score_kernels_are_caught() {
    let mutants = [
        (
            "a tie of min(·, 0) given the whole gradient",
            "    slope = x < T(0) ? T(1) : (x == T(0) ? T(0.5) : T(0));",
            "    slope = x < T(0) ? T(1) : (x == T(0) ? T(1) : T(0));",
        ),
        (
            "the block sum dropped (thread 0's rows only)",
            "    sum = block_sum(sum);\n",
            "",
        ),
        (
            "the mean's 1/K dropped from the backward",
            "    const T up = (T(0) - grad_out[0]) * (T(1) / T(count));",
            "    const T up = T(0) - grad_out[0];",
        ),
        (
            "BLEU+1's constant added to the unigrams too",
            "        const T additive = n == 0 ? T(0) : s.additive;",
            "        const T additive = s.additive;",
        ),
        (
            "a match below tiny kept",
            "    const bool kept = m >= tiny;",
            "    const bool kept = true;",
        ),
    ];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(3)];
    assert_broken_copies_caught("score", &mutants, |module| check_all(module, &orders));
}
