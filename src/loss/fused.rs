//! Fused CPU kernels: softmax over the vocabulary without materialising it where the loss only
//! needs a few columns, each a candle custom op with a hand-written backward.
//!
//! - [`softmax_gather`]: `softmax(logits)[b, i, ids[b, k]]`, the token-match matrix of one-hot
//!   references (`X[j,i] = P[i, ρ_j]`) read straight from the logits. The forward never writes a
//!   `[B,S,V]` tensor; the backward writes the logits gradient once.
//! - [`softmax_last_dim`]: a softmax with a backward, for the forms that need every probability
//!   (the paired form's hypothesis self-match, soft references). `candle_nn::ops::softmax_last_dim`
//!   has no backward and drops gradients silently; `candle_nn::ops::softmax` is correct but
//!   allocates one `[B,S,V]` tensor per elementary op.
//!
//! On devices other than the CPU both fall back to composed candle ops with the same numbers;
//! with the `cuda` feature, CUDA kernels (the `cuda` submodule) replace them when opted in.
//! f32 kernels use a vectorisable `exp` (Cephes' polynomial, about 1 ulp); f64 kernels use the
//! standard library's `exp`, so f64 results agree with the composed path to rounding.

use super::host::with_cpu_slice;
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape,
    Tensor, WithDType, D,
};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(feature = "cuda")]
pub mod cuda;

/// Whether the CUDA kernels of `cuda` run for tensors on `device`: only on CUDA, only with the
/// `cuda` feature, and only when opted in with `CANDLE_BLEU_CUDA_KERNELS=1` until a GPU run has
/// checked them (docs/gpu.md). Otherwise the composed candle ops run.
#[cfg(feature = "cuda")]
fn use_cuda_kernels(device: &candle_core::Device) -> bool {
    device.is_cuda() && cuda::kernels_enabled()
}

#[cfg(not(feature = "cuda"))]
fn use_cuda_kernels(_device: &candle_core::Device) -> bool {
    false
}

/// Columns the gather kernel appends to each row after the gathered probabilities: the row's
/// maximum logit and its sum of `exp(logit - max)`, kept for the backward.
const ROW_STATS: usize = 2;

/// A zeroed buffer for a `[B, S, V]` kernel output. Buffers this large are fresh pages from
/// the OS (glibc serves them by `mmap`), and first-touch page faults cost about as much as the
/// kernel's arithmetic: at `[32,64,64,32000]` f32, 64 000 faults of 4 KiB per 250 MiB. On Linux
/// we ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`, honoured when THP is in
/// `madvise` or `always` mode), which makes them 512 times fewer. Advice only: the contents
/// and the result do not change.
pub(crate) fn vocab_sized_buffer<T: KernelFloat>(len: usize) -> Vec<T> {
    let buffer = vec![T::ZERO; len];
    #[cfg(target_os = "linux")]
    advise_huge_pages(&buffer);
    buffer
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(buffer: &[T]) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(buffer);
    if bytes < 8 * HUGE_PAGE {
        return;
    }
    let start = buffer.as_ptr() as usize;
    let aligned_start = (start + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let aligned_end = (start + bytes) & !(HUGE_PAGE - 1);
    if aligned_end > aligned_start {
        // SAFETY: madvise only advises the kernel on how to back pages of the range, which lies
        // inside `buffer`'s live allocation; MADV_HUGEPAGE never changes memory contents. A
        // failure (e.g. THP disabled) leaves ordinary pages, so the result is ignored.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

/// The float operations the kernels need, for f32 and f64.
pub(crate) trait KernelFloat:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    /// `exp(x)` for `x <= 0` (logits minus their row maximum).
    fn exp_nonpositive(x: Self) -> Self;
    /// The larger of the two; NaN is ignored (the finiteness check reports it).
    fn max(self, other: Self) -> Self;
    fn is_finite(self) -> bool;
}

impl KernelFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;

    /// Cephes `expf`: range reduction by `ln 2`, a degree-5 polynomial, and the exponent written
    /// into the bits. Branch-free so that loops over rows vectorise; inputs below `-87` (whose
    /// `exp` is below the smallest normal float) give exactly 0, like the library `exp` rounds to.
    #[inline(always)]
    fn exp_nonpositive(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
        const ROUND: f32 = 12_582_912.0;
        let clamped = if x < -87.0 { -87.0 } else { x };
        let shifted = clamped * LOG2E + ROUND;
        // The rounded integer sits in the low mantissa bits of `shifted`: reading it from the
        // bits keeps the loop free of float-to-int conversions, which would not vectorise.
        let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
        let n = shifted - ROUND;
        let r = clamped - n * LN2_HI - n * LN2_LO;
        let mut p = 1.987_569_1e-4_f32;
        p = p * r + 1.398_199_9e-3;
        p = p * r + 8.333_452e-3;
        p = p * r + 4.166_579_6e-2;
        p = p * r + 1.666_666_5e-1;
        p = p * r + 5.0e-1;
        let y = p * r * r + r + 1.0;
        let scale = f32::from_bits(((n_int + 127) as u32) << 23);
        let e = y * scale;
        if x < -87.0 {
            0.0
        } else {
            e
        }
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

impl KernelFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp_nonpositive(x: f64) -> f64 {
        x.exp()
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}

pub(crate) const LANES: usize = 8;

/// The row's maximum, and whether every entry is finite. Lane arrays let the loop vectorise
/// (a float fold in one accumulator would not, its order being fixed).
#[inline]
pub(crate) fn row_max_checked<T: KernelFloat>(row: &[T]) -> (T, bool) {
    let mut max_lanes = [T::NEG_INFINITY; LANES];
    // x * 0 is 0 for finite x and NaN for NaN or ±inf: one NaN check per row instead of a branch.
    let mut finite_lanes = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            max_lanes[lane] = max_lanes[lane].max(chunk[lane]);
            finite_lanes[lane] += chunk[lane] * T::ZERO;
        }
    }
    let mut max = T::NEG_INFINITY;
    let mut finite = T::ZERO;
    for lane in 0..LANES {
        max = max.max(max_lanes[lane]);
        finite += finite_lanes[lane];
    }
    for &x in rest {
        max = max.max(x);
        finite += x * T::ZERO;
    }
    (max, finite.is_finite() && max.is_finite())
}

/// `Σ_v exp(row[v] - max)`.
#[inline]
pub(crate) fn row_exp_sum<T: KernelFloat>(row: &[T], max: T) -> T {
    let mut sum_lanes = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            sum_lanes[lane] += T::exp_nonpositive(chunk[lane] - max);
        }
    }
    let mut sum = T::ZERO;
    for lane in sum_lanes {
        sum += lane;
    }
    for &x in rest {
        sum += T::exp_nonpositive(x - max);
    }
    sum
}

