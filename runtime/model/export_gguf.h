/* Writes a model as one GGUF v3 file (runtime/model/gguf_writer.h), the layout llama.cpp's
 * converter gives and tessera's GGUF loader reads back (runtime/model/gguf_loader.c).
 *
 * Architecture: llama (Mistral too, as llama.cpp names it), qwen2, qwen3; GPT-OSS (and
 * YaRN rope) is refused. Llama 3 rope scaling is stored as llama.cpp stores it, a
 * rope_freqs.weight tensor of per-frequency divisors, with rope.scaling.
 * original_context_length (tessera's GGUF loader recovers the parameters from them). llama files hold attn_q/attn_k rows in llama.cpp's permuted
 * order (adjacent rotary pairs): a source with half-rotation rows (a Hugging Face Llama)
 * is permuted, llama2.c's interleaved rows are written as they are; qwen2/qwen3 rows are
 * never permuted.
 *
 * dtype: F32, F16, BF16, or Q8_0. Vectors (norms, biases) are F32. Under Q8_0 a matrix is
 * Q8_0 (ggml's reference quantizer, kernels/cpu/quant_q8.h; a source already Q8_0 is
 * copied block for block) exactly where `--dtype q8_0` quantizes at load
 * (tsr_model_q8_eligible), and otherwise BF16 (F16 when the source is F16), so the file
 * loads into the very weights `--dtype q8_0` computes with. A source in another block
 * format (Q4_0/Q4_1, FP8) is dequantized to f32 first.
 *
 * Tokenizer (tok, NULL for none): a GGUF file's tokenizer.* keys are copied; a llama2.c
 * tokenizer.bin becomes the `llama` (SentencePiece) keys as llama.cpp's converter writes them
 * (U+2581 for spaces, scores, token types, unknown/BOS/EOS ids 0/1/2); a byte-level BPE
 * tokenizer.json whose pre-tokenizer llama.cpp names (Llama 3's llama-bpe, Qwen2's qwen2,
 * SmolLM's smollm, GPT-2's gpt-2) becomes the `gpt2` keys; other tokenizer.json files (byte
 * fallback, other normalizers or pre-tokenizers) are not carried. *carried: whether a
 * vocabulary (tokenizer.ggml.tokens) was written. When no tokenizer key was, the model's
 * BOS/EOS ids are. */
#ifndef TSR_RUNTIME_EXPORT_GGUF_H
#define TSR_RUNTIME_EXPORT_GGUF_H

#include <stdbool.h>

#include "runtime/model/model.h"

tsr_status tsr_export_gguf(const tsr_model *m, const char *path, tsr_dtype dtype,
                           const char *tok, bool *carried);

#endif
