//! The row op's CUDA kernels (`kernels.cu`, and `ce_options.cu` with the cross-entropy's
//! options) on the emulator against its CPU kernels: every pass forward and backward, f32 and f64, in several thread and block orders, each launch from the
//! CUDA side's own plans (`launch.rs`), with host buffers that carry guard zones (a write outside
//! a buffer shows) and outputs filled with NaN first (an element no thread wrote shows). Then
//! deliberately broken copies of the source, each of which must be caught.
//!
//! `cargo test --release --features cuda-emu --lib kernels::emu`

use super::module::{EmuModule, ThreadOrder};
use crate::loss::kernels::cpu::CrossEntropyTerms;
use crate::loss::kernels::ctc::launch::{CTC_16BIT_FAMILIES, CTC_BLOCK, CTC_FAMILIES, CTC_SOURCE};
use crate::loss::kernels::launch::{self as shared_launch, FloatKind, Launch};
use crate::loss::kernels::layout::Pass;
use crate::loss::kernels::matches::launch::{MATCHES_FAMILIES, MATCHES_SOURCE};
use crate::loss::kernels::row::launch::{
    self, row_args, BackwardBuffers, BackwardInput, RowArgsIn, RowPassFwdBuffers, KERNEL_FAMILIES,
    OPTIONS_16BIT_FAMILIES, OPTIONS_FAMILIES, OPTIONS_SOURCE,
};
use crate::loss::kernels::row::op::{GatherIds, RowOp};
use crate::loss::kernels::score::launch::{SCORE_FAMILIES, SCORE_SOURCE};
use crate::loss::kernels::softcap;
use candle_core::{DType, Device, Tensor, Var, WithDType};
use std::ffi::c_void;
use std::sync::OnceLock;

/// Every CUDA source of the crate as one module: the row kernels, then the CTC kernels, the
/// options kernels, the score kernels and the matches kernels, which NVRTC compiles as modules of
/// their own, each after `kernels.cu` (`ctc_launch::CTC_SOURCE`, `launch::OPTIONS_SOURCE`,
/// `score::launch::SCORE_SOURCE`, `matches::launch::MATCHES_SOURCE`).
pub(super) const SOURCE: &str = concat!(
    include_str!("../row/kernels.cu"),
    "\n",
    include_str!("../row/float16.cu"),
    "\n",
    include_str!("../ctc/ctc.cu"),
    "\n",
    include_str!("../ctc/ngrams.cu"),
    "\n",
    include_str!("../row/ce_options.cu"),
    "\n",
    include_str!("../row/log_softmax.cu"),
    "\n",
    include_str!("../score/score.cu"),
    "\n",
    include_str!("../matches/matches.cu")
);

/// The source compiled once for the emulator, for every test of this process.
pub(super) fn module() -> &'static EmuModule {
    static MODULE: OnceLock<EmuModule> = OnceLock::new();
    MODULE.get_or_init(|| compile(SOURCE))
}

