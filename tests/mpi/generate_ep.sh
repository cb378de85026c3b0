#!/bin/bash
# generate_ep.sh TESSERA ROOT MPIEXEC
# `tessera generate --ep 2` (the experts of the tiny GPT-OSS model spread over the two
# tensor-parallel ranks, tokens exchanged all-to-all, runtime/exec/moe.h) must print one
# process's tokens, in F32 and MXFP4 (and MXFP4 under --dtype q8_0), with a prompt longer than the sliding window and a
# chunked prefill; and `run --ep 2` writes one process's records for a batch of sequences.
set -u
bin=$1 root=$2 mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tok=$root/tests/data/harmony/tokenizer.json
prompt="The user asks a question. Let me think about the answer before I write it."
fail=0
for mq in gptoss_f32 gptoss_mxfp4 gptoss_mxfp4:q8_0; do
    m=${mq%%:*}
    dt=(); [ "$m" != "$mq" ] && dt=(--dtype "${mq#*:}") # q8_0: the experts repacked (W4A8)
    common=(--model "$root/tests/data/arch/$m" --tokenizer "$tok" --prompt "$prompt"
            --max-tokens 32 --temperature 0 --chunk 7 --threads 1 "${dt[@]}")
    "$bin" generate "${common[@]}" >"$tmp/ref.txt" 2>"$tmp/ref.err" || { cat "$tmp/ref.err"; exit 1; }
    "$mpiexec" -n 2 --oversubscribe "$bin" generate "${common[@]}" --ep 2 >"$tmp/out.txt" \
        2>"$tmp/out.err" || { echo "FAIL [$mq]:"; cat "$tmp/out.err"; fail=1; continue; }
    if ! cmp -s "$tmp/ref.txt" "$tmp/out.txt"; then
        echo "FAIL [$mq]: --ep 2 tokens differ from one process"
        diff "$tmp/ref.txt" "$tmp/out.txt" | head -5; fail=1
    fi
done
for i in 1 2 3; do
    printf '{"custom_id": "r%d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s %d", "max_tokens": 16, "temperature": 0}}\n' \
        "$i" "$prompt" "$i"
done >"$tmp/in.jsonl"
run=(run --model "$root/tests/data/arch/gptoss_f32" --tokenizer "$tok" --input "$tmp/in.jsonl"
     --threads 1 --progress-interval 0 --quiet --max-batch-tokens 16)
"$bin" "${run[@]}" --output "$tmp/ref.jsonl" || { echo "FAIL: run"; exit 1; }
"$mpiexec" -n 2 --oversubscribe "$bin" "${run[@]}" --output "$tmp/out.jsonl" --ep 2 ||
    { echo "FAIL: run --ep 2"; exit 1; }
strip() { sed -e 's/"id":"[^"]*"//g' -e 's/"request_id":"[^"]*"//g' "$1" | sort; }
if ! cmp -s <(strip "$tmp/ref.jsonl") <(strip "$tmp/out.jsonl"); then
    echo "FAIL: run --ep 2 records differ from one process"; fail=1
fi
[ $fail = 0 ] && echo "ep 2: one process's tokens (generate f32, mxfp4 and mxfp4 q8_0, run)"
exit $fail
