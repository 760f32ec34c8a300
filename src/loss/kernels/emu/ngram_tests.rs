//! The CUDA kernels of the n-gram programs on CTC outputs (`ngrams.cu`) on the emulator against
//! their CPU kernel (`CtcNgramOp`): the output `[B, 1 + N + N·W]` and the logits' gradient, f32
//! and f64, every order from 1 to 8 (the fused `N <= 4` programs of the CPU kernel and its
//! general ones), the blank first, inside and last, references with repeated tokens and shared
//! prefixes, several references per element, elements with no frame, frames and a vocabulary
//! wider than a block, more trie nodes than threads, and NaN in every padding frame (never
//! read), in several thread orders, each launch from the plans of `ctc/ngrams_launch.rs` (whose
//! backward segments of `⌈√T'⌉` frames give every case several checkpoints). Then out-of-range
//! frame counts and non-finite logits, and broken copies of the kernels, caught.

use super::module::{EmuModule, ThreadOrder};
use super::tests::{assert_broken_copies_caught, module, run, spread, Float, Guarded};
use crate::loss::kernels::ctc::ngrams::{CtcNgramOp, CtcNgramPlan};
use crate::loss::kernels::ctc::ngrams_launch::{self, NgramArgs, NgramInputs, NGRAM_MAX_ORDER};
use candle_core::{Device, Tensor, Var};

/// One batch: sizes, each element's references and frame count, the blank and the order.
#[derive(Debug, Clone)]
struct NgramCase {
    frames: usize,
    vocab: usize,
    refs: Vec<Vec<Vec<u32>>>,
    input_lengths: Vec<usize>,
    blank: u32,
    max_order: usize,
}

impl NgramCase {
    fn batch(&self) -> usize {
        self.refs.len()
    }

    /// `W`: the widest element's references laid end to end.
    fn width(&self) -> usize {
        self.refs
            .iter()
            .map(|r| r.iter().map(Vec::len).sum::<usize>())
            .max()
            .unwrap_or(0)
            .max(1)
    }

    fn plan(&self) -> CtcNgramPlan {
        CtcNgramPlan::new(
            &self.refs,
            &self.input_lengths,
            self.max_order,
            self.blank,
            self.width(),
        )
    }

    /// Logits `[B, T', V]` in f64, NaN in every padding frame.
    fn logits(&self, seed: u64) -> Vec<f64> {
        let (t_max, v) = (self.frames, self.vocab);
        let mut x = spread(self.batch() * t_max * v, seed, 3.0);
        for (b, &len) in self.input_lengths.iter().enumerate() {
            for t in len..t_max {
                x[(b * t_max + t) * v..][..v].fill(f64::NAN);
            }
        }
        x
    }
}

/// A reference of `len` tokens of `0..vocab` without the blank, from `seed`, with repeats.
fn reference(len: usize, vocab: usize, blank: u32, seed: u64) -> Vec<u32> {
    let tokens: Vec<u32> = (0..vocab as u32).filter(|&v| v != blank).collect();
    spread(len, seed, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            if i % 5 == 3 {
                tokens[(i * 7) % tokens.len()] // a token the reference repeats
            } else {
                tokens[((x + 1.0) * 0.5 * tokens.len() as f64) as usize % tokens.len()]
            }
        })
        .collect()
}

/// The cases: every order on a small batch, then wide ones.
fn cases() -> Vec<NgramCase> {
    let mut cases = Vec::new();
    for max_order in 1..=NGRAM_MAX_ORDER {
        cases.push(NgramCase {
            frames: 9,
            vocab: 6,
            refs: vec![
                vec![vec![1, 2, 2, 3, 1, 2], vec![1, 2, 4]],
                vec![vec![4, 4, 4, 4]],
                vec![vec![3]],
                vec![vec![5, 1, 5, 1, 5]],
            ],
            input_lengths: vec![9, 6, 0, 7],
            blank: 0,
            max_order,
        });
    }
    // The blank inside and last, and a vocabulary wider than a block.
    cases.push(NgramCase {
        frames: 12,
        vocab: 300,
        refs: vec![
            vec![reference(20, 300, 7, 1), reference(14, 300, 7, 2)],
            vec![reference(9, 300, 7, 3)],
        ],
        input_lengths: vec![12, 11],
        blank: 7,
        max_order: 4,
    });
    cases.push(NgramCase {
        frames: 10,
        vocab: 5,
        refs: vec![vec![vec![0, 1, 1, 2, 3, 0]], vec![vec![2, 2]]],
        input_lengths: vec![10, 4],
        blank: 4,
        max_order: 3,
    });
    // More trie nodes than threads in a block (K ≈ 4 · 150), 70 frames.
    cases.push(NgramCase {
        frames: 70,
        vocab: 40,
        refs: vec![vec![reference(90, 40, 0, 4), reference(60, 40, 0, 5)]],
        input_lengths: vec![70],
        blank: 0,
        max_order: 4,
    });
    cases
}

