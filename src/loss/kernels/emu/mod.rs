//! The emulator of the CUDA execution model (feature `cuda-emu`): the crate's CUDA C compiled
//! as host C++ behind a prelude (`prelude.h`, `runtime.h`), each thread a fiber, barriers and
//! warp shuffles as counting barriers, shared memory filled with NaN before every block; the
//! launch plans of [`launch`](super::launch) run on it over host buffers, so that every kernel
//! is tested on the CPU exactly as it is launched on a GPU (docs/gpu.md, "The emulator"). This
//! file only declares the modules.

#[cfg(test)]
mod ctc_tests;
#[cfg(test)]
mod log_softmax_tests;
#[cfg(test)]
mod matches_tests;
pub(crate) mod module;
#[cfg(test)]
mod ngram_tests;
#[cfg(test)]
mod score_tests;
#[cfg(test)]
mod tests;
