//! The CUDA kernels of the loss's row op (`src/loss/kernels/cuda.rs`, `kernels.cu`), built with
//! `--features cuda` (see docs/gpu.md for the toolchain and the commands).
//!
//! Without a GPU: NVRTC compiles the kernel source to PTX for two architectures (NVRTC needs its
//! library, not a GPU). With one (`Device::new_cuda(0)` succeeds): every pass, forward and
//! backward, with the kernels switched on (`set_cuda_kernels(true)`), against the CPU kernels on
//! the same inputs, and a cross-entropy + BLEU training loss against the CPU; otherwise those
//! tests print a note and pass. The kernel switch is process-wide and one test flips it: run
//! this binary with `--test-threads=1`.
#![cfg(feature = "cuda")]

use candle_bleu::loss::{self, testing};
use candle_core::{DType, Device, Result, Tensor, Var};

/// The `.entry` names of a PTX module.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| {
            let rest = line.trim().split(".entry ").nth(1)?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect()
}

#[test]
fn nvrtc_compiles_every_kernel_for_f32_and_f64() -> Result<()> {
    for capability in [(7, 5), (9, 0)] {
        let ptx = testing::cuda_ptx(capability)?;
        let entries = ptx_entries(&ptx);
        assert_eq!(
            entries.len(),
            10,
            "PTX entries for {capability:?}: {entries:?}"
        );
    }
    assert!(testing::cuda_ptx((0, 0)).is_err());
    Ok(())
}

#[test]
fn kernels_are_off_by_default() {
    assert!(!loss::cuda_kernels_enabled());
}

/// The CUDA device with the kernels switched on, or `None` (with a note) without a GPU.
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(device) => {
            loss::set_cuda_kernels(true);
            Some(device)
        }
        Err(error) => {
            let reason = error.to_string();
            let reason = reason.lines().next().unwrap_or_default();
            println!("SKIPPED (no CUDA device): {reason}");
            None
        }
    }
}

/// Deterministic logits `[B, S, V]` spread over about ±6, and ids `[B, K]` with repeats.
fn inputs(batch: usize, seq: usize, vocab: usize, width: usize) -> Result<(Tensor, Tensor)> {
    let logits: Vec<f64> = (0..batch * seq * vocab)
        .map(|i| 6.0 * ((i as f64 * 0.618_033_988_7).fract() * 2.0 - 1.0))
        .collect();
    let mut ids: Vec<u32> = (0..batch * width)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    if width >= 3 {
        ids[2] = ids[0]; // a repeated id in the first row
    }
    Ok((
        Tensor::from_vec(logits, (batch, seq, vocab), &Device::Cpu)?,
        Tensor::from_vec(ids, (batch, width), &Device::Cpu)?,
    ))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    a.sub(&b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
}

/// Outputs and the logits gradient of `sum(outputs ⊙ weights)` for `op` on `device`.
fn run<F>(op: F, logits: &Tensor, ids: &Tensor, device: &Device) -> Result<(Vec<Tensor>, Tensor)>
where
    F: Fn(&Tensor, &Tensor) -> Result<Vec<Tensor>>,
{
    let logits = Var::from_tensor(&logits.to_device(device)?)?;
    let ids = ids.to_device(device)?;
    let outputs = op(logits.as_tensor(), &ids)?;
    let mut objective = Tensor::zeros((), DType::F64, device)?;
    for (index, out) in outputs.iter().enumerate() {
        // Fixed, different weights per output element, so every gradient path is exercised.
        let count = out.elem_count();
        let weights: Vec<f64> = (0..count)
            .map(|i| ((i * 31 + index * 17) % 11) as f64 / 11.0 - 0.4)
            .collect();
        let weights = Tensor::from_vec(weights, out.shape(), device)?.to_dtype(out.dtype())?;
        let term = out.mul(&weights)?.sum_all()?.to_dtype(DType::F64)?;
        objective = objective.add(&term)?;
    }
    let grads = objective.backward()?;
    let Some(grad) = grads.get(logits.as_tensor()) else {
        candle_core::bail!("no gradient reached the logits")
    };
    Ok((outputs, grad.clone()))
}

type Op = fn(&Tensor, &Tensor) -> Result<Vec<Tensor>>;

const OPS: [(&str, Op); 3] = [
    ("softmax_gather", |l, i| {
        Ok(vec![testing::softmax_gather(l, i)?])
    }),
    ("softmax_last_dim", |l, _| {
        Ok(vec![testing::softmax_last_dim(l)?])
    }),
    ("softmax_self_match_gather", |l, i| {
        let (z, x) = testing::softmax_self_match_gather(l, i)?;
        Ok(vec![z, x])
    }),
];

/// Shapes with a vocabulary below one warp, between a warp and a block, and over several blocks.
const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 3, 7, 4), (2, 5, 300, 6), (3, 4, 2_053, 9)];

