//! The passes every entry point of the loss shares, on checked arguments (`checked`), for every
//! kind of input: the pass over the logits ([`logits_pass`], the crate's kernels or composed
//! candle ops as the checked value's [`Path`] says) or over hidden states (the hidden-state op,
//! `hidden_pass`), the hypothesis side of BLEU from it ([`hypothesis_pass`]), the cross-entropy
//! alone ([`cross_entropy_pass`]) and the per-element statistics ([`statistics`]). The
//! reduction stage (`reduce`) sums and scores what they give.
//!
//! The walk of `hidden` through [`ce_bleu_from_hidden`](super::ce_bleu_from_hidden): one process
//! (`reduce::Reducer::Local`), the default config (`Corpus`, no z-loss or token accuracy), id
//! references, the CPU kernels. A stop is a call into another function of the crate on the main
//! path; the validation (`checked::calls::training_call`), the op's blocks and the statistics'
//! length models and forms are one stop each, and questions asked on the side (the path, a dtype, a
//! layout's columns) are not stops. 18 stops; no file is entered more than twice, and the
//! reduction hands finished sums down to the score, which calls nothing back:
//!
//! 1. `hidden::hidden_input` — `hidden`, `proj` and `blocks` as one `Hypotheses::Hidden`
//!    (the entry asks `dispatch::Path::for_device` on the side);
//! 2. `run::training` — the one path;
//! 3. `checked::calls::training_call` — every argument checked once (`shaped` → `hidden_call`:
//!    `hidden` as contiguous rows `[B·S, D]` in the compute dtype; `ShapedInput::finish`);
//! 4. `reduce::Reducer::divide` — the cross-entropy's divisor `n`;
//! 5. `references::References::side` — the reference side (cached);
//! 6. [`hypothesis_pass`];
//! 7. `hidden_pass::hidden_rows` — the row parameters from the checked arguments;
//! 8. `kernels::hidden::op::HiddenRowsOp` (through candle's `apply_op3`) — one op over the rows,
//!    its output `[B, S, C]` split by [`RowLayout`](super::kernels::layout::RowLayout);
//! 9. [`inputs_from_gathered`] — the token matches `[B, S, W]` (and EOS probabilities);
//! 10. [`TokenLosses::from_rows`] — the cross-entropy's column (each row divided by `n`);
//! 11. [`statistics`] — length weights, clipped matches, lengths: `BleuStats` `[B, N]`, `[B]`;
//! 12. `reduce::Reducer::training`;
//! 13. `reduce::token_sum` — the cross-entropy, the sum of the divided rows;
//! 14. `reduce::Reducer::bleu_loss`;
//! 15. `reduce::score_rows` — the statistics in f64, summed over the batch: `[1, N]`, `[1]`;
//! 16. `score::neg_log_bleu` — `-log BLEU` of the sums;
//! 17. `score::log_brevity_penalty`;
//! 18. `score::weighted_log_precisions`.
//!
//! Files in order: `hidden`, `run`, `checked`, `reduce`, `references`, `pipeline`, `hidden_pass`,
//! `kernels/hidden`, `pipeline`, `reduce`, `score`. docs/design.md holds the same list and the
//! data-parallel form's.

use super::checked::hidden::materialised_logits;
use super::checked::hypotheses::CheckedInput;
use super::checked::logits::CheckedHypotheses;
use super::checked::targets::CheckedTargets;
use super::config::{BleuLossConfig, BleuStats, Form};
use super::dispatch::Path;
use super::hidden_pass::hidden_rows;
use super::kernels::composed::{self, gather_columns};
use super::kernels::layout::RowLayout;
use super::kernels::row::op::{GatherIds, RowOp};
use super::kernels::softcap;
use super::references::{ReferenceSide, ReferenceTokens};
use super::{forms, length};
use candle_core::{bail, Module, Result, Tensor, D};

/// Everything the statistics need from the hypothesis side.
pub(crate) struct HypothesisInputs {
    /// `X`: `[B, S, W]`.
    pub token_match: Tensor,
    /// `P[:, :, eos]`: `[B, S]`, for the EOS length models.
    pub eos_probs: Option<Tensor>,
    /// `Z_1 = P Pᵀ`: `[B, S, S]`, for the paired form.
    pub hyp_self_match: Option<Tensor>,
}

/// The token matches from full probabilities: a gather for ids, a product for matrices.
pub(crate) fn hypothesis_inputs_from_probs(
    probs: &Tensor,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    let token_match = match &side.tokens {
        ReferenceTokens::Ids(ids) => gather_columns(probs, ids)?,
        ReferenceTokens::Matrices(matrices) => probs.matmul(&matrices.t()?)?,
    };
    let eos_probs = cfg
        .length
        .eos_id()
        .map(|eos| probs.narrow(2, eos as usize, 1)?.squeeze(2))
        .transpose()?;
    let hyp_self_match = (cfg.form == Form::Paired)
        .then(|| probs.matmul(&probs.t()?))
        .transpose()?;
    Ok(HypothesisInputs {
        token_match,
        eos_probs,
        hyp_self_match,
    })
}

