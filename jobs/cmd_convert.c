/* `tessera convert`: writes any model tessera loads as a Hugging Face Llama directory
 * (config.json + model.safetensors), and copies the tokenizer found next to the source. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "jobs/cli.h"
#include "jobs/commands.h"
#include "base/dtype.h"
#include "runtime/model/loader.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

static const char tsr__convert_about[] =
    "Loads SPEC (a llama2.c .bin, a Hugging Face directory, or synthetic:NAME) and writes DIR\n"
    "as a Hugging Face LlamaForCausalLM directory: config.json and model.safetensors, which\n"
    "transformers' from_pretrained reads. llama2.c weights use interleaved rotary pairs; their\n"
    "q_proj and k_proj rows are permuted to HF's half-rotation layout (as llama2.c export.py\n"
    "does). Norms are written in the output dtype too. DIR is created when missing; files\n"
    "there are replaced. config.json is written last, so a DIR holding one is complete.\n"
    "A tokenizer next to SPEC (tok<vocab>.bin or tokenizer.bin beside a file, tokenizer.json or\n"
    "tokenizer.bin in a directory) is copied into DIR under its own name (tok<vocab>.bin as\n"
    "tokenizer.bin); when none is found a note says so and the conversion still succeeds.\n"
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
    const char *model = NULL, *output = NULL, *dtype_name = NULL;
    tsr_cli_opt opts[] = {
        {"model", TSR_OPT_STRING, &model, "SPEC", "model to convert (required)", false},
        {"output", TSR_OPT_STRING, &output, "DIR", "output directory (required)", false},
        {"dtype", TSR_OPT_STRING, &dtype_name, "f32|bf16|f16",
         "dtype of the written tensors (default: the source's)", false},
    };
    tsr_cli cli = {"convert", "--model SPEC --output DIR [--dtype f32|bf16|f16]",
                   tsr__convert_about, opts, (int)(sizeof opts / sizeof opts[0])};
    tsr_cli_result res = tsr_cli_parse(&cli, argc, argv);
    if (res != TSR_CLI_OK) return res == TSR_CLI_HELP ? 0 : 2;
    if (!model || !*model) return tsr_cli_usage_error(&cli, "--model SPEC is required");
    if (!output || !*output) return tsr_cli_usage_error(&cli, "--output DIR is required");
    int dtype = -1;
    if (dtype_name) {
        dtype = tsr_dtype_parse(dtype_name);
        /* q8_0 is no safetensors dtype yet: generate and bench quantize at load */
        if (dtype < 0 || dtype == TSR_Q8_0 || dtype == TSR_F8_E4M3)
            return tsr_cli_usage_error(&cli, "--dtype '%s': expected f32, bf16 or f16",
                                       dtype_name);
    }

    tsr_model *m = NULL;
    if (tsr_model_load(model, &m) != TSR_OK) return tsr_cmd_fail("convert");
    tsr_dtype out_dtype = dtype >= 0 ? (tsr_dtype)dtype : m->cfg.dtype;
    /* a Q8_0 or 4-bit GGUF, an FP8 checkpoint: q * d (+ m) and code * scale are exact in f32 */
    if (out_dtype == TSR_Q8_0 || out_dtype == TSR_Q4_0 || out_dtype == TSR_Q4_1 ||
        out_dtype == TSR_Q4_K || out_dtype == TSR_F8_E4M3)
        out_dtype = TSR_F32;
    if (tsr_export_hf(m, output, out_dtype) != TSR_OK) {
        tsr_model_destroy(m);
        return tsr_cmd_fail("convert");
    }

    int rc = 0;
    if (strncmp(model, "synthetic:", 10) != 0) {
        char tok[4096], dst[4200];
        if (tsr_tokenizer_find(model, m->cfg.vocab_size, tok, sizeof tok) == TSR_OK) {
            size_t len = strlen(tok);
            bool json = len >= 5 && !strcmp(tok + len - 5, ".json");
            snprintf(dst, sizeof dst, "%s/%s", output, json ? "tokenizer.json" : "tokenizer.bin");
            if (tsr__copy_file(tok, dst) != TSR_OK)
                rc = tsr_cmd_fail("convert");
            else
                fprintf(stderr, "tessera convert: copied tokenizer %s -> %s\n", tok, dst);
        } else {
            fprintf(stderr, "tessera convert: note: no tokenizer next to %s; %s has none\n",
                    model, output);
        }
    }
    if (rc == 0)
        fprintf(stderr, "tessera convert: wrote %s (%s, %d layers, dim %d, vocab %d)\n", output,
                tsr_dtype_name(out_dtype), m->cfg.n_layers, m->cfg.dim, m->cfg.vocab_size);
    tsr_model_destroy(m);
    return rc;
}
