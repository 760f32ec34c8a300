//! The one choice between the crate's kernels and composed candle ops, for the logits path and
//! the hidden-state path alike: [`Path`].

#[cfg(feature = "cuda-unverified")]
use super::kernels::ctc::cuda::ctc_kernels_loaded;
#[cfg(feature = "cuda-unverified")]
use super::kernels::ctc::ngrams_launch::NGRAM_MAX_ORDER;
#[cfg(feature = "cuda-unverified")]
use super::kernels::matches::cuda::matches_kernels_loaded;
use super::kernels::row::op::{cuda_kernels_loaded, options_kernels_loaded};
#[cfg(feature = "cuda-unverified")]
use super::kernels::score::{cuda::score_kernels_loaded, launch::SCORE_MAX_ORDER};
use candle_core::Device;

/// Which implementation of the passes over the logits runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The crate's custom ops: the CPU kernels, or the CUDA kernels (feature `cuda`).
    Kernels,
    /// Composed candle ops: the reference the kernels are tested against, and what every
    /// device without kernels runs. The same numbers to rounding.
    Composed,
}

impl Path {
    /// The fast path for tensors on `device`: the CPU kernels on the CPU; the CUDA kernels on
    /// CUDA when loaded (the `cuda` feature builds them; a failure to compile or load warns once);
    /// composed ops otherwise.
    pub(crate) fn for_device(device: &Device) -> Self {
        if device.is_cpu() || cuda_kernels_loaded(device) {
            Path::Kernels
        } else {
            Path::Composed
        }
    }

    /// Whether the CPU kernels run on `device`: the kernel path on the CPU. The ops with CPU
    /// kernels only (the hidden-state op, the CTC ops) run composed candle ops everywhere else,
    /// whatever the path.
    pub(crate) fn runs_cpu_kernels(self, device: &Device) -> bool {
        self == Path::Kernels && device.is_cpu()
    }

    /// Whether the CTC loss's op runs on `device`: the CPU kernel on the CPU, and with the
    /// `cuda-unverified` feature its CUDA kernels (`ctc.cu`, tested on the emulator, not yet on a
    /// GPU) on a CUDA device where they load. Otherwise composed ops.
    pub(crate) fn runs_ctc_kernels(self, device: &Device) -> bool {
        #[cfg(feature = "cuda-unverified")]
        if self == Path::Kernels && ctc_kernels_loaded(device) {
            return true;
        }
        self.runs_cpu_kernels(device)
    }

    /// Whether the expected form's clipped matches run as one op on `device`
    /// (`kernels::matches`): its CPU kernel on the CPU, and with the `cuda-unverified` feature its
    /// CUDA kernels (`matches.cu`; tested on the emulator, not yet on a GPU) where they load.
    /// Otherwise composed ops, its reference.
    pub(crate) fn runs_matches_kernel(self, device: &Device) -> bool {
        #[cfg(feature = "cuda-unverified")]
        if self == Path::Kernels && matches_kernels_loaded(device) {
            return true;
        }
        self.runs_cpu_kernels(device)
    }

    /// Whether the score (`-log BLEU` of the summed statistics) runs as one op on `device`
    /// (`kernels::score`): the CPU kernel on the CPU, and with the `cuda-unverified` feature its
    /// CUDA kernels (`score.cu`; tested on the emulator, not yet on a GPU) for orders up to 8
    /// where they load. Otherwise composed ops, its reference.
    pub(crate) fn runs_score_kernel(self, device: &Device, max_order: usize) -> bool {
        #[cfg(feature = "cuda-unverified")]
        if self == Path::Kernels && max_order <= SCORE_MAX_ORDER && score_kernels_loaded(device) {
            return true;
        }
        let _ = max_order;
        self.runs_cpu_kernels(device)
    }

    /// Whether the n-gram programs of the BLEU loss on CTC outputs run as a kernel on `device`:
    /// the CPU kernel on the CPU, and with the `cuda-unverified` feature the CUDA kernels
    /// (`ngrams.cu`, in the CTC module; tested on the emulator, not yet on a GPU) for orders up
    /// to 8 where they load. Otherwise composed ops.
    pub(crate) fn runs_ctc_ngram_kernels(self, device: &Device, max_order: usize) -> bool {
        #[cfg(feature = "cuda-unverified")]
        if max_order <= NGRAM_MAX_ORDER && self.runs_ctc_kernels(device) {
            return true;
        }
        let _ = max_order;
        self.runs_cpu_kernels(device)
    }

    /// The path for a cross-entropy with `options` beyond padding and label smoothing (the
    /// z-loss, the token accuracy, class weights): the kernels where they compute them — the CPU
    /// kernels, and on CUDA the options kernels (`ce_options.cu`, feature `cuda-unverified`) —
    /// else composed ops: the CPU kernels' numbers, never a silent change of them.
    pub(crate) fn for_options(self, device: &Device, options: bool) -> Self {
        if self == Path::Kernels && options && !device.is_cpu() && !options_kernels_loaded(device) {
            Path::Composed
        } else {
            self
        }
    }

    /// Whether the CUDA options kernels run the row pass (`ce_options.cu`, feature
    /// `cuda-unverified`): it then reads the logits through a soft cap itself (no pass of its
    /// own) and reads 16-bit logits as they are (no f32 copy). Elsewhere the logits are capped
    /// by one op, and widened, before the pass.
    pub(crate) fn runs_options_kernels(self, device: &Device) -> bool {
        self == Path::Kernels && !device.is_cpu() && options_kernels_loaded(device)
    }

    /// Whether the kernels that run find non-finite logits in their own pass, so that the
    /// separate check is skipped: exactly when the CPU kernels run (the CUDA kernels and the
    /// composed ops do not look).
    pub(crate) fn checks_finite(self, device: &Device) -> bool {
        self.runs_cpu_kernels(device)
    }
}
