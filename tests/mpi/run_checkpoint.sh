#!/bin/bash
# run_checkpoint.sh TESSERA ROOT MPIEXEC NP [flags...] [--resume NP2 [flags2...]]
# `tessera run --checkpoint` under mpirun: a SIGTERM to one rank stops every rank at the same
# step, all ranks write one checkpoint file together (parallel HDF5, each its part of the
# KV), and the rerun resumes it, on the same layout or on NP2 ranks with flags2 (NP2 = 1: a
# plain process, no launcher), giving the records of an uninterrupted run on the resume's
# layout. The flags are the layout and the KV policy (--kv-policy ...). The stop is sent
# once 5 records are written. Exit 77 (skipped) without HDF5.
set -u
bin=$1 root=$2 mpiexec=$3 np=$4
shift 4
flags=()
while [ $# -gt 0 ] && [ "$1" != --resume ]; do flags+=("$1"); shift; done
np2=$np
flags2=("${flags[@]}")
if [ $# -gt 0 ]; then
    np2=$2
    shift 2
    flags2=("$@")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=$root/models/stories260K.bin
if "$bin" run --model "$model" --input /dev/null --output "$tmp/x.jsonl" \
    --checkpoint "$tmp/x.h5" 2>&1 | grep -q "this build has no HDF5"; then
    echo "skipped: built without HDF5"
    exit 77
fi
in=$tmp/in.jsonl
for i in $(seq 0 39); do
    body='"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0.8, "seed": %d'
    printf '{"custom_id": "p-%02d", "url": "/v1/completions", "body": {'"$body"'}}\n' \
        "$i" $((60 + i % 40)) "$i"
done >"$in"
args=(run --model "$model" --input "$in" --max-batch-seqs 8 --threads 1 --progress-interval 0)
# launch NP: the command prefix for NP ranks (1: none)
launch() {
    if [ "$1" -eq 1 ]; then echo ""; else echo "$mpiexec -n $1 --oversubscribe"; fi
}
texts() {
    sed -E 's/.*"custom_id":"([^"]*)".*"text":(".*"),"finish_reason".*/\1 \2/' "$1" | sort
}
fail=0
# shellcheck disable=SC2046
$(launch "$np2") "$bin" "${args[@]}" --quiet --output "$tmp/ref.jsonl" "${flags2[@]}" ||
    { echo "FAIL: ref run"; exit 1; }
"$mpiexec" -n "$np" --oversubscribe "$bin" "${args[@]}" --output "$tmp/a.jsonl" \
    --checkpoint "$tmp/ck.h5" "${flags[@]}" 2>"$tmp/a.err" &
pid=$!
k=0
while [ "$(cat "$tmp/a.jsonl" 2>/dev/null | wc -l)" -lt 5 ] && [ $k -lt 1000 ]; do
    sleep 0.01
    k=$((k + 1))
done
# One rank gets the signal; the collective stop takes the others along.
rank=$(pgrep -P "$pid" | tail -n 1)
[ -n "$rank" ] && kill -TERM "$rank"
wait "$pid"
rc=$?
[ $rc -ne 0 ] || { echo "FAIL: the stopped run exited 0"; fail=1; }
grep -q "checkpoint: [1-9][0-9]* in-flight requests saved to $tmp/ck.h5$" "$tmp/a.err" ||
    { echo "FAIL: no checkpoint line: $(cat "$tmp/a.err")"; fail=1; }
[ -f "$tmp/ck.h5" ] || { echo "FAIL: no $tmp/ck.h5"; fail=1; }
ls "$tmp"/ck.rank*.h5 "$tmp"/ck.h5.tmp >/dev/null 2>&1 && { echo "FAIL: other files left"; fail=1; }
# shellcheck disable=SC2046
$(launch "$np2") "$bin" "${args[@]}" --output "$tmp/a.jsonl" --checkpoint "$tmp/ck.h5" \
    "${flags2[@]}" 2>"$tmp/a2.err" || { echo "FAIL: resume: $(cat "$tmp/a2.err")"; fail=1; }
grep -q "resuming [1-9][0-9]* in-flight requests" "$tmp/a2.err" ||
    { echo "FAIL: no resume line: $(cat "$tmp/a2.err")"; fail=1; }
ls "$tmp"/ck*.h5 >/dev/null 2>&1 && { echo "FAIL: checkpoint file left"; fail=1; }
texts "$tmp/ref.jsonl" >"$tmp/ref.txt"
texts "$tmp/a.jsonl" >"$tmp/a.txt"
if [ "$(wc -l <"$tmp/a.txt")" -ne 40 ] || ! cmp -s "$tmp/ref.txt" "$tmp/a.txt"; then
    echo "FAIL: resumed records differ from the uninterrupted run"
    diff "$tmp/ref.txt" "$tmp/a.txt" | head -6
    fail=1
fi
[ $fail -eq 0 ] && echo "ok: checkpoint under -n $np ${flags[*]}, resumed under -n $np2 ${flags2[*]}"
exit $fail
