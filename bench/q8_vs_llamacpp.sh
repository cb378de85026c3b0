#!/usr/bin/env bash
# Q8_0 (or 4-bit) decode and prefill, tessera against llama.cpp, paired on one file in one
# sitting.
#
# usage: LLAMA_BENCH=/path/to/llama-bench bench/q8_vs_llamacpp.sh [BUILD_DIR]
#
# llama.cpp is not part of tessera: build it natively on the machine under test (its own
# instructions, -DGGML_NATIVE=ON) and give its llama-bench binary in LLAMA_BENCH. The file
# both run is a random-weight Q8_0 GGUF of the stories110M shape written by
# tools/make_q8_gguf.py (into $BUILD_DIR unless Q8_GGUF names one): tessera loads its Q8_0
# blocks as they are (kernels/cpu/quant_q8.h). For each thread count, the rounds alternate
# (tessera, llama.cpp, tessera, llama.cpp, ...) so that a shared machine's load falls on
# both; each side's figure is its median round. Printed beside them: the CPU model, the
# streaming read bandwidth (tsr_membw, best of 5; and the median read `tessera bench
# --membw-mib` measured beside its decode), tessera's decode GB/s and its share of that read.
# Environment: THREADS ("1 2"), ROUNDS (3), GEN (64), PROMPT (128), SHAPE (stories110M),
# Q8_GGUF or GGUF (an existing file to use instead), KV_DTYPE (tessera's --kv-dtype: unset,
# its CPU default f32; bf16 stores 2 bytes a value as llama.cpp's default F16 cache does). The 4-bit path: GGUF=models/SmolLM2-
# 135M-Instruct.Q4_1.gguf (tessera computes its Q4_1 matrices natively, kernels/cpu/quant_q4.h,
# as llama.cpp does: Q4_1 weights, activations quantized per 32-block with their sums).
#
# Batched decode: BATCH=64 (and LLAMA_BATCHED_BENCH=/path/to/llama-batched-bench, built as
# above; LLAMA_BENCH is then not needed) decodes BATCH sequences of PROMPT prompt tokens and
# GEN decode tokens together: `tessera bench --batch BATCH` against `llama-batched-bench
# -npp PROMPT -ntg GEN -npl BATCH` (a context of BATCH * (PROMPT + GEN) cells), rounds
# alternating as above. Columns: decode tok/s over all sequences (llama.cpp's S_TG) and
# prefill tok/s (S_PP), each side's median round.
# LLAMA_ARGS: more options for llama-bench, printed with the results (e.g. "--repack 0",
# which keeps llama.cpp off its AMX kernels: on the AMX Xeon of docs/perf.md they stopped on
# SIGILL; llama-batched-bench takes the same from its environment, LLAMA_ARG_REPACK=0).
set -uo pipefail

build=${1:-./build}
if ! build=$(cd "$build" 2>/dev/null && pwd); then
    echo "q8_vs_llamacpp.sh: build directory '${1:-./build}' not found" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
batch=${BATCH:-}
if [[ -n $batch && ! $batch =~ ^[1-9][0-9]*$ ]]; then
    echo "q8_vs_llamacpp.sh: BATCH must be a positive integer, not '$batch'" >&2
    exit 2
fi
kvd=${KV_DTYPE:-}
kv_opt=()
case $kvd in
    '') ;;
    f32 | bf16 | q8 | fp8) kv_opt=(--kv-dtype "$kvd") ;;
    *) echo "q8_vs_llamacpp.sh: KV_DTYPE must be f32, bf16, q8 or fp8, not '$kvd'" >&2
       exit 2 ;;
esac
lb=${LLAMA_BENCH:-}
llama_args=${LLAMA_ARGS:-}
lbb=${LLAMA_BATCHED_BENCH:-}
if [[ -n $batch ]]; then
    if [[ -z $lbb || ! -x $lbb ]]; then
        echo "q8_vs_llamacpp.sh: BATCH set: set LLAMA_BATCHED_BENCH to a llama-batched-bench" \
             "binary built on this machine" >&2
        exit 2
    fi
elif [[ -z $lb || ! -x $lb ]]; then
    echo "q8_vs_llamacpp.sh: set LLAMA_BENCH to a llama-bench binary built on this machine" >&2
    exit 2
fi
tessera=$build/tessera
membw=$build/bench/tsr_membw
threads=${THREADS:-"1 2"} rounds=${ROUNDS:-3} gen=${GEN:-64} prompt=${PROMPT:-128}
shape=${SHAPE:-stories110M}
gg=${GGUF:-${Q8_GGUF:-$build/rand-$shape-q8_0.gguf}}
if [[ ! -f $gg ]]; then
    python3 tools/make_q8_gguf.py "$shape" "$gg" || exit 1
fi

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
jget() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d$1)"; }

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "cpu      $cpu ($(nproc) CPUs visible; load average $(cut -d' ' -f1-3 /proc/loadavg))"
mb=$("$membw" --mib 512 --repeat 5 --max-threads 2)
echo "read     tsr_membw best of 5: $(echo "$mb" | jget "['read_gb_s_1t']") GB/s 1 thread," \
     "$(echo "$mb" | jget "['read_gb_s_2t']") GB/s 2 threads"
