//! The one owner of the row ops' per-row output layout, [`RowLayout`]:
//!
//! | pass | output per row |
//! |---|---|
//! | [`Pass::Rows`] | `[x_0 … x_{K−1} | ce | max | sum | weight]` |
//! | [`Pass::SelfMatch`] | `[Z_0 … Z_{S−1} | x_0 … x_{K−1} | ce | max | sum | weight]` |
//! | the composed hidden-state rows | `[Z_0 … Z_{S−1} (paired form) | x_0 … x_{K−1} | ce]` |
//!
//! `Z` is the self-match `P Pᵀ` within the row's batch element, `x_k` the softmax at the
//! gathered ids, `ce` the row's scaled cross-entropy term and `max | sum | weight` what the
//! kernels' backward needs ([`CE_COLUMNS`]). With a z-loss or the token accuracy asked for,
//! every layout ends in two metric columns, `z | correct` ([`RowLayout::with_metrics`]): the
//! row's `λ·lse²` and 1 where its target is the argmax, both unweighted and 0 at padding, read
//! detached — no gradient flows through them. Every back-end (the CPU row kernels, the CUDA
//! kernels, the hidden-state op's CPU and composed blocks) and the passes over their outputs
//! compute widths and offsets and split an output with this type.

use candle_core::{Result, Tensor, D};

/// Columns each row of the kernels' output carries after the gathered probabilities: the row's
/// (scaled) cross-entropy term, then what the backward needs — the row's maximum logit, its sum
/// of `exp(logit − max)`, and the row's weight `1/n` (0 at padding or without targets).
pub(crate) const CE_COLUMNS: usize = 4;

/// Which pass a row op makes over each row of logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Softmax statistics, gathered probabilities and cross-entropy columns.
    Rows,
    /// The self-match `Z = P Pᵀ` within each batch element, then the columns of `Rows`.
    SelfMatch,
    /// Every probability.
    Softmax,
}

/// The columns of one output row: `[Z | x | ce | statistics]` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowLayout {
    /// `Some(S)`: the self-match pass's `S` columns of `Z` come first.
    pub self_match: Option<usize>,
    /// The gathered columns `x`.
    pub gathered: usize,
    /// Columns after `ce`: `max | sum | weight` for the kernels, none for the composed rows.
    statistics: usize,
    /// Whether the metric columns `z | correct` end the row.
    metrics: bool,
}

/// The metric columns a row ends in, when it has them: `z | correct`.
const METRIC_COLUMNS: usize = 2;

impl RowLayout {
    /// The row pass's layout: `[x | ce | max | sum | weight]` with `gathered` columns of `x`.
    pub(crate) fn rows(gathered: usize) -> Self {
        Self {
            self_match: None,
            gathered,
            statistics: CE_COLUMNS - 1,
            metrics: false,
        }
    }

    /// The same columns, ending in the metric columns `z | correct` when `metrics`.
    pub(crate) fn with_metrics(self, metrics: bool) -> Self {
        Self { metrics, ..self }
    }

    /// Whether the rows end in the metric columns.
    pub(crate) fn has_metrics(&self) -> bool {
        self.metrics
    }

    /// The self-match pass's layout: `[Z | x | ce | max | sum | weight]`, `seq` columns of `Z`.
    pub(crate) fn self_match(seq: usize, gathered: usize) -> Self {
        Self {
            self_match: Some(seq),
            ..Self::rows(gathered)
        }
    }

    /// The kernels' layout of `pass` over elements of `seq` rows (the softmax pass writes every
    /// probability instead; its backward is given the row pass's layout without columns).
    pub(crate) fn of_pass(pass: Pass, seq: usize, gathered: usize) -> Self {
        match pass {
            Pass::Rows => Self::rows(gathered),
            Pass::SelfMatch => Self::self_match(seq, gathered),
            Pass::Softmax => Self::rows(0),
        }
    }

    /// The same columns without the kernels' statistics: `[Z | x | ce]`, what the composed
    /// hidden-state rows write.
    pub(crate) fn without_statistics(self) -> Self {
        Self {
            statistics: 0,
            ..self
        }
    }

    /// Whether the rows start with the self-match `Z`.
    pub(crate) fn paired(&self) -> bool {
        self.self_match.is_some()
    }

    /// The number of `Z` columns (0 without the self-match).
    pub(crate) fn self_match_columns(&self) -> usize {
        self.self_match.unwrap_or(0)
    }