pub(super) fn compile(source: &str) -> EmuModule {
    let families: Vec<&str> = KERNEL_FAMILIES
        .iter()
        .chain(&CTC_FAMILIES)
        .chain(&OPTIONS_FAMILIES)
        .chain(&SCORE_FAMILIES)
        .chain(&MATCHES_FAMILIES)
        .copied()
        .collect();
    let sixteen_bit: Vec<&str> = OPTIONS_16BIT_FAMILIES
        .iter()
        .chain(&CTC_16BIT_FAMILIES)
        .copied()
        .collect();
    EmuModule::compile(
        source,
        (&families, &sixteen_bit),
        &["BLOCK", "CTC_BLOCK", "NGRAM_MAX_COUNTS", "SCORE_MAX_ORDER"],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Each broken copy of [`SOURCE`] (`(name, from, to)`: `from`, which must occur exactly once,
/// replaced by `to`) compiled and given to `check`, which must fail on every one; `what` names
/// the kernels in the panic. Prints the first line of each failure.
pub(super) fn assert_broken_copies_caught(
    what: &str,
    mutants: &[(&str, &str, &str)],
    check: impl Fn(&EmuModule) -> Result<(), String>,
) {
    for &(name, from, to) in mutants {
        assert_eq!(
            SOURCE.matches(from).count(),
            1,
            "{name}: the text to replace"
        );
        let module = compile(&SOURCE.replace(from, to));
        match check(&module) {
            Ok(()) => panic!("the emulator tests passed a broken {what} kernel: {name}"),
            Err(failure) => println!(
                "caught {name}: {}",
                failure.lines().next().unwrap_or_default()
            ),
        }
    }
}

/// Whether `got` is within `rtol · (scale + |want|)` of `want`: `scale` the size of a sum whose
/// terms the kernel adds in another order than the CPU. NaN matches NaN only.
pub(super) fn close_scaled(got: f64, want: f64, rtol: f64, scale: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    (got - want).abs() <= rtol * (scale + want.abs())
}

/// Elements before and after each host buffer, holding a canary that a stray write changes.
const GUARD: usize = 64;

/// What the harness needs of an element type: a canary bit pattern and bitwise comparison.
pub(super) trait Element: Copy + std::fmt::Debug {
    const CANARY: Self;
    fn bits(self) -> u64;
}
impl Element for f32 {
    const CANARY: f32 = f32::from_bits(0x7fa5_a5a5);
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}
impl Element for f64 {
    const CANARY: f64 = f64::from_bits(0x7ff4_a5a5_a5a5_a5a5);
    fn bits(self) -> u64 {
        self.to_bits()
    }
}
impl Element for u32 {
    const CANARY: u32 = 0xdead_beef;
    fn bits(self) -> u64 {
        self as u64
    }
}

/// A host buffer between two guard zones.
pub(super) struct Guarded<T: Element> {
    data: Vec<T>,
    what: &'static str,
}

impl<T: Element> Guarded<T> {
    pub(super) fn new(what: &'static str, payload: &[T]) -> Self {
        let mut data = vec![T::CANARY; GUARD];
        data.extend_from_slice(payload);
        data.extend(std::iter::repeat_n(T::CANARY, GUARD));
        Self { data, what }
    }

    pub(super) fn filled(what: &'static str, len: usize, value: T) -> Self {
        Self::new(what, &vec![value; len])
    }

    pub(super) fn ptr(&mut self) -> *mut c_void {
        self.data[GUARD..].as_mut_ptr() as *mut c_void
    }

    pub(super) fn payload(&self) -> &[T] {
        &self.data[GUARD..self.data.len() - GUARD]
    }

    /// An error if a guard element changed.
    pub(super) fn check_guards(&self) -> Result<(), String> {
        let n = self.data.len();
        let touched = self.data[..GUARD]
            .iter()
            .chain(&self.data[n - GUARD..])
            .any(|x| x.bits() != T::CANARY.bits());
        if touched {
            return Err(format!("a write outside `{}`", self.what));
        }
        Ok(())
    }
}

/// Float element types of the kernels.
pub(super) trait Float: Element + WithDType + PartialOrd {
    const KIND: FloatKind;
    /// (absolute, relative) tolerance against the CPU kernels.
    const TOLERANCE: (f64, f64);
}
impl Float for f32 {
    const KIND: FloatKind = FloatKind::F32;
    const TOLERANCE: (f64, f64) = (2e-6, 2e-5);
}
impl Float for f64 {
    const KIND: FloatKind = FloatKind::F64;
    const TOLERANCE: (f64, f64) = (1e-13, 1e-11);
}

/// An error naming the first element of `got` that is not within tolerance of `want` (NaN
/// matches NaN only, an infinity only itself).
pub(super) fn compare<T: Float>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let (atol, rtol) = T::TOLERANCE;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else if g == w {
            true // infinities too
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        if !ok {
            return Err(format!("{what}[{i}]: emulator {g:e}, CPU {w:e}"));
        }
    }
    Ok(())
}

/// One configuration of the row op.
#[derive(Debug, Clone, Copy)]
struct Case {
    pass: Pass,
    batch: usize,
    seq: usize,
    vocab: usize,
    /// Gathered ids per batch element (0: none).
    width: usize,
    targets: bool,
    pad: Option<u32>,
    smoothing: f64,
    /// The cross-entropy's options, which send the launches to `ce_options.cu`.
    class_weights: bool,
    z_loss: f64,
    accuracy: bool,
    softcap: Option<f64>,
}

impl Case {
    fn rows(batch: usize, seq: usize, vocab: usize, width: usize) -> Self {
        Self {
            pass: Pass::Rows,
            batch,
            seq,
            vocab,
            width,
            targets: true,
            pad: Some(0),
            smoothing: 0.1,
            class_weights: false,
            z_loss: 0.0,
            accuracy: false,
            softcap: None,
        }
    }

    /// The same case with every option: class weights, a z-loss, the token accuracy, and a soft
    /// cap in the row pass (the self-match pass takes logits capped before the op).
    fn with_options(self) -> Self {
        Self {
            class_weights: true,
            z_loss: 0.01,
            accuracy: true,
            softcap: (self.pass == Pass::Rows).then_some(5.0),
            ..self
        }
    }
}

/// Deterministic class weights in [0, 2.1] (some 0) for `vocab` classes.
fn class_weights(vocab: usize) -> std::sync::Arc<[f64]> {
    (0..vocab).map(|v| (v % 8) as f64 * 0.3).collect()
}

/// Deterministic values in about ±`scale`.
pub(super) fn spread(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let x = ((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed)
                .wrapping_mul(0xbf58_476d_1ce4_e5b9);
            scale * ((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        })
        .collect()
}

/// The inputs of a case: logits `[B, S, V]`, ids `[B, K]` (with a repeated id in every row
/// of width ≥ 3) and targets `[B, S]` (every third one the padding id, when there is one).
struct Inputs {
    logits: Vec<f64>,
    ids: Vec<u32>,
    targets: Vec<u32>,
}

fn inputs(case: &Case, seed: u64) -> Inputs {
    let Case {
        batch,
        seq,
        vocab,
        width,
        ..
    } = *case;
    let logits = spread(batch * seq * vocab, seed, 6.0);
    let mut ids: Vec<u32> = spread(batch * width, seed ^ 1, 1.0)
        .iter()
        .map(|x| ((x.abs() * vocab as f64) as usize).min(vocab - 1) as u32)
        .collect();
    if width >= 3 {
        for row in ids.chunks_mut(width) {
            row[width - 1] = row[0];
        }
    }
    let targets: Vec<u32> = spread(batch * seq, seed ^ 2, 1.0)
        .iter()
        .enumerate()
        .map(|(i, x)| match case.pad {
            Some(pad) if i % 3 == 2 => pad,
            _ => ((x.abs() * vocab as f64) as usize).min(vocab - 1) as u32,
        })
        .collect();
    let mut logits = logits;
    if case.accuracy {
        // Rows whose target is the maximum, alone (every third row) or tied with an earlier
        // column (the next row: `argmax` picks that one); elsewhere the spread decides.
        for (r, &t) in targets.iter().enumerate() {
            let row = &mut logits[r * vocab..][..vocab];
            match r % 3 {
                0 => row[t as usize] = 7.0,
                1 => {
                    row[t as usize] = 7.0;
                    row[0] = 7.0;
                }
                _ => {}
            }
        }
    }
    Inputs {
        logits,
        ids,
        targets,
    }
}

/// The CPU op of a case and its tensors.
struct CpuCase {
    op: RowOp,
    logits: Tensor,
    /// The soft cap, which the CPU applies before the op (`softcap::softcap`) and the CUDA
    /// kernels as they read the logits.
    softcap: Option<f64>,
}

impl CpuCase {
    /// The CPU op's output on (capped) logits.
    fn apply(&self, logits: &Tensor) -> candle_core::Result<Tensor> {
        let logits = match self.softcap {
            Some(cap) => softcap::softcap(logits, cap, true)?,
            None => logits.clone(),
        };
        self.op.clone().apply(&logits)
    }

    /// What the CUDA side launches for the case.
    fn cuda_args(&self) -> candle_core::Result<RowArgsIn<'_>> {
        let mut args = self.op.cuda_args(self.logits.shape())?;
        args.softcap = self.softcap;
        Ok(args)
    }
}

fn cpu_case<T: Float>(case: &Case, inputs: &Inputs) -> candle_core::Result<CpuCase> {
    let device = Device::Cpu;
    let logits: Vec<T> = inputs.logits.iter().map(|&x| T::from_f64(x)).collect();
    let logits = Tensor::from_vec(logits, (case.batch, case.seq, case.vocab), &device)?;
    let op = match case.pass {
        Pass::Softmax => RowOp::softmax(),
        _ => {
            let gather = (case.width > 0)
                .then(|| GatherIds::from_host(&inputs.ids, (case.batch, case.width), &device))
                .transpose()?;
            let targets =
                Tensor::from_vec(inputs.targets.clone(), (case.batch, case.seq), &device)?;
            let counted: Vec<u32> = inputs
                .targets
                .iter()
                .copied()
                .filter(|&t| Some(t) != case.pad)
                .collect();
            let weights = case.class_weights.then(|| class_weights(case.vocab));
            // The mean's divisor: the count, or Σ w_t over the counted targets with weights,
            // whose z-term still divides by the count (`z_ratio`).
            let n = counted.len().max(1) as f64;
            let divisor = match &weights {
                Some(w) => counted.iter().map(|&t| w[t as usize]).sum::<f64>().max(0.5),
                None => n,
            };
            let terms = CrossEntropyTerms {
                pad_id: case.pad,
                label_smoothing: case.smoothing,
                class_weights: weights,
                z_loss: case.z_loss,
                token_accuracy: case.accuracy,
            };
            let ce = case
                .targets
                .then(|| (&targets, terms, 1.0 / divisor, divisor / n));
            RowOp::rows(case.pass == Pass::SelfMatch, gather.as_ref(), ce)?
        }
    };
    Ok(CpuCase {
        op,
        logits,
        softcap: case.softcap,
    })
}

/// The class weights in the launch's float type, or a one-element placeholder, when the launches
/// take the options (the CUDA side's `class_weights_buffer`).
fn class_weights_buffer<T: Float>(args_in: &RowArgsIn<'_>) -> Option<Guarded<T>> {
    if !args_in.has_options() {
        return None;
    }
    Some(match args_in.class_weights() {
        Some(w) => Guarded::new(
            "class_weights",
            &w.iter().map(|&w| T::from_f64(w)).collect::<Vec<_>>(),
        ),
        None => Guarded::new("class_weights", &[T::from_f64(0.0)]),
    })
}

/// The u32 data of an optional tensor of the op, or one zero (the CUDA side's placeholder).
fn held_u32(what: &'static str, tensor: Option<&Tensor>) -> Guarded<u32> {
    match tensor {
        Some(t) => Guarded::new(
            what,
            &t.flatten_all().and_then(|t| t.to_vec1()).expect("u32 data"),
        ),
        None => Guarded::new(what, &[0]),
    }
}

/// Runs `plan` and checks the guards of every buffer it touched.
pub(super) fn run(
    module: &EmuModule,
    plan: &Launch<*mut c_void>,
    order: ThreadOrder,
) -> Result<(), String> {
    // SAFETY: every buffer of the plans below is sized as the CUDA side allocates it.
    unsafe { module.run(plan, order) }.map_err(|e| format!("{order:?}: {e}"))
}

/// `out[b] = a[b] · c[b]ᵀ`-style products on the host: `[B, M, K] × [B, N, K]ᵀ` when
/// `transpose`, else `[B, M, K] × [B, K, N]`, accumulated in f64 (cuBLAS's place in the CUDA
/// path).
fn host_matmul<T: Float>(
    a: &[T],
    b: &[T],
    (batch, m, k, n): (usize, usize, usize, usize),
    transpose: bool,
) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0;
                for l in 0..k {
                    let bv = if transpose {
                        b[bi * n * k + j * k + l]
                    } else {
                        b[bi * k * n + l * n + j]
                    };
                    sum += a[bi * m * k + i * k + l].to_f64() * bv.to_f64();
                }
                out[bi * m * n + i * n + j] = T::from_f64(sum);
            }
        }
    }
    out
}

