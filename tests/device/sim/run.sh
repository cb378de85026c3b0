#!/usr/bin/env bash
# The CUDA attention kernels (kernels/cuda/flash_attn.cu, attn_decode.cu) checked on the CPU,
# for the days without a GPU: extract.py turns each file's kernels into host C++, prelude.h
# simulates a block (its threads as OS threads, __syncthreads and warp shuffles as
# barriers), prims.h emulates mma.sync and ldmatrix by the PTX fragment layouts, and sim.cpp
# runs the kernels on a few shapes against a float64 reference (ctest cuda_kernels_sim,
# label slow: about a minute, mostly thread start-ups). What it checks: the kernels'
# indexing, fragment arithmetic, masks, tile skipping, online softmax, sinks, h2o scores and
# the split-K merge. What it cannot: timing, races that need real concurrency inside a
# warp, cp.async ordering, the compiler's register use; the GPU check
# (tests/unit/test_flash_attn.c in tests/device/run.sh) covers those.
# Arguments: [scratch dir] [fa|dec]. Needs a C++20 compiler (CXX, default c++) and python3;
# no CUDA toolkit (cuda_runtime_api.h here stands in). Exit 77 without them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
tmp=${1:-$(mktemp -d)}
mkdir -p "$tmp"
CXX=${CXX:-c++}
if ! command -v "$CXX" >/dev/null || ! command -v python3 >/dev/null; then
    echo "cuda_kernels_sim: no $CXX or python3: skipped"
    exit 77
fi
python3 "$here/extract.py" "$root/kernels/cuda/flash_attn.cu" fa >"$tmp/flash_attn_sim.inc"
python3 "$here/extract.py" "$root/kernels/cuda/attn_decode.cu" dec >"$tmp/attn_decode_sim.inc"
"$CXX" -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas \
    -I"$here" -I"$root" -I"$tmp" "$here/sim.cpp" -o "$tmp/sim"
"$tmp/sim" "${2:-}"
