#!/bin/bash
# generate_gqa.sh TESSERA ROOT MPIEXEC
# `tessera generate` on small synthetic GQA models (4 query heads, 1 or 2 KV heads) must
# print exactly the tokens of one process with tp = 2 and tp = 4, for every KV policy. With
# tp > n_kv_heads each KV head is replicated on the ranks that share its query group, so a
# per-KV-head decision made from a rank's own query heads (offload's channel choice) would
# differ from one process. h2o, snapkv, streaming and offload run with budgets that evict
# and select (checked in the single-process --stats line), prefill in chunks so that
# offload also selects during the prefill.
set -u
bin=$1 root=$2 mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="Once upon a time, there was a little dog named Max who lived in a small house near the big forest with his friend"
common=(--tokenizer "$root/models/tok512.bin" --prompt "$prompt" --max-tokens 80 --temperature 0
        --chunk 16 --kv-memory 16777216)
fail=0
for kv in 1 2; do
    # head_dim 16: 8 rotary pairs per head, of which offload speculates on 4
    cat >"$tmp/gqa$kv.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": $kv,
 "vocab_size": 512, "max_position_embeddings": 512, "torch_dtype": "float32",
 "tie_word_embeddings": false, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
EOF
    model=synthetic:$tmp/gqa$kv.json
    for pol in "paged" "h2o --kv-budget 0.4" "h2o --kv-budget 0.4 --h2o-scores materialize" \
               "offload --kv-budget 0.4 --offload-mode warmup" "snapkv --kv-budget 0.4" \
               "streaming --kv-budget 0.4"; do
        # shellcheck disable=SC2086
        "$bin" generate --model "$model" "${common[@]}" --kv-policy $pol --stats \
            >"$tmp/ref.txt" 2>"$tmp/ref.err" || { cat "$tmp/ref.err"; exit 1; }
        case $pol in
        h2o*|snapkv*|streaming*) grep -q '"evictions":[1-9]' "$tmp/ref.err" ||
                  { echo "FAIL [kv $kv, $pol]: no eviction"; fail=1; } ;;
        offload*) grep -q '"spec_selections":[1-9]' "$tmp/ref.err" ||
                  { echo "FAIL [kv $kv, $pol]: no selection"; fail=1; } ;;
        esac
        if [ "$(wc -c <"$tmp/ref.txt")" -lt 80 ]; then
            echo "FAIL [kv $kv, $pol]: output too short"; fail=1; continue
        fi
        for tp in 2 4; do
            # shellcheck disable=SC2086
            "$mpiexec" -n "$tp" --oversubscribe "$bin" generate --model "$model" "${common[@]}" \
                --kv-policy $pol --tp "$tp" >"$tmp/par.txt" 2>"$tmp/par.err"
            rc=$?
            if [ "$rc" -ne 0 ]; then
                echo "FAIL [kv $kv, $pol] --tp $tp: exit $rc"; cat "$tmp/par.err"; fail=1
                continue
            fi
            if ! cmp -s "$tmp/ref.txt" "$tmp/par.txt"; then
                echo "FAIL [kv $kv, $pol] --tp $tp: tokens differ from one process"
                cmp "$tmp/ref.txt" "$tmp/par.txt"; fail=1; continue
            fi
            echo "ok [kv $kv, $pol] --tp $tp"
        done
    done
done
exit $fail
