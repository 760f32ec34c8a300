//! The loss on a CUDA GPU, forward + backward: time and peak device memory of each step, with the
//! crate's CUDA kernels off (the `_composed` functions: composed candle ops) and on (the fast
//! functions, which run the kernels with the `cuda` feature), beside PyTorch
//! eager and `torch.compile` on the same GPU (`benches/torch_cuda.py`, read with `--torch`).
//! `benches/cuda_vs_torch.sh` runs the two sides alternately.
//!
//! ```text
//! scripts/build-cuda.sh build --release --features cuda --bench cuda   # builds here, no GPU needed
//! target/cuda/release/deps/cuda-<hash> [--quick] [--repeats N] [--warmup N] [--json PATH]
//!     [--torch PATH] [--only KEY,…] [--kernels both|off|on] [--cpu]
//! cargo bench --features cuda --bench cuda -- --quick                  # the same through cargo
//! ```
//!
//! `--kernels off` times the `_composed` functions (`cross_entropy_from_logits_composed`, …),
//! `on` the fast ones, `both` (the default) each row both ways. With `--cpu`, `on` is the CPU
//! kernels.
//!
//! Host against device time (feature `cuda-unverified`: **not yet run on a GPU**): per timed step
//! the bench also records a CUDA event on candle's stream before the step and one after its last
//! launch (before the synchronize), and reads the host's wall clock when the step's code has
//! returned, before the synchronize. Per row it prints the median of `host` (the host's time
//! to issue every launch, allocation and host-side computation of the step), `device` (the
//! events' elapsed time: the GPU's time from the step's first to its last launch, idle gaps
//! included) and `wall` (the timed step, synchronize included). `host ≈ device ≈ wall` means the
//! GPU waits on the host (launch-bound); `device ≈ wall ≫ host` means the GPU is the bottleneck.
//! In the JSON: `host_ms_runs`, `device_ms_runs`.
//!
//! Rows (each with the kernels off and on where it has both), forward + backward, gradients
//! dropped:
//! - logits `[B,S,T,V]` = `[32,64,64,32000]` f32 and `[64,128,128,50000]` bf16 (the loss computes
//!   bf16 logits in f32): `cross_entropy_from_logits`, `bleu_loss_from_logits` Expected,
//!   LowerBound and Paired, `ce_bleu_from_logits` Expected — inputs as in `benches/loss.rs`
//!   (logits N(0, 1), one reference of `T` ids uniform in `[0, V)`, no padding, random targets,
//!   default configs) — and `cross_entropy_from_logits options` (`ce_options`: class weights in
//!   `[0.5, 1.5]`, label smoothing 0.1, z-loss 1e-4, the token accuracy, pad 0; on CUDA the
//!   options kernels with `cuda-unverified`, else composed ops);
//! - CTC `[B,T',L,V]` = `[32,128,48,8000]` f32 (`benches/ctc.rs`'s shape: logits N(0, 1),
//!   targets uniform in `[1, V)`, blank 0, full lengths): `ctc_loss_from_logits` and
//!   `ctc_loss(log_softmax)` (the crate's `log_softmax`; kernels off: `ctc_loss_composed` on
//!   `log_softmax_slow`), both against PyTorch's `F.ctc_loss(F.log_softmax)` (`ctc`), and
//!   `ctc_bleu_loss_from_logits` (4-grams, the targets as references; no PyTorch row) — on
//!   CUDA their kernels only with `cuda-unverified`;
//! - hidden states `[B,S,D,T,V]` = `[32,64,512,64,32000]` and `[32,64,512,64,128000]` f32:
//!   `ce_bleu_from_hidden` and `ce_bleu_from_logits(Linear::forward(hidden))`, inputs and config
//!   as in `benches/hidden.rs` (λ = 0.3, label smoothing 0.1, pad 0, lengths in `[S/2, S]`,
//!   tied weight N(0, 1/D), default blocks). `ce_bleu_from_hidden` runs blocks of rows: in this
//!   bench's build (`cuda-unverified`) the row op's CUDA kernels on each block's cuBLAS logits,
//!   composed ops on each block without the feature; it has no `_composed` twin: one row, `kern`
//!   "-"; the logits row beside it runs `ce_bleu_from_logits` (on) or
//!   `ce_bleu_from_logits_composed` (off).
//!
//! Per shape, each row runs `--warmup` untimed steps (NVRTC compile and cuBLAS set-up included),
//! one untimed memory step, then `--repeats` rounds that alternate the rows; every step ends
//! with `device.synchronize()` inside the timer (CUDA is asynchronous). The table gives the
//! median and min–max in ms.
//!
//! Peak device memory: candle 0.11 has no caching allocator of its own; its CUDA backend
//! allocates every buffer through cudarc 0.19's `CudaStream::alloc`, which calls
//! `cuMemAllocAsync` (and `cuMemFreeAsync` on drop) when the context `has_async_alloc()`
//! (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`): those come from the device's current memory
//! pool (`cuDeviceGetMemPool`, the default pool unless someone set another). Before a step the
//! bench reads the pool's `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` and sets `CU_MEMPOOL_ATTR_USED_MEM_HIGH`
//! to 0 (which resets the high-water mark to the current use); after the step and a synchronize
//! it reads `CU_MEMPOOL_ATTR_USED_MEM_HIGH`; the peak is the difference: everything the step
//! allocated on top of the inputs (logits or hidden states and weight, references, targets),
//! the gradients included; the maximum over the memory step and the timed steps. It is reported in bytes and as a multiple of the `[B, S, V]` logits
//! tensor (in the logits' dtype; f32 for the hidden rows). cuBLAS's own workspace (allocated by
//! cuBLAS, not candle) is outside the pool. Without memory pools the bench falls back to
//! sampling `cuMemGetInfo` from a second thread during the memory step (free before − least free
//! seen: a lower bound, whole-device) and says so. The PyTorch side reports
//! `max_memory_allocated()` − `memory_allocated()` before the step, the same quantity through its
//! caching allocator.
//!
//! `--json PATH` (default `benches/results/cuda-<unix time>.json`) gets the raw rows; `--torch
//! PATH` reads `benches/torch_cuda.py`'s JSON and adds, per row, candle / eager and
//! candle / compile for the median time and the peak memory (< 1: candle is faster / smaller).
//! `--quick`: tiny shapes (a smoke run; `torch_cuda.py --quick` uses the same). `--cpu` runs the
//! rows on the CPU (no device memory; for checking the bench on a machine without a GPU).

