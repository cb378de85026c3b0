#!/bin/bash
# placement.sh TESSERA ROOT MPIEXEC: 4 CPU ranks on a synthetic 2-package, 4-NUMA-node
# machine (TSR_TOPOLOGY) get one NUMA node each, in rank order, with disjoint cores, and
# --verbose reports it; the tokens are those of one process.
set -u
bin=$1 root=$2 mpiexec=$3
topo="pack:2 numa:2 core:4 pu:1"
args=(generate --model "$root/models/stories260K.bin" --prompt "Once upon a time"
      --max-tokens 16 --temperature 0)
ref=$("$bin" "${args[@]}" 2>/dev/null) || exit 1
out=$(TSR_TOPOLOGY=$topo "$mpiexec" -n 4 --oversubscribe -x TSR_TOPOLOGY "$bin" "${args[@]}" \
      --tp 2 --pp 2 --verbose 2>"${TMPDIR:-/tmp}/placement.$$") || {
    cat "${TMPDIR:-/tmp}/placement.$$"; exit 1; }
log=$(cat "${TMPDIR:-/tmp}/placement.$$"); rm -f "${TMPDIR:-/tmp}/placement.$$"
echo "$log" | grep "NUMA"
fail=0
for r in 0 1 2 3; do
    c0=$((r * 4)) c1=$((r * 4 + 3))
    echo "$log" | grep -q "rank $r: local rank $r: NUMA node $r (os $r, package $((r / 2))), cores $c0-$c1" ||
        { echo "FAIL: rank $r is not on NUMA node $r with cores $c0-$c1"; fail=1; }
done
[ "$out" = "$ref" ] || { echo "FAIL: tokens differ from one process"; fail=1; }
exit $fail
