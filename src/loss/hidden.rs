//! The loss from hidden states and the output projection, without storing the `[B, S, V]`
//! logits: [`cross_entropy_from_hidden`], [`bleu_loss_from_hidden`], [`ce_bleu_from_hidden`],
//! and their composed references.
//!
//! The logits `H Wᵀ + b` of a block of rows (positions) are computed, passed through the same
//! row kernels as the logits entry points, and dropped; the backward recomputes the logits
//! (block by block, or on the CPU in vocabulary tiles where the backward is exact and row by
//! row: `docs/loss.md` §12.1), runs the row kernel's backward for their gradient `G`, and turns
//! that into `dH = G W`, `dW += Gᵀ H`, `db += Σ_rows G`. At most one block or tile of logits
//! (and one of their gradient) is alive, so the loss's memory is `O(block)`, flat in `V` and in `B·S`; what
//! candle's autograd stores and accumulates is `[B, S, D]` and `[V, D]`, never `[B, S, V]`
//! (Wijmans et al. 2024, *Cut Your Losses in Large-Vocabulary Language Models*; Liger-Kernel's
//! fused linear cross-entropy).
//!
//! Each block holds whole vocabulary rows, so every row's softmax is exact in one pass and the
//! per-row output is the logits path's, to rounding. The paired form needs all `S` rows of an
//! element at once (its self-match `P Pᵀ`): its blocks are whole sequences.
//!
//! These are wrappers over the one path every loss takes (`run`): the hidden states are one
//! kind of input ([`Hypotheses::Hidden`](super::checked::hypotheses::Hypotheses)), validated
//! with the others, and their pass is the hidden-state op (`hidden_pass`, `kernels::hidden::op`):
//! raw slices
//! on the CPU (gemm + the row kernels), candle ops in the same blocks elsewhere — so the GPU
//! path keeps the `O(block)` memory too.

use super::checked::hypotheses::Hypotheses;
use super::config::{
    BleuLossConfig, BleuLossOutput, CrossEntropyConfig, CrossEntropyOutput, HiddenConfig,
    TrainingLoss, TrainingLossConfig,
};
use super::dispatch::Path;
use super::reduce::Reducer;
use super::references::{References, TrainingTargets};
use super::run;
use candle_core::{Result, Tensor};
use candle_nn::Linear;

/// Mean token cross-entropy of `softmax(proj(hidden))` against `targets`, without storing the
/// `[B, S, V]` logits: [`cross_entropy_from_logits`](super::cross_entropy_from_logits) of
/// `proj.forward(hidden)`, the same values and gradients (to rounding; 1e-10 in f64).
///
/// # Arguments
/// * `hidden` - float `[B, S, D]`: the decoder's states before the output layer. f32 and f64
///   are computed in their dtype, f16 and bf16 in f32.
/// * `proj` - the output layer, weight `[V, D]` and an optional bias `[V]`, in the dtype of
///   `hidden`, on its device. Tied embeddings: `Linear::new(embeddings.clone(), None)`.
/// * `targets` - u32 `[B, S]`, each `< V` or equal to `cfg.pad_id`; not all padding.
/// * `cfg` - padding id and label smoothing, as
///   [`cross_entropy_from_logits`](super::cross_entropy_from_logits).
/// * `blocks` - block size and gradient filtering ([`HiddenConfig`]; `&HiddenConfig::default()`
///   is exact).
///
/// Returns the loss ([`CrossEntropyOutput`]: a scalar, or `[B, S]` with `reduction` `None`, in
/// the compute dtype, differentiable with respect to `hidden`, the weight and the bias) and the
/// z-loss's part and token accuracy when `cfg` asks for them, computed in the same blocks.
/// Errors (naming the argument and its shape or value) as the logits function does, on a `proj` whose weight is not `[V, D]` with the `D` of `hidden` or whose dtype or
/// device differs, on an invalid `blocks`, and on non-finite logits (CPU).
///
/// ```
/// use candle_bleu::loss::{cross_entropy_from_hidden, cross_entropy_from_logits, CrossEntropyConfig, HiddenConfig};
/// use candle_core::{Device, Module, Tensor};
/// use candle_nn::Linear;
///
/// let dev = Device::Cpu;
/// let hidden = Tensor::randn(0f64, 1.0, (2, 3, 4), &dev)?; // [B, S, D]
/// let embeddings = Tensor::randn(0f64, 1.0, (10, 4), &dev)?; // [V, D], tied output layer
/// let proj = Linear::new(embeddings, None);
/// let targets = Tensor::new(&[[1u32, 2, 3], [4, 5, 0]], &dev)?;
/// let ce = CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.1, ..Default::default() };
/// let from_hidden = cross_entropy_from_hidden(&hidden, &proj, &targets, &ce, &HiddenConfig::default())?;
/// let from_logits = cross_entropy_from_logits(&proj.forward(&hidden)?, &targets, &ce)?;
/// let (from_hidden, from_logits) = (from_hidden.loss.to_scalar::<f64>()?, from_logits.loss.to_scalar::<f64>()?);
/// assert!((from_hidden - from_logits).abs() < 1e-12);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn cross_entropy_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    blocks: &HiddenConfig,
) -> Result<CrossEntropyOutput> {
    let input = hidden_input(hidden, proj, blocks);
    let path = Path::for_device(hidden.device());
    run::cross_entropy(input, targets, cfg, path, Reducer::Local)
}