#[path = "common/ids.rs"]
mod ids;

use anyhow::{anyhow, Context, Result};
use candle_bleu::loss::{
    bleu_loss_from_logits, bleu_loss_from_logits_composed, ce_bleu_from_hidden,
    ce_bleu_from_logits, ce_bleu_from_logits_composed, cross_entropy_from_logits,
    cross_entropy_from_logits_composed, ctc_bleu_loss_from_logits,
    ctc_bleu_loss_from_logits_composed, ctc_loss, ctc_loss_composed, ctc_loss_from_logits,
    ctc_loss_from_logits_composed, log_softmax, log_softmax_slow, BleuLossConfig,
    CrossEntropyConfig, CtcConfig, Form, HiddenConfig, References, TrainingLossConfig,
    TrainingTargets,
};
use candle_core::cuda_backend::cudarc::driver::{result as cu, sys, CudaContext};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::Linear;
use serde_json::{json, Value};
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

const LOGITS_SHAPES: [([usize; 4], DType); 2] = [
    ([32, 64, 64, 32000], DType::F32),
    ([64, 128, 128, 50000], DType::BF16),
];
const LOGITS_SHAPES_QUICK: [([usize; 4], DType); 2] = [
    ([4, 16, 16, 1000], DType::F32),
    ([8, 16, 16, 2000], DType::BF16),
];
/// The CTC rows' `[B, T', L, V]`: the CPU bench's shape (`benches/ctc.rs`), f32.
const CTC_SHAPES: [[usize; 4]; 1] = [[32, 128, 48, 8000]];
const CTC_SHAPES_QUICK: [[usize; 4]; 1] = [[4, 32, 8, 500]];
const HIDDEN_SHAPES: [[usize; 5]; 2] = [[32, 64, 512, 64, 32000], [32, 64, 512, 64, 128000]];
const HIDDEN_SHAPES_QUICK: [[usize; 5]; 2] = [[4, 16, 64, 16, 1000], [4, 16, 64, 16, 4000]];

struct Args {
    quick: bool,
    repeats: usize,
    warmup: usize,
    json: Option<String>,
    torch: Option<String>,
    only: Option<Vec<String>>,
    kernels: Vec<bool>,
    cpu: bool,
    /// `--pool-threshold BYTES|max`: the CUDA memory pool's release threshold
    /// (`candle_bleu::cuda_pool`, a `cuda-unverified` build); the driver's default otherwise.
    pool_threshold: Option<u64>,
}

