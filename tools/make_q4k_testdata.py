#!/usr/bin/env python3
"""Writes the Q4_K goldens (tests/data/q4k/) with the `gguf` PyPI package, whose
gguf.quants.dequantize (llama.cpp's Q4_K dequantization) is the oracle. The package has no
Q4_K quantizer, so the blocks are encoded here (any valid encoding will do: the oracle is
the dequantization of the bytes):

  w_q4k.bin    GGUF Q4_K blocks of a [37, 768] matrix (37 rows x 3 blocks x 144 bytes):
               random floats encoded per sub-block (min .. max over 15 steps, 6-bit scales
               and mins), plus edge blocks: d = 0, dmin = 0, every scale and min 63, codes
               0 and 15
  w_deq.f32    gguf.quants.dequantize of w_q4k.bin (little-endian f32, [37, 768])
  x.f32        4 activation rows of 768 (a zero block, a block led by a negative value,
               large and tiny magnitudes)
  x_q8k.bin    llama.cpp's quantize_row_q8_K_ref of each row, computed here in f32 numpy:
               per row the int8 codes [768], the f32 scales [3], the int32 sums of each 32
               codes [24] (llama.cpp keeps sums per 16; their pairs)
  tiny_q4k.gguf  a 2-layer llama (dim 512, 2 heads of 256, 1 KV head, hidden 512, vocab
               300, tied embeddings) whose matrices are all Q4_K (so wo and w_down are
               eligible: head_dim and hidden / n_heads are whole super-blocks), with the
               byte-level gpt2 tokenizer of tests/data/gguf/tiny_llama.gguf
  tiny_q4k_hd64.gguf  the same at dim 256, 4 heads of 64, 2 KV heads, hidden 512, 1 layer:
               wo's head parts (64 columns) and w_down's hidden chunks (128) are not whole
               super-blocks, so the loader expands those two

Usage: python3 tools/make_q4k_testdata.py  (pip install gguf numpy)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# the GGUF model writing of tools/make_gguf_testdata.py (this script's folder is on sys.path)
from make_gguf_testdata import (add_gpt2_tokenizer, add_llama_tensors, llama_writer,
                                 write_and_close)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "q4k")
rng = np.random.default_rng(4242)


def pack_scales(sc, m):
    """ggml's 12-byte packing of 8 6-bit scales and mins (get_scale_min_k4's inverse)."""
    b = np.zeros(12, np.uint8)
    for j in range(4):
        b[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        b[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6)
        b[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4)
    return b


def block(d, dmin, sc, m, q):
    """One block_q4_K from its parts (q: 256 codes 0..15 in column order)."""
    qs = np.zeros(128, np.uint8)
    for c in range(4):
        for l in range(32):
            qs[32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4)
    return (np.float16(d).tobytes() + np.float16(dmin).tobytes() + pack_scales(sc, m).tobytes()
            + qs.tobytes())


def encode(x):
    """A valid Q4_K encoding of 256 floats: per sub-block min .. max over 15 steps."""
    sub = x.reshape(8, 32)
    lo = np.minimum(sub.min(axis=1), 0.0)
    scale = (sub.max(axis=1) - lo) / 15.0
    d = np.float32(scale.max() / 63.0)
    dmin = np.float32((-lo).max() / 63.0)
    d16, dm16 = np.float16(d), np.float16(dmin)
    sc = np.clip(np.rint(scale / np.float32(d16)) if d16 else np.zeros(8), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / np.float32(dm16)) if dm16 else np.zeros(8), 0, 63).astype(np.uint8)
    q = np.zeros(256, np.uint8)
    for j in range(8):
        step = np.float32(d16) * sc[j]
        off = np.float32(dm16) * m[j]
        if step > 0:
            q[32 * j:32 * j + 32] = np.clip(np.rint((sub[j] + off) / step), 0, 15)
    return block(d16, dm16, sc, m, q)


def matrix(rows, cols, sigma=1.0, edges=False, offset=True):
    out = []
    for r in range(rows):
        for b in range(cols // 256):
            x = (rng.standard_normal(256) * sigma).astype(np.float32)
            if offset and r % 3 == 1:
                x += np.float32(0.5 * sigma)  # rows with an offset: the mins matter
            out.append(encode(x))
    if edges:  # the first blocks of rows 0..4
        codes = rng.integers(0, 16, 256).astype(np.uint8)
        out[0] = block(0.0, 0.01, rng.integers(0, 64, 8), rng.integers(0, 64, 8), codes)
        out[3] = block(0.02, 0.0, rng.integers(0, 64, 8), rng.integers(0, 64, 8), codes)
        out[6] = block(0.001, 0.003, np.full(8, 63), np.full(8, 63), np.full(256, 15, np.uint8))
        out[9] = block(0.5, 0.25, np.full(8, 63), np.full(8, 63), np.zeros(256, np.uint8))
        raw = np.frombuffer(rng.integers(0, 256, 144, dtype=np.uint8).tobytes(), np.uint8).copy()
        raw[0:2] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        raw[2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
        out[12] = raw.tobytes()  # random scale bytes: every bit of the packing
    return np.frombuffer(b"".join(out), np.uint8).reshape(rows, cols // 256 * 144)


def q8k(x):
    """llama.cpp's quantize_row_q8_K_ref in f32: (codes, scales, sums per 32)."""
    qs, ds, sums = [], [], []
    for b in range(len(x) // 256):
        v = x[256 * b:256 * b + 256].astype(np.float32)
        i = int(np.argmax(np.abs(v)))  # the first of the largest magnitudes
        if v[i] == 0:
            q = np.zeros(256, np.int32)
            d = np.float32(0)
        else:
            iscale = np.float32(-127.0) / v[i]
            q = np.minimum(127, np.rint((iscale * v).astype(np.float32))).astype(np.int32)
            d = np.float32(1.0) / iscale
        qs.append(q.astype(np.int8))
        ds.append(d)
        sums += [int(q[32 * s:32 * s + 32].sum()) for s in range(8)]
    return (np.concatenate(qs), np.array(ds, np.float32), np.array(sums, np.int32))


def goldens():
    w = matrix(37, 768, edges=True)
    with open(os.path.join(OUT, "w_q4k.bin"), "wb") as f:
        f.write(w.tobytes())
    deq = dequantize(w, T.Q4_K).reshape(37, 768).astype("<f4")
    with open(os.path.join(OUT, "w_deq.f32"), "wb") as f:
        f.write(deq.tobytes())
    x = (rng.standard_normal((4, 768)) * 2.0).astype(np.float32)
    x[0, 256:512] = 0.0                   # an all-zero block: d 0, codes 0
    x[1, 10] = -40.0                      # a block led by a negative value
    x[2, :256] *= np.float32(1e3)
    x[3, 512:] *= np.float32(1e-4)
    with open(os.path.join(OUT, "x.f32"), "wb") as f:
        f.write(x.astype("<f4").tobytes())
    with open(os.path.join(OUT, "x_q8k.bin"), "wb") as f:
        for r in range(4):
            q, d, s = q8k(x[r])
            f.write(q.tobytes() + d.astype("<f4").tobytes() + s.astype("<i4").tobytes())


def tiny_model(name="tiny_q4k.gguf", dim=512, hidden=512, heads=2, kv=1, hd=256, layers=2,
               offset=True):
    w = llama_writer(os.path.join(OUT, name), layers, dim, hidden, heads, kv, hd, 10000.0, 1e-5)
    toks = add_gpt2_tokenizer(w, [])

    def q4k(name, rows, cols, sigma, _kind):
        w.add_tensor(name, matrix(rows, cols, sigma, offset=offset), raw_dtype=T.Q4_K)

    add_llama_tensors(w, q4k, len(toks), layers, dim, hidden, heads, kv, hd,
                      lambda role: None if role == "output" else T.Q4_K)  # tied
    write_and_close(w)


def main():
    os.makedirs(OUT, exist_ok=True)
    goldens()
    tiny_model()
    tiny_model("tiny_q4k_hd64.gguf", dim=256, hidden=512, heads=4, kv=2, hd=64, layers=1,
               offset=False)
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
