#!/usr/bin/env bash
# Bulk-generation throughput of `tessera run` against --max-batch-seqs.
#
# usage: bench/throughput.sh [BUILD_DIR]    (default ./build; builds nothing)
#
# Writes N greedy requests (one prompt, MAX_TOKENS each) and runs them with
# --max-batch-seqs 1, 8, 32 and 64 (BATCHES), reading requests/s and tokens/s from the
# --metrics JSON of each run. Prints one Markdown table (docs/jobs.md records it).
# Environment: MODEL (default synthetic:stories15M, random weights with the real shapes),
# TOKENIZER (models/tokenizer.bin, the matching 32000 vocab), N (64), MAX_TOKENS (32),
# THREADS (2), BATCHES ("1 8 32 64").
set -uo pipefail

build=${1:-./build}
if ! build=$(cd "$build" 2>/dev/null && pwd); then
    echo "throughput.sh: build directory '${1:-./build}' not found" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
tessera=$build/tessera
if [[ ! -x $tessera ]]; then
    echo "throughput.sh: $tessera not built (cmake --build $build)" >&2
    exit 2
fi
MODEL=${MODEL:-synthetic:stories15M}
TOKENIZER=${TOKENIZER:-models/tokenizer.bin}
N=${N:-64}
MAX_TOKENS=${MAX_TOKENS:-32}
THREADS=${THREADS:-2}
BATCHES=${BATCHES:-"1 8 32 64"}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$N"); do
    printf '{"custom_id": "b%d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time, there was a little", "max_tokens": %d, "temperature": 0}}\n' \
        "$i" "$MAX_TOKENS"
done >"$work/in.jsonl"

# the value of "key" inside the top-level object "section" of a metrics file
field() { tr -d ' \t\n' <"$1" | grep -o "\"$2\":{[^}]*" | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }

echo "model $MODEL, $N requests x $MAX_TOKENS tokens (greedy), $THREADS threads, $(date +%F)"
echo
echo "| --max-batch-seqs | requests/s | output tok/s | total tok/s | TPOT p50 (ms) | speed-up |"
echo "|-----------------:|-----------:|-------------:|------------:|--------------:|---------:|"
base=
for bs in $BATCHES; do
    rm -f "$work"/out.jsonl*
    tokens=$((bs > 512 ? bs : 512))
    if ! "$tessera" run --model "$MODEL" --tokenizer "$TOKENIZER" --input "$work/in.jsonl" \
        --output "$work/out.jsonl" --metrics "$work/m.json" --max-batch-seqs "$bs" \
        --max-batch-tokens "$tokens" --threads "$THREADS" --quiet; then
        echo "throughput.sh: tessera run failed at --max-batch-seqs $bs" >&2
        exit 1
    fi
    rps=$(field "$work/m.json" throughput requests_per_s)
    otps=$(field "$work/m.json" throughput output_tokens_per_s)
    ttps=$(field "$work/m.json" throughput total_tokens_per_s)
    tpot=$(tr -d ' \t\n' <"$work/m.json" | grep -o '"tpot":{[^}]*' | grep -o '"p50":[0-9.e+-]*' | cut -d: -f2)
    [[ -z $base ]] && base=$otps
    awk -v bs="$bs" -v r="$rps" -v o="$otps" -v t="$ttps" -v p="$tpot" -v b="$base" \
        'BEGIN { printf "| %16d | %10.2f | %12.1f | %11.1f | %13.2f | %7.2fx |\n", bs, r, o, t, p * 1000, o / b }'
done
