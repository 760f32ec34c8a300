#!/usr/bin/env bash
# Installs what `cargo build --features cuda` needs on a machine WITHOUT a GPU or a system CUDA
# toolkit: NVIDIA's compiler (nvcc, for candle-kernels' build script), headers and link libraries,
# all from the Python package registry, plus a link-only stub of the driver library `libcuda`.
#
#   scripts/cuda-toolchain.sh            install (idempotent; seconds when already installed), then
#                                        print the environment as `export` lines
#   eval "$(scripts/cuda-toolchain.sh --env)"   the same, with only the exports on stdout
#
# Settings (environment):
#   CUDA_TOOLCHAIN_DIR   where the venv goes (default ${XDG_CACHE_HOME:-~/.cache}/candle-bleu/cuda-13.0.2)
#   CUDA_COMPUTE_CAP     the GPU architecture candle's kernels are compiled for (default 90: H100/H200)
#   PYTHON               the interpreter that creates the venv (default python3)
#
# The toolkit is pinned to 13.0.2 (nvcc 13.0) so that its PTX loads on a CUDA 13.0 driver; a newer
# nvcc emits PTX an older driver rejects.
#
# The stub `libcuda.so` only satisfies the linker (the wheels ship no libcuda: the real one comes
# with the NVIDIA driver). Every function in it returns CUDA_ERROR_STUB_LIBRARY (34), so on this
# machine `Device::new_cuda(0)` fails cleanly. It lives in `lib/stubs`, which the printed
# LD_LIBRARY_PATH includes for THIS machine only: never copy it to a GPU machine, where the
# driver's `libcuda.so.1` must be found instead (see docs/gpu.md).
set -euo pipefail

TOOLKIT_VERSION=13.0.2
# NCCL for CUDA 13 (the `nccl` feature links libnccl; cudarc's bindings are NCCL 2.30's API,
# which 2.32 keeps).
NCCL_VERSION=2.32.3
CUDARC_VERSION_CODE=13000
EXTRAS="nvcc,crt,cccl,cudart,cublas,curand,nvrtc,nvvm"
CUDA_STUB_LIBRARY_ERROR=34

env_only=0
case "${1:-}" in
--env) env_only=1 ;;
"") ;;
-h | --help)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "usage: $0 [--env]" >&2
    exit 2
    ;;
esac

