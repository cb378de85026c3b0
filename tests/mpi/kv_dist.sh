#!/bin/bash
# kv_dist.sh [--backend NAME] TEST_EXE MPIEXEC NP POLICY [PP [inject]]: the one-process
# checksum of the job's tokens (with the same injected shortages) on the plain CPU, then the
# same job on NP ranks in PP stages on NAME (default cpu) must reproduce it
# (test_kv_dist.c checks the rest). On cpu-fenced that also asserts the fenced device's
# tokens are the CPU's. 77 (skipped) when this build lacks the backend.
set -u
backend=()
if [ "${1:-}" = --backend ]; then
    backend=(--backend "$2")
    shift 2
fi
exe=$1 mpiexec=$2 np=$3 policy=$4 pp=${5:-1} inject=${6:-}
one=$("$exe" "$policy" 1 $inject) || { echo "$one"; exit 1; }
echo "$one"
sum=$(printf '%s\n' "$one" | sed -nE 's/.*checksum ([0-9a-f]+).*/\1/p')
[ -n "$sum" ] || { echo "kv_dist.sh: no checksum"; exit 1; }
"$mpiexec" -n "$np" --oversubscribe -x TSR_EXPECT_SUM="$sum" "$exe" "${backend[@]}" "$policy" \
    "$pp" $inject