/// [`cross_entropy_from_hidden`] as composed candle ops (a `matmul` per block of rows,
/// `candle_nn::ops::log_softmax`, a gather), never the crate's kernels: the reference the
/// kernels are tested against, and what devices without them run. The same values and
/// gradients to rounding; the same blocks, so it never stores the `[B, S, V]` logits either.
pub fn cross_entropy_from_hidden_composed(
    hidden: &Tensor,
    proj: &Linear,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    blocks: &HiddenConfig,
) -> Result<CrossEntropyOutput> {
    let input = hidden_input(hidden, proj, blocks);
    run::cross_entropy(input, targets, cfg, Path::Composed, Reducer::Local)
}

/// The hidden states as an input of the one path.
pub(crate) fn hidden_input<'a>(
    hidden: &'a Tensor,
    proj: &'a Linear,
    blocks: &'a HiddenConfig,
) -> Hypotheses<'a> {
    Hypotheses::Hidden {
        hidden,
        proj,
        blocks,
    }
}

/// The BLEU loss of `softmax(proj(hidden))`, without storing the `[B, S, V]` logits:
/// [`bleu_loss_from_logits`](super::bleu_loss_from_logits) of `proj.forward(hidden)`, the same values, statistics and
/// gradients (to rounding; 1e-10 in f64).
///
/// With id references every form and length model runs blocked: the expected and
/// lower-bound forms in blocks of rows, the paired form in blocks of whole sequences (its
/// self-match `P Pᵀ` needs every row of an element). Matrix references
/// ([`References::from_matrices`](super::References::from_matrices)) are `[B, T, V]` themselves, as large as the logits: with
/// them the logits are materialised (`proj.forward(hidden)`) and the logits path runs.
///
/// # Arguments
/// * `hidden`, `proj`, `blocks` - as [`cross_entropy_from_hidden`].
/// * `hyp_lengths`, `refs`, `cfg` - as [`bleu_loss_from_logits`](super::bleu_loss_from_logits).
///
/// Errors as [`bleu_loss_from_logits`](super::bleu_loss_from_logits) and [`cross_entropy_from_hidden`] do.
pub fn bleu_loss_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
    blocks: &HiddenConfig,
) -> Result<BleuLossOutput> {
    let input = hidden_input(hidden, proj, blocks);
    let path = Path::for_device(hidden.device());
    run::bleu(input, hyp_lengths, refs, cfg, path, Reducer::Local)
}

