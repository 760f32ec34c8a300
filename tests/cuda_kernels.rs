//! The loss on a CUDA GPU, against the CPU and against its composed reference. On a GPU
//! (docs/gpu.md):
//!
//! ```text
//! scripts/build-cuda.sh test --release --features cuda --test cuda_kernels
//! ```
//!
//! With `cuda` the fast functions (`bleu_loss_from_logits`, `cross_entropy_from_logits`,
//! `ce_bleu_from_logits`) run the crate's CUDA kernels (`src/loss/kernels/cuda.rs`,
//! `kernels.cu`) on CUDA tensors; their `_composed` references run composed candle ops. Against
//! the CPU the tests check the kernels on the GPU; kernels against composed ops compare the fast
//! functions with the `_composed` ones on the same GPU; [`the_kernels_run_on_cuda`] checks that
//! the kernels, not the composed ops, ran. (Until 2026-11-27 the kernels were opt-in, the
//! `cuda-kernels` feature, and this file ran from both builds on an H200: 6/6 each.)
//!
//! The passes of the row op are reached through the entry points that run them ([`Entry`]):
//! the cross-entropy and the expected and lower-bound forms with id references run the row pass
//! (gathering at the ids), the paired form with id references the self-match pass, matrix
//! references (`References::from_matrices`) the softmax pass.
//!
//! Without a GPU (`Device::new_cuda(0)` fails, e.g. on the link stub of
//! `scripts/cuda-toolchain.sh`) every test prints `SKIPPED (no CUDA device)` and passes. The
//! NVRTC compile of the kernels, which needs libnvrtc but no GPU, is a unit test of the library:
//! `scripts/build-cuda.sh test --release --features cuda --lib kernels::cuda`. The GPU
//! tests take one lock, so they run one at a time whatever `--test-threads` says (one of them
//! reads the device memory pool's high-water mark).
#![cfg(feature = "cuda")]

use candle_bleu::loss::{
    self, BleuLossConfig, CrossEntropyConfig, Form, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Result, Tensor, Var};
use std::sync::{Mutex, MutexGuard};

/// The CUDA device and the lock every GPU test holds, or `None` (with a note) without a GPU.
fn gpu() -> Option<(MutexGuard<'static, ()>, Device)> {
    static LOCK: Mutex<()> = Mutex::new(());
    let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match Device::new_cuda(0) {
        Ok(device) => Some((lock, device)),
        Err(error) => {
            let reason = error.to_string();
            let reason = reason.lines().next().unwrap_or_default();
            println!("SKIPPED (no CUDA device): {reason}");
            None
        }
    }
}

/// Deterministic logits `[B, S, V]` spread over about ±6, and reference ids `[B, K]` in
/// `1..V`, with a repeated id in the first row and one trailing padding id (0) in every second
/// row.
fn inputs(batch: usize, seq: usize, vocab: usize, width: usize) -> Result<(Tensor, Tensor)> {
    let logits: Vec<f64> = (0..batch * seq * vocab)
        .map(|i| 6.0 * ((i as f64 * 0.618_033_988_7).fract() * 2.0 - 1.0))
        .collect();
    let mut ids: Vec<u32> = (0..batch * width)
        .map(|i| 1 + ((i * 7919 + 13) % (vocab - 1)) as u32)
        .collect();
    if width >= 3 {
        ids[2] = ids[0];
    }
    for b in (1..batch).step_by(2) {
        ids[b * width + width - 1] = 0;
    }
    Ok((
        Tensor::from_vec(logits, (batch, seq, vocab), &Device::Cpu)?,
        Tensor::from_vec(ids, (batch, width), &Device::Cpu)?,
    ))
}

/// Cross-entropy targets `[B, S]` in `1..V`, with padding (0) at the end of every second row
/// and repeated ids.
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

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    a.sub(&b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
}

/// Largest `|a − b|` over `max |a|` (1 where `a` is all zeros), both read in f64 on the host.
fn relative_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let scale = a.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    Ok(max_abs_diff(&a, b)? / if scale > 0.0 { scale } else { 1.0 })
}

