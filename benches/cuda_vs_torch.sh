#!/usr/bin/env bash
# candle (benches/cuda.rs) against PyTorch (benches/torch_cuda.py) on one CUDA GPU, run
# alternately — torch, candle, torch, candle, … — so that drifts of clock or temperature fall on
# both sides. Each candle run reads the PyTorch JSON of the run just before it (--torch) and
# prints candle/eager and candle/compile ratios.
#
#   benches/cuda_vs_torch.sh BENCH_BINARY OUT_DIR [--rounds N] [--quick] [--repeats N]
#                            [--only KEY,...] [--torch-args "..."] [--candle-args "..."]
#
# BENCH_BINARY: the `cuda` bench built elsewhere (target/cuda/release/deps/cuda-<hash> from
#   `scripts/build-cuda.sh build --release --features cuda --bench cuda`, which times each row
#   with the crate's CUDA kernels on and off; add `cuda-unverified` for host vs device time);
#   no Rust toolchain is needed here. It needs the driver's libcuda.so.1 and the CUDA 13
#   libraries (libcublas, libcublasLt, libcurand, libcudart, libnvrtc + libnvrtc-builtins): the
#   script looks for them under $PYTHON's site-packages/nvidia/*/lib (the CUDA 13 wheels, e.g.
#   torch's own when it is a CUDA 13 build) and puts those directories, after CANDLE_LIB_DIR
#   (':'-separated, for what the wheels lack), on LD_LIBRARY_PATH for the candle runs only.
#   env.txt shows `ldd` of the binary; a library "not found" there is printed as a warning.
# OUT_DIR: created; gets torch-<r>.json/.log, candle-<r>.json/.log per round, env.txt (nvidia-smi,
#   versions, ldd of the binary) and console.log (everything printed).
# PYTHON: the interpreter with torch (default python3). Run from anywhere: the script cds to the
#   repository root (benches/torch_cuda.py imports its neighbours).
#
# Defaults: 2 rounds, the full shapes, 10 repeats per side and round.
set -uo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[[ $# -ge 2 ]] || usage
bin="$(realpath "$1")"
out="$2"
shift 2
rounds=2
common=()
torch_extra=""
candle_extra=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --quick) common+=(--quick); shift ;;
        --repeats) common+=(--repeats "$2"); shift 2 ;;
        --only) common+=(--only "$2"); shift 2 ;;
        --torch-args) torch_extra="$2"; shift 2 ;;
        --candle-args) candle_extra="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "unknown argument $1" >&2; usage ;;
    esac
done
[[ -x "$bin" ]] || { echo "not an executable: $bin" >&2; exit 2; }
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
mkdir -p "$out"
out="$(realpath "$out")"
python="${PYTHON:-python3}"
exec > >(tee -a "$out/console.log") 2>&1

# Directories under site-packages/nvidia/ holding the CUDA 13 libraries the binary links
# (CUDA 13 wheels put them all in nvidia/cu13/lib; per-library wheels in nvidia/*/lib).
find_libs='import glob, os, site, sys
want = ("libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudart.so.13", "libnvrtc.so.13")
dirs = []
for root in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
        if "stubs" not in d and d not in dirs and any(os.path.exists(os.path.join(d, w)) for w in want):
            dirs.append(d)
print(":".join(dirs))'
found="$("$python" -c "$find_libs" 2>/dev/null)"
lib_dir="${CANDLE_LIB_DIR:-}${CANDLE_LIB_DIR:+${found:+:}}$found"
candle_env=()
if [[ -n "$lib_dir" ]]; then
    candle_env=(env "LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname)"
    echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "binary: $bin ($(stat -c %s "$bin") bytes, sha256 $(sha256sum "$bin" | cut -d' ' -f1))"
    echo "candle library dir: ${lib_dir:-none, the system default}"
    echo "python: $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
    echo "--- nvidia-smi"
    nvidia-smi 2>&1 || echo "nvidia-smi failed"
    echo "--- ldd $bin"
    "${candle_env[@]}" ldd "$bin" 2>&1
} > "$out/env.txt"
cat "$out/env.txt"
if "${candle_env[@]}" ldd "$bin" 2>/dev/null | grep -q "not found"; then
    echo "WARNING: the bench binary has unresolved libraries (above); set CANDLE_LIB_DIR" >&2
fi

status=0
for r in $(seq 1 "$rounds"); do
    echo
    echo "=== round $r/$rounds: PyTorch $(date -u +%T)"
    # shellcheck disable=SC2086
    "$python" benches/torch_cuda.py "${common[@]}" --json "$out/torch-$r.json" $torch_extra \
        2>&1 | tee "$out/torch-$r.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "PyTorch run $r failed" >&2; status=1; }
    echo
    echo "=== round $r/$rounds: candle $(date -u +%T)"
    torch_arg=()
    [[ -f "$out/torch-$r.json" ]] && torch_arg=(--torch "$out/torch-$r.json")
    # shellcheck disable=SC2086
    "${candle_env[@]}" "$bin" "${common[@]}" --json "$out/candle-$r.json" "${torch_arg[@]}" \
        $candle_extra 2>&1 | tee "$out/candle-$r.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "candle run $r failed" >&2; status=1; }
done
echo
echo "done $(date -u +%T): $out (exit $status)"
exit $status
