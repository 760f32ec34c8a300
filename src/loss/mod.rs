//! The differentiable BLEU loss: `-log BLEU` of hypothesis distributions against references,
//! with gradients through candle's autograd. The derivation, term by term and in the names the
//! code uses, is `docs/loss.md` in the repository.
//!
//! Hypothesis distributions `[B, S, V]` and references go through candle tensor ops — token
//! matches, n-gram products, first-occurrence masks, clipped counts, lengths, brevity penalty —
//! to `-log BLEU`.
//!
//! # A training step
//!
//! ```
//! use candle_bleu::loss::{bleu_loss_from_logits, BleuLossConfig, References};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
//!
//! let dev = Device::Cpu;
//! let (batch, seq, vocab) = (2, 4, 8);
//! // Target ids u32 [B, T] (or [B, R, T] for several references); trailing 0s are padding.
//! let targets = Tensor::new(&[[1u32, 2, 3, 4], [5, 6, 7, 0]], &dev)?;
//! let refs = References::from_ids(&targets, 0)?; // once per batch: reads the ids to the host
//!
//! // A toy "model": free logits [B, S, V].
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let logits = vb.get_with_hints((batch, seq, vocab), "logits", candle_nn::Init::Randn {
//!     mean: 0.0,
//!     stdev: 1.0,
//! })?;
//! let mut opt = SGD::new(varmap.all_vars(), 1.0)?;
//! let cfg = BleuLossConfig::default(); // 4-grams, expected form, corpus BLEU, BLEU+1
//!
//! let first = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//! for _ in 0..20 {
//!     let out = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//!     opt.backward_step(&out.loss)?; // usually `ce + λ · out.loss`
//! }
//! let last = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//! let (first, last) = (first.loss.to_scalar::<f32>()?, last.loss.to_scalar::<f32>()?);
//! assert!(last < first, "-log BLEU {first} -> {last}");
//! println!("soft BLEU {:.3}", (-last).exp());
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! # Device-to-host copies
//!
//! A copy from a GPU to the host waits for the stream, so the loss keeps them off its path.
//! Every one it makes goes through one counted helper ([`host_copies`]); per call, with the
//! default config:
//!
//! | entry point | copies |
//! |---|---|
//! | [`References::from_ids`] | 1 (the ids, once per batch) |
//! | [`References::from_matrices`] | 1 (the lengths) + 1 off the CPU (the NaN/Inf check) |
//! | [`bleu_loss`], [`bleu_loss_from_logits`], id references, `hyp_lengths` given or `None`, any form, length model and reduction | **0**, the first call on a `References` included |
//! | the same with matrix references | 0; under `NotEos`/`SoftEos` 1 on the first call per `(max_order, eos_id, dtype)` (the EOS cut) |
//! | [`bleu_loss_from_hidden`], id references | 0, as from logits |
//! | [`cross_entropy_from_logits`], [`ce_bleu_from_logits`], [`ce_bleu_from_hidden`], [`cross_entropy_from_hidden`] | 0 on the CPU; off it 1 (the targets' largest id and count, checked; with class weights the targets themselves, for `Σ w_t`) |
//! | [`loss_from_stats`] | 0 |
//! | [`ctc_loss`], [`ctc_loss_from_logits`] and their composed references | 3 (`targets`, `input_lengths`, `target_lengths`: the alignments are built on the host); off the CPU + 1 with [`CtcConfig::check_values`] (the input) |
//! | [`ctc_bleu_loss_from_logits`], [`ctc_expected_counts`] | without `input_lengths` 0; with them 1 on the CPU (the lengths, which the kernel reads on the host), 0 off it (the composed ops read them on the device); off the CPU with `check_values` 1 for the lengths + 1 for the NaN/Inf check |
//! | [`ctc_greedy_decode`] | 1 (the argmax ids), + 1 with `input_lengths` |
//! | backward passes | 0 |
//!
//! The reference side is built on the host from the ids `from_ids` read, uploaded once and
//! cached in the `References`; the closest reference length and the hypothesis length masks
//! are tensor ops on the device. The value checks that need the data (NaN/Inf in the inputs,
//! `hyp_lengths <= S`) run in place on the CPU, always — the fused CPU kernels find
//! non-finite logits in the pass they make anyway — and off the CPU only with
//! [`BleuLossConfig::check_values`] (one copy per checked tensor). The counts are asserted by
//! `tests/loss_host_copies.rs`, on any test device.
//!
//! # Dtypes and devices
//!
//! f32 and f64 hypotheses are computed in their dtype, f16 and bf16 in f32. The score
//! ([`loss_from_stats`]) runs in f64 where the device has it and in f32 on Metal, with the same
//! guards (a unit test runs that path on the CPU). The fused kernels are CPU kernels and CUDA
//! kernels (with the `cuda` feature, on by default there: CUDA C compiled at run time by NVRTC,
//! so `libnvrtc` must be found at run time; verified on an H200, docs/gpu.md); elsewhere
//! (Metal, or CUDA if the kernels fail to compile or load) composed candle ops give the same
//! numbers. Each fused entry point has its composed reference, public and tested against it
//! (as candle-nn's `rms_norm_slow` is against `rms_norm`): [`bleu_loss_from_logits_composed`],
//! [`cross_entropy_from_logits_composed`], [`ce_bleu_from_logits_composed`], the hidden-state
//! ones ([`cross_entropy_from_hidden_composed`], [`bleu_loss_from_hidden_composed`],
//! [`ce_bleu_from_hidden_composed`]) and the CTC ones ([`ctc_loss_composed`],
//! [`ctc_loss_from_logits_composed`], [`ctc_bleu_loss_from_logits_composed`]).
//!
//! # Modules
//!
//! - `references`: the references ([`References`], [`TrainingTargets`]) and their side of the
//!   statistics (`ν`, `κ`), from ids or matrices;
//! - `length`: the length models `Given`, `NotEos`, `SoftEos`;
//! - `forms`: the expected, paired and lower-bound forms of the clipped matches;
//! - `checked`: the one validation: every kind of input (probabilities, logits, hidden states
//!   with the output layer) is checked once, into checked values the passes consume;
//! - `dispatch`: the one choice between the kernels and composed candle ops;
//! - `pipeline`, `hidden_pass`: the pass over the logits or the hidden states and the
//!   per-element statistics from it;
//! - `reduce`: the reduction stage — the batch's sums taken locally or over a data-parallel
//!   group, the rule that some target counts — which hands the finished sums to the score;
//! - `run`: the one path every loss takes (validate, pass, statistics, reduce), which the entry
//!   points below and those of [`distributed`] wrap;
//! - `kernels`: the row kernels over the logits (CPU, and CUDA with the `cuda` feature) and the hidden-state op, each a candle custom op with a hand-written backward,
//!   and their composed candle-op counterparts; they take plain parameters, never a loss config;
//! - [`cross_entropy_from_logits`]: fused token cross-entropy (PyTorch's `F.cross_entropy`);
//! - [`ctc_loss`], [`ctc_loss_from_logits`]: the CTC loss (PyTorch's `F.ctc_loss`, batch-first,
//!   with the true gradient of its input) and [`ctc_greedy_decode`];
//! - [`log_softmax`]: the last dimension's log-softmax as one op with a one-pass backward
//!   (PyTorch's `F.log_softmax(x, -1)`; [`log_softmax_slow`] its composed reference), for
//!   PyTorch's idiom `ctc_loss(&log_softmax(&x)?, …)`;
//! - [`ce_bleu_from_logits`]: cross-entropy + BLEU of a training step in one pass over the logits;
//! - [`ce_bleu_from_hidden`], [`cross_entropy_from_hidden`], [`bleu_loss_from_hidden`]: the same
//!   from the hidden states and the output layer, in blocks of rows, never storing the
//!   `[B, S, V]` logits (their `blocks` argument, [`HiddenConfig`]);
//! - `score`: `-log BLEU` of finished sums: smoothing, guards, brevity penalty (the loss from
//!   statistics a caller gives is [`loss_from_stats`], in `bleu`);
//! - [`distributed`]: data-parallel training — every entry point's loss of the global batch
//!   (but [`ctc_loss`]'s, whose mean divides each element by its own target length)
//!   from each worker's shard over a sum all-reduce (MPI, NCCL, threads), from logits or
//!   hidden states, and the gradient and broadcast helpers.

mod all_reduce;
mod bleu;
mod checked;
mod config;
mod cross_entropy;
mod ctc;
mod ctc_bleu;
mod ctc_fmeasure;
mod ctc_pass;
mod dispatch;
pub mod distributed;
mod forms;
mod hidden;
mod hidden_pass;
mod host;
mod kernels;
mod length;
mod pipeline;
mod products;
mod reduce;
mod references;
mod run;
mod score;
mod training;

pub use bleu::{bleu_loss, bleu_loss_from_logits, bleu_loss_from_logits_composed, loss_from_stats};
pub use config::{
    BleuLossConfig, BleuLossOutput, BleuStats, CrossEntropyConfig, CrossEntropyOutput,
    CrossEntropyReduction, CtcConfig, CtcExpectedCounts, CtcNgramFConfig, CtcNgramFOutput,
    CtcReduction, Form, HiddenConfig, LengthModel, LossSmoothing, Reduction, TrainingLoss,
    TrainingLossConfig,
};
pub use cross_entropy::{cross_entropy_from_logits, cross_entropy_from_logits_composed};
pub use ctc::{
    ctc_greedy_decode, ctc_loss, ctc_loss_composed, ctc_loss_from_logits,
    ctc_loss_from_logits_composed,
};
pub use ctc_bleu::{
    ctc_bleu_loss_from_logits, ctc_bleu_loss_from_logits_composed, ctc_expected_counts,
};
pub use ctc_fmeasure::{ctc_ngram_f_loss, ctc_ngram_f_loss_composed};
pub use hidden::{
    bleu_loss_from_hidden, bleu_loss_from_hidden_composed, ce_bleu_from_hidden,
    ce_bleu_from_hidden_composed, cross_entropy_from_hidden, cross_entropy_from_hidden_composed,
};
pub use host::host_copies;
pub use kernels::row::log_softmax::{log_softmax, log_softmax_slow};
pub use references::{References, TrainingTargets};
pub use score::{log_brevity_penalty, PRECISION_FLOOR};
pub use training::{ce_bleu_from_logits, ce_bleu_from_logits_composed};
