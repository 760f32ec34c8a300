//! Every device-to-host copy of the loss, counted.
//!
//! On a GPU a copy to the host stalls the stream until everything queued before it has run, so
//! the loss keeps them off its default path (see [`crate::loss`], "Device-to-host copies"). The
//! few that remain — building [`References`](super::References) from ids, the opt-in value
//! checks ([`BleuLossConfig::check_values`](super::BleuLossConfig::check_values)), the EOS cut of
//! matrix references — go through this module, which counts them per thread: tests assert how
//! many copies each entry point makes, on any device. A read that needs the data on the host
//! goes through here whatever the device, CPU included, so that the count on the CPU is the
//! count a GPU would see.
//!
//! The one exception is the value checks: on the CPU they read the data in place
//! ([`with_cpu_slice`]: no copy, not counted, always run); elsewhere they are opt-in copies,
//! counted. So with `check_values` set the CPU count is lower than a GPU's by one per check.

use candle_core::{bail, DType, Result, Storage, Tensor, WithDType};
use std::cell::Cell;

thread_local! {
    static HOST_COPIES: Cell<u64> = const { Cell::new(0) };
}

/// How many device-to-host copies the loss has made on this thread since it started.
///
/// Counts every read of tensor data back to the host by [`crate::loss`], one per tensor read,
/// whatever the device (so that tests on the CPU see what a GPU would), except the value
/// checks, which read CPU data in place and count only off the CPU (see the [`crate::loss`]
/// docs, "Device-to-host copies"). Take the difference around a call:
///
/// ```
/// use candle_bleu::loss::{bleu_loss_from_logits, host_copies, BleuLossConfig, References};
/// use candle_core::{Device, Tensor};
///
/// let refs = References::from_ids(&Tensor::new(&[[1u32, 2, 3]], &Device::Cpu)?, 0)?;
/// let logits = Tensor::zeros((1, 3, 5), candle_core::DType::F32, &Device::Cpu)?;
/// let before = host_copies();
/// let out = bleu_loss_from_logits(&logits, None, &refs, &BleuLossConfig::default())?;
/// assert_eq!(host_copies() - before, 0); // id references, no lengths: no copy
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn host_copies() -> u64 {
    HOST_COPIES.with(Cell::get)
}

fn count() {
    HOST_COPIES.with(|c| c.set(c.get() + 1));
}

/// `t.to_vec1()`, counted.
pub(crate) fn to_vec1<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    count();
    t.to_vec1()
}

/// `t.to_vec2()`, counted.
pub(crate) fn to_vec2<T: WithDType>(t: &Tensor) -> Result<Vec<Vec<T>>> {
    count();
    t.to_vec2()
}

/// `t.to_vec3()`, counted.
pub(crate) fn to_vec3<T: WithDType>(t: &Tensor) -> Result<Vec<Vec<Vec<T>>>> {
    count();
    t.to_vec3()
}

/// `t.to_scalar()`, counted.
pub(crate) fn to_scalar<T: WithDType>(t: &Tensor) -> Result<T> {
    count();
    t.to_scalar()
}

/// Calls `f` on the data of a CPU tensor in place (made contiguous first if it is not): no
/// copy to count. Errors if `t` is not on the CPU or is not of dtype `T`.
pub(crate) fn with_cpu_slice<T: WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        bail!("internal: with_cpu_slice on a tensor on {:?}", t.device())
    };
    let data = cpu.as_slice::<T>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => f(&data[start..end]),
        None => bail!("internal: with_cpu_slice on a non-contiguous layout"),
    }
}

/// Reads one value of a 1-element tensor as f64: in place on the CPU, a counted copy elsewhere.
fn read_scalar(t: &Tensor) -> Result<f64> {
    let cpu = t.device().is_cpu();
    Ok(match t.dtype() {
        DType::F64 if cpu => with_cpu_slice::<f64, _>(t, |s| Ok(s[0]))?,
        DType::F64 => to_scalar::<f64>(t)?,
        _ if cpu => f64::from(with_cpu_slice::<f32, _>(&t.to_dtype(DType::F32)?, |s| {
            Ok(s[0])
        })?),
        _ => f64::from(to_scalar::<f32>(&t.to_dtype(DType::F32)?)?),
    })
}

/// Whether every value of the float tensor `t` is finite.
///
/// On the CPU the data is read in place, always. Elsewhere it takes one counted device-to-host
/// copy (of a scalar), made only when `check_off_cpu`; otherwise `None` (not checked).
pub(crate) fn all_finite(t: &Tensor, check_off_cpu: bool) -> Result<Option<bool>> {
    if !t.device().is_cpu() && !check_off_cpu {
        return Ok(None);
    }
    // A sum is NaN or infinite if any term is: one pass, the common case. Half precision is
    // summed in f32, f32 and f64 in their own dtype.
    let t = match t.dtype() {
        DType::F16 | DType::BF16 => t.to_dtype(DType::F32)?,
        _ => t.clone(),
    };
    if read_scalar(&t.sum_all()?)?.is_finite() {
        return Ok(Some(true));
    }
    // A non-finite sum comes from a non-finite term or from finite terms whose sum overflowed
    // (values near the dtype's maximum). `t · 0` is exactly 0 at every finite value and NaN at
    // every other, so its sum tells the two apart.
    Ok(Some(read_scalar(&(t * 0.0)?.sum_all()?)? == 0.0))
}

