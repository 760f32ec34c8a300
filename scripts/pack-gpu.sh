#!/usr/bin/env bash
# Packs the CUDA build's test, bench and example binaries for a GPU machine that has no Rust
# toolchain (docs/gpu.md, "Running on a GPU machine"):
#
#   scripts/build-cuda.sh build --release --workspace --features cuda,nccl --tests --benches --examples
#   scripts/pack-gpu.sh [OUT_DIR]        # default gpu/ (ignored by git)
#
# writes OUT_DIR/bins.tar.xz holding bins/<name> for each binary below (the newest build of
# each), and OUT_DIR/bins.sha256. Each binary is about 40 MB, almost all of it candle's embedded
# PTX, the same in every binary: xz with a dictionary larger than one binary stores that PTX
# once, so 17 binaries pack to a few tens of MB (the device tool carries at most 64 MiB).
# scripts/gpu-suite.sh unpacks and runs them there.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo_root/gpu}")"
deps="${CARGO_TARGET_DIR:-$repo_root/target/cuda}/release/deps"
examples="${CARGO_TARGET_DIR:-$repo_root/target/cuda}/release/examples"

# name in the pack = the cargo target's name; where it is found.
tests=(cuda_kernels distributed loss_errors loss_exact loss_extreme loss_grad loss_host_copies
    loss_props loss_spec_reference hidden cross_entropy training_loss docs_worked_example)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bins" "$out"

newest() { # newest executable file matching a glob, or nothing
    ls -t $1 2>/dev/null | while read -r f; do [[ -x "$f" && -f "$f" ]] && { echo "$f"; break; }; done
}
pick() { # pick NAME GLOB
    local found
    found="$(newest "$2")"
    [[ -n "$found" ]] || { echo "pack-gpu: no binary for $1 ($2)" >&2; exit 1; }
    cp "$found" "$stage/bins/$1"
    echo "pack-gpu: $1 <- ${found#"$repo_root"/}" >&2
}
for t in "${tests[@]}"; do pick "$t" "$deps/$t-*"; done
pick lib_unit "$deps/candle_bleu-*"
# The bench and the examples when they are built (`--benches`, `--examples`).
for optional in "bench_cuda $deps/cuda-*" "seq2seq $examples/seq2seq" \
    "translate $examples/translate"; do
    set -- $optional
    if [[ -n "$(newest "$2")" ]]; then pick "$1" "$2"; else echo "pack-gpu: no $1, left out" >&2; fi
done

(cd "$stage/bins" && sha256sum * >"$out/bins.sha256")
# Sorted by name, so the binaries sit next to each other; a 192 MiB dictionary reaches back
# over a whole binary to the previous copy of the PTX.
tar -C "$stage" -cf - bins | xz -6 --lzma2=preset=6,dict=192MiB -T1 >"$out/bins.tar.xz"
ls -l "$out/bins.tar.xz" >&2
