#!/usr/bin/env bash
# Installs what the `mpi` feature and `mpirun` need on Debian/Ubuntu: Open MPI's headers and
# library (libopenmpi-dev), its launcher (openmpi-bin) and libclang (rsmpi's bindgen reads the
# MPI headers with it). Idempotent and quiet: when `mpirun`, `mpicc` and libclang are already
# there it does nothing. Needs root (or sudo) and the distribution's package mirror.
#
#   scripts/install-mpi.sh        used by .ci/run before the build
set -euo pipefail

have_libclang() {
    ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'
}
if command -v mpirun >/dev/null && command -v mpicc >/dev/null && have_libclang; then
    echo "[install-mpi] present: $(mpirun --version 2>/dev/null | head -1)" >&2
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
        echo "[install-mpi] not root and no sudo: install libopenmpi-dev openmpi-bin libclang-dev" >&2
        exit 1
    }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
start=$(date +%s)
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends \
    libopenmpi-dev openmpi-bin libclang-dev >/dev/null
echo "[install-mpi] installed in $(($(date +%s) - start)) s: $(mpirun --version 2>/dev/null | head -1)" >&2
