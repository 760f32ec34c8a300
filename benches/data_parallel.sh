#!/usr/bin/env bash
# Step time of examples/data_parallel: 2 MPI ranks x 1 thread against 1 process x 1 thread and
# 1 process x 2 threads, alternating back to back (ROUNDS rounds), on the example's default task
# (global batch 64, seq 32, vocab 1000, 4 + 64 + 256 wide: 410k parameters, f32).
#
#   benches/data_parallel.sh [ROUNDS] [STEPS] [FLAGS…]   (default 3 rounds of 60 steps, 10 of warm-up)
#
# FLAGS go to every run, e.g. `--from-hidden` (each rank's loss from the hidden states and the
# output layer, `distributed::ce_bleu_from_hidden`).
#
# Needs `cargo build --release --features mpi --example data_parallel` and Open MPI's mpirun.
# The single-process runs start the binary directly (an MPI singleton), so that Open MPI binds
# nothing; the 2-rank run uses mpirun's default binding (one core per rank).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-60}
shift $(( $# < 2 ? $# : 2 ))
exe=target/release/examples/data_parallel
args=(--time --steps "$steps" --warmup 10 --eval-every 0 --eval-size 16 --allreduce-reps 50 "$@")
mpirun_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg); flags: ${*:-none}"
echo "# $(lscpu | grep 'Model name' | sed 's/  */ /g')"
for round in $(seq "$rounds"); do
    echo "## round $round"
    RAYON_NUM_THREADS=1 mpirun "${mpirun_flags[@]}" -np 2 "$exe" "${args[@]}" | grep -E "step time|all-reduce alone"
    RAYON_NUM_THREADS=1 "$exe" "${args[@]}" | grep -E "step time|all-reduce alone"
    RAYON_NUM_THREADS=2 "$exe" "${args[@]}" | grep -E "step time|all-reduce alone"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
