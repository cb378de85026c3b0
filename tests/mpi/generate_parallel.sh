#!/bin/bash
# generate_parallel.sh TESSERA ROOT MPIEXEC NP [layout flags...]
# `tessera generate` under mpirun with a tp x pp layout must print exactly the tokens of a
# single-process run, for every KV policy (h2o and offload with a budget that makes them
# evict and select), greedy and seeded sampling (with --pp the last stage samples and the
# other stages only advance their RNG and receive the token id). The prompt is long enough (> 12 tokens) for the prefill to go
# through the sgemm path, and the decode through the matvec path.
set -u
bin=$1 root=$2 mpiexec=$3 np=$4
shift 4
model=$root/models/stories260K.bin
prompt="Once upon a time, there was a little dog named Max who lived in a small house near the big forest with his friend"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for pol in "paged" "h2o --kv-budget 0.5" "offload --kv-budget 0.5 --offload-mode warmup" \
    "offload --kv-budget 0.5 --offload-mode skew" "paged --temperature 0.9 --top-p 0.95 --seed 7"; do
    # offload's skew mode runs warmup under --pp (docs/kv-cache.md): nothing to compare
    case "$pol $*" in *skew*--pp*) continue ;; esac
    # shellcheck disable=SC2086
    "$bin" generate --model "$model" --prompt "$prompt" --max-tokens 80 --temperature 0 \
        --kv-policy $pol >"$tmp/ref.txt" 2>"$tmp/ref.err" || { cat "$tmp/ref.err"; exit 1; }
    # shellcheck disable=SC2086
    "$mpiexec" -n "$np" --oversubscribe "$bin" generate --model "$model" --prompt "$prompt" \
        --max-tokens 80 --temperature 0 --kv-policy $pol "$@" >"$tmp/par.txt" 2>"$tmp/par.err"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAIL [$pol] $*: exit $rc"; cat "$tmp/par.err"; fail=1; continue
    fi
    if ! cmp -s "$tmp/ref.txt" "$tmp/par.txt"; then
        echo "FAIL [$pol] $*: tokens differ from one process"
        diff "$tmp/ref.txt" "$tmp/par.txt" | head -5; fail=1; continue
    fi
    if [ "$(wc -c <"$tmp/par.txt")" -lt 100 ]; then
        echo "FAIL [$pol] $*: output too short"; fail=1; continue
    fi
    echo "ok [$pol] -n $np $*"
done
exit $fail
