#!/usr/bin/env bash
# Fidelity per KV policy on held-out TinyStories-style text (bench/data/heldout.txt, written
# for this bench, never seen in training) with the bundled stories260K model: every policy
# the registry knows (tsr_quality --list-policies, so a policy added later appears without
# editing this script) at budgets of 10 %, 20 % and 50 % of the sequence, next to the full
# cache (paged). Each row runs the full cache and the policy side by side on the same tokens
# (runtime/eval/fidelity.h); scoring is decode mode (one token per forward call), so eviction
# happens as in generation.
#
#   bench/quality.sh [BUILD_DIR] [PAIRS] [PROMPT]
#     BUILD_DIR  default build; needs the tsr_quality target (bench/quality.c)
#     PAIRS      extra offload rows per budget speculating on PAIRS channel pairs per KV
#                head, in skew and in warmup mode (default 2 of the model's 4, i.e. half the
#                channels). The `offload warmup` row is warmup with its default 4
#                pairs: every channel of this model's 8-channel heads, so its speculation is
#                exact here; `offload skew` is InfiniGen's 20 % of the channels (2 of 8)
#     PROMPT     the first PROMPT tokens of each story go in as one prefill chunk, a prompt
#                (default 64; snapkv's selection at a prompt's end is measured only with
#                one), the rest one token per call; 0: every position in decode mode;
#                "both": every row twice, prompt mode (64) and decode-only (0), side by side
# Columns: mean NLL (nats/token), perplexity, top-1 agreement of the greedy next token with
# the full cache, KL(full || policy) of the next-token distributions (nats, mean over
# positions), KV peak (block pool), evictions, bytes moved per token (host writes + fetches)
# and offload's speculative recall of the exact top tokens.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
PAIRS=${2:-2}
PROMPT=${3:-64}
BIN="$BUILD/bench/tsr_quality"
[ -x "$BIN" ] || { echo "quality.sh: $BIN not built (cmake --build $BUILD --target tsr_quality)" >&2; exit 1; }
ARGS=("$ROOT/models/stories260K.bin" "$ROOT/models/tok512.bin" "$ROOT/bench/data/heldout.txt")

printf '%-31s %6s %6s %7s %7s %9s %8s %11s %10s %12s %7s\n' policy budget tokens nll ppl \
    agreement kl kv_peak_kb evictions moved_B/tok recall
row() {
    local label=$1 budget=$2
    shift 2
    local line
    if [ "$PROMPT" = both ]; then
        PROMPT=64 row "$label [prompt]" "$budget" "$@"
        PROMPT=0 row "$label [decode]" "$budget" "$@"
        return
    fi
    line=$("$BIN" "${ARGS[@]}" "$@" --prompt "$PROMPT" 2>&1) || { printf '%-20s %6s FAILED: %s\n' "$label" "$budget" "$line"; return; }
    local f
    f() { sed -n "s/.*$1\([^ ,}]*\).*/\1/p" <<<"$line"; }
    local rec moved
    rec=$(f '"spec_recall":')
    [ -z "$rec" ] || [ "$rec" = "-1.0000" ] && rec=-
    moved=$(f '"bytes_moved_per_token":')
    [ -z "$moved" ] || [ "$moved" = "0.0" ] || [ "$moved" = "0.0000" ] && moved=-
    [ "$moved" = - ] || moved=$(printf '%.0f' "$moved")
    printf '%-31s %6s %6s %7s %7s %9s %8s %11.1f %10s %12s %7s\n' "$label" "$budget" \
        "$(f ' tokens=')" "$(f ' nll=')" "$(f ' ppl=')" "$(f ' agreement=')" "$(f ' kl=')" \
        "$(awk -v b="$(f '"bytes_peak":')" 'BEGIN{print b/1024}')" "$(f '"evictions":')" \
        "$moved" "${rec:--}"
}
mapfile -t POLICIES < <("$BIN" --list-policies)
row "paged (full cache)" 100% paged
for b in 0.1 0.2 0.5; do
    pct="$(awk -v b=$b 'BEGIN{print b*100}')%"
    for p in "${POLICIES[@]}"; do
        [ "$p" = paged ] && continue
        # offload's default is skew (its own row below): this row keeps warmup's exact
        # speculation on this model (the fetch budget alone)
        if [ "$p" = offload ]; then row "offload warmup" "$pct" offload --budget $b \
            --offload-mode warmup --recall; else row "$p" "$pct" "$p" --budget $b --recall; fi
        if [ "$p" = offload ]; then
            row "offload skew" "$pct" offload --budget $b --offload-mode skew --recall
            row "offload skew (p=$PAIRS)" "$pct" offload --budget $b --pairs "$PAIRS" \
                --offload-mode skew --recall
            row "offload warmup (p=$PAIRS)" "$pct" offload --budget $b --pairs "$PAIRS" \
                --offload-mode warmup --recall
        fi
    done
done
