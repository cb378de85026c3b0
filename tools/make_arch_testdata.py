#!/usr/bin/env python3
"""Tiny random Qwen2, Qwen3 and Mistral models and their reference outputs from Hugging Face
transformers, for tests/unit/test_arch.c (tessera is never compared with its own output).

What it writes (under --out, default tests/data):
  arch/<family>_<dtype>/       config.json + model.safetensors (save_pretrained), for
                               family in qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm),
                               mistral, and dtype in f32, bf16
  arch/qwen2_bf16.gguf, arch/qwen3_bf16.gguf
                               the bf16 models' weights as a GGUF file (BF16 tensors,
                               llama.cpp's qwen2/qwen3 keys and tensor names, written with
                               the `gguf` package); their reference is the bf16 golden
  golden/arch_<family>_<dtype>.json
                               prompt ids, logits at a few prompt positions, a 16-token
                               greedy continuation and the logits of its last step, in
                               tests/unit/test_golden.c's format

The reference runs in float32 with eager attention; a bf16 model's reference is its bf16
weights upcast to float32 (tessera computes in float32 on bf16 weights too), so both
dtypes differ from transformers only in summation order. Every parameter is drawn at
random (biases and norm weights too: transformers' own init leaves them 0 and 1, which
would not test them). Prompts are redrawn until every greedy step has a top-1 margin of
at least 1e-3, so that rounding cannot flip a token.

Rerun (from the repository root; a few seconds on a CPU):
  python3 tools/make_arch_testdata.py --out tests/data
Needs torch and transformers (pip install torch transformers safetensors); CI only reads
what it wrote.
"""

import argparse
import copy
import json
import os
import shutil

import torch
import transformers
from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, hidden_act="silu")
FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=False)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(use_sliding_window=False,
                                                  attention_bias=False)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None)),
}
PROMPT_LENS = (6, 23, 41)
N_GREEDY = 16
ROWS = 4  # prompt positions with stored logits: spread over the prompt, last included


def build(family, seed):
    cfg_cls, model_cls, extra = FAMILIES[family]
    conf = cfg_cls(**COMMON, **extra)
    conf._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(conf).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def reference(model, gen):
    """Prompts, their logits rows, greedy continuations; None when a margin is too thin."""
    prompts = []
    for n in PROMPT_LENS:
        ids = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
        full = logits_of(model, ids)
        rows = sorted({0, n // 3, (2 * n) // 3, n - 1})[:ROWS]
        seq, greedy, last = list(ids), [], None
        step = full[-1]
        for i in range(N_GREEDY):
            top = torch.topk(step, 2).values
            if float(top[0] - top[1]) < 1e-3:
                return None
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
    return prompts


def write_gguf(model, family, path):
    """llama.cpp's layout for qwen2/qwen3 (convert_hf_to_gguf.py): no rotary permutation
    (NEOX rope), q/k/v biases as attn_{q,k,v}.bias, q/k norms as attn_{q,k}_norm.weight."""
    import gguf
    from gguf import GGMLQuantizationType as T, quants
    c = model.config
    w = gguf.GGUFWriter(path, family)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for name, p in model.state_dict().items():
        x = p.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            continue  # tied
        else:
            parts = name.split(".")  # model.layers.L.<module...>.weight|bias
            out = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.{parts[-1]}"
        if x.ndim == 2:  # matrices in BF16 (exact: the weights are bf16 values)
            w.add_tensor(out, quants.quantize(x, T.BF16), raw_dtype=T.BF16)
        else:  # vectors in F32, as llama.cpp writes them
            w.add_tensor(out, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one summation order: reruns give the same files
    torch.use_deterministic_algorithms(True)
    os.makedirs(os.path.join(args.out, "golden"), exist_ok=True)
    for fi, family in enumerate(FAMILIES):
        for dtype in ("f32", "bf16"):
            seed = 100 + 10 * fi + (dtype == "bf16")
            model = build(family, seed)
            name = f"{family}_{dtype}"
            d = os.path.join(args.out, "arch", name)
            shutil.rmtree(d, ignore_errors=True)
            if dtype == "bf16":
                # The reference is the bf16 weights upcast, in an f32 model: converting the
                # model itself would also round its rotary inv_freq buffer to bf16.
                with torch.no_grad():
                    for prm in model.parameters():
                        prm.copy_(prm.to(torch.bfloat16).float())
                copy.deepcopy(model).to(torch.bfloat16).save_pretrained(
                    d, safe_serialization=True)
            else:
                model.save_pretrained(d, safe_serialization=True)
            for extra in ("generation_config.json",):
                if os.path.exists(os.path.join(d, extra)):
                    os.remove(os.path.join(d, extra))
            gen = torch.Generator().manual_seed(seed)
            prompts = None
            while prompts is None:
                prompts = reference(model, gen)
            golden = {"model": f"tests/data/arch/{name}",
                      "generator": "tools/make_arch_testdata.py",
                      "versions": {"torch": torch.__version__,
                                   "transformers": transformers.__version__},
                      "math": "float32" + (" (bf16 weights upcast)" if dtype == "bf16" else ""),
                      "architecture": type(model).__name__,
                      "vocab_size": VOCAB, "seed": seed, "prompts": prompts}
            with open(os.path.join(args.out, "golden", f"arch_{name}.json"), "w") as f:
                json.dump(golden, f, separators=(",", ":"))
            if dtype == "bf16" and family.startswith("qwen"):
                write_gguf(model, family, os.path.join(args.out, "arch", f"{name}.gguf"))
            print(f"{name}: {type(model).__name__}, "
                  f"{sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
