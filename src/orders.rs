//! The n-gram orders and their weights: one validation shared by the exact BLEU
//! ([`crate::exact`]) and the loss ([`crate::loss`]), so that both accept exactly the same
//! `max_order` and `weights`. It sits below both (neither depends on the other) and reports the
//! problem as data; each caller words it in its own error type.

/// A rejected `max_order` or `weights`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InvalidOrders {
    /// `"max_order"` or `"weights"`: the configuration field at fault.
    pub field: &'static str,
    /// What is wrong, with the offending value (e.g. `must be >= 1, got 0`).
    pub message: String,
}

/// Checks `max_order >= 1` and, if given, that `weights` has `max_order` entries, each finite
/// and `>= 0`.
pub(crate) fn check_orders(max_order: usize, weights: Option<&[f64]>) -> Result<(), InvalidOrders> {
    if max_order == 0 {
        return Err(InvalidOrders {
            field: "max_order",
            message: "must be >= 1, got 0".into(),
        });
    }
    if let Some(weights) = weights {
        if weights.len() != max_order {
            return Err(InvalidOrders {
                field: "weights",
                message: format!(
                    "has {} entries but `max_order` is {max_order}",
                    weights.len()
                ),
            });
        }
        if let Some((n, w)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !w.is_finite() || **w < 0.0)
        {
            return Err(InvalidOrders {
                field: "weights",
                message: format!("must be finite and >= 0, got weights[{n}] = {w}"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_field_and_the_value() {
        assert_eq!(check_orders(4, None), Ok(()));
        assert_eq!(check_orders(2, Some(&[0.0, 1.5])), Ok(()));
        assert_eq!(check_orders(0, None).unwrap_err().field, "max_order");
        let short = check_orders(4, Some(&[0.5, 0.5])).unwrap_err();
        assert_eq!(short.field, "weights");
        assert_eq!(short.message, "has 2 entries but `max_order` is 4");
        let negative = check_orders(3, Some(&[0.5, -0.5, 1.0])).unwrap_err();
        assert_eq!(
            negative.message,
            "must be finite and >= 0, got weights[1] = -0.5"
        );
        let nan = check_orders(2, Some(&[0.5, f64::NAN])).unwrap_err();
        assert_eq!(nan.message, "must be finite and >= 0, got weights[1] = NaN");
    }
}
