//! The loss from hidden states and the output projection, without storing the `[B, S, V]`
//! logits: its configuration.

/// Block sizes and gradient filtering of the hidden-state entry points.
///
/// The logits of a block of rows (`rows × V`) are computed from the hidden states and the
/// output projection, used and dropped, forward and backward (the backward recomputes them), so
/// the loss's memory does not grow with `B · S · V`.
///
/// `Default`: blocks of at most [`HiddenConfig::DEFAULT_BLOCK_ELEMENTS`] logits, no filtering
/// (exact).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HiddenConfig {
    /// The most logits one block holds (`rows × V` elements, `>= 1`): a block has
    /// `max(1, block_elements / V)` rows, rounded to whole sequences where the loss needs whole
    /// sequences at once (the paired form, matrix references).
    pub block_elements: usize,
    /// Vocabulary columns per tile in the backward (`>= 1`): the unit that gradient filtering
    /// skips.
    pub vocab_tile: usize,
    /// Gradient filtering (Wijmans et al. 2024, Cut Cross-Entropy): in the backward, skip a tile
    /// whose softmax probabilities all lie below this threshold. `None` (default): no filtering,
    /// exact gradients.
    pub filter_below: Option<f64>,
}

impl HiddenConfig {
    /// The default block size: 4 Mi logits (16 MiB in f32).
    pub const DEFAULT_BLOCK_ELEMENTS: usize = 4 << 20;
}

impl Default for HiddenConfig {
    fn default() -> Self {
        Self {
            block_elements: Self::DEFAULT_BLOCK_ELEMENTS,
            vocab_tile: 2048,
            filter_below: None,
        }
    }
}
