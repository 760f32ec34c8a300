//! The three forms of the clipped matches `m_n` (docs/loss.md, §8 The three forms of the clipped matches), per batch element.
//!
//! Layout: hypothesis n-gram starts `i` on dimension 1, reference starts `j` on dimension 2.
//! `M[i, j] = Π_{k<n} X[i+k, j+k]` is the n-gram match of the hypothesis n-gram at `i` with the
//! reference n-gram at `j` (the transpose of the derivation's `M[j, i]`).

use super::config::Form;
use super::kernels::matches::args::MatchArgs;
use super::kernels::matches::op::ExpectedMatchesOp;
use super::length::HypothesisWeights;
use super::products::{extend_ngram_match, prod_last_dim};
use super::references::{ReferenceSide, ReferenceTokens};
use candle_core::{Result, Tensor};

/// The inputs every form needs.
pub(crate) struct FormInputs<'a> {
    /// `X`: float `[B, S, W]`, `X[i, j] = A_j · P_i`.
    pub token_match: &'a Tensor,
    /// `Z_1 = P Pᵀ`: float `[B, S, S]`, the hypothesis token self-match (paired form only).
    pub hyp_self_match: Option<&'a Tensor>,
    pub hyp: &'a HypothesisWeights,
    pub refs: &'a ReferenceSide,
}

/// `m_n` for `n = 1..=max_order`, float `[B, N]`. With `on_kernel` (the dispatch's
/// `Path::runs_matches_kernel`) the expected form of id references runs as one op
/// ([`ExpectedMatchesOp`]), whose `[B, N]` is the result itself (no order taken apart and stacked
/// again: each `narrow` costs a padding copy in the backward); everything else as composed ops,
/// stacked.
pub(crate) fn clipped_matches(
    form: Form,
    inputs: &FormInputs<'_>,
    max_order: usize,
    on_kernel: bool,
) -> Result<Tensor> {
    // The op reads id references' packed counts, at the token matches' width.
    if let (true, Form::Expected, ReferenceTokens::Ids(_), Some(counts)) =
        (on_kernel, form, &inputs.refs.tokens, &inputs.refs.counts)
    {
        if counts.dim(3)? == inputs.token_match.dim(2)?
            && counts.dim(1)? == max_order
            && counts.dtype() == inputs.token_match.dtype()
        {
            return expected_matches_op(inputs, counts, max_order);
        }
    }
    let batch = inputs.token_match.dim(0)?;
    let zeros = Tensor::zeros(
        batch,
        inputs.token_match.dtype(),
        inputs.token_match.device(),
    )?;
    let mut matches = Vec::with_capacity(max_order);
    let mut ngram_match = Some(inputs.token_match.clone());
    let mut hyp_ngram_self_match = inputs.hyp_self_match.cloned();
    for order in 1..=max_order {
        if order > 1 {
            ngram_match = match &ngram_match {
                Some(previous) => extend_ngram_match(previous, inputs.token_match, order)?,
                None => None,
            };
            if let (Some(previous), Some(base)) = (&hyp_ngram_self_match, inputs.hyp_self_match) {
                hyp_ngram_self_match = extend_ngram_match(previous, base, order)?;
            }
        }
        let (Some(ngram_match), Some(match_weight)) =
            (&ngram_match, &inputs.hyp.matches[order - 1])
        else {
            matches.push(zeros.clone());
            continue;
        };
        let ref_starts = ngram_match.dim(2)?;
        let first = inputs.refs.first[order - 1].narrow(1, 0, ref_starts)?;
        let clip = inputs.refs.clip[order - 1].narrow(1, 0, ref_starts)?;
        let order_matches = match form {
            Form::Expected => expected(ngram_match, match_weight, &first, &clip)?,
            Form::LowerBound => lower_bound(ngram_match, match_weight, &clip)?,
            Form::Paired => {
                let self_match = hyp_ngram_self_match.as_ref().ok_or_else(|| {
                    candle_core::Error::Msg("paired form needs the hypothesis self-match".into())
                })?;
                paired(ngram_match, self_match, match_weight, &first, &clip)?
            }
        };
        matches.push(order_matches);
    }
    Tensor::stack(&matches, 1)
}

