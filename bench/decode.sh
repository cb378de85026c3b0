#!/usr/bin/env bash
# Prefill and decode speed of tessera against the machine's own ceilings.
#
# usage: bench/decode.sh [BUILD_DIR]    (default ./build; builds nothing)
#
# Runs tsr_membw (streaming-read GB/s at 1 and 2 threads), then `tessera bench --json
# --membw-mib 256` for each model/dtype at 1 and 2 threads, and tsr_sgemm at the model's
# biggest per-layer matmul (M = prompt tokens, N = hidden_dim, K = dim: w_gate/w_up) with
# the same threads (its best of 5 runs: a ceiling, like the best-of-5 bandwidth).
# The decode target is set against the read measured beside that decode (`--membw-mib`:
# 256 MiB read passes before each timed repeat and after the last, median pass, same
# threads): on a shared machine the neighbours move both figures together, and the median
# decode of a few seconds is set against a median read of the same moments. The
# standalone tsr_membw best is printed too ("% of best"), with no target (docs/perf.md).
# Prints one table; the raw JSON lines go to $BUILD_DIR/bench-decode.jsonl.
# Targets: decode >= 80 % of the paired streaming read at 1 thread; prefill >= 50 % of
# SGEMM.
# Environment: PROMPT (default 128), GEN (128), REPEAT (3), THREADS ("1 2"), PROBE_MIB (256),
# MODELS (whitespace-separated "SPEC|DTYPE" entries; the default is below).
set -uo pipefail

build=${1:-./build}
if ! build=$(cd "$build" 2>/dev/null && pwd); then
    echo "decode.sh: build directory '${1:-./build}' not found" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2 # model paths are relative to the repo root

tessera=$build/tessera
membw=$build/bench/tsr_membw
sgemm=$build/bench/tsr_sgemm
for exe in "$tessera" "$membw" "$sgemm"; do
    if [[ ! -x $exe ]]; then
        echo "decode.sh: $exe not built (cmake --build $build)" >&2
        exit 2
    fi
done

