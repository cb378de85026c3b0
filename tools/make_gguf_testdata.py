#!/usr/bin/env python3
"""Writes the small GGUF files the unit tests read (tests/data/gguf/), with the `gguf` PyPI
package (llama.cpp's own writer and reference dequantizer):

  types.gguf        one [2, 256] tensor per type tessera dequantizes, plus metadata of every
                    value type; types_expected.f32 holds gguf.quants.dequantize's values
                    (little-endian f32, the tensors in file order)
  tiny_llama.gguf   a 1-layer llama model (dim 256, 4 heads, 2 KV heads, vocab 300, tied
                    embeddings, mixed tensor types) with a small gpt2 tokenizer (256 byte
                    tokens, a few merges, two control tokens, pre = smollm)
  tiny_llama_expected.json  config and the first values of each tensor as dequantized

K-quant blocks are random bytes with sane f16 scales (the package has no K quantizer; its
dequantizer is the reference). Usage: python3 tools/make_gguf_testdata.py (pip install gguf).
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "gguf")
rng = np.random.default_rng(1234)

KQ = {T.Q4_K: (144, [0]), T.Q5_K: (176, [0]), T.Q6_K: (210, [208])}


def kquant(t, rows, cols):
    """Random K-quant blocks; the f16 scale fields get small finite values."""
    size, _ = KQ[t]
    nb = rows * cols // 256
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for b in range(nb):
        if t == T.Q6_K:
            raw[b, 208:210] = np.frombuffer(np.float16(rng.uniform(0.001, 0.01)).tobytes(), np.uint8)
        else:
            raw[b, 0:2] = np.frombuffer(np.float16(rng.uniform(0.001, 0.01)).tobytes(), np.uint8)
            raw[b, 2:4] = np.frombuffer(np.float16(rng.uniform(0.001, 0.01)).tobytes(), np.uint8)
    return raw.reshape(rows, cols // 256 * size)


def tensor(t, rows, cols):
    """(data to write, raw dtype or None, dequantized f32 reference)."""
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.5
    if t == T.F32:
        return x, None, x
    if t == T.F16:
        h = x.astype(np.float16)
        return h, None, h.astype(np.float32)
    if t in KQ:
        q = kquant(t, rows, cols)
    else:
        q = quants.quantize(x, t)
    return q, t, quants.dequantize(q, t).reshape(rows, cols).astype(np.float32)


def add(w, name, t, rows, cols, ref):
    data, raw, deq = tensor(t, rows, cols)
    w.add_tensor(name, data, raw_dtype=raw)
    ref[name] = deq
    return deq


def types_file():
    path = os.path.join(OUT, "types.gguf")
    w = gguf.GGUFWriter(path, "none")
    w.add_uint8("m.u8", 200)
    w.add_int8("m.i8", -100)
    w.add_uint16("m.u16", 60000)
    w.add_int16("m.i16", -30000)
    w.add_uint32("m.u32", 4000000000)
    w.add_int32("m.i32", -2000000000)
    w.add_float32("m.f32", 1.5)
    w.add_bool("m.bool", True)
    w.add_string("m.str", "héllo")
    w.add_uint64("m.u64", 1 << 40)
    w.add_int64("m.i64", -(1 << 40))
    w.add_float64("m.f64", 2.25)
    w.add_array("m.arr_i32", [1, -2, 3])
    w.add_array("m.arr_str", ["a", "", "xyz"])
    w.add_array("m.arr_nested", [[1, 2], [3]])
    ref = {}
    for t in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K]:
        add(w, "t." + t.name, t, 2, 256, ref)
    write_and_close(w)
    with open(os.path.join(OUT, "types_expected.f32"), "wb") as f:
        for name in ref:
            f.write(ref[name].astype("<f4").tobytes())


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def llama_writer(path, layers, dim, hidden, heads, kv, hd, theta, eps):
    """A GGUFWriter for a llama with its hyperparameters set (context 128)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_dimension_count(hd)
    return w


def add_gpt2_tokenizer(w, merges, vocab=300):
    """A small gpt2 tokenizer (pre = smollm): the 256 byte tokens (GPT-2 byte map), one token
    per merge, <|im_start|> (bos) and <|im_end|> (eos), padded to `vocab`. Returns the
    tokens."""
    b2u = bytes_to_unicode()
    toks = [b2u[b] for b in range(256)]
    for a, b in merges:
        toks.append(a + b)
    toks += ["<|im_start|>", "<|im_end|>"]
    types = [1] * (len(toks) - 2) + [3, 3]
    while len(toks) < vocab:
        toks.append("[PAD%d]" % len(toks))
        types.append(4)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges([a + " " + b for a, b in merges])
    w.add_bos_token_id(256 + len(merges))
    w.add_eos_token_id(256 + len(merges) + 1)
    w.add_add_bos_token(False)
    return toks


