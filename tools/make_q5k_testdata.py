#!/usr/bin/env python3
"""Writes the Q5_K goldens (tests/data/q5k/) with the `gguf` PyPI package, whose
gguf.quants.dequantize (llama.cpp's Q5_K dequantization) is the oracle. The package has no
Q5_K quantizer, so the blocks are encoded here (any valid encoding will do: the oracle is
the dequantization of the bytes; the script checks that it reproduces the encoded floats):

  w_q5k.bin    GGUF Q5_K blocks of a [37, 768] matrix (37 rows x 3 blocks x 176 bytes):
               random floats encoded per 32-value sub-block (min .. max over 31 steps, 6-bit
               scales and mins), rows with an offset, plus edge blocks (the first block of
               rows 0..4): d = 0; dmin = 0; every scale and min 63 with every code 31; every
               code 0; random bytes (d = 0.004, dmin = 0.002)
  w_deq.f32    gguf.quants.dequantize of w_q5k.bin (little-endian f32, [37, 768])
  tiny_q5k.gguf  a 1-layer llama mixed as llama.cpp's Q5_K_M (dim 256, 4 heads of 64, 2 KV
               heads, hidden 512, the byte-level gpt2 tokenizer of
               tools/make_gguf_testdata.py): attn_v, ffn_down and an untied output.weight
               Q6_K (tools/make_q6k_testdata.py's blocks), the other matrices and the
               embedding Q5_K; wo's head parts (64 columns) and w_down's hidden chunks (128)
               cut 256-value blocks, which the 32-column repacking takes

and, for GGUF's Q5_0 and Q5_1 (loaded into the Q5_K layout), with the package's own
quantizers (gguf.quants.quantize) and an independent random stream:

  w_q5_0.bin, w_q5_1.bin   [37, 160] matrices of block_q5_0 / block_q5_1 (37 rows x 5 blocks
               x 22 / 24 bytes): random floats quantized by the package, rows with an offset,
               plus edge blocks (the first of rows 0..4): d = 0; a negative d (Q5_1: a
               negative min); every code 31; every code 0; random bytes with a finite d and m
  w_q5_0.f32, w_q5_1.f32   gguf.quants.dequantize of them (little-endian f32, [37, 160])
  tiny_q5_01.gguf  a 1-layer llama of width 384 (not a multiple of 256: llama.cpp's K-quant
               files fall back to Q5_0/Q5_1 there; 6 heads of 64, 2 KV heads, hidden 768)
               mixed as such a file: attn_q, attn_k, ffn_up and output Q5_0; attn_output,
               ffn_gate and the embedding Q5_1; attn_v Q8_0; ffn_down (768 columns) Q6_K

Usage: python3 tools/make_q5k_testdata.py  (pip install gguf numpy)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

# the GGUF model writing of tools/make_gguf_testdata.py, Q4_K's scale packing and the Q6_K
# blocks (this script's folder is on sys.path)
from make_gguf_testdata import (add_gpt2_tokenizer, add_llama_tensors, llama_writer,
                                 write_and_close)
from make_q4k_testdata import pack_scales
from make_q6k_testdata import matrix as q6k_matrix

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q5k")
rng = np.random.default_rng(5252)


def block(d, dmin, sc, m, q):
    """One block_q5_K from its parts (q: 256 codes 0..31 in column order)."""
    q = np.asarray(q, np.uint8)
    qs = np.zeros(128, np.uint8)
    qh = np.zeros(32, np.uint8)
    for c in range(4):
        for l in range(32):
            qs[32 * c + l] = (q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4)
    for j in range(8):
        qh |= ((q[32 * j:32 * j + 32] >> 4) << j).astype(np.uint8)
    return (np.float16(d).tobytes() + np.float16(dmin).tobytes()
            + pack_scales(np.asarray(sc), np.asarray(m)).tobytes() + qh.tobytes()
            + qs.tobytes())


def encode(x):
    """A valid Q5_K encoding of 256 floats: per sub-block min .. max over 31 steps."""
    sub = x.reshape(8, 32).astype(np.float32)
    lo = np.minimum(sub.min(axis=1), 0.0)
    scale = (sub.max(axis=1) - lo) / np.float32(31.0)
    d16, dm16 = np.float16(scale.max() / 63.0), np.float16((-lo).max() / 63.0)
    sc = np.clip(np.rint(scale / np.float32(d16)) if d16 else np.zeros(8), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / np.float32(dm16)) if dm16 else np.zeros(8), 0, 63).astype(np.uint8)
    q = np.zeros(256, np.uint8)
    for j in range(8):
        step = np.float32(d16) * sc[j]
        off = np.float32(dm16) * m[j]
        if step > 0:
            q[32 * j:32 * j + 32] = np.clip(np.rint((sub[j] + off) / step), 0, 31)
    return block(d16, dm16, sc, m, q)


def matrix(rows, cols, sigma=1.0, edges=False):
    out = []
    for r in range(rows):
        for b in range(cols // 256):
            x = (rng.standard_normal(256) * sigma).astype(np.float32)
            if r % 3 == 1:
                x += np.float32(0.5 * sigma)  # rows with an offset: the mins matter
            out.append(encode(x))
    if edges:  # the first blocks of rows 0..4
        codes = rng.integers(0, 32, 256)
        out[0] = block(0.0, 0.01, rng.integers(0, 64, 8), rng.integers(0, 64, 8), codes)
        out[3] = block(0.02, 0.0, rng.integers(0, 64, 8), rng.integers(0, 64, 8), codes)
        out[6] = block(0.001, 0.003, np.full(8, 63), np.full(8, 63), np.full(256, 31))
        out[9] = block(0.5, 0.25, np.full(8, 63), np.full(8, 63), np.zeros(256))
        raw = rng.integers(0, 256, 176, dtype=np.uint8)
        raw[0:2] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        raw[2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
        out[12] = raw.tobytes()  # every bit of the packing
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, cols // 256 * 176)


def check_encoding():
    """dequantize(encode(x)) is x to within a step: the layout above is the package's."""
    x = rng.standard_normal(256 * 8).astype(np.float32)
    blocks = b"".join(encode(x[256 * i:256 * i + 256]) for i in range(8))
    y = dequantize(np.frombuffer(blocks, np.uint8).reshape(8, 176), T.Q5_K).reshape(-1)
    err = np.abs(y - x).max() / np.abs(x).max()
    assert err < 0.06, err