/// The token matches (and EOS probabilities) from the gathered columns `[X | eos]`.
pub(crate) fn inputs_from_gathered(
    gathered: &Tensor,
    width: usize,
    self_match: Option<Tensor>,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    Ok(HypothesisInputs {
        token_match: gathered.narrow(2, 0, width)?,
        eos_probs: cfg
            .length
            .eos_id()
            .map(|_| gathered.narrow(2, width, 1)?.squeeze(2))
            .transpose()?,
        hyp_self_match: self_match,
    })
}

/// What one pass over the logits reads for the BLEU side.
#[derive(Clone, Copy)]
pub(crate) enum Gather<'a> {
    /// Nothing (the cross-entropy alone).
    Nothing,
    /// The softmax at u32 `[B, K]` ids.
    Ids(&'a GatherIds),
    /// The self-match `P Pᵀ` and the softmax at the ids (the paired form).
    SelfMatch(&'a GatherIds),
    /// Every probability (matrix references).
    Probs,
}

/// What [`logits_pass`] gives.
#[derive(Default)]
pub(crate) struct LogitsPass {
    /// `[B, S, K]`: the softmax at the ids.
    pub gathered: Option<Tensor>,
    /// `[B, S, S]`: `P Pᵀ`.
    pub self_match: Option<Tensor>,
    /// `[B, S, V]`: every probability.
    pub probs: Option<Tensor>,
    /// The cross-entropy's token terms against the targets.
    pub cross_entropy: Option<TokenLosses>,
}

/// One pass over checked `[B, S, V]` logits in their compute dtype: what `gather` asks for
/// and, with `targets`, the cross-entropy. The kernels ([`RowOp`]: one op whose backward
/// writes one logits gradient for everything it computed) or composed candle ops, as the checked
/// value's path says. A soft cap left to the pass (`CheckedHypotheses::softcap`) is read by the
/// row pass as it reads the logits; the self-match and softmax passes take capped logits.
pub(crate) fn logits_pass(
    checked: &CheckedHypotheses,
    gather: Gather,
    targets: Option<&CheckedTargets>,
) -> Result<LogitsPass> {
    // What only the row pass reads natively (`Path::runs_options_kernels`): a soft cap and
    // 16-bit logits. The other passes, and composed ops, take capped f32 logits.
    let native_16bit = checked.compute_dtype() != checked.tensor.dtype();
    let prepared;
    let (logits, softcap) = match gather {
        Gather::SelfMatch(_) | Gather::Probs if checked.softcap.is_some() || native_16bit => {
            let mut tensor = checked.tensor.to_dtype(checked.compute_dtype())?;
            if let Some(cap) = checked.softcap {
                tensor = softcap::softcap(&tensor, cap, false)?;
            }
            prepared = CheckedHypotheses {
                tensor,
                path: checked.path,
                softcap: None,
            };
            (&prepared, None)
        }
        _ => (checked, checked.softcap),
    };
    if logits.path == Path::Composed {
        if softcap.is_some() {
            bail!("internal: a soft cap left to the composed ops' pass");
        }
        return composed_logits_pass(&logits.tensor, gather, targets);
    }
    let (ids, self_match) = match gather {
        Gather::Nothing => (None, false),
        Gather::Ids(ids) => (Some(ids), false),
        Gather::SelfMatch(ids) => (Some(ids), true),
        Gather::Probs => {
            let probs = RowOp::softmax().apply(&logits.tensor)?;
            let ce = logits_pass(logits, Gather::Nothing, targets)?.cross_entropy;
            return Ok(LogitsPass {
                probs: Some(probs),
                cross_entropy: ce,
                ..Default::default()
            });
        }
    };
    let (_, seq, _) = logits.tensor.dims3()?;
    let terms = targets.map(|t| {
        (
            t.targets.as_ref(),
            t.terms.clone(),
            t.inv_count(),
            t.z_ratio(),
        )
    });
    let op = RowOp::rows(self_match, ids, terms)?.with_softcap(softcap)?;
    let layout = op.layout(seq)?;
    let out = op.apply(&logits.tensor)?;
    Ok(LogitsPass {
        gathered: ids.map(|_| layout.gathered_part(&out)).transpose()?,
        self_match: layout.self_match_part(&out)?,
        probs: None,
        cross_entropy: targets
            .map(|_| TokenLosses::from_rows(&out, &layout))
            .transpose()?,
    })
}

/// [`logits_pass`] as composed candle ops, with the kernels' numbers to rounding.
fn composed_logits_pass(
    logits: &Tensor,
    gather: Gather,
    targets: Option<&CheckedTargets>,
) -> Result<LogitsPass> {
    let cross_entropy = targets
        .map(|t| -> Result<TokenLosses> {
            let metrics = if t.terms.metrics() {
                let (safe_targets, mask) = composed::masked_targets(&t.targets, t.terms.pad_id)?;
                let mask = mask.to_dtype(logits.dtype())?;
                let (z, correct) =
                    composed::token_metrics(logits, &safe_targets, &mask, t.terms.z_loss)?;
                Some(TokenMetrics { z, correct })
            } else {
                None
            };
            Ok(TokenLosses {
                terms: composed::token_cross_entropy(logits, &t.targets, &t.terms, t.z_ratio())?,
                divided: false,
                metrics,
            })
        })
        .transpose()?;
    let probs = match gather {
        Gather::Nothing => None,
        _ => Some(candle_nn::ops::softmax(logits, D::Minus1)?),
    };
    let mut pass = LogitsPass {
        cross_entropy,
        ..Default::default()
    };
    match (gather, probs) {
        (Gather::Ids(ids), Some(probs)) => pass.gathered = Some(gather_columns(&probs, &ids.ids)?),
        (Gather::SelfMatch(ids), Some(probs)) => {
            pass.self_match = Some(probs.matmul(&probs.t()?)?);
            pass.gathered = Some(gather_columns(&probs, &ids.ids)?);
        }
        (_, probs) => pass.probs = probs,
    }
    Ok(pass)
}

/// The BLEU side's hypothesis inputs from checked logits (and, with `targets`, the
/// cross-entropy from the same pass): the softmax at the reference ids (and EOS) for id
/// references, `P Pᵀ` too for the paired form, every probability for matrix references.
fn logits_hypothesis_pass(
    logits: &CheckedHypotheses,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
    targets: Option<&CheckedTargets>,
) -> Result<(HypothesisInputs, Option<TokenLosses>)> {
    match &side.tokens {
        ReferenceTokens::Ids(ids) => {
            let width = ids.dim(1)?;
            let gather_ids = gather_ids(side)?;
            let gather = match cfg.form {
                Form::Paired => Gather::SelfMatch(gather_ids),
                Form::Expected | Form::LowerBound => Gather::Ids(gather_ids),
            };
            let pass = logits_pass(logits, gather, targets)?;
            let Some(gathered) = pass.gathered else {
                bail!("internal: the logits pass gathered nothing")
            };
            let inputs = inputs_from_gathered(&gathered, width, pass.self_match, cfg)?;
            Ok((inputs, pass.cross_entropy))
        }
        ReferenceTokens::Matrices(_) => {
            let pass = logits_pass(logits, Gather::Probs, targets)?;
            let Some(probs) = pass.probs else {
                bail!("internal: the logits pass gave no probabilities")
            };
            let inputs = hypothesis_inputs_from_probs(&probs, side, cfg)?;
            Ok((inputs, pass.cross_entropy))
        }
    }
}

/// The ids a pass gathers at, `[B, W]` with the `eos_id` column under the EOS length models:
/// the ones the reference side caches.
fn gather_ids(side: &ReferenceSide) -> Result<&GatherIds> {
    match &side.gather {
        Some(gather) => Ok(gather),
        None => bail!("internal: id references without gather ids"),
    }
}

/// The hypothesis inputs of the BLEU side from any checked input (and, with `targets`, the
/// pass's cross-entropy token terms): probabilities are used as they are; logits
/// go through [`logits_pass`]; hidden states through the hidden-state op
/// ([`hidden_rows`]) with id references, and with matrix references (`[B, T, V]`
/// themselves, as large as the logits) through their materialised logits.
pub(crate) fn hypothesis_pass(
    input: &CheckedInput,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
    targets: Option<&CheckedTargets>,
) -> Result<(HypothesisInputs, Option<TokenLosses>)> {
    match input {
        CheckedInput::Tensor {
            checked,
            probs: true,
        } => Ok((
            hypothesis_inputs_from_probs(&checked.tensor, side, cfg)?,
            None,
        )),
        CheckedInput::Tensor { checked, .. } => logits_hypothesis_pass(checked, side, cfg, targets),
        CheckedInput::Hidden {
            checked,
            blocks,
            given: (hidden, proj),
        } => match &side.tokens {
            ReferenceTokens::Ids(ids) => {
                let paired = cfg.form == Form::Paired;
                let gather = gather_ids(side)?;
                let (out, layout) = hidden_rows(checked, Some(gather), targets, paired, blocks)?;
                let self_match = layout.self_match_part(&out)?;
                let gathered = layout.gathered_part(&out)?;
                let inputs = inputs_from_gathered(&gathered, ids.dim(1)?, self_match, cfg)?;
                let cross_entropy = targets
                    .map(|_| TokenLosses::from_rows(&out, &layout))
                    .transpose()?;
                Ok((inputs, cross_entropy))
            }
            ReferenceTokens::Matrices(_) => {
                let logits = materialised_logits(checked, proj.forward(hidden)?, cfg.check_values)?;
                logits_hypothesis_pass(&logits, side, cfg, targets)
            }
        },
    }
}

/// The token terms of the cross-entropy, from one pass: `[B, S, 1]` (or `[B, S]`), each
/// non-pad position's term, 0 at padding; and the metrics when the targets' terms ask for them.
pub(crate) struct TokenLosses {
    pub terms: Tensor,
    /// Whether each term is divided by the targets' divisor already (the kernels and the
    /// hidden-state op weight each row), or the sum is divided once (the composed ops on logits,
    /// as they always computed the mean).
    pub divided: bool,
    /// With a z-loss or the token accuracy: each position's metrics.
    pub metrics: Option<TokenMetrics>,
}

/// Each position's metrics, detached, the shape of [`TokenLosses::terms`], 0 at padding:
/// `λ·lse²` (unweighted) and 1 where the target is the row's argmax.
pub(crate) struct TokenMetrics {
    pub z: Tensor,
    pub correct: Tensor,
}

impl TokenLosses {
    /// The cross-entropy column of a row op's (or the hidden-state op's) output `out` — each
    /// row's term divided already — and its metric columns when `layout` has them.
    pub(crate) fn from_rows(out: &Tensor, layout: &RowLayout) -> Result<Self> {
        Ok(Self {
            terms: layout.cross_entropy_part(out)?,
            divided: true,
            metrics: layout
                .metrics_part(out)?
                .map(|(z, correct)| TokenMetrics { z, correct }),
        })
    }
}

/// The cross-entropy's token terms alone, from one pass: the row op ([`RowOp`]) or composed
/// ops over logits, the hidden-state op over hidden states.
pub(crate) fn cross_entropy_pass(
    input: &CheckedInput,
    targets: &CheckedTargets,
) -> Result<TokenLosses> {
    match input {
        CheckedInput::Tensor { checked, .. } => {
            let pass = logits_pass(checked, Gather::Nothing, Some(targets))?;
            match pass.cross_entropy {
                Some(losses) => Ok(losses),
                None => bail!("internal: the logits pass computed no cross-entropy"),
            }
        }
        CheckedInput::Hidden {
            checked, blocks, ..
        } => {
            let (out, layout) = hidden_rows(checked, None, Some(targets), false, blocks)?;
            TokenLosses::from_rows(&out, &layout)
        }
    }
}

/// The per-element statistics from the hypothesis inputs: length weights, clipped matches,
/// totals, lengths and the effective reference lengths (docs/loss.md, §4–§9). The reduction
/// stage (`reduce`) sums and scores them.
pub(crate) fn statistics(
    inputs: HypothesisInputs,
    side: &ReferenceSide,
    hyp_lengths: Option<&Tensor>,
    cfg: &BleuLossConfig,
    on_kernel: bool,
) -> Result<BleuStats> {
    let (batch, seq, _) = inputs.token_match.dims3()?;
    let (dtype, device) = (
        inputs.token_match.dtype(),
        inputs.token_match.device().clone(),
    );
    let weights = length::hypothesis_weights(
        cfg.length,
        inputs.eos_probs.as_ref(),
        hyp_lengths,
        batch,
        seq,
        cfg.max_order,
        dtype,
        &device,
    )?;
    let form_inputs = forms::FormInputs {
        token_match: &inputs.token_match,
        hyp_self_match: inputs.hyp_self_match.as_ref(),
        hyp: &weights,
        refs: side,
    };
    let matches = forms::clipped_matches(cfg.form, &form_inputs, cfg.max_order, on_kernel)?;
    let zeros = Tensor::zeros(batch, dtype, &device)?;
    let totals: Vec<Tensor> = weights
        .totals
        .iter()
        .map(|g| g.as_ref().map_or_else(|| Ok(zeros.clone()), |g| g.sum(1)))
        .collect::<Result<_>>()?;
    let hyp_len = weights.length.sum(1)?;
    let ref_len = length::closest_reference_lengths(&hyp_len, &side.ref_lengths, &side.ref_mask)?;
    Ok(BleuStats {
        matches,
        totals: Tensor::stack(&totals, 1)?,
        hyp_len,
        ref_len,
    })
}
