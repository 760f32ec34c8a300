#!/usr/bin/env bash
# The next GPU run, in one command of about 5.5 minutes, on a bare GPU machine (no Rust toolchain,
# no network) from the repository root, with the binaries scripts/pack-gpu.sh packed (docs/gpu.md,
# "Running on a GPU machine"):
#
#   scripts/gpu-check.sh [PACK]      # PACK: default gpu/bins.tar.xz (or an unpacked bins/ dir)
#
# 1. tests (scripts/gpu-suite.sh, LANES=3 lanes): tests/cuda_kernels.rs, the one-rank NCCL test and
#    the library's unit tests; then the loss test binaries fixed after the 2026-11-27 H200 run
#    (hidden, loss_grad, training_loss, loss_host_copies, cross_entropy) with their tensors on
#    the GPU;
# 2. bench: benches/cuda.rs (kernels off and on; built with cuda-unverified: host vs device time
#    per step from CUDA events) against benches/torch_cuda.py (eager and torch.compile), the two
#    sides alternated by benches/cuda_vs_torch.sh (PyTorch, then candle, per round; eager and
#    compile alternate inside PyTorch's rounds), ROUNDS rounds (default 2) of REPEATS steps
#    (default 5); TF32 off on both sides (NVIDIA_TF32_OVERRIDE=0 for cuBLAS; candle's reduced
#    precision off and PyTorch's float32 matmul precision "highest", their defaults);
# 3. ncu (where Nsight Compute exists and can read counters): gpu__time_duration.sum of every
#    kernel of two rows, cross_entropy and ce_expected, kernels on, 1 warm-up and 1 timed step.
#
# A phase starts only while the time left of BUDGET_S (default 330) allows: the bench keeps
# NCU_S (default 60) for ncu, and its second round is skipped first. Everything goes under OUT (default $OUT, else gpu-check-out):
# at most 3 files, console.log (all that was printed), summary.txt (test counts, the bench's
# tables, what was skipped) and results.tar.gz (every log, JSON and CSV).
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
pack="${1:-gpu/bins.tar.xz}"
out="${OUT:-$repo_root/gpu-check-out}"
budget="${BUDGET_S:-330}"
ncu_reserve="${NCU_S:-60}"
rounds="${ROUNDS:-2}"
repeats="${REPEATS:-5}"
mkdir -p "$out"
work="$(mktemp -d)"
exec 3>&1 4>&2
exec > >(tee -a "$out/console.log") 2>&1
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
note() { echo "[gpu-check $((SECONDS - start)) s] $*" | tee -a "$work/summary.txt"; }
export NVIDIA_TF32_OVERRIDE=0 PYTHONUNBUFFERED=1

# The binaries, unpacked once (gpu-suite.sh takes the directory).
if [[ -d "$pack" ]]; then
    bins="$pack"
else
    python3 - "$pack" "$work" <<'PY' || { note "cannot unpack $pack"; exit 2; }
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as tar:
    tar.extractall(sys.argv[2], filter="data")
PY
    bins="$work/bins"
    chmod +x "$bins"/*/*
fi
set_name="$(basename "$(find "$bins" -mindepth 1 -maxdepth 1 -type d | sort | head -1)")"
note "binaries: $bins/$set_name ($(ls "$bins/$set_name" | wc -l) files), budget ${budget} s"

# 1. Tests, in lanes.
SETS="$set_name" LANES="${LANES:-3}" TEST_TIMEOUT="${TEST_TIMEOUT:-150}" \
    SUITE="${SUITE:-ctc_loss_unverified ctc_bleu_unverified ctc_fmeasure_unverified ce_options_unverified cuda_kernels_unverified loss_host_copies_unverified hidden loss_grad training_loss loss_host_copies cross_entropy ce_options ctc_loss ctc_bleu}" \
    bash scripts/gpu-suite.sh "$bins" "$work/tests" info kernels suite
for log in "$work/tests/kernels.log" "$work/tests/suite.log"; do
    grep -E '^== exit|^test result:|FAILED|panicked' "$log" >>"$work/summary.txt"
done
note "tests done"

# The machine's CUDA libraries, as gpu-suite.sh finds them, for the bench and ncu.
libdirs=()
for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13 libnvrtc.so.13 \
    libnvrtc-builtins.so.13.0 libnccl.so.2; do
    found="$(find /usr /opt /lib /lib64 -name "$lib" -not -path '*/stubs/*' 2>/dev/null | head -1)"
    [[ -n "$found" ]] && libdirs+=("$(dirname "$found")")
done
export CANDLE_LIB_DIR="$(printf '%s\n' "${libdirs[@]}" | awk '!seen[$0]++' | paste -sd:)"
bench="$bins/$set_name/bench_cuda"

# 2. The bench against PyTorch, round by round while the budget allows (a round took about 90 s
#    on the H200 on 2026-11-27; the first compiles).
for ((r = 1; r <= rounds; r++)); do
    if [[ $(left) -lt $((100 + ncu_reserve)) ]]; then
        note "bench round $r skipped: $(left) s left"
        break
    fi
    # Stopped in time for ncu and the tar.
    timeout "$(( $(left) - ncu_reserve ))" bash benches/cuda_vs_torch.sh "$bench" "$work/bench/round-$r" \
        --rounds 1 --repeats "$repeats"
    note "bench round $r done (exit $?; 124: stopped at the budget)"
    sed -n '/^logits \[/,/^raw rows/p' "$work/bench/round-$r/candle-1.log" >>"$work/summary.txt"
done

# 3. ncu, two rows.
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
if [[ -z "$ncu_bin" ]]; then
    note "ncu: not found, skipped"
elif [[ $(left) -lt 40 ]]; then
    note "ncu: skipped, $(left) s left"
else
    mkdir -p "$work/ncu"
    for row in cross_entropy ce_expected; do
        [[ $(left) -lt 20 ]] && { note "ncu $row: skipped, $(left) s left"; continue; }
        LD_LIBRARY_PATH="$CANDLE_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            timeout "$(( $(left) - 10 ))" "$ncu_bin" --clock-control none \
            --metrics gpu__time_duration.sum --csv \
            "$bench" --only "$row" --kernels on --warmup 1 --repeats 1 \
            --json "$work/ncu/$row.json" >"$work/ncu/ncu-$row.csv" 2>"$work/ncu/ncu-$row.log"
        status=$?
        note "ncu $row: exit $status, $(grep -c '"' "$work/ncu/ncu-$row.csv") CSV lines"
        [[ $status -eq 0 ]] || tail -n 5 "$work/ncu/ncu-$row.log" | tee -a "$work/summary.txt"
    done
fi

# 4. At most 3 files under OUT.
note "total $((SECONDS - start)) s"
cp "$work/summary.txt" "$out/summary.txt"
tar -C "$work" -czf "$out/results.tar.gz" --exclude=bins . 2>/dev/null
ls -l "$out"
# Let tee write the end of console.log before the command returns.
exec 1>&3 2>&4
sleep 1