/// The row's maximum and `Σ_v exp(row[v] - max)` in one read of the row from memory: blocks
/// small enough to stay in L1 are scanned for their maximum, then summed, rescaling the
/// running sum when the maximum grows (online softmax). Also whether every entry is finite.
#[inline]
pub(crate) fn row_max_and_exp_sum<T: KernelFloat>(row: &[T]) -> (T, T, bool) {
    const BLOCK: usize = 2048;
    let mut max = T::NEG_INFINITY;
    let mut sum = T::ZERO;
    let mut finite = true;
    for block in row.chunks(BLOCK) {
        let (block_max, block_finite) = row_max_checked(block);
        finite &= block_finite;
        if block_max > max {
            // max < block_max, so the exponent is <= 0 (and exp(-inf) = 0 at the first block).
            sum = sum * T::exp_nonpositive(max - block_max);
            max = block_max;
        }
        sum += row_exp_sum(block, max);
    }
    (max, sum, finite)
}

/// Writes `exp(row[v] - max)` into `out` and returns their sum.
#[inline]
pub(crate) fn row_exp_into<T: KernelFloat>(row: &[T], max: T, out: &mut [T]) -> T {
    let mut sum_lanes = [T::ZERO; LANES];
    let mut out_chunks = out.chunks_exact_mut(LANES);
    let mut row_chunks = row.chunks_exact(LANES);
    for (o, chunk) in (&mut out_chunks).zip(&mut row_chunks) {
        for lane in 0..LANES {
            let e = T::exp_nonpositive(chunk[lane] - max);
            o[lane] = e;
            sum_lanes[lane] += e;
        }
    }
    let mut sum = T::ZERO;
    for lane in sum_lanes {
        sum += lane;
    }
    for (o, &x) in out_chunks
        .into_remainder()
        .iter_mut()
        .zip(row_chunks.remainder())
    {
        let e = T::exp_nonpositive(x - max);
        *o = e;
        sum += e;
    }
    sum
}

pub(crate) fn non_finite_error(argument: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "`{argument}` contains NaN or infinite values; the BLEU loss needs finite logits"
    ))
}

pub(crate) fn contiguous_slice<'a, T: candle_core::WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [T]> {
    let data = storage.as_slice::<T>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("`{what}`: the fused kernel needs a contiguous tensor"),
    }
}

