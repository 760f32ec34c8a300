//! The pass over hidden states and the output layer: [`hidden_rows`], the per-row outputs of
//! their logits from one custom op (`kernels::hidden::op::HiddenRowsOp`) that computes and drops
//! the logits block by block ([`HiddenRowsKind`]): the CPU kernels where the checked path runs
//! them; on CUDA the row op's kernels on each block ([`RowOpRows`]: one matmul and one row pass
//! per block forward, their backward recomputed per block; feature `cuda-unverified`); composed
//! candle ops in the same blocks elsewhere. The row parameters are built here from the checked
//! arguments; the kernels take them as plain values. This layer sees both kernel families, so
//! it is where the hidden family's blocks meet the row family's op.

use super::checked::hidden::CheckedHidden;
use super::checked::targets::CheckedTargets;
use super::config::HiddenConfig;
use super::dispatch::Path;
use super::host::CpuView;
use super::kernels::composed::{class_weight_tensor, masked_targets};
use super::kernels::cpu::CrossEntropyTerms;
use super::kernels::hidden::composed::{BlockRows, ComposedBlocks, ComposedRows};
use super::kernels::hidden::cpu::{CpuBlocks, RowSpec};
use super::kernels::hidden::op::{bias_input, HiddenBlocks, HiddenRowsOp};
use super::kernels::layout::RowLayout;
use super::kernels::row::op::{GatherIds, RowOp};
use super::kernels::softcap::softcap;
use candle_core::{bail, Device, Result, Tensor};

/// How the hidden-state op computes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HiddenRowsKind {
    /// The CPU kernels: GEMM per vocabulary tile and the row kernels on raw slices.
    CpuKernels,
    /// The row op on each block's logits ([`RowOpRows`]): its CUDA kernels on CUDA.
    RowOpBlocks,
    /// Composed candle ops on each block ([`ComposedRows`]).
    Composed,
}

