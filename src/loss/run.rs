//! The one path of every loss, whatever its input (probabilities, logits, or hidden states with
//! the output layer) and wherever its sums are taken (one process, or a data-parallel group):
//!
//! 1. validate the arguments once (`checked::calls::*_call`);
//! 2. set the cross-entropy's divisor (`reduce::Reducer::divide`: `n` for a local mean, with the
//!    rule that some target counts; 1 for a shard's sum);
//! 3. one pass over the logits or the hidden states (`pipeline`: the kernel op, the tiled
//!    hidden-state op or composed ops, as `dispatch::Path` and the device say);
//! 4. the per-element statistics (`pipeline::statistics`);
//! 5. the reduction and the score (`reduce::Reducer`).
//!
//! The public entry points (`bleu`, `cross_entropy`, `training`, `hidden`, and the
//! data-parallel ones of `distributed`) are short wrappers over these functions.

use super::checked::calls::{bleu_call, cross_entropy_call, training_call};
use super::checked::hypotheses::Hypotheses;
use super::checked::targets::TargetCount;
use super::config::{
    BleuLossConfig, BleuLossOutput, CrossEntropyConfig, CrossEntropyOutput, TrainingLoss,
    TrainingLossConfig,
};
use super::dispatch::Path;
use super::pipeline::{cross_entropy_pass, hypothesis_pass, statistics};
use super::reduce::{token_sum_by, Reducer};
use super::references::{References, TrainingTargets};
use candle_core::{bail, Result, Tensor};

/// The BLEU loss of `input` against `refs`.
pub(crate) fn bleu(
    input: Hypotheses<'_>,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
    path: Path,
    reducer: Reducer,
) -> Result<BleuLossOutput> {
    let input = bleu_call(input, hyp_lengths, refs, cfg, path)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), input.dtype())?;
    let (inputs, _) = hypothesis_pass(&input, &side, cfg, None)?;
    let on_kernel = path.runs_matches_kernel(inputs.token_match.device());
    reducer.bleu(
        statistics(inputs, &side, hyp_lengths, cfg, on_kernel)?,
        cfg,
        path,
    )
}

/// The cross-entropy of `input` against `targets`, reduced as `cfg.reduction` says.
pub(crate) fn cross_entropy(
    input: Hypotheses<'_>,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    path: Path,
    reducer: Reducer,
) -> Result<CrossEntropyOutput> {
    let (input, targets) = cross_entropy_call(input, targets, cfg, path)?;
    let targets = reducer.divide(targets)?;
    reducer.cross_entropy(cross_entropy_pass(&input, &targets)?, &targets)
}

/// `cross_entropy + bleu_weight · bleu` of `input`, both from one pass.
pub(crate) fn training(
    input: Hypotheses<'_>,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
    path: Path,
    reducer: Reducer,
) -> Result<TrainingLoss> {
    let TrainingTargets {
        tokens,
        refs,
        hyp_lengths,
    } = *targets;
    let (input, tokens, bleu_weight) = training_call(input, hyp_lengths, refs, tokens, cfg, path)?;
    let tokens = reducer.divide(tokens)?;
    let bleu = &cfg.bleu;
    let side = refs.side(bleu.max_order, bleu.length.eos_id(), input.dtype())?;
    let (inputs, token_losses) = hypothesis_pass(&input, &side, bleu, Some(&tokens))?;
    let Some(token_losses) = token_losses else {
        bail!("internal: the pass computed no cross-entropy")
    };
    let on_kernel = path.runs_matches_kernel(inputs.token_match.device());
    let stats = statistics(inputs, &side, hyp_lengths, bleu, on_kernel)?;
    reducer.training(token_losses, &tokens, stats, bleu, (bleu_weight, path))
}

