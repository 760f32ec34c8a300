//! The CTC loss's CUDA kernels (`ctc.cu`) on the emulator against its CPU kernel (`CtcOp`):
//! the output `[B, width]` and the input gradient, from logits and from log-probabilities, f32
//! and f64, blanks first and last, repeated labels, empty targets, targets too long for their
//! frames (with and without `zero_infinity`), more states than threads in a block, `-inf`
//! log-probabilities, and NaN in every padding frame (never read), in several thread orders,
//! each launch from the plans of `ctc/launch.rs`; f16 and bf16 inputs read as they are, against
//! the CPU kernel in f32. Then broken copies of the kernels, caught.

use super::module::{EmuModule, ThreadOrder};
use super::tests::{
    assert_broken_copies_caught, bits_16, compare, module, run, spread, widen_16, Element, Float,
    Guarded,
};
use crate::loss::kernels::ctc::launch::{self, CtcArgs, CtcInputs, CtcWorkspace};
use crate::loss::kernels::ctc::op::{CtcAlignments, CtcOp};
use crate::loss::kernels::launch::FloatKind;
use candle_core::{DType, Device, Tensor, Var};

/// One batch: its sizes, each element's target and input length, and the settings.
#[derive(Debug, Clone)]
struct CtcCase {
    frames: usize,
    vocab: usize,
    targets: Vec<Vec<u32>>,
    input_lengths: Vec<usize>,
    blank: u32,
    from_logits: bool,
    zero_infinity: bool,
    /// Log-probabilities of -inf at some non-blank entries (log-probability inputs only).
    with_neg_inf: bool,
}

impl CtcCase {
    fn batch(&self) -> usize {
        self.targets.len()
    }

    fn target_max(&self) -> usize {
        self.targets.iter().map(Vec::len).max().unwrap_or(0)
    }

    fn args(&self) -> CtcArgs {
        CtcArgs {
            batch: self.batch(),
            frames: self.frames,
            vocab: self.vocab,
            target_max: self.target_max(),
            blank: self.blank,
            from_logits: self.from_logits,
            zero_infinity: self.zero_infinity,
        }
    }

    /// The input `[B, T, V]` in f64: logits, or their log-softmax; NaN in the padding frames.
    fn input(&self, seed: u64) -> Vec<f64> {
        let (t_max, v) = (self.frames, self.vocab);
        let mut x = spread(self.batch() * t_max * v, seed, 4.0);
        for (b, &len) in self.input_lengths.iter().enumerate() {
            for t in 0..t_max {
                let row = &mut x[(b * t_max + t) * v..][..v];
                if t >= len {
                    row.fill(f64::NAN);
                } else if !self.from_logits {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                    row.iter_mut().for_each(|x| *x -= lse);
                    if self.with_neg_inf && t % 3 == 1 {
                        // A label impossible at this frame (never the blank).
                        let label = (self.blank as usize + 1 + t) % v;
                        row[label] = f64::NEG_INFINITY;
                    }
                }
            }
        }
        x
    }
}

/// The cases: the shapes of the CPU kernel's own tests and of the loss's, and a wide one.
fn cases() -> Vec<CtcCase> {
    let base = CtcCase {
        frames: 7,
        vocab: 6,
        targets: vec![vec![1, 2, 2], vec![4, 4], vec![], vec![3, 3, 3]],
        input_lengths: vec![7, 5, 3, 4], // the last needs 5 frames: an infinite loss
        blank: 0,
        from_logits: true,
        zero_infinity: false,
        with_neg_inf: false,
    };
    let mut cases = Vec::new();
    for from_logits in [true, false] {
        for zero_infinity in [false, true] {
            cases.push(CtcCase {
                from_logits,
                zero_infinity,
                ..base.clone()
            });
        }
        cases.push(CtcCase {
            blank: 5,
            targets: vec![vec![0, 1, 0], vec![4], vec![2, 3, 2, 3]],
            input_lengths: vec![6, 1, 7],
            from_logits,
            with_neg_inf: !from_logits,
            ..base.clone()
        });
        // More states (2L + 1 = 281) than threads in a block, 300 frames of a wider vocabulary.
        let long: Vec<u32> = (0..140).map(|i| 1 + (i * 7 % 49) as u32).collect();
        cases.push(CtcCase {
            frames: 300,
            vocab: 50,
            targets: vec![long, vec![7, 7, 8]],
            input_lengths: vec![300, 211],
            from_logits,
            ..base.clone()
        });
    }
    cases
}