    /// The first gathered column.
    pub(crate) fn gathered_start(&self) -> usize {
        self.self_match_columns()
    }

    /// The cross-entropy column, followed by the statistics.
    pub(crate) fn ce_column(&self) -> usize {
        self.self_match_columns() + self.gathered
    }

    /// The kernels' statistic columns after `ce`: the row's maximum logit, its sum of
    /// `exp(logit − max)` and its weight `1/n`.
    pub(crate) fn max_column(&self) -> usize {
        self.ce_column() + 1
    }

    /// See [`Self::max_column`].
    pub(crate) fn sum_column(&self) -> usize {
        self.ce_column() + 2
    }

    /// See [`Self::max_column`].
    pub(crate) fn weight_column(&self) -> usize {
        self.ce_column() + 3
    }

    /// The first metric column (`z`, then `correct`), after the statistics.
    pub(crate) fn metrics_column(&self) -> usize {
        self.ce_column() + 1 + self.statistics
    }

    /// Columns per row.
    pub(crate) fn stride(&self) -> usize {
        self.metrics_column() + if self.metrics { METRIC_COLUMNS } else { 0 }
    }

    /// `Z`, `[.., S]`, of an output whose last dimension holds the rows (`None` without it).
    pub(crate) fn self_match_part(&self, out: &Tensor) -> Result<Option<Tensor>> {
        self.self_match
            .map(|seq| out.narrow(D::Minus1, 0, seq))
            .transpose()
    }

    /// The gathered columns `x`, `[.., K]`.
    pub(crate) fn gathered_part(&self, out: &Tensor) -> Result<Tensor> {
        out.narrow(D::Minus1, self.gathered_start(), self.gathered)
    }

    /// The cross-entropy column, `[.., 1]`.
    pub(crate) fn cross_entropy_part(&self, out: &Tensor) -> Result<Tensor> {
        out.narrow(D::Minus1, self.ce_column(), 1)
    }

    /// The metric columns, detached: `(z, correct)`, `[.., 1]` each (`None` without them).
    pub(crate) fn metrics_part(&self, out: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        if !self.metrics {
            return Ok(None);
        }
        let first = self.metrics_column();
        let z = out.narrow(D::Minus1, first, 1)?.detach();
        let correct = out.narrow(D::Minus1, first + 1, 1)?.detach();
        Ok(Some((z, correct)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_and_offsets() {
        let rows = RowLayout::rows(3);
        assert_eq!(
            (rows.gathered_start(), rows.ce_column(), rows.stride()),
            (0, 3, 7)
        );
        let paired = RowLayout::self_match(5, 3);
        assert_eq!(
            (paired.gathered_start(), paired.ce_column(), paired.stride()),
            (5, 8, 12)
        );
        let statistics = (
            paired.max_column(),
            paired.sum_column(),
            paired.weight_column(),
        );
        assert_eq!(statistics, (9, 10, 11));
        assert_eq!(paired.without_statistics().stride(), 9);
        let measured = paired.with_metrics(true);
        assert_eq!((measured.metrics_column(), measured.stride()), (12, 14));
        assert_eq!(measured.weight_column(), paired.weight_column());
        let composed = measured.without_statistics();
        assert_eq!((composed.metrics_column(), composed.stride()), (9, 11));
        assert_eq!(RowLayout::of_pass(Pass::Softmax, 5, 3), RowLayout::rows(0));
        assert_eq!(RowLayout::of_pass(Pass::SelfMatch, 5, 3), paired);
    }

    #[test]
    fn parts_split_a_row() -> Result<()> {
        let layout = RowLayout::self_match(2, 1).without_statistics();
        let out = Tensor::arange(0u32, 2 * layout.stride() as u32, &candle_core::Device::Cpu)?
            .reshape((1, 2, layout.stride()))?;
        let z = layout.self_match_part(&out)?.expect("paired");
        assert_eq!(z.to_vec3::<u32>()?, [[[0, 1], [4, 5]]]);
        assert_eq!(layout.gathered_part(&out)?.to_vec3::<u32>()?, [[[2], [6]]]);
        assert_eq!(
            layout.cross_entropy_part(&out)?.to_vec3::<u32>()?,
            [[[3], [7]]]
        );
        assert!(RowLayout::rows(1).self_match_part(&out)?.is_none());
        Ok(())
    }
}
