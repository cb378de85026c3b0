#!/bin/bash
# kv_dist.sh TEST_EXE MPIEXEC NP POLICY [PP [inject]]: the one-process checksum of the job's
# tokens (with the same injected shortages), then the same job on NP ranks in PP stages must
# reproduce it (test_kv_dist.c checks the rest).
set -u
exe=$1 mpiexec=$2 np=$3 policy=$4 pp=${5:-1} inject=${6:-}
one=$("$exe" "$policy" 1 $inject) || { echo "$one"; exit 1; }
echo "$one"
sum=$(printf '%s\n' "$one" | sed -nE 's/.*checksum ([0-9a-f]+).*/\1/p')
[ -n "$sum" ] || { echo "kv_dist.sh: no checksum"; exit 1; }
"$mpiexec" -n "$np" --oversubscribe -x TSR_EXPECT_SUM="$sum" "$exe" "$policy" "$pp" $inject
