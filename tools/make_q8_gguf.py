#!/usr/bin/env python3
"""Writes a random-weight llama GGUF with every matrix in Q8_0 (gguf.quants.quantize, ggml's
reference numerics), for paired decode benchmarks of tessera and llama.cpp on the same file
(bench/q8_vs_llamacpp.sh). The shapes are tessera's synthetic ones (stories15M, stories110M);
the vocabulary is placeholder SentencePiece pieces (llama.cpp needs one; the benchmark feeds
token ids, not text). Weights ~ N(0, 1/cols), norms ~1, seed fixed.

Usage: python3 tools/make_q8_gguf.py stories110M OUT.gguf   (pip install gguf numpy)
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

SHAPES = {  # dim, hidden, layers, heads, kv heads, vocab, context
    "stories15M": (288, 768, 6, 6, 6, 32000, 256),
    "stories110M": (768, 2048, 12, 12, 12, 32000, 1024),
}


def main():
    name, out = sys.argv[1], sys.argv[2]
    dim, hidden, L, heads, kv, vocab, ctx = SHAPES[name]
    hd = dim // heads
    rng = np.random.default_rng(110)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("rand-" + name)
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    toks += ["\u2581p%d" % i for i in range(vocab - len(toks))]
    w.add_token_list(toks)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(n, rows, cols):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols)))
        w.add_tensor(n, quantize(x, T.Q8_0), raw_dtype=T.Q8_0)

    def vec(n, k):
        w.add_tensor(n, (1.0 + 0.05 * rng.standard_normal(k)).astype(np.float32))

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


if __name__ == "__main__":
    main()