/// The CPU kernel's output `[B, width]`, the upstream gradient used, and the input gradient.
fn cpu_side<T: Float>(
    case: &CtcCase,
    x: &[f64],
    seed: u64,
) -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let alignments = CtcAlignments {
        targets: case.targets.clone(),
        input_lengths: case.input_lengths.clone(),
        blank: case.blank,
        zero_infinity: case.zero_infinity,
    };
    let op = CtcOp::new(alignments, case.from_logits);
    let data: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let x = Var::from_tensor(&Tensor::from_vec(
        data,
        (case.batch(), case.frames, case.vocab),
        &Device::Cpu,
    )?)?;
    let out = x.as_tensor().apply_op1(op)?;
    let grad_out: Vec<T> = spread(out.elem_count(), seed ^ 5, 1.0)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let grad_out_t = Tensor::from_vec(grad_out.clone(), out.shape(), &Device::Cpu)?;
    let grads = (out.clone() * grad_out_t)?.sum_all()?.backward()?;
    let grad = grads
        .get(x.as_tensor())
        .expect("an input gradient")
        .flatten_all()?
        .to_vec1()?;
    Ok((out.flatten_all()?.to_vec1()?, grad_out, grad))
}

/// The alignment buffers as the device holds them: u32 targets `[B, L]`, input and target
/// lengths `[B]`.
struct DeviceBuffers {
    targets: Vec<u32>,
    input_lengths: Vec<u32>,
    target_lengths: Vec<u32>,
}

impl CtcCase {
    /// The case's alignments as u32 device buffers, the padding an id far outside the
    /// vocabulary (no kernel may read it).
    fn device_buffers(&self) -> DeviceBuffers {
        let target_max = self.target_max();
        let mut targets: Vec<u32> = Vec::new();
        for target in &self.targets {
            targets.extend(target);
            targets.extend(std::iter::repeat_n(u32::MAX, target_max - target.len()));
        }
        let lengths = |v: Vec<usize>| v.into_iter().map(|l| l as u32).collect::<Vec<_>>();
        DeviceBuffers {
            targets,
            input_lengths: lengths(self.input_lengths.clone()),
            target_lengths: lengths(self.targets.iter().map(Vec::len).collect()),
        }
    }
}

/// The kernels' output and gradient on the emulator, as the CUDA op runs them.
fn emulated<T: Float>(
    module: &EmuModule,
    case: &CtcCase,
    x: &[T],
    grad_out: &[T],
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<T>), String> {
    let nan = T::from_f64(f64::NAN);
    let input = Input {
        kind: T::KIND,
        x,
        unwritten: nan,
    };
    emulated_on(
        module,
        case,
        &case.device_buffers(),
        (input, grad_out),
        order,
    )
}

/// The input of a launch in its storage type `S` (16-bit inputs as their bits), its
/// [`FloatKind`], and the value the gradient buffer starts as (NaN), so that an element no thread
/// writes shows.
struct Input<'a, S> {
    kind: FloatKind,
    x: &'a [S],
    unwritten: S,
}

