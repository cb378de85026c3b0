#!/usr/bin/env python3
"""Reference logits from PyTorch (transformers' LlamaForCausalLM) for tsr_logits_check.

The device check (tests/device/run.sh) computes these on the GPU machine, in the same run
as tessera's CUDA logits, and bench/logits_check.c compares: tessera is never compared only
with itself. The math is float32 with eager attention (BF16-stored weights are upcast, as
tools/hf_reference.py does for the bundled golden files); --device cuda runs it on the GPU
with TF32 off.

Models: a Hugging Face directory (config.json + safetensors: tests/data/synth_bf16_gqa, or
what `tessera convert` writes) or a llama2.c checkpoint (*.bin, e.g. models/stories260K.bin,
converted in memory by tools/hf_reference.py's reader, independently of tessera).

Prompts: the ids of every prompt of --prompts-from (a golden JSON file: prompts[].ids, with
its greedy lengths), or --prompt-ids "1,2,3" with --greedy N.

Output (--out FILE.json), the layout of tests/data/golden: model, generator, versions,
device, math, vocab_size, prompts [{ids, logits ([len(ids)][vocab] flat, every prompt row),
greedy (N tokens, free-running argmax with a full recompute per step), step_margins (top-1
minus top-2 logit at each greedy step), min_margin}], and for BF16-stored weights also
bf16_math_max_rel_diff and bf16_math_greedy_agree_tokens per prompt (transformers' own BF16
math against its F32 math: the scale of BF16 rounding on this model).

  python3 tools/torch_reference.py --model tests/data/synth_bf16_gqa \\
      --prompts-from tests/data/golden/synth_bf16_gqa.json --out /tmp/torch_synth.json

Without torch or transformers it prints one line and exits 3 (the device check then reports
the PyTorch comparison as skipped).
"""

import argparse
import json
import os
import sys

MISSING_EXIT = 3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF directory or llama2.c .bin")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts-from", help="golden JSON whose prompts' ids to use")
    src.add_argument("--prompt-ids", help="comma-separated token ids of one prompt")
    ap.add_argument("--greedy", type=int, default=16,
                    help="greedy steps for --prompt-ids (default 16)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    return ap.parse_args(argv)


def load_prompts(args):
    """[(ids, greedy_steps)] from the arguments (no torch needed)."""
    if args.prompt_ids:
        try:
            ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            sys.exit(f"torch_reference.py: --prompt-ids {args.prompt_ids!r}: not integers")
        if not ids or args.greedy < 1:
            sys.exit("torch_reference.py: need at least one id and --greedy >= 1")
        return [(ids, args.greedy)]
    with open(args.prompts_from) as f:
        gold = json.load(f)
    return [(list(p["ids"]), len(p["greedy"])) for p in gold["prompts"]]


def margin_of(row):
    """Top-1 minus top-2 of a 1-D sequence of floats."""
    a, b = sorted(row)[-2:]
    return b - a


def first_divergence(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def r7(values):
    """7 significant digits (float32 carries ~7.2)."""
    return [float(f"{v:.7g}") for v in values]


def main(argv=None):
    args = parse_args(argv)
    prompts = load_prompts(args)
    try:
        import numpy as np
        import torch
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError as e:
        print(f"torch_reference.py: needs numpy, torch and transformers ({e})", file=sys.stderr)
        return MISSING_EXIT

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            print("torch_reference.py: --device cuda but torch sees no GPU", file=sys.stderr)
            return 1
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
        torch.backends.cudnn.allow_tf32 = False

    stored_bf16 = False
    if os.path.isdir(args.model):
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        stored_bf16 = (cfg.get("torch_dtype") or cfg.get("dtype")) in ("bfloat16", "float16")
        model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager")
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import hf_reference  # the llama2.c reader of the bundled golden files
        cfg, w = hf_reference.read_llama2c(args.model)
        model = hf_reference.hf_from_llama2c(cfg, w)
    model = model.to(dev).eval()
    bf = None
    if stored_bf16:
        bf = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                              attn_implementation="eager").to(dev).eval()

    @torch.no_grad()
    def logits_of(mdl, ids):
        return mdl(torch.tensor([ids], device=dev)).logits[0].float().cpu().numpy()

    def greedy(mdl, ids, n):
        seq, toks, margins = list(ids), [], []
        for _ in range(n):
            row = logits_of(mdl, seq)[-1]
            t = int(np.argmax(row))
            toks.append(t)
            margins.append(float(margin_of(row.tolist())))
            seq.append(t)
        return toks, margins

    out = {"model": args.model, "generator": "tools/torch_reference.py",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "numpy": np.__version__},
           "device": dev if dev == "cpu" else torch.cuda.get_device_name(),
           "math": "float32" + (" (bf16 weights upcast)" if stored_bf16 else ""),
           "vocab_size": int(model.config.vocab_size), "prompts": []}
    for ids, n in prompts:
        lg = logits_of(model, ids)
        toks, margins = greedy(model, ids, n)
        p = {"ids": ids, "logits": r7(lg.ravel()), "greedy": toks,
             "step_margins": [float(f"{m:.6g}") for m in margins],
             "min_margin": float(f"{min(margins):.6g}")}
        if bf is not None:
            lgb = logits_of(bf, ids)
            p["bf16_math_max_rel_diff"] = float(
                f"{float(np.max(np.abs(lg - lgb)) / np.max(np.abs(lg))):.4g}")
            p["bf16_math_greedy_agree_tokens"] = first_divergence(toks, greedy(bf, ids, n)[0])
        out["prompts"].append(p)
        print(f"torch_reference.py: {len(ids)} ids, {n} greedy steps, min margin "
              f"{min(margins):.3g}" + (f", bf16 math rel diff {p['bf16_math_max_rel_diff']}, "
                                       f"bf16 greedy agrees {p['bf16_math_greedy_agree_tokens']}"
                                       if bf is not None else ""))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"torch_reference.py: wrote {args.out} ({os.path.getsize(args.out)} bytes) on {dev}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