const USAGE: &str =
    "usage: cuda [--quick] [--repeats N] [--warmup N] [--json PATH] [--torch PATH] \
[--only KEY,...] [--kernels both|off|on] [--cpu] [--pool-threshold BYTES|max]
  KEY: cross_entropy, expected, lower_bound, paired, ce_expected, hidden_ce_expected, logits, hidden
  --kernels: off = the _composed functions, on = the fast functions (the crate's CUDA kernels),
  both = each row both ways";

/// Whether this binary times host against device per step (CUDA events; not yet run on a GPU).
const SPLIT_BUILT: bool = cfg!(feature = "cuda-unverified");

fn parse_args() -> Result<Args> {
    let mut args = Args {
        quick: false,
        repeats: 10,
        warmup: 2,
        json: None,
        torch: None,
        only: None,
        kernels: Vec::new(),
        cpu: false,
        pool_threshold: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow!("{arg} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--cpu" => args.cpu = true,
            "--repeats" => args.repeats = value()?.parse().context("--repeats N")?,
            "--warmup" => args.warmup = value()?.parse().context("--warmup N")?,
            "--json" => args.json = Some(value()?),
            "--pool-threshold" => {
                args.pool_threshold = Some(match value()?.as_str() {
                    "max" => u64::MAX,
                    bytes => bytes.parse().context("--pool-threshold BYTES|max")?,
                })
            }
            "--torch" => args.torch = Some(value()?),
            "--only" => args.only = Some(value()?.split(',').map(String::from).collect()),
            "--kernels" => {
                args.kernels = match value()?.as_str() {
                    "both" => vec![false, true],
                    "off" => vec![false],
                    "on" => vec![true],
                    other => anyhow::bail!("--kernels both|off|on, got {other}"),
                }
            }
            // `cargo bench` passes --bench to harness-less benches.
            "--bench" => {}
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    anyhow::ensure!(args.repeats >= 1, "--repeats must be at least 1");
    if args.kernels.is_empty() {
        args.kernels = vec![false, true];
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------------
// Peak device memory
// ---------------------------------------------------------------------------------------------

/// How the peak device memory of a step is read.
enum Memory {
    /// The device's current memory pool, which candle's `cuMemAllocAsync` allocations come from.
    Pool(sys::CUmemoryPool),
    /// No memory pools: `cuMemGetInfo` sampled from a second thread (whole device, lower bound).
    Sampled(Arc<CudaContext>),
    /// On the CPU (`--cpu`): not measured.
    Off,
}

fn pool_attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: `pool` is the device's pool (cuDeviceGetMemPool); the USED_MEM_* and
    // RESERVED_MEM_* attributes are cuuint64_t, which `value` is.
    unsafe { cu::mem_pool::get_attribute(pool, attr, &mut value as *mut u64 as *mut c_void) }
        .map_err(|e| anyhow!("cuMemPoolGetAttribute({attr:?}): {e:?}"))?;
    Ok(value)
}

fn reset_pool_high(pool: sys::CUmemoryPool) -> Result<()> {
    let mut zero: u64 = 0;
    let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    // SAFETY: as above; USED_MEM_HIGH may only be set to 0, which resets it to the current use.
    unsafe { cu::mem_pool::set_attribute(pool, attr, &mut zero as *mut u64 as *mut c_void) }
        .map_err(|e| anyhow!("cuMemPoolSetAttribute(USED_MEM_HIGH, 0): {e:?}"))
}

/// What a [`Memory`] read before a step.
enum Before {
    Pool(u64),
    Sampled {
        free: usize,
        stop: Arc<AtomicBool>,
        sampler: std::thread::JoinHandle<Result<usize>>,
    },
    Off,
}

impl Memory {
    fn method(&self) -> &'static str {
        match self {
            Memory::Pool(_) => {
                "CU_MEMPOOL_ATTR_USED_MEM_HIGH after the step (reset to 0 before it) minus \
                 CU_MEMPOOL_ATTR_USED_MEM_CURRENT before it, on the device's current memory pool \
                 (candle allocates with cuMemAllocAsync)"
            }
            Memory::Sampled(_) => {
                "FALLBACK (no memory pools, has_async_alloc() = false): cuMemGetInfo free memory \
                 before the step minus the least free memory sampled from a second thread during \
                 it; a lower bound, and counts anything else on the device"
            }
            Memory::Off => "not measured (CPU)",
        }
    }

    /// Bytes in use in the pool now (the inputs), where a pool is read.
    fn in_use(&self) -> Result<Option<u64>> {
        match self {
            Memory::Pool(pool) => Ok(Some(pool_attribute(
                *pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            )?)),
            _ => Ok(None),
        }
    }

    /// Call after a synchronize, right before the step.
    fn before(&self) -> Result<Before> {
        match self {
            Memory::Pool(pool) => {
                let current = pool_attribute(
                    *pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                )?;
                reset_pool_high(*pool)?;
                Ok(Before::Pool(current))
            }
            Memory::Sampled(ctx) => {
                let (free, _) = ctx.mem_get_info()?;
                let stop = Arc::new(AtomicBool::new(false));
                let (ctx, flag) = (ctx.clone(), stop.clone());
                let sampler = std::thread::spawn(move || -> Result<usize> {
                    let mut least = usize::MAX;
                    loop {
                        let done = flag.load(Ordering::Relaxed);
                        least = least.min(ctx.mem_get_info()?.0);
                        if done {
                            return Ok(least);
                        }
                    }
                });
                Ok(Before::Sampled {
                    free,
                    stop,
                    sampler,
                })
            }
            Memory::Off => Ok(Before::Off),
        }
    }

    /// Call after the step and a synchronize: the step's peak bytes above `before`.
    fn after(&self, before: Before) -> Result<Option<u64>> {
        match (self, before) {
            (Memory::Pool(pool), Before::Pool(current)) => {
                let high = pool_attribute(
                    *pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                )?;
                Ok(Some(high.saturating_sub(current)))
            }
            (
                Memory::Sampled(_),
                Before::Sampled {
                    free,
                    stop,
                    sampler,
                },
            ) => {
                stop.store(true, Ordering::Relaxed);
                let least = sampler
                    .join()
                    .map_err(|_| anyhow!("the cuMemGetInfo sampler panicked"))??;
                Ok(Some(free.saturating_sub(least) as u64))
            }
            _ => Ok(None),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

/// The header lines, their JSON, and how memory is read.
fn describe(device: &Device) -> Result<(Vec<String>, Value, Memory)> {
    let Device::Cuda(cuda) = device else {
        return Ok((
            vec![
                "device: cpu (--cpu: a smoke run of the rows; no device memory, times are not GPU times)"
                    .into(),
            ],
            json!({ "name": "cpu" }),
            Memory::Off,
        ));
    };
    let stream = cuda.cuda_stream();
    let ctx = stream.context().clone();
    let name = ctx.name()?;
    let (major, minor) = ctx.compute_capability()?;
    let total = ctx.total_mem()?;
    let mut driver: i32 = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver) }.result()?;
    let (mut nvrtc_major, mut nvrtc_minor) = (0i32, 0i32);
    // SAFETY: writes two ints.
    let nvrtc_version = unsafe { nvrtc::sys::nvrtcVersion(&mut nvrtc_major, &mut nvrtc_minor) }
        .result()
        .ok()
        .map(|_| format!("{nvrtc_major}.{nvrtc_minor}"));
    let built_for = option_env!("CUDARC_CUDA_VERSION").unwrap_or("unknown");
    let cu_device = ctx.cu_device();
    let async_alloc = ctx.has_async_alloc();
    let mut lines = vec![
        format!(
            "device: cuda:0 {name} (compute capability {major}.{minor}, {:.1} GiB)",
            total as f64 / (1u64 << 30) as f64
        ),
        format!(
            "CUDA driver {}.{} (cuDriverGetVersion {driver}); built against CUDA {built_for} \
             (CUDARC_CUDA_VERSION); NVRTC {}; CUDA_COMPUTE_CAP at build {}",
            driver / 1000,
            (driver % 1000) / 10,
            nvrtc_version.as_deref().unwrap_or("unknown"),
            option_env!("CUDA_COMPUTE_CAP").unwrap_or("unknown"),
        ),
        format!(
            "candle: gemm_reduced_precision f32 {} / bf16 {} (TF32 off unless set)",
            candle_core::cuda_backend::gemm_reduced_precision_f32(),
            candle_core::cuda_backend::gemm_reduced_precision_bf16(),
        ),
    ];
    let mut default_is_current = None;
    let memory = if async_alloc {
        // SAFETY: `cu_device` is candle's context's device.
        let pool = unsafe { cu::device::get_mem_pool(cu_device) }?;
        // SAFETY: as above.
        let default_pool = unsafe { cu::device::get_default_mem_pool(cu_device) }?;
        default_is_current = Some(pool == default_pool);
        lines.push(format!(
            "memory: has_async_alloc() = true: candle allocates with cuMemAllocAsync from the \
             device's current memory pool ({}); peak = USED_MEM_HIGH − USED_MEM_CURRENT per step",
            if pool == default_pool {
                "the default pool"
            } else {
                "NOT the default pool"
            }
        ));
        Memory::Pool(pool)
    } else {
        lines.push(
            "memory: has_async_alloc() = false (no memory pools): FALLBACK to cuMemGetInfo \
             sampled during the step (a whole-device lower bound)"
                .into(),
        );
        Memory::Sampled(ctx.clone())
    };
    let info = json!({
        "name": name,
        "compute_capability": format!("{major}.{minor}"),
        "total_mem_bytes": total,
        "driver_version": driver,
        "cuda_build_version": built_for,
        "nvrtc_version": nvrtc_version,
        "has_async_alloc": async_alloc,
        "pool_is_default": default_is_current,
        "gemm_reduced_precision_f32": candle_core::cuda_backend::gemm_reduced_precision_f32(),
        "gemm_reduced_precision_bf16": candle_core::cuda_backend::gemm_reduced_precision_bf16(),
    });
    Ok((lines, info, memory))
}

// ---------------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------------

/// One forward + backward step; the argument picks the fast function (`true`) or its
/// `_composed` twin (`false`).
type Step<'a> = Rc<dyn Fn(bool) -> candle_core::Result<()> + 'a>;

/// A row's step and whether it has a `_composed` twin (else one row, run as the fast function).
struct Steps<'a> {
    name: &'static str,
    key: &'static str,
    step: Step<'a>,
    composed_twin: bool,
}

struct Row<'a> {
    name: &'static str,
    /// The row's name in torch_cuda.py's JSON.
    key: &'static str,
    /// `Some(true)`: the fast function; `Some(false)`: the `_composed` one; `None`: a function
    /// without a `_composed` twin.
    kernels: Option<bool>,
    step: Step<'a>,
}

/// The rows of `steps`, each with the wanted `kernels` settings (once where there is no twin).
fn rows_of<'a>(
    steps: Vec<Steps<'a>>,
    kernels: &[bool],
    only: &Option<Vec<String>>,
    group: &str,
) -> Vec<Row<'a>> {
    let mut rows = Vec::new();
    for s in steps {
        if !wanted(only, s.key, group) {
            continue;
        }
        let settings: Vec<Option<bool>> = if s.composed_twin {
            kernels.iter().map(|&k| Some(k)).collect()
        } else {
            vec![None]
        };
        for kernels in settings {
            rows.push(Row {
                name: s.name,
                key: s.key,
                kernels,
                step: s.step.clone(),
            });
        }
    }
    rows
}

