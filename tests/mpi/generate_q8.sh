#!/bin/bash
# generate_q8.sh TESSERA ROOT MPIEXEC
# `tessera generate --dtype q8_0` (weights quantized at load after the shard cut) must print
# one process's tokens with tp = 2 and with pp = 2: every matrix Q8_0 (head_dim 32, hidden
# 256), and with wo kept in BF16 (head_dim 16: its head parts are not whole 32-column
# blocks). The model line must name q8_0 (the quantization took place). Then --dtype fp8,
# and a Q8_0 GGUF, whose matrices load as they are. The layers in 4 bits (--dtype q4_1,
# embedding and classifier Q8_0) likewise, and Q4_K, Q5_K and Q6_K GGUFs computed natively.
set -u
bin=$1 root=$2 mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="Once upon a time, there was a little dog named Max who lived in a small house"
common=(--tokenizer "$root/models/tok512.bin" --prompt "$prompt" --max-tokens 48 --temperature 0
        --chunk 8)
fail=0
for hd in 32 16; do
    cat >"$tmp/m$hd.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "hidden_size": $((4 * hd)), "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 512, "max_position_embeddings": 512, "torch_dtype": "float32",
 "tie_word_embeddings": false, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
EOF
    model=synthetic:$tmp/m$hd.json
  for dt in q8_0 q4_1; do
    "$bin" generate --model "$model" "${common[@]}" --dtype $dt --verbose >"$tmp/ref.txt" \
        2>"$tmp/ref.err" || { cat "$tmp/ref.err"; exit 1; }
    if [ "$(wc -c <"$tmp/ref.txt")" -lt 40 ]; then echo "FAIL [hd $hd $dt]: output too short"; fail=1; fi
    grep -aq "vocab 512, $dt;" "$tmp/ref.err" || { echo "FAIL [hd $hd]: not $dt"; fail=1; }
    for lay in "--tp 2 --pp 1" "--tp 1 --pp 2"; do
        # shellcheck disable=SC2086
        "$mpiexec" -n 2 --oversubscribe "$bin" generate --model "$model" "${common[@]}" \
            --dtype $dt $lay --threads 1 >"$tmp/out.txt" 2>"$tmp/out.err" ||
            { echo "FAIL [hd $hd $dt, $lay]:"; cat "$tmp/out.err"; fail=1; continue; }
        if ! cmp -s "$tmp/ref.txt" "$tmp/out.txt"; then
            echo "FAIL [hd $hd $dt, $lay]: tokens differ from one process"
            diff "$tmp/ref.txt" "$tmp/out.txt" | head -5; fail=1
        fi
    done
  done
done
# --dtype fp8 (runtime/model/fp8.h): per-channel FP8 after the shard cut, then Q8_0 on the
# CPU (said once per process), the same tokens on every layout.
model=synthetic:$tmp/m32.json
"$bin" generate --model "$model" "${common[@]}" --dtype fp8 >"$tmp/ref.txt" 2>"$tmp/ref.err" ||
    { cat "$tmp/ref.err"; exit 1; }
grep -aq "FP8 weights run as Q8_0 (the cpu backend computes no FP8)" "$tmp/ref.err" || { echo "FAIL [fp8]: no conversion line"; fail=1; }
for lay in "--tp 2 --pp 1" "--tp 1 --pp 2"; do
    # shellcheck disable=SC2086
    "$mpiexec" -n 2 --oversubscribe "$bin" generate --model "$model" "${common[@]}" \
        --dtype fp8 $lay --threads 1 >"$tmp/out.txt" 2>"$tmp/out.err" ||
        { echo "FAIL [fp8, $lay]:"; cat "$tmp/out.err"; fail=1; continue; }
    cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL [fp8, $lay]: tokens differ"; fail=1; }
done
# A Q8_0 GGUF (tools/make_q8_testdata.py) loads as it is and is cut into shards as Q8_0.
model=$root/tests/data/q8/tiny_q8_0.gguf
"$bin" generate --model "$model" "${common[@]}" >"$tmp/ref.txt" 2>"$tmp/ref.err" ||
    { cat "$tmp/ref.err"; exit 1; }
