#!/usr/bin/env bash
# `tessera bench` runs and prints one JSON line with the figures bench/decode.sh reads.
# args: $1 tessera binary, $2 repo root, $3 scratch dir
set -u
BIN=$1 ROOT=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP"
fails=0 passes=0
check() { if [ "$1" = 0 ]; then echo "ok   $2"; passes=$((passes + 1)); else echo "FAIL $2"; fails=$((fails + 1)); fi; }

"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --json >"$TMP/out" 2>"$TMP/err"
rc=$?
ok=$rc
for key in prefill_tok_s prefill_samples decode_tok_s weight_bytes decode_bytes_per_token prefill_flops_per_token peak_rss_bytes weight_gb_s; do
    grep -q "\"$key\":" "$TMP/out" || { echo "missing $key"; ok=1; }
done
grep -q '"kv_memory":{"full_layers":5,"full_bytes_per_token":[0-9]*,"sliding_layers":0,' "$TMP/out" ||
    { echo "kv_memory: not 5 full layers"; ok=1; }
check "$ok" bench_json
# bytes per weight by dtype: 4 for f32; q8_0 below bf16's 2 (stories260K keeps wo and
# w_down in bf16: their blocks would cross the tp reduction parts)
grep -q '"bytes_per_weight":4.0000,' "$TMP/out"
check $? bench_bytes_per_weight_f32
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --dtype q8_0 --json >"$TMP/outq" 2>"$TMP/err"
bpw=$(grep -o '"bytes_per_weight":[0-9.]*' "$TMP/outq" | cut -d: -f2)
[ -n "$bpw" ] && awk -v b="$bpw" 'BEGIN { exit !(b > 1.0625 && b < 2) }'
check $? bench_bytes_per_weight_q8_0
# GPT-OSS: KV bytes per token by layer type (one sliding layer of window 8, one full; K and V
# of 2 KV heads of 16 f32 values and a position: 260 bytes a layer)
"$BIN" bench --model "$ROOT/tests/data/arch/gptoss_f32" --prompt-tokens 16 --gen-tokens 2 --repeat 1 --json >"$TMP/out8" 2>"$TMP/err"
[ $? -eq 0 ] && grep -q '"kv_memory":{"full_layers":1,"full_bytes_per_token":260,"sliding_layers":1,"sliding_bytes_per_token":260,"window":8},' "$TMP/out8"
check $? bench_kv_memory_layer_types
"$BIN" bench --model "synthetic:tiny" --prompt-tokens 16 --gen-tokens 2 --repeat 1 --json >"$TMP/out2" 2>"$TMP/err"
check $? bench_synthetic
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 0 >"$TMP/out3" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ]
check $? bench_bad_arg
# The dense cache (one buffer) instead of the paged pool of generate/run (the default).
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --kv dense --json >"$TMP/out4" 2>"$TMP/err"
[ $? -eq 0 ] && grep -q '"decode_tok_s":' "$TMP/out4"
check $? bench_kv_dense
"$BIN" bench --model "$ROOT/models/stories260K.bin" --kv ring >"$TMP/out5" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "^tessera bench: --kv 'ring': expected paged, dense or offload" "$TMP/err"
check $? bench_bad_kv
# The offload policy (skew at 20 %): its stats, with the copy streams' counts and the hidden
# fraction (-1 where the backend times no events: every CPU backend).
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 48 --gen-tokens 8 --repeat 1 --kv offload --json >"$TMP/out9" 2>"$TMP/err"
[ $? -eq 0 ] && grep -q '"kv_stats":{"policy":"offload",' "$TMP/out9" &&
    grep -q '"copy_prefetches":[0-9]*,"copy_prefetch_used":' "$TMP/out9" &&
    grep -q '"copy_hidden":-1.0000}' "$TMP/out9"
check $? bench_kv_offload
# --membw-mib: a streaming read beside the decode, reported with the decode's share of it.
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 2 --membw-mib 4 --json >"$TMP/out6" 2>"$TMP/err"
ok=$?
for key in membw_bytes read_passes read_gb_s read_best_gb_s decode_read_ratio; do
    grep -q "\"$key\":" "$TMP/out6" || { echo "missing $key"; ok=1; }
