#!/usr/bin/env bash
# Checkpoint write and read speed at 1, 2 and 4 ranks, next to the file system's own write
# bandwidth with as many writers (bench/ckpt.c), one JSON line per rank count:
#   bench/ckpt.sh BUILD_DIR [tsr_ckpt options...]
# e.g. bench/ckpt.sh build --tokens 256. Files go to $TMPDIR (else /tmp). As root, Open MPI
# needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set here).
set -eu
b=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$b/bench/tsr_ckpt" "$@"
for n in 2 4; do
    mpiexec -n "$n" --oversubscribe "$b/bench/tsr_ckpt" "$@"
done