/// The emulator's forward output and logits gradient of `op` for `grad_out`, as the CUDA side
/// computes them (`cuda.rs`: the same plans, the same sequence, host products for cuBLAS's).
fn emulated<T: Float>(
    module: &EmuModule,
    args_in: &RowArgsIn<'_>,
    shape: &candle_core::Shape,
    logits: &[T],
    grad_out: &[T],
    order: ThreadOrder,
) -> Result<(Vec<T>, Vec<T>), String> {
    let e = |e: candle_core::Error| e.to_string();
    let args = row_args(args_in, shape).map_err(e)?;
    let (rows, vocab) = (args.rows, args.vocab as usize);
    let float = T::KIND;
    let nan = T::from_f64(f64::NAN);
    let mut logits_buf = Guarded::new("logits", logits);
    let mut ids = held_u32("ids", args_in.ids);
    let mut links = held_u32("links", args_in.links);
    let mut targets = held_u32("targets", args_in.targets);
    let mut weights = class_weights_buffer::<T>(args_in);
    let stride = args_in.layout.stride();
    let seq = args.rows_per_batch as usize;
    let batch = rows / seq.max(1);
    let softmax = |logits: &mut Guarded<T>| -> Result<Guarded<T>, String> {
        let mut probs = Guarded::filled("probs", rows * vocab, nan);
        let plan = launch::softmax_fwd(float, &args, logits.ptr(), probs.ptr()).map_err(e)?;
        run(module, &plan, order)?;
        probs.check_guards()?;
        Ok(probs)
    };
    // Forward.
    let mut out = match args_in.pass {
        Pass::Softmax => softmax(&mut logits_buf)?,
        _ => {
            let mut out = Guarded::filled("out", rows * stride, nan);
            let buffers = RowPassFwdBuffers {
                logits: logits_buf.ptr(),
                ids: ids.ptr(),
                targets: targets.ptr(),
                out: out.ptr(),
                class_weights: weights.as_mut().map(Guarded::ptr),
            };
            let plan = launch::row_pass_fwd(float, args_in, &args, buffers).map_err(e)?;
            run(module, &plan, order)?;
            if args_in.pass == Pass::SelfMatch {
                let probs = softmax(&mut logits_buf)?;
                let z = host_matmul(
                    probs.payload(),
                    probs.payload(),
                    (batch, seq, vocab, seq),
                    true,
                );
                for r in 0..rows {
                    out.data[GUARD + r * stride..][..seq].copy_from_slice(&z[r * seq..][..seq]);
                }
            }
            out
        }
    };
    out.check_guards()?;
    // Backward.
    let mut grad_out_buf = Guarded::new("grad_out", grad_out);
    let mut grad = Guarded::filled("grad", rows * vocab, nan);
    let (mut probs, mut dense);
    let input = match args_in.pass {
        Pass::Rows => BackwardInput::Logits(logits_buf.ptr()),
        Pass::Softmax => BackwardInput::Jacobian {
            probs: out.ptr(),
            dense: grad_out_buf.ptr(),
        },
        Pass::SelfMatch => {
            probs = softmax(&mut logits_buf)?;
            let mut sym = Guarded::filled("sym", rows * seq, nan);
            let plan =
                launch::symmetrize(float, args_in, &args, seq, grad_out_buf.ptr(), sym.ptr())
                    .map_err(e)?;
            run(module, &plan, order)?;
            sym.check_guards()?;
            dense = Guarded::new(
                "dense",
                &host_matmul(
                    sym.payload(),
                    probs.payload(),
                    (batch, seq, seq, vocab),
                    false,
                ),
            );
            BackwardInput::Jacobian {
                probs: probs.ptr(),
                dense: dense.ptr(),
            }
        }
    };
    let buffers = BackwardBuffers {
        input,
        ids: ids.ptr(),
        links: links.ptr(),
        targets: targets.ptr(),
        out: out.ptr(),
        grad_out: grad_out_buf.ptr(),
        grad: grad.ptr(),
        class_weights: weights.as_mut().map(Guarded::ptr),
    };
    let plan = launch::backward(float, args_in, &args, buffers).map_err(e)?;
    run(module, &plan, order)?;
    for buffer in [&grad, &out, &grad_out_buf, &logits_buf] {
        buffer.check_guards()?;
    }
    if let Some(weights) = &weights {
        weights.check_guards()?;
    }
    for buffer in [&ids, &links, &targets] {
        buffer.check_guards()?;
    }
    Ok((out.payload().to_vec(), grad.payload().to_vec()))
}