/// `out[r, k] = softmax(logits[r])[ids[r / rows_per_batch, k]]`, then the row's max and exp-sum.
fn gather_forward<T: KernelFloat>(
    logits: &[T],
    ids: &[u32],
    rows_per_batch: usize,
    vocab: usize,
    width: usize,
) -> Result<Vec<T>> {
    let stride = width + ROW_STATS;
    let rows = logits.len() / vocab;
    let mut out = vec![T::ZERO; rows * stride];
    let all_finite = AtomicBool::new(true);
    out.par_chunks_mut(stride)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(row_index, (out_row, row))| {
            let (max, sum, finite) = row_max_and_exp_sum(row);
            if !finite {
                all_finite.store(false, Ordering::Relaxed);
                return;
            }
            let inv_sum = T::ONE / sum;
            let row_ids = &ids[(row_index / rows_per_batch) * width..][..width];
            for (o, &id) in out_row[..width].iter_mut().zip(row_ids) {
                *o = T::exp_nonpositive(row[id as usize] - max) * inv_sum;
            }
            out_row[width] = max;
            out_row[width + 1] = sum;
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    Ok(out)
}

/// `dlogits[r, v] = Σ_k g_k x_k [v = id_k] - p_v Σ_k g_k x_k`, with `x_k` the gathered
/// probabilities and `g_k` their incoming gradient: the softmax Jacobian applied to a sparse
/// gradient, one pass over the row.
fn gather_backward<T: KernelFloat>(
    logits: &[T],
    ids: &[u32],
    gathered: &[T],
    grad_gathered: &[T],
    rows_per_batch: usize,
    vocab: usize,
    width: usize,
) -> Vec<T> {
    let stride = width + ROW_STATS;
    let mut grad = vocab_sized_buffer(logits.len());
    grad.par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(row_index, (grad_row, row))| {
            let stats = &gathered[row_index * stride..][..stride];
            let grads = &grad_gathered[row_index * stride..][..width];
            let (max, sum) = (stats[width], stats[width + 1]);
            let mut weighted = T::ZERO;
            for k in 0..width {
                weighted += grads[k] * stats[k];
            }
            let scale = T::ZERO - weighted / sum;
            let mut grad_chunks = grad_row.chunks_exact_mut(LANES);
            let mut row_chunks = row.chunks_exact(LANES);
            for (g, chunk) in (&mut grad_chunks).zip(&mut row_chunks) {
                for lane in 0..LANES {
                    g[lane] = scale * T::exp_nonpositive(chunk[lane] - max);
                }
            }
            for (g, &x) in grad_chunks
                .into_remainder()
                .iter_mut()
                .zip(row_chunks.remainder())
            {
                *g = scale * T::exp_nonpositive(x - max);
            }
            let row_ids = &ids[(row_index / rows_per_batch) * width..][..width];
            for k in 0..width {
                grad_row[row_ids[k] as usize] += grads[k] * stats[k];
            }
        });
    grad
}

/// The one f32/f64 dispatch of the CPU kernels: calls the generic `$kernel::<T>(args)` for the
/// float type of `$dtype`; another dtype is an error naming the argument. Every custom op below
/// is one generic function over `T: KernelFloat + WithDType` behind this.
macro_rules! dispatch_float {
    ($dtype:expr, $what:expr, $kernel:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            candle_core::DType::F32 => $kernel::<f32>($($arg),*),
            candle_core::DType::F64 => $kernel::<f64>($($arg),*),
            other => Err($crate::loss::fused::unsupported_dtype($what, other)),
        }
    };
    // `<T> => body`: the body once, with `T` the kernel's float type (methods, wrapping).
    ($dtype:expr, $what:expr, <$float:ident> => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $float = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $float = f64;
                $body
            }
            other => Err($crate::loss::fused::unsupported_dtype($what, other)),
        }
    };
}
pub(crate) use dispatch_float;

pub(crate) fn unsupported_dtype(what: &str, dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{what}: the CPU kernel takes f32 or f64 `logits`, got {dtype:?}"
    ))
}

/// The shapes of a validated `(logits, ids)` pair.
#[derive(Debug, Clone, Copy)]
struct GatherDims {
    batch: usize,
    seq: usize,
    vocab: usize,
    width: usize,
}