def goldens():
    w = matrix(37, 768, edges=True)
    with open(os.path.join(OUT, "w_q5k.bin"), "wb") as f:
        f.write(w.tobytes())
    deq = dequantize(w, T.Q5_K).reshape(37, 768).astype("<f4")
    with open(os.path.join(OUT, "w_deq.f32"), "wb") as f:
        f.write(deq.tobytes())


def tiny_model(name, dim=256, hidden=512, heads=4, kv=2, hd=64, layers=1):
    w = llama_writer(os.path.join(OUT, name), layers, dim, hidden, heads, kv, hd, 10000.0, 1e-5)
    toks = add_gpt2_tokenizer(w, [])

    def mat(tname, rows, cols, sigma, t):
        if t == T.Q6_K:
            w.add_tensor(tname, q6k_matrix(rows, cols, sigma), raw_dtype=T.Q6_K)
        else:
            w.add_tensor(tname, matrix(rows, cols, sigma), raw_dtype=T.Q5_K)

    add_llama_tensors(w, mat, len(toks), layers, dim, hidden, heads, kv, hd,
                      lambda role: T.Q6_K if role in ("output", "attn_v", "ffn_down")
                      else T.Q5_K)
    write_and_close(w)


# Q5_0 / Q5_1: their own stream, so the files above do not change
rng01 = np.random.default_rng(5001)


def q5_matrix(t, rows, cols, sigma=1.0, edges=False):
    """[rows, cols] floats quantized to Q5_0 / Q5_1 (t) by the package."""
    x = (rng01.standard_normal((rows, cols)) * sigma).astype(np.float32)
    x[1::3] += np.float32(0.5 * sigma)  # rows with an offset: Q5_1's min matters
    q = quantize(x, t).copy()
    if edges:
        bb = 22 if t == T.Q5_0 else 24
        blk = q.reshape(rows, cols // 32, bb)

        def f16(v):
            return np.frombuffer(np.float16(v).tobytes(), np.uint8)
        codes = rng01.integers(0, 256, bb - 2, dtype=np.uint8)
        blk[0, 0, 0:2] = f16(0.0)
        blk[0, 0, 2:] = codes
        if t == T.Q5_1:
            blk[0, 0, 2:4] = f16(0.25)  # a finite min (random bytes could be a NaN)
        blk[1, 0, 0:2] = f16(-0.03)  # negative d; Q5_1: a negative min too
        if t == T.Q5_1:
            blk[1, 0, 2:4] = f16(-0.7)
        blk[2, 0, 2 + (bb - 22):] = 255  # every code 31
        blk[3, 0, 2 + (bb - 22):] = 0  # every code 0
        blk[4, 0, :] = rng01.integers(0, 256, bb, dtype=np.uint8)
        blk[4, 0, 0:2] = f16(0.004)
        if t == T.Q5_1:
            blk[4, 0, 2:4] = f16(-0.06)
    return q


def q5_goldens():
    for t, tag in ((T.Q5_0, "q5_0"), (T.Q5_1, "q5_1")):
        w = q5_matrix(t, 37, 160, edges=True)
        with open(os.path.join(OUT, "w_%s.bin" % tag), "wb") as f:
            f.write(w.tobytes())
        deq = dequantize(w, t).reshape(37, 160).astype("<f4")
        with open(os.path.join(OUT, "w_%s.f32" % tag), "wb") as f:
            f.write(deq.tobytes())


def tiny_q5_01(name, dim=384, hidden=768, heads=6, kv=2, hd=64):
    w = llama_writer(os.path.join(OUT, name), 1, dim, hidden, heads, kv, hd, 10000.0, 1e-5)
    toks = add_gpt2_tokenizer(w, [])

    def mat(tname, rows, cols, sigma, t):
        if t == T.Q6_K:
            w.add_tensor(tname, q6k_matrix(rows, cols, sigma), raw_dtype=t)
        elif t == T.Q8_0:
            x = (rng01.standard_normal((rows, cols)) * sigma).astype(np.float32)
            w.add_tensor(tname, quantize(x, t), raw_dtype=t)
        else:
            w.add_tensor(tname, q5_matrix(t, rows, cols, sigma), raw_dtype=t)

    kinds = {"token_embd": T.Q5_1, "output": T.Q5_0, "attn_q": T.Q5_0, "attn_k": T.Q5_0,
             "attn_v": T.Q8_0, "attn_output": T.Q5_1, "ffn_gate": T.Q5_1, "ffn_up": T.Q5_0,
             "ffn_down": T.Q6_K}
    add_llama_tensors(w, mat, len(toks), 1, dim, hidden, heads, kv, hd, kinds.get)
    write_and_close(w)


def main():
    os.makedirs(OUT, exist_ok=True)
    check_encoding()
    goldens()
    tiny_model("tiny_q5k.gguf")
    q5_goldens()
    tiny_q5_01("tiny_q5_01.gguf")
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
