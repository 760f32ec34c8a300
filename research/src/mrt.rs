//! Minimum risk training (Shen et al. 2016; Edunov et al. 2018): the expected cost of a set of
//! candidate translations under the model's distribution renormalised over the set.
//!
//! For source `x` with candidates `y_1 … y_k` (samples or beam outputs, duplicates removed)
//! and costs `c_j = 1 − sentence-BLEU(y_j, r)`:
//!
//! `Q(y_j) = exp(α · log p(y_j | x)) / Σ_{j'} exp(α · log p(y_j' | x))`,
//! `risk(x) = Σ_j Q(y_j) · c_j`,
//!
//! and the batch's risk is the mean over sources. `α` sharpens (`α > 1`) or flattens the
//! renormalised distribution; Shen et al. use `α = 5·10⁻³` with 100 samples, Edunov et al.
//! `α = 1` with beam candidates. The training loss mixes it with token cross-entropy,
//! `CE + μ · risk`, as Edunov et al. found necessary.

use anyhow::{bail, Result};
use candle_core::{DType, Tensor, D};

/// Per-candidate log-probabilities `log p(y | x)` from teacher-forced logits.
///
/// * `logits` - f32 `[N, T, V]` for decoder inputs `BOS y`;
/// * `targets` - u32 `[N, T]`: `y EOS` then `pad`;
/// * returns f32 `[N]`: `Σ_t log softmax(logits[n, t])[targets[n, t]]` over non-pad positions.
pub fn sequence_log_probs(logits: &Tensor, targets: &Tensor, pad: u32) -> Result<Tensor> {
    let (n, t, _) = logits.dims3()?;
    if targets.dims() != [n, t] {
        bail!(
            "`targets` must be [{n}, {t}] like `logits` {:?}, got {:?}",
            logits.dims(),
            targets.dims()
        );
    }
    let mask = targets.ne(pad)?.to_dtype(logits.dtype())?;
    let safe = targets.where_cond(targets, &targets.zeros_like()?)?;
    let safe = mask.to_dtype(DType::U32)?.mul(&safe)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = log_probs.gather(&safe.unsqueeze(2)?, 2)?.squeeze(2)?;
    Ok((picked * mask)?.sum(1)?)
}

/// The mean risk over sources.
///
/// * `log_probs` - `[B, K]`: `log p(y_j | x_b)` (differentiable);
/// * `costs` - `[B, K]`: `c_j` in `[0, 1]` (constants);
/// * `valid` - `[B, K]`: 1 for a candidate that counts, 0 for a duplicate or an empty slot
///   (every source needs at least one);
/// * `alpha` - the sharpness `α > 0`.
pub fn risk(log_probs: &Tensor, costs: &Tensor, valid: &Tensor, alpha: f64) -> Result<Tensor> {
    if !(alpha.is_finite() && alpha > 0.0) {
        bail!("`alpha` must be finite and > 0, got {alpha}");
    }
    let (b, k) = log_probs.dims2()?;
    if costs.dims() != [b, k] || valid.dims() != [b, k] {
        bail!(
            "`costs` {:?} and `valid` {:?} must be [{b}, {k}] like `log_probs`",
            costs.dims(),
            valid.dims()
        );
    }
    // Invalid candidates get a score of -1e9 (exp underflows to exactly 0).
    let invalid_penalty = ((valid.ones_like()? - valid)? * -1e9)?;
    let scores = ((log_probs * alpha)? + invalid_penalty)?;
    let q = candle_nn::ops::softmax(&scores, D::Minus1)?;
    Ok((q * costs)?.sum(1)?.mean_all()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn risk_by_hand_and_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let lp = Var::new(&[[-1.0f64, -2.0, -3.0], [-0.5, -0.5, -9.0]], &dev)?;
        let costs = Tensor::new(&[[0.2f64, 0.5, 1.0], [0.0, 1.0, 0.3]], &dev)?;
        let valid = Tensor::new(&[[1.0f64, 1.0, 1.0], [1.0, 1.0, 0.0]], &dev)?;
        let r = risk(lp.as_tensor(), &costs, &valid, 1.0)?;
        let z1: f64 = [-1.0f64, -2.0, -3.0].iter().map(|x| x.exp()).sum();
        let r1 = ((-1.0f64).exp() * 0.2 + (-2.0f64).exp() * 0.5 + (-3.0f64).exp()) / z1;
        let r2 = 0.5; // two equal candidates, costs 0 and 1; the third is invalid
        assert!((r.to_scalar::<f64>()? - (r1 + r2) / 2.0).abs() < 1e-12);
        // d risk / d lp_j = Q_j (c_j − risk_b) / B
        let grads = r.backward()?;
        let g = grads.get(lp.as_tensor()).unwrap().to_vec2::<f64>()?;
        let q0 = (-1.0f64).exp() / z1;
        assert!((g[0][0] - q0 * (0.2 - r1) / 2.0).abs() < 1e-12);
        assert!(g[1][2].abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn sequence_log_probs_by_hand() -> Result<()> {
        let dev = Device::Cpu;
        let logits = Tensor::new(&[[[0f32, 0.0], [1.0, 0.0]]], &dev)?; // [1, 2, 2]
        let targets = Tensor::new(&[[1u32, 0]], &dev)?; // second position is pad (0)
        let lp = sequence_log_probs(&logits, &targets, 0)?.to_vec1::<f32>()?;
        assert!((lp[0] - 0.5f32.ln()).abs() < 1e-6);
        Ok(())
    }
}
