#!/usr/bin/env bash
# Builds and packs the CUDA test, bench and example binaries for a GPU machine that has no Rust
# toolchain (docs/gpu.md, "Running on a GPU machine"):
#
#   scripts/pack-gpu.sh [OUT_DIR]        # default gpu/ (untracked: never commit it)
#
# One build, `--features cuda,nccl`: since the H200 run of 2026-11-27 the `cuda` feature runs
# the crate's CUDA kernels, and the composed ops they are checked against are the public
# `_composed` functions of the same build (tests/cuda_kernels.rs compares both on the GPU; the
# bench's `--kernels off` times them). A second build, `cuda` without the kernels, would hold
# the same code: it has no purpose left.
#
#   bins/cuda/<name>       --features cuda,nccl: the loss's test binaries below, the library's
#                          unit tests (lib_unit) and, unless EXAMPLES=0, the seq2seq and
#                          translate examples
#   bins/cuda/bench_cuda   the `cuda` bench, --features cuda,nccl,cuda-unverified: it adds the
#                          host/device timing per step (CUDA events), not yet run on a GPU
#   bins/cuda/ctc_loss_unverified, ctc_bleu_unverified, ctc_fmeasure_unverified,
#   ce_options_unverified, cuda_kernels_unverified, loss_host_copies_unverified,
#   lib_unit_unverified    tests/ctc_loss.rs, tests/ctc_bleu.rs, tests/ctc_fmeasure.rs,
#                          tests/ce_options.rs, tests/cuda_kernels.rs,
#                          tests/loss_host_copies.rs and the unit tests,
#                          --features cuda,nccl,cuda-unverified: the CTC loss on its CUDA kernels
#                          (ctc.cu, no host copy of the targets), the BLEU loss and NMLA's
#                          F-measure on CTC outputs on theirs (ngrams.cu), the cross-entropy's
#                          options and f16/bf16 logits on ce_options.cu, the hidden-state
#                          path through the row op's kernels, the cross-entropy's targets
#                          counted on the device (no host copy)
#
# The builds go through scripts/build-cuda.sh (target/cuda; incremental: seconds when already
# built) and the binaries are the exact ones cargo reports (--message-format=json), not globbed
# from target/.
#
# Writes OUT_DIR/bins.tar.xz and OUT_DIR/bins.sha256. Each binary is about 55 MB, almost all of
# it candle's embedded PTX, the same in every binary: xz with a dictionary larger than one binary
# stores that PTX once (the two builds' 33 binaries, 1.75 GiB, packed to 24.3 MiB). A device
# machine gets at most 64 MiB of working tree, the repository's tracked files (about 15 MB)
# included. scripts/gpu-suite.sh and scripts/gpu-check.sh unpack and run them.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo_root/gpu}")"
build="$repo_root/scripts/build-cuda.sh"

# The test binaries (cargo target names).
tests=(cuda_kernels distributed loss_errors loss_exact loss_extreme loss_grad loss_host_copies
    loss_props loss_spec_reference hidden cross_entropy training_loss docs_worked_example ctc_loss
    ctc_bleu ce_options)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
kind=cuda
mkdir -p "$stage/bins/$kind" "$out"

# `build-cuda.sh ARGS --message-format=json-render-diagnostics`, printing "KIND NAME PATH" per
# executable cargo reports (KIND: lib for the unit tests, test, bench, example).
executables() {
    "$build" "$@" --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])'
}

pick() { # pick NAME KIND TARGET LISTING: copy TARGET's executable of KIND to bins/cuda/NAME
    local found
    found="$(awk -v k="$2" -v n="$3" '$1 == k && $2 == n { print $3 }' <<<"$4" | tail -1)"
    [[ -n "$found" ]] || { echo "pack-gpu: cargo built no $2 $3" >&2; exit 1; }
    cp "$found" "$stage/bins/$kind/$1"
    echo "pack-gpu: $kind/$1 <- ${found#"$repo_root"/}" >&2
}

test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
echo "pack-gpu: building the tests (--features cuda,nccl)" >&2
listing="$(executables test --no-run --release -p candle-bleu --features cuda,nccl \
    --lib "${test_args[@]}")"
for t in "${tests[@]}"; do pick "$t" test "$t" "$listing"; done
pick lib_unit lib candle_bleu "$listing"
echo "pack-gpu: building the bench (--features cuda,nccl,cuda-unverified)" >&2
listing="$(executables build --release -p candle-bleu --features cuda,nccl,cuda-unverified \
    --bench cuda)"
pick bench_cuda bench cuda "$listing"
# The CTC loss's CUDA kernels are behind cuda-unverified until a GPU run passes: its test binary
# and the library's unit tests (NVRTC compiles the CTC module too) from that build.
echo "pack-gpu: building the unverified kernels' tests (--features cuda,nccl,cuda-unverified)" >&2
listing="$(executables test --no-run --release -p candle-bleu \
    --features cuda,nccl,cuda-unverified --lib --test ctc_loss --test ce_options \
    --test cuda_kernels --test ctc_bleu --test ctc_fmeasure --test loss_host_copies)"
pick ctc_loss_unverified test ctc_loss "$listing"
pick ctc_bleu_unverified test ctc_bleu "$listing"
pick ctc_fmeasure_unverified test ctc_fmeasure "$listing"
pick ce_options_unverified test ce_options "$listing"
pick cuda_kernels_unverified test cuda_kernels "$listing"
pick loss_host_copies_unverified test loss_host_copies "$listing"
pick lib_unit_unverified lib candle_bleu "$listing"
if [[ "${EXAMPLES:-1}" != 0 ]]; then
    listing="$(executables build --release -p candle-bleu-research --features cuda,nccl \
        --example seq2seq --example translate)"
    pick seq2seq example seq2seq "$listing"
    pick translate example translate "$listing"
fi

(cd "$stage/bins" && sha256sum */* >"$out/bins.sha256")
# A 192 MiB dictionary reaches back over a whole binary to the previous copy of the PTX.
tar -C "$stage" -cf - bins | xz -6 --lzma2=preset=6,dict=192MiB -T1 >"$out/bins.tar.xz"
ls -l "$out/bins.tar.xz" >&2
