/* `tessera convert`: writes any model tessera loads as one GGUF file (f32/f16/bf16/Q8_0,
 * the tokenizer as GGUF keys: runtime/model/export_gguf.h) or as a Hugging Face Llama
 * directory (config.json + model.safetensors, the tokenizer file copied beside them). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "jobs/cli.h"
#include "jobs/commands.h"
#include "base/dtype.h"
#include "runtime/model/export_gguf.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

static const char tsr__convert_about[] =
    "Loads SPEC (a llama2.c .bin, a GGUF file, a Hugging Face directory, or synthetic:NAME)\n"
    "and writes OUT in one of two formats: --format gguf, or an OUT ending in .gguf, writes\n"
    "one GGUF v3 file; otherwise (--format hf) OUT is a directory.\n"
    "\n"
    "GGUF (--dtype f32|f16|bf16|q8_0; default the source's: a Q8_0 GGUF stays Q8_0 block for\n"
    "block, a Q4_0/Q4_1 or FP8 source gives f32, and with q8_0 is requantized from its f32\n"
    "values, where --dtype q8_0 at load keeps Q4 as it is): the metadata llama.cpp's\n"
    "converter writes (architecture llama, qwen2 or qwen3; Mistral as llama) and the tensors\n"
    "under llama.cpp's names, norms and biases in f32. llama rows of attn_q/attn_k are in\n"
    "llama.cpp's adjacent-pair order (a Hugging Face Llama's are permuted). q8_0: a matrix is\n"
    "Q8_0 (ggml's reference quantizer, the `gguf` package's bytes) exactly where run/generate\n"
    "--dtype q8_0 quantizes at load (columns a multiple of 32; wo needs head_dim % 32 == 0,\n"
    "w_down hidden % 32 == 0 and at least one 32-column unit per head), else bf16 (f16 from\n"
    "an f16 source), so the file computes what --dtype q8_0 on SPEC computes. The tokenizer\n"
    "next to SPEC is stored as GGUF keys: a GGUF's tokenizer.* keys, or a llama2.c\n"
    "tokenizer.bin as the `llama` SentencePiece keys, or a byte-level BPE tokenizer.json (the\n"
    "Llama 3, Qwen2, SmolLM2 and GPT-2 pre-tokenizers) as the `gpt2` keys; other tokenizers\n"
    "are not carried (a note says so; pass --tokenizer to generate then). Llama 3 rope\n"
    "scaling is stored as llama.cpp's rope_freqs.weight (low/high frequency factors 1 and 4\n"
    "only); GPT-OSS is refused. The file is written as OUT.tmp and renamed, so OUT is\n"
    "complete or untouched.\n"
    "\n"
    "Hugging Face (--dtype f32|bf16|f16; a quantized source is written dequantized, f32 by\n"
    "default): a directory of config.json (LlamaForCausalLM, or the source's Qwen2, Qwen3 or\n"
    "Mistral class) and model.safetensors, which transformers' from_pretrained reads.\n"
    "llama2.c weights use interleaved rotary pairs; their q_proj and k_proj rows are permuted\n"
    "to HF's half-rotation layout (as llama2.c export.py does). Norms are written in the\n"
    "output dtype too. OUT is created when missing; files there are replaced. config.json is\n"
    "written last, so a directory holding one is complete. A tokenizer next to SPEC\n"
    "(tok<vocab>.bin or tokenizer.bin beside a file, tokenizer.json or tokenizer.bin in a\n"
    "directory) is copied into OUT under its own name (tok<vocab>.bin as tokenizer.bin); when\n"
    "none is found a note says so and the conversion still succeeds.\n"
    "Exit status: 0 success, 1 runtime failure, 2 usage error.";

static tsr_status tsr__copy_file(const char *src, const char *dst) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *in = fopen(src, "rb");
    if (!in) return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (ferror(in)) ok = false;
    fclose(in);
    if (fclose(out) != 0) ok = false;
    if (!ok) {
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: copy to %s failed", src, dst);
    }
    if (rename(tmp, dst) != 0) {
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: rename failed: %s", dst, strerror(errno));
    }
    return TSR_OK;
}

int tsr_cmd_convert(int argc, char **argv) {
    const char *model = NULL, *output = NULL, *dtype_name = NULL, *format = NULL;
    tsr_cli_opt opts[] = {
        {"model", TSR_OPT_STRING, &model, "SPEC", "model to convert (required)", false},
        {"output", TSR_OPT_STRING, &output, "OUT",
         "output: a .gguf file, or a Hugging Face directory (required)", false},
        {"format", TSR_OPT_STRING, &format, "gguf|hf",
         "output format (default: gguf when OUT ends in .gguf, else hf)", false},
        {"dtype", TSR_OPT_STRING, &dtype_name, "f32|bf16|f16|q8_0",
         "dtype of the written matrices (default: the source's; q8_0: GGUF only)", false},
    };
    tsr_cli cli = {"convert",
                   "--model SPEC --output OUT [--format gguf|hf] [--dtype f32|bf16|f16|q8_0]",
                   tsr__convert_about, opts, (int)(sizeof opts / sizeof opts[0])};
    tsr_cli_result res = tsr_cli_parse(&cli, argc, argv);
    if (res != TSR_CLI_OK) return res == TSR_CLI_HELP ? 0 : 2;
    if (!model || !*model) return tsr_cli_usage_error(&cli, "--model SPEC is required");
    if (!output || !*output) return tsr_cli_usage_error(&cli, "--output OUT is required");
    size_t olen = strlen(output);
    bool gguf = olen > 5 && !strcmp(output + olen - 5, ".gguf");
    if (format) {
        if (strcmp(format, "gguf") != 0 && strcmp(format, "hf") != 0)
            return tsr_cli_usage_error(&cli, "--format '%s': expected gguf or hf", format);
        gguf = !strcmp(format, "gguf");
    }
    int dtype = -1;
    if (dtype_name) {
        dtype = tsr_dtype_parse(dtype_name);
        if (dtype < 0 || dtype == TSR_F8_E4M3 || dtype == TSR_Q4_0 || dtype == TSR_Q4_1)
            return tsr_cli_usage_error(&cli, "--dtype '%s': expected f32, bf16, f16 or q8_0",
                                       dtype_name);
        /* safetensors has no Q8_0 layout tessera writes: run/generate quantize at load */
        if (dtype == TSR_Q8_0 && !gguf)
            return tsr_cli_usage_error(&cli, "--dtype q8_0 needs GGUF output (--output "
                                       "FILE.gguf or --format gguf)");
    }

    tsr_model *m = NULL;
    if (tsr_model_load(model, &m) != TSR_OK) return tsr_cmd_fail("convert");
    tsr_dtype out_dtype = dtype >= 0 ? (tsr_dtype)dtype : m->cfg.dtype;
    /* a Q8_0, 4-, 5- or 6-bit GGUF, an FP8 checkpoint: q * d (+ m) and code * scale are exact
     * in f32 (a Q8_0 source stays Q8_0 in GGUF, block for block) */
    if ((out_dtype == TSR_Q8_0 && !gguf) || out_dtype == TSR_Q4_0 || out_dtype == TSR_Q4_1 ||
        out_dtype == TSR_Q4_K || out_dtype == TSR_Q5_K || out_dtype == TSR_Q6_K ||
        out_dtype == TSR_F8_E4M3)
        out_dtype = TSR_F32;
    bool synthetic = strncmp(model, "synthetic:", 10) == 0;
    char tok[4096];
    bool have_tok = !synthetic &&
                    tsr_tokenizer_find(model, m->cfg.vocab_size, tok, sizeof tok) == TSR_OK;
    tsr_error_clear();
    int rc = 0;
    if (gguf) {
        bool carried = false;
        if (tsr_export_gguf(m, output, out_dtype, have_tok ? tok : NULL, &carried) != TSR_OK) {
            tsr_model_destroy(m);
            return tsr_cmd_fail("convert");
        }
        if (carried)
            fprintf(stderr, "tessera convert: tokenizer %s stored as GGUF keys\n", tok);
        else if (!synthetic)
            fprintf(stderr, "tessera convert: note: %s holds no tokenizer vocabulary (%s%s)\n",
                    output, have_tok ? "not carried from " : "none found next to SPEC",
                    have_tok ? tok : "");
    } else {
        if (tsr_export_hf(m, output, out_dtype) != TSR_OK) {
            tsr_model_destroy(m);
            return tsr_cmd_fail("convert");
        }
        if (have_tok) {
            char dst[4200];
            size_t len = strlen(tok);
            bool json = len >= 5 && !strcmp(tok + len - 5, ".json");
            snprintf(dst, sizeof dst, "%s/%s", output, json ? "tokenizer.json" : "tokenizer.bin");
            if (tsr__copy_file(tok, dst) != TSR_OK)
                rc = tsr_cmd_fail("convert");
            else
                fprintf(stderr, "tessera convert: copied tokenizer %s -> %s\n", tok, dst);
        } else if (!synthetic) {
            fprintf(stderr, "tessera convert: note: no tokenizer next to %s; %s has none\n",
                    model, output);
        }
    }
    if (rc == 0)
        fprintf(stderr, "tessera convert: wrote %s (%s %s, %d layers, dim %d, vocab %d)\n",
                output, gguf ? "GGUF" : "Hugging Face", tsr_dtype_name(out_dtype),
                m->cfg.n_layers, m->cfg.dim, m->cfg.vocab_size);
    tsr_model_destroy(m);
    return rc;
}