/// `m_n = Σ_j min(κ_j, ν_j Σ_i M[i, j] u_i)`: the expected count of each distinct reference
/// n-gram in the hypothesis, clipped.
fn expected(
    ngram_match: &Tensor,
    match_weight: &Tensor,
    first: &Tensor,
    clip: &Tensor,
) -> Result<Tensor> {
    let expected_count = ngram_match
        .broadcast_mul(&match_weight.unsqueeze(2)?)?
        .sum(1)?;
    clip_expected_counts(&expected_count, first, clip)
}

/// The expected form of every order at once, `[B, N]`, by [`ExpectedMatchesOp`] over the id
/// references' packed counts `[2, N, B, W]`.
fn expected_matches_op(
    inputs: &FormInputs<'_>,
    counts: &Tensor,
    max_order: usize,
) -> Result<Tensor> {
    let (batch, seq, width) = inputs.token_match.dims3()?;
    let args = MatchArgs {
        batch,
        seq,
        width,
        orders: max_order,
        shifted: inputs.hyp.match_shifted,
    };
    inputs.token_match.contiguous()?.apply_op2(
        &inputs.hyp.match_source.contiguous()?,
        ExpectedMatchesOp::new(args, counts.clone())?,
    )
}

/// `m_n = Σ_j min(κ_j, ν_j E_j)` from the expected count `E_j` (`[B, W]`) of each reference
/// n-gram: every distinct n-gram's count, clipped once. Shared by the expected form and the
/// BLEU loss on CTC outputs.
pub(crate) fn clip_expected_counts(
    expected_count: &Tensor,
    first: &Tensor,
    clip: &Tensor,
) -> Result<Tensor> {
    clip.minimum(&first.mul(expected_count)?)?.sum(1)
}

/// Zhukov et al.'s lower bound: `m_n = Σ_{i,j} a_{ij} min(1, κ_j / (1 + E_j - a_{ij}))` with
/// `a_{ij} = u_i M[i, j]`, `E_j = Σ_i a_{ij}`.
fn lower_bound(ngram_match: &Tensor, match_weight: &Tensor, clip: &Tensor) -> Result<Tensor> {
    let weighted = ngram_match.broadcast_mul(&match_weight.unsqueeze(2)?)?;
    let expected_count = weighted.sum_keepdim(1)?;
    // 1 + E_j - a_ij >= 1: E_j sums non-negative terms that include a_ij.
    let others = expected_count.broadcast_sub(&weighted)?.affine(1.0, 1.0)?;
    let share = clip.unsqueeze(1)?.broadcast_div(&others)?.minimum(1.0)?;
    weighted.mul(&share)?.sum((1, 2))
}

