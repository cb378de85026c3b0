#!/bin/bash
# kv_dist.sh TEST_EXE MPIEXEC NP POLICY: the one-process checksum of the job's tokens, then
# the same job on NP ranks must reproduce it (test_kv_dist.c checks the rest).
set -u
exe=$1 mpiexec=$2 np=$3 policy=$4
one=$("$exe" "$policy") || { echo "$one"; exit 1; }
echo "$one"
sum=$(printf '%s\n' "$one" | sed -nE 's/.*checksum ([0-9a-f]+).*/\1/p')
[ -n "$sum" ] || { echo "kv_dist.sh: no checksum"; exit 1; }
"$mpiexec" -n "$np" --oversubscribe -x TSR_EXPECT_SUM="$sum" "$exe" "$policy"
