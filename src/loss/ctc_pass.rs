//! The pass of the BLEU loss on CTC outputs, on checked arguments
//! (`checked::ctc::ctc_bleu_call`): the expected n-gram statistics of the collapsed sequences
//! ([`ctc_counts_pass`]: the CPU kernel of [`CtcNgramOp`], or the same programs as composed
//! candle ops), then the clipped matches and the score ([`ctc_statistics`]; the reduction stage
//! scores them), as the expected form clips (docs/loss.md, §17).

use super::checked::ctc::CheckedCtcLogits;
use super::config::{BleuLossConfig, BleuStats, CtcExpectedCounts};
use super::forms::clip_expected_counts;
use super::kernels::ctc::ngrams::{CtcNgramOp, CtcNgramPlan};
use super::kernels::ctc::ngrams_composed::ctc_ngram_expectations_composed;
use super::length;
use super::references::{ReferenceSide, References};
use candle_core::{bail, Result, Tensor};

/// The expected counts, totals and length of every element's collapsed sequence, up to order
/// `max_order`, against the id references `refs` laid end to end in rows of `width` positions
/// (the reference side's layout).
pub(crate) fn ctc_counts_pass(
    checked: &CheckedCtcLogits,
    refs: &References,
    blank: u32,
    max_order: usize,
    width: usize,
) -> Result<CtcExpectedCounts> {
    let Some(ids) = refs.ids() else {
        bail!("internal: CTC statistics need id references")
    };
    let logits = &checked.logits.tensor;
    let (batch, frames, _) = logits.dims3()?;
    let runs_kernel = checked
        .logits
        .path
        .runs_ctc_ngram_kernels(logits.device(), max_order);
    // Off the CPU the composed ops read the lengths through the frame mask, and the CUDA
    // kernels on the device: the plan's frame counts are then unused.
    let frame_counts = match (&checked.frames, runs_kernel && logits.device().is_cpu()) {
        (Some(frames), _) => frames.clone(),
        (None, false) => vec![frames; batch],
        (None, true) => bail!("internal: the CPU kernel needs the input lengths on the host"),
    };
    let plan = CtcNgramPlan::new(ids, &frame_counts, max_order, blank, width);
    let columns = plan.columns();
    let out = if runs_kernel {
        let op = CtcNgramOp::new(plan);
        #[cfg(feature = "cuda-unverified")]
        let op = match (&checked.frames, &checked.input_lengths) {
            (None, Some(lengths)) => op.with_device_frames(lengths)?,
            _ => op,
        };
        logits.contiguous()?.apply_op1(op)?
    } else {
        ctc_ngram_expectations_composed(logits, &checked.frame_mask, &plan)?
    };
    debug_assert_eq!(out.dims(), [batch, columns]);
    Ok(CtcExpectedCounts {
        hyp_len: out.narrow(1, 0, 1)?.squeeze(1)?,
        totals: out.narrow(1, 1, max_order)?,
        counts: out
            .narrow(1, 1 + max_order, max_order * width)?
            .reshape((batch, max_order, width))?,
    })
}

/// The per-element statistics from the expected counts: `m_n = Σ_j min(κ_j, ν_j E_j)` and the
/// closest reference length to `E[|B(a)|]`; the reduction stage scores them.
pub(crate) fn ctc_statistics(
    expected: CtcExpectedCounts,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
) -> Result<BleuStats> {
    let ref_len =
        length::closest_reference_lengths(&expected.hyp_len, &side.ref_lengths, &side.ref_mask)?;
    Ok(BleuStats {
        matches: clipped_expected_matches(&expected.counts, side, cfg.max_order)?,
        totals: expected.totals,
        hyp_len: expected.hyp_len,
        ref_len,
    })
}

/// `m_n` of every order, `[B, N]`, from the expected counts `E` (`[B, N, W]`): for id references
/// all orders at once from their packed `ν` and `κ` (`ReferenceSide::counts`, `[2, N, B, W]`):
/// three ops each way, where clipping order by order takes three per order, a `stack`, and in the
/// backward a padding copy per order's `narrow`. The same elementwise ops and sums either way.
fn clipped_expected_matches(
    expected_counts: &Tensor,
    side: &ReferenceSide,
    max_order: usize,
) -> Result<Tensor> {
    if let Some(counts) = &side.counts {
        if counts.dims()[1..] == [max_order, expected_counts.dim(0)?, expected_counts.dim(2)?]
            && counts.dtype() == expected_counts.dtype()
        {
            // [2, N, B, W] -> ν and κ as [B, N, W] views.
            let first = counts.get(0)?.transpose(0, 1)?;
            let clip = counts.get(1)?.transpose(0, 1)?;
            return clip.minimum(&first.mul(expected_counts)?)?.sum(2);
        }
    }
    let matches = (0..max_order)
        .map(|n| {
            let counts = expected_counts.narrow(1, n, 1)?.squeeze(1)?;
            clip_expected_counts(&counts, &side.first[n], &side.clip[n])
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&matches, 1)
}