#[test]
fn kernels_match_the_cpu_ops_in_f32_and_f64() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    for (batch, seq, vocab, width) in SHAPES {
        let (logits, ids) = inputs(batch, seq, vocab, width)?;
        for dtype in [DType::F32, DType::F64] {
            let logits = logits.to_dtype(dtype)?;
            for (name, op) in OPS {
                let (cpu_out, cpu_grad) = run(op, &logits, &ids, &Device::Cpu)?;
                let (gpu_out, gpu_grad) = run(op, &logits, &ids, &gpu)?;
                let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
                for (a, b) in cpu_out.iter().zip(&gpu_out) {
                    let diff = max_abs_diff(a, b)?;
                    assert!(
                        diff < tol,
                        "{name} {dtype:?} {vocab}: outputs differ by {diff}"
                    );
                }
                let diff = max_abs_diff(&cpu_grad, &gpu_grad)?;
                assert!(
                    diff < tol,
                    "{name} {dtype:?} {vocab}: gradients differ by {diff}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn training_loss_matches_the_cpu() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let (logits, _) = inputs(2, 5, 300, 0)?;
    let targets = Tensor::new(&[[1u32, 2, 3, 0, 0], [5, 6, 7, 8, 9]], &Device::Cpu)?;
    for form in [loss::Form::Expected, loss::Form::Paired] {
        let cfg = loss::TrainingLossConfig {
            ce: loss::CrossEntropyConfig {
                pad_id: Some(0),
                label_smoothing: 0.1,
            },
            bleu: loss::BleuLossConfig {
                form,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut results = Vec::new();
        for device in [Device::Cpu, gpu.clone()] {
            let x = Var::from_tensor(&logits.to_device(&device)?)?;
            let t = targets.to_device(&device)?;
            let refs = loss::References::from_ids(&t, 0)?;
            let out = loss::ce_bleu_from_logits(x.as_tensor(), None, &refs, &t, &cfg)?;
            let grad = out.loss.backward()?.get(&x).unwrap().clone();
            results.push((out.loss, grad));
        }
        assert!(
            max_abs_diff(&results[0].0, &results[1].0)? < 1e-12,
            "{form:?} loss"
        );
        assert!(
            max_abs_diff(&results[0].1, &results[1].1)? < 1e-12,
            "{form:?} gradient"
        );
    }
    Ok(())
}

/// Largest `|a − b|` over `max |a|` (1 where `a` is all zeros), both read in f64 on the host.
fn relative_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let scale = a.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    Ok(max_abs_diff(&a, b)? / if scale > 0.0 { scale } else { 1.0 })
}

/// Cross-entropy (`form` = `None`) or cross-entropy + BLEU of `logits` against `targets`
/// (padding 0, label smoothing 0.1; the targets are the references).
fn training_loss(logits: &Tensor, targets: &Tensor, form: Option<loss::Form>) -> Result<Tensor> {
    let ce = loss::CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
    };
    match form {
        None => loss::cross_entropy_from_logits(logits, targets, &ce),
        Some(form) => {
            let refs = loss::References::from_ids(targets, 0)?;
            let cfg = loss::TrainingLossConfig {
                ce,
                bleu: loss::BleuLossConfig {
                    form,
                    ..Default::default()
                },
                ..Default::default()
            };
            Ok(loss::ce_bleu_from_logits(logits, None, &refs, targets, &cfg)?.loss)
        }
    }
}

/// [`training_loss`] on `device`: its value and the gradient of `logits`.
fn training_step(
    logits: &Tensor,
    targets: &Tensor,
    form: Option<loss::Form>,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let x = Var::from_tensor(&logits.to_device(device)?)?;
    let value = training_loss(x.as_tensor(), &targets.to_device(device)?, form)?;
    let grad = value.backward()?.get(&x).unwrap().clone();
    Ok((value, grad))
}

/// Targets `[B, S]` with padding at the end of every second row and repeated ids.
fn targets(batch: usize, seq: usize, vocab: usize) -> Result<Tensor> {
    let ids: Vec<u32> = (0..batch * seq)
        .map(|i| {
            let (b, s) = (i / seq, i % seq);
            if b % 2 == 1 && s + 2 >= seq {
                0
            } else {
                1 + ((i * 37 + 5) % (vocab - 1)) as u32
            }
        })
        .collect();
    Tensor::from_vec(ids, (batch, seq), &Device::Cpu)
}

const FORMS: [Option<loss::Form>; 4] = [
    None,
    Some(loss::Form::Expected),
    Some(loss::Form::LowerBound),
    Some(loss::Form::Paired),
];

/// f16 and bf16 logits: the GPU (kernels on) against the CPU in f32 on the same rounded
/// values. The loss is computed in f32 on both; the gradient comes back in the logits' dtype,
/// rounded once.
#[test]
fn half_precision_logits_match_the_cpu_in_f32() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    for (batch, seq, vocab, _) in SHAPES {
        let (logits, _) = inputs(batch, seq, vocab, 0)?;
        let targets = targets(batch, seq, vocab)?;
        for (dtype, grad_tol) in [(DType::F16, 2e-3), (DType::BF16, 1e-2)] {
            let half = logits.to_dtype(dtype)?;
            for form in FORMS {
                let (cpu_value, cpu_grad) =
                    training_step(&half.to_dtype(DType::F32)?, &targets, form, &Device::Cpu)?;
                let (gpu_value, gpu_grad) = training_step(&half, &targets, form, &gpu)?;
                assert_eq!(
                    gpu_grad.dtype(),
                    dtype,
                    "{form:?} {dtype:?}: gradient dtype"
                );
                let value_diff = relative_diff(&cpu_value, &gpu_value)?;
                assert!(
                    value_diff < 1e-5,
                    "{form:?} {dtype:?} V={vocab}: loss differs by {value_diff} (relative)"
                );
                let grad_diff = relative_diff(&cpu_grad, &gpu_grad)?;
                assert!(
                    grad_diff < grad_tol,
                    "{form:?} {dtype:?} V={vocab}: gradient differs by {grad_diff} (relative)"
                );
            }
        }
    }
    Ok(())
}

/// The `[B, S, V]` view of a larger tensor: `"offset"`, elements 1.. of a `[B + 1, S, V]`
/// tensor (contiguous, with a start offset); `"strided"`, elements 1.., positions 2.. and
/// tokens 3.. of a `[B + 1, S + 2, V + 5]` tensor (a row stride wider than `V`).
fn view(kind: &str, big: &Tensor, (batch, seq, vocab): (usize, usize, usize)) -> Result<Tensor> {
    let rows = big.narrow(0, 1, batch)?;
    match kind {
        "offset" => Ok(rows),
        _ => rows.narrow(1, 2, seq)?.narrow(2, 3, vocab),
    }
}

/// The larger tensor [`view`] takes its `kind` of view from.
fn big_logits(kind: &str, (batch, seq, vocab): (usize, usize, usize)) -> Result<Tensor> {
    let (logits, _) = match kind {
        "offset" => inputs(batch + 1, seq, vocab, 0)?,
        _ => inputs(batch + 1, seq + 2, vocab + 5, 0)?,
    };
    Ok(logits)
}

/// Logits and ids that are views into larger tensors — a start offset and a row stride wider
/// than `V` — give on the GPU what their contiguous copies give on the CPU: the kernel ops'
/// outputs and logits gradients, and the training losses with their gradients.
#[test]
fn narrowed_and_offset_inputs_match_contiguous_ones() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let (batch, seq, vocab, width) = (3, 4, 300, 6);
    let dims = (batch, seq, vocab);
    // Ids `[B + 1, K + 2]`, all below V; the view takes rows 1.. and columns 2..
    let big_ids: Vec<u32> = (0..(batch + 1) * (width + 2))
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let big_ids = Tensor::from_vec(big_ids, (batch + 1, width + 2), &Device::Cpu)?;
    let ids = big_ids.narrow(0, 1, batch)?.narrow(1, 2, width)?;
    let targets = Tensor::cat(&[&ids, &ids], 1)?
        .narrow(1, 0, seq)?
        .contiguous()?;
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        for kind in ["offset", "strided"] {
            let big_logits = big_logits(kind, dims)?.to_dtype(dtype)?;
            let contiguous = view(kind, &big_logits, dims)?.contiguous()?;
            // The kernel ops, on a view of the GPU tensor, with ids that are a view too.
            for (name, op) in OPS {
                let (cpu_out, cpu_grad) = run(op, &contiguous, &ids.contiguous()?, &Device::Cpu)?;
                let big = Var::from_tensor(&big_logits.to_device(&gpu)?)?;
                let gpu_ids = big_ids
                    .to_device(&gpu)?
                    .narrow(0, 1, batch)?
                    .narrow(1, 2, width)?;
                let outputs = op(&view(kind, big.as_tensor(), dims)?, &gpu_ids)?;
                let mut objective = Tensor::zeros((), DType::F64, &gpu)?;
                for (index, out) in outputs.iter().enumerate() {
                    let weights: Vec<f64> = (0..out.elem_count())
                        .map(|i| ((i * 31 + index * 17) % 11) as f64 / 11.0 - 0.4)
                        .collect();
                    let weights =
                        Tensor::from_vec(weights, out.shape(), &gpu)?.to_dtype(out.dtype())?;
                    objective =
                        objective.add(&out.mul(&weights)?.sum_all()?.to_dtype(DType::F64)?)?;
                }
                let big_grad = objective.backward()?.get(&big).unwrap().clone();
                for (a, b) in cpu_out.iter().zip(&outputs) {
                    let diff = max_abs_diff(a, b)?;
                    assert!(
                        diff < tol,
                        "{name} {dtype:?} {kind}: outputs differ by {diff}"
                    );
                }
                let diff = max_abs_diff(&cpu_grad, &view(kind, &big_grad, dims)?)?;
                assert!(
                    diff < tol,
                    "{name} {dtype:?} {kind}: gradients differ by {diff}"
                );
            }
            // The training losses on the view.
            for form in FORMS {
                let (cpu_value, cpu_grad) =
                    training_step(&contiguous, &targets, form, &Device::Cpu)?;
                let big = Var::from_tensor(&big_logits.to_device(&gpu)?)?;
                let logits = view(kind, big.as_tensor(), dims)?;
                let t = targets.to_device(&gpu)?;
                let value = training_loss(&logits, &t, form)?;
                let big_grad = value.backward()?.get(&big).unwrap().clone();
                let value_diff = max_abs_diff(&cpu_value, &value)?;
                let grad_diff = max_abs_diff(&cpu_grad, &view(kind, &big_grad, dims)?)?;
                assert!(
                    value_diff < tol && grad_diff < tol,
                    "{form:?} {dtype:?} {kind}: loss differs by {value_diff}, gradient by {grad_diff}"
                );
            }
        }
    }
    Ok(())
}

