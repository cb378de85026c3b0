#!/usr/bin/env bash
# GPU check for the device machine (one NVIDIA GPU; CUDA toolkit, CMake, ninja, PyTorch;
# no Debian -dev packages, no MPI, no network). Builds tessera with CUDA, runs ctest and
# test_backend_ops (every op, CUDA vs CPU, plus timings) and prints the figures, checks the
# backend memory contract on the GPU (test_cuda_mem), then the data-plane choice for the
# real CUDA backend (test_dist_plane).
#
#   here:    tools/fetch-device-debs.sh           # OpenBLAS, cJSON, PCRE2, hwloc, pkgconf
#   there:   bash tests/device/run.sh             # run tool: carry [".debs"]
#
# Missing libraries come from .debs/*.deb, unpacked with `dpkg -x` into $DEBROOT (never /),
# found through PKG_CONFIG_LIBDIR + PKG_CONFIG_SYSROOT_DIR, so no -I/usr/include is needed.
# Options (environment): BUILD_DIR (build-device), DEBROOT (/tmp/debroot), CUDA_ARCH (native,
# else 90), OUT (where logs go; the run tool's $OUT), CONFIGURE_ONLY=1 (stop after cmake),
# FORCE_DEBS=1 (use .debs even if the system has the libraries). Meant to finish in < 5 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
B=${BUILD_DIR:-build-device}
DEBROOT=${DEBROOT:-/tmp/debroot}
OUT=${OUT:-/tmp/tessera-device}
mkdir -p "$OUT"
T0=$(date +%s)
say() { printf '\n==== %s (%ds) ====\n' "$*" "$(( $(date +%s) - T0 ))"; }
MA=x86_64-linux-gnu

say "machine"
command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
nvcc --version | tail -n 1
cmake --version | head -n 1
JOBS=$(nproc)

# ---- dependencies: the system's when complete, else the carried .debs ----
have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$@" 2>/dev/null; }
CMAKE_DEPS=()
if [ -z "${FORCE_DEBS:-}" ] && have_pc openblas libcjson libpcre2-8 hwloc; then
    echo "dependencies: from the system"
else
    say "dependencies: unpacking .debs into $DEBROOT"
    shopt -s nullglob
    debs=("$ROOT"/.debs/*.deb)
    if [ ${#debs[@]} -eq 0 ]; then
        echo "run.sh: no .debs/*.deb (run tools/fetch-device-debs.sh and carry .debs)" >&2
        exit 2
    fi
    mkdir -p "$DEBROOT"
    for f in "${debs[@]}"; do
        if command -v dpkg >/dev/null; then
            dpkg -x "$f" "$DEBROOT"
        else # dpkg-less: a .deb is an ar archive holding data.tar.*
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$f" && tar -xf data.tar.* -C "$DEBROOT")
            rm -rf "$tmp"
        fi
    done
    L=$DEBROOT/usr/lib/$MA
    # openblas.pc lives in openblas-pthread/ (Debian's alternatives link is not in the .deb).
    export PKG_CONFIG_LIBDIR=$L/pkgconfig:$L/openblas-pthread/pkgconfig:$DEBROOT/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$DEBROOT
    export PKG_CONFIG_PATH=
    # keep -I/-L of the prefix even where they look like system paths once rewritten
    export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
    export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PKGCONF=$(command -v pkg-config || true)
    if [ -z "$PKGCONF" ]; then
        PKGCONF=$DEBROOT/usr/bin/pkgconf
        # pkgconf's personality files would point at /usr; the LIBDIR above replaces them.
    fi
    CMAKE_DEPS+=(-DPKG_CONFIG_EXECUTABLE="$PKGCONF")
    for m in openblas libcjson libpcre2-8 hwloc; do
        printf '  %-11s %s\n' "$m" "$("$PKGCONF" --cflags --libs "$m")"
    done
fi

# NCCL: the toolkit's, else pip's nvidia-nccl wheel (PyTorch brings one).
NCCL_ROOT=${NCCL_ROOT:-}
if [ -z "$NCCL_ROOT" ] && [ ! -f "$(dirname "$(command -v nvcc)")/../include/nccl.h" ] &&
    command -v python3 >/dev/null; then
    NCCL_ROOT=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null ||
        true)
fi
[ -n "$NCCL_ROOT" ] && CMAKE_DEPS+=(-DNCCL_ROOT="$NCCL_ROOT")

ARCH=${CUDA_ARCH:-}
if [ -z "$ARCH" ]; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 |
        tr -d . || true)
    ARCH=${cap:-90}
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

say "configure ($B, sm_$ARCH)"
rm -rf "$B"
cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=OFF \
    -DTESSERA_CUDA=ON -DTESSERA_MPI=OFF -DTESSERA_HDF5=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    "${CMAKE_DEPS[@]}" 2>&1 | tee "$OUT/configure.log" |
    grep -E "tessera|NCCL|CUDA|Warn|Error" || true
[ -f "$B/CMakeCache.txt" ] && grep -q "^TESSERA_CUDA:BOOL=ON" "$B/CMakeCache.txt"
if [ -n "${CONFIGURE_ONLY:-}" ]; then
    say "configured (CONFIGURE_ONLY)"
    exit 0
fi

say "build (-j$JOBS)"
cmake --build "$B" -j"$JOBS" >"$OUT/build.log" 2>&1 || {
    tail -n 40 "$OUT/build.log"
    exit 1
}

say "ctest"
rc=0
ctest --test-dir "$B" --output-on-failure -j"$JOBS" --timeout 120 2>&1 | tee "$OUT/ctest.log" |
    tail -n 25 || rc=1
grep -q "100% tests passed" "$OUT/ctest.log" || rc=1

say "test_backend_ops: CUDA vs CPU, with timings"
TSR_BENCH=1 "$B/tests/test_backend_ops" 2>&1 | tee "$OUT/backend_ops.log" || rc=1
grep -q "backend cuda on" "$OUT/backend_ops.log" || {
    echo "run.sh: the CUDA backend did not come up" >&2
    rc=1
}
# split-K decode, tiled prefill and the sample op must have met the CPU on the GPU
for k in "attn split-K" "attn prefill tiled" "sample vocab 50000"; do
    grep -q "^  $k.* cuda " "$OUT/backend_ops.log" || { echo "run.sh: no cuda line for '$k'" >&2; rc=1; }
done

# The memory contract (kernels/backend.h) on the GPU: host staging, sync and stream copies,
# events, KV rows by slot (kv.cu), attention with host positions; CUDA against the CPU.
say "test_cuda_mem: the CUDA backend's memory calls"
"$B/tests/test_cuda_mem" 2>&1 | tee "$OUT/cuda_mem.log" || rc=1
grep -q "cuda: attention with host positions" "$OUT/cuda_mem.log" || {
    echo "run.sh: test_cuda_mem did not run on the CUDA backend" >&2
    rc=1
}

# No MPI here, so no multi-rank NCCL run: this checks that the real CUDA backend counts as a
# device backend with its own stream, i.e. what would put a multi-rank data plane on NCCL
# (and is refused cleanly by this MPI-less, NCCL-less build).
say "test_dist_plane: the CUDA backend's data plane"
"$B/tests/test_dist_plane" test_cuda_backend_if_present 2>&1 | tee "$OUT/dist_plane.log" || rc=1
grep -q "cuda backend on GPU" "$OUT/dist_plane.log" || {
    echo "run.sh: test_dist_plane did not get the CUDA backend" >&2
    rc=1
}

say "done (rc=$rc)"
exit $rc