#[derive(Default)]
struct Outcome {
    runs_ms: Vec<f64>,
    /// Per timed step, with `cuda-unverified` on CUDA: the host's time to issue the step.
    host_ms: Vec<f64>,
    /// Per timed step, likewise: the CUDA events' time around the step's launches.
    device_ms: Vec<f64>,
    peak_bytes: Option<u64>,
    peak_runs: Vec<u64>,
    error: Option<String>,
}

/// The inputs of `benches/loss.rs`.
struct LogitsInputs {
    var: Var,
    refs: References,
    targets: Tensor,
}

fn logits_inputs(device: &Device, [b, s, t, v]: [usize; 4], dtype: DType) -> Result<LogitsInputs> {
    let logits = Tensor::randn(0f32, 1.0, (b, s, v), device)?.to_dtype(dtype)?;
    // Ids drawn on the CPU (curand's uniform is in (0, 1], which could give the id V).
    let ids = Tensor::rand(0f32, v as f32, (b, t), &Device::Cpu)?
        .to_dtype(DType::U32)?
        .to_device(device)?;
    let targets = Tensor::rand(0f32, v as f32, (b, s), &Device::Cpu)?
        .to_dtype(DType::U32)?
        .to_device(device)?;
    Ok(LogitsInputs {
        var: Var::from_tensor(&logits)?,
        refs: References::from_ids(&ids, u32::MAX)?,
        targets,
    })
}

fn logits_steps(x: &LogitsInputs) -> Vec<Steps<'_>> {
    let bleu = |form: Form| -> Step<'_> {
        Rc::new(move |fast| {
            let cfg = BleuLossConfig {
                form,
                ..Default::default()
            };
            let out = if fast {
                bleu_loss_from_logits(x.var.as_tensor(), None, &x.refs, &cfg)?
            } else {
                bleu_loss_from_logits_composed(x.var.as_tensor(), None, &x.refs, &cfg)?
            };
            drop(out.loss.backward()?);
            Ok(())
        })
    };
    let cross_entropy = |cfg: CrossEntropyConfig| -> Step<'_> {
        Rc::new(move |fast| {
            let logits = x.var.as_tensor();
            let loss = if fast {
                cross_entropy_from_logits(logits, &x.targets, &cfg)?.loss
            } else {
                cross_entropy_from_logits_composed(logits, &x.targets, &cfg)?.loss
            };
            drop(loss.backward()?);
            Ok(())
        })
    };
    let vocab = x.var.dim(2).unwrap_or(1);
    // Liger-Kernel's options at once: class weights (in [0.5, 1.5]), label smoothing 0.1, the
    // z-loss (1e-4) and the token accuracy, padding 0 (torch_cuda.py's `ce_options`).
    let options = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        z_loss: 1e-4,
        token_accuracy: true,
        class_weights: Some(
            (0..vocab)
                .map(|v| 0.5 + v as f64 / vocab.max(2) as f64)
                .collect(),
        ),
        ..Default::default()
    };
    let steps: [(&'static str, &'static str, Step<'_>); 6] = [
        (
            "cross_entropy_from_logits",
            "cross_entropy",
            cross_entropy(CrossEntropyConfig::default()),
        ),
        (
            "cross_entropy_from_logits options",
            "ce_options",
            cross_entropy(options),
        ),
        (
            "bleu_loss_from_logits Expected",
            "expected",
            bleu(Form::Expected),
        ),
        (
            "bleu_loss_from_logits LowerBound",
            "lower_bound",
            bleu(Form::LowerBound),
        ),
        ("bleu_loss_from_logits Paired", "paired", bleu(Form::Paired)),
        (
            "ce_bleu_from_logits Expected",
            "ce_expected",
            Rc::new(move |fast| {
                let cfg = TrainingLossConfig::default();
                let targets = TrainingTargets::new(&x.targets, &x.refs);
                let out = if fast {
                    ce_bleu_from_logits(x.var.as_tensor(), &targets, &cfg)?
                } else {
                    ce_bleu_from_logits_composed(x.var.as_tensor(), &targets, &cfg)?
                };
                drop(out.loss.backward()?);
                Ok(())
            }),
        ),
    ];
    steps
        .into_iter()
        .map(|(name, key, step)| Steps {
            name,
            key,
            step,
            composed_twin: true,
        })
        .collect()
}

/// The CTC rows' inputs: logits N(0, 1) `[B, T', V]`, targets `[B, L]` drawn in `[1, V)` (blank
/// 0) on the CPU and moved, every input length `T'` and target length `L`; the targets are also
/// the BLEU rows' references.
struct CtcInputs {
    var: Var,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    refs: References,
}

