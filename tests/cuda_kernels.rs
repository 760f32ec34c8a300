//! The CUDA kernels of the loss's row op (`src/loss/kernels/cuda.rs`, `kernels.cu`), built with
//! `--features cuda` (see docs/gpu.md for the toolchain and the commands).
//!
//! Without a GPU: NVRTC compiles the kernel source to PTX for two architectures (NVRTC needs its
//! library, not a GPU). With one (`Device::new_cuda(0)` succeeds): every pass, forward and
//! backward, with the kernels switched on (`set_cuda_kernels(true)`), against the CPU kernels on
//! the same inputs, and a cross-entropy + BLEU training loss against the CPU; otherwise those
//! tests print a note and pass.
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
