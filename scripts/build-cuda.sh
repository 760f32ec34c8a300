#!/usr/bin/env bash
# Builds candle-bleu's CUDA variant on a machine without a GPU (see docs/gpu.md):
#
#   scripts/build-cuda.sh                 cargo build --release --features cuda --tests --benches --examples
#   scripts/build-cuda.sh <cargo args…>   any other cargo command under the same environment, e.g.
#       scripts/build-cuda.sh clippy --release --all-targets --features cuda -- -D warnings
#       scripts/build-cuda.sh test --release --features cuda --test cuda_kernels -- --nocapture
#
# It installs or reuses the toolchain (scripts/cuda-toolchain.sh), and builds into its own target
# directory (target/cuda, or CARGO_TARGET_DIR when set) so the CPU build in target/ is untouched.
# The first build compiles candle-kernels with nvcc: about 13 min on 2 cores. Runs at nice 10.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
eval "$("$repo_root/scripts/cuda-toolchain.sh" --env)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo_root/target/cuda}"
if [[ $# -eq 0 ]]; then
    set -- build --release --features cuda --tests --benches --examples
fi
echo "[build-cuda] CUDA_HOME=$CUDA_HOME CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP CARGO_TARGET_DIR=$CARGO_TARGET_DIR" >&2
echo "[build-cuda] cargo $*" >&2
start=$(date +%s)
status=0
nice -n 10 cargo "$@" || status=$?
echo "[build-cuda] cargo exited $status after $(($(date +%s) - start)) s" >&2
exit $status