/// The case forward and backward on the emulator against the CPU kernels, in `orders`.
fn check_case<T: Float>(
    module: &EmuModule,
    case: &Case,
    seed: u64,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let inputs = inputs(case, seed);
    let cpu = cpu_case::<T>(case, &inputs).map_err(|e| e.to_string())?;
    // The CPU kernels: forward, then the gradient of Σ out ⊙ grad_out through the op's backward.
    let logits = Var::from_tensor(&cpu.logits).map_err(|e| e.to_string())?;
    let cpu_side = || -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
        let out = cpu.apply(logits.as_tensor())?;
        let grad_out: Vec<T> = spread(out.elem_count(), seed ^ 3, 1.0)
            .into_iter()
            .map(T::from_f64)
            .collect();
        let grad_out_t = Tensor::from_vec(grad_out.clone(), out.shape(), &Device::Cpu)?;
        let grads = (&out * &grad_out_t)?.sum_all()?.backward()?;
        let grad = grads
            .get(logits.as_tensor())
            .expect("a logits gradient")
            .flatten_all()?
            .to_vec1()?;
        Ok((out.flatten_all()?.to_vec1()?, grad_out, grad))
    };
    let (want_out, grad_out, want_grad) = cpu_side().map_err(|e| e.to_string())?;
    let shape = cpu.logits.shape();
    let args_in = cpu.cuda_args().map_err(|e| e.to_string())?;
    let logits_host: Vec<T> = cpu
        .logits
        .flatten_all()
        .and_then(|t| t.to_vec1())
        .map_err(|e| e.to_string())?;
    for &order in orders {
        let (out, grad) = emulated::<T>(module, &args_in, shape, &logits_host, &grad_out, order)?;
        compare(&format!("{case:?} {order:?} forward"), &out, &want_out)?;
        compare(&format!("{case:?} {order:?} gradient"), &grad, &want_grad)?;
    }
    Ok(())
}

/// Vocabularies below, at and around the block size and a large odd one; ids wider than a block.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &(vocab, width) in &[
        (1, 1),
        (7, 3),
        (255, 5),
        (256, 0),
        (257, 17),
        (1000, 300),
        (5003, 9),
    ] {
        cases.push(Case::rows(2, 3, vocab, width));
    }
    cases.push(Case {
        targets: false,
        pad: None,
        smoothing: 0.0,
        ..Case::rows(2, 2, 300, 4)
    });
    cases.push(Case {
        pad: None,
        smoothing: 0.0,
        ..Case::rows(1, 4, 513, 6)
    });
    for &(seq, vocab, width) in &[(1, 5, 2), (3, 300, 7), (5, 1000, 0)] {
        cases.push(Case {
            pass: Pass::SelfMatch,
            ..Case::rows(2, seq, vocab, width)
        });
    }
    cases.extend(options_cases());
    for &vocab in &[1, 31, 256, 777] {
        cases.push(Case {
            pass: Pass::Softmax,
            width: 0,
            targets: false,
            pad: None,
            smoothing: 0.0,
            ..Case::rows(2, 3, vocab, 0)
        });
    }
    cases
}

