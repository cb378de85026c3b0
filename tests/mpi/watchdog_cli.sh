#!/bin/bash
# watchdog_cli.sh TESSERA ROOT MPIEXEC stop|kill [layout flags...]
# `tessera run` on 2 ranks, mid-job (some records written): rank 1 gets SIGSTOP (with
# --comm-timeout 10) or SIGKILL. The job must end with a non-zero exit within 30 s of the
# signal, with tessera's own line from rank 0 (one line only): the stuck operation and the stopped rank, or
# the dead rank. An outer timeout makes a hang a failure, never a stuck test.
set -u
bin=$1 root=$2 mpiexec=$3 mode=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon a time %d","max_tokens":200,"temperature":0}}\n' "$i" "$i"
done >"$tmp/in.jsonl"
marker="wd$$.$RANDOM"
timeout -s KILL 120 "$mpiexec" -n 2 --oversubscribe -x TSR_WD_MARKER="$marker" "$bin" run \
    --model "$root/models/stories260K.bin" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" \
    --quiet --comm-timeout 10 "$@" >"$tmp/log" 2>&1 &
job=$!
# rank 1's pid: the process with our marker and rank 1 in its environment
pid=""
for _ in $(seq 1 600); do
    if [ -z "$pid" ]; then
        for e in /proc/[0-9]*/environ; do
            env=$( { tr '\0' '\n' <"$e"; } 2>/dev/null) || continue
            case "$env" in *"TSR_WD_MARKER=$marker"*) ;; *) continue ;; esac
            if printf '%s\n' "$env" | grep -qE '^(OMPI_COMM_WORLD_RANK|PMIX_RANK|PMI_RANK)=1$'; then
                p=${e#/proc/}
                pid=${p%/environ}
                break
            fi
        done
    fi
    # mid-job: a few records are out
    if [ -n "$pid" ] && [ -f "$tmp/out.jsonl" ] && [ "$(wc -l <"$tmp/out.jsonl")" -ge 3 ]; then break; fi
    if ! kill -0 "$job" 2>/dev/null; then break; fi
    sleep 0.1
done
if [ -z "$pid" ] || ! kill -0 "$job" 2>/dev/null; then
    echo "FAIL: the job did not reach mid-job (rank 1 pid '${pid}')"; cat "$tmp/log"; exit 1
fi
records=$(wc -l <"$tmp/out.jsonl")
t0=$(date +%s.%N)
if [ "$mode" = stop ]; then kill -STOP "$pid"; else kill -KILL "$pid"; fi
wait "$job"
rc=$?
t1=$(date +%s.%N)
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
cat "$tmp/log"
echo "watchdog_cli: SIG$(echo "$mode" | tr a-z A-Z) of rank 1 (pid $pid) after $records records: exit $rc after $took s"
if [ "$mode" = stop ]; then
    want='^tessera: rank 0: no progress for 1[0-9] s in [a-z_ ]+ \((tp|pp|world) group(, waiting for rank 1)?\); rank 1 \(pid [0-9]+\) is stopped; aborting$'
else
    want='^tessera: rank 0: rank 1 \(pid [0-9]+\) died \(killed, crashed or aborted\) while this rank waited in [a-z_ ]+ \((tp|pp|world) group\); aborting$'
fi
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; fail=1; }
grep -qE "$want" "$tmp/log" || { echo "FAIL: no line /$want/"; fail=1; }
# one line only: no other rank reports rank 0's abort as a death
if grep -qE '^tessera: rank [1-9][0-9]*: ' "$tmp/log"; then echo "FAIL: a second tessera line"; fail=1; fi
awk -v t="$took" 'BEGIN { exit !(t <= 30) }' || { echo "FAIL: took $took s (limit 30)"; fail=1; }
[ "$fail" -eq 0 ] && echo "ok"
exit $fail