fn ctc_inputs(device: &Device, [b, t, l, v]: [usize; 4]) -> Result<CtcInputs> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let ids: Vec<u32> = (0..b * l).map(|_| rng.gen_range(1..v as u32)).collect();
    let targets = Tensor::from_vec(ids, (b, l), device)?;
    let logits = Tensor::randn(0f32, 1.0, (b, t, v), &Device::Cpu)?.to_device(device)?;
    Ok(CtcInputs {
        var: Var::from_tensor(&logits)?,
        refs: References::from_ids(&targets, u32::MAX)?,
        targets,
        input_lengths: Tensor::from_vec(vec![t as u32; b], b, device)?,
        target_lengths: Tensor::from_vec(vec![l as u32; b], b, device)?,
    })
}

/// The CTC rows: the fused CTC loss, PyTorch's idiom `ctc_loss(log_softmax(x))` with the crate's
/// `log_softmax` (both against torch_cuda.py's `ctc`, `F.ctc_loss(F.log_softmax)`), and the BLEU
/// loss on CTC outputs (4-grams); each against its composed twin (kernels off).
fn ctc_steps(x: &CtcInputs) -> Vec<Steps<'_>> {
    let cfg = Rc::new(CtcConfig::default());
    let (cfg_fused, cfg_idiom) = (cfg.clone(), cfg);
    let steps: [(&'static str, &'static str, Step<'_>); 3] = [
        (
            "ctc_loss_from_logits",
            "ctc",
            Rc::new(move |fast| {
                let f = if fast {
                    ctc_loss_from_logits
                } else {
                    ctc_loss_from_logits_composed
                };
                let loss = f(
                    x.var.as_tensor(),
                    &x.targets,
                    &x.input_lengths,
                    &x.target_lengths,
                    &cfg_fused,
                )?;
                drop(loss.backward()?);
                Ok(())
            }),
        ),
        (
            "ctc_loss(log_softmax)",
            "ctc",
            Rc::new(move |fast| {
                let loss = if fast {
                    let log_probs = log_softmax(x.var.as_tensor())?;
                    ctc_loss(
                        &log_probs,
                        &x.targets,
                        &x.input_lengths,
                        &x.target_lengths,
                        &cfg_idiom,
                    )?
                } else {
                    let log_probs = log_softmax_slow(x.var.as_tensor())?;
                    ctc_loss_composed(
                        &log_probs,
                        &x.targets,
                        &x.input_lengths,
                        &x.target_lengths,
                        &cfg_idiom,
                    )?
                };
                drop(loss.backward()?);
                Ok(())
            }),
        ),
        (
            "ctc_bleu_loss_from_logits",
            "ctc_bleu4",
            Rc::new(move |fast| {
                let f = if fast {
                    ctc_bleu_loss_from_logits
                } else {
                    ctc_bleu_loss_from_logits_composed
                };
                let out = f(
                    x.var.as_tensor(),
                    Some(&x.input_lengths),
                    &x.refs,
                    0,
                    &BleuLossConfig::default(),
                )?;
                drop(out.loss.backward()?);
                Ok(())
            }),
        ),
    ];
    steps
        .into_iter()
        .map(|(name, key, step)| Steps {
            name,
            key,
            step,
            composed_twin: true,
        })
        .collect()
}

/// The inputs of `benches/hidden.rs` (σ = 1, no Zipf prior), built on the CPU and moved.
struct HiddenInputs {
    hidden: Var,
    proj: Linear,
    refs: References,
    targets: Tensor,
    lengths: Tensor,
}

/// `bytes` in MiB.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// `, pool in use with the inputs N MiB` of a group's title, when the pool can be read.
fn pool_note(in_use: Option<u64>) -> String {
    in_use.map_or(String::new(), |u| {
        format!(", pool in use with the inputs {:.1} MiB", mib(u as usize))
    })
}

fn hidden_inputs(device: &Device, [b, s, d, t, v]: [usize; 5]) -> Result<HiddenInputs> {
    use rand::SeedableRng;
    let cpu = Device::Cpu;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2024);
    let hidden = Tensor::randn(0f32, 1.0, (b, s, d), &cpu)?.to_device(device)?;
    let weight =
        Tensor::randn(0f32, (1.0 / (d as f64).sqrt()) as f32, (v, d), &cpu)?.to_device(device)?;
    let (ref_ids, target_ids, lengths) = ids::random_ids(&mut rng, [b, s, t, v]);
    let weight = Var::from_tensor(&weight)?;
    Ok(HiddenInputs {
        hidden: Var::from_tensor(&hidden)?,
        proj: Linear::new(weight.as_tensor().clone(), None),
        refs: References::from_ids(&Tensor::from_vec(ref_ids, (b, t), device)?, 0)?,
        targets: Tensor::from_vec(target_ids, (b, s), device)?,
        lengths: Tensor::from_vec(lengths, b, device)?,
    })
}

/// `benches/hidden.rs`'s config: λ = 0.3, pad 0, label smoothing 0.1, default blocks.
fn hidden_config() -> TrainingLossConfig {
    TrainingLossConfig {
        bleu_weight: 0.3,
        ce: CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        },
        bleu: BleuLossConfig::default(),
    }
}

fn hidden_steps(x: &HiddenInputs) -> Vec<Steps<'_>> {
    vec![
        Steps {
            name: "ce_bleu_from_hidden Expected",
            key: "hidden_ce_expected",
            // No `_composed` twin: on CUDA it runs composed blocks in either build.
            step: Rc::new(move |_: bool| {
                let out = ce_bleu_from_hidden(
                    x.hidden.as_tensor(),
                    &x.proj,
                    &TrainingTargets::new(&x.targets, &x.refs).with_hyp_lengths(&x.lengths),
                    &hidden_config(),
                    &HiddenConfig::default(),
                )?;
                drop(out.loss.backward()?);
                Ok(())
            }),
            composed_twin: false,
        },
        Steps {
            name: "Linear + ce_bleu_from_logits Expected",
            key: "hidden_ce_expected",
            step: Rc::new(move |fast| {
                let logits = x.proj.forward(x.hidden.as_tensor())?;
                let targets =
                    TrainingTargets::new(&x.targets, &x.refs).with_hyp_lengths(&x.lengths);
                let out = if fast {
                    ce_bleu_from_logits(&logits, &targets, &hidden_config())?
                } else {
                    ce_bleu_from_logits_composed(&logits, &targets, &hidden_config())?
                };
                drop(out.loss.backward()?);
                Ok(())
            }),
            composed_twin: true,
        },
    ]
}

