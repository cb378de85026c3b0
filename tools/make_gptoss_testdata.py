#!/usr/bin/env python3
"""Tiny random GPT-OSS models and their reference outputs from Hugging Face transformers,
for tests/unit/test_gptoss.c (tessera is never compared with its own output).

What it writes (under --out, default tests/data):
  arch/gptoss_f32/     config.json (5.x spelling: rope_parameters) + model.safetensors from
                       save_pretrained: experts in its transposed [E, in, out] layout
  arch/gptoss_bf16/    the same model with every weight rounded to bf16 and the expert
                       matrices replaced by their MXFP4 round trip (so that the next
                       directory holds exactly the same values), save_pretrained in bf16
  arch/gptoss_mxfp4/   the bf16 directory with the expert matrices as MXFP4 blocks and
                       scales ([E, out, in/32, 16] and [E, out, in/32], U8; element 2j is
                       the low nibble of byte j), written here (transformers cannot write
                       MXFP4 on a CPU) with a quantization_config of quant_method mxfp4
  golden/arch_gptoss_f32.json, golden/arch_gptoss_q.json
                       prompt ids, logits at a few prompt positions, a 32-token greedy
                       continuation and the logits of its last step (tests/unit/
                       test_golden.c's format), plus the smallest router top-k margin
                       (k-th minus (k+1)-th router logit over every token and layer seen)
                       and the smallest greedy top-1 margin. arch_gptoss_q is the
                       reference of both the bf16 and the mxfp4 directory.

The model: 2 layers (sliding window 8, then full attention), hidden 32, 4 query heads and 2
kv heads of 16 (so the q width 64 differs from hidden), 4 experts with 2 per token,
intermediate 32, YaRN rope (factor 32, truncate false), attention biases, sinks. Every
parameter is random (biases, norms and sinks too). Prompts are longer than the window and
greedy decode goes far past it. Seeds and prompts are redrawn until both margins are at
least 1e-3, so that float32 summation order cannot flip an expert or a token. The mxfp4
directory is also loaded back with transformers' Mxfp4Config(dequantize=True) and must give
the bf16 directory's logits exactly (checks the nibble order and scale bias written here).

Rerun (from the repository root; seconds on a CPU):
  python3 tools/make_gptoss_testdata.py --out tests/data
Needs torch, transformers (5.x) and safetensors; CI only reads what it wrote.
"""

import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM

VOCAB = 160
E, TOPK, WINDOW = 4, 2, 8
PROMPT_LENS = (6, 23, 41)
N_GREEDY = 32
ROWS = 4
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def config():
    cfg = GptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        num_local_experts=E, num_experts_per_tok=TOPK, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5,
        attention_bias=True, tie_word_embeddings=False, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096})
    cfg._attn_implementation = "eager"
    return cfg


