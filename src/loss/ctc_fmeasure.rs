//! NMLA's n-gram F-measure on CTC outputs (Shao & Feng 2022, "Non-Monotonic Latent Alignments
//! for CTC-Based Non-Autoregressive Machine Translation"): [`ctc_ngram_f_loss`] and its composed
//! reference [`ctc_ngram_f_loss_composed`], from the expected counts and totals that the BLEU
//! loss on CTC outputs computes (docs/loss.md, §17.6).

use super::checked::ctc::ctc_bleu_call;
use super::config::{BleuLossConfig, CtcNgramFConfig, CtcNgramFOutput, Reduction};
use super::ctc_pass::{ctc_counts_pass, ctc_statistics};
use super::dispatch::Path;
use super::references::References;
use candle_core::{bail, Result, Tensor};

/// The n-gram F-measure loss of a CTC model's outputs against references, NMLA's objective:
/// per element `F_n = 2·M_n / (T_n(y) + E[T_n(B(a))])` and the loss `−mean_b F_n`
/// ([`Reduction::SentenceMean`], NMLA's) or `−2·Σ_b M_n / Σ_b (T_n(y) + E[T_n(B(a))])`
/// ([`Reduction::Corpus`]), where
/// - `M_n` is the clipped expected matches of order `n`: each reference n-gram's expected count
///   in the collapsed sequence `B(a)`, clipped at its reference count, summed (the BLEU loss's
///   `m_n`, [`ctc_bleu_loss_from_logits`](super::ctc_bleu_loss_from_logits));
/// - `T_n(y) = max(|y| − n + 1, 0)` is the number of n-grams of the reference (of the reference
///   whose length is closest to the expected length, as BLEU picks, with several);
/// - `E[T_n(B(a))] = E[max(|B(a)| − n + 1, 0)]` the expected number of n-grams of the output,
///   exact (NMLA writes `E|ŷ| − n + 1`, equal whenever `|B(a)| ≥ n − 1` surely).
///
/// Unlike BLEU's precision, the F-measure penalises length both ways: n-grams the output lacks
/// lower it through `T_n(y)`, n-grams it adds through `E[T_n]`. An element whose reference has
/// no n-gram of order `n` has `F_n = 0` (and `M_n = 0`): it adds nothing to the gradient.
///
/// # Arguments
/// * `logits`, `input_lengths`, `refs`, `blank` - as for the BLEU loss on CTC outputs: float
///   `[B, T', V]` logits (f32/f64 in their dtype, f16/bf16 in f32), u32 `[B]` frames per
///   element (`None` = `T'`), id [`References`] without the blank, the blank's id `< V`.
/// * `cfg` - the order `n` (`>= 1`; NMLA's is 2), the reduction and `check_values`.
///
/// Returns the loss and, per element `[B]`, `F_n`, `M_n`, `E[T_n(B(a))]` and `T_n(y)`. The
/// CPU kernel of the BLEU loss on CTC outputs computes the expectations (no `[B, T', V]`
/// softmax is stored); off the CPU composed candle ops do.
///
/// ```
/// use candle_bleu::loss::{ctc_ngram_f_loss, CtcNgramFConfig, References};
/// use candle_core::{Device, Tensor};
/// const BLANK: u32 = 0;
/// let dev = Device::Cpu;
/// let refs = References::from_ids(&Tensor::new(&[[3u32, 4, 5]], &dev)?, BLANK)?;
/// // Frames certain of "3 _ 4 4": the output is "3 4", whose one bigram is a reference bigram.
/// let frames = [3u32, 0, 4, 4];
/// let mut logits = vec![-30f64; 4 * 6];
/// for (t, &v) in frames.iter().enumerate() {
///     logits[t * 6 + v as usize] = 30.0;
/// }
/// let logits = Tensor::from_vec(logits, (1, 4, 6), &dev)?;
/// let out = ctc_ngram_f_loss(&logits, None, &refs, BLANK, &CtcNgramFConfig::default())?;
/// // F_2 = 2 · 1 / (2 + 1): the reference has 2 bigrams, the output 1, and 1 matches.
/// assert!((out.loss.to_scalar::<f64>()? + 2.0 / 3.0).abs() < 1e-9);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_ngram_f_loss(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &CtcNgramFConfig,
) -> Result<CtcNgramFOutput> {
    let path = Path::for_device(logits.device());
    ctc_ngram_f_on(logits, input_lengths, refs, blank, cfg, path)
}

/// [`ctc_ngram_f_loss`] as composed candle ops, never the crate's kernel: the reference the
/// kernel path is tested against. The same values and gradients to rounding.
pub fn ctc_ngram_f_loss_composed(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &CtcNgramFConfig,
) -> Result<CtcNgramFOutput> {
    ctc_ngram_f_on(logits, input_lengths, refs, blank, cfg, Path::Composed)
}

fn ctc_ngram_f_on(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &CtcNgramFConfig,
    path: Path,
) -> Result<CtcNgramFOutput> {
    let order = cfg.order;
    if order == 0 {
        bail!("`cfg.order` = 0: the F-measure needs an n-gram order >= 1");
    }
    // The statistics of the BLEU loss on CTC outputs up to `order`: the same validation, the
    // same programs, the same clipping and reference length.
    let bleu_cfg = BleuLossConfig {
        max_order: order,
        check_values: cfg.check_values,
        ..Default::default()
    };
    let checked = ctc_bleu_call(logits, input_lengths, refs, blank, &bleu_cfg, path)?;
    let side = refs.side(order, None, checked.logits.tensor.dtype())?;
    let width = side.first[0].dim(1)?;
    let expected = ctc_counts_pass(&checked, refs, blank, order, width)?;
    let stats = ctc_statistics(expected, &side, &bleu_cfg)?;
    let matches = stats.matches.narrow(1, order - 1, 1)?.squeeze(1)?;
    let hyp_ngrams = stats.totals.narrow(1, order - 1, 1)?.squeeze(1)?;
    let ref_ngrams = stats.ref_len.affine(1.0, -((order - 1) as f64))?.relu()?;
    let denominator = (&ref_ngrams + &hyp_ngrams)?;
    // T_n(y) >= 1 gives a denominator >= 1; T_n(y) = 0 gives M_n = 0, and F_n = 0 whatever
    // E[T_n] is: the floor of 1 only keeps that 0 / 0 out.
    let f_measure = (matches.affine(2.0, 0.0)? / denominator.maximum(1.0)?)?;
    let loss = match cfg.reduction {
        Reduction::SentenceMean => f_measure.mean(0)?.neg()?,
        Reduction::Corpus => {
            let total = denominator.sum(0)?.maximum(1.0)?;
            (matches.sum(0)?.affine(-2.0, 0.0)? / total)?
        }
    };
    Ok(CtcNgramFOutput {
        loss,
        f_measure,
        matches,
        hyp_ngrams,
        ref_ngrams,
    })
}