fn wanted(only: &Option<Vec<String>>, key: &str, group: &str) -> bool {
    only.as_ref()
        .is_none_or(|keys| keys.iter().any(|k| k == key || k == group))
}

/// One timed step: wall ms (synchronize included), peak bytes, and with `cuda-unverified` on
/// CUDA the host's and the events' ms (see the module docs).
struct Timed {
    ms: f64,
    peak: Option<u64>,
    split: Option<(f64, f64)>,
}

/// One step of `row`, synchronized, timed; with the memory read around it when `memory`.
fn run_step(device: &Device, row: &Row, memory: Option<&Memory>) -> Result<Timed> {
    device.synchronize()?;
    let before = memory.map(Memory::before).transpose()?;
    let events = split::Started::on(device)?;
    let start = Instant::now();
    let stepped = (row.step)(row.kernels.unwrap_or(true));
    let host_ms = start.elapsed().as_secs_f64() * 1e3;
    let events = events.map(split::Started::stop).transpose()?;
    let result = stepped.and_then(|()| device.synchronize());
    let ms = start.elapsed().as_secs_f64() * 1e3;
    // Read (and stop a sampler) even when the step failed.
    let peak = match (memory, before) {
        (Some(m), Some(b)) => m.after(b),
        _ => Ok(None),
    };
    result?;
    let split = match events {
        Some(e) => Some((host_ms, e.elapsed_ms()?)),
        None => None,
    };
    Ok(Timed {
        ms,
        peak: peak?,
        split,
    })
}

/// CUDA events around a step's launches, on candle's stream (one stream per device in candle
/// 0.11). With the `cuda-unverified` feature only: this has not yet run on a GPU.
#[cfg(feature = "cuda-unverified")]
mod split {
    use anyhow::{anyhow, Result};
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaEvent, CudaStream};
    use candle_core::Device;
    use std::sync::Arc;

    /// Events with timing (`CU_EVENT_DEFAULT`; cudarc's default disables it).
    fn record(stream: &CudaStream) -> Result<CudaEvent> {
        stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| anyhow!("cuEventRecord: {e:?}"))
    }

    /// The start event, recorded before the step's first launch.
    pub struct Started {
        stream: Arc<CudaStream>,
        start: CudaEvent,
    }

    impl Started {
        /// `None` off CUDA.
        pub fn on(device: &Device) -> Result<Option<Self>> {
            let Device::Cuda(cuda) = device else {
                return Ok(None);
            };
            let stream = cuda.cuda_stream();
            let start = record(&stream)?;
            Ok(Some(Self { stream, start }))
        }

        /// Records the end event, after the step's last launch (before any synchronize).
        pub fn stop(self) -> Result<Stopped> {
            let end = record(&self.stream)?;
            Ok(Stopped {
                start: self.start,
                end,
            })
        }
    }

    pub struct Stopped {
        start: CudaEvent,
        end: CudaEvent,
    }

    impl Stopped {
        /// The GPU's ms between the events (waits for the end event).
        pub fn elapsed_ms(&self) -> Result<f64> {
            self.start
                .elapsed_ms(&self.end)
                .map(f64::from)
                .map_err(|e| anyhow!("cuEventElapsedTime: {e:?}"))
        }
    }
}

/// Without `cuda-unverified`: no events, no split.
#[cfg(not(feature = "cuda-unverified"))]
mod split {
    use anyhow::Result;
    use candle_core::Device;

    pub enum Started {}

    impl Started {
        pub fn on(_device: &Device) -> Result<Option<Self>> {
            Ok(None)
        }

        pub fn stop(self) -> Result<Stopped> {
            match self {}
        }
    }

    pub enum Stopped {}

    impl Stopped {
        pub fn elapsed_ms(&self) -> Result<f64> {
            match *self {}
        }
    }
}

