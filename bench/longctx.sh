#!/usr/bin/env bash
# Long-context prefill per KV policy (every policy the registry knows: tsr_longctx
# --policies): 8K, 32K and 128K tokens on a synthetic model, printing time, peak RSS, the KV
# pool's peak and, on a device backend, the peak device memory per run; on the CPU then the
# --h2o-scores=materialize baseline, which must fail cleanly where n^2 scores exceed memory.
#
#   bench/longctx.sh [BUILD_DIR] [SIZES] [LAYERS]
#     BUILD_DIR  default build; needs the tsr_longctx target (bench/longctx.c)
#     SIZES      default "8192 32768 131072"
#     LAYERS     default 1 (paged attention is O(n^2): 128K with 5 layers takes ~40 min on
#                2 cores; 1 layer keeps the table to minutes and shows the same scaling)
# Environment: BACKEND (cpu; cuda on a GPU), MODEL (tiny: synthetic:tiny; any synthetic
# preset, e.g. llama-3.1-8b, gets ,ctx=131072,layers=LAYERS), THREADS (2), BUDGET (0.1: h2o
# and offload keep 10 % of the sequence; paged ignores it), RUN_TIMEOUT (seconds per run,
# 0: none; a run past it is a row "FAILED: timeout"), DEADLINE (epoch seconds, instead of
# RUN_TIMEOUT: each run gets the time left over the runs left, so a fast policy leaves its
# share to the slower ones after it), MATERIALIZE (1 on the CPU, 0
# elsewhere), POLICIES (default: every registered policy).
set -euo pipefail
BUILD=${1:-build}
SIZES=${2:-"8192 32768 131072"}
LAYERS=${3:-1}
BIN="$BUILD/bench/tsr_longctx"
[ -x "$BIN" ] || { echo "longctx.sh: $BIN not built (cmake --build $BUILD --target tsr_longctx)" >&2; exit 1; }
BACKEND=${BACKEND:-cpu}
MODEL=${MODEL:-tiny}
SPEC="synthetic:$MODEL,ctx=131072,layers=$LAYERS"
THREADS=${THREADS:-2}
BUDGET=${BUDGET:-0.1}
RUN_TIMEOUT=${RUN_TIMEOUT:-0}
if [ "$BACKEND" = cpu ]; then MATERIALIZE=${MATERIALIZE:-1}; else MATERIALIZE=${MATERIALIZE:-0}; fi
if [ -n "${POLICIES:-}" ]; then read -ra POLICIES <<<"$POLICIES" # a subset: POLICIES="snapkv streaming"
else mapfile -t POLICIES < <("$BIN" --policies); fi
[ ${#POLICIES[@]} -gt 0 ] || { echo "longctx.sh: $BIN --policies listed none" >&2; exit 1; }

echo "# $SPEC on $BACKEND, budget $BUDGET (policies: ${POLICIES[*]})"
printf '%-22s %8s %10s %12s %12s %10s %14s\n' policy n seconds peak_rss_mb kv_peak_mb evictions \
    device_peak_mb
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
read -ra SIZE_LIST <<<"$SIZES"
RUNS_LEFT=$((${#SIZE_LIST[@]} * (${#POLICIES[@]} + (MATERIALIZE == 1 ? 1 : 0))))
row() {
    local line rc=0 pre=() prog
    if [ -n "${DEADLINE:-}" ]; then
        RUN_TIMEOUT=$(((DEADLINE - $(date +%s)) / (RUNS_LEFT > 0 ? RUNS_LEFT : 1)))
        [ "$RUN_TIMEOUT" -ge 5 ] || RUN_TIMEOUT=5
    fi
    RUNS_LEFT=$((RUNS_LEFT - 1))
    [ "$RUN_TIMEOUT" != 0 ] && command -v timeout >/dev/null && pre=(timeout -k 5 "$RUN_TIMEOUT")
    line=$("${pre[@]}" "$BIN" "$SPEC" "$@" --threads "$THREADS" --backend "$BACKEND" \
        --progress 2 2>"$ERR") || rc=$?
    local pol n secs rss kvp ev dpk
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        # how far it got: the last progress line (tokens, seconds, device peak so far)
        prog=$(grep '^progress' "$ERR" | tail -n 1 |
            sed -n 's/progress tokens=\([0-9]*\) seconds=\([0-9.]*\) device_peak_mb=\([0-9.]*\)/: \1 tokens in \2 s, device peak \3 MB so far/p' || true)
        printf '%-22s %8s %10s\n' "$1" "$2" "FAILED: timeout ${RUN_TIMEOUT}s${prog}"
        return
    fi
    pol=$(sed -n 's/^policy=\([^ ]*\).*/\1/p' <<<"$line")
    n=$(sed -n 's/.* n=\([0-9]*\).*/\1/p' <<<"$line")
    rss=$(sed -n 's/.*peak_rss_mb=\([0-9.]*\).*/\1/p' <<<"$line")
    dpk=$(sed -n 's/.*device_peak_mb=\([0-9.]*\).*/\1/p' <<<"$line")
    if [ -z "$pol" ]; then
        printf '%-22s %8s %10s\n' "$1" "$2" "FAILED: exit $rc, no output"
        return
    fi
    if grep -q FAILED <<<"$line"; then
        secs=$(sed -n 's/.*FAILED (\([^)]*\)).*/FAILED: \1/p' <<<"$line")
        printf '%-22s %8s %10s %12s\n' "$pol" "$n" "$secs" "$rss"
        return
    fi
    secs=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<<"$line")
    kvp=$(sed -n 's/.*"bytes_peak":\([0-9]*\).*/\1/p' <<<"$line")
    ev=$(sed -n 's/.*"evictions":\([0-9]*\).*/\1/p' <<<"$line")
    printf '%-22s %8s %10s %12s %12.1f %10s %14s\n' "$pol" "$n" "$secs" "$rss" \
        "$(awk -v b="$kvp" 'BEGIN{print b/1048576}')" "$ev" "${dpk:--}"
}
for n in $SIZES; do
    for p in "${POLICIES[@]}"; do
        row "$p" "$n" --budget "$BUDGET"
    done
done
# The original H2O: one n x n prefill call with the full score matrix.
if [ "$MATERIALIZE" = 1 ]; then
    for n in $SIZES; do
        row h2o "$n" --budget "$BUDGET" --materialize
    done
fi
