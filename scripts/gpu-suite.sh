#!/usr/bin/env bash
# The GPU runs of docs/gpu.md, on a machine with an NVIDIA GPU, its driver and CUDA 13 libraries
# but no Rust toolchain, from the binaries that scripts/pack-gpu.sh packed on a build machine:
#
#   scripts/gpu-suite.sh PACK OUT_DIR [STEP ...]
#
# PACK is bins.tar.xz (or a directory of unpacked binaries) from scripts/pack-gpu.sh: bins/cuda/
# (--features cuda,nccl: the crate's CUDA kernels, and their `_composed` references). Every step
# writes OUT_DIR/<step>.log and the steps' last lines go to stdout. SETS (default "cuda") picks
# the builds the test steps run (an older two-build pack: SETS="kernels composed"). The test
# binaries run in LANES parallel lanes (default 3), one binary at a time per lane: all at once
# (30 processes on 16 cores, 2026-11-27) made two 18-second binaries run past 170 s.
# Steps (default: info kernels suite):
#   info      nvidia-smi, the libraries found, the binaries' SHA-256
#   kernels   per build: tests/cuda_kernels.rs (the GPU against the CPU: f32, f64, f16, bf16,
#             views, the hidden-state path; fast vs composed functions; the kernels ran), the
#             one-rank NCCL test and the library's unit tests (the NVRTC compile among them)
#   suite     per build: every loss test binary (or those SUITE names) with the loss's tensors
#             on the GPU (CANDLE_BLEU_TEST_DEVICE=cuda); each binary is stopped after
#             TEST_TIMEOUT seconds (default 300)
#   bench     benches/cuda.rs (kernels on and off) against benches/torch_cuda.py
#             (benches/cuda_vs_torch.sh), from the first of SETS
#   examples  the seq2seq example (one seed) and translate --quick (catalogues: CATALOGS=dir),
#             from the build EXAMPLES_SET names (default: the first of SETS)
#
# The libraries come from the machine itself (PyTorch's CUDA wheels or a system toolkit), never
# a link stub: the binaries link libcuda.so.1, libcublas(Lt).so.13, libcurand.so.10,
# libcudart.so.13, libnvrtc.so.13 and, with the nccl feature, libnccl.so.2.
set -uo pipefail
if [[ $# -lt 2 ]]; then
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
pack="$1"
out="$2"
shift 2
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(info kernels suite)
read -r -a sets <<<"${SETS:-cuda}"
mkdir -p "$out"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# 1. The binaries.
if [[ -d "$pack" ]]; then
    bins="$pack"
else
    bins="$(mktemp -d)/bins"
    python3 - "$pack" "$(dirname "$bins")" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as tar:
    tar.extractall(sys.argv[2], filter="data")
EOF
    chmod +x "$bins"/*/*
fi
for set in "${sets[@]}"; do
    [[ -d "$bins/$set" ]] || { echo "gpu-suite: $pack has no $set/ build (SETS=\"${sets[*]}\")" >&2; exit 2; }
done

# 2. The machine's CUDA libraries (the first directory holding each, stubs excluded).
libdirs=()
for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13 libnvrtc.so.13 \
    libnvrtc-builtins.so.13.0 libnccl.so.2; do
    dir="$(find /usr /opt /lib /lib64 -name "$lib" -not -path '*/stubs/*' 2>/dev/null | head -1)"
    if [[ -n "$dir" ]]; then libdirs+=("$(dirname "$dir")"); else echo "gpu-suite: $lib not found" >&2; fi
done
LD_LIBRARY_PATH="$(printf '%s\n' "${libdirs[@]}" | awk '!seen[$0]++' | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

run_test() { # LOG SET/NAME [ENV=VALUE ...] -- ARGS...
    local log="$1" name="$2"
    shift 2
    local envs=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
    shift
    {
        echo "== $name ${envs[*]} $*"
        local start=$SECONDS
        env "${envs[@]}" timeout "${TEST_TIMEOUT:-300}" "$bins/$name" "$@" 2>&1
        echo "== exit $? after $((SECONDS - start)) s: $name ${envs[*]}"
    } >>"$log"
}

# run_lanes LOG [ENV=VALUE ...] -- JOB ...: each JOB "SET/NAME[|ARG ...]" (args split on
# spaces), spread round-robin over LANES lanes (default 3) that run one binary at a time each;
# every job logs to its own file, appended to LOG in job order once all are done. Put the
# longest jobs first.
run_lanes() {
    local log="$1"
    shift
    local envs=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
    shift
    local jobs=("$@") lanes="${LANES:-3}" dir lane i
    dir="$(mktemp -d)"
    for ((lane = 0; lane < lanes; lane++)); do
        (
            for ((i = lane; i < ${#jobs[@]}; i += lanes)); do
                local name="${jobs[$i]%%|*}" args=()
                [[ "${jobs[$i]}" == *"|"* ]] && read -r -a args <<<"${jobs[$i]#*|}"
                run_test "$dir/$i.log" "$name" "${envs[@]}" -- "${args[@]}"
            done
        ) &
    done
    wait
    for ((i = 0; i < ${#jobs[@]}; i++)); do cat "$dir/$i.log" >>"$log"; done
    rm -rf "$dir"
}

for step in "${steps[@]}"; do
    log="$out/$step.log"
    : >"$log"
    echo "### $step (log: $log)"
    case "$step" in
    info)
        {
            date -u
            nvidia-smi
            nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
            echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
            nproc
            (cd "$bins" && sha256sum ./*/*)
        } >>"$log" 2>&1
        tail -n 20 "$log"
        ;;
    kernels)
        jobs=()
        for set in "${sets[@]}"; do
            jobs+=("$set/cuda_kernels|--test-threads=1 --nocapture" "$set/distributed|--nocapture nccl"
                "$set/lib_unit|--test-threads=4")
            # The unverified build's unit tests (NVRTC compiles the CTC module), when packed.
            [[ -x "$bins/$set/lib_unit_unverified" ]] && jobs+=("$set/lib_unit_unverified|--test-threads=4")
        done
        run_lanes "$log" -- "${jobs[@]}"
        grep -E '^== |^test result:' "$log"
        grep -E 'FAILED|panicked|SKIPPED|NOTE|^failures:' "$log" | head -30
        ;;
    suite)
        jobs=()
        for set in "${sets[@]}"; do
            # Longest first (their times under contention on 2026-11-27).
            for name in ${SUITE:-loss_extreme loss_spec_reference loss_exact loss_props loss_grad \
                loss_errors loss_host_copies hidden training_loss cross_entropy docs_worked_example \
                ctc_loss ctc_bleu ce_options}; do
                jobs+=("$set/$name")
            done
        done
        run_lanes "$log" CANDLE_BLEU_TEST_DEVICE=cuda PROPTEST_CASES="${PROPTEST_CASES:-64}" -- \
            "${jobs[@]}"
        grep -E '^== |^test result:' "$log"
        grep -E 'FAILED|panicked' "$log" | head -30
        ;;
    bench)
        bash benches/cuda_vs_torch.sh "$bins/${sets[0]}/bench_cuda" "$out/bench" >>"$log" 2>&1
        tail -n 60 "$log"
        ;;
    examples)
        {
            echo "== seq2seq (seed 1)"
            start=$SECONDS
            timeout 420 "$bins/${EXAMPLES_SET:-${sets[0]}}/seq2seq" --seeds 1 --out "$out/seq2seq" 2>&1
            echo "== exit $? after $((SECONDS - start)) s: seq2seq"
            echo "== translate --quick"
            start=$SECONDS
            timeout 300 "$bins/${EXAMPLES_SET:-${sets[0]}}/translate" --quick --catalogs "${CATALOGS:-gpu/locale}" \
                --out "$out/translate-quick" 2>&1
            echo "== exit $? after $((SECONDS - start)) s: translate --quick"
        } >>"$log"
        grep -E '^==|BLEU|bleu|step' "$log" | tail -n 40
        ;;
    *)
        echo "gpu-suite: unknown step $step" >&2
        ;;
    esac
done