echo "file     $gg ($(stat -L -c %s "$gg") bytes)"
echo "kv       tessera ${kvd:-f32 (its CPU default)}, llama.cpp f16 (its default)"
[[ -n $llama_args ]] && echo "llama    options: $llama_args"
[[ -n ${LLAMA_ARG_REPACK:-} ]] && echo "llama    LLAMA_ARG_REPACK=$LLAMA_ARG_REPACK"
if [[ -n $batch ]]; then
    echo "batched  $batch sequences, prompt $prompt, decode $gen tokens each"
    printf '%-3s %-10s %-10s %-8s %-10s %-10s %-8s\n' thr tes_dec lcpp_S_TG ratio tes_pre \
        lcpp_S_PP ratio
    for t in $threads; do
        : >"$build/q8_tes_dec"; : >"$build/q8_lc_dec"; : >"$build/q8_tes_pre"; : >"$build/q8_lc_pre"
        for ((r = 0; r < rounds; r++)); do
            j=$("$tessera" bench --model "$gg" --threads "$t" --prompt-tokens "$prompt" \
                --gen-tokens "$gen" --batch "$batch" "${kv_opt[@]}" --repeat 1 --json 2>/dev/null |
                tail -1)
            echo "$j" | jget "['decode_tok_s']" >>"$build/q8_tes_dec"
            echo "$j" | jget "['prefill_tok_s']" >>"$build/q8_tes_pre"
            l=$("$lbb" -m "$gg" -c $((batch * (prompt + gen))) -b 2048 -ub 512 -npp "$prompt" \
                -ntg "$gen" -npl "$batch" -t "$t" --output-format jsonl 2>/dev/null | grep speed_tg | tail -1)
            echo "$l" | jget "['speed_tg']" >>"$build/q8_lc_dec"
            echo "$l" | jget "['speed_pp']" >>"$build/q8_lc_pre"
        done
        td=$(median <"$build/q8_tes_dec") ld=$(median <"$build/q8_lc_dec")
        tp=$(median <"$build/q8_tes_pre") lp=$(median <"$build/q8_lc_pre")
        awk -v t="$t" -v td="$td" -v ld="$ld" -v tp="$tp" -v lp="$lp" \
            'BEGIN {printf "%-3s %-10.1f %-10.1f %-8.2f %-10.1f %-10.1f %-8.2f\n",
                    t, td, ld, td / ld, tp, lp, tp / lp}'
    done
    rm -f "$build"/q8_tes_* "$build"/q8_lc_*
    exit 0
fi
printf '%-3s %-10s %-10s %-8s %-10s %-10s %-8s %-9s %-9s %-6s\n' thr tes_dec lcpp_dec ratio \
    tes_pre lcpp_pre ratio tes_GB/s read_GB/s share
for t in $threads; do
    : >"$build/q8_tes_dec" ; : >"$build/q8_lc_dec"; : >"$build/q8_tes_pre"; : >"$build/q8_lc_pre"
    : >"$build/q8_tes_gbs"; : >"$build/q8_tes_read"
    for ((r = 0; r < rounds; r++)); do
        j=$("$tessera" bench --model "$gg" --threads "$t" --prompt-tokens "$prompt" \
            --gen-tokens "$gen" "${kv_opt[@]}" --repeat 1 --membw-mib 256 --json 2>/dev/null |
            tail -1)
        echo "$j" | jget "['decode_tok_s']" >>"$build/q8_tes_dec"
        echo "$j" | jget "['prefill_tok_s']" >>"$build/q8_tes_pre"
        echo "$j" | jget "['decode_gb_s']" >>"$build/q8_tes_gbs"
        echo "$j" | jget "['read_gb_s']" >>"$build/q8_tes_read"
        l=$("$lb" -m "$gg" -t "$t" -p "$prompt" -n "$gen" -r 1 $llama_args -o jsonl 2>/dev/null)
        echo "$l" | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(('dec' if d['n_gen'] else 'pre'), d['avg_ts'])" >"$build/q8_lc_round"
        grep '^dec' "$build/q8_lc_round" | cut -d' ' -f2 >>"$build/q8_lc_dec"
        grep '^pre' "$build/q8_lc_round" | cut -d' ' -f2 >>"$build/q8_lc_pre"
    done
    td=$(median <"$build/q8_tes_dec") ld=$(median <"$build/q8_lc_dec")
    tp=$(median <"$build/q8_tes_pre") lp=$(median <"$build/q8_lc_pre")
    tg=$(median <"$build/q8_tes_gbs") rd=$(median <"$build/q8_tes_read")
    awk -v t="$t" -v td="$td" -v ld="$ld" -v tp="$tp" -v lp="$lp" -v tg="$tg" -v rd="$rd" \
        'BEGIN {printf "%-3s %-10.1f %-10.1f %-8.2f %-10.1f %-10.1f %-8.2f %-9.2f %-9.2f %-5.1f%%\n",
                t, td, ld, td / ld, tp, lp, tp / lp, tg, rd, 100 * tg / rd}'
done
rm -f "$build"/q8_tes_* "$build"/q8_lc_*
