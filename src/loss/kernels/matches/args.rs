//! The settings of the expected form's matches op as plain numbers ([`MatchArgs`]), which its CPU
//! op (`op.rs`) takes; the length model's meaning is resolved above the kernels (`forms.rs`).

/// The sizes and settings of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MatchArgs {
    pub batch: usize,
    /// `S`, the hypothesis positions.
    pub seq: usize,
    /// `W`, the references laid end to end.
    pub width: usize,
    /// `N`.
    pub orders: usize,
    /// Whether order `n`'s match weight at start `i` is `U[i + n − 1]` (the weight of the
    /// n-gram's last position: `Given`, `NotEos`) rather than `U[i]` (`SoftEos`: the survival
    /// before its first).
    pub shifted: bool,
}

impl MatchArgs {
    /// `u_n[i]`'s index in `U`.
    #[inline]
    pub(crate) fn weight_index(&self, order: usize, start: usize) -> usize {
        if self.shifted {
            start + order - 1
        } else {
            start
        }
    }

    /// Order `n`'s starts `(S − n + 1, W − n + 1)`, or `None` when either side has no n-gram.
    #[inline]
    pub(crate) fn starts(&self, order: usize) -> Option<(usize, usize)> {
        (order <= self.seq && order <= self.width)
            .then(|| (self.seq - order + 1, self.width - order + 1))
    }
}