/// The derivation's paired form: `m_n = Σ_{i,j} min(M κ_j μ_i, M c_i ν_j)` with hypothesis
/// masks `μ_i = u_i Π_{i'<i} (1 - Z[i,i'] u_{i'})` and counts `c_i = μ_i Σ_{i'} Z[i,i'] u_{i'}`.
fn paired(
    ngram_match: &Tensor,
    hyp_self_match: &Tensor,
    match_weight: &Tensor,
    first: &Tensor,
    clip: &Tensor,
) -> Result<Tensor> {
    let starts = match_weight.dim(1)?;
    let (dtype, device) = (match_weight.dtype(), match_weight.device());
    // weighted_self[i, i'] = Z[i, i'] u_{i'}
    let weighted_self = hyp_self_match.broadcast_mul(&match_weight.unsqueeze(1)?)?;
    let hyp_first = if starts == 1 {
        match_weight.clone()
    } else {
        let strictly_lower =
            Tensor::tril2(starts, dtype, device)?.sub(&Tensor::eye(starts, dtype, device)?)?;
        let not_seen_before = weighted_self
            .broadcast_mul(&strictly_lower.unsqueeze(0)?)?
            .affine(-1.0, 1.0)?;
        match_weight.mul(&prod_last_dim(&not_seen_before)?)?
    };
    let hyp_count = hyp_first.mul(&weighted_self.sum(2)?)?;
    let clipped = ngram_match
        .broadcast_mul(&hyp_first.unsqueeze(2)?)?
        .broadcast_mul(&clip.unsqueeze(1)?)?;
    let unclipped = ngram_match
        .broadcast_mul(&hyp_count.unsqueeze(2)?)?
        .broadcast_mul(&first.unsqueeze(1)?)?;
    clipped.minimum(&unclipped)?.sum((1, 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::config::LengthModel;
    use crate::loss::length::hypothesis_weights;
    use crate::loss::references::References;
    use candle_core::{DType, Device, Var};

    /// The expected form by its op against its composed ops: `m_n` and the gradients of `X` and
    /// of the match weights' source `U`, every length model's shift, orders 1–5 (some longer
    /// than the hypothesis or the references), token matches with exact zeros and ones (ties of
    /// the clip) and random ones, f64 to 1e-12.
    #[test]
    fn the_matches_op_matches_the_composed_expected_form() -> Result<()> {
        let dev = Device::Cpu;
        // Two elements; element 1 has a repeated bigram and padding.
        let ids = Tensor::new(&[[3u32, 4, 3, 4, 5], [6, 6, 2, 0, 0]], &dev)?;
        let refs = References::from_ids(&ids, 0)?;
        for (seq, max_order) in [(4, 4), (6, 5), (2, 3), (1, 2)] {
            for model in [
                LengthModel::Given,
                LengthModel::NotEos { eos_id: 1 },
                LengthModel::SoftEos { eos_id: 1 },
            ] {
                for exact in [true, false] {
                    let side = refs.side(max_order, None, DType::F64)?;
                    let width = side.first[0].dim(1)?;
                    let values: Vec<f64> = (0..2 * seq * width)
                        .map(|k| {
                            let r = ((k as u64 * 2654435761) % 1000) as f64 / 1000.0;
                            if exact {
                                (r > 0.5) as u8 as f64
                            } else {
                                r
                            }
                        })
                        .collect();
                    let x = Var::from_vec(values, (2, seq, width), &dev)?;
                    let eos = Var::from_vec(
                        (0..2 * seq).map(|k| 0.05 + 0.1 * (k % 3) as f64).collect(),
                        (2, seq),
                        &dev,
                    )?;
                    let run = |on_kernel: bool| -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
                        let weights = hypothesis_weights(
                            model,
                            Some(eos.as_tensor()),
                            None,
                            2,
                            seq,
                            max_order,
                            DType::F64,
                            &dev,
                        )?;
                        let inputs = FormInputs {
                            token_match: x.as_tensor(),
                            hyp_self_match: None,
                            hyp: &weights,
                            refs: &side,
                        };
                        let m = clipped_matches(Form::Expected, &inputs, max_order, on_kernel)?;
                        let scale = Tensor::new(&[1.0f64, -0.7, 0.4, 1.3, 0.9][..max_order], &dev)?;
                        let grads = m.broadcast_mul(&scale)?.sum_all()?.backward()?;
                        let flat = |t: Option<&Tensor>, n: usize| -> Result<Vec<f64>> {
                            Ok(match t {
                                Some(t) => t.flatten_all()?.to_vec1()?,
                                None => vec![0.0; n],
                            })
                        };
                        Ok((
                            m.flatten_all()?.to_vec1()?,
                            flat(grads.get(x.as_tensor()), x.elem_count())?,
                            flat(grads.get(eos.as_tensor()), eos.elem_count())?,
                        ))
                    };
                    let (want, want_x, want_eos) = run(false)?;
                    let (got, got_x, got_eos) = run(true)?;
                    let what = format!("S = {seq}, N = {max_order}, {model:?}, exact {exact}");
                    for (name, g, w) in [
                        ("m", &got, &want),
                        ("dX", &got_x, &want_x),
                        ("dEOS", &got_eos, &want_eos),
                    ] {
                        assert_eq!(g.len(), w.len(), "{what}: {name}");
                        for (i, (a, b)) in g.iter().zip(w).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                                "{what}: {name}[{i}]: op {a}, composed {b}"
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