/// The cross-entropy's options (`ce_options.cu`), alone and together, in the row and the
/// self-match passes: with and without smoothing and padding, vocabularies around the block
/// size, and rows whose maximum repeats (the argmax is its first column).
fn options_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &(vocab, width) in &[(7, 3), (257, 17), (1000, 9)] {
        let base = Case::rows(2, 3, vocab, width);
        cases.push(base.with_options());
        cases.push(Case {
            class_weights: true,
            ..base
        });
        cases.push(Case {
            z_loss: 1e-3,
            smoothing: 0.0,
            ..base
        });
        cases.push(Case {
            accuracy: true,
            pad: None,
            ..base
        });
        cases.push(Case {
            softcap: Some(2.5),
            ..base
        });
        cases.push(Case {
            class_weights: true,
            smoothing: 0.0,
            z_loss: 0.1,
            ..base
        });
    }
    for &(seq, vocab, width) in &[(3, 300, 7), (2, 5, 0)] {
        cases.push(
            Case {
                pass: Pass::SelfMatch,
                ..Case::rows(2, seq, vocab, width)
            }
            .with_options(),
        );
    }
    cases
}

/// Rows holding +inf (not at thread 0), NaN, and -inf (not at its thread's first element) give
/// NaN in every value column of their rows, as the kernels document (with a soft cap too, which
/// would map an infinity to a finite value); the other rows equal the CPU kernels' on the same
/// logits with the bad rows zeroed.
fn check_non_finite_rows<T: Float>(
    module: &EmuModule,
    case: Case,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let mut inputs = inputs(&case, 7);
    let vocab = case.vocab;
    let bad = [
        (1usize, 37usize, f64::INFINITY),
        (3, 290, f64::NAN),
        (4, 261, f64::NEG_INFINITY),
    ];
    let clean = inputs.logits.clone();
    for &(row, _, _) in &bad {
        inputs.logits[row * vocab..][..vocab]
            .iter_mut()
            .for_each(|x| *x = 0.0);
    }
    let cpu = cpu_case::<T>(&case, &inputs).map_err(|e| e.to_string())?;
    let want = cpu
        .apply(&cpu.logits)
        .and_then(|t| t.flatten_all()?.to_vec1::<T>())
        .map_err(|e| e.to_string())?;
    let mut logits = clean;
    for &(row, v, value) in &bad {
        logits[row * vocab..][..vocab]
            .iter_mut()
            .for_each(|x| *x = 0.0);
        logits[row * vocab + v] = value;
    }
    let logits: Vec<T> = logits.iter().map(|&x| T::from_f64(x)).collect();
    let args_in = cpu.cuda_args().map_err(|e| e.to_string())?;
    let stride = args_in.layout.stride();
    // Every column but the weight is a value: NaN in a bad row.
    let weight_column = args_in.layout.weight_column();
    for &order in orders {
        let args = row_args(&args_in, cpu.logits.shape()).map_err(|e| e.to_string())?;
        let mut out = Guarded::filled("out", args.rows * stride, T::from_f64(f64::NAN));
        let mut logits_buf = Guarded::new("logits", &logits);
        let mut ids = held_u32("ids", args_in.ids);
        let mut targets = held_u32("targets", args_in.targets);
        let mut weights = class_weights_buffer::<T>(&args_in);
        let buffers = RowPassFwdBuffers {
            logits: logits_buf.ptr(),
            ids: ids.ptr(),
            targets: targets.ptr(),
            out: out.ptr(),
            class_weights: weights.as_mut().map(Guarded::ptr),
        };
        let plan =
            launch::row_pass_fwd(T::KIND, &args_in, &args, buffers).map_err(|e| e.to_string())?;
        run(module, &plan, order)?;
        out.check_guards()?;
        for r in 0..args.rows {
            let (got, expected) = (
                &out.payload()[r * stride..][..stride],
                &want[r * stride..][..stride],
            );
            if bad.iter().any(|&(row, _, _)| row == r) {
                if let Some(k) =
                    (0..stride).find(|&k| k != weight_column && !got[k].to_f64().is_nan())
                {
                    return Err(format!("{order:?}: row {r} holds a non-finite logit, but column {k} is {:?}, not NaN", got[k]));
                }
                compare(
                    &format!("{order:?} row {r} weight"),
                    &got[weight_column..][..1],
                    &expected[weight_column..][..1],
                )?;
            } else {
                compare(&format!("{order:?} row {r}"), got, expected)?;
            }
        }
    }
    Ok(())
}

/// Every check on `module` in `orders`: the first failure, if any.
fn check_all(module: &EmuModule, cases: &[Case], orders: &[ThreadOrder]) -> Result<(), String> {
    for (i, case) in cases.iter().enumerate() {
        check_case::<f64>(module, case, i as u64, orders)?;
        check_case::<f32>(module, case, i as u64, orders)?;
    }
    for case in [
        Case::rows(2, 3, 300, 5),
        Case::rows(2, 3, 300, 5).with_options(),
    ] {
        check_non_finite_rows::<f32>(module, case, orders)?;
        check_non_finite_rows::<f64>(module, case, orders)?;
    }
    Ok(())
}