/// Whether every value of the float tensor `t` is finite, and whether every one is `>= 0`:
/// `(finite, nonnegative)`, checked as [`all_finite`] is (`None`: not checked). `nonnegative`
/// is `false` when `finite` is.
///
/// On the CPU the data is read in place. Elsewhere the sum, the sum of `t · 0` and the minimum
/// come back in **one** counted copy of three numbers (one copy per checked tensor, as
/// [`BleuLossConfig::check_values`](super::BleuLossConfig::check_values) documents): reading
/// [`all_finite`]'s sum and then the minimum would be two copies, two stream stalls.
pub(crate) fn finite_and_nonnegative(
    t: &Tensor,
    check_off_cpu: bool,
) -> Result<Option<(bool, bool)>> {
    if t.device().is_cpu() {
        return match all_finite(t, true)? {
            None => Ok(None),
            Some(false) => Ok(Some((false, false))),
            Some(true) => {
                let min = read_scalar(&float_view(t)?.flatten_all()?.min(0)?)?;
                Ok(Some((true, min >= 0.0)))
            }
        };
    }
    if !check_off_cpu {
        return Ok(None);
    }
    let [sum, zeros, min] = summary_in_one_copy(t)?;
    Ok(Some(classify(sum, zeros, min)))
}

/// `t` in a dtype the checks sum in: f32 for f16/bf16, its own otherwise.
fn float_view(t: &Tensor) -> Result<Tensor> {
    match t.dtype() {
        DType::F16 | DType::BF16 => t.to_dtype(DType::F32),
        _ => Ok(t.clone()),
    }
}

/// `[sum(t), sum(t · 0), min(t)]` in one counted copy (f64 for f64 tensors, f32 otherwise:
/// Metal has no f64).
fn summary_in_one_copy(t: &Tensor) -> Result<[f64; 3]> {
    let t = float_view(t)?.flatten_all()?;
    let summary = Tensor::stack(&[t.sum_all()?, (&t * 0.0)?.sum_all()?, t.min(0)?], 0)?;
    let values: Vec<f64> = match summary.dtype() {
        DType::F64 => to_vec1::<f64>(&summary)?,
        _ => to_vec1::<f32>(&summary.to_dtype(DType::F32)?)?
            .into_iter()
            .map(f64::from)
            .collect(),
    };
    Ok([values[0], values[1], values[2]])
}

/// `(finite, nonnegative)` from `sum(t)`, `sum(t · 0)` and `min(t)`: the sum is finite when
/// every term is (or, when it is not, `t · 0` sums to exactly 0 iff every term is finite: the
/// sum overflowed); `nonnegative` only counts when `finite`.
fn classify(sum: f64, zeros: f64, min: f64) -> (bool, bool) {
    let finite = sum.is_finite() || zeros == 0.0;
    (finite, finite && min >= 0.0)
}

/// The values of the u32 vector `t`: in place on the CPU (always), a counted copy elsewhere
/// when `check_off_cpu`, otherwise `None`.
pub(crate) fn u32_values(t: &Tensor, check_off_cpu: bool) -> Result<Option<Vec<u32>>> {
    if t.device().is_cpu() {
        with_cpu_slice::<u32, _>(t, |s| Ok(Some(s.to_vec())))
    } else if check_off_cpu {
        Ok(Some(to_vec1::<u32>(&t.flatten_all()?)?))
    } else {
        Ok(None)
    }
}

/// The contiguous CPU data of a tensor, borrowed in place (no copy) for as long as the view
/// lives: what the kernels' backward passes read their saved tensors through.
pub(crate) struct CpuView<'a> {
    storage: candle_core::StorageRef<'a>,
    start: usize,
    end: usize,
}

impl<'a> CpuView<'a> {
    /// A view of `t`, which must be a contiguous CPU tensor (call `contiguous()` first).
    pub(crate) fn new(t: &'a Tensor, what: &str) -> Result<Self> {
        let (storage, layout) = t.storage_and_layout();
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("internal: `{what}` is not contiguous")
        };
        if !matches!(&*storage, Storage::Cpu(_)) {
            bail!("internal: `{what}` is on {:?}, not the CPU", t.device());
        }
        Ok(Self {
            storage,
            start,
            end,
        })
    }

    /// The data as `T` (an error if the dtype differs).
    pub(crate) fn slice<T: WithDType>(&self) -> Result<&[T]> {
        match &*self.storage {
            Storage::Cpu(cpu) => Ok(&cpu.as_slice::<T>()?[self.start..self.end]),
            _ => bail!("internal: CpuView of a tensor off the CPU"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The off-CPU check of a statistic, run here on CPU tensors: one counted copy per tensor,
    /// and the same answers as the in-place CPU check, overflowing sums included.
    #[test]
    fn the_off_cpu_check_is_one_copy_with_the_cpu_answers() -> Result<()> {
        let cases: [(Vec<f32>, (bool, bool)); 6] = [
            (vec![0.0, 1.5, 3.0], (true, true)),
            (vec![2.0, -0.5, 1.0], (true, false)),
            (vec![1.0, f32::NAN, 2.0], (false, false)),
            (vec![-1.0, f32::INFINITY], (false, false)),
            (vec![3e38, 3e38, 3e38], (true, true)),
            (vec![-3e38, -3e38, 1.0], (true, false)),
        ];
        for (values, want) in cases {
            for dtype in [DType::F32, DType::F64, DType::BF16] {
                let t = Tensor::new(values.as_slice(), &Device::Cpu)?.to_dtype(dtype)?;
                let before = host_copies();
                let [sum, zeros, min] = summary_in_one_copy(&t)?;
                assert_eq!(host_copies() - before, 1, "{values:?} {dtype:?}");
                assert_eq!(classify(sum, zeros, min), want, "{values:?} {dtype:?}");
                assert_eq!(
                    finite_and_nonnegative(&t, false)?,
                    Some(want),
                    "CPU {values:?} {dtype:?}"
                );
            }
        }
        Ok(())
    }
}
