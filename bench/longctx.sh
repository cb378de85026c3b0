#!/usr/bin/env bash
# Long-context prefill per KV policy: 8K, 32K and 128K tokens on a synthetic tiny model
# (max_position_embeddings 131072), printing time and peak RSS per run, then the
# --h2o-scores=materialize baseline, which must fail cleanly where n^2 scores exceed memory.
#
#   bench/longctx.sh [BUILD_DIR] [SIZES] [LAYERS]
#     BUILD_DIR  default build; needs the tsr_longctx target (bench/longctx.c)
#     SIZES      default "8192 32768 131072"
#     LAYERS     default 1 (paged attention is O(n^2): 128K with 5 layers takes ~40 min on
#                2 cores; 1 layer keeps the table to minutes and shows the same scaling)
# Budgets: h2o, offload, snapkv and streaming keep 10 % of the sequence (--kv-budget 0.1).
# POLICIES (default "paged h2o offload snapkv streaming") picks the rows.
set -euo pipefail
BUILD=${1:-build}
SIZES=${2:-"8192 32768 131072"}
LAYERS=${3:-1}
BIN="$BUILD/bench/tsr_longctx"
[ -x "$BIN" ] || { echo "longctx.sh: $BIN not built (cmake --build $BUILD --target tsr_longctx)" >&2; exit 1; }
SPEC="synthetic:tiny,ctx=131072,layers=$LAYERS"
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-"paged h2o offload snapkv streaming"}

printf '%-22s %8s %10s %12s %12s %10s\n' policy n seconds peak_rss_mb kv_peak_mb evictions
row() {
    local line
    line=$("$BIN" "$SPEC" "$@" --threads "$THREADS" 2>/dev/null || true)
    local pol n secs rss kvp ev
    pol=$(sed -n 's/^policy=\([^ ]*\).*/\1/p' <<<"$line")
    n=$(sed -n 's/.* n=\([0-9]*\).*/\1/p' <<<"$line")
    rss=$(sed -n 's/.*peak_rss_mb=\([0-9.]*\).*/\1/p' <<<"$line")
    if grep -q FAILED <<<"$line"; then
        secs=$(sed -n 's/.*FAILED (\([^)]*\)).*/FAILED: \1/p' <<<"$line")
        printf '%-22s %8s %10s %12s\n' "$pol" "$n" "$secs" "$rss"
        return
    fi
    secs=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<<"$line")
    kvp=$(sed -n 's/.*"bytes_peak":\([0-9]*\).*/\1/p' <<<"$line")
    ev=$(sed -n 's/.*"evictions":\([0-9]*\).*/\1/p' <<<"$line")
    printf '%-22s %8s %10s %12s %12.1f %10s\n' "$pol" "$n" "$secs" "$rss" \
        "$(awk -v b="$kvp" 'BEGIN{print b/1048576}')" "$ev"
}
for n in $SIZES; do
    for pol in $POLICIES; do
        if [ "$pol" = paged ]; then row paged "$n"; else row "$pol" "$n" --budget 0.1; fi
    done
done
# The original H2O: one n x n prefill call with the full score matrix (with the h2o rows).
case " $POLICIES " in
*" h2o "*) for n in $SIZES; do row h2o "$n" --budget 0.1 --materialize; done ;;
esac