#[test]
fn the_source_block_size_and_parameter_kinds_match_the_plans() {
    let module = module();
    assert_eq!(module.define("BLOCK"), Some(shared_launch::BLOCK as i64));
    assert_eq!(module.define("CTC_BLOCK"), Some(CTC_BLOCK as i64));
    // The emulator's one module holds the text of each module NVRTC compiles, unchanged.
    let options = OPTIONS_SOURCE.split_at(CTC_SOURCE.find("\n#line 2 \"ctc.cu\"").unwrap());
    let score = SCORE_SOURCE.split_at(SCORE_SOURCE.find("\n#line 2 \"score.cu\"").unwrap());
    assert!(SOURCE.starts_with(CTC_SOURCE) && SOURCE.starts_with(options.0));
    let matches = MATCHES_SOURCE.split_at(MATCHES_SOURCE.find("\n#line 2 \"matches.cu\"").unwrap());
    assert!(SOURCE.starts_with(score.0) && SOURCE.starts_with(matches.0));
    assert!(SOURCE.ends_with(matches.1));
    let before_matches = &SOURCE[..SOURCE.len() - matches.1.len()];
    assert!(before_matches.ends_with(score.1));
    assert!(before_matches[..before_matches.len() - score.1.len()].ends_with(options.1));
    // One plan of every kernel, in each float type, over dangling buffers (none runs).
    let p = std::ptr::null_mut::<c_void>();
    for case in [
        Case::rows(1, 2, 5, 2),
        Case::rows(1, 2, 5, 2).with_options(),
        Case {
            pass: Pass::SelfMatch,
            ..Case::rows(1, 2, 5, 2)
        },
        Case {
            pass: Pass::SelfMatch,
            ..Case::rows(1, 2, 5, 2)
        }
        .with_options(),
        Case {
            pass: Pass::Softmax,
            width: 0,
            targets: false,
            ..Case::rows(1, 2, 5, 0)
        },
    ] {
        let inputs = inputs(&case, 0);
        let cpu = cpu_case::<f64>(&case, &inputs).unwrap();
        let shape = cpu.logits.shape();
        let args_in = cpu.cuda_args().unwrap();
        let args = row_args(&args_in, shape).unwrap();
        for float in FloatKind::ALL {
            let input = match case.pass {
                Pass::Rows => BackwardInput::Logits(p),
                _ => BackwardInput::Jacobian { probs: p, dense: p },
            };
            let buffers = BackwardBuffers {
                input,
                ids: p,
                links: p,
                targets: p,
                out: p,
                grad_out: p,
                grad: p,
                class_weights: args_in.has_options().then_some(p),
            };
            let plans = [
                launch::softmax_fwd(float, &args, p, p).unwrap(),
                launch::row_pass_fwd(
                    float,
                    &args_in,
                    &args,
                    RowPassFwdBuffers {
                        logits: p,
                        ids: p,
                        targets: p,
                        out: p,
                        class_weights: args_in.has_options().then_some(p),
                    },
                )
                .unwrap(),
                launch::symmetrize(float, &args_in, &args, 2, p, p).unwrap(),
                launch::backward(float, &args_in, &args, buffers).unwrap(),
            ];
            for plan in &plans {
                let name = plan.kernel_name();
                assert_eq!(
                    module.parameter_kinds(&name).unwrap(),
                    EmuModule::plan_kinds(plan),
                    "{name}: the plan's parameter kinds against the compiled kernel's"
                );
                assert_eq!(plan.dims.block, (shared_launch::BLOCK, 1, 1));
                assert_eq!(plan.dims.grid, (args.rows as u32, 1, 1));
            }
        }
    }
}

#[test]
fn every_pass_matches_the_cpu_kernels_in_every_thread_order() {
    if let Err(failure) = check_all(module(), &cases(), &ThreadOrder::SOME) {
        panic!("{failure}");
    }
}

/// A broken copy of the source: what the test replaces and with what.
struct Mutant {
    name: &'static str,
    from: &'static str,
    to: &'static str,
}

const MUTANTS: [Mutant; 10] = [
    Mutant {
        name: "a barrier removed before a shared-memory read (block_sum)",
        from: "    if (lane == 0) shared[warp] = v;\n    __syncthreads();\n",
        to: "    if (lane == 0) shared[warp] = v;\n",
    },
    Mutant {
        name: "a __syncthreads inside a branch (block_max_sum)",
        from: "        shared_s[warp] = s;\n    }\n    __syncthreads();\n",
        to: "        shared_s[warp] = s;\n        __syncthreads();\n    }\n",
    },
    Mutant {
        name: "a shuffle only the even lanes reach (block_max_sum)",
        from: "        const A m2 = __shfl_xor_sync(FULL_MASK, m, offset);\n        const A s2 = __shfl_xor_sync(FULL_MASK, s, offset);\n        merge(m, s, m2, s2);\n    }\n    const int warp",
        to: "        const A m2 = (threadIdx.x & 1) ? m : __shfl_xor_sync(FULL_MASK, m, offset);\n        const A s2 = __shfl_xor_sync(FULL_MASK, s, offset);\n        merge(m, s, m2, s2);\n    }\n    const int warp",
    },
    Mutant {
        name: "__syncthreads_and replaced by a per-thread flag (row_max_sum)",
        from: "    finite = __syncthreads_and(all_finite);\n",
        to: "    finite = all_finite;\n    __syncthreads();\n",
    },
    Mutant {
        name: "the target's gradient with the wrong sign (row_pass_bwd)",
        from: "    if (threadIdx.x == 0 && t >= 0) g[t] -= ce_grad * (T(1) - eps);\n}",
        to: "    if (threadIdx.x == 0 && t >= 0) g[t] += ce_grad * (T(1) - eps);\n}",
    },
    Mutant {
        name: "a barrier removed before a shared-memory read (block_min_u32)",
        from: "    if (lane == 0) shared_min[warp] = v;\n    __syncthreads();\n",
        to: "    if (lane == 0) shared_min[warp] = v;\n",
    },
    Mutant {
        name: "the class weight left out of the smoothing offset (row_options_bwd)",
        from: "+ offset * opt.class_weight(v)) * opt.cap_grad(y),",
        to: "+ offset) * opt.cap_grad(y),",
    },
    Mutant {
        name: "the soft cap's derivative left out at a gathered id (row_options_bwd)",
        from: "to_acc(g[id]) + sparse * opt.cap_grad(opt.capped(to_acc(row[id]))),",
        to: "to_acc(g[id]) + sparse,",
    },
    Mutant {
        name: "the z-loss's dense coefficient without its factor 2 (CeOptions)",
        from: "ce_grad * (T(1) + T(2) * z_loss * lse)",
        to: "ce_grad * (T(1) + z_loss * lse)",
    },
    Mutant {
        name: "the argmax from thread 0's columns only (row_options_fwd)",
        from: "        first_max = block_min_u32(first_max);\n",
        to: "",
    },
];

