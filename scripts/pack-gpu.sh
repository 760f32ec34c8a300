#!/usr/bin/env bash
# Builds and packs the CUDA test, bench and example binaries for a GPU machine that has no Rust
# toolchain (docs/gpu.md, "Running on a GPU machine"):
#
#   scripts/pack-gpu.sh [OUT_DIR]        # default gpu/ (untracked: never commit it)
#
# The crate's CUDA kernels are chosen at build time (the `cuda-kernels` feature), so the GPU
# runs need two builds of every binary, packed side by side:
#
#   bins/kernels/<name>    --features cuda-kernels,nccl: CUDA tensors take the crate's kernels
#   bins/composed/<name>   --features cuda,nccl: CUDA tensors take composed candle ops
#
# Each set holds the loss's test binaries below, the library's unit tests (lib_unit) and, unless
# EXAMPLES=0, the seq2seq and translate examples; the kernels set also the `cuda` bench
# (bench_cuda: it times the kernels on and off in one process). The builds go through
# scripts/build-cuda.sh (target/cuda; incremental: seconds when already built) and the binaries
# are the exact ones cargo reports (--message-format=json), not globbed from target/.
#
# Writes OUT_DIR/bins.tar.xz and OUT_DIR/bins.sha256. Each binary is about 55 MB, almost all of
# it candle's embedded PTX, the same in every binary of both builds: xz with a dictionary larger
# than one binary stores that PTX once, and each binary sits next to its twin from the other
# build. The 33 binaries (1.75 GiB) packed to 24.3 MiB; a device machine gets at most 64 MiB of
# working tree, the repository's tracked files (about 15 MB) included. scripts/gpu-suite.sh
# unpacks and runs them.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo_root/gpu}")"
build="$repo_root/scripts/build-cuda.sh"

# The test binaries (cargo target names) of each set.
tests=(cuda_kernels distributed loss_errors loss_exact loss_extreme loss_grad loss_host_copies
    loss_props loss_spec_reference hidden cross_entropy training_loss docs_worked_example)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bins/kernels" "$stage/bins/composed" "$out"

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

pick() { # pick SET NAME KIND TARGET LISTING: copy TARGET's executable of KIND to bins/SET/NAME
    local found
    found="$(awk -v k="$3" -v n="$4" '$1 == k && $2 == n { print $3 }' <<<"$5" | tail -1)"
    [[ -n "$found" ]] || { echo "pack-gpu: cargo built no $3 $4 for $1" >&2; exit 1; }
    cp "$found" "$stage/bins/$1/$2"
    echo "pack-gpu: $1/$2 <- ${found#"$repo_root"/}" >&2
}

test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
for set in kernels composed; do
    case "$set" in
    kernels) lib_features=cuda-kernels,nccl research_features=cuda,nccl,candle-bleu/cuda-kernels ;;
    composed) lib_features=cuda,nccl research_features=cuda,nccl ;;
    esac
    echo "pack-gpu: building the $set set (--features $lib_features)" >&2
    listing="$(executables test --no-run --release -p candle-bleu --features "$lib_features" \
        --lib "${test_args[@]}")"
    for t in "${tests[@]}"; do pick "$set" "$t" test "$t" "$listing"; done
    pick "$set" lib_unit lib candle_bleu "$listing"
    if [[ "$set" == kernels ]]; then
        listing="$(executables build --release -p candle-bleu --features "$lib_features" --bench cuda)"
        pick "$set" bench_cuda bench cuda "$listing"
    fi
    if [[ "${EXAMPLES:-1}" != 0 ]]; then
        listing="$(executables build --release -p candle-bleu-research \
            --features "$research_features" --example seq2seq --example translate)"
        pick "$set" seq2seq example seq2seq "$listing"
        pick "$set" translate example translate "$listing"
    fi
done

(cd "$stage/bins" && sha256sum */* >"$out/bins.sha256")
# Each binary beside its twin from the other build; a 192 MiB dictionary reaches back over a
# whole binary to the previous copy of the PTX.
files=()
for name in $(find "$stage/bins" -type f -printf '%f\n' | sort -u); do
    for set in kernels composed; do
        [[ -f "$stage/bins/$set/$name" ]] && files+=("bins/$set/$name")
    done
done
tar -C "$stage" -cf - "${files[@]}" | xz -6 --lzma2=preset=6,dict=192MiB -T1 >"$out/bins.tar.xz"
ls -l "$out/bins.tar.xz" >&2