/// This batch's (or shard's) cross-entropy **sum** over its non-pad targets and their count —
/// `Σ w_t` under class weights, the weighted mean's denominator — without the rule that some
/// target counts: a shard of only padding gives `(0, 0)`. Class weights with a z-loss are
/// refused: the weighted mean and the z-term's mean divide by different counts.
pub(crate) fn cross_entropy_sum_and_count(
    input: Hypotheses<'_>,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    path: Path,
) -> Result<(Tensor, f64)> {
    if cfg.class_weights.is_some() && cfg.z_loss != 0.0 {
        bail!(
            "`class_weights` with `z_loss` in `cross_entropy_sum_and_count`: the weighted mean divides by Σ w_t and the z-term by the count of targets, so no one count makes sum / count the loss; use one of them"
        );
    }
    // The count is returned as a number: read on the host.
    let cfg = &CrossEntropyConfig {
        check_values: true,
        ..cfg.clone()
    };
    let (input, targets) = cross_entropy_call(input, targets, cfg, path)?;
    // A divisor of 1: the pass sums the row terms (what a group's shard does). `weight_sum`
    // is the count without class weights.
    let TargetCount::Host { weight_sum, .. } = targets.count else {
        bail!("internal: targets read for their count were not counted on the host");
    };
    Ok((
        token_sum_by(&cross_entropy_pass(&input, &targets)?, 1.0)?,
        weight_sum,
    ))
}

#[cfg(test)]
mod tests {
    //! The one path with either reducer, on the kernels and on the composed ops (what devices
    //! without the kernels run), from logits and from hidden states: a data-parallel group of
    //! two threads gives every worker the single-process loss of the whole batch, and each
    //! worker the single-process gradient of its own shard's inputs — the composed path
    //! included, which the data-parallel tests (on the CPU, the kernels) do not reach.
    use super::*;
    use crate::loss::checked::targets::COUNT_TARGETS_ON_DEVICE;
    use crate::loss::config::{CrossEntropyReduction, HiddenConfig};
    use crate::loss::distributed::ThreadAllReduce;
    use crate::loss::host::host_copies;
    use candle_core::{Device, Var};
    use candle_nn::Linear;

    const BATCH: usize = 4;
    const SEQ: usize = 3;
    const VOCAB: usize = 7;
    const DIM: usize = 5;

