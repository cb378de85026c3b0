#!/usr/bin/env python3
"""Reference logits for SmolLM2-135M-Instruct (Q4_1 GGUF) from Hugging Face transformers, which
tests/unit/test_gguf_smollm2.c compares tessera with (tolerances: docs/correctness.md).

transformers loads the same GGUF file (`from_pretrained(dir, gguf_file=...)`): it dequantizes
Q4_1/Q8_0 to float32 with the gguf package and undoes llama.cpp's Q/K row permutation, so the
reference is LlamaForCausalLM in float32 (eager attention, CPU, one thread) on exactly the
weights tessera dequantizes. Prompt ids come from the reference tokenizer of
tools/gguf_tokenizer_reference.py, so tokenization is not under test here.

Writes tests/data/gguf/smollm2_logits.json: 5 prompts of 10 to ~2000 tokens (ChatML chats and
long documents); for each, at 8 prompt positions and the last one, the 32 largest logits
(id, value), the 256 largest at the last position, and a 64-token greedy continuation with the
margin between the two best logits at each step.

Usage: python3 tools/gguf_reference.py (pip install torch transformers gguf tokenizers)
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_tokenizer_reference import build  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "data", "gguf", "smollm2_logits.json")
GREEDY = 64
TOP = 32


def chat(user):
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n"
            "<|im_start|>assistant\n")


def prompts(tok):
    def doc(rel, n):
        with open(os.path.join(ROOT, rel)) as f:
            text = f.read()
        ids = tok.encode(text, add_special_tokens=False).ids[:n]
        return ids
    out = [
        tok.encode("The capital of France is a city that many people visit because",
                   add_special_tokens=False).ids,
        tok.encode(chat("What is the capital of France?"), add_special_tokens=False).ids,
        tok.encode(chat("Write a short poem about the sea, then explain in two sentences "
                        "why people have always written about it."), add_special_tokens=False).ids,
        doc("README.md", 700),
        doc("docs/architecture.md", 2000),
    ]
    return out


def top_pairs(row, k):
    idx = np.argsort(-row, kind="stable")[:k]
    return [[int(i), float(f"{row[i]:.6f}")] for i in idx]


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok, _ = build(MODEL)
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(MODEL),
                                                 gguf_file=os.path.basename(MODEL),
                                                 dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    res = {"model": "models/SmolLM2-135M-Instruct.Q4_1.gguf",
           "generator": "tools/gguf_reference.py",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "math": "float32 (GGUF dequantized by transformers)", "prompts": []}
    for ids in prompts(tok):
        n = len(ids)
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
        lg = out.logits[0].float().numpy()
        rows = sorted(set(np.linspace(0, n - 1, 9).astype(int).tolist()))
        top = [top_pairs(lg[r], 256 if r == n - 1 else TOP) for r in rows]
        past = out.past_key_values
        cur = lg[-1]
        greedy, margins = [], []
        for _ in range(GREEDY):
            s = np.sort(cur)
            t = int(np.argmax(cur))
            greedy.append(t)
            margins.append(float(f"{s[-1] - s[-2]:.5g}"))
            with torch.no_grad():
                o = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            cur = o.logits[0, -1].float().numpy()
        text = tok.decode(greedy, skip_special_tokens=False)
        print(f"prompt of {n} tokens: |logit|max {np.abs(lg).max():.3g}; greedy: {text[:80]!r}",
              file=sys.stderr)
        res["prompts"].append({"ids": ids, "rows": rows, "top": top, "greedy": greedy,
                               "greedy_margin": margins, "greedy_text": text})
    with open(OUT, "w") as f:
        f.write("{\n")
        keys = [k for k in res if k != "prompts"]
        for k in keys:
            f.write(f" {json.dumps(k)}: {json.dumps(res[k])},\n")
        f.write(' "prompts": [\n' + ",\n".join("  " + json.dumps(p) for p in res["prompts"])
                + "\n ]\n}\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
