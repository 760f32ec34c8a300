//! Length models: how much of each hypothesis position belongs to the output (docs/loss.md,
//! §5 Length models); and the effective reference length each hypothesis length is compared
//! with ([`closest_reference_lengths`]).
//!
//! | model | length weight `h_i` | match weight `u_i` | total weight `g_i` |
//! |---|---|---|---|
//! | `Given(len)` | `1[i < len]` | `1[i+n-1 < len]` | `1[i+n-1 < len]` |
//! | `NotEos(eos, len)` | `1[i < len] (1 - P[i, eos])` | `1[i+n-1 < len]` | `Π_{k<n} h_{i+k}` |
//! | `SoftEos(eos)` | `s_i` | `s_{i-1}` | `s_{i+n-1}` |
//!
//! with `s_i = Π_{k<=i} (1 - P[k, eos])` and `s_{-1} = 1`.

use super::config::LengthModel;
use super::products::prod_last_dim;
use candle_core::{DType, Device, Result, Tensor};

/// The hypothesis weights of every order (index `n - 1`).
#[derive(Debug, Clone)]
pub(crate) struct HypothesisWeights {
    /// `h`: float `[B, S]`; `Σ_i h_i` is the hypothesis length `c`.
    pub length: Tensor,
    /// `u` per order: float `[B, S - n + 1]`, `None` when `n > S`.
    pub matches: Vec<Option<Tensor>>,
    /// `g` per order: float `[B, S - n + 1]`, `None` when `n > S`; `Σ_i g_i` is the total `t_n`.
    pub totals: Vec<Option<Tensor>>,
    /// `U`: float `[B, S]`, the one tensor every order's `u` narrows: `u_n[i] = U[i + n - 1]`
    /// when `match_shifted` (`Given`, `NotEos`), else `U[i]` (`SoftEos`).
    pub match_source: Tensor,
    pub match_shifted: bool,
}

/// `1[i < len_b]` as a float `[B, S]` mask, built on the device from u32 `[B]` lengths (all
/// ones for `None`): no lengths travel to the host. A length above `S` masks nothing, as `S`.
fn position_mask(
    hyp_lengths: Option<&Tensor>,
    batch: usize,
    seq: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    match hyp_lengths {
        None => Tensor::ones((batch, seq), dtype, device),
        Some(lengths) => Tensor::arange(0u32, seq as u32, device)?
            .unsqueeze(0)?
            .broadcast_lt(&lengths.unsqueeze(1)?)?
            .to_dtype(dtype),
    }
}

/// `s_i = Π_{k<=i} (1 - p_k)`: a cumulative product as a product over the lower triangle, so
/// that an exact `p_k = 1` gives exact zeros and finite gradients.
pub(crate) fn survival(eos_probs: &Tensor) -> Result<Tensor> {
    let (_, seq) = eos_probs.dims2()?;
    let lower = Tensor::tril2(seq, eos_probs.dtype(), eos_probs.device())?;
    // factors[b, i, k] = 1 - p_k [k <= i]
    let factors = eos_probs
        .unsqueeze(1)?
        .broadcast_mul(&lower.unsqueeze(0)?)?
        .affine(-1.0, 1.0)?;
    prod_last_dim(&factors)
}

/// The weights of `model` for hypotheses of `seq` positions.
///
/// * `eos_probs` - `P[:, :, eos]`, float `[B, S]`; required by the EOS models.
/// * `hyp_lengths` - u32 `[B]` hard lengths (`S` each when `None`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn hypothesis_weights(
    model: LengthModel,
    eos_probs: Option<&Tensor>,
    hyp_lengths: Option<&Tensor>,
    batch: usize,
    seq: usize,
    max_order: usize,
    dtype: DType,
    device: &Device,
) -> Result<HypothesisWeights> {
    let starts = |order: usize| (order <= seq).then(|| seq - order + 1);
    let eos = || {
        eos_probs
            .ok_or_else(|| candle_core::Error::Msg("length model needs EOS probabilities".into()))
    };
    match model {
        LengthModel::Given => {
            let mask = position_mask(hyp_lengths, batch, seq, dtype, device)?;
            let per_order: Vec<Option<Tensor>> = (1..=max_order)
                .map(|order| {
                    starts(order)
                        .map(|n| mask.narrow(1, order - 1, n))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            Ok(HypothesisWeights {
                length: mask.clone(),
                matches: per_order.clone(),
                totals: per_order,
                match_source: mask,
                match_shifted: true,
            })
        }
        LengthModel::NotEos { .. } => {
            let mask = position_mask(hyp_lengths, batch, seq, dtype, device)?;
            let length = mask.mul(&eos()?.affine(-1.0, 1.0)?)?;
            let matches = (1..=max_order)
                .map(|order| {
                    starts(order)
                        .map(|n| mask.narrow(1, order - 1, n))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            // g_n = g_{n-1}[:S-n+1] * h[n-1:]
            let mut totals = Vec::with_capacity(max_order);
            let mut previous = length.clone();
            for order in 1..=max_order {
                match starts(order) {
                    Some(n) if order > 1 => {
                        previous =
                            previous
                                .narrow(1, 0, n)?
                                .mul(&length.narrow(1, order - 1, n)?)?;
                        totals.push(Some(previous.clone()));
                    }
                    Some(_) => totals.push(Some(length.clone())),
                    None => totals.push(None),
                }
            }
            Ok(HypothesisWeights {
                length,
                matches,
                totals,
                match_source: mask,
                match_shifted: true,
            })
        }
        LengthModel::SoftEos { .. } => {
            let survive = survival(eos()?)?;
            let nothing_before = Tensor::ones((batch, 1), dtype, device)?;
            let survive_before = if seq == 1 {
                nothing_before
            } else {
                Tensor::cat(&[&nothing_before, &survive.narrow(1, 0, seq - 1)?], 1)?
            };
            let matches = (1..=max_order)
                .map(|order| {
                    starts(order)
                        .map(|n| survive_before.narrow(1, 0, n))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            let totals = (1..=max_order)
                .map(|order| {
                    starts(order)
                        .map(|n| survive.narrow(1, order - 1, n))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            Ok(HypothesisWeights {
                length: survive,
                matches,
                totals,
                match_source: survive_before,
                match_shifted: false,
            })
        }
    }
}

/// The effective reference length of each element: the reference length closest to the
/// hypothesis length `c`, the shorter on a tie (sacrebleu and NLTK), chosen with tensor ops on
/// the device. A constant: no gradient flows through the choice.
///
/// * `hyp_len` - float `[B]`;
/// * `ref_lengths` - float `[B, R]` in the dtype of `hyp_len`, `ref_mask` u8 `[B, R]` (1 where a
///   reference is). Distances are taken in that dtype, so a tie between fractional lengths is a
///   tie of its rounded distances.
pub(crate) fn closest_reference_lengths(
    hyp_len: &Tensor,
    ref_lengths: &Tensor,
    ref_mask: &Tensor,
) -> Result<Tensor> {
    let far = Tensor::full(f32::INFINITY, ref_lengths.shape(), ref_lengths.device())?
        .to_dtype(ref_lengths.dtype())?;
    let distance = ref_lengths
        .broadcast_sub(&hyp_len.detach().unsqueeze(1)?)?
        .abs()?;
    // Padding is infinitely far; every element has a reference, so its nearest is finite.
    let distance = ref_mask.where_cond(&distance, &far)?;
    let nearest = distance.min_keepdim(1)?;
    let is_nearest = distance.broadcast_eq(&nearest)?;
    is_nearest.where_cond(ref_lengths, &far)?.min(1)
}
