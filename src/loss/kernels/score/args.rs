//! The score's settings as plain numbers ([`ScoreArgs`]), which its CPU op (`op.rs`), its launch
//! plans (`launch.rs`) and its CUDA side (`cuda.rs`) all take; the loss config's meaning is
//! resolved above the kernels, by `loss/score.rs`.

/// The score's settings, plain numbers (the loss config's meaning resolved by `loss/score.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScoreArgs {
    /// `N`: the rows are `[K, 2N + 2]`.
    pub orders: usize,
    /// `k`, added to the matches and totals of every order from the second (BLEU+1); 0 for none.
    pub additive: f64,
    /// `w_n`, one per order.
    pub weights: Vec<f64>,
    /// The smallest statistic that counts; below it a total or a match is 0.
    pub tiny: f64,
    /// `ln` of the precision floor.
    pub log_floor: f64,
}

impl ScoreArgs {
    /// Columns of a row: `2N + 2`.
    pub(crate) fn columns(&self) -> usize {
        2 * self.orders + 2
    }
}
