//! [`MpiAllReduce`]: the sum all-reduce over an MPI communicator (feature `mpi`, rsmpi).

use crate::loss::all_reduce::AllReduce;
use candle_core::{bail, DType, Result, Tensor, WithDType};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::topology::{Communicator, SimpleCommunicator};

/// The most elements one `MPI_Allreduce` call carries (its count is a C `int`); larger tensors
/// are reduced in pieces of this size.
const MAX_ELEMENTS_PER_CALL: usize = 1 << 30;

/// A sum all-reduce over the processes of an MPI communicator, on host buffers: the tensor is
/// copied to the host, summed with `MPI_Allreduce(MPI_SUM)` and copied back to its device.
///
/// Launch the program with `mpirun -np N`; each process is one worker (its rank is the
/// communicator's rank). As root, Open MPI needs `--allow-run-as-root`, and with more
/// processes than cores `--oversubscribe`.
///
/// ```no_run
/// use candle_bleu::loss::distributed::{mpi, AllReduce, MpiAllReduce};
/// let universe = mpi::initialize().expect("MPI initialised once");
/// let reduce = MpiAllReduce::new(universe.world());
/// println!("rank {} of {}", reduce.rank(), reduce.world_size());
/// ```
///
/// Dtypes: f32, f64, u8, u32 and i64 are reduced as such; f16 and bf16 through f32 (summed in
/// f32, rounded once). Other dtypes are an error. Every process must pass the same number of
/// elements (MPI reports a mismatch as an error of its own, which aborts the job under its
/// default error handler). Open MPI gives every rank the same result (each element is reduced
/// once and the result distributed), which keeps data-parallel parameters identical.
#[derive(Debug)]
pub struct MpiAllReduce<C: Communicator = SimpleCommunicator> {
    comm: C,
}

impl<C: Communicator> MpiAllReduce<C> {
    /// The all-reduce over the processes of `comm` (e.g. `universe.world()`).
    pub fn new(comm: C) -> Self {
        Self { comm }
    }

    /// The communicator, for the program's own collectives (a broadcast, a barrier).
    pub fn communicator(&self) -> &C {
        &self.comm
    }

    /// `MPI_Allreduce(MPI_SUM)` of the tensor's elements as `T`, on the host.
    fn sum_as<T: WithDType + Equivalence>(&self, t: &Tensor) -> Result<Tensor> {
        let local: Vec<T> = t.flatten_all()?.to_vec1()?;
        let mut total = vec![T::from_f64(0.0); local.len()];
        for (send, receive) in local
            .chunks(MAX_ELEMENTS_PER_CALL)
            .zip(total.chunks_mut(MAX_ELEMENTS_PER_CALL))
        {
            self.comm
                .all_reduce_into(send, receive, SystemOperation::sum());
        }
        Tensor::from_vec(total, t.shape(), t.device())
    }
}

impl<C: Communicator> AllReduce for MpiAllReduce<C> {
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        match t.dtype() {
            DType::F32 => self.sum_as::<f32>(t),
            DType::F64 => self.sum_as::<f64>(t),
            DType::U8 => self.sum_as::<u8>(t),
            DType::U32 => self.sum_as::<u32>(t),
            DType::I64 => self.sum_as::<i64>(t),
            DType::F16 | DType::BF16 => self.sum_as::<f32>(&t.to_dtype(DType::F32)?)?.to_dtype(t.dtype()),
            other => bail!(
                "MpiAllReduce: cannot sum a {other:?} tensor (shape {:?}); f32, f64, f16, bf16, u8, u32 and i64 are supported",
                t.dims()
            ),
        }
    }

    fn world_size(&self) -> usize {
        self.comm.size() as usize
    }

    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
}