#[test]
fn broken_copies_of_the_kernels_are_caught() {
    let cases = [
        Case::rows(2, 2, 300, 5),
        Case {
            pass: Pass::SelfMatch,
            ..Case::rows(1, 2, 40, 3)
        },
        Case::rows(2, 3, 300, 5).with_options(),
        Case {
            z_loss: 0.05,
            ..Case::rows(2, 2, 300, 5)
        },
    ];
    let orders = [ThreadOrder::Forward, ThreadOrder::Random(3)];
    for mutant in &MUTANTS {
        assert_eq!(
            SOURCE.matches(mutant.from).count(),
            1,
            "{}: the text to replace",
            mutant.name
        );
        let module = compile(&SOURCE.replace(mutant.from, mutant.to));
        match check_all(&module, &cases, &orders) {
            Ok(()) => panic!("the emulator tests passed a broken kernel: {}", mutant.name),
            Err(failure) => println!(
                "caught {}: {}",
                mutant.name,
                failure.lines().next().unwrap_or_default()
            ),
        }
    }
}

// ---- 16-bit logits (`ce_options.cu`'s row pass over f16 and bf16) ---------------------------------

impl Element for u16 {
    const CANARY: u16 = 0xa5a5;
    fn bits(self) -> u64 {
        self as u64
    }
}

/// The bits of a 16-bit CPU tensor (f16 or bf16), flattened.
pub(super) fn bits_16(t: &Tensor) -> Vec<u16> {
    let flat = t.flatten_all().expect("a tensor");
    match t.dtype() {
        DType::F16 => flat
            .to_vec1::<half::f16>()
            .expect("f16")
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        _ => flat
            .to_vec1::<half::bf16>()
            .expect("bf16")
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    }
}

/// The f32 value of 16-bit `bits` of `dtype`, as `half` widens it.
pub(super) fn widen_16(bits: u16, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_bits(bits).to_f32(),
        _ => half::bf16::from_bits(bits).to_f32(),
    }
}

/// The row pass over `dtype` logits (f16 or bf16) on the emulator against the CPU kernels in
/// f32 on the same (widened, exact) logits: the rows in f32 to f32's tolerance; the gradient,
/// rounded once to `dtype` on the CPU and written in `dtype` by the kernel (the gathered columns
/// and the target rounded twice), within two units in its last place.
fn check_16bit(
    module: &EmuModule,
    case: &Case,
    dtype: DType,
    seed: u64,
    orders: &[ThreadOrder],
) -> Result<(), String> {
    let e = |e: candle_core::Error| e.to_string();
    let float = match dtype {
        DType::F16 => FloatKind::F16,
        _ => FloatKind::BF16,
    };
    let inputs = inputs(case, seed);
    let cpu = cpu_case::<f32>(case, &inputs).map_err(e)?;
    let narrow = cpu.logits.to_dtype(dtype).map_err(e)?;
    let wide = Var::from_tensor(&narrow.to_dtype(DType::F32).map_err(e)?).map_err(e)?;
    let out = cpu.apply(wide.as_tensor()).map_err(e)?;
    let grad_out: Vec<f32> = spread(out.elem_count(), seed ^ 3, 1.0)
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let grad_out_t = Tensor::from_vec(grad_out.clone(), out.shape(), &Device::Cpu).map_err(e)?;
    let grads = (&out * &grad_out_t)
        .and_then(|t| t.sum_all())
        .and_then(|t| t.backward())
        .map_err(e)?;
    let want_grad = bits_16(
        &grads
            .get(wide.as_tensor())
            .expect("a logits gradient")
            .to_dtype(dtype)
            .map_err(e)?,
    );
    let want_out: Vec<f32> = out.flatten_all().and_then(|t| t.to_vec1()).map_err(e)?;
    let args_in = cpu.cuda_args().map_err(e)?;
    let args = row_args(&args_in, narrow.shape()).map_err(e)?;
    let stride = args_in.layout.stride();
    let nan_bits: u16 = if dtype == DType::F16 { 0x7e00 } else { 0x7fc0 };
    let (ulp, smallest) = if dtype == DType::F16 {
        (2f64.powi(-10), 6e-8)
    } else {
        (2f64.powi(-7), 1e-38)
    };
    for &order in orders {
        let mut logits = Guarded::new("logits", &bits_16(&narrow));
        let mut ids = held_u32("ids", args_in.ids);
        let mut links = held_u32("links", args_in.links);
        let mut targets = held_u32("targets", args_in.targets);
        let mut weights = Guarded::<f32>::new(
            "class_weights",
            &args_in.class_weights().map_or(vec![0.0], |w| {
                w.iter().map(|&w| w as f32).collect::<Vec<_>>()
            }),
        );
        let mut out = Guarded::filled("out", args.rows * stride, f32::NAN);
        let buffers = RowPassFwdBuffers {
            logits: logits.ptr(),
            ids: ids.ptr(),
            targets: targets.ptr(),
            out: out.ptr(),
            class_weights: Some(weights.ptr()),
        };
        let plan = launch::row_pass_fwd(float, &args_in, &args, buffers).map_err(e)?;
        if plan.family != "row_options_fwd" {
            return Err(format!("{dtype:?} logits launched {}", plan.kernel_name()));
        }
        run(module, &plan, order)?;
        compare(
            &format!("{case:?} {dtype:?} {order:?} rows"),
            out.payload(),
            &want_out,
        )?;
        let mut grad_out_buf = Guarded::new("grad_out", &grad_out);
        let mut grad = Guarded::filled("grad", args.rows * args.vocab as usize, nan_bits);
        let buffers = BackwardBuffers {
            input: BackwardInput::Logits(logits.ptr()),
            ids: ids.ptr(),
            links: links.ptr(),
            targets: targets.ptr(),
            out: out.ptr(),
            grad_out: grad_out_buf.ptr(),
            grad: grad.ptr(),
            class_weights: Some(weights.ptr()),
        };
        let plan = launch::backward(float, &args_in, &args, buffers).map_err(e)?;
        run(module, &plan, order)?;
        for (i, (&got, &want)) in grad.payload().iter().zip(&want_grad).enumerate() {
            let (g, w) = (widen_16(got, dtype) as f64, widen_16(want, dtype) as f64);
            let within = (g - w).abs() <= 2.0 * ulp * w.abs() + smallest;
            if !within {
                return Err(format!(
                    "{case:?} {dtype:?} {order:?} gradient[{i}]: emulator {g:e}, CPU {w:e}"
                ));
            }
        }
        grad.check_guards()?;
        logits.check_guards()?;
        out.check_guards()?;
        weights.check_guards()?;
        grad_out_buf.check_guards()?;
    }
    Ok(())
}