/// [`bleu_loss_from_hidden`] as composed candle ops in the same blocks, never the crate's
/// kernels: its reference, as [`cross_entropy_from_hidden_composed`] is
/// [`cross_entropy_from_hidden`]'s.
pub fn bleu_loss_from_hidden_composed(
    hidden: &Tensor,
    proj: &Linear,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
    blocks: &HiddenConfig,
) -> Result<BleuLossOutput> {
    let input = hidden_input(hidden, proj, blocks);
    run::bleu(
        input,
        hyp_lengths,
        refs,
        cfg,
        Path::Composed,
        Reducer::Local,
    )
}

/// Cross-entropy plus weighted BLEU loss of one training step, from the hidden states and the
/// output layer, without storing the `[B, S, V]` logits:
/// [`ce_bleu_from_logits`](super::ce_bleu_from_logits) of `proj.forward(hidden)`, the same values and gradients (to
/// rounding; 1e-10 in f64) for `hidden`, the weight and the bias.
///
/// One op computes both losses' per-row terms from each block of logits (one recompute in the
/// backward serves both gradients). Matrix references fall back to materialised logits, as in
/// [`bleu_loss_from_hidden`].
///
/// # Arguments
/// * `hidden`, `proj`, `blocks` - as [`cross_entropy_from_hidden`].
/// * `targets`, `cfg` - as [`ce_bleu_from_logits`](super::ce_bleu_from_logits).
///
/// Errors as [`ce_bleu_from_logits`](super::ce_bleu_from_logits) and [`cross_entropy_from_hidden`] do.
///
/// ```
/// use candle_bleu::loss::{ce_bleu_from_hidden, HiddenConfig, References, TrainingLossConfig, TrainingTargets};
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{Linear, VarBuilder, VarMap};
///
/// let dev = Device::Cpu;
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
/// let proj = candle_nn::linear(16, 50, vb.pp("out"))?; // D = 16 → V = 50, with a bias
/// let hidden = Tensor::randn(0f32, 1.0, (2, 5, 16), &dev)?; // the decoder's states [B, S, D]
/// let targets = Tensor::new(&[[3u32, 4, 5, 6, 2], [7, 8, 2, 0, 0]], &dev)?;
/// let refs = References::from_ids(&targets, 0)?;
/// let targets = TrainingTargets::new(&targets, &refs);
/// let cfg = TrainingLossConfig::default();
/// let step = ce_bleu_from_hidden(&hidden, &proj, &targets, &cfg, &HiddenConfig::default())?;
/// let grads = step.loss.backward()?;
/// assert!(grads.get(proj.weight()).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ce_bleu_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
    blocks: &HiddenConfig,
) -> Result<TrainingLoss> {
    let input = hidden_input(hidden, proj, blocks);
    let path = Path::for_device(hidden.device());
    run::training(input, targets, cfg, path, Reducer::Local)
}

/// [`ce_bleu_from_hidden`] as composed candle ops in the same blocks, never the crate's
/// kernels: its reference, as [`cross_entropy_from_hidden_composed`] is
/// [`cross_entropy_from_hidden`]'s.
///
/// ```
/// use candle_bleu::loss::{
///     ce_bleu_from_hidden, ce_bleu_from_hidden_composed, HiddenConfig, References,
///     TrainingLossConfig, TrainingTargets,
/// };
/// use candle_core::{Device, Tensor};
/// use candle_nn::Linear;
///
/// let dev = Device::Cpu;
/// let hidden = Tensor::randn(0f64, 1.0, (2, 4, 8), &dev)?;
/// let proj = Linear::new(Tensor::randn(0f64, 1.0, (20, 8), &dev)?, None);
/// let tokens = Tensor::new(&[[3u32, 4, 5, 2], [7, 8, 2, 0]], &dev)?;
/// let refs = References::from_ids(&tokens, 0)?;
/// let targets = TrainingTargets::new(&tokens, &refs);
/// let (cfg, blocks) = (TrainingLossConfig::default(), HiddenConfig::default());
/// let fast = ce_bleu_from_hidden(&hidden, &proj, &targets, &cfg, &blocks)?.loss.to_scalar::<f64>()?;
/// let slow = ce_bleu_from_hidden_composed(&hidden, &proj, &targets, &cfg, &blocks)?.loss.to_scalar::<f64>()?;
/// assert!((fast - slow).abs() < 1e-10);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ce_bleu_from_hidden_composed(
    hidden: &Tensor,
    proj: &Linear,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
    blocks: &HiddenConfig,
) -> Result<TrainingLoss> {
    let input = hidden_input(hidden, proj, blocks);
    run::training(input, targets, cfg, Path::Composed, Reducer::Local)
}