/// The hidden-state entry points on the GPU against the logits path on the GPU and against
/// themselves on the CPU: values and the gradients of `hidden`, the weight and the bias.
#[test]
fn hidden_state_functions_on_cuda_match_the_logits_path() -> Result<()> {
    use candle_core::Module;
    let Some(gpu) = gpu() else { return Ok(()) };
    let (batch, seq, dim, vocab) = (3, 5, 16, 300);
    let spread = |count: usize, scale: f64, phase: f64| -> Vec<f64> {
        (0..count)
            .map(|i| scale * (((i as f64 + phase) * 0.754_877_666).fract() * 2.0 - 1.0))
            .collect()
    };
    let targets = targets(batch, seq, vocab)?;
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        let hidden = Tensor::from_vec(
            spread(batch * seq * dim, 1.5, 0.3),
            (batch, seq, dim),
            &Device::Cpu,
        )?
        .to_dtype(dtype)?;
        let weight = Tensor::from_vec(spread(vocab * dim, 1.0, 0.7), (vocab, dim), &Device::Cpu)?
            .to_dtype(dtype)?;
        let bias =
            Tensor::from_vec(spread(vocab, 0.5, 0.1), vocab, &Device::Cpu)?.to_dtype(dtype)?;
        for form in FORMS {
            // (value, [d hidden, d weight, d bias]) per (device, path).
            let mut results = Vec::new();
            for (device, from_hidden) in [(&gpu, true), (&gpu, false), (&Device::Cpu, true)] {
                let h = Var::from_tensor(&hidden.to_device(device)?)?;
                let w = Var::from_tensor(&weight.to_device(device)?)?;
                let b = Var::from_tensor(&bias.to_device(device)?)?;
                let proj =
                    candle_nn::Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
                let t = targets.to_device(device)?;
                let refs = loss::References::from_ids(&t, 0)?;
                let ce = loss::CrossEntropyConfig {
                    pad_id: Some(0),
                    label_smoothing: 0.1,
                };
                // Small blocks, so that the GPU runs the blocked loop more than once.
                let hidden_cfg = loss::HiddenConfig {
                    block_elements: 2 * vocab * seq,
                    ..Default::default()
                };
                let value = match (form, from_hidden) {
                    (None, true) => {
                        loss::cross_entropy_from_hidden(h.as_tensor(), &proj, &t, &ce, &hidden_cfg)?
                    }
                    (None, false) => {
                        loss::cross_entropy_from_logits(&proj.forward(h.as_tensor())?, &t, &ce)?
                    }
                    (Some(form), _) => {
                        let cfg = loss::TrainingLossConfig {
                            ce,
                            bleu: loss::BleuLossConfig {
                                form,
                                ..Default::default()
                            },
                            hidden: hidden_cfg,
                            ..Default::default()
                        };
                        if from_hidden {
                            loss::ce_bleu_from_hidden(h.as_tensor(), &proj, None, &refs, &t, &cfg)?
                                .loss
                        } else {
                            let logits = proj.forward(h.as_tensor())?;
                            loss::ce_bleu_from_logits(&logits, None, &refs, &t, &cfg)?.loss
                        }
                    }
                };
                let grads = value.backward()?;
                let grads: Vec<Tensor> = [&h, &w, &b]
                    .iter()
                    .map(|v| grads.get(v.as_tensor()).unwrap().clone())
                    .collect();
                results.push((value, grads));
            }
            for (other, label) in [(1, "the logits path on the GPU"), (2, "the CPU")] {
                let value_diff = relative_diff(&results[other].0, &results[0].0)?;
                assert!(
                    value_diff < tol,
                    "{form:?} {dtype:?}: hidden path on the GPU vs {label}: loss differs by {value_diff}"
                );
                for (which, (a, b)) in ["hidden", "weight", "bias"]
                    .iter()
                    .zip(results[other].1.iter().zip(&results[0].1))
                {
                    let diff = relative_diff(a, b)?;
                    assert!(
                        diff < tol,
                        "{form:?} {dtype:?}: hidden path on the GPU vs {label}: d {which} differs by {diff}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// The kernels against the composed candle ops, both on the GPU (the two paths a CUDA user can
/// get), for every form and the cross-entropy, in f32 and f64.
#[test]
fn kernels_match_the_composed_path_on_the_gpu() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    for (batch, seq, vocab, _) in SHAPES {
        let (logits, _) = inputs(batch, seq, vocab, 0)?;
        let targets = targets(batch, seq, vocab)?;
        for dtype in [DType::F32, DType::F64] {
            let logits = logits.to_dtype(dtype)?;
            let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            for form in FORMS {
                loss::set_cuda_kernels(false);
                let composed = training_step(&logits, &targets, form, &gpu);
                loss::set_cuda_kernels(true);
                let (composed_value, composed_grad) = composed?;
                let (kernel_value, kernel_grad) = training_step(&logits, &targets, form, &gpu)?;
                let value_diff = relative_diff(&composed_value, &kernel_value)?;
                let grad_diff = relative_diff(&composed_grad, &kernel_grad)?;
                assert!(
                    value_diff < tol && grad_diff < tol,
                    "{form:?} {dtype:?} V={vocab}: kernels vs composed: loss {value_diff}, gradient {grad_diff} (relative)"
                );
            }
        }
    }
    Ok(())
}
