#!/bin/bash
# run_checkpoint.sh TESSERA ROOT MPIEXEC NP [layout flags...]
# `tessera run --checkpoint` under mpirun: a SIGTERM to one rank stops every rank at the same
# step, each rank writes its own FILE.rank<R>.h5 (its KV shard), the rerun resumes them and
# the records equal an uninterrupted multi-rank run's. Exit 77 (skipped) without HDF5.
set -u
bin=$1 root=$2 mpiexec=$3 np=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=$root/models/stories260K.bin
if "$bin" run --model "$model" --input /dev/null --output "$tmp/x.jsonl" \
    --checkpoint "$tmp/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "skipped: built without HDF5"
    exit 77
fi
in=$tmp/in.jsonl
for i in $(seq 0 59); do
    body='"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0.8, "seed": %d'
    printf '{"custom_id": "p-%02d", "url": "/v1/completions", "body": {'"$body"'}}\n' \
        "$i" $((80 + i % 40)) "$i"
done >"$in"
args=(run --model "$model" --input "$in" --max-batch-seqs 8 --threads 1 --progress-interval 0)
mpi=("$mpiexec" -n "$np" --oversubscribe)
texts() {
    sed -E 's/.*"custom_id":"([^"]*)".*"text":(".*"),"finish_reason".*/\1 \2/' "$1" | sort
}
fail=0
"${mpi[@]}" "$bin" "${args[@]}" --quiet --output "$tmp/ref.jsonl" "$@" ||
    { echo "FAIL: ref run"; exit 1; }
"${mpi[@]}" "$bin" "${args[@]}" --output "$tmp/a.jsonl" --checkpoint "$tmp/ck.h5" "$@" \
    2>"$tmp/a.err" &
pid=$!
k=0
while [ "$(cat "$tmp/a.jsonl" 2>/dev/null | wc -l)" -lt 10 ] && [ $k -lt 1000 ]; do
    sleep 0.01
    k=$((k + 1))
done
# One rank gets the signal; the collective stop takes the others along.
rank=$(pgrep -P "$pid" | tail -n 1)
[ -n "$rank" ] && kill -TERM "$rank"
wait "$pid"
rc=$?
[ $rc -ne 0 ] || { echo "FAIL: the stopped run exited 0"; fail=1; }
grep -q "checkpoint: [0-9]* in-flight requests saved to $tmp/ck.h5 (one file per rank)" \
    "$tmp/a.err" || { echo "FAIL: no checkpoint line: $(cat "$tmp/a.err")"; fail=1; }
for r in $(seq 0 $((np - 1))); do
    [ -f "$tmp/ck.rank$r.h5" ] || { echo "FAIL: no $tmp/ck.rank$r.h5"; fail=1; }
done
"${mpi[@]}" "$bin" "${args[@]}" --output "$tmp/a.jsonl" --checkpoint "$tmp/ck.h5" "$@" \
    2>"$tmp/a2.err" || { echo "FAIL: resume: $(cat "$tmp/a2.err")"; fail=1; }
grep -q "resuming [0-9]* in-flight requests" "$tmp/a2.err" ||
    { echo "FAIL: no resume line: $(cat "$tmp/a2.err")"; fail=1; }
ls "$tmp"/ck*.h5 >/dev/null 2>&1 && { echo "FAIL: checkpoint files left"; fail=1; }
texts "$tmp/ref.jsonl" >"$tmp/ref.txt"
texts "$tmp/a.jsonl" >"$tmp/a.txt"
if [ "$(wc -l <"$tmp/a.txt")" -ne 60 ] || ! cmp -s "$tmp/ref.txt" "$tmp/a.txt"; then
    echo "FAIL: resumed records differ from the uninterrupted run"
    diff "$tmp/ref.txt" "$tmp/a.txt" | head -6
    fail=1
fi
[ $fail -eq 0 ] && echo "ok: checkpoint/resume under -n $np $*"
exit $fail
