#!/usr/bin/env python3
"""Independent reference outputs for tessera, computed with Hugging Face transformers.

tessera is never compared with its own output: every golden number comes from
transformers' LlamaForCausalLM (torch, CPU, float32 math, eager attention).

What it writes (under --out, default tests/data):
  golden/stories260K.json     stories260K: full prompt logits and 64-token greedy
                              continuations for 3 prompts (see docs/correctness.md)
  synth_bf16_gqa/             a seeded synthetic Llama (GQA, llama3 rope scaling) saved in
                              bf16 with save_pretrained: config.json + model.safetensors
  synth_bf16_gqa_sharded/     the same weights in 3 shards + model.safetensors.index.json
  golden/synth_bf16_gqa.json  logits of the f32-upcast synthetic model at a subset of
                              positions, greedy continuations, bf16-math deviation

Rerun (from the repository root; takes ~20 s on a laptop CPU):
  python3 tools/hf_reference.py --model models/stories260K.bin \
      --tokenizer models/tok512.bin --out tests/data
Check a directory that tessera exported (tsr_export_hf, e.g. the one test_golden writes to
<build>/golden_stories260K_hf) by loading it with transformers and comparing with the golden:
  python3 tools/hf_reference.py --check-hf-dir build/golden_stories260K_hf
The outputs are deterministic for a given torch/transformers version; rerunning with other
versions may change the last digits of the logits (far below the test tolerances) and the
"versions" fields.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

BOS, EOS = 1, 2


# ---------------------------------------------------------------------------------------
# llama2.c checkpoint -> transformers LlamaForCausalLM

def read_llama2c(path):
    """Reads a llama2.c legacy (version 0) checkpoint into numpy arrays ([out][in] layout,
    the nn.Linear convention that llama2.c's export.py serializes)."""
    raw = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", raw[:28])
    tied = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_heads
    kv_dim = n_kv * hd
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].reshape(shape).astype(np.float32)
        off += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, n_heads * hd, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, n_heads * hd)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len, hd // 2)  # freq_cis_real: recomputed by both sides from theta
    take(seq_len, hd // 2)  # freq_cis_imag
    w["wcls"] = None if tied else take(vocab, dim)
    if off != data.size:
        sys.exit(f"{path}: {data.size - off} unread floats (not a legacy llama2.c file?)")
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
               vocab=vocab, seq_len=seq_len, tied=tied)
    return cfg, w