/// The CPU kernel's output, the upstream gradient used, and the logits' gradient.
fn cpu_side<T: Float>(
    case: &NgramCase,
    logits: &[f64],
    seed: u64,
) -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let data: Vec<T> = logits.iter().map(|&v| T::from_f64(v)).collect();
    let x = Var::from_tensor(&Tensor::from_vec(
        data,
        (case.batch(), case.frames, case.vocab),
        &Device::Cpu,
    )?)?;
    let out = x.as_tensor().apply_op1(CtcNgramOp::new(case.plan()))?;
    let grad_out: Vec<T> = spread(out.elem_count(), seed ^ 9, 1.0)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let upstream = Tensor::from_vec(grad_out.clone(), out.shape(), &Device::Cpu)?;
    let grads = (out.clone() * upstream)?.sum_all()?.backward()?;
    let grad = grads
        .get(x.as_tensor())
        .expect("a logits gradient")
        .flatten_all()?
        .to_vec1()?;
    Ok((out.flatten_all()?.to_vec1()?, grad_out, grad))
}

/// The kernels' output and gradient on the emulator, as the CUDA op runs them, with the frame
/// counts `frames` as the device holds them.
fn emulated<T: Float>(
    module: &EmuModule,
    case: &NgramCase,
    frames: &[u32],
    (logits, grad_out): (&[T], &[T]),
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<T>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let plan = case.plan();
    let (buffer, nodes, groups) = plan.trie_buffer();
    let args = NgramArgs {
        batch: case.batch(),
        frames: case.frames,
        vocab: case.vocab,
        max_order: case.max_order,
        width: case.width(),
        blank: case.blank,
        nodes,
        groups,
    };
    let nan = T::from_f64(f64::NAN);
    let mut x = Guarded::new("logits", logits);
    let mut frames = Guarded::new("frames", frames);
    let mut trie = Guarded::new("trie", &buffer);
    let mut out = Guarded::filled("out", args.batch * args.columns(), nan);
    let mut work = Guarded::filled("forward workspace", args.workspace_len(false), nan);
    let inputs = NgramInputs {
        logits: x.ptr(),
        frames: frames.ptr(),
        trie: trie.ptr(),
    };
    let launch =
        ngrams_launch::ctc_ngram_fwd(T::KIND, &args, inputs, out.ptr(), work.ptr()).map_err(e)?;
    run(module, &launch, order)?;
    let mut grad_out = Guarded::new("grad_out", grad_out);
    let mut grad = Guarded::filled("grad", args.batch * args.frames * args.vocab, nan);
    let mut back_work = Guarded::filled("backward workspace", args.workspace_len(true), nan);
    let inputs = NgramInputs {
        logits: x.ptr(),
        frames: frames.ptr(),
        trie: trie.ptr(),
    };
    let launch = ngrams_launch::ctc_ngram_bwd(
        T::KIND,
        &args,
        inputs,
        (grad_out.ptr(), grad.ptr()),
        back_work.ptr(),
    )
    .map_err(e)?;
    run(module, &launch, order)?;
    for buffer in [&x, &out, &work, &grad_out, &grad, &back_work] {
        buffer.check_guards()?;
    }
    frames.check_guards()?;
    trie.check_guards()?;
    Ok((out.payload().to_vec(), grad.payload().to_vec()))
}

/// An error naming the first element of `got` farther from `want` than `rtol` of the vector's
/// largest magnitude (plus `rtol` of the element's own): the programs sum over frames and the
/// vocabulary in another order than the CPU kernel, so the differences scale with the sums, not
/// with each small entry. NaN matches NaN only.
fn compare_scaled<T: Float>(what: &str, got: &[T], want: &[T], rtol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want
        .iter()
        .map(|w| w.to_f64().abs())
        .filter(|w| w.is_finite())
        .fold(0.0, f64::max);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else {
            (g - w).abs() <= rtol * (scale + w.abs())
        };
        if !ok {
            return Err(format!("{what}[{i}]: emulator {g:e}, CPU {w:e}"));
        }
    }
    Ok(())
}

/// The relative tolerance of a float type.
fn rtol<T: Float>() -> f64 {
    if T::KIND == crate::loss::kernels::launch::FloatKind::F64 {
        1e-12
    } else {
        2e-5
    }
}

fn check_case<T: Float>(
    module: &EmuModule,
    case: &NgramCase,
    seed: u64,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let logits = case.logits(seed);
    let (want_out, grad_out, want_grad) =
        cpu_side::<T>(case, &logits, seed).map_err(|e| e.to_string())?;
    let logits: Vec<T> = logits.iter().map(|&v| T::from_f64(v)).collect();
    let frames: Vec<u32> = case.input_lengths.iter().map(|&l| l as u32).collect();
    for &order in orders {
        let (out, grad) = emulated::<T>(module, case, &frames, (&logits, &grad_out), order)?;
        let what = format!(
            "N = {}, T = {}, V = {}, blank {}, {order:?}",
            case.max_order, case.frames, case.vocab, case.blank
        );
        compare_scaled(&format!("{what}: output"), &out, &want_out, rtol::<T>())?;
        compare_scaled(&format!("{what}: gradient"), &grad, &want_grad, rtol::<T>())?;
    }
    Ok(())
}