impl HiddenRowsKind {
    /// The kind for `path` on `device`: the CPU kernels on the CPU's kernel path; the row op's
    /// kernels on each block where its CUDA kernels run (`Path::Kernels` off the CPU; the
    /// cross-entropy's options have sent the path to composed ops where their kernels do not
    /// load) — only with `cuda-unverified`, since this path has not run on a GPU; composed ops
    /// otherwise.
    pub(crate) fn for_path(path: Path, device: &Device) -> Self {
        #[cfg(test)]
        if ROW_OP_BLOCKS_ON_CPU.with(|on| on.get()) && device.is_cpu() && path == Path::Kernels {
            return HiddenRowsKind::RowOpBlocks;
        }
        if path.runs_cpu_kernels(device) {
            HiddenRowsKind::CpuKernels
        } else if cfg!(feature = "cuda-unverified") && path == Path::Kernels {
            HiddenRowsKind::RowOpBlocks
        } else {
            HiddenRowsKind::Composed
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Tests only: run [`HiddenRowsKind::RowOpBlocks`] on the CPU's kernel path (the row op's
    /// CPU kernels on each block), to test the blocks' orchestration against the CPU kernels.
    pub(crate) static ROW_OP_BLOCKS_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The rows of a block through the row op ([`RowOp`]): the row pass, or the self-match pass
/// over whole elements, on the block's logits, with the gathered ids and targets of its rows;
/// the op's backward kernel runs in the block's recomputed backward.
struct RowOpRows {
    /// `Some(S)` for the self-match pass (blocks of whole elements of `S` rows).
    self_match: Option<usize>,
    /// u32 `[B, K]` per element (self-match pass) or `[B·S, K]` per row (row pass), with
    /// their first-occurrence links.
    gather: Option<GatherIds>,
    /// u32 `[B·S]` cross-entropy targets (padding included: the op reads the padding id).
    targets: Option<Tensor>,
    terms: CrossEntropyTerms,
    inv_count: f64,
    z_ratio: f64,
    /// The soft cap read by the row pass itself (the CPU op caps a copy; on CUDA the options
    /// kernels read through it).
    pass_softcap: Option<f64>,
    /// The soft cap applied to each block's logits by its own op before the pass (the
    /// self-match pass, and CUDA without the options kernels).
    block_softcap: Option<(f64, bool)>,
    layout: RowLayout,
}

impl BlockRows for RowOpRows {
    fn op_name(&self) -> &'static str {
        "candle-bleu-loss-from-hidden-row-kernels"
    }

    fn rows(&self, logits: &Tensor, start: usize) -> Result<Tensor> {
        let (n, vocab) = logits.dims2()?;
        let seq = self.self_match.unwrap_or(1);
        if !n.is_multiple_of(seq) || !start.is_multiple_of(seq) {
            bail!("internal: a self-match block of {n} rows at {start} splits an element of {seq}");
        }
        let (elements, first) = (n / seq, start / seq);
        let capped;
        let logits = match self.block_softcap {
            Some((cap, cpu_kernels)) => {
                capped = softcap(logits, cap, cpu_kernels)?;
                &capped
            }
            None => logits,
        };
        let logits = logits.reshape((elements, seq, vocab))?;
        let gather = self
            .gather
            .as_ref()
            .map(|g| -> Result<GatherIds> {
                Ok(GatherIds {
                    ids: g.ids.narrow(0, first, elements)?,
                    links: g.links.narrow(0, first, elements)?,
                })
            })
            .transpose()?;
        let targets = self
            .targets
            .as_ref()
            .map(|t| t.narrow(0, start, n)?.reshape((elements, seq)))
            .transpose()?;
        let terms = targets
            .as_ref()
            .map(|t| (t, self.terms.clone(), self.inv_count, self.z_ratio));
        let op = RowOp::rows(self.self_match.is_some(), gather.as_ref(), terms)?
            .with_softcap(self.pass_softcap)?;
        if op.layout(seq)? != self.layout {
            bail!("internal: the row op's columns differ from the hidden-state op's");
        }
        op.apply(&logits)?.reshape((n, self.layout.stride()))
    }
}

/// The row parameters of [`RowOpRows`] from the checked arguments.
fn row_op_rows(
    inputs: &CheckedHidden,
    gather: Option<&GatherIds>,
    targets: Option<&CheckedTargets>,
    paired: bool,
    layout: RowLayout,
) -> Result<RowOpRows> {
    let (batch, seq) = (inputs.batch, inputs.seq);
    let device = inputs.hidden.device();
    // The row pass gathers per row: each element's ids repeated over its rows, so that a block
    // may start inside an element.
    let per_row = |t: &Tensor| -> Result<Tensor> {
        let width = t.dim(1)?;
        t.unsqueeze(1)?
            .broadcast_as((batch, seq, width))?
            .reshape((batch * seq, width))
    };
    let gather = gather
        .map(|g| -> Result<GatherIds> {
            Ok(if paired {
                g.clone()
            } else {
                GatherIds {
                    ids: per_row(&g.ids)?,
                    links: per_row(&g.links)?,
                }
            })
        })
        .transpose()?;
    let reads_cap = !paired && (device.is_cpu() || inputs.path.runs_options_kernels(device));
    Ok(RowOpRows {
        self_match: paired.then_some(seq),
        gather,
        targets: targets.map(|t| t.targets.flatten_all()).transpose()?,
        terms: targets.map(|t| t.terms.clone()).unwrap_or_default(),
        inv_count: targets.map_or(0.0, |t| t.inv_count()),
        z_ratio: targets.map_or(1.0, |t| t.z_ratio()),
        pass_softcap: inputs.softcap.filter(|_| reads_cap),
        block_softcap: inputs
            .softcap
            .filter(|_| !reads_cap)
            .map(|cap| (cap, device.is_cpu())),
        layout,
    })
}

/// The per-row outputs `[B, S, C]` of the hidden states' logits (`HiddenRowsOp`) and their
/// columns: the CPU kernels where the checked path runs them, composed candle ops otherwise
/// (the same columns without the kernels' statistics).
pub(crate) fn hidden_rows(
    inputs: &CheckedHidden,
    gather: Option<&GatherIds>,
    targets: Option<&CheckedTargets>,
    paired: bool,
    cfg: &HiddenConfig,
) -> Result<(Tensor, RowLayout)> {
    let (batch, seq, vocab) = (inputs.batch, inputs.seq, inputs.vocab);
    let block_rows = cfg.block_rows(vocab, if paired { seq } else { 1 });
    let ids = gather.map(|g| &g.ids);
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
    let kind = HiddenRowsKind::for_path(inputs.path, device);
    let blocks = if kind == HiddenRowsKind::CpuKernels {
        layout = kernels_layout;
        let read = |t: &Tensor, what: &str| -> Result<Vec<u32>> {
            let t = t.contiguous()?;
            let view = CpuView::new(&t, what)?;
            Ok(view.slice::<u32>()?.to_vec())
        };
        let ids = ids.map(|ids| read(ids, "ids")).transpose()?;
        let (rows_targets, terms, inv_count, z_ratio) = match targets {
            Some(t) => (
                Some(read(&t.targets, "targets")?),
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
        let rows: Box<dyn BlockRows> = if kind == HiddenRowsKind::RowOpBlocks {
            layout = kernels_layout;
            Box::new(row_op_rows(inputs, gather, targets, paired, layout)?)
        } else {
            layout = kernels_layout.without_statistics();
            Box::new(ComposedRows {
                ids: ids
                    .map(|ids| {
                        ids.unsqueeze(1)?
                            .broadcast_as((batch, seq, width))?
                            .reshape((batch * seq, width))
                    })
                    .transpose()?,
                targets: targets
                    .map(|t| -> Result<(Tensor, Tensor)> {
                        let (safe, mask) = masked_targets(&t.targets, t.terms.pad_id)?;
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
            })
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

#[cfg(test)]
mod tests {
    //! What a block of the hidden-state op costs on the device: its forward graph's ops (each a
    //! launch on CUDA, reshapes aside), with the row op's kernels and with composed ops. Their
    //! values are tested against the CPU kernels in `hidden.rs`.
    use super::*;
    use candle_core::{Device, Var};

    /// The tracked ops `rows` adds to a block's logits `[6, 11]` (CE with padding and label
    /// smoothing, 3 gathered ids per row).
    fn block_ops(rows: &dyn BlockRows, logits: &Tensor) -> Result<usize> {
        let before = logits.sorted_nodes().len();
        Ok(rows.rows(logits, 0)?.sorted_nodes().len() - before)
    }

    #[test]
    fn a_row_op_block_is_a_few_ops() -> Result<()> {
        let dev = Device::Cpu;
        let (n, dim, vocab, width) = (6, 4, 11, 3);
        let hidden = Var::randn(0f32, 1.0, (n, dim), &dev)?;
        let weight = Var::randn(0f32, 1.0, (vocab, dim), &dev)?;
        let bias = Var::randn(0f32, 1.0, vocab, &dev)?;
        let logits = hidden
            .matmul(&weight.t()?)?
            .broadcast_add(bias.as_tensor())?;
        let ids: Vec<u32> = (0..n * width)
            .map(|i| (1 + i % (vocab - 1)) as u32)
            .collect();
        let gather = GatherIds::from_host(&ids, (n, width), &dev)?;
        let targets = Tensor::new(&[1u32, 2, 0, 4, 5, 0], &dev)?;
        let terms = CrossEntropyTerms {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        };
        let row_op = RowOpRows {
            self_match: None,
            gather: Some(gather.clone()),
            targets: Some(targets.clone()),
            terms: terms.clone(),
            inv_count: 0.25,
            z_ratio: 1.0,
            pass_softcap: None,
            block_softcap: None,
            layout: RowLayout::rows(width),
        };
        let weights = targets
            .ne(0u32)?
            .to_dtype(candle_core::DType::F32)?
            .affine(0.25, 0.0)?;
        let composed = ComposedRows {
            ids: Some(gather.ids),
            targets: Some((targets, weights)),
            terms,
            class_weights: None,
            z_ratio: 1.0,
            softcap: None,
            layout: RowLayout::rows(width).without_statistics(),
        };
        let (kernel_ops, composed_ops) =
            (block_ops(&row_op, &logits)?, block_ops(&composed, &logits)?);
        println!("ops per block: row op {kernel_ops}, composed {composed_ops}");
        // The row op, between two reshapes (views, no launch).
        assert_eq!(kernel_ops, 3);
        assert!(composed_ops >= 10, "{composed_ops}");
        Ok(())
    }
}
