#!/usr/bin/env python3
"""Writes the FP8 (E4M3, compressed-tensors layout) test data and its goldens with torch's
float8_e4m3fn:

  tests/data/fp8_synth/        tests/data/synth_bf16_gqa with every layer projection stored as
                               compressed-tensors FP8: NAME.weight F8_E4M3 [out, in] and
                               NAME.weight_scale BF16 (the model dtype, as compressed-tensors
                               stores it), per output channel ([out, 1]) in layer 0 and per
                               tensor ([1]) in layer 1; embedding, lm_head and norms stay
                               BF16; config.json gains quantization_config (two config groups,
                               format float-quantized). The compressed-tensors package is not
                               needed: the files are written by hand as it would write them.
  tests/data/golden/fp8_synth.json
                               transformers' LlamaForCausalLM in f32 with the FP8 weights
                               dequantized (code * scale, exact in f32): the math of the CUDA
                               backend's FP8 kernels up to their f32 accumulation order.
  tests/data/golden/fp8_synth_q8_0.json
                               what the CPU computes (runtime/model/fp8.h): the dequantized
                               FP8 weights requantized to Q8_0 with W8A8 numerics (gguf-py,
                               as tools/q8_reference.py) on the matrices Q8_0 fits, the others
                               in f32 with f32 inputs; embedding and classifier BF16.
  tests/data/fp8/quant_f32.bin, quant_codes.bin, quant_scales.bin
                               a [16, 96] f32 matrix with edge rows, and its per-channel FP8 as
                               torch computes it (scale = amax / 448 in f32, codes =
                               (x / scale).clamp(-448, 448).to(float8_e4m3fn)), for
                               tsr_fp8_quantize_tensor (--dtype fp8); little-endian.

Usage: python3 tools/make_fp8_testdata.py   (torch, transformers, safetensors, gguf, numpy)
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from q8_reference import eligible, q8, r7  # noqa: E402  (same W8A8 numerics)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests/data/synth_bf16_gqa")
OUT = os.path.join(ROOT, "tests/data/fp8_synth")
GOLD_SRC = os.path.join(ROOT, "tests/data/golden/synth_bf16_gqa.json")
GOLD_F32 = os.path.join(ROOT, "tests/data/golden/fp8_synth.json")
GOLD_Q8 = os.path.join(ROOT, "tests/data/golden/fp8_synth_q8_0.json")
FP8_MAX = 448.0
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def fp8(w: torch.Tensor, per_channel: bool, scale_dtype):
    """compressed-tensors' float quantization: scale = amax / 448 in the scale dtype."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
    scale = (amax / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny).to(scale_dtype)
    s = scale.float() if per_channel else scale.float().reshape(1, 1)
    codes = (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def write_model():
    t = load_file(os.path.join(SRC, "model.safetensors"))
    out, deq = {}, {}
    for k, v in t.items():
        name = k[: -len(".weight")] if k.endswith(".weight") else None
        if name and "layers." in k and any(name.endswith(p) for p in PROJ):
            layer = int(k.split(".")[2])
            codes, scale = fp8(v, per_channel=(layer == 0), scale_dtype=torch.bfloat16)
            out[k] = codes.contiguous()
            out[name + ".weight_scale"] = scale.contiguous()
            deq[k] = codes.float() * (scale.float() if layer == 0 else scale.float().reshape(1, 1))
        else:
            out[k] = v.contiguous()
    os.makedirs(OUT, exist_ok=True)
    save_file(out, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(SRC, "config.json")))

    def group(strategy, layer):
        return {"targets": ["re:model[.]layers[.]%d[.].*" % layer],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                            "strategy": strategy, "dynamic": False, "observer": "minmax"},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                      "strategy": "token", "dynamic": True, "observer": None}}

    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": group("channel", 0), "group_1": group("tensor", 1)}}
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return deq


def goldens(deq, q8_sim, path, math):
    src = json.load(open(GOLD_SRC))
    model = LlamaForCausalLM.from_pretrained(SRC, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    cfg = model.config
    sd = model.state_dict()
    n_q8 = 0
    with torch.no_grad():
        for k, v in deq.items():
            sd[k].copy_(v)
        if q8_sim:
            for name, mod in model.named_modules():
                if not isinstance(mod, torch.nn.Linear) or name == "lm_head":
                    continue
                if not eligible(cfg, name, mod.in_features):
                    continue
                mod.weight.copy_(q8(mod.weight))
                mod.register_forward_pre_hook(lambda m, args: (q8(args[0]),))
                n_q8 += 1
        prompts = []
        for p in src["prompts"]:
            ids = p["ids"]
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            rows = p.get("rows", list(range(len(ids))))
            seq, toks, margins, last = list(ids), [], [], None
            for _ in range(len(p["greedy"])):
                row = model(torch.tensor([seq])).logits[0, -1].float().numpy()
                tok = int(np.argmax(row))
                top2 = np.sort(row)[-2:]
                margins.append(float(top2[1] - top2[0]))
                toks.append(tok)
                seq.append(tok)
                last = row
            prompts.append({"ids": ids, "rows": rows, "logits": r7(logits[rows]), "greedy": toks,
                            "step_logits_last": r7(last), "min_margin": round(min(margins), 6)})
    out = {"model": "tests/data/fp8_synth", "generator": "tools/make_fp8_testdata.py",
           "math": math, "q8_0_matrices": n_q8, "vocab_size": src["vocab_size"],
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "prompts": prompts}
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, "margins:", [p["min_margin"] for p in prompts],
          "greedy:", [p["greedy"] for p in prompts])


def quant_edges():
    rng = np.random.default_rng(2708)
    w = rng.standard_normal((16, 96)).astype(np.float32)
    w[0] = 0.0                                        # all zero: scale 1
    w[1] *= np.float32(1e-6)                          # codes in the subnormal range
    w[2] *= np.float32(3e4)                           # large values
    w[3, :] = np.float32(-2.0)                        # constant negative row
    w[3, 5] = np.float32(-7.0)
    w[4] = np.linspace(-1, 1, 96).astype(np.float32)  # ties after scaling
    w[5, ::7] = np.float32(1e-30)                     # far below the smallest subnormal
    x = torch.from_numpy(w)
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    d = os.path.join(ROOT, "tests/data/fp8")
    os.makedirs(d, exist_ok=True)
    w.astype("<f4").tofile(os.path.join(d, "quant_f32.bin"))
    codes.view(torch.uint8).numpy().tofile(os.path.join(d, "quant_codes.bin"))
    scale.numpy().astype("<f4").ravel().tofile(os.path.join(d, "quant_scales.bin"))


def main():
    torch.manual_seed(0)
    deq = write_model()
    goldens(deq, False, GOLD_F32, "FP8 weights dequantized (code * scale), f32")
    goldens(deq, True, GOLD_Q8, "FP8 weights dequantized, then W8A8 Q8_0 (gguf-py) where it "
                                "fits, f32")
    quant_edges()


if __name__ == "__main__":
    main()
