//! The BLEU loss on CTC outputs: [`ctc_bleu_loss_from_logits`], its composed reference
//! [`ctc_bleu_loss_from_logits_composed`], and the expected statistics it clips,
//! [`ctc_expected_counts`] (docs/loss.md, §17). Each checks its arguments once (`checked`) and
//! runs the CTC pass (`ctc_pass`).

use super::checked::ctc::ctc_bleu_call;
use super::config::{BleuLossConfig, BleuLossOutput, CtcExpectedCounts};
use super::ctc_pass::{ctc_counts_pass, ctc_statistics};
use super::dispatch::Path;
use super::reduce::Reducer;
use super::references::References;
use candle_core::{Result, Tensor};

/// `-log BLEU` of a CTC model's outputs against references: each frame's distribution
/// `softmax(logits[b, t])` is drawn independently, and the hypothesis is the alignment's
/// collapse (repeats merged, then blanks removed). The statistics are expectations over the
/// alignments, computed exactly by dynamic programs linear in the frames (docs/loss.md, §17):
/// each reference n-gram's expected count in the collapsed sequence, clipped at its reference
/// count as [`Form::Expected`](super::Form::Expected) clips; the expected number of n-grams
/// `E[max(|B(a)| − n + 1, 0)]`; the expected length `E[|B(a)|]`, against which the closest
/// reference length is chosen. Then the configured smoothing, brevity penalty, weights and
/// reduction, as for every other input. At one-hot frames it is the loss of the collapsed
/// sequence's exact statistics.
///
/// Multi-reference [`References`] work as elsewhere: clip counts are the largest count in any
/// one reference, and the closest reference length is chosen by the expected length.
///
/// # Arguments
/// * `logits` - float `[B, T', V]`, batch-first (PyTorch's CTC is time-first `[T, B, V]`), one
///   row of logits per frame over the vocabulary with the blank. f32 and f64 are computed in
///   their dtype, f16 and bf16 in f32. NaN or Inf within the input lengths is an error (on the
///   CPU always, off it with `cfg.check_values`); frames beyond them may hold anything, NaN
///   included, as in [`ctc_loss`](super::ctc_loss).
/// * `input_lengths` - u32, i32 or i64 `[B]`: the frames of each element, each `<= T'`
///   (frames beyond are not read and get zero gradient); `None` = `T'`. Read to the host once
///   on the CPU (one counted copy), where the kernel needs them.
/// * `refs` - id [`References`] (`References::from_ids`) of the same batch, on the same
///   device, none of whose tokens is `blank`.
/// * `blank` - the blank's id, `< V`.
/// * `cfg` - orders, weights, smoothing and reduction as for [`bleu_loss`](super::bleu_loss);
///   the form must be `Expected` and the length model `Given` (the EOS length models do not
///   apply to CTC outputs, whose length is the collapse's). `check_values` as elsewhere.
///
/// The CPU kernel runs the programs and their hand-written backward over raw slices, one batch
/// element per thread, storing no `[B, T', V]` softmax; its backward stores, per element being
/// processed, the frames' probabilities and `N − 2` states per frame and symbol. Off the CPU the
/// same programs run as composed candle ops ([`ctc_bleu_loss_from_logits_composed`]).
///
/// ```
/// use candle_bleu::loss::{ctc_bleu_loss_from_logits, BleuLossConfig, References};
/// use candle_core::{Device, Tensor};
/// const BLANK: u32 = 0;
/// let dev = Device::Cpu;
/// let refs = References::from_ids(&Tensor::new(&[[3u32, 4, 4, 5]], &dev)?, BLANK)?;
/// // A CTC output of 8 frames that is certain of "3 3 _ 4 _ 4 5 5": it collapses to 3 4 4 5.
/// let frames = [3u32, 3, 0, 4, 0, 4, 5, 5];
/// let mut logits = vec![-30f32; 8 * 6];
/// for (t, &v) in frames.iter().enumerate() {
///     logits[t * 6 + v as usize] = 30.0;
/// }
/// let logits = Tensor::from_vec(logits, (1, 8, 6), &dev)?;
/// let out = ctc_bleu_loss_from_logits(&logits, None, &refs, BLANK, &BleuLossConfig::default())?;
/// assert!(out.loss.to_scalar::<f32>()?.abs() < 1e-4); // BLEU 1
/// assert!((out.stats.hyp_len.to_vec1::<f32>()?[0] - 4.0).abs() < 1e-4);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_bleu_loss_from_logits(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let path = Path::for_device(logits.device());
    ctc_bleu_on(
        logits,
        input_lengths,
        refs,
        blank,
        cfg,
        path,
        Reducer::Local,
    )
}