/// f16 and bf16 logits take the options kernels' row pass: plain, with every option, with class
/// weights alone; vocabularies around the block size.
#[test]
fn sixteen_bit_logits_match_the_cpu_kernels_in_f32() {
    let cases = [
        Case::rows(2, 3, 257, 17),
        Case::rows(2, 3, 300, 5).with_options(),
        Case {
            class_weights: true,
            ..Case::rows(1, 4, 1000, 9)
        },
        Case {
            targets: false,
            pad: None,
            smoothing: 0.0,
            ..Case::rows(2, 2, 31, 4)
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        for dtype in [DType::F16, DType::BF16] {
            if let Err(failure) = check_16bit(module(), case, dtype, i as u64, &ThreadOrder::SOME) {
                panic!("{failure}");
            }
        }
    }
}

/// A test kernel over `ce_options.cu`'s conversions, one thread per element: `widened[i]` from
/// `narrow[i]`, `narrowed[i]` from `wide[i]`.
const CONVERSIONS: &str = r#"
#define CONVERT_16BIT(SUFFIX, S, NARROW)                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) convert_16bit_##SUFFIX(                \
        const float* wide, const S* narrow, float* widened, S* narrowed, u32 n) {               \
        const u32 i = blockIdx.x * BLOCK + threadIdx.x;                                         \
        if (i < n) {                                                                            \
            widened[i] = to_acc(narrow[i]);                                                     \
            narrowed[i] = NARROW(wide[i]);                                                      \
        }                                                                                       \
    }
CONVERT_16BIT(f16, f16_storage, to_f16)
CONVERT_16BIT(bf16, bf16_storage, to_bf16)
"#;

/// The kernels' 16-bit conversions equal `half`'s (candle's) bit for bit: every one of the 65536
/// patterns widened, and 2^17 f32 values narrowed — every 16-bit value, each halfway point to its
/// neighbour (ties to even) and a little on either side of it, and seeded bit patterns (NaN,
/// infinities, subnormals, overflow among them); NaN maps to NaN.
#[test]
fn sixteen_bit_conversions_are_halfs_bit_for_bit() {
    let module = EmuModule::compile(
        &format!("{SOURCE}\n{CONVERSIONS}"),
        (&[], &["convert_16bit"]),
        &["BLOCK"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let patterns: Vec<u16> = (0..=u16::MAX).collect();
    for dtype in [DType::F16, DType::BF16] {
        let float = match dtype {
            DType::F16 => FloatKind::F16,
            _ => FloatKind::BF16,
        };
        let widen = |bits: u16| widen_16(bits, dtype);
        let narrow = |x: f32| match dtype {
            DType::F16 => half::f16::from_f32(x).to_bits(),
            _ => half::bf16::from_f32(x).to_bits(),
        };
        let mut wide: Vec<f32> = Vec::new();
        for &b in &patterns {
            let (x, next) = (widen(b), widen(b.wrapping_add(1)));
            wide.push(x);
            let mid = ((x as f64 + next as f64) / 2.0) as f32;
            wide.extend([mid, f32::from_bits(mid.to_bits() + 1)]);
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..65536 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            wide.push(f32::from_bits((state >> 32) as u32));
        }
        let n = wide.len();
        let narrow_in: Vec<u16> = (0..n).map(|i| patterns[i % patterns.len()]).collect();
        let mut wide_buf = Guarded::new("wide", &wide);
        let mut narrow_buf = Guarded::new("narrow", &narrow_in);
        let mut widened = Guarded::filled("widened", n, f32::NAN);
        let mut narrowed = Guarded::filled("narrowed", n, 0u16);
        let plan = Launch {
            family: "convert_16bit",
            float,
            dims: shared_launch::LaunchDims {
                grid: (n.div_ceil(shared_launch::BLOCK as usize) as u32, 1, 1),
                block: (shared_launch::BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            params: vec![
                shared_launch::Param::Buffer(wide_buf.ptr()),
                shared_launch::Param::Buffer(narrow_buf.ptr()),
                shared_launch::Param::Buffer(widened.ptr()),
                shared_launch::Param::Buffer(narrowed.ptr()),
                shared_launch::Param::U32(n as u32),
            ],
        };
        run(&module, &plan, ThreadOrder::Forward).unwrap_or_else(|e| panic!("{e}"));
        for (i, (&got, &b)) in widened.payload().iter().zip(&narrow_in).enumerate() {
            let want = widen(b);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{dtype:?} widening [{i}] {b:#06x}: kernel {got:e}, half {want:e}"
            );
        }
        for (i, (&got, &x)) in narrowed.payload().iter().zip(&wide).enumerate() {
            let want = narrow(x);
            let nan = |bits: u16| widen(bits).is_nan();
            assert!(
                got == want || (nan(got) && nan(want)),
                "{dtype:?} narrowing [{i}] {x:e}: kernel {got:#06x}, half {want:#06x}"
            );
        }
        for buffer in [&wide_buf, &widened] {
            buffer.check_guards().unwrap();
        }
        for buffer in [&narrow_buf, &narrowed] {
            buffer.check_guards().unwrap();
        }
    }
}
