//! The public `log_softmax`'s CUDA kernels (`log_softmax.cu`) on the emulator against its CPU
//! op: the forward `y = x − lse(x)` and the in-place backward `g − exp(y)·Σ g`, f32 and f64,
//! one class, rows narrower and wider than a block (7, 300, 2053), `-inf` entries, and rows
//! holding NaN, `+inf` or only `-inf` (NaN everywhere, as on the CPU), in several thread orders,
//! each launch from the plans of `row/launch.rs`. Then broken copies of the kernels, caught.

use super::module::{EmuModule, ThreadOrder};
use super::tests::{assert_broken_copies_caught, compare, module, run, spread, Float, Guarded};
use crate::loss::kernels::row::launch;
use crate::loss::kernels::row::log_softmax::log_softmax;
use candle_core::{Device, Tensor, Var};

/// Rows of `classes` values from `seed`; with `special`, the rows of the non-finite cases.
fn inputs(rows: usize, classes: usize, seed: u64) -> Vec<f64> {
    spread(rows * classes, seed, 6.0)
}

/// The non-finite rows: a `-inf` entry, NaN, `+inf`, only `-inf`, then a finite row.
fn special_rows() -> Vec<f64> {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    vec![
        0.0, -inf, 1.0, //
        nan, 0.0, 1.0, //
        inf, 0.0, 1.0, //
        -inf, -inf, -inf, //
        0.5, 0.25, -1.0,
    ]
}

/// The CPU op's output and input gradient for the upstream gradient `upstream`.
fn cpu_side<T: Float>(
    x: &[f64],
    (rows, classes): (usize, usize),
    upstream: &[T],
) -> candle_core::Result<(Vec<T>, Vec<T>)> {
    let data: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let x = Var::from_tensor(&Tensor::from_vec(data, (rows, classes), &Device::Cpu)?)?;
    let y = log_softmax(x.as_tensor())?;
    let weights = Tensor::from_vec(upstream.to_vec(), (rows, classes), &Device::Cpu)?;
    let grads = (y.clone() * weights)?.sum_all()?.backward()?;
    let grad = grads.get(x.as_tensor()).expect("a gradient");
    Ok((y.flatten_all()?.to_vec1()?, grad.flatten_all()?.to_vec1()?))
}

/// The kernels' output and the gradient they write in place over `upstream`.
fn emulated<T: Float>(
    module: &EmuModule,
    x: &[T],
    (rows, classes): (usize, usize),
    upstream: &[T],
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<T>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let mut x = Guarded::new("x", x);
    let mut y = Guarded::filled("y", rows * classes, T::from_f64(f64::NAN));
    let plan = launch::log_softmax_fwd(T::KIND, (rows, classes), x.ptr(), y.ptr()).map_err(e)?;
    run(module, &plan, order)?;
    let mut grad = Guarded::new("grad", upstream);
    let plan = launch::log_softmax_bwd(T::KIND, (rows, classes), grad.ptr(), y.ptr()).map_err(e)?;
    run(module, &plan, order)?;
    for buffer in [&x, &y, &grad] {
        buffer.check_guards()?;
    }
    Ok((y.payload().to_vec(), grad.payload().to_vec()))
}

fn check<T: Float>(
    module: &EmuModule,
    x: &[f64],
    shape: (usize, usize),
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let upstream: Vec<T> = spread(x.len(), 17, 1.0)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let (want_y, want_grad) = cpu_side::<T>(x, shape, &upstream).map_err(|e| e.to_string())?;
    let xs: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    for &order in orders {
        let (y, grad) = emulated(module, &xs, shape, &upstream, order)?;
        let what = format!("{shape:?}, {order:?}");
        compare(&format!("{what}: output"), &y, &want_y)?;
        compare(&format!("{what}: gradient"), &grad, &want_grad)?;
    }
    Ok(())
}

fn check_all(module: &EmuModule, orders: &[ThreadOrder]) -> Result<(), String> {
    for (i, shape) in [(3, 1), (4, 7), (2, 300), (2, 2053)]
        .into_iter()
        .enumerate()
    {
        let x = inputs(shape.0, shape.1, i as u64);
        check::<f64>(module, &x, shape, orders)?;
        check::<f32>(module, &x, shape, orders)?;
    }
    let special = special_rows();
    check::<f64>(module, &special, (5, 3), orders)?;
    check::<f32>(module, &special, (5, 3), orders)
}

#[test]
fn the_log_softmax_kernels_match_the_cpu_op_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

#[test]
fn broken_copies_of_the_log_softmax_kernels_are_caught() {
    let mutants = [
        (
            "each thread's own maximum, not the row's",
            "    m = log_softmax_block_max(m);\n",
            "",
        ),
        (
            "the backward's sum over each thread's columns only",
            "    total = block_sum(total);\n",
            "",
        ),
        (
            "the barrier before warp 0 reads the maximum's partials removed",
            "    if (lane == 0) log_softmax_partials[warp] = v;\n    __syncthreads();\n",
            "    if (lane == 0) log_softmax_partials[warp] = v;\n",
        ),
    ];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(3)];
    assert_broken_copies_caught("log_softmax", &mutants, |module| check_all(module, &orders));
}