/// [`ctc_bleu_loss_from_logits`] as composed candle ops (`candle_nn::ops::softmax`, gathers and
/// the programs frame by frame), never the crate's kernel: the reference the kernel is tested
/// against, and what devices without it run. The same values and gradients to rounding; it
/// stores the `[B, T', V]` softmax and a graph of `O(T' · N)` ops.
pub fn ctc_bleu_loss_from_logits_composed(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    ctc_bleu_on(
        logits,
        input_lengths,
        refs,
        blank,
        cfg,
        Path::Composed,
        Reducer::Local,
    )
}

/// The BLEU loss on CTC outputs with `reducer`'s sums: this process's, or a data-parallel
/// group's (`distributed::DataParallel::ctc_bleu_loss_from_logits`).
pub(crate) fn ctc_bleu_on(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &BleuLossConfig,
    path: Path,
    reducer: Reducer,
) -> Result<BleuLossOutput> {
    let checked = ctc_bleu_call(logits, input_lengths, refs, blank, cfg, path)?;
    let side = refs.side(cfg.max_order, None, checked.logits.tensor.dtype())?;
    let width = side.first[0].dim(1)?;
    let expected = ctc_counts_pass(&checked, refs, blank, cfg.max_order, width)?;
    reducer.bleu(ctc_statistics(expected, &side, cfg)?, cfg, path)
}

/// The expected n-gram statistics of CTC outputs' collapsed sequences, before clipping: what
/// [`ctc_bleu_loss_from_logits`] scores, for logging or for objectives of one's own. Exact
/// expectations over the alignments, differentiable with respect to `logits`.
///
/// # Arguments
/// * `logits`, `input_lengths`, `refs`, `blank` - as [`ctc_bleu_loss_from_logits`];
/// * `max_order` - the largest n-gram order `N` (>= 1).
///
/// ```
/// use candle_bleu::loss::{ctc_expected_counts, References};
/// use candle_core::{Device, Tensor};
/// let dev = Device::Cpu;
/// let refs = References::from_ids(&Tensor::new(&[[1u32, 2]], &dev)?, 0)?;
/// // Two frames, each "1" or blank with probability 1/2: B(a) is "1" with probability 3/4.
/// let logits = Tensor::new(&[[[0f64, 0.0, -1e4], [0.0, 0.0, -1e4]]], &dev)?;
/// let stats = ctc_expected_counts(&logits, None, &refs, 0, 2)?;
/// let counts = stats.counts.to_vec3::<f64>()?; // [B, N, W]
/// assert!((counts[0][0][0] - 0.75).abs() < 1e-12); // E[count of "1"]
/// assert_eq!(counts[0][0][1], 0.0); // "2" has probability 0
/// assert!((stats.hyp_len.to_vec1::<f64>()?[0] - 0.75).abs() < 1e-12);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_expected_counts(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    max_order: usize,
) -> Result<CtcExpectedCounts> {
    let cfg = BleuLossConfig {
        max_order,
        ..Default::default()
    };
    let path = Path::for_device(logits.device());
    let checked = ctc_bleu_call(logits, input_lengths, refs, blank, &cfg, path)?;
    let side = refs.side(max_order, None, checked.logits.tensor.dtype())?;
    let width = side.first[0].dim(1)?;
    ctc_counts_pass(&checked, refs, blank, max_order, width)
}