/// Checks `logits` (float `[B, S, V]`, `V >= 1`) and `ids` (u32 `[B, K]`) against each other.
fn check_logits_and_ids(op: &str, logits: &Tensor, ids: &Tensor) -> Result<GatherDims> {
    let (batch, seq, vocab) = match logits.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("{op}: `logits` must be [B, S, V], got shape {dims:?}"),
    };
    if !logits.dtype().is_float() {
        bail!(
            "{op}: `logits` must be a float tensor, got {:?} with shape {:?}",
            logits.dtype(),
            logits.dims()
        );
    }
    if vocab == 0 {
        bail!(
            "{op}: `logits` has an empty vocabulary: shape {:?}, V must be >= 1",
            logits.dims()
        );
    }
    if ids.dtype() != DType::U32 {
        bail!(
            "{op}: `ids` must be u32, got {:?} with shape {:?}",
            ids.dtype(),
            ids.dims()
        );
    }
    let width = match ids.dims() {
        &[b, k] if b == batch => k,
        dims => bail!(
            "{op}: `ids` must be [B, K] with B = {batch} of `logits` (shape {:?}), got shape {dims:?}",
            logits.dims()
        ),
    };
    if !ids.device().same_device(logits.device()) {
        bail!(
            "{op}: `ids` are on {:?} but `logits` on {:?}",
            ids.device(),
            logits.device()
        );
    }
    Ok(GatherDims {
        batch,
        seq,
        vocab,
        width,
    })
}

/// Checks every id `< V`. On the CPU the ids are read in place; on another device this is one
/// counted device-to-host copy ([`super::host`]), which is why the loss, whose ids were checked
/// when its references were built, calls the unchecked ops.
fn check_ids_in_vocab(op: &str, ids: &Tensor, dims: GatherDims) -> Result<()> {
    let find = |ids: &[u32]| {
        ids.iter()
            .position(|&id| id as usize >= dims.vocab)
            .map(|p| (p / dims.width.max(1), p % dims.width.max(1), ids[p]))
    };
    let bad = if ids.device().is_cpu() {
        super::host::with_cpu_slice::<u32, _>(ids, |ids| Ok(find(ids)))?
    } else {
        find(&super::host::to_vec2::<u32>(ids)?.concat())
    };
    if let Some((b, k, id)) = bad {
        bail!(
            "{op}: `ids[{b}, {k}]` = {id} is out of the vocabulary: every id must be < V = {}",
            dims.vocab
        );
    }
    Ok(())
}

fn gather_fwd_cpu<T: KernelFloat + WithDType>(
    logits: &CpuStorage,
    logits_layout: &Layout,
    ids: &[u32],
    dims: GatherDims,
) -> Result<CpuStorage> {
    let logits = contiguous_slice::<T>(logits, logits_layout, "logits")?;
    let out = gather_forward(logits, ids, dims.seq, dims.vocab, dims.width)?;
    Ok(T::to_cpu_storage_owned(out))
}

fn gather_bwd_cpu<T: KernelFloat + WithDType>(
    logits: &Tensor,
    ids: &Tensor,
    gathered: &Tensor,
    grad_gathered: &Tensor,
) -> Result<Tensor> {
    let (_, seq, vocab) = logits.dims3()?;
    let width = ids.dim(1)?;
    let grad = with_cpu_slice::<T, _>(logits, |logits| {
        with_cpu_slice::<u32, _>(ids, |ids| {
            with_cpu_slice::<T, _>(gathered, |gathered| {
                with_cpu_slice::<T, _>(grad_gathered, |grad_gathered| {
                    Ok(gather_backward(
                        logits,
                        ids,
                        gathered,
                        grad_gathered,
                        seq,
                        vocab,
                        width,
                    ))
                })
            })
        })
    })?;
    Tensor::from_vec(grad, logits.shape(), logits.device())
}

/// `[softmax(logits) at ids | row max | row exp-sum]`, `[B, S, K + 2]`.
pub(crate) struct SoftmaxGather;