log() { echo "[cuda-toolchain] $*" >&2; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
toolchain_dir="${CUDA_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/candle-bleu/cuda-$TOOLKIT_VERSION}"
python="${PYTHON:-python3}"
compute_cap="${CUDA_COMPUTE_CAP:-90}"

# 1. A venv holding the wheels (pip is the registry's ordinary client).
if [[ ! -x "$toolchain_dir/bin/python" ]]; then
    log "creating venv $toolchain_dir"
    mkdir -p "$(dirname "$toolchain_dir")"
    "$python" -m venv "$toolchain_dir"
fi

# 2. The toolkit wheels (~1.2 GB download). A marker records a completed install of this pin.
marker="$toolchain_dir/.cuda-toolkit-$TOOLKIT_VERSION-$EXTRAS"
if [[ ! -f "$marker" ]]; then
    log "installing cuda-toolkit[$EXTRAS]==$TOOLKIT_VERSION (about 1.2 GB)"
    start=$(date +%s)
    nice -n 10 "$toolchain_dir/bin/pip" install --quiet --disable-pip-version-check \
        "cuda-toolkit[$EXTRAS]==$TOOLKIT_VERSION" >&2
    touch "$marker"
    log "installed in $(($(date +%s) - start)) s"
fi

# 2b. NCCL (about 300 MB), with its own marker.
nccl_marker="$toolchain_dir/.nvidia-nccl-cu13-$NCCL_VERSION"
if [[ ! -f "$nccl_marker" ]]; then
    log "installing nvidia-nccl-cu13==$NCCL_VERSION"
    start=$(date +%s)
    nice -n 10 "$toolchain_dir/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-nccl-cu13==$NCCL_VERSION" >&2
    touch "$nccl_marker"
    log "installed in $(($(date +%s) - start)) s"
fi

cuda_root="$("$toolchain_dir/bin/python" -c \
    'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
for needed in bin/nvcc include/cuda.h include/cuda_runtime.h lib; do
    [[ -e "$cuda_root/$needed" ]] || {
        log "missing $cuda_root/$needed: delete $marker and rerun"
        exit 1
    }
done

nccl_lib="$("$toolchain_dir/bin/python" -c \
    'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')"
[[ -e "$nccl_lib/libnccl.so.2" ]] || {
    log "missing $nccl_lib/libnccl.so.2: delete $nccl_marker and rerun"
    exit 1
}
[[ -e "$nccl_lib/libnccl.so" ]] || ln -s libnccl.so.2 "$nccl_lib/libnccl.so"

# 3. Unversioned names for the linker (the wheels ship only libfoo.so.N[.M…]). For each library,
#    link the shortest versioned name, e.g. libcublas.so -> libcublas.so.13.
shopt -s nullglob
declare -A shortest=()
for versioned in "$cuda_root"/lib/lib*.so.*; do
    name="$(basename "$versioned")"
    base="${name%%.so.*}.so"
    if [[ -z "${shortest[$base]:-}" || ${#name} -lt ${#shortest[$base]} ]]; then
        shortest[$base]="$name"
    fi
done
for base in "${!shortest[@]}"; do
    if [[ ! -e "$cuda_root/lib/$base" ]]; then
        ln -s "${shortest[$base]}" "$cuda_root/lib/$base"
        log "linked lib/$base -> ${shortest[$base]}"
    fi
done

# 4. The libcuda link stub, generated from the driver API functions that the cudarc version in
#    Cargo.lock declares (its src/driver/sys/mod.rs). Rebuilt only when that list changes.
cudarc_manifest="$(cd "$repo_root" && cargo metadata --format-version 1 --features cuda 2>/dev/null |
    "$python" -c 'import json, sys
pkgs = [p for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"]
print(pkgs[0]["manifest_path"] if pkgs else "")')"
if [[ -z "$cudarc_manifest" ]]; then
    log "cargo metadata found no cudarc: is the cuda feature in Cargo.toml?"
    exit 1
fi
driver_sys="$(dirname "$cudarc_manifest")/src/driver/sys/mod.rs"
stub_dir="$cuda_root/lib/stubs"
mkdir -p "$stub_dir"
stub_c="$(mktemp)"
trap 'rm -f "$stub_c"' EXIT
{
    echo "/* Link-only stub of libcuda.so.1, generated by candle-bleu's scripts/cuda-toolchain.sh"
    echo "   from $(basename "$(dirname "$cudarc_manifest")")'s driver API. Never use on a GPU machine. */"
    echo "static const char stub_message[] = \"libcuda stub: linked for building only, no CUDA driver\";"
    echo "int cuGetErrorString(int error, const char **message) { (void)error; *message = stub_message; return 0; }"
    echo "int cuGetErrorName(int error, const char **name) { (void)error; *name = \"CUDA_ERROR_STUB_LIBRARY\"; return 0; }"
    grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$driver_sys" | sed 's/^pub unsafe fn //' |
        grep -vxE 'cuGetErrorString|cuGetErrorName' | sort -u |
        sed "s/.*/int &(void) { return $CUDA_STUB_LIBRARY_ERROR; }/"
} >"$stub_c"
if ! cmp -s "$stub_c" "$stub_dir/libcuda_stub.c" || [[ ! -f "$stub_dir/libcuda.so" ]]; then
    n_functions=$(grep -c '^int ' "$stub_c")
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub_dir/libcuda.so" -x c "$stub_c"
    cp "$stub_c" "$stub_dir/libcuda_stub.c"
    log "built lib/stubs/libcuda.so ($n_functions functions)"
fi
ln -sfn libcuda.so "$stub_dir/libcuda.so.1"

# 5. The environment: cudarc reads CUDA_HOME/CUDA_PATH (link search: <root>/lib, <root>/lib/stubs)
#    and the version; candle-kernels' cudaforge finds nvcc on PATH and the target in CUDA_COMPUTE_CAP.
exports=$(
    cat <<EOF
export CUDA_HOME='$cuda_root'
export CUDA_PATH='$cuda_root'
export PATH='$cuda_root/bin':"\$PATH"
export CUDARC_CUDA_VERSION=$CUDARC_VERSION_CODE
export CUDA_COMPUTE_CAP=$compute_cap
export LIBRARY_PATH='$cuda_root/lib:$nccl_lib:$stub_dir'\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export LD_LIBRARY_PATH='$cuda_root/lib:$nccl_lib:$stub_dir'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
)
if [[ $env_only -eq 1 ]]; then
    echo "$exports"
else
    log "nvcc: $("$cuda_root/bin/nvcc" --version | tail -2 | head -1)"
    log "ready; load the environment with: eval \"\$($0 --env)\""
    echo "$exports"
fi
