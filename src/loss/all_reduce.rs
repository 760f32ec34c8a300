//! The collective that data-parallel training runs on: a sum all-reduce over a group of
//! workers ([`AllReduce`]), and the group of one. At the bottom of the loss's layers: the
//! reduction stage (`reduce`) sums over it, and `distributed` holds its back-ends (threads, MPI,
//! NCCL) and re-exports it.

use candle_core::{Result, Tensor};

/// A sum all-reduce over the workers of a data-parallel group.
///
/// Every worker calls [`AllReduce::sum`] with a tensor of the same shape and dtype, in the same
/// order of calls, and gets the element-wise sum over all workers. Implementations must return
/// the same values on every worker (so that parameters stay identical), on the input's device
/// and in its dtype, with no gradient attached (the functions of this module detach what they
/// pass and add the local gradient back themselves).
pub trait AllReduce {
    /// The element-wise sum of `t` over every worker: same shape, dtype and device as `t`.
    fn sum(&self, t: &Tensor) -> Result<Tensor>;
    /// The number of workers in the group (`>= 1`).
    fn world_size(&self) -> usize;
    /// This worker's index, in `0..world_size()`.
    fn rank(&self) -> usize;
}

/// A group of one worker: [`AllReduce::sum`] returns its input. Code written for N workers runs
/// unchanged in one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SingleWorker;

impl AllReduce for SingleWorker {
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.detach())
    }

    fn world_size(&self) -> usize {
        1
    }

    fn rank(&self) -> usize {
        0
    }
}

impl<R: AllReduce + ?Sized> AllReduce for &R {
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        (**self).sum(t)
    }

    fn world_size(&self) -> usize {
        (**self).world_size()
    }

    fn rank(&self) -> usize {
        (**self).rank()
    }
}