impl CustomOp2 for SoftmaxGather {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-gather"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let (_, width) = ids_layout.shape().dims2()?;
        let dims = GatherDims {
            batch,
            seq,
            vocab,
            width,
        };
        let ids = contiguous_slice::<u32>(ids, ids_layout, "ids")?;
        let out = dispatch_float!(
            logits.dtype(),
            "softmax_gather",
            gather_fwd_cpu(logits, logits_layout, ids, dims)
        )?;
        Ok((out, Shape::from((batch, seq, width + ROW_STATS))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        logits: &candle_core::CudaStorage,
        logits_layout: &Layout,
        ids: &candle_core::CudaStorage,
        ids_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::softmax_gather_forward(logits, logits_layout, ids, ids_layout)
    }

    fn bwd(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        gathered: &Tensor,
        grad_gathered: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if logits.device().is_cuda() {
            let grad = cuda::softmax_gather_backward(logits, ids, gathered, grad_gathered)?;
            return Ok((Some(grad), None));
        }
        if !logits.device().is_cpu() {
            bail!("softmax_gather backward: `logits` are not on the CPU")
        }
        let grad = dispatch_float!(
            logits.dtype(),
            "softmax_gather backward",
            gather_bwd_cpu(logits, ids, gathered, grad_gathered)
        )?;
        Ok((Some(grad), None))
    }
}

/// `softmax(logits, last dim)` gathered at `ids`: `out[b, i, k] = P[b, i, ids[b, k]]`.
///
/// # Arguments
/// * `logits` - float `[B, S, V]`, `V >= 1`; f32 or f64 on the CPU (fused kernel), any float
///   dtype elsewhere (composed candle ops).
/// * `ids` - u32 `[B, K]` on the same device, every id `< V`.
///
/// Returns `[B, S, K]` in the dtype of `logits`, differentiable with respect to `logits`.
///
/// Errors (naming the argument and its shape or value) on a wrong rank or dtype, a batch
/// mismatch, an id `>= V`, and on the CPU NaN or infinite `logits`. Off the CPU, checking the
/// ids is one device-to-host copy.
///
/// ```
/// use candle_bleu::loss::fused::softmax_gather;
/// use candle_core::{Device, Tensor};
///
/// let logits = Tensor::new(&[[[0f32, 0., 0., 0.]]], &Device::Cpu)?; // [1, 1, 4]
/// let ids = Tensor::new(&[[3u32, 1]], &Device::Cpu)?; // [1, 2]
/// let p = softmax_gather(&logits, &ids)?; // [1, 1, 2]
/// assert_eq!(p.flatten_all()?.to_vec1::<f32>()?, [0.25, 0.25]);
/// assert!(softmax_gather(&logits, &Tensor::new(&[[4u32]], &Device::Cpu)?).is_err());
/// # Ok::<(), candle_core::Error>(())
/// ```
///
/// With the opt-in CUDA kernels (`cuda` feature, `CANDLE_BLEU_CUDA_KERNELS=1`) f16 and bf16
/// logits are accepted too and give f32, and a non-finite row gives NaN instead of an error.
pub fn softmax_gather(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let dims = check_logits_and_ids("softmax_gather", logits, ids)?;
    check_ids_in_vocab("softmax_gather", ids, dims)?;
    softmax_gather_unchecked(logits, ids)
}

/// [`softmax_gather`] for inputs the caller has checked (the loss: ids from its references).
pub(crate) fn softmax_gather_unchecked(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (batch, seq, _) = logits.dims3()?;
    let width = ids.dim(1)?;
    if logits.device().is_cpu() || use_cuda_kernels(logits.device()) {
        let logits = logits.contiguous()?;
        let ids = ids.contiguous()?;
        let out = logits.apply_op2(&ids, SoftmaxGather)?;
        return out.narrow(2, 0, width);
    }
    let probs = candle_nn::ops::softmax(logits, D::Minus1)?;
    let index = ids
        .unsqueeze(1)?
        .broadcast_as((batch, seq, width))?
        .contiguous()?;
    probs.gather(&index, 2)
}

pub(crate) fn softmax_forward<T: KernelFloat>(logits: &[T], vocab: usize) -> Result<Vec<T>> {
    let mut probs = vocab_sized_buffer(logits.len());
    let all_finite = AtomicBool::new(true);
    probs
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .for_each(|(out, row)| {
            let (max, finite) = row_max_checked(row);
            if !finite {
                all_finite.store(false, Ordering::Relaxed);
                return;
            }
            let inv_sum = T::ONE / row_exp_into(row, max, out);
            for p in out.iter_mut() {
                *p = *p * inv_sum;
            }
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    Ok(probs)
}

/// `dlogits = p ⊙ (dp - Σ_v p_v dp_v)` row by row.
fn softmax_backward<T: KernelFloat>(probs: &[T], grad_probs: &[T], vocab: usize) -> Vec<T> {
    let mut grad = vocab_sized_buffer(probs.len());
    grad.par_chunks_mut(vocab)
        .zip(probs.par_chunks(vocab).zip(grad_probs.par_chunks(vocab)))
        .for_each(|(out, (p, dp))| {
            let mut dot_lanes = [T::ZERO; LANES];
            let p_chunks = p.chunks_exact(LANES);
            let dp_chunks = dp.chunks_exact(LANES);
            let (p_rest, dp_rest) = (p_chunks.remainder(), dp_chunks.remainder());
            for (pc, dc) in p_chunks.zip(dp_chunks) {
                for lane in 0..LANES {
                    dot_lanes[lane] += pc[lane] * dc[lane];
                }
            }
            let mut dot = T::ZERO;
            for lane in dot_lanes {
                dot += lane;
            }
            for (&a, &b) in p_rest.iter().zip(dp_rest) {
                dot += a * b;
            }
            for ((o, &pv), &dv) in out.iter_mut().zip(p).zip(dp) {
                *o = pv * (dv - dot);
            }
        });
    grad
}

fn softmax_fwd_cpu<T: KernelFloat + WithDType>(
    storage: &CpuStorage,
    layout: &Layout,
    vocab: usize,
) -> Result<CpuStorage> {
    let logits = contiguous_slice::<T>(storage, layout, "logits")?;
    Ok(T::to_cpu_storage_owned(softmax_forward(logits, vocab)?))
}

fn softmax_bwd_cpu<T: KernelFloat + WithDType>(
    probs: &Tensor,
    grad_probs: &Tensor,
) -> Result<Tensor> {
    let vocab = probs.dims().last().copied().unwrap_or(1).max(1);
    let grad = with_cpu_slice::<T, _>(probs, |probs| {
        with_cpu_slice::<T, _>(grad_probs, |grad_probs| {
            Ok(softmax_backward(probs, grad_probs, vocab))
        })
    })?;
    Tensor::from_vec(grad, probs.shape(), probs.device())
}

/// A softmax over the last dimension with a hand-written backward.
pub(crate) struct SoftmaxLastDim;

impl CustomOp1 for SoftmaxLastDim {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let vocab = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let out = dispatch_float!(
            storage.dtype(),
            "softmax_last_dim",
            softmax_fwd_cpu(storage, layout, vocab)
        )?;
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::softmax_forward(storage, layout)
    }

    fn bwd(&self, _logits: &Tensor, probs: &Tensor, grad_probs: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if probs.device().is_cuda() {
            return Ok(Some(cuda::softmax_backward(probs, grad_probs)?));
        }
        if !probs.device().is_cpu() {
            bail!("softmax_last_dim backward: the probabilities are not on the CPU")
        }
        let grad = dispatch_float!(
            probs.dtype(),
            "softmax_last_dim backward",
            softmax_bwd_cpu(probs, grad_probs)
        )?;
        Ok(Some(grad))
    }
}

/// Softmax over the last dimension, with a backward, in one pass over the data each way.
///
/// `logits`: float, rank >= 1; f32 or f64 on the CPU (a fused kernel), any float dtype
/// elsewhere (`candle_nn::ops::softmax`). Errors on another dtype or a scalar, and on the CPU if
/// `logits` holds NaN or infinite values.
///
/// ```
/// use candle_bleu::loss::fused::softmax_last_dim;
/// use candle_core::{Device, Tensor, Var};
///
/// let x = Var::new(&[[1f64, 2., 3.]], &Device::Cpu)?;
/// let p = softmax_last_dim(x.as_tensor())?;
/// let grad = p.narrow(1, 2, 1)?.sum_all()?.backward()?; // d p_3 / d x
/// let (p, g) = (p.to_vec2::<f64>()?[0].clone(), grad.get(&x).unwrap().to_vec2::<f64>()?[0].clone());
/// assert!((g[2] - p[2] * (1.0 - p[2])).abs() < 1e-15);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn softmax_last_dim(logits: &Tensor) -> Result<Tensor> {
    if logits.rank() == 0 {
        bail!("softmax_last_dim: `logits` must have rank >= 1, got a scalar");
    }
    if !logits.dtype().is_float() {
        bail!(
            "softmax_last_dim: `logits` must be a float tensor, got {:?} with shape {:?}",
            logits.dtype(),
            logits.dims()
        );
    }
    if logits.device().is_cpu() || use_cuda_kernels(logits.device()) {
        logits.contiguous()?.apply_op1(SoftmaxLastDim)
    } else {
        candle_nn::ops::softmax(logits, D::Minus1)
    }
}

/// Softmax probabilities gathered at `ids` into `[rows, width]`, from full `[rows, V]` rows.
pub(crate) fn gather_rows<T: KernelFloat>(
    probs: &[T],
    ids: &[u32],
    rows_per_batch: usize,
    vocab: usize,
    width: usize,
) -> Vec<T> {
    let rows = probs.len() / vocab;
    let mut out = vec![T::ZERO; rows * width];
    out.par_chunks_mut(width.max(1))
        .zip(probs.par_chunks(vocab))
        .enumerate()
        .for_each(|(row_index, (out_row, row))| {
            let row_ids = &ids[(row_index / rows_per_batch) * width..][..width];
            for (o, &id) in out_row.iter_mut().zip(row_ids) {
                *o = row[id as usize];
            }
        });
    out
}

/// `dlogits = p ⊙ (g - Σ_v p_v g_v)` with `g = dP + scatter(dX at ids)`: the softmax Jacobian
/// applied to a dense gradient plus a sparse one, one pass over each row.
fn self_match_backward<T: KernelFloat>(
    probs: &[T],
    grad_probs_dense: &[T],
    ids: &[u32],
    grad_gathered: &[T],
    rows_per_batch: usize,
    vocab: usize,
    width: usize,
) -> Vec<T> {
    let mut grad = vocab_sized_buffer(probs.len());
    grad.par_chunks_mut(vocab)
        .zip(
            probs
                .par_chunks(vocab)
                .zip(grad_probs_dense.par_chunks(vocab)),
        )
        .enumerate()
        .for_each(|(row_index, (out, (p, dense)))| {
            let row_ids = &ids[(row_index / rows_per_batch) * width..][..width];
            let sparse = &grad_gathered[row_index * width..][..width];
            let mut dot_lanes = [T::ZERO; LANES];
            let p_chunks = p.chunks_exact(LANES);
            let d_chunks = dense.chunks_exact(LANES);
            let (p_rest, d_rest) = (p_chunks.remainder(), d_chunks.remainder());
            for (pc, dc) in p_chunks.zip(d_chunks) {
                for lane in 0..LANES {
                    dot_lanes[lane] += pc[lane] * dc[lane];
                }
            }
            let mut dot = T::ZERO;
            for lane in dot_lanes {
                dot += lane;
            }
            for (&a, &b) in p_rest.iter().zip(d_rest) {
                dot += a * b;
            }
            for (&id, &g) in row_ids.iter().zip(sparse) {
                dot += p[id as usize] * g;
            }
            for ((o, &pv), &dv) in out.iter_mut().zip(p).zip(dense) {
                *o = pv * (dv - dot);
            }
            for (&id, &g) in row_ids.iter().zip(sparse) {
                out[id as usize] += p[id as usize] * g;
            }
        });
    grad
}

fn self_match_fwd_cpu<T: KernelFloat + WithDType>(
    logits: &CpuStorage,
    logits_layout: &Layout,
    ids: &[u32],
    dims: GatherDims,
) -> Result<CpuStorage> {
    let GatherDims {
        batch,
        seq,
        vocab,
        width,
    } = dims;
    let probs = softmax_forward(
        contiguous_slice::<T>(logits, logits_layout, "logits")?,
        vocab,
    )?;
    let gathered = gather_rows(&probs, ids, seq, vocab, width);
    let probs = Tensor::from_vec(probs, (batch, seq, vocab), &candle_core::Device::Cpu)?;
    let self_match = probs.matmul(&probs.t()?)?;
    let stride = seq + width;
    let mut out = vec![T::ZERO; batch * seq * stride];
    with_cpu_slice::<T, _>(&self_match, |self_match| {
        for row in 0..batch * seq {
            out[row * stride..][..seq].copy_from_slice(&self_match[row * seq..][..seq]);
            out[row * stride + seq..][..width].copy_from_slice(&gathered[row * width..][..width]);
        }
        Ok(())
    })?;
    Ok(T::to_cpu_storage_owned(out))
}

fn self_match_bwd_cpu<T: KernelFloat + WithDType>(
    logits: &Tensor,
    ids: &Tensor,
    grad_out: &Tensor,
) -> Result<Tensor> {
    let (_, seq, vocab) = logits.dims3()?;
    let width = ids.dim(1)?;
    let probs = with_cpu_slice::<T, _>(logits, |logits| softmax_forward(logits, vocab))?;
    let probs = Tensor::from_vec(probs, logits.shape(), logits.device())?;
    let grad_self = grad_out.narrow(2, 0, seq)?;
    // Z = P Pᵀ: dP = (dZ + dZᵀ) P.
    let grad_dense = grad_self
        .add(&grad_self.t()?)?
        .contiguous()?
        .matmul(&probs)?;
    let grad_gathered = grad_out.narrow(2, seq, width)?;
    let grad = with_cpu_slice::<T, _>(&probs, |probs| {
        with_cpu_slice::<T, _>(&grad_dense, |grad_dense| {
            with_cpu_slice::<u32, _>(ids, |ids| {
                with_cpu_slice::<T, _>(&grad_gathered, |grad_gathered| {
                    Ok(self_match_backward(
                        probs,
                        grad_dense,
                        ids,
                        grad_gathered,
                        seq,
                        vocab,
                        width,
                    ))
                })
            })
        })
    })?;
    Tensor::from_vec(grad, logits.shape(), logits.device())
}

/// `[Z | X]`: the hypothesis self-match `Z = P Pᵀ` and `P` gathered at `ids`, from logits.
pub(crate) struct SoftmaxSelfMatch;

impl CustomOp2 for SoftmaxSelfMatch {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-self-match"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let (_, width) = ids_layout.shape().dims2()?;
        let dims = GatherDims {
            batch,
            seq,
            vocab,
            width,
        };
        let ids = contiguous_slice::<u32>(ids, ids_layout, "ids")?;
        let out = dispatch_float!(
            logits.dtype(),
            "softmax_self_match_gather",
            self_match_fwd_cpu(logits, logits_layout, ids, dims)
        )?;
        Ok((out, Shape::from((batch, seq, seq + width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        logits: &candle_core::CudaStorage,
        logits_layout: &Layout,
        ids: &candle_core::CudaStorage,
        ids_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::softmax_self_match_forward(logits, logits_layout, ids, ids_layout)
    }

    fn bwd(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        _out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if logits.device().is_cuda() {
            let grad = cuda::softmax_self_match_backward(logits, ids, _out, grad_out)?;
            return Ok((Some(grad), None));
        }
        if !logits.device().is_cpu() {
            bail!("softmax_self_match_gather backward: `logits` are not on the CPU")
        }
        let grad = dispatch_float!(
            logits.dtype(),
            "softmax_self_match_gather backward",
            self_match_bwd_cpu(logits, ids, grad_out)
        )?;
        Ok((Some(grad), None))
    }
}

/// The hypothesis self-match `Z = P Pᵀ` (`[B, S, S]`) and `P` gathered at `ids` (`[B, S, K]`),
/// with `P = softmax(logits)`, for the paired form.
///
/// On the CPU one op whose backward applies the softmax Jacobian once to the sum of both
/// gradients (`(dZ + dZᵀ) P` and the sparse gather gradient), writing a single `[B, S, V]`
/// gradient; elsewhere composed candle ops.
///
/// # Arguments
/// As [`softmax_gather`]: `logits` float `[B, S, V]`, `ids` u32 `[B, K]` with every id `< V`;
/// the same errors.
///
/// ```
/// use candle_bleu::loss::fused::softmax_self_match_gather;
/// use candle_core::{Device, Tensor};
///
/// let logits = Tensor::new(&[[[0f64, 0.], [9., -9.]]], &Device::Cpu)?; // [1, 2, 2]
/// let (z, x) = softmax_self_match_gather(&logits, &Tensor::new(&[[0u32]], &Device::Cpu)?)?;
/// assert_eq!((z.dims(), x.dims()), (&[1, 2, 2][..], &[1, 2, 1][..]));
/// assert!((z.to_vec3::<f64>()?[0][0][0] - 0.5).abs() < 1e-15); // (1/2)² + (1/2)²
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn softmax_self_match_gather(logits: &Tensor, ids: &Tensor) -> Result<(Tensor, Tensor)> {
    let dims = check_logits_and_ids("softmax_self_match_gather", logits, ids)?;
    check_ids_in_vocab("softmax_self_match_gather", ids, dims)?;
    softmax_self_match_gather_unchecked(logits, ids)
}

/// [`softmax_self_match_gather`] for inputs the caller has checked.
pub(crate) fn softmax_self_match_gather_unchecked(
    logits: &Tensor,
    ids: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (batch, seq, _) = logits.dims3()?;
    let width = ids.dim(1)?;
    if logits.device().is_cpu() || use_cuda_kernels(logits.device()) {
        let out = logits
            .contiguous()?
            .apply_op2(&ids.contiguous()?, SoftmaxSelfMatch)?;
        return Ok((out.narrow(2, 0, seq)?, out.narrow(2, seq, width)?));
    }
    let probs = candle_nn::ops::softmax(logits, D::Minus1)?;
    let index = ids
        .unsqueeze(1)?
        .broadcast_as((batch, seq, width))?
        .contiguous()?;
    Ok((probs.matmul(&probs.t()?)?, probs.gather(&index, 2)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate_on_the_kernel_range() {
        let mut worst = 0.0f64;
        for step in 0..200_000 {
            let x = -87.0 * step as f32 / 200_000.0;
            let fast = f32::exp_nonpositive(x) as f64;
            let exact = (x as f64).exp();
            worst = worst.max(((fast - exact) / exact).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(f32::exp_nonpositive(-100.0), 0.0);
        assert_eq!(f32::exp_nonpositive(0.0), 1.0);
    }
}
