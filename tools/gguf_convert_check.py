#!/usr/bin/env python3
"""Oracle for `tessera convert --output X.gguf`: reads the written file with gguf.GGUFReader
and checks it against the source model read here with numpy, independently of tessera:

- every tensor's bytes equal gguf.quants.quantize(the source's f32 values, its type) (Q8_0:
  ggml's reference quantizer; BF16/F16 rounding; F32 as is), with llama.cpp's row permutation
  of attn_q/attn_k for llama files from a Hugging Face (half-rotation) source;
- each matrix has the type tessera's `--dtype q8_0` gives it at load (Q8_0 where the columns
  are whole 32-value blocks, wo only when head_dim % 32 == 0, w_down only with whole units per
  head; else BF16), vectors F32;
- rope_freqs.weight (Llama 3 rope scaling) equal to llama.cpp's converter's factors;
- the architecture's hyperparameter keys, and for a llama2.c tokenizer the tokenizer keys equal
  those of tests/data/gguf/tok512_spm.gguf (tools/spm_gguf.py, the gguf package's writer).

With --expect FILE it also writes (or with --verify, checks) the expected digests: the SHA-256 of
every tensor's bytes and of the whole file, which tests/cli/test_convert.sh compares without
Python (tests/data/convert/expected.json).

Usage: python3 tools/gguf_convert_check.py SOURCE OUT.gguf DTYPE [--tokenizer-ref GGUF]
           [--expect FILE --name NAME]      (pip install gguf numpy safetensors)
SOURCE: a llama2.c .bin or a Hugging Face directory (config.json + model.safetensors).

tests/data/convert/expected.json was written from the repository root, for each NAME of
stories260K_{q8_0,f32,f16,bf16} and {qwen2,qwen3,mistral}_f32_q8_0, by
    build/tessera convert --model SOURCE --output NAME.gguf --dtype DTYPE
    python3 tools/gguf_convert_check.py SOURCE NAME.gguf DTYPE \
        [--tokenizer-ref tests/data/gguf/tok512_spm.gguf  (stories260K)] \
        --expect tests/data/convert/expected.json --name NAME
with SOURCE models/stories260K.bin or tests/data/arch/<model>.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize


def llama2c(path):
    """llama2.c v0 checkpoint -> (config dict, {gguf name: f32 array}), rows as stored
    (interleaved rotary pairs, which is llama.cpp's order for llama files)."""
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, L, H, KV, vocab, ctx = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // H
    a = np.frombuffer(data, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        x = a[off:off + n].reshape(shape)
        off += n
        return x

    t = {"token_embd.weight": take(vocab, dim)}
    att = take(L, dim)
    wq, wk, wv = take(L, H * hd, dim), take(L, KV * hd, dim), take(L, KV * hd, dim)
    wo = take(L, dim, H * hd)
    ffn = take(L, dim)
    w1, w2, w3 = take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    t["output_norm.weight"] = take(dim)
    take(ctx * hd // 2)
    take(ctx * hd // 2)
    if not shared:
        t["output.weight"] = take(vocab, dim)
    for l in range(L):
        p = "blk.%d." % l
        t[p + "attn_norm.weight"] = att[l]
        t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"] = wq[l], wk[l], wv[l]
        t[p + "attn_output.weight"] = wo[l]
        t[p + "ffn_norm.weight"] = ffn[l]
        t[p + "ffn_gate.weight"], t[p + "ffn_down.weight"], t[p + "ffn_up.weight"] = w1[l], w2[l], w3[l]
    cfg = dict(arch="llama", dim=dim, hidden=hidden, L=L, H=H, KV=KV, hd=hd, vocab=vocab, ctx=ctx,
               eps=1e-5, theta=10000.0)
    return cfg, t


def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf(path):
    from safetensors.numpy import load_file
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    st = {k: v.astype(np.float32) for k, v in
          load_file(os.path.join(path, "model.safetensors")).items()}
    mt = c["model_type"]
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[mt]
    H, dim = c["num_attention_heads"], c["hidden_size"]
    KV = c.get("num_key_value_heads") or H
    hd = c.get("head_dim") or dim // H
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    cfg = dict(arch=arch, dim=dim, hidden=c["intermediate_size"], L=c["num_hidden_layers"], H=H,
               KV=KV, hd=hd, vocab=c["vocab_size"], ctx=c["max_position_embeddings"],
               eps=c["rms_norm_eps"], theta=theta)
    t = {"token_embd.weight": st["model.embed_tokens.weight"],
         "output_norm.weight": st["model.norm.weight"]}
    if "lm_head.weight" in st and not c.get("tie_word_embeddings", False):
        t["output.weight"] = st["lm_head.weight"]
    names = {"input_layernorm.weight": "attn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight"}
    rs = c.get("rope_scaling") or c.get("rope_parameters") or {}
    if rs.get("rope_type") == "llama3":
        cfg["rope_freqs"] = llama3_factors(hd, theta, rs)
        cfg["rope_orig"] = rs.get("original_max_position_embeddings", 8192)
    for l in range(cfg["L"]):
        for hn, gn in names.items():
            k = "model.layers.%d.%s" % (l, hn)
            if k not in st:
                continue
            w = st[k]
            if arch == "llama" and gn == "attn_q.weight":
                w = permute(w, H)
            if arch == "llama" and gn == "attn_k.weight":
                w = permute(w, KV)
            t["blk.%d.%s" % (l, gn)] = w
    return cfg, t


def llama3_factors(hd, theta, rs):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel rope_freqs.weight."""
    factor, lo, hi = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    freqs = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def q8_eligible(cfg, name, cols):
    """tessera's tsr_model_q8_eligible (runtime/model/quantize.c)."""
    if cols % 32:
        return False
    if name.endswith("attn_output.weight"):
        return cfg["hd"] % 32 == 0
    if name.endswith("ffn_down.weight"):
        return cfg["hidden"] % 32 == 0 and cfg["hidden"] // 32 >= cfg["H"]
    return True


def expected_type(cfg, name, x, dtype):
    if x.ndim == 1:
        return T.F32
    if dtype == "q8_0":
        return T.Q8_0 if q8_eligible(cfg, name, x.shape[1]) else T.BF16
    return {"f32": T.F32, "f16": T.F16, "bf16": T.BF16}[dtype]


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def check_tokenizer(r, ref_path, fail):
    ref = gguf.GGUFReader(ref_path)
    for k, f in ref.fields.items():
        if not k.startswith("tokenizer."):
            continue
        if field(r, k) != f.contents():
            fail("tokenizer key %s differs from %s" % (k, ref_path))
    for k in r.fields:
        if k.startswith("tokenizer.") and k not in ref.fields:
            fail("tokenizer key %s is not in %s" % (k, ref_path))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("gguf")
    ap.add_argument("dtype", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--tokenizer-ref")
    ap.add_argument("--expect", help="JSON of expected digests to update")
    ap.add_argument("--name", help="entry name in --expect")
    a = ap.parse_args()
    errors = []

    def fail(msg):
        errors.append(msg)
        print("FAIL:", msg, file=sys.stderr)

    cfg, src = llama2c(a.source) if os.path.isfile(a.source) else hf(a.source)
    r = gguf.GGUFReader(a.gguf)
    arch = cfg["arch"]
    keys = {"general.architecture": arch, arch + ".context_length": cfg["ctx"],
            arch + ".embedding_length": cfg["dim"], arch + ".block_count": cfg["L"],
            arch + ".feed_forward_length": cfg["hidden"],
            arch + ".attention.head_count": cfg["H"], arch + ".attention.head_count_kv": cfg["KV"],
            arch + ".attention.key_length": cfg["hd"], arch + ".rope.dimension_count": cfg["hd"],
            arch + ".vocab_size": cfg["vocab"]}
    for k, v in keys.items():
        if field(r, k) != v:
            fail("%s = %r, expected %r" % (k, field(r, k), v))
    for k, v in ((".rope.freq_base", cfg["theta"]), (".attention.layer_norm_rms_epsilon", cfg["eps"])):
        got = field(r, arch + k)
        if got is None or np.float32(got) != np.float32(v):
            fail("%s%s = %r, expected %r" % (arch, k, got, v))
    if a.tokenizer_ref:
        check_tokenizer(r, a.tokenizer_ref, fail)

    got = {t.name: t for t in r.tensors}
    if "rope_freqs" in cfg:
        t = got.pop("rope_freqs.weight", None)
        if t is None or t.tensor_type != T.F32 or not np.allclose(np.asarray(t.data), cfg["rope_freqs"],
                                                                   rtol=1e-6, atol=0):
            fail("rope_freqs.weight differs from llama.cpp's llama3 factors")
        if field(r, arch + ".rope.scaling.original_context_length") != \
                (cfg.get("rope_orig") or 8192):
            fail("rope.scaling.original_context_length differs")
    if set(got) != set(src):
        fail("tensor names differ: extra %s, missing %s" %
             (sorted(set(got) - set(src)), sorted(set(src) - set(got))))
    digests, counts = {}, {}
    for name in sorted(set(got) & set(src)):
        t, x = got[name], np.ascontiguousarray(src[name], dtype=np.float32)
        want = expected_type(cfg, name, x, a.dtype)
        counts[want.name] = counts.get(want.name, 0) + 1
        if t.tensor_type != want:
            fail("%s is %s, expected %s" % (name, t.tensor_type.name, want.name))
            continue
        if list(t.shape) != list(reversed(x.shape)):
            fail("%s has shape %s, expected %s (ggml order)" % (name, list(t.shape),
                                                                list(reversed(x.shape))))
            continue
        ref = x if want == T.F32 else quantize(x, want)
        raw = np.asarray(t.data).tobytes()
        if raw != np.ascontiguousarray(ref).tobytes():
            fail("%s: bytes differ from gguf.quants.quantize(source, %s)" % (name, want.name))
        digests[name] = hashlib.sha256(raw).hexdigest()
    if errors:
        print("%d problem(s)" % len(errors), file=sys.stderr)
        sys.exit(1)
    with open(a.gguf, "rb") as f:
        file_digest = hashlib.sha256(f.read()).hexdigest()
    print("ok: %s, %d tensors (%s) equal gguf.quants.quantize of the source; file sha256 %s" %
          (a.gguf, len(digests), ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items())),
           file_digest))
    if a.expect:
        db = {}
        if os.path.exists(a.expect):
            with open(a.expect) as f:
                db = json.load(f)
        db[a.name or os.path.basename(a.gguf)] = {
            "source": a.source if not os.path.isabs(a.source) else os.path.basename(a.source),
            "dtype": a.dtype, "file_sha256": file_digest, "tensor_sha256": digests}
        with open(a.expect, "w") as f:
            json.dump(db, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
