#!/bin/bash
# run_parallel.sh TESSERA ROOT MPIEXEC NP [layout flags...]
# `tessera run` (continuous batching of 30 requests) under mpirun: rank 0 alone writes the
# output, and every record equals the single-process run's record for the same request.
# Steps carry up to 6 sequences (checked in the metrics), so with --pp P and the default
# --micro-batches (P) the pipeline really cuts steps into several micro-batches.
set -u
bin=$1 root=$2 mpiexec=$3 np=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(run --model "$root/models/stories260K.bin" --input "$root/examples/prompts.jsonl"
      --quiet --max-batch-seqs 6 --max-batch-tokens 64)
# Each record's id and text, sorted by id (records come in completion order).
texts() {
    sed -E 's/.*"custom_id":"([^"]*)".*"text":(".*"),"finish_reason".*/\1 \2/' "$1" | sort
}
fail=0
for pol in "paged" "h2o --kv-budget 0.5" "offload --kv-budget 0.5 --offload-mode warmup"; do
    rm -f "$tmp"/*.jsonl
    # shellcheck disable=SC2086
    "$bin" "${args[@]}" --kv-policy $pol --output "$tmp/ref.jsonl" || exit 1
    # shellcheck disable=SC2086
    "$mpiexec" -n "$np" --oversubscribe "$bin" "${args[@]}" --kv-policy $pol \
        --output "$tmp/par.jsonl" --metrics "$tmp/m.json" "$@" || { echo "FAIL: exit $?"; exit 1; }
    texts "$tmp/ref.jsonl" >"$tmp/ref.txt"
    texts "$tmp/par.jsonl" >"$tmp/par.txt"
    n=$(wc -l <"$tmp/par.txt")
    running=$(sed -nE 's/.*"max_running":[[:space:]]*([0-9]+).*/\1/p' "$tmp/m.json")
    if [ "${running:-0}" -lt 2 ]; then
        echo "FAIL [$pol]: no step held several sequences (max_running ${running:-?})"
        fail=1
        continue
    fi
    if [ "$n" -ne 30 ] || ! cmp -s "$tmp/ref.txt" "$tmp/par.txt"; then
        echo "FAIL [$pol]: $n records; differences from one process:"
        diff "$tmp/ref.txt" "$tmp/par.txt" | head -6
        fail=1
        continue
    fi
    echo "ok [$pol]: 30 records equal to one process (-n $np $*)"
done
exit $fail