#[cfg(test)]
mod tests {
    //! The composed candle-op blocks (what devices without the CPU kernels run) against the CPU
    //! kernels, on the CPU: values, statistics and the gradients of `hidden`, the weight and the
    //! bias to 1e-10 in f64, for every form and length model, both reductions, padding and
    //! label smoothing, with and without a bias, in one block and in several; the composed
    //! path's own finiteness check; its host copies.
    use super::*;
    use crate::loss::config::{Form, LengthModel, Reduction};
    use crate::loss::host::host_copies;
    use candle_core::{Device, Var};

    const VOCAB: usize = 7;
    const EOS: u32 = 5;

    struct Fixture {
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor,
        targets: Tensor,
        refs: References,
        lengths: Tensor,
    }

    /// Deterministic values in `[-scale, scale)`.
    fn values(shape: &[usize], scale: f64, phase: f64) -> Result<Tensor> {
        let count: usize = shape.iter().product();
        let data: Vec<f64> = (0..count)
            .map(|i| scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0))
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu)
    }

    fn fixture() -> Result<Fixture> {
        let targets = Tensor::new(&[[1u32, 2, 5, 2, 3], [2, 4, 4, 1, 0]], &Device::Cpu)?;
        Ok(Fixture {
            hidden: values(&[2, 5, 4], 1.5, 0.1)?,
            weight: values(&[VOCAB, 4], 1.0, 0.4)?,
            bias: values(&[VOCAB], 0.5, 0.7)?,
            refs: References::from_ids(&targets, 0)?,
            lengths: Tensor::new(&[5u32, 3], &Device::Cpu)?,
            targets,
        })
    }

    /// The loss and every gradient of `f(hidden, proj)`, flattened.
    fn evaluate(
        f: impl Fn(&Tensor, &Linear) -> Result<Vec<Tensor>>,
        fx: &Fixture,
        bias: bool,
    ) -> Result<Vec<Vec<f64>>> {
        let (h, w, b) = (
            Var::from_tensor(&fx.hidden)?,
            Var::from_tensor(&fx.weight)?,
            Var::from_tensor(&fx.bias)?,
        );
        let proj = Linear::new(w.as_tensor().clone(), bias.then(|| b.as_tensor().clone()));
        let outputs = f(h.as_tensor(), &proj)?;
        let grads = outputs[0].backward()?;
        let mut all = Vec::new();
        for t in outputs
            .iter()
            .chain([&h, &w, &b].iter().filter_map(|v| grads.get(v.as_tensor())))
        {
            all.push(t.flatten_all()?.to_vec1::<f64>()?);
        }
        Ok(all)
    }

    fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: outputs");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len(), "{what}: sizes");
            for (p, q) in x.iter().zip(y) {
                assert!(
                    (p - q).abs() <= 1e-10 * (1.0 + q.abs()),
                    "{what}: {p} vs {q}"
                );
            }
        }
    }

    /// `f` with the hidden-state op's rows computed by the row op on each block
    /// (`HiddenRowsKind::RowOpBlocks`, CUDA's path) on the CPU's kernel path.
    fn with_row_op_blocks<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
        use crate::loss::hidden_pass::ROW_OP_BLOCKS_ON_CPU;
        ROW_OP_BLOCKS_ON_CPU.with(|on| on.set(true));
        let out = f();
        ROW_OP_BLOCKS_ON_CPU.with(|on| on.set(false));
        out
    }

    #[test]
    fn the_composed_blocks_equal_the_kernels() -> Result<()> {
        let fx = fixture()?;
        let mut checked = 0;
        for form in [Form::Expected, Form::Paired, Form::LowerBound] {
            for length in [
                LengthModel::Given,
                LengthModel::NotEos { eos_id: EOS },
                LengthModel::SoftEos { eos_id: EOS },
            ] {
                for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                    for block_elements in [HiddenConfig::DEFAULT_BLOCK_ELEMENTS, 2 * VOCAB] {
                        for bias in [false, true] {
                            let hidden_cfg = HiddenConfig {
                                block_elements,
                                ..Default::default()
                            };
                            let cfg = TrainingLossConfig {
                                bleu_weight: 0.7,
                                ce: CrossEntropyConfig {
                                    pad_id: Some(0),
                                    label_smoothing: 0.1,
                                    ..Default::default()
                                },
                                bleu: BleuLossConfig {
                                    form,
                                    length,
                                    reduction,
                                    ..Default::default()
                                },
                            };
                            let lengths = match length {
                                LengthModel::SoftEos { .. } => None,
                                _ => Some(&fx.lengths),
                            };
                            let targets = TrainingTargets {
                                tokens: &fx.targets,
                                refs: &fx.refs,
                                hyp_lengths: lengths,
                            };
                            let run = |path: Path| -> Result<[Vec<Vec<f64>>; 3]> {
                                Ok([
                                    evaluate(
                                        |h, p| {
                                            let input = hidden_input(h, p, &hidden_cfg);
                                            let out = run::training(
                                                input,
                                                &targets,
                                                &cfg,
                                                path,
                                                Reducer::Local,
                                            )?;
                                            Ok(vec![
                                                out.loss,
                                                out.cross_entropy,
                                                out.bleu.stats.matches,
                                                out.bleu.stats.totals,
                                            ])
                                        },
                                        &fx,
                                        bias,
                                    )?,
                                    evaluate(
                                        |h, p| {
                                            let input = hidden_input(h, p, &hidden_cfg);
                                            let out = run::bleu(
                                                input,
                                                lengths,
                                                &fx.refs,
                                                &cfg.bleu,
                                                path,
                                                Reducer::Local,
                                            )?;
                                            Ok(vec![out.loss, out.stats.hyp_len, out.stats.ref_len])
                                        },
                                        &fx,
                                        bias,
                                    )?,
                                    evaluate(
                                        |h, p| {
                                            let input = hidden_input(h, p, &hidden_cfg);
                                            Ok(vec![
                                                run::cross_entropy(
                                                    input,
                                                    &fx.targets,
                                                    &cfg.ce,
                                                    path,
                                                    Reducer::Local,
                                                )?
                                                .loss,
                                            ])
                                        },
                                        &fx,
                                        bias,
                                    )?,
                                ])
                            };
                            let (kernels, composed) = (run(Path::Kernels)?, run(Path::Composed)?);
                            let row_op_blocks = with_row_op_blocks(|| run(Path::Kernels))?;
                            for (k, ((a, b), c)) in kernels
                                .iter()
                                .zip(&composed)
                                .zip(&row_op_blocks)
                                .enumerate()
                            {
                                let what = format!(
                                    "entry {k}, {form:?} {length:?} {reduction:?}, block {block_elements}, bias {bias}"
                                );
                                assert_close(b, a, &format!("composed, {what}"));
                                assert_close(c, a, &format!("row-op blocks, {what}"));
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 3 * 2 * 2 * 2 * 3);
        Ok(())
    }

    /// The row op on each block (CUDA's path) with every cross-entropy option — z-loss, token
    /// accuracy, class weights, a soft cap (read by the row pass, applied to the block for the
    /// self-match pass) — equals the CPU kernels: values, metrics and gradients.
    #[test]
    fn the_row_op_blocks_take_the_cross_entropy_options() -> Result<()> {
        let fx = fixture()?;
        let weights: std::sync::Arc<[f64]> = vec![0.5, 1.0, 2.0, 1.5, 0.25, 1.0, 3.0].into();
        let options = [
            ("z-loss and accuracy", 1e-2, true, None, None),
            ("class weights", 0.0, false, Some(weights.clone()), None),
            ("soft cap", 0.0, false, None, Some(1.5)),
            ("all", 1e-2, true, Some(weights), Some(1.5)),
        ];
        let mut checked = 0;
        for (name, z_loss, token_accuracy, class_weights, softcap) in options {
            for form in [Form::Expected, Form::Paired] {
                for block_elements in [HiddenConfig::DEFAULT_BLOCK_ELEMENTS, 2 * VOCAB] {
                    let hidden_cfg = HiddenConfig {
                        block_elements,
                        ..Default::default()
                    };
                    let cfg = TrainingLossConfig {
                        bleu_weight: 0.6,
                        ce: CrossEntropyConfig {
                            pad_id: Some(0),
                            label_smoothing: 0.1,
                            z_loss,
                            token_accuracy,
                            class_weights: class_weights.clone(),
                            softcap,
                            ..Default::default()
                        },
                        bleu: BleuLossConfig {
                            form,
                            ..Default::default()
                        },
                    };
                    let targets = TrainingTargets::new(&fx.targets, &fx.refs);
                    let run = || {
                        evaluate(
                            |h, p| {
                                let input = hidden_input(h, p, &hidden_cfg);
                                let out = run::training(
                                    input,
                                    &targets,
                                    &cfg,
                                    Path::Kernels,
                                    Reducer::Local,
                                )?;
                                let mut all = vec![out.loss, out.cross_entropy, out.bleu.loss];
                                all.extend(out.z_loss);
                                all.extend(out.token_accuracy);
                                Ok(all)
                            },
                            &fx,
                            true,
                        )
                    };
                    let kernels = run()?;
                    let row_op_blocks = with_row_op_blocks(run)?;
                    assert_eq!(
                        kernels.len(),
                        3 + usize::from(z_loss != 0.0) + usize::from(token_accuracy) + 3
                    );
                    assert_close(
                        &row_op_blocks,
                        &kernels,
                        &format!("{name}, {form:?}, block {block_elements}"),
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * 2 * 2);
        Ok(())
    }

    /// The composed path checks finiteness itself (the CPU kernels find it in their pass), and
    /// names the argument; on the CPU it reads the targets in place: no copy to the host.
    #[test]
    fn the_composed_blocks_check_their_inputs_in_place() -> Result<()> {
        let fx = fixture()?;
        let cfg = TrainingLossConfig::default();
        let targets = TrainingTargets::new(&fx.targets, &fx.refs);
        let inf_weight = fx
            .weight
            .broadcast_add(&Tensor::new(&[f64::INFINITY], &Device::Cpu)?)?;
        let inf_proj = Linear::new(inf_weight, None);
        let blocks = HiddenConfig::default();
        let on = |proj: &Linear, path: Path| {
            let input = hidden_input(&fx.hidden, proj, &blocks);
            run::training(input, &targets, &cfg, path, Reducer::Local)
        };
        let err = on(&inf_proj, Path::Composed).unwrap_err().to_string();
        assert!(
            err.contains("`proj.weight` contains NaN or infinite values"),
            "{err}"
        );
        let err = on(&inf_proj, Path::Kernels).unwrap_err().to_string();
        assert!(err.contains("contain NaN or infinite values"), "{err}");
        let proj = Linear::new(fx.weight.clone(), Some(fx.bias.clone()));
        let before = host_copies();
        on(&proj, Path::Composed)?;
        assert_eq!(host_copies() - before, 0);
        Ok(())
    }
}
