//! Products that candle has no reduction for, written with multiplies only.
//!
//! candle has no product reduction and no `cumprod`, and `exp(Σ log x)` turns the exact zeros of
//! one-hot inputs into NaN gradients (docs/loss.md, §10.3 Guards). Everything here is built from elementwise
//! multiplies of narrowed views, whose gradients are exact at zero.

use candle_core::{Result, Tensor};

/// `Π_k t[..., k]` over the last dimension, as a balanced tree of elementwise multiplies
/// (`log2 K` ops instead of `K`).
///
/// Any float dtype and shape `[..., K]` with `K >= 1`; returns `[...]`.
pub fn prod_last_dim(t: &Tensor) -> Result<Tensor> {
    let last = t.rank() - 1;
    let mut current = t.clone();
    loop {
        let width = current.dim(last)?;
        if width == 1 {
            return current.squeeze(last);
        }
        let half = width / 2;
        let paired = current
            .narrow(last, 0, half)?
            .mul(&current.narrow(last, half, half)?)?;
        current = if width % 2 == 1 {
            Tensor::cat(&[&paired, &current.narrow(last, width - 1, 1)?], last)?
        } else {
            paired
        };
    }
}

/// The n-gram match matrix of order `n` from that of order `n - 1` and the token matches:
/// `M_n[a, b] = M_{n-1}[a, b] · X[a + n - 1, b + n - 1]` over the last two dimensions, so that
/// `M_n[a, b] = Π_{k<n} X[a + k, b + k]`.
///
/// `previous` is `[B, R - n + 2, C - n + 2]`, `token_match` `[B, R, C]`; returns
/// `[B, R - n + 1, C - n + 1]`, or `None` when either side has no n-gram of order `n`.
pub fn extend_ngram_match(
    previous: &Tensor,
    token_match: &Tensor,
    order: usize,
) -> Result<Option<Tensor>> {
    let (_, rows, cols) = token_match.dims3()?;
    if order > rows || order > cols {
        return Ok(None);
    }
    let (new_rows, new_cols) = (rows - order + 1, cols - order + 1);
    let kept = previous.narrow(1, 0, new_rows)?.narrow(2, 0, new_cols)?;
    let next = token_match
        .narrow(1, order - 1, new_rows)?
        .narrow(2, order - 1, new_cols)?;
    Ok(Some(kept.mul(&next)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn tree_product_matches_a_loop_and_keeps_zero_gradients_finite() -> Result<()> {
        let values = [0.5f64, 0.0, 2.0, 3.0, 0.25, 1.5, 0.0, 4.0, 0.1];
        for width in 1..=values.len() {
            let x = Var::from_slice(&values[..width], (1, width), &Device::Cpu)?;
            let product = prod_last_dim(x.as_tensor())?;
            let expected: f64 = values[..width].iter().product();
            assert_eq!(product.to_vec1::<f64>()?, vec![expected]);
            let grads = product.sum_all()?.backward()?;
            let grad = grads.get(&x).unwrap().to_vec2::<f64>()?;
            for (k, g) in grad[0].iter().enumerate() {
                let others: f64 = values[..width]
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != k)
                    .map(|(_, v)| v)
                    .product();
                assert_eq!(*g, others, "width {width}, coordinate {k}");
            }
        }
        Ok(())
    }

    #[test]
    fn shifted_products_give_ngram_matches() -> Result<()> {
        // X[a, b] = 1 where a == b: the diagonal survives every order.
        let x = Tensor::eye(4, candle_core::DType::F64, &Device::Cpu)?.unsqueeze(0)?;
        let m2 = extend_ngram_match(&x, &x, 2)?.unwrap();
        assert_eq!(m2.dims(), &[1, 3, 3]);
        let m4 = extend_ngram_match(&extend_ngram_match(&m2, &x, 3)?.unwrap(), &x, 4)?.unwrap();
        assert_eq!(m4.to_vec3::<f64>()?, vec![vec![vec![1.0]]]);
        assert!(extend_ngram_match(&m4, &x, 5)?.is_none());
        Ok(())
    }
}