/// Relative tolerance of the outputs (computed in f32 for f16 and bf16 logits) and of the
/// logits gradient (returned in the logits' dtype, rounded once).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-10, 1e-10),
        DType::F16 => (1e-4, 2e-3),
        DType::BF16 => (1e-4, 1e-2),
        _ => (1e-4, 1e-4),
    }
}

/// A public entry point over the logits, and the pass of the row op it runs.
#[derive(Debug, Clone, Copy)]
enum Entry {
    /// `cross_entropy_from_logits`: the row pass with the cross-entropy columns only.
    CrossEntropy,
    /// `bleu_loss_from_logits` with id references: the row pass gathering at the ids
    /// (`Expected`, `LowerBound`) or the self-match pass (`Paired`).
    Bleu(Form),
    /// `bleu_loss_from_logits` with matrix references: the softmax pass.
    BleuMatrices(Form),
    /// `ce_bleu_from_logits`: the row or self-match pass with the gathered ids and the
    /// cross-entropy columns together.
    CeBleu(Form),
}

const ENTRIES: [Entry; 9] = [
    Entry::CrossEntropy,
    Entry::Bleu(Form::Expected),
    Entry::Bleu(Form::LowerBound),
    Entry::Bleu(Form::Paired),
    Entry::BleuMatrices(Form::Expected),
    Entry::BleuMatrices(Form::Paired),
    Entry::CeBleu(Form::Expected),
    Entry::CeBleu(Form::LowerBound),
    Entry::CeBleu(Form::Paired),
];

/// Which function of an entry point runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    /// `bleu_loss_from_logits`, …: the CPU kernels on the CPU, the CUDA kernels on CUDA.
    Fast,
    /// `bleu_loss_from_logits_composed`, …: composed candle ops everywhere.
    Composed,
}

/// One-hot reference matrices `[B, K, V]` (f32) of `ids`, with lengths `[B]` that end every
/// second row's reference one row early (where [`inputs`] put its padding id).
fn matrix_references(ids: &Tensor, vocab: usize) -> Result<References> {
    let (batch, width) = ids.dims2()?;
    let columns = Tensor::arange(0u32, vocab as u32, ids.device())?.reshape((1, 1, vocab))?;
    let one_hot = ids
        .unsqueeze(2)?
        .broadcast_eq(&columns)?
        .to_dtype(DType::F32)?;
    let lengths: Vec<u32> = (0..batch).map(|b| (width - b % 2) as u32).collect();
    References::from_matrices(&one_hot, &Tensor::from_vec(lengths, batch, ids.device())?)
}

/// `entry`'s differentiable outputs on `logits`, against references `ids` (u32 `[B, K]`,
/// padding 0) and cross-entropy `targets` (u32 `[B, S]`, padding 0, label smoothing 0.1), all
/// on one device: the loss, then the cross-entropy term and the clipped matches `[B, N]` where
/// the entry has them.
fn evaluate(
    entry: Entry,
    function: Function,
    logits: &Tensor,
    ids: &Tensor,
    targets: &Tensor,
) -> Result<Vec<Tensor>> {
    let composed = function == Function::Composed;
    let ce = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        ..Default::default()
    };
    let bleu = |form| BleuLossConfig {
        form,
        ..Default::default()
    };
    match entry {
        Entry::CrossEntropy => Ok(vec![if composed {
            loss::cross_entropy_from_logits_composed(logits, targets, &ce)?.loss
        } else {
            loss::cross_entropy_from_logits(logits, targets, &ce)?.loss
        }]),
        Entry::Bleu(form) | Entry::BleuMatrices(form) => {
            let refs = match entry {
                Entry::BleuMatrices(_) => matrix_references(ids, logits.dim(2)?)?,
                _ => References::from_ids(ids, 0)?,
            };
            let out = if composed {
                loss::bleu_loss_from_logits_composed(logits, None, &refs, &bleu(form))?
            } else {
                loss::bleu_loss_from_logits(logits, None, &refs, &bleu(form))?
            };
            Ok(vec![out.loss, out.stats.matches])
        }
        Entry::CeBleu(form) => {
            let refs = References::from_ids(ids, 0)?;
            let cfg = TrainingLossConfig {
                ce,
                bleu: bleu(form),
                ..Default::default()
            };
            let targets = TrainingTargets::new(targets, &refs);
            let out = if composed {
                loss::ce_bleu_from_logits_composed(logits, &targets, &cfg)?
            } else {
                loss::ce_bleu_from_logits(logits, &targets, &cfg)?
            };
            Ok(vec![out.loss, out.cross_entropy, out.bleu.stats.matches])
        }
    }
}