done
grep -q '"membw_bytes":4194304,"read_passes":9,' "$TMP/out6" || { echo "wrong probe size or passes"; ok=1; }
grep -q '"read_gb_s":' "$TMP/out" && { echo "probe keys without --membw-mib"; ok=1; }
check "$ok" bench_membw
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --membw-mib 4 >"$TMP/out7" 2>"$TMP/err"
[ $? -eq 0 ] && grep -q "^read    4 MiB streaming read beside the decode: .* GB/s (median of 6 passes; best .*); decode at .* % of it$" "$TMP/out7"
check $? bench_membw_text
"$BIN" bench --model "$ROOT/models/stories260K.bin" --membw-mib -1 >"$TMP/out8" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "membw-mib" "$TMP/err"
check $? bench_bad_membw
# A probe buffer that cannot fit is refused up front (it once ended in the OOM killer).
"$BIN" bench --model "$ROOT/models/stories260K.bin" --membw-mib 1048576 >"$TMP/out9" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "more than half of the .* MiB of memory available" "$TMP/err" && [ ! -s "$TMP/out9" ]
check $? bench_membw_too_big
# A mixture of experts (the tiny GPT-OSS, 4 experts, 2 per token): a decode token reads only
# the routed experts' bytes, so active_weight_bytes < weight_bytes and the decode bytes
# count the active ones.
"$BIN" bench --model "$ROOT/tests/data/arch/gptoss_mxfp4" --prompt-tokens 8 --gen-tokens 2 --repeat 1 --json >"$TMP/out10" 2>"$TMP/err"
ok=$?
python3 - "$TMP/out10" <<'PY' || ok=1
import json, sys
r = json.load(open(sys.argv[1]))
w, a, d = r["weight_bytes"], r["active_weight_bytes"], r["decode_bytes_per_token"]
assert 0 < a < w and d >= a, (w, a, d)
PY
check "$ok" bench_moe_active_bytes
# --batch B: B sequences decoded together (the batched decode of tessera run). Sequence 0's
# greedy tokens are batch 1's (every sequence has the same prompt, and a row's products do
# not depend on the batch), its tokens per second count all B sequences, and a decode
# step's bytes are shared by B.
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 6 --repeat 1 --batch 3 --json >"$TMP/out11" 2>"$TMP/err"
ok=$?
python3 - "$TMP/out" "$TMP/out11" <<'PY' || ok=1
import json, sys
one, three = (json.load(open(f)) for f in sys.argv[1:3])
assert three["batch"] == 3 and one["batch"] == 1, (one["batch"], three["batch"])
assert three["decode_bytes_per_token"] < one["decode_bytes_per_token"], "bytes not shared"
# weight_gb_s divides a step's weight bytes by B: active_weight_bytes * tok/s / B, within the
# printed rounding (3 decimals: near 1 % of the small figures of a slow or fenced run)
for r, B in ((one, 1), (three, 3)):
    want = r["active_weight_bytes"] * r["decode_tok_s"] / B / 1e9
    assert abs(r["weight_gb_s"] - want) <= 6e-4 + 1e-3 * want, (B, r["weight_gb_s"], want)
PY
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --batch 3 --json >"$TMP/out12" 2>"$TMP/err"
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --json >"$TMP/out13" 2>"$TMP/err"
[ "$(grep -o '"last_token":[0-9]*' "$TMP/out12")" = "$(grep -o '"last_token":[0-9]*' "$TMP/out13")" ] || { echo "batch 3 changed sequence 0's tokens"; ok=1; }
check "$ok" bench_batch
"$BIN" bench --model "$ROOT/models/stories260K.bin" --batch 2 --kv dense >"$TMP/out14" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--batch 2: only with --kv paged" "$TMP/err"
check $? bench_batch_kv_dense
# --kv-dtype bf16: the KV bytes of decode_bytes_per_token halve (2 bytes a value), and the
# batched decode on 2 threads (its sequences' attention side by side, BF16 rows read as they
# are) gives sequence 0 the tokens of one sequence on one thread.
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --kv-dtype bf16 --threads 1 --json >"$TMP/out15" 2>"$TMP/err"
ok=$?
"$BIN" bench --model "$ROOT/models/stories260K.bin" --prompt-tokens 8 --gen-tokens 4 --repeat 1 --kv-dtype bf16 --threads 2 --batch 4 --json >"$TMP/out16" 2>"$TMP/err" || ok=1
python3 - "$TMP/out" "$TMP/out15" "$TMP/out16" <<'PY' || ok=1
import json, sys
f32, bf, bf4 = (json.load(open(f)) for f in sys.argv[1:4])
assert f32["kv_dtype"] == "f32" and bf["kv_dtype"] == "bf16", (f32["kv_dtype"], bf["kv_dtype"])
n, m = bf["prompt_tokens"], bf["gen_tokens"]
kv16 = 2 * bf["n_layers"] * bf["n_kv_heads"] * bf["head_dim"] * 2 * (n + (m + 1) / 2)
# out is --prompt-tokens 8 --gen-tokens 4 too (f32): its KV bytes are twice bf16's
assert (f32["prompt_tokens"], f32["gen_tokens"]) == (n, m)
assert abs((f32["decode_bytes_per_token"] - bf["decode_bytes_per_token"]) - kv16) <= 1, (f32["decode_bytes_per_token"], bf["decode_bytes_per_token"], kv16)
assert bf4["last_token"] == bf["last_token"], (bf4["last_token"], bf["last_token"])
PY
check "$ok" bench_kv_dtype
"$BIN" bench --model "$ROOT/models/stories260K.bin" --kv-dtype f16 >"$TMP/out17" 2>"$TMP/err"
[ $? -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--kv-dtype f16: unknown" "$TMP/err"
check $? bench_bad_kv_dtype
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
