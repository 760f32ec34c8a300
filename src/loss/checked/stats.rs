//! Statistics a caller gives: `loss_from_stats`'s ([`stats_call`]), and a data-parallel
//! worker's own before the all-reduce (`DataParallel::{bleu_loss_from_stats, global_stats}`,
//! and the group's loss on the statistics of its own pass: [`shard_stats`]).

use crate::loss::config::{BleuLossConfig, BleuStats};
use crate::loss::host;
use crate::loss::score;
use candle_core::{bail, Result};

/// The arguments of [`loss_from_stats`](crate::loss::loss_from_stats), checked: the config;
/// `matches` and `totals` float `[B, N]` with `N = max_order` and `B >= 1`, `hyp_len` and
/// `ref_len` float `[B]`, all on one device; every value finite and `>= 0` ([`stats_values`]).
/// Each message starts with `loss_from_stats: `.
pub(crate) fn stats_call(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<()> {
    let BleuStats {
        matches,
        totals,
        hyp_len,
        ref_len,
    } = stats;
    score::validate_config(cfg)?;
    let (batch, orders) = match matches.dims() {
        &[b, n] => (b, n),
        dims => bail!("loss_from_stats: `stats.matches` must be [B, N], got shape {dims:?}"),
    };
    if orders != cfg.max_order {
        bail!(
            "loss_from_stats: `stats.matches` has {orders} orders (shape {:?}) but `max_order` is {}",
            matches.dims(),
            cfg.max_order
        );
    }
    if totals.dims() != matches.dims() {
        bail!(
            "loss_from_stats: `stats.totals` has shape {:?}, `stats.matches` {:?}",
            totals.dims(),
            matches.dims()
        );
    }
    for (name, t) in [("hyp_len", hyp_len), ("ref_len", ref_len)] {
        if t.dims() != [batch] {
            bail!(
                "loss_from_stats: `stats.{name}` must be [{batch}], got shape {:?}",
                t.dims()
            );
        }
    }
    if batch == 0 {
        bail!(
            "loss_from_stats: empty batch (`stats.matches` has shape {:?})",
            matches.dims()
        );
    }
    for (name, t) in [
        ("matches", matches),
        ("totals", totals),
        ("hyp_len", hyp_len),
        ("ref_len", ref_len),
    ] {
        if !t.dtype().is_float() {
            bail!(
                "loss_from_stats: `stats.{name}` must be a float tensor, got {:?} with shape {:?}",
                t.dtype(),
                t.dims()
            );
        }
        if !t.device().same_device(matches.device()) {
            bail!(
                "loss_from_stats: `stats.{name}` is on {:?} but `stats.matches` on {:?}",
                t.device(),
                matches.device()
            );
        }
    }
    stats_values("loss_from_stats: ", stats, cfg.check_values)
}

/// A data-parallel worker's own statistics, checked before they go into the all-reduce, where
/// another worker's sums could hide them: the shapes ([`shard_stats_shapes`]), every value
/// finite and `>= 0` ([`stats_values`]), the config, and `N = max_order`.
pub(crate) fn shard_stats(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<()> {
    shard_stats_shapes(stats)?;
    stats_values("", stats, cfg.check_values)?;
    score::validate_config(cfg)?;
    let orders = stats.matches.dim(1)?;
    if orders != cfg.max_order {
        bail!(
            "`stats.matches` has {orders} orders (shape {:?}) but `max_order` is {}",
            stats.matches.dims(),
            cfg.max_order
        );
    }
    Ok(())
}

/// Errors unless a worker's statistics are `matches`/`totals` `[B, N]` and `hyp_len`/`ref_len`
/// `[B]` with at least one element (every worker needs one).
pub(crate) fn shard_stats_shapes(stats: &BleuStats) -> Result<()> {
    let (batch, orders) = match stats.matches.dims() {
        &[b, n] => (b, n),
        dims => bail!("`stats.matches` must be [B, N], got shape {dims:?}"),
    };
    if stats.totals.dims() != [batch, orders]
        || stats.hyp_len.dims() != [batch]
        || stats.ref_len.dims() != [batch]
    {
        bail!(
            "`stats` must be matches/totals [B, N] and hyp_len/ref_len [B], got {:?}, {:?}, {:?}, {:?}",
            stats.matches.dims(),
            stats.totals.dims(),
            stats.hyp_len.dims(),
            stats.ref_len.dims()
        );
    }
    if batch == 0 {
        bail!(
            "`stats` of an empty shard (shape {:?}): every worker needs at least one element",
            stats.matches.dims()
        );
    }
    Ok(())
}

/// Errors unless every statistic is finite and `>= 0` (on the CPU always, elsewhere when
/// `check_off_cpu`; see [`BleuLossConfig::check_values`]). No text gives a negative count or
/// length: negative values would be scored as a finite, wrong loss, and a NaN or infinite one
/// would give a NaN loss and NaN gradients. `context` prefixes the message.
fn stats_values(context: &str, stats: &BleuStats, check_off_cpu: bool) -> Result<()> {
    let named = [
        ("matches", &stats.matches),
        ("totals", &stats.totals),
        ("hyp_len", &stats.hyp_len),
        ("ref_len", &stats.ref_len),
    ];
    for (name, t) in named {
        match host::finite_and_nonnegative(t, check_off_cpu)? {
            Some((false, _)) => bail!(
                "{context}`stats.{name}` contains NaN or infinite values (shape {:?})",
                t.dims()
            ),
            Some((true, false)) => bail!(
                "{context}`stats.{name}` contains negative values (shape {:?}): counts and \
                 lengths are >= 0",
                t.dims()
            ),
            _ => {}
        }
    }
    Ok(())
}
