//! The CUDA kernels of the fused ops (`candle_bleu::loss::fused::cuda`), built with
//! `--features cuda` (see docs/gpu.md for the toolchain and the commands).
//!
//! Without a GPU: NVRTC compiles the kernel source to PTX for every kernel and dtype (NVRTC needs
//! its library, not a GPU). With one (`Device::new_cuda(0)` succeeds): every kernel, forward and
//! backward, against the CPU ops on the same inputs; otherwise those tests print a note and pass.
#![cfg(feature = "cuda")]

use candle_bleu::loss::fused::{self, cuda};
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
fn nvrtc_compiles_every_kernel_for_every_dtype() -> Result<()> {
    let mut expected = cuda::kernel_names();
    expected.sort();
    assert_eq!(expected.len(), 24);
    for arch in [cuda::DEFAULT_ARCH, "compute_90"] {
        let ptx = cuda::compile_ptx(arch)?;
        let mut entries = ptx_entries(&ptx);
        entries.sort();
        assert_eq!(entries, expected, "PTX entries for {arch}");
        let target = ptx
            .lines()
            .find(|line| line.starts_with(".target"))
            .unwrap_or("(no .target line)");
        println!(
            "NVRTC {arch}: {} bytes of PTX, {} entries, {target}",
            ptx.len(),
            entries.len()
        );
    }
    Ok(())
}

#[test]
fn nvrtc_reports_compile_errors_as_candle_errors() {
    // Compile errors must come back as errors naming the source, never as a panic.
    let error = cuda::compile_ptx("compute_0").expect_err("an invalid architecture must fail");
    assert!(error.to_string().contains("fused.cu"), "{error}");
}

#[test]
fn kernels_are_off_unless_opted_in_with_exactly_1() {
    assert!(!cuda::enabled_by(None));
    assert!(!cuda::enabled_by(Some("0")));
    assert!(!cuda::enabled_by(Some("")));
    assert!(!cuda::enabled_by(Some("true")));
    assert!(cuda::enabled_by(Some("1")));
}

/// The CUDA device with the kernels switched on, or `None` (with a note) without a GPU.
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(device) => {
            // Every test in this file that touches the GPU wants the kernels: set, never unset.
            std::env::set_var(cuda::ENABLE_VAR, "1");
            Some(device)
        }
        Err(error) => {
            // The first line only: candle appends a backtrace when RUST_BACKTRACE is set.
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
        Ok(vec![fused::softmax_gather(l, i)?])
    }),
    ("softmax_last_dim", |l, _| {
        Ok(vec![fused::softmax_last_dim(l)?])
    }),
    ("softmax_self_match_gather", |l, i| {
        let (z, x) = fused::softmax_self_match_gather(l, i)?;
        Ok(vec![z, x])
    }),
];

/// Shapes with a vocabulary below one warp, between a warp and a block, and over several blocks.
const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 3, 7, 4), (2, 5, 300, 6), (3, 4, 2_053, 9)];