/// Warm-up, one memory step, then `repeats` rounds alternating the rows.
fn run_group(
    device: &Device,
    memory: &Memory,
    rows: &[Row],
    warmup: usize,
    repeats: usize,
) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = rows.iter().map(|_| Outcome::default()).collect();
    let pool = matches!(memory, Memory::Pool(_));
    for (row, o) in rows.iter().zip(&mut out) {
        for _ in 0..warmup {
            if let Err(e) = run_step(device, row, None) {
                o.error = Some(format!("warm-up: {e:#}"));
                break;
            }
        }
    }
    for (row, o) in rows.iter().zip(&mut out) {
        if o.error.is_none() {
            match run_step(device, row, Some(memory)) {
                Ok(timed) => o.peak_bytes = timed.peak,
                Err(e) => o.error = Some(format!("memory step: {e:#}")),
            }
        }
    }
    for _ in 0..repeats {
        for (row, o) in rows.iter().zip(&mut out) {
            if o.error.is_some() {
                continue;
            }
            // The pool's counters cost two host calls outside the timer; the sampling fallback
            // would run a thread beside the step, so it reads the memory step only.
            match run_step(device, row, pool.then_some(memory)) {
                Ok(Timed { ms, peak, split }) => {
                    o.runs_ms.push(ms);
                    if let Some((host, device)) = split {
                        o.host_ms.push(host);
                        o.device_ms.push(device);
                    }
                    if let Some(p) = peak {
                        o.peak_runs.push(p);
                        o.peak_bytes = o.peak_bytes.max(Some(p));
                    }
                }
                Err(e) => o.error = Some(format!("timed run: {e:#}")),
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// PyTorch's numbers
// ---------------------------------------------------------------------------------------------

/// torch_cuda.py's row for (key, shape, dtype, mode), where it has a time.
fn torch_row<'a>(
    torch: &'a Option<Value>,
    key: &str,
    shape: &[usize],
    dtype: &str,
    mode: &str,
) -> Option<&'a Value> {
    torch.as_ref()?.get("rows")?.as_array()?.iter().find(|r| {
        let row_shape: Option<Vec<usize>> = r.get("shape").and_then(|s| {
            s.as_array()?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect()
        });
        r.get("name").and_then(Value::as_str) == Some(key)
            && row_shape.as_deref() == Some(shape)
            && r.get("dtype").and_then(Value::as_str) == Some(dtype)
            && r.get("mode").and_then(Value::as_str) == Some(mode)
            && r.get("median_ms").and_then(Value::as_f64).is_some()
    })
}

fn ratio(ours: Option<f64>, theirs: Option<f64>) -> Option<f64> {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

fn median_min_max(times: &[f64]) -> Option<(f64, f64, f64)> {
    if times.is_empty() {
        return None;
    }
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some((
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    ))
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F64 => "f64",
        _ => "f32",
    }
}

/// Prints a group's table and appends its JSON rows.
#[allow(clippy::too_many_arguments)]
fn report(
    title: &str,
    shape: &[usize],
    dtype: &str,
    logits_bytes: usize,
    rows: &[Row],
    outcomes: &[Outcome],
    torch: &Option<Value>,
    raw: &mut Vec<Value>,
) {
    println!("\n{title}");
    println!(
        "{:<40} {:>4} {:>9} {:>17} {:>10} {:>7} | {:>7} {:>7} | {:>7} {:>7}",
        "row",
        "kern",
        "median ms",
        "min-max ms",
        "peak MiB",
        "/logits",
        "t/eager",
        "t/comp",
        "m/eager",
        "m/comp"
    );
    for (row, o) in rows.iter().zip(outcomes) {
        let stats = median_min_max(&o.runs_ms);
        let eager = torch_row(torch, row.key, shape, dtype, "eager");
        let compile = torch_row(torch, row.key, shape, dtype, "compile");
        let t = |r: Option<&Value>, field: &str| r.and_then(|r| r.get(field)?.as_f64());
        let median = stats.map(|s| s.0);
        let peak = o.peak_bytes.map(|p| p as f64);
        let ratios = [
            ratio(median, t(eager, "median_ms")),
            ratio(median, t(compile, "median_ms")),
            ratio(peak, t(eager, "peak_bytes")),
            ratio(peak, t(compile, "peak_bytes")),
        ];
        let kern = match row.kernels {
            Some(true) => "on",
            Some(false) => "off",
            None => "-",
        };
        match (&o.error, stats) {
            (None, Some((median, min, max))) => println!(
                "{:<40} {:>4} {:>9.2} {:>17} {:>10} {:>7} | {:>7} {:>7} | {:>7} {:>7}",
                row.name,
                kern,
                median,
                format!("{min:.2}-{max:.2}"),
                o.peak_bytes.map_or("-".into(), |p| format!(
                    "{:.1}",
                    p as f64 / (1u64 << 20) as f64
                )),
                o.peak_bytes.map_or("-".into(), |p| format!(
                    "{:.2}x",
                    p as f64 / logits_bytes as f64
                )),
                fmt_ratio(ratios[0]),
                fmt_ratio(ratios[1]),
                fmt_ratio(ratios[2]),
                fmt_ratio(ratios[3]),
            ),
            (error, _) => println!(
                "{:<40} {:>4} FAILED: {}",
                row.name,
                kern,
                error
                    .as_deref()
                    .and_then(|e| e.lines().next())
                    .unwrap_or("no timed run")
            ),
        }
        raw.push(json!({
            "name": row.name,
            "key": row.key,
            "shape": shape,
            "dtype": dtype,
            "kernels": row.kernels,
            "median_ms": stats.map(|s| s.0),
            "min_ms": stats.map(|s| s.1),
            "max_ms": stats.map(|s| s.2),
            "runs_ms": o.runs_ms,
            "host_ms_runs": o.host_ms,
            "device_ms_runs": o.device_ms,
            "peak_bytes": o.peak_bytes,
            "peak_bytes_runs": o.peak_runs,
            "logits_bytes": logits_bytes,
            "peak_over_logits": o.peak_bytes.map(|p| p as f64 / logits_bytes as f64),
            "vs_torch": {
                "time_over_eager": ratios[0],
                "time_over_compile": ratios[1],
                "peak_over_eager": ratios[2],
                "peak_over_compile": ratios[3],
                "eager_error": eager.is_none().then(|| torch_error(torch, row.key, shape, dtype, "eager")).flatten(),
                "compile_error": compile.is_none().then(|| torch_error(torch, row.key, shape, dtype, "compile")).flatten(),
            },
            "error": o.error,
        }));
    }
    if outcomes.iter().any(|o| !o.host_ms.is_empty()) {
        println!(
            "{:<40} {:>4} {:>9} {:>9} {:>9} {:>7}  (medians; host: issuing the step, device: \
             CUDA events around its launches)",
            "host vs device", "kern", "wall ms", "host ms", "device ms", "h/wall"
        );
        for (row, o) in rows.iter().zip(outcomes) {
            let median = |v: &[f64]| median_min_max(v).map(|s| s.0);
            if let (Some(wall), Some(host), Some(dev)) =
                (median(&o.runs_ms), median(&o.host_ms), median(&o.device_ms))
            {
                let kern = match row.kernels {
                    Some(true) => "on",
                    Some(false) => "off",
                    None => "-",
                };
                println!(
                    "{:<40} {:>4} {:>9.2} {:>9.2} {:>9.2} {:>7.2}",
                    row.name,
                    kern,
                    wall,
                    host,
                    dev,
                    host / wall
                );
            }
        }
    }
}

/// The error string PyTorch recorded for a row that has no time.
fn torch_error(
    torch: &Option<Value>,
    key: &str,
    shape: &[usize],
    dtype: &str,
    mode: &str,
) -> Option<String> {
    torch
        .as_ref()?
        .get("rows")?
        .as_array()?
        .iter()
        .find(|r| {
            r.get("name").and_then(Value::as_str) == Some(key)
                && r.get("dtype").and_then(Value::as_str) == Some(dtype)
                && r.get("mode").and_then(Value::as_str) == Some(mode)
                && r.get("shape").and_then(Value::as_array).is_some_and(|s| {
                    s.iter()
                        .map(Value::as_u64)
                        .eq(shape.iter().map(|&d| Some(d as u64)))
                })
        })?
        .get("error")?
        .as_str()
        .map(String::from)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let device = if args.cpu {
        Device::Cpu
    } else {
        Device::new_cuda(0).map_err(|e| {
            anyhow!(
                "no CUDA device 0: {e}\nthis bench needs an NVIDIA GPU, its driver's libcuda.so.1 \
                 and the CUDA 13 libraries (libcublas, libcublasLt, libcurand, libcudart, \
                 libnvrtc) on LD_LIBRARY_PATH — not the link stub (docs/gpu.md); --cpu runs the \
                 rows on the CPU as a smoke test"
            )
        })?
    };
    let (mut header, device_info, memory) = describe(&device)?;
    if let Some(bytes) = args.pool_threshold {
        #[cfg(feature = "cuda-unverified")]
        {
            let previous = candle_bleu::cuda_pool::set_pool_release_threshold(&device, bytes)?;
            header.push(format!(
                "memory pool release threshold: {bytes} bytes (was {previous})"
            ));
        }
        #[cfg(not(feature = "cuda-unverified"))]
        anyhow::bail!(
            "--pool-threshold {bytes} needs a cuda-unverified build (candle_bleu::cuda_pool)"
        );
    }
    header.push(format!(
        "build: --features cuda{}; kernels on = the fast functions ({}), off = the _composed \
         functions",
        if SPLIT_BUILT {
            ",cuda-unverified (host vs device time per step: CUDA events, not yet verified)"
        } else {
            ""
        },
        if device.is_cpu() {
            "the CPU kernels"
        } else {
            "the crate's CUDA kernels, compiled by NVRTC on first use"
        }
    ));
    for line in &header {
        println!("{line}");
    }
    let torch: Option<Value> = match &args.torch {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("--torch {path}"))?;
            let doc: Value =
                serde_json::from_str(&text).with_context(|| format!("parsing --torch {path}"))?;
            println!(
                "torch: {path}: torch {} on {}",
                doc.get("torch_version")
                    .and_then(Value::as_str)
                    .unwrap_or("?"),
                doc.get("device_name")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
            );
            Some(doc)
        }
        None => None,
    };
    println!(
        "forward + backward per step, synchronized; {} warm-up step(s), 1 memory step, then the \
         median and min-max of {} rounds alternating the rows of a shape; kernels {}",
        args.warmup,
        args.repeats,
        match args.kernels.as_slice() {
            [false] => "off",
            [true] => "on",
            _ => "off and on",
        }
    );
    println!("peak: {}", memory.method());
    if torch.is_some() {
        println!(
            "t/eager, t/comp: candle median / PyTorch median (eager, torch.compile); m/…: peak \
             memory ratios; < 1: candle is faster / smaller"
        );
    }
    let mut raw = Vec::new();
    let (logits_shapes, hidden_shapes) = if args.quick {
        (LOGITS_SHAPES_QUICK, HIDDEN_SHAPES_QUICK)
    } else {
        (LOGITS_SHAPES, HIDDEN_SHAPES)
    };
    for (shape, dtype) in logits_shapes {
        let x = logits_inputs(&device, shape, dtype)?;
        let [b, s, _, v] = shape;
        let logits_bytes = b * s * v * dtype.size_in_bytes();
        let rows = rows_of(logits_steps(&x), &args.kernels, &args.only, "logits");
        if rows.is_empty() {
            continue;
        }
        let in_use = memory.in_use()?;
        check_pool(in_use, logits_bytes);
        let outcomes = run_group(&device, &memory, &rows, args.warmup, args.repeats);
        let title = format!(
            "logits [B,S,T,V] = {shape:?} {}: logits {:.1} MiB{}",
            dtype_name(dtype),
            mib(logits_bytes),
            pool_note(in_use)
        );
        report(
            &title,
            &shape,
            dtype_name(dtype),
            logits_bytes,
            &rows,
            &outcomes,
            &torch,
            &mut raw,
        );
    }
    let ctc_shapes = if args.quick {
        CTC_SHAPES_QUICK
    } else {
        CTC_SHAPES
    };
    for shape in ctc_shapes {
        let x = ctc_inputs(&device, shape)?;
        let [b, t, _, v] = shape;
        let logits_bytes = b * t * v * 4;
        let rows = rows_of(ctc_steps(&x), &args.kernels, &args.only, "ctc");
        if rows.is_empty() {
            continue;
        }
        let in_use = memory.in_use()?;
        check_pool(in_use, logits_bytes);
        let outcomes = run_group(&device, &memory, &rows, args.warmup, args.repeats);
        let title = format!(
            "CTC [B,T',L,V] = {shape:?} f32: logits {:.1} MiB{}",
            mib(logits_bytes),
            pool_note(in_use)
        );
        report(
            &title,
            &shape,
            "f32",
            logits_bytes,
            &rows,
            &outcomes,
            &torch,
            &mut raw,
        );
    }
    for shape in hidden_shapes {
        if !wanted(&args.only, "hidden_ce_expected", "hidden") {
            continue;
        }
        let x = hidden_inputs(&device, shape)?;
        let [b, s, d, _, v] = shape;
        let logits_bytes = b * s * v * 4;
        let rows = rows_of(hidden_steps(&x), &args.kernels, &args.only, "hidden");
        let in_use = memory.in_use()?;
        check_pool(in_use, b * s * d * 4);
        let outcomes = run_group(&device, &memory, &rows, args.warmup, args.repeats);
        let title = format!(
            "hidden states [B,S,D,T,V] = {shape:?} f32: the logits would be {:.1} MiB{}",
            mib(logits_bytes),
            pool_note(in_use)
        );
        report(
            &title,
            &shape,
            "f32",
            logits_bytes,
            &rows,
            &outcomes,
            &torch,
            &mut raw,
        );
    }

    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = args
        .json
        .clone()
        .unwrap_or_else(|| format!("benches/results/cuda-{stamp}.json"));
    let doc = json!({
        "unix_time": stamp,
        "device": device_info,
        "header": header,
        "memory_method": memory.method(),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "quick": args.quick,
        "cuda_kernels_feature": true,
        "cuda_unverified_feature": SPLIT_BUILT,
        "kernels": args.kernels,
        "torch_json": args.torch,
        "rows": raw,
    });
    if let Some(dir) = std::path::Path::new(&path).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {path}"))?;
    println!("\nraw rows: {path}");
    Ok(())
}

/// The pool must hold the inputs: otherwise candle's allocations do not come from it and the
/// peaks read from it are not candle's.
fn check_pool(in_use: Option<u64>, input_bytes: usize) {
    if let Some(used) = in_use {
        if used < input_bytes as u64 {
            println!(
                "WARNING: the memory pool holds {used} bytes with the {input_bytes}-byte inputs \
                 allocated: candle's allocations do not come from it, so the peaks below are NOT \
                 candle's"
            );
        }
    }
}