for lay in "--tp 2 --pp 1" "--tp 1 --pp 2"; do
    # shellcheck disable=SC2086
    "$mpiexec" -n 2 --oversubscribe "$bin" generate --model "$model" "${common[@]}" $lay \
        --threads 1 >"$tmp/out.txt" 2>"$tmp/out.err" ||
        { echo "FAIL [gguf, $lay]:"; cat "$tmp/out.err"; fail=1; continue; }
    cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL [gguf, $lay]: tokens differ"; fail=1; }
done
# A Q4_K GGUF (tools/make_q4k_testdata.py: head_dim 256, hidden 512 over 2 heads, so wo and
# w_down are cut on 256-column super-blocks) runs natively and gives one process's tokens.
# tiny_q4k_hd64.gguf: head_dim 64, so wo and w_down run as Q4_1 (said at load); the same.
q4k=(--prompt "$prompt" --max-tokens 24 --temperature 0 --chunk 8)
for f in tiny_q4k tiny_q4k_hd64; do
  model=$root/tests/data/q4k/$f.gguf
  "$bin" generate --model "$model" "${q4k[@]}" --verbose >"$tmp/ref.txt" 2>"$tmp/ref.err" ||
      { cat "$tmp/ref.err"; exit 1; }
  grep -aq "q4_k;" "$tmp/ref.err" || { echo "FAIL [$f]: not q4_k"; fail=1; }
  if [ $f = tiny_q4k_hd64 ] && ! grep -aq "2 Q4_K matrices run as Q4_1" "$tmp/ref.err"; then
      echo "FAIL [$f]: no Q4_1 line"; fail=1
  fi
  for lay in "--tp 2 --pp 1" "--tp 1 --pp 2"; do
    [ $f = tiny_q4k_hd64 ] && [ "$lay" = "--tp 1 --pp 2" ] && continue # 1 layer
    # shellcheck disable=SC2086
    "$mpiexec" -n 2 --oversubscribe "$bin" generate --model "$model" "${q4k[@]}" $lay \
        --threads 1 >"$tmp/out.txt" 2>"$tmp/out.err" ||
        { echo "FAIL [$f, $lay]:"; cat "$tmp/out.err"; fail=1; continue; }
    cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL [$f, $lay]: tokens differ"; fail=1; }
  done
done
# Q6_K, Q5_K, Q5_0, Q5_1, Q3_K and IQ4_NL GGUFs (tools/make_q6k_testdata.py,
# make_q5k_testdata.py, make_q3k_testdata.py): a Q4_K_M-like mix (attn_v, ffn_down and the
# output Q6_K), an all-Q6_K one, a Q5_K_M-like one whose wo and w_down parts are 64 and 128
# columns, one of width 384 mixed of Q5_0 and Q5_1 (run as Q5_K), Q8_0 and Q6_K, and a
# Q3_K_M-like one (Q3_K run as Q6_K, IQ4_NL as Q8_0): the 32-column blocks are cut as
# Q8_0's, the same tokens.
for f in q6k/tiny_q6k q6k/tiny_q6k_hd64 q5k/tiny_q5k q5k/tiny_q5_01 q3k/tiny_q3k; do
  model=$root/tests/data/$f.gguf
  "$bin" generate --model "$model" "${q4k[@]}" --verbose >"$tmp/ref.txt" 2>"$tmp/ref.err" ||
      { cat "$tmp/ref.err"; exit 1; }
  for lay in "--tp 2 --pp 1" "--tp 1 --pp 2"; do
    [ $f != q6k/tiny_q6k ] && [ "$lay" = "--tp 1 --pp 2" ] && continue # 1 layer
    # shellcheck disable=SC2086
    "$mpiexec" -n 2 --oversubscribe "$bin" generate --model "$model" "${q4k[@]}" $lay \
        --threads 1 >"$tmp/out.txt" 2>"$tmp/out.err" ||
        { echo "FAIL [$f, $lay]:"; cat "$tmp/out.err"; fail=1; continue; }
    cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL [$f, $lay]: tokens differ"; fail=1; }
  done
done
[ $fail = 0 ] && echo "q8_0: tp 2 and pp 2 print one process's tokens"
exit $fail
