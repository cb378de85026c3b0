#!/usr/bin/env python3
"""Writes the Q8_0 quantizer goldens (tests/data/q8/) with the `gguf` PyPI package
(gguf.quants.quantize reproduces ggml's reference quantize_row_q8_0 bit for bit):

  quant.json       per model and matrix: rows, cols, and the 64-bit FNV-1a hash of the
                   sorted per-row hashes of the GGUF Q8_0 bytes (block_q8_0 rows; sorted so
                   that a loader's row permutation, e.g. the rotary one, does not matter).
                   Models: tests/data/synth_bf16_gqa (BF16 safetensors) and
                   models/stories260K.bin (llama2.c f32); matrices with cols % 32 != 0 skipped.
  edge_f32.bin     a [24, 96] f32 matrix of edge cases (zero blocks, exact .5 ties after
                   scaling, tiny and huge magnitudes, negative maxima), little-endian
  edge_q8_0.bin    its GGUF Q8_0 bytes (24 rows x 3 blocks x 34 bytes)
  tiny_q8_0.gguf   a 2-layer llama GGUF with every matrix Q8_0 (dim 128, hidden 256, 4 heads,
                   2 KV heads, head_dim 32, vocab 512 as models/tok512.bin, untied), random
                   weights quantized by the package; no tokenizer (give --tokenizer)

Usage: python3 tools/make_q8_testdata.py  (pip install gguf numpy)
"""
import json
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q8")
M64 = (1 << 64) - 1


def fnv64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & M64
    return h


def matrix_hash(w: np.ndarray) -> str:
    q = quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.Q8_0)
    rows = sorted(fnv64(bytes(r)) for r in q)
    return "%016x" % fnv64(b"".join(struct.pack("<Q", r) for r in rows))


def safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if v["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            t = u.view(np.float32)
        else:
            t = np.frombuffer(buf, dtype=np.float32)
        out[k] = t.reshape(v["shape"])
    return out


def synth():
    t = safetensors(os.path.join(ROOT, "tests/data/synth_bf16_gqa/model.safetensors"))
    names = {"tok_emb": "model.embed_tokens.weight", "classifier": "lm_head.weight"}
    per = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
           "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
           "w_down": "mlp.down_proj"}
    for l in range(2):
        for k, v in per.items():
            names["%d.%s" % (l, k)] = "model.layers.%d.%s.weight" % (l, v)
    return {k: t[v] for k, v in names.items()}


def stories260k():
    raw = open(os.path.join(ROOT, "models/stories260K.bin"), "rb").read()
    dim, hidden, L, nh, nkv, vocab, seq = struct.unpack("<7i", raw[:28])
    vocab = abs(vocab)
    f = np.frombuffer(raw[28:], dtype=np.float32)
    hd = dim // nh
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = f[off:off + n].reshape(shape)
        off += n
        return a

    emb = take(vocab, dim)
    take(L, dim)
    wq, wk, wv, wo = take(L, dim, dim), take(L, nkv * hd, dim), take(L, nkv * hd, dim), take(L, dim, dim)
    take(L, dim)
    w1, w2, w3 = take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    out = {"tok_emb": emb}
    for l in range(L):
        out.update({"%d.wq" % l: wq[l], "%d.wk" % l: wk[l], "%d.wv" % l: wv[l],
                    "%d.wo" % l: wo[l], "%d.w_gate" % l: w1[l], "%d.w_up" % l: w3[l],
                    "%d.w_down" % l: w2[l]})
    return out


def edge():
    rng = np.random.default_rng(27)
    w = rng.standard_normal((24, 96)).astype(np.float32)
    w[0, :32] = 0.0                                   # an all-zero block
    w[1, :32] = np.linspace(-127, 127, 32).astype(np.float32) / 64.0  # exact .5 ties
    w[2, 32:64] = -w[2, 32:64] * 0 + np.float32(-3.0)  # constant negative block
    w[2, 40] = -5.0
    w[3] *= np.float32(1e-6)                          # scales below fp16's normal range
    w[4] *= np.float32(3e4)                           # large values
    w[5, 64:] = 0.5 * np.sign(rng.standard_normal(32)).astype(np.float32)
    w[6] = np.round(w[6] * 127) / 127                 # values on the grid
    return w


def tiny_gguf(path):
    import gguf
    rng = np.random.default_rng(270)
    dim, hidden, heads, kv, hd, vocab, L = 128, 256, 4, 2, 32, 512, 2
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(name, rows, cols):
        x = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        w.add_tensor(name, quantize(x, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)

    def vec(name, n):
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", vocab, dim)
    vec("output_norm.weight", dim)
    mat("output.weight", vocab, dim)
    for l in range(L):
        vec("blk.%d.attn_norm.weight" % l, dim)
        vec("blk.%d.ffn_norm.weight" % l, dim)
        mat("blk.%d.attn_q.weight" % l, heads * hd, dim)
        mat("blk.%d.attn_k.weight" % l, kv * hd, dim)
        mat("blk.%d.attn_v.weight" % l, kv * hd, dim)
        mat("blk.%d.attn_output.weight" % l, dim, heads * hd)
        mat("blk.%d.ffn_gate.weight" % l, hidden, dim)
        mat("blk.%d.ffn_up.weight" % l, hidden, dim)
        mat("blk.%d.ffn_down.weight" % l, dim, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    res = {}
    for name, mats in (("synth_bf16_gqa", synth()), ("stories260K", stories260k())):
        res[name] = {k: {"rows": int(v.shape[0]), "cols": int(v.shape[1]), "hash": matrix_hash(v)}
                     for k, v in sorted(mats.items()) if v.shape[1] % 32 == 0}
    with open(os.path.join(OUT, "quant.json"), "w") as fh:
        json.dump(res, fh, indent=1, sort_keys=True)
        fh.write("\n")
    w = edge()
    w.astype("<f4").tofile(os.path.join(OUT, "edge_f32.bin"))
    quantize(w, GGMLQuantizationType.Q8_0).tofile(os.path.join(OUT, "edge_q8_0.bin"))
    tiny_gguf(os.path.join(OUT, "tiny_q8_0.gguf"))
    print("wrote", OUT, {k: len(v) for k, v in res.items()})


if __name__ == "__main__":
    main()