prompt=${PROMPT:-128}
gen=${GEN:-128}
repeat=${REPEAT:-3}
probe_mib=${PROBE_MIB:-256} # the paired read: 8x the 32 MiB L3 of these machines
threads_list=${THREADS:-1 2}
models=${MODELS:-"models/stories260K.bin|f32 synthetic:stories15M|f32 synthetic:stories15M|bf16
synthetic:stories110M|f32 synthetic:stories110M|bf16"}
log=$build/bench-decode.jsonl
: >"$log"

# jget KEY JSON: the value of a number or string key in a flat one-line JSON object.
jget() { sed -n "s/.*\"$1\":\"\\{0,1\\}\\([^,\"}]*\\).*/\\1/p" <<<"$2"; }
# calc EXPR: floating-point arithmetic through awk.
calc() { awk "BEGIN { printf \"%.1f\", $1 }"; }

# Last-level cache size: weights that fit it are not streamed from memory each token.
llc=$(sed -n 's/K$//p' /sys/devices/system/cpu/cpu0/cache/index3/size 2>/dev/null)
llc_bytes=$(( ${llc:-32768} * 1024 ))

start=$(date +%s)
load0=$(cut -d' ' -f1 /proc/loadavg)
bw_json=$("$membw") || { echo "decode.sh: tsr_membw failed" >&2; exit 1; }
echo "$bw_json" >>"$log"
declare -A sg # "M N K T" -> median GFLOP/s
rows=()
for entry in $models; do
    spec=${entry%|*}
    dtype=${entry##*|}
    for t in $threads_list; do
        if ! out=$("$tessera" bench --model "$spec" --dtype "$dtype" --threads "$t" \
                   --prompt-tokens "$prompt" --gen-tokens "$gen" --repeat "$repeat" --json \
                   --membw-mib "$probe_mib" 2>&1); then
            rows+=("$spec|$dtype|$t|FAILED: ${out//|/\/}")
            continue
        fi
        echo "$out" >>"$log"
        key="$prompt $(jget hidden_dim "$out") $(jget dim "$out") $t"
        if [[ -z ${sg[$key]:-} ]]; then
            read -r m n k _ <<<"$key"
            sj=$("$sgemm" --m "$m" --n "$n" --k "$k" --threads "$t") || sj=""
            echo "$sj" >>"$log"
            sg[$key]=$(jget gflops_best "$sj") # a ceiling: the best run
        fi
        pre="$(jget prefill_tok_s "$out")|$(jget prefill_gflops "$out")|${sg[$key]:-0}"
        dec="$(jget decode_tok_s "$out")|$(jget decode_gb_s "$out")|$(jget weight_bytes "$out")"
        dec="$dec|$(jget read_gb_s "$out")"
        rows+=("$spec|$dtype|$t|$pre|$dec")
    done
done

# Bandwidth again at the end: a neighbour's burst during the first run would otherwise
# understate the ceiling; the better of the two is the machine's.
bw_json2=$("$membw") || bw_json2=$bw_json
echo "$bw_json2" >>"$log"
declare -A bw
for t in $threads_list 2; do
    a=$(jget "read_gb_s_${t}t" "$bw_json")
    b=$(jget "read_gb_s_${t}t" "$bw_json2")
    if [[ -z $a ]]; then # more threads than tsr_membw measures: its 2-thread figure
        a=$(jget read_gb_s_2t "$bw_json")
        b=$(jget read_gb_s_2t "$bw_json2")
    fi
    bw[$t]=$(awk "BEGIN { print ($a > ${b:-0}) ? $a : ${b:-0} }")
done

echo "# tessera decode.sh: prompt $prompt tokens (one chunk), $gen decode tokens," \
    "median of $repeat"
echo "# standalone streaming read (tsr_membw, better of a run before and after; \"% of best\"):" \
    "${bw[1]:-?} GB/s at 1 thread," \
    "${bw[2]:-?} GB/s at 2 threads"
echo "# 1 thread by page size (first run): 4 KiB pages $(jget read4k_gb_s_1t "$bw_json") GB/s," \
    "2 MiB transparent huge pages $(jget read2m_gb_s_1t "$bw_json") GB/s" \
    "(tessera's weights are in huge pages; the ceiling is the better of the two)"
echo "# load average at the start: $load0 (other processes distort the 2-thread figures)"
echo "# SGEMM reference: best of 5 runs at M=$prompt N=hidden K=dim (the biggest per-layer" \
    "matmul), same threads"
echo "# paired read: ${probe_mib} MiB passes beside each decode (tessera bench --membw-mib)," \
    "median pass, same threads"
echo "# targets: decode >= 80 % of the paired read at 1 thread; prefill >= 50 % of SGEMM"
echo
fmt="| %-24s | %-5s | %7s | %13s | %15s | %16s | %13s | %12s | %11s | %9s | %18s | %9s |\n"
# shellcheck disable=SC2059
printf "$fmt" model dtype threads "prefill tok/s" "prefill GFLOP/s" "% of SGEMM (50)" \
    "SGEMM GFLOP/s" "decode tok/s" "decode GB/s" "read GB/s" "% of read (80 @1t)" \
    "% of best"
# shellcheck disable=SC2059
printf "$fmt" "---" "---" "---" "---" "---" "---" "---" "---" "---" "---" "---" "---"
for r in "${rows[@]}"; do
    IFS='|' read -r spec dtype t pre_tok pre_gf sgf dec_tok dec_gb wbytes rd_gb <<<"$r"
    if [[ $pre_tok == FAILED* ]]; then
        printf "| %-24s | %-5s | %7s | %s |\n" "$spec" "$dtype" "$t" "$pre_tok"
        continue
    fi
    pct_sg=$(calc "($sgf > 0) ? 100 * $pre_gf / $sgf : 0")
    pct_best=$(calc "100 * $dec_gb / ${bw[$t]}")
    pct_bw=$(calc "(${rd_gb:-0} > 0) ? 100 * $dec_gb / $rd_gb : 0")
    mark_sg=$(awk "BEGIN { print ($pct_sg < 50) ? \" MISS\" : \"\" }")
    mark_bw=""
    if awk "BEGIN { exit !($wbytes <= $llc_bytes) }"; then
        mark_bw=" (fits L3)"
    elif [[ $t == 1 ]]; then
        mark_bw=$(awk "BEGIN { print ($pct_bw < 80) ? \" MISS\" : \"\" }")
    fi
    # shellcheck disable=SC2059
    printf "$fmt" "$spec" "$dtype" "$t" "$(calc "$pre_tok")" "$(calc "$pre_gf")" \
        "$pct_sg$mark_sg" "$sgf" "$(calc "$dec_tok")" "$(calc "$dec_gb")" "$(calc "${rd_gb:-0}")" \
        "$pct_bw$mark_bw" "$pct_best"
done
echo
echo "# (fits L3): weights <= the $((llc_bytes >> 20)) MiB L3 need not come from memory, so the"
echo "# bandwidth % is not a memory figure there and no target applies."
echo "# % of best: decode GB/s over the standalone tsr_membw best above (the best of 10 short"
echo "# passes at the start and the end of this script, up to a minute from the decode); no"
echo "# target, shown for the record."
echo "# raw JSON: $log; elapsed $(($(date +%s) - start)) s"
