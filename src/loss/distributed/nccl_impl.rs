//! [`NcclAllReduce`]: the sum all-reduce over an NCCL communicator, on the GPU (feature `nccl`).
//!
//! **Not yet run on a GPU**: compiled against candle's cudarc NCCL bindings (NCCL 2.30 API,
//! linked against NCCL 2.32 from the `nvidia-nccl-cu13` wheel) on a machine without one.

use crate::loss::all_reduce::AllReduce;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::CudaDType;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor,
};

/// A sum all-reduce over the ranks of an NCCL communicator: `ncclAllReduce(ncclSum)` of the
/// tensor's device buffer on the candle device's stream, so the data never leaves the GPU and
/// the reduction is ordered with the kernels before and after it.
///
/// One process (or thread) per GPU, as in candle-examples' `llama_multiprocess`: rank 0 creates
/// an [`Id`] (`Id::new()`), every rank receives its 128 bytes (`Id::uninit(bytes)`; through
/// MPI with [`NcclAllReduce::from_mpi`], or any channel) and calls [`NcclAllReduce::new`] with
/// its CUDA device. Tensors passed to [`AllReduce::sum`] must live on that device.
///
/// Dtypes: f32, f64, u8, u32 and i64 as such; f16 and bf16 through f32 (summed in f32, rounded
/// once).
///
/// **Status**: one rank ran on one GPU (an H200, 2026-11-27); more than one rank has not run
/// (see `docs/distributed.md`).
#[derive(Debug)]
pub struct NcclAllReduce {
    comm: Comm,
}

impl NcclAllReduce {
    /// Joins the NCCL communicator identified by `id` as `rank` of `world_size`, on `device`
    /// (a CUDA device; the communicator uses its stream). Blocks until every rank has joined.
    pub fn new(device: &Device, rank: usize, world_size: usize, id: Id) -> Result<Self> {
        if rank >= world_size {
            bail!("NcclAllReduce: `rank` {rank} must be < `world_size` {world_size}");
        }
        let cuda = device.as_cuda_device()?;
        let comm = Comm::from_rank(cuda.cuda_stream(), rank, world_size, id)
            .map_err(|e| candle_core::Error::Msg(format!("NCCL communicator: {e:?}")))?;
        Ok(Self { comm })
    }

    /// The NCCL communicator over the ranks of an MPI communicator: rank 0 creates the id and
    /// broadcasts it over MPI; every rank then joins on `device`, with its MPI rank.
    #[cfg(feature = "mpi")]
    pub fn from_mpi<C: mpi::topology::Communicator>(device: &Device, comm: &C) -> Result<Self> {
        use mpi::collective::Root;
        let (rank, world_size) = (comm.rank() as usize, comm.size() as usize);
        let mut bytes = [0 as std::ffi::c_char; 128];
        if rank == 0 {
            let id = Id::new().map_err(|e| candle_core::Error::Msg(format!("NCCL id: {e:?}")))?;
            bytes = *id.internal();
        }
        comm.process_at_rank(0).broadcast_into(&mut bytes[..]);
        Self::new(device, rank, world_size, Id::uninit(bytes))
    }

    /// The NCCL communicator.
    pub fn communicator(&self) -> &Comm {
        &self.comm
    }
}

/// The all-reduce as a candle op, so that it runs on the tensor's storage on its device.
struct AllReduceOp<'a> {
    comm: &'a Comm,
}

impl AllReduceOp<'_> {
    fn reduce<T: CudaDType + DeviceRepr + NcclType>(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("NcclAllReduce: the input must be contiguous");
        };
        let device = storage.device().clone();
        let src = storage.as_cuda_slice::<T>()?.slice(start..end);
        // Every element is written by the all-reduce.
        let mut dst = unsafe { device.alloc::<T>(end - start)? };
        if end > start {
            self.comm
                .all_reduce(&src, &mut dst, &ReduceOp::Sum)
                .map_err(|e| candle_core::Error::Msg(format!("ncclAllReduce: {e:?}")))?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(dst, device),
            layout.shape().clone(),
        ))
    }
}

impl CustomOp1 for AllReduceOp<'_> {
    fn name(&self) -> &'static str {
        "candle-bleu-nccl-all-reduce"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("NcclAllReduce: the tensor is on the CPU; NCCL reduces CUDA tensors (use MpiAllReduce on CPUs)")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        match storage.dtype() {
            DType::F32 => self.reduce::<f32>(storage, layout),
            DType::F64 => self.reduce::<f64>(storage, layout),
            DType::U8 => self.reduce::<u8>(storage, layout),
            DType::U32 => self.reduce::<u32>(storage, layout),
            DType::I64 => self.reduce::<i64>(storage, layout),
            other => bail!("NcclAllReduce: cannot sum a {other:?} tensor"),
        }
    }
}

impl AllReduce for NcclAllReduce {
    fn sum(&self, t: &Tensor) -> Result<Tensor> {
        if !t.device().is_cuda() {
            bail!(
                "NcclAllReduce: the tensor (shape {:?}) is on {:?}; NCCL reduces CUDA tensors",
                t.dims(),
                t.device()
            );
        }
        let op = AllReduceOp { comm: &self.comm };
        match t.dtype() {
            DType::F16 | DType::BF16 => t
                .to_dtype(DType::F32)?
                .apply_op1_no_bwd(&op)?
                .to_dtype(t.dtype()),
            _ => t.contiguous()?.apply_op1_no_bwd(&op),
        }
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn rank(&self) -> usize {
        self.comm.rank()
    }
}
