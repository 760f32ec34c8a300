//! [`ThreadAllReduce`]: a sum all-reduce between threads of one process.

use crate::loss::all_reduce::AllReduce;
use candle_core::{bail, Result, Tensor};
use std::sync::{Arc, Barrier, Mutex, PoisonError};

/// What the workers of one group share: one slot per worker and a barrier.
#[derive(Debug)]
struct Shared {
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

/// One worker of a group of threads in one process that all-reduce through shared memory: for
/// tests, examples, and to run data-parallel code without a collective library.
///
/// [`ThreadAllReduce::group`]`(n)` makes the `n` workers; move each into its own thread. Every
/// worker's [`AllReduce::sum`] blocks until all `n` have called it, then each worker adds the
/// `n` tensors in rank order (so every worker gets bit-identical results) on their device.
///
/// As with any collective, a worker that stops calling (an error, a panic) leaves the others
/// blocked: the threads of a test should all fail or all succeed.
#[derive(Debug, Clone)]
pub struct ThreadAllReduce {
    shared: Arc<Shared>,
    rank: usize,
    world_size: usize,
}

impl ThreadAllReduce {
    /// The `world_size` workers of a new group, in rank order. Panics if `world_size` is 0.
    pub fn group(world_size: usize) -> Vec<ThreadAllReduce> {
        assert!(world_size >= 1, "a group needs at least one worker");
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![None; world_size]),
            barrier: Barrier::new(world_size),
        });
        (0..world_size)
            .map(|rank| ThreadAllReduce {
                shared: shared.clone(),
                rank,
                world_size,
            })
            .collect()
    }
}

impl AllReduce for ThreadAllReduce {
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        self.shared
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[self.rank] = Some(t.detach());
        self.shared.barrier.wait();
        let result = (|| {
            let slots = self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut total: Option<Tensor> = None;
            for (rank, slot) in slots.iter().enumerate() {
                let Some(x) = slot else {
                    bail!("ThreadAllReduce: worker {rank} contributed nothing");
                };
                if x.dims() != t.dims() || x.dtype() != t.dtype() {
                    bail!(
                        "ThreadAllReduce: worker {rank} passed {:?} {:?}, worker {} {:?} {:?}: every worker must pass the same shape and dtype",
                        x.dtype(),
                        x.dims(),
                        self.rank,
                        t.dtype(),
                        t.dims()
                    );
                }
                total = Some(match total {
                    None => x.copy()?,
                    Some(acc) => (acc + x)?,
                });
            }
            match total {
                Some(total) => Ok(total),
                None => bail!("ThreadAllReduce: empty group"),
            }
        })();
        // Every worker has read every slot before any of them writes the next call's.
        self.shared.barrier.wait();
        result
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn rank(&self) -> usize {
        self.rank
    }
}
