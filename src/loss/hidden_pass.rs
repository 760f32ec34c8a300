//! The pass over hidden states and the output layer: [`hidden_rows`], the per-row outputs of
//! their logits from one custom op (`kernels::hidden::op::HiddenRowsOp`) that computes and drops
//! the logits block by block — the CPU kernels where the checked path runs them, composed
//! candle ops in the same blocks elsewhere. The row parameters are built here from the checked
//! arguments; the kernels take them as plain values.

use super::checked::hidden::CheckedHidden;
use super::checked::targets::CheckedTargets;
use super::config::HiddenConfig;
use super::host::CpuView;
use super::kernels::composed::{class_weight_tensor, masked_targets};
use super::kernels::cpu::CrossEntropyTerms;
use super::kernels::hidden::composed::{ComposedBlocks, ComposedRows};
use super::kernels::hidden::cpu::{CpuBlocks, RowSpec};
use super::kernels::hidden::op::{bias_input, HiddenBlocks, HiddenRowsOp};
use super::kernels::layout::RowLayout;
use candle_core::{Result, Tensor};

/// The per-row outputs `[B, S, C]` of the hidden states' logits (`HiddenRowsOp`) and their
/// columns: the CPU kernels where the checked path runs them, composed candle ops otherwise
/// (the same columns without the kernels' statistics).
pub(crate) fn hidden_rows(
    inputs: &CheckedHidden,
    ids: Option<&Tensor>,
    targets: Option<&CheckedTargets>,
    paired: bool,
    cfg: &HiddenConfig,
) -> Result<(Tensor, RowLayout)> {
    let (batch, seq, vocab) = (inputs.batch, inputs.seq, inputs.vocab);
    let block_rows = cfg.block_rows(vocab, if paired { seq } else { 1 });
    let width = ids.map_or(Ok(0), |ids| ids.dim(1))?;
    let metrics = targets.is_some_and(|t| t.terms.metrics());
    let kernels_layout = if paired {
        RowLayout::self_match(seq, width)
    } else {
        RowLayout::rows(width)
    }
    .with_metrics(metrics);
    let layout;
    let device = inputs.hidden.device();
    let blocks = if inputs.path.runs_cpu_kernels(device) {
        layout = kernels_layout;
        let read = |t: &Tensor, what: &str| -> Result<Vec<u32>> {
            let t = t.contiguous()?;
            let view = CpuView::new(&t, what)?;
            Ok(view.slice::<u32>()?.to_vec())
        };
        let ids = ids.map(|ids| read(ids, "ids")).transpose()?;
        let (rows_targets, terms, inv_count, z_ratio) = match targets {
            Some(t) => (
                Some(read(t.targets, "targets")?),
                t.terms.clone(),
                t.inv_count(),
                t.z_ratio(),
            ),
            None => (None, CrossEntropyTerms::default(), 0.0, 1.0),
        };
        HiddenBlocks::Cpu(CpuBlocks {
            spec: RowSpec {
                ids: ids.unwrap_or_default(),
                layout,
                targets: rows_targets,
                terms,
                inv_count,
                z_ratio,
                seq,
                vocab,
            },
            block_rows,
            block_elements: cfg.block_elements,
            vocab_tile: cfg.vocab_tile,
            filter_below: cfg.filter_below,
            softcap: inputs.softcap,
        })
    } else {
        layout = kernels_layout.without_statistics();
        let rows = ComposedRows {
            ids: ids
                .map(|ids| {
                    ids.unsqueeze(1)?
                        .broadcast_as((batch, seq, width))?
                        .reshape((batch * seq, width))
                })
                .transpose()?,
            targets: targets
                .map(|t| -> Result<(Tensor, Tensor)> {
                    let (safe, mask) = masked_targets(t.targets, t.terms.pad_id)?;
                    let weights = mask.to_dtype(inputs.dtype)?.affine(t.inv_count(), 0.0)?;
                    Ok((safe.flatten_all()?, weights.flatten_all()?))
                })
                .transpose()?,
            terms: targets.map(|t| t.terms.clone()).unwrap_or_default(),
            class_weights: targets
                .and_then(|t| t.terms.class_weights.as_deref())
                .map(|w| class_weight_tensor(w, inputs.dtype, device))
                .transpose()?,
            z_ratio: targets.map_or(1.0, |t| t.z_ratio()),
            softcap: inputs.softcap,
            layout,
        };
        HiddenBlocks::Composed(ComposedBlocks::forward(
            &inputs.hidden,
            &inputs.weight,
            inputs.bias.as_ref(),
            rows,
            block_rows,
        )?)
    };
    let op = HiddenRowsOp {
        blocks,
        has_bias: inputs.bias.is_some(),
    };
    let bias = bias_input(inputs.bias.as_ref(), inputs.dtype, device)?;
    let out = inputs.hidden.apply_op3(&inputs.weight, &bias, op)?;
    Ok((out.reshape((batch, seq, ()))?, layout))
}