/// [`evaluate`] on `view(logits)` with the inputs on `var`'s device: the outputs and the
/// gradient of `var` for `sum_i sum(outputs_i ⊙ w_i)`, with fixed weights that differ per
/// element and output, so that every column of the pass carries a gradient.
fn step(
    entry: Entry,
    function: Function,
    var: &Var,
    view: impl Fn(&Tensor) -> Result<Tensor>,
    ids: &Tensor,
    targets: &Tensor,
) -> Result<(Vec<Tensor>, Tensor)> {
    let device = var.device();
    let logits = view(var.as_tensor())?;
    let outputs = evaluate(
        entry,
        function,
        &logits,
        &ids.to_device(device)?,
        &targets.to_device(device)?,
    )?;
    let mut objective = Tensor::zeros((), DType::F64, device)?;
    for (index, out) in outputs.iter().enumerate() {
        let weights: Vec<f64> = (0..out.elem_count())
            .map(|i| 1.0 + ((i * 31 + index * 17) % 11) as f64 / 11.0 - 0.4)
            .collect();
        let weights = Tensor::from_vec(weights, out.shape(), device)?.to_dtype(out.dtype())?;
        objective = objective.add(&out.mul(&weights)?.sum_all()?.to_dtype(DType::F64)?)?;
    }
    let grads = objective.backward()?;
    let Some(grad) = grads.get(var.as_tensor()) else {
        candle_core::bail!("{entry:?}: no gradient reached the logits")
    };
    Ok((outputs, grad.clone()))
}

/// [`step`] on `logits` moved to `device`.
fn step_on(
    entry: Entry,
    function: Function,
    logits: &Tensor,
    ids: &Tensor,
    targets: &Tensor,
    device: &Device,
) -> Result<(Vec<Tensor>, Tensor)> {
    let var = Var::from_tensor(&logits.to_device(device)?)?;
    step(entry, function, &var, |l| Ok(l.clone()), ids, targets)
}

/// Asserts that two [`step`] results agree within `(output, gradient)` tolerances relative to
/// the largest entry of each of `expected`'s tensors.
fn assert_close(
    expected: &(Vec<Tensor>, Tensor),
    actual: &(Vec<Tensor>, Tensor),
    (output_tol, grad_tol): (f64, f64),
    what: &str,
) -> Result<()> {
    assert_eq!(expected.0.len(), actual.0.len(), "{what}: outputs");
    for (index, (a, b)) in expected.0.iter().zip(&actual.0).enumerate() {
        let diff = relative_diff(a, b)?;
        assert!(
            diff < output_tol,
            "{what}: output {index} differs by {diff} (relative)"
        );
    }
    let diff = relative_diff(&expected.1, &actual.1)?;
    assert!(
        diff < grad_tol,
        "{what}: the logits gradient differs by {diff} (relative)"
    );
    Ok(())
}

/// Shapes `(B, S, V, K)` with a vocabulary below one warp, between a warp and a block, and over
/// several blocks.
const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 3, 7, 4), (2, 5, 300, 6), (3, 4, 2_053, 9)];