    /// Deterministic values in `[-scale, scale)`.
    fn values(shape: &[usize], scale: f64, phase: f64) -> Result<Tensor> {
        let count: usize = shape.iter().product();
        let data: Vec<f64> = (0..count)
            .map(|i| scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0))
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu)
    }

    /// `x` as hidden states of `proj` in `blocks`, or as logits.
    fn hypotheses<'a>(
        hidden_input: bool,
        x: &'a Tensor,
        proj: &'a Linear,
        blocks: &'a HiddenConfig,
    ) -> Hypotheses<'a> {
        if hidden_input {
            Hypotheses::Hidden {
                hidden: x,
                proj,
                blocks,
            }
        } else {
            Hypotheses::Logits(x)
        }
    }

    /// The loss, cross-entropy and BLEU loss of elements `start..start + len`, and the gradient
    /// of their inputs (logits, or hidden states), with `reducer`.
    fn shard(
        hidden_input: bool,
        (start, len): (usize, usize),
        path: Path,
        reducer: Reducer,
        device_count: bool,
    ) -> Result<([f64; 3], Vec<f64>)> {
        // What a GPU does with the value checks off: the targets counted on the device.
        COUNT_TARGETS_ON_DEVICE.with(|on| on.set(device_count));
        let hidden = values(&[BATCH, SEQ, DIM], 1.5, 0.1)?.narrow(0, start, len)?;
        let weight = values(&[VOCAB, DIM], 1.0, 0.4)?;
        let bias = values(&[VOCAB], 0.5, 0.7)?;
        let proj = Linear::new(weight, Some(bias));
        // Element 3's targets are all padding; every element has a reference.
        let tokens = Tensor::new(
            &[[1u32, 2, 0], [3, 0, 0], [4, 5, 6], [0, 0, 0]],
            &Device::Cpu,
        )?
        .narrow(0, start, len)?;
        let ref_ids = Tensor::new(
            &[[1u32, 2, 3], [3, 4, 0], [4, 5, 6], [2, 2, 1]],
            &Device::Cpu,
        )?
        .narrow(0, start, len)?;
        let refs = References::from_ids(&ref_ids, 0)?;
        let targets = TrainingTargets::new(&tokens, &refs);
        let cfg = TrainingLossConfig {
            bleu_weight: 0.7,
            ce: CrossEntropyConfig {
                pad_id: Some(0),
                label_smoothing: 0.1,
                ..Default::default()
            },
            ..Default::default()
        };
        let blocks = HiddenConfig {
            block_elements: 2 * VOCAB,
            ..Default::default()
        };
        let x = Var::from_tensor(&if hidden_input {
            hidden
        } else {
            candle_core::Module::forward(&proj, &hidden)?
        })?;
        let input = hypotheses(hidden_input, x.as_tensor(), &proj, &blocks);
        let out = training(input, &targets, &cfg, path, reducer)?;
        let grad = out.loss.backward()?;
        let grad = grad.get(x.as_tensor()).expect("a gradient");
        let scalars = [
            out.loss.to_scalar::<f64>()?,
            out.cross_entropy.to_scalar::<f64>()?,
            out.bleu.loss.to_scalar::<f64>()?,
        ];
        Ok((scalars, grad.flatten_all()?.to_vec1::<f64>()?))
    }

    #[test]
    fn a_group_of_two_gives_the_single_process_numbers_on_every_path() -> Result<()> {
        for (path, hidden_input, device_count) in [Path::Kernels, Path::Composed]
            .into_iter()
            .flat_map(|p| [false, true].map(|h| (p, h)))
            .flat_map(|(p, h)| [false, true].map(|d| (p, h, d)))
        {
            {
                let (single, single_grad) =
                    shard(hidden_input, (0, BATCH), path, Reducer::Local, device_count)?;
                let (host, host_grad) =
                    shard(hidden_input, (0, BATCH), path, Reducer::Local, false)?;
                for (a, b) in single
                    .iter()
                    .zip(&host)
                    .chain(single_grad.iter().zip(&host_grad))
                {
                    assert!((a - b).abs() < 1e-12, "{path:?}, hidden {hidden_input}: counted on the device {a} vs on the host {b}");
                }
                // Worker 1's shard holds only padding targets (element 3).
                let ranges = [(0, 3), (3, 1)];
                let workers = std::thread::scope(|s| {
                    let handles: Vec<_> = ThreadAllReduce::group(2)
                        .into_iter()
                        .zip(ranges)
                        .map(|(reduce, range)| {
                            s.spawn(move || {
                                shard(
                                    hidden_input,
                                    range,
                                    path,
                                    Reducer::Group(&reduce),
                                    device_count,
                                )
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a worker"))
                        .collect::<Result<Vec<_>>>()
                })?;
                let per_element = single_grad.len() / BATCH;
                for ((scalars, grad), (start, len)) in workers.iter().zip(ranges) {
                    let what = format!("{path:?}, hidden {hidden_input}, device count {device_count}, shard {start}+{len}");
                    for (a, b) in scalars.iter().zip(&single) {
                        assert!((a - b).abs() < 1e-12, "{what}: {scalars:?} vs {single:?}");
                    }
                    let expected = &single_grad[start * per_element..(start + len) * per_element];
                    for (a, b) in grad.iter().zip(expected) {
                        assert!((a - b).abs() < 1e-12, "{what}: gradient {a} vs {b}");
                    }
                }
            }
        }
        Ok(())
    }

    /// The cross-entropy with its targets counted on the device (a GPU's path with the value
    /// checks off), run on the CPU: the host-counted numbers for every reduction and option,
    /// from logits and hidden states, on the kernels and the composed ops, with no read to the
    /// host; a target out of the vocabulary gives NaN (the mean, the sum, that position) instead
    /// of an error, and a mean over only padding NaN.
    #[test]
    fn targets_counted_on_the_device_give_the_host_numbers_and_nan_for_bad_ones() -> Result<()> {
        let dev = Device::Cpu;
        let logits = values(&[2, 3, VOCAB], 2.0, 0.3)?;
        let hidden = values(&[2, 3, DIM], 1.5, 0.1)?;
        let proj = Linear::new(
            values(&[VOCAB, DIM], 1.0, 0.4)?,
            Some(values(&[VOCAB], 0.5, 0.7)?),
        );
        let blocks = HiddenConfig::default();
        let good = Tensor::new(&[[1u32, 2, 0], [3, 0, 6]], &dev)?;
        let bad = Tensor::new(&[[1u32, 2, 0], [3, 9, 6]], &dev)?;
        let padding = Tensor::new(&[[0u32, 0, 0], [0, 0, 0]], &dev)?;
        let mut checked = 0;
        for (hidden_input, path) in [
            (false, Path::Kernels),
            (false, Path::Composed),
            (true, Path::Kernels),
            (true, Path::Composed),
        ] {
            for reduction in [
                CrossEntropyReduction::Mean,
                CrossEntropyReduction::Sum,
                CrossEntropyReduction::None,
            ] {
                for (z_loss, token_accuracy, softcap) in
                    [(0.0, false, None), (1e-2, true, Some(3.0))]
                {
                    let cfg = CrossEntropyConfig {
                        pad_id: Some(0),
                        label_smoothing: 0.1,
                        reduction,
                        z_loss,
                        token_accuracy,
                        softcap,
                        ..Default::default()
                    };
                    let run = |targets: &Tensor, on_device: bool| -> Result<(Vec<Vec<f64>>, u64)> {
                        COUNT_TARGETS_ON_DEVICE.with(|on| on.set(on_device));
                        let x = Var::from_tensor(if hidden_input { &hidden } else { &logits })?;
                        let input = hypotheses(hidden_input, x.as_tensor(), &proj, &blocks);
                        let before = host_copies();
                        let out = cross_entropy(input, targets, &cfg, path, Reducer::Local);
                        let copies = host_copies() - before;
                        COUNT_TARGETS_ON_DEVICE.with(|on| on.set(false));
                        let out = out?;
                        let grad = out.loss.sum_all()?.backward()?;
                        let mut all = vec![out.loss.flatten_all()?.to_vec1::<f64>()?];
                        for t in out.z_loss.iter().chain(&out.token_accuracy) {
                            all.push(t.flatten_all()?.to_vec1::<f64>()?);
                        }
                        all.push(
                            grad.get(x.as_tensor())
                                .expect("a gradient")
                                .flatten_all()?
                                .to_vec1::<f64>()?,
                        );
                        Ok((all, copies))
                    };
                    let what = format!("hidden {hidden_input}, {path:?}, {reduction:?}, z {z_loss}, accuracy {token_accuracy}");
                    let (host, _) = run(&good, false)?;
                    let (device, copies) = run(&good, true)?;
                    assert_eq!(copies, 0, "{what}: reads to the host");
                    assert_eq!(host.len(), device.len(), "{what}");
                    for (a, b) in host.iter().flatten().zip(device.iter().flatten()) {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + a.abs()),
                            "{what}: host {a} vs device {b}"
                        );
                    }
                    // Target 9 >= V = 7 at [1, 1]: an error when read, NaN when not.
                    let err = run(&bad, false).unwrap_err().to_string();
                    assert!(err.contains("out of the vocabulary"), "{what}: {err}");
                    let (poisoned, _) = run(&bad, true)?;
                    let loss = &poisoned[0];
                    match reduction {
                        CrossEntropyReduction::None => {
                            for (k, value) in loss.iter().enumerate() {
                                assert_eq!(
                                    value.is_nan(),
                                    k == 4,
                                    "{what}: position {k} = {value}"
                                );
                            }
                        }
                        _ => assert!(loss[0].is_nan(), "{what}: {loss:?}"),
                    }
                    if reduction == CrossEntropyReduction::Mean {
                        let err = run(&padding, false).unwrap_err().to_string();
                        assert!(err.contains("pad_id"), "{what}: {err}");
                        let (only_padding, _) = run(&padding, true)?;
                        assert!(only_padding[0][0].is_nan(), "{what}: {:?}", only_padding[0]);
                    }
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * 3 * 2);
        Ok(())
    }
}
