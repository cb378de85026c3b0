#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (tests/fuzz/corpus/<target>/) from the repository's
own test data, kept small: run from the repository root as
    python3 tests/fuzz/make_corpus.py BUILD_DIR
BUILD_DIR is a built tree (any compiler): its tessera writes the tiny HF model
(`tessera convert` of a synthetic model).
The corpora are committed; this script only regenerates them."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.getcwd()
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
OUT = os.path.join(ROOT, "tests/fuzz/corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def split2(a, b):
    return struct.pack("<H", len(a)) + a + b


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)]"""
    hdr, off, blob = {}, 0, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + blob


# ---- a tiny model: config.json and model.safetensors written by tessera convert
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16,
        "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
tmp = tempfile.mkdtemp()
try:
    with open(os.path.join(tmp, "tiny.json"), "w") as f:
        json.dump(TINY, f)
    hf = os.path.join(tmp, "hf")
    subprocess.run([os.path.join(BUILD, "tessera"), "convert", "--model",
                    "synthetic:" + os.path.join(tmp, "tiny.json"), "--output", hf,
                    "--dtype", "bf16"], check=True, stdout=subprocess.DEVNULL)
    cfg, st = read(os.path.join(hf, "config.json")), read(os.path.join(hf, "model.safetensors"))
finally:
    shutil.rmtree(tmp)

put("fuzz_hf_model", "tiny_bf16", split2(cfg, st))
put("fuzz_hf_model", "tiny_truncated", split2(cfg, st[: len(st) // 2]))
put("fuzz_safetensors", "tiny_model", st)
put("fuzz_safetensors", "small_mixed", safetensors(
    [("a", "F32", [2, 3], struct.pack("<6f", *range(6))), ("b", "BF16", [4], b"\x80\x3f" * 4),
     ("c", "I64", [1], struct.pack("<q", 7)), ("d", "F16", [], b"\x00\x3c")],
    meta={"format": "pt"}))
put("fuzz_safetensors", "empty", safetensors([]))

put("fuzz_config", "synth_bf16_gqa", read("tests/data/synth_bf16_gqa/config.json"))
put("fuzz_config", "tiny", cfg)
put("fuzz_config", "sharded", read("tests/data/synth_bf16_gqa_sharded/config.json"))

# ---- llama2.c: the header of stories260K, and a tiny model of zeros of the right size
dim, hid, L, H, KV, V, S = 8, 16, 1, 2, 1, 16, 8
hd = dim // H
floats = V * dim + L * (dim + dim * H * hd + 2 * dim * KV * hd + H * hd * dim + dim +
                        3 * dim * hid) + dim + S * hd
put("fuzz_llama2c", "tiny_shared", struct.pack("<7i", dim, hid, L, H, KV, V, S) +
    bytes(4 * floats))
put("fuzz_llama2c", "tiny_unshared", struct.pack("<7i", dim, hid, L, H, KV, -V, S) +
    bytes(4 * (floats + V * dim)))
put("fuzz_llama2c", "stories260K_header", read("models/stories260K.bin")[:28])

# ---- tokenizer.bin: tok512 (the stories260K tokenizer) and a three-token one
put("fuzz_tokenizer_bin", "tok512", read("models/tok512.bin"))
tiny = struct.pack("<i", 4)
for s, piece in [(0.0, b"<unk>"), (0.0, b"\n<s>\n"), (-1.0, b" a"), (-2.0, b"<0x41>")]:
    tiny += struct.pack("<fi", s, len(piece)) + piece
put("fuzz_tokenizer_bin", "tiny", tiny)

# ---- tokenizer.json: the legacy Llama-3 test tokenizer cut to its bytes and first merges
tj = json.loads(read("tests/data/tokenizers/bpe_llama3_legacy/tokenizer.json"))
vocab = tj["model"]["vocab"]
by_id = sorted(vocab.items(), key=lambda kv: kv[1])
keep = [tok for tok, _ in by_id[:256]]
merges = []
for m in tj["model"]["merges"]:
    a, b = m.split(" ") if isinstance(m, str) else m
    if a in keep and b in keep and a + b in vocab:
        merges.append(m)
        if a + b not in keep:
            keep.append(a + b)
    if len(merges) == 48:
        break
tj["model"]["vocab"] = {tok: i for i, tok in enumerate(keep)}
tj["model"]["merges"] = merges
for i, t in enumerate(tj["added_tokens"][:4]):
    t["id"] = len(keep) + i
tj["added_tokens"] = tj["added_tokens"][:4]
put("fuzz_tokenizer_json", "llama3_small", json.dumps(tj, ensure_ascii=False))

# ---- tokenize: first byte = tokenizer | bos<<2 | eos<<3 | decode<<4
put("fuzz_tokenize", "bpe_text", b"\x0c" + "Hello world 123, café <|begin_of_text|>!".encode())
put("fuzz_tokenize", "bpe_legacy", b"\x05" + b"Once upon a time\n\n there")
put("fuzz_tokenize", "spm_text", b"\x0e" + b"Once upon a time, Lily \xff\xfe")
put("fuzz_tokenize", "tok512", b"\x03" + b"The cat sat on the mat.")
put("fuzz_tokenize", "decode_ids", b"\x10" + struct.pack("<8H", 1, 2, 300, 1396, 9, 0, 65, 1397))

# ---- JSONL request lines (the shapes of tests/cli/test_run.sh)
lines = [
    '{"custom_id": "good-1", "method": "POST", "url": "/v1/completions", "body": '
    '{"prompt": "The cat", "max_tokens": 4, "temperature": 0, "top_p": 0.9, "seed": 3, '
    '"stop": ["\\n", "."]}}',
    '{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": '
    '{"messages": [{"role": "system", "content": "Be brief."}, '
    '{"role": "user", "content": "hi \\u00e9"}], "max_tokens": 8}}',
    '{"custom_id": "no-body", "method": "POST", "url": "/v1/completions"}',
    '{"custom_id": "bad-param", "method": "POST", "url": "/v1/completions", '
    '"body": {"prompt": "x", "top_p": 5}}',
    '{"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}',
]
for i, ln in enumerate(lines):
    put("fuzz_batch_line", "line%d" % i, ln)

# ---- chat templates (tests/unit/test_batch_io.c): config, then role\0content\0...
llama3 = ('{"bos_token": "<|begin_of_text|>", "chat_template": "{% set loop_messages = '
          "messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
          "+ message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
          "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
          "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}\"}").encode()
llama31 = ('{"chat_template": "{{- bos_token }}<|start_header_id|>system'
           '<|end_header_id|>Cutting Knowledge Date: December 2023<|eot_id|>"}').encode()
msgs = b"system\0Be brief. \0user\0\n Hello!"
put("fuzz_chat_template", "llama3", split2(llama3, msgs))
put("fuzz_chat_template", "llama31", split2(llama31, b"user\0Hello!"))
put("fuzz_chat_template", "none", split2(b'{"model_max_length": 512}', msgs))

# ---- jinja: corpus templates with a chat context (tests/fuzz/fuzz_jinja.c)
ctx = json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "<think>x</think>Hello"},
                               {"role": "user", "content": "Bye"}],
                  "tools": None, "add_generation_prompt": True, "bos_token": "<s>",
                  "eos_token": "</s>"}).encode()
for name in ["HuggingFaceTB-SmolLM2-1.7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
             "Qwen-Qwen3-0.6B", "mistralai-Mistral-Nemo-Instruct-2407", "google-gemma-2-2b-it",
             "microsoft-Phi-3.5-mini-instruct"]:
    src = read("tests/data/chat_templates/%s.jinja" % name)
    put("fuzz_jinja", name, split2(src, ctx))
put("fuzz_jinja", "constructs", split2(
    b"{% set ns = namespace(n=0) %}{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}"
    b"{% for x in messages if x.role != 'system' %}{% set ns.n = ns.n + 1 %}"
    b"{{ loop.index }}{{ x.content|trim|upper }}{{ x.content.split('>')[-1][:3] }}"
    b"{{ m(x.role, b=loop.last) }}{% endfor %}{{ messages|selectattr('role', 'equalto', 'user')"
    b"|map(attribute='content')|join(',') }}{{ {'a': [1, 2.5, none]}|tojson(indent=2) }}"
    b"{{ strftime_now('%Y') }}{{ 'x' if ns.n is odd else raise_exception('even') }}", ctx))

# ---- checkpoint: edit scripts on the base checkpoint (tests/fuzz/fuzz_checkpoint.c)
put("fuzz_checkpoint", "unedited", b"")
put("fuzz_checkpoint", "patch", bytes([0, 3, 0, 3, 0xff, 0xff, 0xff, 0x7f, 0, 9, 4, 0, 0x80]))
put("fuzz_checkpoint", "delete", bytes([1, 7, 1, 20]))
put("fuzz_checkpoint", "resize", bytes([2, 12, 40, 3, 0x41, 2, 30, 0, 0, 0]))
