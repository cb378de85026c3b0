#!/usr/bin/env bash
# Perplexity per KV policy on held-out TinyStories-style text (bench/data/heldout.txt, written
# for this bench, never seen in training) with the bundled stories260K model: paged (the full
# cache) next to h2o and offload at budgets of 10 %, 20 % and 50 % of the sequence. Scoring
# is decode mode (one token per forward call), so eviction happens as in generation.
#
#   bench/quality.sh [BUILD_DIR] [PAIRS]
#     BUILD_DIR  default build; needs the tsr_quality target (bench/quality.c)
#     PAIRS      offload: rotary channel pairs per KV head for the speculation (default 2 of
#                the model's 4, i.e. half the channels; 4 makes it exact)
# Columns: mean NLL (nats/token), perplexity, KV peak (block pool), evictions, offload's
# bytes moved per token (host writes + fetches) and speculative recall of the exact top
# tokens.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
PAIRS=${2:-2}
BIN="$BUILD/bench/tsr_quality"
[ -x "$BIN" ] || { echo "quality.sh: $BIN not built (cmake --build $BUILD --target tsr_quality)" >&2; exit 1; }
ARGS=("$ROOT/models/stories260K.bin" "$ROOT/models/tok512.bin" "$ROOT/bench/data/heldout.txt")

printf '%-20s %6s %7s %7s %8s %11s %10s %12s %7s\n' policy budget tokens nll ppl kv_peak_kb \
    evictions moved_B/tok recall
row() {
    local label=$1 budget=$2
    shift 2
    local line
    line=$("$BIN" "${ARGS[@]}" "$@" 2>&1) || { printf '%-20s %6s FAILED: %s\n' "$label" "$budget" "$line"; return; }
    local f
    f() { sed -n "s/.*$1\([^ ,}]*\).*/\1/p" <<<"$line"; }
    local rec
    rec=$(f '"spec_recall":')
    [ -z "$rec" ] || [ "$rec" = "-1.0000" ] && rec=-
    printf '%-20s %6s %7s %7s %8s %11.1f %10s %12s %7s\n' "$label" "$budget" "$(f ' tokens=')" \
        "$(f ' nll=')" "$(f ' ppl=')" "$(awk -v b="$(f '"bytes_peak":')" 'BEGIN{print b/1024}')" \
        "$(f '"evictions":')" "$(f '"bytes_moved_per_token":')" "$rec"
}
row paged 100% paged
for b in 0.1 0.2 0.5; do
    pct="$(awk -v b=$b 'BEGIN{print b*100}')%"
    row h2o "$pct" h2o --budget $b
    row "h2o (materialize)" "$pct" h2o --budget $b --materialize
    row "offload (p=$PAIRS)" "$pct" offload --budget $b --pairs "$PAIRS" --recall
    row "offload (exact)" "$pct" offload --budget $b --pairs 4 --recall
done