def permute_rotary(w, n_heads):
    """llama2.c rotates interleaved pairs (2i, 2i+1); HF rotates halves (i, i + hd/2).
    Exactly convert_llama_weights_to_hf.py's permute()."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3) \
            .reshape(rows, cols)


def hf_from_llama2c(cfg, w):
    hd = cfg["dim"] // cfg["n_heads"]
    conf = LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["dim"], intermediate_size=cfg["hidden"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv"], head_dim=hd, hidden_act="silu",
        max_position_embeddings=cfg["seq_len"], rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=cfg["tied"], attention_bias=False, mlp_bias=False,
        bos_token_id=BOS, eos_token_id=EOS)
    conf._attn_implementation = "eager"
    model = LlamaForCausalLM(conf).float().eval()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    sd = {"model.embed_tokens.weight": t(w["emb"]), "model.norm.weight": t(w["rms_final"])}
    for l in range(cfg["n_layers"]):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = t(w["rms_att"][l])
        sd[p + "post_attention_layernorm.weight"] = t(w["rms_ffn"][l])
        sd[p + "self_attn.q_proj.weight"] = t(permute_rotary(w["wq"][l], cfg["n_heads"]))
        sd[p + "self_attn.k_proj.weight"] = t(permute_rotary(w["wk"][l], cfg["n_kv"]))
        sd[p + "self_attn.v_proj.weight"] = t(w["wv"][l])
        sd[p + "self_attn.o_proj.weight"] = t(w["wo"][l])
        sd[p + "mlp.gate_proj.weight"] = t(w["w1"][l])
        sd[p + "mlp.down_proj.weight"] = t(w["w2"][l])
        sd[p + "mlp.up_proj.weight"] = t(w["w3"][l])
    sd["lm_head.weight"] = t(w["emb"] if cfg["tied"] else w["wcls"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # With tied embeddings lm_head may be reported either way; anything else is a bug.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        sys.exit(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    if cfg["tied"]:
        model.tie_weights()
    return model


# ---------------------------------------------------------------------------------------
# llama2.c tokenizer (tok512.bin): encode/decode exactly as run.c does

class Llama2cTokenizer:
    def __init__(self, path, vocab_size):
        raw = open(path, "rb").read()
        (self.max_len,) = struct.unpack_from("<i", raw, 0)
        off = 4
        self.pieces, self.scores = [], []
        for _ in range(vocab_size):
            score, n = struct.unpack_from("<fi", raw, off)
            off += 8
            self.pieces.append(raw[off:off + n])
            off += n
            self.scores.append(score)
        self.lookup = {}
        for i, p in enumerate(self.pieces):
            self.lookup.setdefault(p, i)  # run.c's bsearch finds some match; pieces are unique

    def encode(self, text, bos=True):
        ids = [BOS] if bos else []
        if text:
            ids.append(self.lookup[b" "])  # dummy prefix, as sentencepiece add_dummy_prefix
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(x + 3 for x in b)  # byte fallback: <0x00> is id 3
        while True:
            best, best_i, best_id = -1e10, -1, -1
            for i in range(len(ids) - 1):
                m = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if m is not None and self.scores[m] > best:
                    best, best_i, best_id = self.scores[m], i, m
            if best_i < 0:
                break
            ids[best_i:best_i + 2] = [best_id]
        return ids

    def decode_piece(self, prev, tok):
        p = self.pieces[tok]
        if prev == BOS and p.startswith(b" "):
            p = p[1:]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            p = bytes([int(p[3:5], 16)])
        return p

    def decode(self, ids, prev=BOS):
        out = b""
        for t in ids:
            out += self.decode_piece(prev, t)
            prev = t
        return out.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------
# helpers

def r7(x):
    """Rounds floats to 7 significant digits (float32 carries ~7.2)."""
    return [float(f"{v:.7g}") for v in np.asarray(x, dtype=np.float64).ravel()]


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids])).logits[0].float().numpy()


@torch.no_grad()
def greedy(model, ids, n):
    """Manual argmax loop (full recompute each step, so no cache subtleties); stops only
    at n tokens. Returns the tokens, the last-row logits of every step, and the margin
    between the best and second-best logit (how fragile an exact-token check is)."""
    seq = list(ids)
    toks, step_logits, margins = [], [], []
    for _ in range(n):
        row = model(torch.tensor([seq])).logits[0, -1].float().numpy()
        t = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        toks.append(t)
        step_logits.append(row)
        margins.append(float(top2[1] - top2[0]))
        seq.append(t)
    return toks, step_logits, margins


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    return os.path.getsize(path)


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__}


# ---------------------------------------------------------------------------------------
# 1-2: stories260K

KNOWN_STORY = ("Once upon a time, there was a little girl named Lily. She loved to play "
               "outside in the park. One day, she saw a big, red ball.")

STORY_PROMPTS = [
    "Once upon a time",
    "Lily and Ben went to the park.",
    "Once upon a time, there was a little dog named Max. Max liked to run and jump in the "
    "big green garden. One day, Max found a shiny red ball under a tree.",
]
STORY_CONTINUE = 64
# decode steps whose full logits are stored (the rest: tokens only, to stay < 1 MB)
STORY_STEP_ROWS = [0, 1, 15, 31, 47, 63]


def stories(args):
    cfg, w = read_llama2c(args.model)
    model = hf_from_llama2c(cfg, w)
    tok = Llama2cTokenizer(args.tokenizer, cfg["vocab"])

    # The conversion is right only if it reproduces llama2.c's documented story.
    toks, _, _ = greedy(model, [BOS], 60)
    text = tok.decode(toks)
    if not text.startswith(KNOWN_STORY):
        sys.exit(f"conversion check failed: greedy story from BOS is {text!r}")
    print(f"stories260K: conversion verified: {text[:80]!r}...")

    out = {"model": "models/stories260K.bin", "tokenizer": "models/tok512.bin",
           "generator": "tools/hf_reference.py", "versions": versions(),
           "math": "float32", "vocab_size": cfg["vocab"], "bos_story": text,
           "prompts": []}
    for ptext in STORY_PROMPTS:
        ids = tok.encode(ptext)
        lg = logits_of(model, ids)
        cont, step_logits, margins = greedy(model, ids, STORY_CONTINUE)
        out["prompts"].append({
            "text": ptext, "ids": ids,
            "logits": r7(lg),  # [len(ids)][vocab], row-major
            "greedy": cont,
            "greedy_text": tok.decode(cont, prev=ids[-1]),
            "step_rows": STORY_STEP_ROWS,
            "step_logits": r7(np.stack([step_logits[s] for s in STORY_STEP_ROWS])),
            "min_margin": float(f"{min(margins):.4g}"),
        })
        print(f"  prompt {len(ids):3d} tokens, min greedy margin {min(margins):.3g}: "
              f"{out['prompts'][-1]['greedy_text'][:60]!r}")
    size = write_json(os.path.join(args.out, "golden", "stories260K.json"), out)
    print(f"  wrote golden/stories260K.json ({size} bytes)")
    if size >= 1 << 20:
        sys.exit("golden/stories260K.json is over 1 MB")


# ---------------------------------------------------------------------------------------
# 3: synthetic bf16 GQA model with llama3 rope scaling

SYNTH_SEED = 1234
SYNTH_STD = 0.08
SYNTH_PROMPT_LENS = [160, 97]  # both past original_max_position_embeddings (64)
SYNTH_CONTINUE = 32


def synth_config():
    return LlamaConfig(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS, hidden_act="silu",
        attention_bias=False, mlp_bias=False, initializer_range=SYNTH_STD)


def classic_config_json(path):
    """Rewrites a transformers-5 config.json (rope_parameters) in the layout of the Llama 3
    checkpoints on the Hub (top-level rope_theta + rope_scaling, torch_dtype), which is
    what tessera must read. The sharded copy keeps the transformers-5 layout so both
    spellings are covered."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def synth(args):
    torch.manual_seed(SYNTH_SEED)
    conf = synth_config()
    model = LlamaForCausalLM(conf).float().eval()
    # Explicit init, in parameter order: matrices N(0, std); norm gains 1 + N(0, 0.2) so
    # that a loader that ignores (or misplaces) a norm weight is caught.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(SYNTH_STD * torch.randn_like(p))
    model = model.to(torch.bfloat16)

    d1 = os.path.join(args.out, "synth_bf16_gqa")
    d2 = os.path.join(args.out, "synth_bf16_gqa_sharded")
    for d in (d1, d2):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d1, safe_serialization=True)
    model.save_pretrained(d2, safe_serialization=True, max_shard_size="100KB")
    for d in (d1, d2):
        gc = os.path.join(d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)  # not needed by tessera; keeps the fixture minimal
    classic_config_json(os.path.join(d1, "config.json"))
    for d in (d1, d2):
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o644)  # safetensors writes 0600
    shards = sorted(f for f in os.listdir(d2) if f.endswith(".safetensors"))
    if not (2 <= len(shards) <= 4) or not os.path.exists(
            os.path.join(d2, "model.safetensors.index.json")):
        sys.exit(f"unexpected sharding: {shards}")
    size1 = os.path.getsize(os.path.join(d1, "model.safetensors"))
    print(f"synth_bf16_gqa: model.safetensors {size1} bytes; sharded: {shards}")
    if size1 >= 300 * 1024:
        sys.exit("synth model is over 300 KB")

    # Reference: the saved bf16 weights, upcast, f32 math. Both directories must load to
    # the same model (and the classic config must mean the same as the v5 one).
    ref = LlamaForCausalLM.from_pretrained(d1, dtype=torch.float32,
                                           attn_implementation="eager").eval()
    ref2 = LlamaForCausalLM.from_pretrained(d2, dtype=torch.float32,
                                            attn_implementation="eager").eval()
    for (k, a), (k2, b) in zip(ref.state_dict().items(), ref2.state_dict().items()):
        if k != k2 or not torch.equal(a, b):
            sys.exit(f"sharded copy differs at {k}")
    rp = ref.config.rope_parameters
    if rp.get("rope_type") != "llama3" or rp.get("rope_theta") != 500000.0:
        sys.exit(f"classic config.json read back wrong: {rp}")
    bf = LlamaForCausalLM.from_pretrained(d1, dtype=torch.bfloat16,
                                          attn_implementation="eager").eval()

    g = torch.Generator().manual_seed(SYNTH_SEED + 1)
    out = {"model": "tests/data/synth_bf16_gqa", "sharded": "tests/data/synth_bf16_gqa_sharded",
           "generator": "tools/hf_reference.py", "versions": versions(),
           "math": "float32 (bf16 weights upcast)", "vocab_size": conf.vocab_size,
           "seed": SYNTH_SEED, "init_std": SYNTH_STD, "prompts": []}
    worst_bf16 = 0.0
    worst_bf16_rel = 0.0
    for n in SYNTH_PROMPT_LENS:
        ids = [BOS] + torch.randint(3, conf.vocab_size, (n - 1,), generator=g).tolist()
        lg = logits_of(ref, ids)
        lgb = logits_of(bf, ids)
        diff = float(np.max(np.abs(lg - lgb)))
        worst_bf16 = max(worst_bf16, diff)
        worst_bf16_rel = max(worst_bf16_rel, diff / float(np.max(np.abs(lg))))
        rows = sorted(set(range(0, n, 10)) | {n - 1})
        cont, step_logits, margins = greedy(ref, ids, SYNTH_CONTINUE)
        cont_bf, _, _ = greedy(bf, ids, SYNTH_CONTINUE)
        agree = next((i for i, (a, b) in enumerate(zip(cont, cont_bf)) if a != b),
                     SYNTH_CONTINUE)
        out["prompts"].append({
            "ids": ids, "rows": rows, "logits": r7(lg[rows]),
            "greedy": cont, "step_logits_last": r7(step_logits[-1]),
            "min_margin": float(f"{min(margins):.4g}"),
            "logit_absmax": float(f"{float(np.max(np.abs(lg))):.4g}"),
            "bf16_math_max_abs_diff": float(f"{diff:.4g}"),
            "bf16_math_greedy_agree_tokens": agree,
        })
        print(f"  prompt {n}: |logit|max {np.max(np.abs(lg)):.3g}, std {lg.std():.3g}, "
              f"min margin {min(margins):.3g}, bf16-math max|diff| {diff:.3g}, "
              f"bf16 greedy agrees for {agree}/{SYNTH_CONTINUE} tokens")
    out["bf16_math_max_abs_diff"] = float(f"{worst_bf16:.4g}")
    out["bf16_math_max_rel_diff"] = float(f"{worst_bf16_rel:.4g}")
    size = write_json(os.path.join(args.out, "golden", "synth_bf16_gqa.json"), out)
    print(f"  wrote golden/synth_bf16_gqa.json ({size} bytes)")


def check_hf_dir(args):
    """transformers must read tessera's export back to the reference logits."""
    model = LlamaForCausalLM.from_pretrained(args.check_hf_dir, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    with open(os.path.join(args.out, "golden", "stories260K.json")) as f:
        gold = json.load(f)
    worst = 0.0
    for p in gold["prompts"]:
        lg = logits_of(model, p["ids"])
        worst = max(worst, float(np.max(np.abs(lg.ravel() - np.array(p["logits"])))))
    print(f"{args.check_hf_dir}: max abs logit error vs golden {worst:.3g}")
    if not worst <= 1e-4:
        sys.exit("exported model does not match the reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/stories260K.bin")
    ap.add_argument("--tokenizer", default="models/tok512.bin")
    ap.add_argument("--out", default="tests/data")
    ap.add_argument("--check-hf-dir", help="only check a tessera-exported HF directory")
    args = ap.parse_args()
    if args.check_hf_dir:
        check_hf_dir(args)
        return
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # fixed reduction order: identical bits on every rerun
    stories(args)
    synth(args)


if __name__ == "__main__":
    main()
