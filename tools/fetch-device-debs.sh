#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that the GPU device machine lacks into
# .debs/ (ignored by git through .debs/.gitignore), for tests/device/run.sh to unpack with
# `dpkg -x` into a private prefix. That machine has the CUDA toolkit, CMake and PyTorch but
# no Debian -dev packages and no network. Run here (Debian bookworm, apt configured):
#   tools/fetch-device-debs.sh && ls .debs
# then carry .debs to the device machine (run tool: carry [".debs"]).
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(
    libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev libgfortran5 libquadmath0
    libcjson1 libcjson-dev
    libpcre2-8-0 libpcre2-dev
    libhwloc15 libhwloc-dev libudev1
    pkgconf pkgconf-bin libpkgconf3
)
mkdir -p .debs
printf '*\n' >.debs/.gitignore
if [ "$(id -u)" = 0 ] && [ -z "${NO_APT_UPDATE:-}" ]; then apt-get update -qq; fi
cd .debs
rm -f ./*.deb
apt-get download -q "${PKGS[@]}"
ls -l ./*.deb |
    awk '{s += $5} END {printf "fetch-device-debs: %d packages, %.1f MiB in .debs/\n", NR, s / 1048576}'