def build(seed):
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config()).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
            elif "experts" in name and not name.endswith("bias"):
                p.copy_(0.15 * torch.randn_like(p))
            elif "router" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def mxfp4_encode(w):
    """w: [E, out, in] float32 -> blocks U8 [E, out, in/32, 16], scales U8 [E, out, in/32]."""
    e_, o_, i_ = w.shape
    b = w.reshape(e_, o_, i_ // 32, 32)
    amax = np.abs(b).max(axis=-1)
    with np.errstate(divide="ignore"):
        ex = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-38))) - 2, -127)
    ex = np.clip(ex, -127, 127).astype(np.int32)
    scaled = np.abs(b) / np.ldexp(1.0, ex)[..., None]
    code = np.abs(scaled[..., None] - FP4).argmin(axis=-1).astype(np.uint8)
    code |= np.where(b < 0, 8, 0).astype(np.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (ex + 127).astype(np.uint8)


def mxfp4_decode(blocks, scales):
    lut = np.concatenate([FP4, -FP4])
    lo, hi = blocks & 15, blocks >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    v = lut[codes] * np.ldexp(1.0, scales.astype(np.int32) - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32).astype(np.float32)


class Margins:
    """Smallest router top-k margin over every forward pass while installed."""

    def __init__(self, model):
        self.router = math.inf
        self.hooks = [layer.mlp.router.register_forward_hook(self.hook)
                      for layer in model.model.layers]

    def hook(self, mod, inp, out):
        logits = out[0].detach()
        top = torch.topk(logits, TOPK + 1, dim=-1).values
        self.router = min(self.router, float((top[:, TOPK - 1] - top[:, TOPK]).min()))


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def reference(model, gen):
    """Prompts, logits rows, greedy continuations and margins; None when one is too thin."""
    marg = Margins(model)
    prompts, greedy_min = [], math.inf
    try:
        for n in PROMPT_LENS:
            ids = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
            full = logits_of(model, ids)
            rows = sorted({0, n // 3, (2 * n) // 3, n - 1})[:ROWS]
            seq, greedy, last, step = list(ids), [], None, full[-1]
            for i in range(N_GREEDY):
                top = torch.topk(step, 2).values
                greedy_min = min(greedy_min, float(top[0] - top[1]))
                tok = int(torch.argmax(step))
                greedy.append(tok)
                last = step
                if i + 1 < N_GREEDY:
                    seq.append(tok)
                    step = logits_of(model, seq)[-1]
            prompts.append({"ids": ids, "rows": rows,
                            "logits": [round(float(v), 6) for r in rows for v in full[r]],
                            "greedy": greedy,
                            "step_logits_last": [round(float(v), 6) for v in last]})
    finally:
        for h in marg.hooks:
            h.remove()
    if greedy_min < 1e-3 or marg.router < 1e-3:
        return None
    return prompts, marg.router, greedy_min


def quantize_model(model):
    """Rounds every parameter to bf16 and the experts through MXFP4; returns the codes."""
    codes = {}
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        for li, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(ex, name)  # [E, in, out]
                w = p.detach().transpose(1, 2).contiguous().numpy()  # [E, out, in]
                blocks, scales = mxfp4_encode(w)
                deq = torch.from_numpy(mxfp4_decode(blocks, scales)).transpose(1, 2)
                p.copy_(deq)
                codes[f"model.layers.{li}.mlp.experts.{name}"] = (blocks, scales)
    return codes


def write_mxfp4_dir(bf16_dir, out_dir, codes):
    os.makedirs(out_dir, exist_ok=True)
    tensors = load_file(os.path.join(bf16_dir, "model.safetensors"))
    for name, (blocks, scales) in codes.items():
        del tensors[name]
        tensors[name + "_blocks"] = torch.from_numpy(blocks)
        tensors[name + "_scales"] = torch.from_numpy(scales)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(bf16_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def save(model, d, dtype):
    shutil.rmtree(d, ignore_errors=True)
    m = model if dtype is None else GptOssForCausalLM(model.config).to(dtype)
    if dtype is not None:
        m.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
    m.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def golden(name, seed, prompts, router_min, greedy_min, math_note):
    return {"model": f"tests/data/arch/{name}", "generator": "tools/make_gptoss_testdata.py",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "math": math_note, "architecture": "GptOssForCausalLM", "vocab_size": VOCAB,
            "seed": seed, "min_router_margin": round(router_min, 6),
            "min_greedy_margin": round(greedy_min, 6), "prompts": prompts}


def check_decode_rule():
    """transformers' MXFP4 decode equals code value * float32(2^(scale - 127)) (2^128 = inf)
    on every code and scale byte: the rule kernels/cpu/mxfp4_cpu.c implements and
    tests/unit/test_gptoss.c checks bit for bit."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    byte = torch.arange(256, dtype=torch.int32)
    blocks = byte.reshape(16, 16).to(torch.uint8).expand(256, 16, 16).reshape(256, 1, 16, 16)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(256, 1, 1).expand(
        256, 1, 16).contiguous()
    hf = convert_moe_packed_tensors(blocks.contiguous(), scales, dtype=torch.float32)
    hf = hf.reshape(256, 512).numpy()  # [scale][element]
    codes = np.stack([np.arange(256) & 15, np.arange(256) >> 4], axis=-1).reshape(512)
    lut = np.concatenate([FP4, -FP4])
    with np.errstate(over="ignore", invalid="ignore"):
        pw = np.array([np.float32(2.0) ** np.float32(s - 127) for s in range(256)], np.float32)
        want = (lut[codes][None, :] * pw[:, None]).astype(np.float32)
    same = (hf.view(np.uint32) == want.view(np.uint32)) | (np.isnan(hf) & np.isnan(want))
    assert same.all(), "transformers' MXFP4 decode differs from the documented rule"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(os.path.join(args.out, "golden"), exist_ok=True)
    check_decode_rule()
    arch = os.path.join(args.out, "arch")
    seed = 2800
    while True:  # margins of both references must hold for one seed
        model = build(seed)
        gen = torch.Generator().manual_seed(seed)
        ref = None
        for _ in range(20):
            ref = reference(model, gen)
            if ref:
                break
        qmodel = build(seed)
        codes = quantize_model(qmodel)
        qref = None
        gen = torch.Generator().manual_seed(seed + 1)
        for _ in range(20):
            qref = reference(qmodel, gen)
            if qref:
                break
        if ref and qref:
            break
        seed += 1
    save(model, os.path.join(arch, "gptoss_f32"), None)
    save(qmodel, os.path.join(arch, "gptoss_bf16"), torch.bfloat16)
    mx = os.path.join(arch, "gptoss_mxfp4")
    shutil.rmtree(mx, ignore_errors=True)
    write_mxfp4_dir(os.path.join(arch, "gptoss_bf16"), mx, codes)
    # transformers' own MXFP4 dequantization must give the bf16 directory's logits exactly
    mq = GptOssForCausalLM.from_pretrained(
        mx, quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.float32).eval()
    mq.config._attn_implementation = "eager"
    ids = qref[0][0]["ids"]
    diff = float((logits_of(mq, ids) - logits_of(qmodel, ids)).abs().max())
    assert diff == 0.0, f"transformers' MXFP4 dequantization differs by {diff}"
    for name, r, note in (("gptoss_f32", ref, "float32"),
                          ("gptoss_q", qref, "float32 (bf16 weights and MXFP4 experts "
                                             "dequantized, upcast)")):
        with open(os.path.join(args.out, "golden", f"arch_{name}.json"), "w") as f:
            json.dump(golden(name, seed, r[0], r[1], r[2], note), f, separators=(",", ":"))
        print(f"{name}: seed {seed}, min router margin {r[1]:.4g}, "
              f"min greedy margin {r[2]:.4g}")


if __name__ == "__main__":
    main()
