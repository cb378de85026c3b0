#!/usr/bin/env bash
# Memory from the job's real limit (runtime/exec/kv_setup.h, base/sys.h):
#  - under a fake cgroup v2 limit of 256 MiB (TSR_PROC_ROOT/TSR_CGROUP_ROOT point the
#    readers at a fake tree) the host pool follows the limit (--stats bytes_capacity,
#    --verbose names memory.max) and a bulk job finishes every request;
#  - a limit too small for the workspace, or for one sequence of the full context, refuses
#    at start with one line, exit 1;
#  - a small --kv-memory that holds one full context but not the requests together
#    completes them all (preemption); one below a full context refuses at start, and runs
#    with a --max-context it does hold;
#  - under ulimit -v the start-up ends with a line and a non-zero exit (no OpenBLAS spin),
#    and under 1 GB generate works.
# args: $1 tessera binary, $2 repo root, $3 scratch dir
set -u
. "$(dirname "$0")/common.sh"
M=$((1 << 20))

# fake_tree NAME MEMORY_MAX MEMORY_CURRENT: a fake /proc and cgroup v2 tree; prints the
# env assignments that point tessera at it.
fake_tree() {
    local d=$TMP/fake_$1
    mkdir -p "$d/proc/self" "$d/cg/job/step"
    echo "0::/job/step" >"$d/proc/self/cgroup"
    printf 'MemTotal: 134217728 kB\nMemAvailable: 67108864 kB\n' >"$d/proc/meminfo"
    echo max >"$d/cg/job/memory.max"
    echo "$2" >"$d/cg/job/step/memory.max"
    echo "$3" >"$d/cg/job/step/memory.current"
    echo "TSR_PROC_ROOT=$d/proc TSR_CGROUP_ROOT=$d/cg"
}

# 24 requests of 64 tokens each.
IN=$TMP/in.jsonl
for i in $(seq 1 24); do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"Once upon a time %d","max_tokens":64,"temperature":0}}\n' "$i" "$i"
done >"$IN"

# ok_records FILE: records without an error
ok_records() { grep -c '"error":null' "$1"; }

unset SLURM_MEM_PER_NODE SLURM_MEM_PER_CPU SLURM_CPUS_ON_NODE

# --- a 256 MiB cgroup: the pool follows it, every request finishes ---------------------
# 128 sequences at once could fill more than the cgroup gives (the default pool is also
# capped at twice what the job's sequences can fill), so the cgroup is the bound here.
env $(fake_tree big 268435456 16777216) "$BIN" run --backend cpu --model "$MODEL" \
    --input "$IN" --output "$TMP/out.jsonl" --stats --verbose --quiet --threads 2 \
    --max-batch-seqs 128 2>"$TMP/big.err"
rc=$?
[ $rc -eq 0 ] || fail "256 MiB cgroup: exit $rc: $(tail -3 "$TMP/big.err")"
n=$(ok_records "$TMP/out.jsonl")
[ "$n" -eq 24 ] || fail "256 MiB cgroup: $n of 24 requests ok"
cap=$(sed -n 's/.*"bytes_capacity":\([0-9]*\).*/\1/p' "$TMP/big.err" | head -1)
echo "KV pool under a 256 MiB cgroup: ${cap:-?} bytes"
# half of 240 MiB (256 less 16 in use), less the prefill workspace
[ -n "${cap:-}" ] && [ "$cap" -le $((120 * M)) ] && [ "$cap" -gt $((100 * M)) ] ||
    fail "256 MiB cgroup: pool of ${cap:-?} bytes, expected between 100 and 120 MiB"
grep -q "KV pool: .*cgroup v2 memory.max" "$TMP/big.err" ||
    fail "--verbose does not name the cgroup bound: $(grep 'KV pool' "$TMP/big.err")"

# --- a limit that leaves no room for the workspace: refused at start -------------------
env $(fake_tree tiny 17825792 16777216) "$BIN" run --backend cpu --model "$MODEL" \
    --input "$IN" --output "$TMP/tiny.jsonl" --quiet 2>"$TMP/tiny.err"
rc=$?
[ $rc -eq 1 ] || fail "1 MiB left under the cgroup: exit $rc, want 1"
grep -q "memory.max.*leaves 1.0 MiB" "$TMP/tiny.err" ||
    fail "1 MiB left: no clear line: $(cat "$TMP/tiny.err")"
# one line of tessera's (a loaded machine may add an MPI library's own warnings)
[ "$(grep -c '^tessera' "$TMP/tiny.err")" -eq 1 ] ||
    fail "1 MiB left: not one line: $(cat "$TMP/tiny.err")"