def add_llama_tensors(w, mat, vocab, layers, dim, hidden, heads, kv, hd, kind):
    """A llama's tensors in llama.cpp's order (embedding, output, norms, then per layer the
    norms and q, k, v, o, gate, up, down), the norms all ones. mat(name, rows, cols, sigma, k)
    writes one matrix of kind k = kind(role), role "token_embd", "output", "attn_q", ...,
    "ffn_down"; kind("output") None: tied embeddings. Sigmas: 0.1 for the embedding and
    output, 0.5 / sqrt(dim) for q and k, 1 / sqrt(dim) for the others."""
    s = 1.0 / np.sqrt(dim)
    mat("token_embd.weight", vocab, dim, 0.1, kind("token_embd"))
    if kind("output") is not None:
        mat("output.weight", vocab, dim, 0.1, kind("output"))
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    for l in range(layers):
        w.add_tensor("blk.%d.attn_norm.weight" % l, np.ones(dim, np.float32))
        w.add_tensor("blk.%d.ffn_norm.weight" % l, np.ones(dim, np.float32))
        for role, rows, cols, sigma in (("attn_q", heads * hd, dim, 0.5 * s),
                                        ("attn_k", kv * hd, dim, 0.5 * s),
                                        ("attn_v", kv * hd, dim, s),
                                        ("attn_output", dim, heads * hd, s),
                                        ("ffn_gate", hidden, dim, s),
                                        ("ffn_up", hidden, dim, s),
                                        ("ffn_down", dim, hidden, s)):
            mat("blk.%d.%s.weight" % (l, role), rows, cols, sigma, kind(role))


def write_and_close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama(path=None, small=False):
    """small: the fuzz seed (dim 32, row-32 block types only); else the unit-test model."""
    path = path or os.path.join(OUT, "tiny_llama.gguf")
    dim, hidden, heads, kv, hd = (32, 32, 2, 1, 16) if small else (256, 256, 4, 2, 64)
    w = llama_writer(path, 1, dim, hidden, heads, kv, hd, 50000.0, 1e-6)
    merges = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("1", "2")]
    toks = add_gpt2_tokenizer(w, merges)
    vocab = len(toks)
    ref = {}
    add(w, "token_embd.weight", T.Q8_0, vocab, dim, ref)
    x = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    w.add_tensor("output_norm.weight", x)
    ref["output_norm.weight"] = x.reshape(1, dim)
    lay = [("attn_norm", T.F32, 1, dim), ("ffn_norm", T.F32, 1, dim),
           ("attn_q", T.Q4_K, heads * hd, dim), ("attn_k", T.Q5_K, kv * hd, dim),
           ("attn_v", T.Q6_K, kv * hd, dim), ("attn_output", T.Q4_1, dim, heads * hd),
           ("ffn_gate", T.Q4_0, hidden, dim), ("ffn_up", T.BF16, hidden, dim),
           ("ffn_down", T.F16, dim, hidden)]
    if small:
        lay = [(n, {T.Q4_K: T.Q8_0, T.Q5_K: T.Q4_0, T.Q6_K: T.Q4_1}.get(t, t), r, c)
               for n, t, r, c in lay]
    for name, t, r, c in lay:
        full = "blk.0.%s.weight" % name
        if r == 1:
            x = (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32)
            w.add_tensor(full, x)
            ref[full] = x.reshape(1, c)
        else:
            add(w, full, t, r, c, ref)
    write_and_close(w)
    if small:
        return
    exp = {"dim": dim, "hidden": hidden, "heads": heads, "kv_heads": kv, "head_dim": hd,
           "vocab": vocab, "layers": 1, "ctx": 128, "theta": 50000.0, "eps": 1e-6,
           "bos": 256 + len(merges), "eos": 256 + len(merges) + 1,
           "tensors": {k: [float(v) for v in ref[k].reshape(-1)[:300]] for k in ref},
           "sums": {k: float(ref[k].astype(np.float64).sum()) for k in ref}}
    with open(os.path.join(OUT, "tiny_llama_expected.json"), "w") as f:
        json.dump(exp, f, indent=0)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    types_file()
    tiny_llama()
    seeds = os.path.join(OUT, "..", "..", "fuzz", "corpus", "fuzz_gguf")
    os.makedirs(seeds, exist_ok=True)
    tiny_llama(os.path.join(seeds, "tiny_model"), small=True)
    with open(os.path.join(OUT, "types.gguf"), "rb") as f, \
            open(os.path.join(seeds, "types"), "wb") as g:
        g.write(f.read())
    print("wrote", OUT, file=sys.stderr)
