#!/usr/bin/env python3
"""W8A8 Q8_0 reference for tessera's `--dtype q8_0` (tests/data/golden/synth_bf16_gqa_q8_0.json).

transformers' LlamaForCausalLM on tests/data/synth_bf16_gqa in float32 math (eager attention),
with GGUF Q8_0 numerics simulated by the `gguf` package (gguf.quants.quantize/dequantize,
bit-exact with ggml's reference): every matrix tessera stores as Q8_0 gets its dequantized
Q8_0 weights, and every input row of those Linear layers is quantized and dequantized the
same way per token (activations Q8_0, as llama.cpp and tessera compute). The embedding is
Q8_0 too (rows dequantized). Which matrices are Q8_0 follows runtime/model/quantize.c:
cols % 32 == 0, o_proj only when head_dim % 32 == 0, down_proj only when the hidden width
has at least n_heads whole 32-column units; the others keep their BF16 weights and f32
inputs. The prompts are those of tests/data/golden/synth_bf16_gqa.json; the golden holds
the same keys (ids, rows, logits, greedy, step_logits_last), so tests/unit/test_golden.c
reads it as it reads that file.

Usage: python3 tools/q8_reference.py   (torch, transformers, gguf, numpy)
"""
import json
import os

import numpy as np
import torch
import transformers
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from transformers import LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(ROOT, "tests/data/synth_bf16_gqa")
SRC = os.path.join(ROOT, "tests/data/golden/synth_bf16_gqa.json")
OUT = os.path.join(ROOT, "tests/data/golden/synth_bf16_gqa_q8_0.json")


def q8(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().float().numpy().astype(np.float32)
    shape = a.shape
    a = a.reshape(-1, shape[-1])
    d = dequantize(quantize(a, T.Q8_0), T.Q8_0).reshape(shape)
    return torch.from_numpy(np.ascontiguousarray(d, dtype=np.float32))


def eligible(cfg, name, cols):
    if cols % 32:
        return False
    if name.endswith("o_proj"):
        return cfg.head_dim % 32 == 0
    if name.endswith("down_proj"):
        return cfg.intermediate_size % 32 == 0 and cfg.intermediate_size // 32 >= cfg.num_attention_heads
    return True


def simulate(model):
    cfg = model.config
    with torch.no_grad():
        emb = model.model.embed_tokens
        emb.weight.copy_(q8(emb.weight))
        n_q8 = 1
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear) or not eligible(cfg, name, mod.in_features):
                continue
            mod.weight.copy_(q8(mod.weight))
            mod.register_forward_pre_hook(lambda m, args: (q8(args[0]),))
            n_q8 += 1
    return n_q8


def r7(x):
    return [float(f"{v:.7g}") for v in np.asarray(x, dtype=np.float64).ravel()]


@torch.no_grad()
def main():
    torch.manual_seed(0)
    src = json.load(open(SRC))
    model = LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    n_q8 = simulate(model)
    prompts = []
    for p in src["prompts"]:
        ids = p["ids"]
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
        rows = p.get("rows", list(range(len(ids))))
        seq, toks, margins, last = list(ids), [], [], None
        for _ in range(len(p["greedy"])):
            row = model(torch.tensor([seq])).logits[0, -1].float().numpy()
            t = int(np.argmax(row))
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
            toks.append(t)
            seq.append(t)
            last = row
        prompts.append({"ids": ids, "rows": rows, "logits": r7(logits[rows]), "greedy": toks,
                        "step_logits_last": r7(last), "min_margin": round(min(margins), 6)})
    out = {"model": "tests/data/synth_bf16_gqa", "math": "W8A8 Q8_0 simulation (gguf-py), f32",
           "q8_0_matrices": n_q8, "vocab_size": src["vocab_size"],
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "gguf": getattr(gguf, "__version__", "0.19")},
           "prompts": prompts}
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, "q8_0 matrices:", n_q8, "margins:", [p["min_margin"] for p in prompts])


if __name__ == "__main__":
    main()
