#!/usr/bin/env bash
# Tokens/s and bytes communicated per token of `tessera generate` for 1, 2 and 4 ranks,
# next to the analytic communication volume of the implementation (docs/scaling.md).
#
# usage: bench/scaling.sh [BUILD_DIR]    (default ./build; builds nothing)
# Environment: MODELS (default "models/stories260K.bin synthetic:stories15M"), GEN (64),
# LAYOUTS (default "1x1 2x1 1x2 2x2 4x1", tp x pp), THREADS per rank (1), MPIEXEC (mpirun).
# Of the default layouts, those a model cannot take (tp must divide its heads and divide or
# be a multiple of its KV heads, pp at most its layers) are skipped with a note line; a
# LAYOUTS given in the environment is run as asked.
# Figures are printed, not asserted. With more ranks than cores the ranks share cores, so
# tokens/s then measures oversubscription as much as scaling; bytes/token do not depend on
# the machine.
#
# Analytic bytes sent per decode token, whole job, f32 activations (d = dim, L = layers,
# V = vocab, t = tp, p = pp):
#   TP  2 L all-reduces of d floats, each an ordered chain ((t-1) sends) plus a binomial
#       broadcast of the result ((t-1) receives): 2 L * 2 (t-1) * 4 d
#   PP  each of the t ranks of a stage sends its activation on: (p-1) * t * 4 d,
#       plus the last stage's sampled token id (int32) broadcast to the other stages:
#       (p-1) * t * 4 (it used to send the logits, (p-1) * t * 4 V)
set -uo pipefail

build=${1:-./build}
if ! build=$(cd "$build" 2>/dev/null && pwd); then
    echo "scaling.sh: build directory '${1:-./build}' not found" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
tessera=$build/tessera
[[ -x $tessera ]] || { echo "scaling.sh: $tessera not built" >&2; exit 2; }
MPIEXEC=${MPIEXEC:-mpirun}
command -v "$MPIEXEC" >/dev/null || { echo "scaling.sh: $MPIEXEC not found" >&2; exit 2; }
MODELS=${MODELS:-"models/stories260K.bin synthetic:stories15M"}
GEN=${GEN:-64}
default_layouts=0
[[ -z ${LAYOUTS:-} ]] && default_layouts=1
LAYOUTS=${LAYOUTS:-"1x1 2x1 1x2 2x2 4x1"}
THREADS=${THREADS:-1}
export OMPI_MCA_rmaps_base_oversubscribe=1
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
prompt="Once upon a time, there was a little dog named Max who lived near the forest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-24s %5s %3s %3s %10s %14s %14s %8s\n' model ranks tp pp "decode/s" \
    "bytes/tok" "analytic" "ratio"
for model in $MODELS; do
    tok=()
    # synthetic models have no tokenizer file: the Llama-2 one has their 32000 vocab
    [[ $model == synthetic:* ]] && tok=(--tokenizer models/tokenizer.bin)
    # dim, layers, heads, KV heads, vocab from the model's own description (--verbose)
    "$tessera" generate --model "$model" "${tok[@]}" --prompt "$prompt" --max-tokens 1 --verbose \
        >/dev/null 2>"$tmp/v.txt" || { cat "$tmp/v.txt"; continue; }
    read -r d L H KV V < <(sed -nE \
        's/.*dim ([0-9]+), ([0-9]+) layers, ([0-9]+) heads \(([0-9]+) kv\), vocab ([0-9]+).*/\1 \2 \3 \4 \5/p' \
        "$tmp/v.txt" | head -1)
    for lay in $LAYOUTS; do
        t=${lay%x*} p=${lay#*x} n=$((t * p))
        why=
        if ((H % t != 0)); then why="--tp $t does not divide the $H heads"
        elif ((KV % t != 0 && t % KV != 0)); then why="--tp $t does not fit the $KV KV heads"
        elif ((p > L)); then why="--pp $p exceeds the $L layers"
        fi
        if ((default_layouts)) && [[ -n $why ]]; then
            printf '%-24s %5d %3d %3d  skipped (default list): %s\n' "$model" "$n" "$t" "$p" "$why"
            continue
        fi
        "$MPIEXEC" -n "$n" "$tessera" generate --model "$model" "${tok[@]}" --prompt "$prompt" \
            --max-tokens "$GEN" --temperature 0 --threads "$THREADS" --tp "$t" --pp "$p" \
            --stats >/dev/null 2>"$tmp/e.txt"
        rc=$?
        if [[ $rc -ne 0 ]]; then
            printf '%-24s %5d %3d %3d  failed (exit %d): %s\n' "$model" "$n" "$t" "$p" "$rc" \
                "$(grep -m1 tessera "$tmp/e.txt")"
            continue
        fi
        tps=$(sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' \
            "$tmp/e.txt")
        bpt=$(sed -nE 's/.*"decode":\{[^}]*"bytes_per_token":([0-9.]+).*/\1/p' "$tmp/e.txt")
        an=$(( 2 * L * 2 * (t - 1) * 4 * d + (p - 1) * t * 4 * d + (p - 1) * t * 4 ))
        ratio=$(awk -v a="$an" -v b="$bpt" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "-" }')
        printf '%-24s %5d %3d %3d %10s %14s %14d %8s\n' "$model" "$n" "$t" "$p" "$tps" "$bpt" \
            "$an" "$ratio"
    done
done