/// [`emulated`] over the given device buffers (which may hold what the host never checked), for
/// an input in any storage type `S` and the output in `T` (f32 for 16-bit inputs).
fn emulated_on<S: Element, T: Float>(
    module: &EmuModule,
    case: &CtcCase,
    buffers: &DeviceBuffers,
    (input, grad_out): (Input<'_, S>, &[T]),
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<S>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let args = case.args();
    let kind = input.kind;
    let (nan, nan64) = (T::from_f64(f64::NAN), f64::NAN);
    let mut x = Guarded::new("x", input.x);
    let mut targets = Guarded::new("targets", &buffers.targets);
    let mut input_lengths = Guarded::new("input_lengths", &buffers.input_lengths);
    let mut target_lengths = Guarded::new("target_lengths", &buffers.target_lengths);
    let mut inputs = || CtcInputs {
        x: x.ptr(),
        targets: targets.ptr(),
        input_lengths: input_lengths.ptr(),
        target_lengths: target_lengths.ptr(),
    };
    let mut out = Guarded::filled("out", args.batch * args.width(), nan);
    let mut alpha = Guarded::filled("alpha", args.table_len(), nan64);
    let mut ptrs = inputs();
    if args.from_logits {
        let plan =
            launch::ctc_lse(kind, &args, ptrs.x, ptrs.input_lengths, out.ptr()).map_err(e)?;
        run(module, &plan, order)?;
        ptrs = inputs();
    }
    let plan = launch::ctc_alpha(kind, &args, ptrs, out.ptr(), alpha.ptr()).map_err(e)?;
    run(module, &plan, order)?;
    let mut grad_out = Guarded::new("grad_out", grad_out);
    let mut beta = Guarded::filled("beta", args.beta_len(), nan64);
    let mut gamma = Guarded::filled("gamma", args.table_len(), nan64);
    let mut scale = Guarded::filled("scale", args.batch, nan64);
    let grad_len = args.batch * args.frames * args.vocab;
    let mut grad = Guarded::filled("grad", grad_len, input.unwritten);
    let workspace = CtcWorkspace {
        alpha: alpha.ptr(),
        beta: beta.ptr(),
        gamma: gamma.ptr(),
        scale: scale.ptr(),
    };
    let plan = launch::ctc_beta(
        kind,
        &args,
        inputs(),
        (out.ptr(), grad_out.ptr()),
        workspace,
    )
    .map_err(e)?;
    run(module, &plan, order)?;
    let plan = launch::ctc_grad_rows(
        kind,
        &args,
        inputs(),
        out.ptr(),
        (gamma.ptr(), scale.ptr()),
        grad.ptr(),
    )
    .map_err(e)?;
    run(module, &plan, order)?;
    for buffer in [&out, &grad_out] {
        buffer.check_guards()?;
    }
    for buffer in [&grad, &x] {
        buffer.check_guards()?;
    }
    for buffer in [&alpha, &beta, &gamma, &scale] {
        buffer.check_guards()?;
    }
    for buffer in [&targets, &input_lengths, &target_lengths] {
        buffer.check_guards()?;
    }
    Ok((out.payload().to_vec(), grad.payload().to_vec()))
}

fn check_case<T: Float>(
    module: &EmuModule,
    case: &CtcCase,
    seed: u64,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let x = case.input(seed);
    let (want_out, grad_out, want_grad) =
        cpu_side::<T>(case, &x, seed).map_err(|e| e.to_string())?;
    let x: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    for &order in orders {
        let (out, grad) = emulated::<T>(module, case, &x, &grad_out, order)?;
        let what = format!(
            "T = {}, V = {}, from_logits {}, zero_infinity {}, {order:?}",
            case.frames, case.vocab, case.from_logits, case.zero_infinity
        );
        compare(&format!("{what}: output"), &out, &want_out)?;
        compare(&format!("{what}: gradient"), &grad, &want_grad)?;
    }
    Ok(())
}

fn check_all(module: &EmuModule, cases: &[CtcCase], orders: &[ThreadOrder]) -> Result<(), String> {
    for (i, case) in cases.iter().enumerate() {
        check_case::<f64>(module, case, i as u64, orders)?;
        check_case::<f32>(module, case, i as u64, orders)?;
    }
    Ok(())
}

#[test]
fn the_ctc_kernels_match_the_cpu_kernel_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &cases(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

/// Targets and lengths the host never read (the training path off the CPU without
/// `check_values`), out of range in five elements — an id `>= V`, the blank as a label, a target
/// length above `L`, an input length of 0 and one above `T` — give those elements a NaN loss and
/// NaN gradients in every frame, read nothing outside the buffers, and leave the one element in
/// range as the CPU kernel computes it.
#[test]
fn out_of_range_alignments_give_nan_elements_and_no_stray_reads() {
    let case = CtcCase {
        frames: 7,
        vocab: 6,
        targets: vec![
            vec![1, 2, 2],
            vec![4, 4],
            vec![5],
            vec![3],
            vec![1, 5],
            vec![2],
        ],
        input_lengths: vec![7, 5, 3, 4, 6, 7],
        blank: 0,
        from_logits: true,
        zero_infinity: false,
        with_neg_inf: false,
    };
    let (frames, vocab, width) = (case.frames, case.vocab, case.args().width());
    let mut buffers = case.device_buffers();
    let l = case.target_max();
    buffers.targets[l] = vocab as u32; // element 1: an id out of the vocabulary
    buffers.target_lengths[2] = l as u32 + 1; // element 2: a target longer than L
    buffers.targets[3 * l] = case.blank; // element 3: the blank as a label
    buffers.input_lengths[4] = 0; // element 4: no frame
    buffers.input_lengths[5] = frames as u32 + 1; // element 5: more frames than T
    for from_logits in [true, false] {
        let case = CtcCase {
            from_logits,
            ..case.clone()
        };
        let width = if from_logits { width } else { 1 };
        let x = case.input(11);
        let (want_out, grad_out, want_grad) = cpu_side::<f64>(&case, &x, 11).unwrap();
        for order in ThreadOrder::SOME {
            let input = Input {
                kind: FloatKind::F64,
                x: &x,
                unwritten: f64::NAN,
            };
            let (out, grad) = emulated_on(module(), &case, &buffers, (input, &grad_out), order)
                .unwrap_or_else(|e| panic!("{e}"));
            let what = format!("from_logits {from_logits}, {order:?}");
            compare(
                &format!("{what}: element 0"),
                &out[..width],
                &want_out[..width],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let rows = frames * vocab;
            compare(
                &format!("{what}: element 0's gradient"),
                &grad[..rows],
                &want_grad[..rows],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            for b in 1..case.batch() {
                assert!(
                    out[b * width].is_nan(),
                    "{what}: element {b}'s loss {}",
                    out[b * width]
                );
                let g = &grad[b * rows..][..rows];
                assert!(
                    g.iter().all(|v| v.is_nan()),
                    "{what}: element {b}'s gradient"
                );
            }
        }
    }
}

/// f16 and bf16 inputs, read as they are (`ctc.cu`'s `_f16`/`_bf16` kernels): the output (f32)
/// and the gradient (in the input's dtype) against the CPU kernel in f32 on the same rounded
/// inputs — the output to f32's tolerance, each gradient element within half a unit in the last
/// place of the 16-bit type (`2⁻⁸·|g|` for bf16, `2⁻¹¹·|g|` for f16: the kernels round once
/// from double) plus the f32 CPU value's own error (`1e-5·|g| + 1e-6`), NaN exactly where the
/// CPU has NaN; every case, from logits and log-probabilities.
#[test]
fn sixteen_bit_inputs_match_the_cpu_kernel_in_f32() {
    let mut checked = 0;
    for (i, case) in cases().iter().enumerate() {
        for dtype in [DType::F16, DType::BF16] {
            let seed = 100 + i as u64;
            // The input rounded to 16 bits (NaN padding frames kept), and its exact f32 values.
            let x64 = case.input(seed);
            let rounded = Tensor::from_vec(
                x64.iter().map(|&v| v as f32).collect::<Vec<f32>>(),
                x64.len(),
                &Device::Cpu,
            )
            .and_then(|t| t.to_dtype(dtype))
            .expect("a 16-bit input");
            let bits = bits_16(&rounded);
            let widened: Vec<f64> = bits.iter().map(|&b| widen_16(b, dtype) as f64).collect();
            let (want_out, grad_out, want_grad) =
                cpu_side::<f32>(case, &widened, seed).unwrap_or_else(|e| panic!("{e}"));
            // Half a unit in the last place, relative: 2⁻¹¹ (f16's 11 significant bits), 2⁻⁸
            // (bf16's 8).
            let (kind, unwritten, half_ulp) = match dtype {
                DType::F16 => (FloatKind::F16, 0x7e00u16, 2f64.powi(-11)),
                _ => (FloatKind::BF16, 0x7fc0u16, 2f64.powi(-8)),
            };
            for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
                let input = Input {
                    kind,
                    x: &bits,
                    unwritten,
                };
                let (out, grad) = emulated_on(
                    module(),
                    case,
                    &case.device_buffers(),
                    (input, &grad_out),
                    order,
                )
                .unwrap_or_else(|e| panic!("{e}"));
                let what = format!(
                    "{dtype:?}, T = {}, V = {}, from_logits {}, zero_infinity {}, {order:?}",
                    case.frames, case.vocab, case.from_logits, case.zero_infinity
                );
                compare(&format!("{what}: output"), &out, &want_out)
                    .unwrap_or_else(|e| panic!("{e}"));
                for (k, (&got, &want)) in grad.iter().zip(&want_grad).enumerate() {
                    let (got, want) = (widen_16(got, dtype) as f64, want as f64);
                    if want.is_nan() || got.is_nan() {
                        assert!(
                            want.is_nan() && got.is_nan(),
                            "{what}: gradient {k}: {got} vs {want}"
                        );
                        continue;
                    }
                    // The kernel's one rounding, and the f32 reference's own error.
                    let tolerance = (half_ulp + 1e-5) * want.abs() + 1e-6;
                    assert!(
                        (got - want).abs() <= tolerance,
                        "{what}: gradient {k}: {got} vs {want}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, cases().len() * 2 * 2);
}

#[test]
fn broken_copies_of_the_ctc_kernels_are_caught() {
    let mutants = [
        (
            "the barrier between two frames of alpha removed",
            "        __syncthreads();  // row t complete before row t + 1 reads it\n",
            "",
        ),
        (
            "the barrier after a beta row removed",
            "        __syncthreads();  // every thread has read beta_now\n",
            "",
        ),
        (
            "a skip allowed between repeated labels",
            "return (s & 1u) && s >= 3 && target[s >> 1] != target[(s >> 1) - 1];",
            "return (s & 1u) && s >= 3;",
        ),
        (
            "the blank's occupancies counted once",
            "        for (u32 j = s; j < states; j += 2)  // the states of one parity",
            "        for (u32 j = s; j < s + 1; j += 2)  // the states of one parity",
        ),
    ];
    let small = cases();
    let cases = [small[0].clone(), small[2].clone(), small[4].clone()];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(5)];
    assert_broken_copies_caught("CTC", &mutants, |module| check_all(module, &cases, &orders));
}