/// The fast functions on the GPU against the same on the CPU (the CPU kernels): every entry
/// point and pass, forward and backward, f32 and f64.
#[test]
fn the_gpu_matches_the_cpu_in_f32_and_f64() -> Result<()> {
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
    for (batch, seq, vocab, width) in SHAPES {
        let (logits, ids) = inputs(batch, seq, vocab, width)?;
        let targets = targets(batch, seq, vocab)?;
        for dtype in [DType::F32, DType::F64] {
            let logits = logits.to_dtype(dtype)?;
            for entry in ENTRIES {
                let cpu = step_on(entry, Function::Fast, &logits, &ids, &targets, &Device::Cpu)?;
                let on_gpu = step_on(entry, Function::Fast, &logits, &ids, &targets, &gpu)?;
                let what = format!("{entry:?} {dtype:?} V={vocab}: the GPU vs the CPU");
                assert_close(&cpu, &on_gpu, tolerance(dtype), &what)?;
            }
        }
    }
    Ok(())
}

/// f16 and bf16 logits on the GPU against the CPU in f32 on the same rounded values. The loss
/// computes half-precision logits in f32 on both (the kernels never see f16 or bf16); the
/// gradient comes back in the logits' dtype, rounded once.
#[test]
fn half_precision_logits_match_the_cpu_in_f32() -> Result<()> {
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
    for (batch, seq, vocab, width) in SHAPES {
        let (logits, ids) = inputs(batch, seq, vocab, width)?;
        let targets = targets(batch, seq, vocab)?;
        for dtype in [DType::F16, DType::BF16] {
            let half = logits.to_dtype(dtype)?;
            let rounded = half.to_dtype(DType::F32)?;
            for entry in ENTRIES {
                let cpu = step_on(
                    entry,
                    Function::Fast,
                    &rounded,
                    &ids,
                    &targets,
                    &Device::Cpu,
                )?;
                let on_gpu = step_on(entry, Function::Fast, &half, &ids, &targets, &gpu)?;
                assert_eq!(
                    on_gpu.1.dtype(),
                    dtype,
                    "{entry:?} {dtype:?}: gradient dtype"
                );
                let what = format!("{entry:?} {dtype:?} V={vocab}: the GPU vs the CPU in f32");
                assert_close(&cpu, &on_gpu, tolerance(dtype), &what)?;
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
        "offset" => inputs(batch + 1, seq, vocab, 1)?,
        _ => inputs(batch + 1, seq + 2, vocab + 5, 1)?,
    };
    Ok(logits)
}

/// Logits and ids that are views into larger GPU tensors — a start offset, a row stride wider
/// than `V`, ids narrowed in both dimensions — give on the GPU what their contiguous copies give
/// on the CPU, through every entry point: outputs and the gradient of the larger tensor, read
/// through the same view.
#[test]
fn narrowed_and_offset_inputs_match_contiguous_ones() -> Result<()> {
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
    let (batch, seq, vocab, width) = (3, 4, 300, 6);
    let dims = (batch, seq, vocab);
    // Ids `[B + 1, K + 2]` in 1..V; the view takes rows 1.. and columns 2..
    let (_, big_ids) = inputs(batch + 1, 1, vocab, width + 2)?;
    let big_ids_gpu = big_ids.to_device(&gpu)?;
    let ids_view = |ids: &Tensor| ids.narrow(0, 1, batch)?.narrow(1, 2, width);
    let ids = ids_view(&big_ids)?.contiguous()?;
    let targets = targets(batch, seq, vocab)?;
    for dtype in [DType::F32, DType::F64] {
        for kind in ["offset", "strided"] {
            let big = big_logits(kind, dims)?.to_dtype(dtype)?;
            let contiguous = view(kind, &big, dims)?.contiguous()?;
            for entry in ENTRIES {
                let cpu = step_on(
                    entry,
                    Function::Fast,
                    &contiguous,
                    &ids,
                    &targets,
                    &Device::Cpu,
                )?;
                let var = Var::from_tensor(&big.to_device(&gpu)?)?;
                let (outputs, big_grad) = step(
                    entry,
                    Function::Fast,
                    &var,
                    |l| view(kind, l, dims),
                    &ids_view(&big_ids_gpu)?,
                    &targets,
                )?;
                let on_gpu = (outputs, view(kind, &big_grad, dims)?);
                let what = format!("{entry:?} {dtype:?} {kind}: a view on the GPU vs the CPU");
                assert_close(&cpu, &on_gpu, tolerance(dtype), &what)?;
            }
        }
    }
    Ok(())
}

/// Cross-entropy + BLEU forms, `None` for the cross-entropy alone.
const FORMS: [Option<Form>; 4] = [
    None,
    Some(Form::Expected),
    Some(Form::LowerBound),
    Some(Form::Paired),
];

/// The hidden-state entry points on the GPU (composed blocks: they have no CUDA kernel) against
/// the logits path on the GPU (the kernels) and against themselves on
/// the CPU: values and the gradients of `hidden`, the weight and the bias.
#[test]
fn hidden_state_functions_on_cuda_match_the_logits_path() -> Result<()> {
    use candle_core::Module;
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
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
                let refs = References::from_ids(&t, 0)?;
                let ce = CrossEntropyConfig {
                    pad_id: Some(0),
                    label_smoothing: 0.1,
                    ..Default::default()
                };
                // Small blocks, so that the GPU runs the blocked loop more than once.
                let hidden_cfg = loss::HiddenConfig {
                    block_elements: 2 * vocab * seq,
                    ..Default::default()
                };
                let value = match (form, from_hidden) {
                    (None, true) => {
                        loss::cross_entropy_from_hidden(h.as_tensor(), &proj, &t, &ce, &hidden_cfg)?
                            .loss
                    }
                    (None, false) => {
                        loss::cross_entropy_from_logits(&proj.forward(h.as_tensor())?, &t, &ce)?
                            .loss
                    }
                    (Some(form), _) => {
                        let cfg = TrainingLossConfig {
                            ce,
                            bleu: BleuLossConfig {
                                form,
                                ..Default::default()
                            },
                            ..Default::default()
                        };
                        let targets = TrainingTargets::new(&t, &refs);
                        if from_hidden {
                            loss::ce_bleu_from_hidden(
                                h.as_tensor(),
                                &proj,
                                &targets,
                                &cfg,
                                &hidden_cfg,
                            )?
                            .loss
                        } else {
                            let logits = proj.forward(h.as_tensor())?;
                            loss::ce_bleu_from_logits(&logits, &targets, &cfg)?.loss
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

/// The fast functions against their `_composed` references, both on the GPU (the two paths a
/// CUDA user can get), for every entry point and pass, in f32, f64, f16 and bf16.
#[test]
fn kernels_match_the_composed_path_on_the_gpu() -> Result<()> {
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
    for (batch, seq, vocab, width) in SHAPES {
        let (logits, ids) = inputs(batch, seq, vocab, width)?;
        let targets = targets(batch, seq, vocab)?;
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let logits = logits.to_dtype(dtype)?;
            for entry in ENTRIES {
                let composed = step_on(entry, Function::Composed, &logits, &ids, &targets, &gpu)?;
                let fast = step_on(entry, Function::Fast, &logits, &ids, &targets, &gpu)?;
                let what = format!("{entry:?} {dtype:?} V={vocab}: fast vs composed on the GPU");
                assert_close(&composed, &fast, tolerance(dtype), &what)?;
            }
        }
    }
    Ok(())
}

/// The peak bytes the device's memory pool held during `f`, above what it held before; `None`
/// (with a note) where it cannot be read: no memory pools, or the pool does not hold
/// `input_bytes` already allocated by candle (its allocations then come from elsewhere). candle
/// 0.11 allocates with `cuMemAllocAsync` from the device's current pool (see benches/cuda.rs).
fn pool_peak(
    device: &Device,
    input_bytes: usize,
    f: impl FnOnce() -> Result<()>,
) -> Result<Option<u64>> {
    use candle_core::cuda_backend::cudarc::driver::{result as cu, sys};
    use std::ffi::c_void;
    let Device::Cuda(cuda) = device else {
        return Ok(None);
    };
    let ctx = cuda.cuda_stream().context().clone();
    if !ctx.has_async_alloc() {
        println!("NOTE: no memory pools (has_async_alloc() = false): peak memory not read");
        return Ok(None);
    }
    let error = |what: &str, e: cu::DriverError| candle_core::Error::Msg(format!("{what}: {e:?}"));
    // SAFETY: the device handle of candle's own context.
    let pool = unsafe { cu::device::get_mem_pool(ctx.cu_device()) }
        .map_err(|e| error("cuDeviceGetMemPool", e))?;
    let read = |attr: sys::CUmemPool_attribute| -> Result<u64> {
        let mut value: u64 = 0;
        // SAFETY: the USED_MEM_* attributes are cuuint64_t, which `value` is.
        unsafe { cu::mem_pool::get_attribute(pool, attr, &mut value as *mut u64 as *mut c_void) }
            .map_err(|e| error("cuMemPoolGetAttribute", e))?;
        Ok(value)
    };
    device.synchronize()?;
    let before = read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    if before < input_bytes as u64 {
        println!(
            "NOTE: the memory pool holds {before} bytes with {input_bytes} bytes of inputs \
             allocated: candle does not allocate from it; peak memory not read"
        );
        return Ok(None);
    }
    let mut zero: u64 = 0;
    let high = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    // SAFETY: as above; USED_MEM_HIGH may only be set to 0 (a reset to the current use).
    unsafe { cu::mem_pool::set_attribute(pool, high, &mut zero as *mut u64 as *mut c_void) }
        .map_err(|e| error("cuMemPoolSetAttribute", e))?;
    f()?;
    device.synchronize()?;
    Ok(Some(read(high)?.saturating_sub(before)))
}

/// The fast functions run the CUDA kernels in every `cuda` build (they are the default there
/// since the H200 run of 2026-11-27). Seen from outside through memory: the expected form's
/// forward pass with the kernels gathers at the ids without storing the `[B, S, V]` softmax,
/// which the composed ops store. So its peak in the device's memory pool is under half the
/// logits, and the `_composed` function's at least the logits; kernels that failed to load (one
/// warning on stderr, then the composed ops) fail here.
#[test]
fn the_kernels_run_on_cuda() -> Result<()> {
    let Some((_lock, gpu)) = gpu() else {
        return Ok(());
    };
    let (batch, seq, vocab, width) = (4, 16, 8192, 8);
    let (logits, ids) = inputs(batch, seq, vocab, width)?;
    let logits = logits.to_dtype(DType::F32)?.to_device(&gpu)?;
    let refs = References::from_ids(&ids.to_device(&gpu)?, 0)?;
    let cfg = BleuLossConfig::default();
    // Also the warm-up: the kernels compiled and loaded, the references' side built.
    loss::bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
    loss::bleu_loss_from_logits_composed(&logits, None, &refs, &cfg)?;
    let logits_bytes = batch * seq * vocab * 4;
    let peak = |composed: bool| {
        pool_peak(&gpu, logits_bytes, || {
            if composed {
                loss::bleu_loss_from_logits_composed(&logits, None, &refs, &cfg).map(drop)
            } else {
                loss::bleu_loss_from_logits(&logits, None, &refs, &cfg).map(drop)
            }
        })
    };
    let (Some(fast), Some(composed)) = (peak(false)?, peak(true)?) else {
        return Ok(());
    };
    println!(
        "forward peak: fast {fast} bytes, composed {composed} bytes, logits {logits_bytes} bytes"
    );
    assert!(
        fast < logits_bytes as u64 / 2,
        "the forward pass allocated {fast} bytes for {logits_bytes} bytes of logits: the \
         composed ops ran (did the kernels fail to load?)"
    );
    assert!(
        composed >= logits_bytes as u64,
        "the composed forward pass allocated only {composed} bytes for {logits_bytes} bytes of \
         logits"
    );
    Ok(())
}