fn check_all(
    module: &EmuModule,
    cases: &[NgramCase],
    orders: &[ThreadOrder],
) -> Result<(), String> {
    for (i, case) in cases.iter().enumerate() {
        // The long case in two orders only: it is the slowest to emulate (a fiber switch per
        // thread at every barrier of its 70 frames).
        let orders = if case.frames >= 50 {
            &orders[..orders.len().min(2)]
        } else {
            orders
        };
        check_case::<f64>(module, case, i as u64, orders)?;
        check_case::<f32>(module, case, i as u64, orders)?;
    }
    Ok(())
}

#[test]
fn the_ngram_kernels_match_the_cpu_kernel_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &cases(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

#[test]
fn the_kernels_highest_order_is_the_launch_plans() {
    assert_eq!(
        module().define("NGRAM_MAX_COUNTS"),
        Some(NGRAM_MAX_ORDER as i64 - 2)
    );
}

/// Frame counts the host never read (the training path off the CPU without `check_values`)
/// above `T'` give their element a NaN row and NaN gradients, a non-finite logit among an
/// element's frames the same, and the other elements stay as the CPU kernel computes them; no
/// read or write leaves the buffers.
#[test]
fn out_of_range_frames_and_non_finite_logits_give_nan_elements() {
    let case = NgramCase {
        frames: 6,
        vocab: 5,
        refs: vec![vec![vec![1, 2, 2]], vec![vec![3, 4]], vec![vec![2, 1]]],
        input_lengths: vec![6, 6, 4],
        blank: 0,
        max_order: 4,
    };
    let mut logits = case.logits(3);
    let (want_out, grad_out, want_grad) = cpu_side::<f64>(&case, &logits, 3).unwrap();
    // Element 1: more frames than T'; element 2: an infinite logit at frame 2.
    let frames = [6u32, 7, 4];
    logits[(2 * case.frames + 2) * case.vocab + 1] = f64::INFINITY;
    let (columns, rows) = (case.plan().columns(), case.frames * case.vocab);
    for order in ThreadOrder::SOME {
        let (out, grad) = emulated(module(), &case, &frames, (&logits, &grad_out), order)
            .unwrap_or_else(|e| panic!("{e}"));
        compare_scaled("element 0", &out[..columns], &want_out[..columns], 1e-12)
            .unwrap_or_else(|e| panic!("{e}"));
        compare_scaled(
            "element 0's gradient",
            &grad[..rows],
            &want_grad[..rows],
            1e-12,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for b in 1..3 {
            assert!(
                out[b * columns..][..columns].iter().all(|v| v.is_nan()),
                "{order:?}: element {b}'s row"
            );
        }
        assert!(grad[rows..2 * rows].iter().all(|v| v.is_nan()), "{order:?}");
        // Element 2's frames in use are NaN, its padding frames 0.
        let element_2 = &grad[2 * rows..];
        assert!(element_2[..4 * case.vocab].iter().all(|v| v.is_nan()));
        assert!(element_2[4 * case.vocab..].iter().all(|&v| v == 0.0));
    }
}

#[test]
fn broken_copies_of_the_ngram_kernels_are_caught() {
    let mutants = [
        (
            "the barrier between two frames of the programs removed",
            "        __syncthreads();  // layer t + 1 complete before frame t + 1 reads it\n",
            "",
        ),
        (
            "the barrier at the end of a reverse frame removed",
            "        __syncthreads();  // frame t done before frame t - 1 reads q_t, the adjoints and the rows\n",
            "",
        ),
        (
            "equal neighbours allowed without a blank between them",
            "    return ((link & NGRAM_REPEATS) ? T(0) : in_before[parent]) + gap_before[parent];",
            "    return in_before[parent] + gap_before[parent];",
        ),
        (
            "the pending gradient of a depth-1 node dropped",
            "                const T pending = -ready_after[root];",
            "                const T pending = T(0);",
        ),
        (
            "a child's readiness not passed to its parent's gap",
            "                gap_adjoint += r;\n",
            "",
        ),
        (
            "a segment recomputed from the first checkpoint",
            "            const T* start = w.checkpoints + (u64)(t0 / segment) * run_width;",
            "            const T* start = w.checkpoints;",
        ),
    ];
    let small = cases();
    let cases = [
        small[3].clone(),
        small[1].clone(),
        small[9].clone(),
        small[10].clone(),
    ];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(5)];
    assert_broken_copies_caught("n-gram", &mutants, |module| {
        check_all(module, &cases, &orders)
    });
}