#[test]
fn kernels_match_the_cpu_ops_in_f32_and_f64() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    for (dtype, tolerance) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
        for (batch, seq, vocab, width) in SHAPES {
            let (logits, ids) = inputs(batch, seq, vocab, width)?;
            let logits = logits.to_dtype(dtype)?;
            for (name, op) in OPS {
                let (cpu_out, cpu_grad) = run(op, &logits, &ids, &Device::Cpu)?;
                let (gpu_out, gpu_grad) = run(op, &logits, &ids, &gpu)?;
                for (c, g) in cpu_out.iter().zip(&gpu_out) {
                    assert_eq!(g.dtype(), dtype, "{name} output dtype");
                    let diff = max_abs_diff(c, g)?;
                    assert!(diff < tolerance, "{name} {dtype:?} {vocab}: forward {diff}");
                }
                let diff = max_abs_diff(&cpu_grad, &gpu_grad)?;
                assert!(
                    diff < tolerance,
                    "{name} {dtype:?} {vocab}: gradient {diff}"
                );
                println!(
                    "{name} {dtype:?} [{batch},{seq},{vocab}] K={width}: ok (grad diff {diff:.1e})"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn half_precision_logits_match_the_f32_cpu_ops() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let (batch, seq, vocab, width) = (2, 5, 1_000, 6);
    for dtype in [DType::BF16, DType::F16] {
        let (logits, ids) = inputs(batch, seq, vocab, width)?;
        // The CPU reference sees exactly the values the kernel reads.
        let rounded = logits.to_dtype(dtype)?.to_dtype(DType::F32)?;
        let (cpu_out, _) = run(OPS[0].1, &rounded, &ids, &Device::Cpu)?;
        let (gpu_out, gpu_grad) = run(OPS[0].1, &logits.to_dtype(dtype)?, &ids, &gpu)?;
        // softmax_gather accumulates in f32 and returns f32; its gradient has the logits' dtype.
        assert_eq!(gpu_out[0].dtype(), DType::F32);
        assert_eq!(gpu_grad.dtype(), dtype);
        let diff = max_abs_diff(&cpu_out[0], &gpu_out[0])?;
        assert!(diff < 1e-6, "softmax_gather {dtype:?}: forward {diff}");
        for (name, op) in &OPS[1..] {
            let (cpu_out, _) = run(*op, &rounded, &ids, &Device::Cpu)?;
            let (gpu_out, _) = run(*op, &logits.to_dtype(dtype)?, &ids, &gpu)?;
            for (c, g) in cpu_out.iter().zip(&gpu_out) {
                assert_eq!(g.dtype(), dtype, "{name} output dtype");
                // One rounding of a probability ≤ 1 to 8 (bf16) or 11 (f16) bits, plus cuBLAS's
                // half-precision matmul for Z.
                let diff = max_abs_diff(c, g)?;
                assert!(diff < 1e-2, "{name} {dtype:?}: forward {diff}");
            }
        }
        println!("{dtype:?}: ok");
    }
    Ok(())
}

#[test]
fn kernels_match_the_composed_candle_ops_on_the_gpu() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let (logits, ids) = inputs(2, 6, 4_099, 5)?;
    let logits = logits.to_device(&gpu)?;
    let ids = ids.to_device(&gpu)?;
    let (batch, seq, _) = logits.dims3()?;
    let probs = candle_nn::ops::softmax(&logits, candle_core::D::Minus1)?;
    let index = ids
        .unsqueeze(1)?
        .broadcast_as((batch, seq, ids.dim(1)?))?
        .contiguous()?;
    let composed_gather = probs.gather(&index, 2)?;
    let composed_self = probs.matmul(&probs.t()?)?;
    let diff = max_abs_diff(&composed_gather, &fused::softmax_gather(&logits, &ids)?)?;
    assert!(diff < 1e-12, "softmax_gather vs composed: {diff}");
    let diff = max_abs_diff(&probs, &fused::softmax_last_dim(&logits)?)?;
    assert!(diff < 1e-12, "softmax_last_dim vs composed: {diff}");
    let (z, x) = fused::softmax_self_match_gather(&logits, &ids)?;
    assert!(max_abs_diff(&composed_self, &z)? < 1e-12);
    assert!(max_abs_diff(&composed_gather, &x)? < 1e-12);
    Ok(())
}

#[test]
fn a_non_finite_logit_gives_nan_outputs_on_its_row_only() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let (logits, ids) = inputs(1, 3, 500, 4)?;
    let mut values = logits.flatten_all()?.to_vec1::<f64>()?;
    values[500 + 17] = f64::NAN; // row 1
    let logits = Tensor::from_vec(values, (1, 3, 500), &gpu)?;
    let out = fused::softmax_gather(&logits, &ids.to_device(&gpu)?)?;
    let rows = out.squeeze(0)?.to_vec2::<f64>()?;
    assert!(rows[0].iter().all(|v| v.is_finite()));
    assert!(rows[1].iter().all(|v| v.is_nan()));
    assert!(rows[2].iter().all(|v| v.is_finite()));
    Ok(())
}