# --- a pool smaller than one sequence of the full context: refused at start ------------
env $(fake_tree small 22544384 16777216) "$BIN" run --backend cpu --model "$MODEL" \
    --input "$IN" --output "$TMP/small.jsonl" --quiet 2>"$TMP/small.err"
rc=$?
[ $rc -eq 1 ] || fail "5.5 MiB left: exit $rc, want 1"
grep -q "one sequence of the full context (512 tokens).*memory.max" "$TMP/small.err" ||
    fail "5.5 MiB left: no clear line: $(cat "$TMP/small.err")"
[ -s "$TMP/small.jsonl" ] && fail "5.5 MiB left: records written"

# --- --kv-memory: one full context fits, the requests together do not ------------------
IN2=$TMP/long.jsonl
for i in $(seq 1 8); do
    printf '{"custom_id":"l%d","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"Once upon a time there was a little girl","max_tokens":300,"temperature":0}}\n' "$i"
done >"$IN2"
"$BIN" run --model "$MODEL" --input "$IN2" --output "$TMP/long.out.jsonl" --kv-memory 700K \
    --quiet --threads 2 2>"$TMP/long.err"
rc=$?
[ $rc -eq 0 ] || fail "--kv-memory 700K: exit $rc: $(cat "$TMP/long.err")"
n=$(ok_records "$TMP/long.out.jsonl")
[ "$n" -eq 8 ] || fail "--kv-memory 700K: $n of 8 requests ok"
grep -q '"prompt_too_long"' "$TMP/long.out.jsonl" && fail "--kv-memory 700K: prompt_too_long records"

# below one full context: refused at start with one line
"$BIN" run --model "$MODEL" --input "$IN2" --output "$TMP/short.jsonl" --kv-memory 256K \
    --quiet 2>"$TMP/short.err"
rc=$?
[ $rc -eq 1 ] || fail "--kv-memory 256K: exit $rc, want 1"
grep -q "one sequence of the full context (512 tokens) needs .*--kv-memory" "$TMP/short.err" ||
    fail "--kv-memory 256K: no clear line: $(cat "$TMP/short.err")"
# ... and with a context it holds, every request runs to the end of that context
"$BIN" run --model "$MODEL" --input "$IN2" --output "$TMP/ctx.jsonl" --kv-memory 256K \
    --max-context 160 --quiet --threads 2 2>"$TMP/ctx.err"
rc=$?
[ $rc -eq 0 ] || fail "--kv-memory 256K --max-context 160: exit $rc: $(cat "$TMP/ctx.err")"
n=$(ok_records "$TMP/ctx.jsonl")
[ "$n" -eq 8 ] || fail "--kv-memory 256K --max-context 160: $n of 8 requests ok"

# --- ulimit -v: a line and a non-zero exit, never a spin --------------------------------
if ldd "${TSR_TEST_BIN:-$BIN}" 2>/dev/null | grep -q libasan; then
    echo "skipped the ulimit -v checks: ASan needs an unlimited address space"
else
    for kb in 100000 200000 300000; do
        (ulimit -v $kb; timeout 60 "$BIN" generate --backend cpu --model "$MODEL" --prompt hi \
            --max-tokens 4 >/dev/null 2>"$TMP/ulimit.err")
        rc=$?
        echo "ulimit -v $kb: exit $rc: $(head -c 200 "$TMP/ulimit.err")"
        [ $rc -ne 124 ] || fail "ulimit -v $kb: still running after 60 s"
        if [ $rc -ne 0 ]; then
            [ -s "$TMP/ulimit.err" ] || fail "ulimit -v $kb: exit $rc without a message"
        fi
    done
    (ulimit -v 100000; timeout 60 "$BIN" generate --backend cpu --model "$MODEL" --prompt hi \
        >/dev/null 2>"$TMP/ulimit.err")
    rc=$?
    [ $rc -eq 1 ] || fail "ulimit -v 100000: exit $rc, want 1"
    grep -q "ulimit -v" "$TMP/ulimit.err" || fail "ulimit -v 100000: $(cat "$TMP/ulimit.err")"
    (ulimit -v 1000000; timeout 60 "$BIN" generate --backend cpu --model "$MODEL" --prompt hi \
        --max-tokens 4 >/dev/null 2>"$TMP/ulimit.err")
    rc=$?
    [ $rc -eq 0 ] || fail "ulimit -v 1000000: exit $rc: $(cat "$TMP/ulimit.err")"
fi

echo "$fails failed"
[ "$fails" -eq 0 ]
