/* `tessera fidelity`: how close a KV policy's outputs stay to the full cache's on the same
 * tokens (runtime/eval/fidelity.h): perplexity of held-out text under both, top-1 agreement and
 * KL divergence of the next-token distributions, and a retrieval probe. One JSON object
 * out (--json FILE, else stdout), for bench/quality.sh and `tessera characterize`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernels/backend.h"
#include "base/alloc.h"
#include "base/file.h"
#include "base/sys.h"
#include "jobs/cli.h"
#include "jobs/commands.h"
#include "jobs/kv_cli.h"
#include "runtime/eval/fidelity.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr__fid_opts {
    const char *model, *tokenizer, *text, *json, *backend, *ref_kv_dtype, *ref_dir, *dtype;
    int probe_length, max_tokens, max_context, chunk, threads, gen_tokens;
    int doc_tokens, tail, prompt_tokens;
    bool quiet, document, decode_prefix;
    tsr_kv_cli kv;
} tsr__fid_opts;

/* A measured number, or null when it was not measured. */
static void tsr__num(cJSON *o, const char *name, bool have, double x) {
    if (have && isfinite(x))
        cJSON_AddNumberToObject(o, name, x);
    else
        cJSON_AddNullToObject(o, name);
}

static tsr_status tsr__write_json(const tsr__fid_opts *o, const tsr_fidelity_result *r) {
    cJSON *d = cJSON_CreateObject();
    if (!d) return TSR_ERR_NOMEM;
    bool text = r->tokens > 0, probe = r->probe_tokens > 0;
    cJSON_AddNumberToObject(d, "schema_version", 1);
    cJSON_AddStringToObject(d, "policy", r->policy ? r->policy : "");
    /* the option as given (a float: 0.1, not 0.100000001) */
    char b[32];
    snprintf(b, sizeof b, "%.7g", o->kv.kv.budget);
    cJSON_AddNumberToObject(d, "budget", strtod(b, NULL));
    cJSON_AddStringToObject(d, "model", o->model);
    cJSON_AddStringToObject(d, "dtype", r->dtype ? r->dtype : "");
    /* how the text was scored: "decode" (one token a call), "prompt" (a prefilled prompt,
     * then decode), "tail-prompt" / "tail-decode" (the last --tail positions of each
     * sequence after its prefix as a chunked prompt / one token a call) */
    cJSON_AddStringToObject(d, "scoring", o->tail > 0 ? (o->decode_prefix ? "tail-decode"
                                                                          : "tail-prompt")
                                          : o->prompt_tokens > 0 ? "prompt" : "decode");
    cJSON_AddBoolToObject(d, "document", o->document);
    cJSON_AddNumberToObject(d, "tail_tokens", o->tail);
    cJSON_AddNumberToObject(d, "tokens", (double)r->tokens);
    tsr__num(d, "nll", text, r->nll);
    tsr__num(d, "ppl", text, r->ppl);
    tsr__num(d, "nll_full", text, r->nll_full);
    tsr__num(d, "ppl_full", text, r->ppl_full);
    tsr__num(d, "agreement", text, r->agreement);
    tsr__num(d, "kl", text, r->kl);
    cJSON_AddNumberToObject(d, "gen_tokens", (double)r->gen_tokens);
    tsr__num(d, "gen_agreement", r->gen_tokens > 0, r->gen_agreement);
    tsr__num(d, "gen_kl", r->gen_tokens > 0, r->gen_kl);
    tsr__num(d, "probe_text_recall", probe && r->probe_text_recall >= 0, r->probe_text_recall);
    tsr__num(d, "probe_attention_recall", probe, r->probe_attention_recall);
    cJSON_AddNumberToObject(d, "probe_tokens", r->probe_tokens);
    cJSON_AddNumberToObject(d, "probe_key_position", r->probe_key_pos);
    cJSON_AddNumberToObject(d, "probe_key_tokens", r->probe_key_tokens);
    cJSON_AddNumberToObject(d, "windows", r->windows);
    cJSON_AddNumberToObject(d, "wall_s", r->wall_s);
    cJSON_AddStringToObject(d, "reference", r->reference ? r->reference : "none");
    cJSON *kv = r->kv_json[0] ? cJSON_Parse(r->kv_json) : NULL;
    if (kv) cJSON_AddItemToObject(d, "kv", kv);
    return tsr_cli_write_json(d, o->json);
}

static tsr_status tsr__fidelity(const tsr__fid_opts *o) {
    char *text = NULL;
    size_t text_len = 0;
    tsr_fidelity_result r;
    /* Text needs the tokenizer; the probe uses it when there is one (a real model), and
     * is made of token ids otherwise (a synthetic model). The engines load the model and
     * tokenizer (runtime/eval/fidelity.h). */
    tsr_engine_spec spec = {.model_path = o->model, .tokenizer_path = o->tokenizer,
                            .load_tokenizer = o->text || o->tokenizer ||
                                              strncmp(o->model, "synthetic:", 10) != 0};
    tsr_engine_spec_dtype(&spec, o->dtype); /* both caches run on the converted matrices */
    tsr_status st = TSR_OK;
    if (o->text) st = tsr_file_read(o->text, "text", 0, &text, &text_len);
    if (st == TSR_OK) {
        tsr_fidelity_options fo = {.backend = o->backend, .threads = o->threads,
                                   .kv = o->kv.kv, .chunk_tokens = o->chunk,
                                   .max_tokens = o->max_tokens,
                                   .probe_length = o->probe_length,
                                   .gen_tokens = o->gen_tokens,
                                   .ref_kv_dtype = o->ref_kv_dtype,
                                   .prompt_tokens = o->prompt_tokens,
                                   .document = o->document, .doc_tokens = o->doc_tokens,
                                   .tail_tokens = o->tail, .decode_prefix = o->decode_prefix,
                                   .ref_dir = o->ref_dir};
        fo.kv.max_context = o->max_context;
        st = tsr_fidelity_run(&spec, NULL, text, text_len, &fo, &r);
    }
    if (st == TSR_OK) st = tsr__write_json(o, &r);
    /* said even with --quiet: an option given and not acted on */
    if (st == TSR_OK && r.reference_unused)
        fprintf(stderr, "tessera fidelity: --reference-dir %s: nothing kept: %s\n", o->ref_dir,
                r.reference_unused);
    if (st == TSR_OK && !o->quiet) {
        fprintf(stderr, "tessera fidelity: %s", r.policy);
        if (r.tokens > 0)
            fprintf(stderr, ": %lld tokens, ppl %.3f (full %.3f), agreement %.4f, KL %.5f",
                    (long long)r.tokens, r.ppl, r.ppl_full, r.agreement, r.kl);
        if (r.probe_tokens > 0) {
            fprintf(stderr, "; probe of %d tokens: attention recall %.3f", r.probe_tokens,
                    r.probe_attention_recall);
            if (r.probe_text_recall >= 0)
                fprintf(stderr, ", text recall %.3f", r.probe_text_recall);
        }
        fprintf(stderr, " (%.2f s)\n", r.wall_s);
    }
    if (st == TSR_OK && o->kv.stats) fprintf(stderr, "%s\n", r.kv_json);
    tsr_free(text);
    return st;
}

int tsr_cmd_fidelity(int argc, char **argv) {
    tsr__fid_opts o = {.threads = tsr_sys_cpus(), .backend = "auto", .chunk = 256};
    tsr_kv_cli_init(&o.kv);
    tsr_cli_opt base[] = {
        {"model", TSR_OPT_STRING, &o.model, "PATH",
         "model: llama2.c .bin, GGUF file, Hugging Face directory, or synthetic:NAME "
         "(required)", false},
        {"tokenizer", TSR_OPT_STRING, &o.tokenizer, "PATH",
         "tokenizer.bin or tokenizer.json (default: found next to the model; a synthetic "
         "model without one gets a probe made of token ids)", false},
        {"text", TSR_OPT_STRING, &o.text, "FILE",
         "held-out text to score: stories separated by blank lines, each from BOS (one "
         "longer than the context is scored in windows of it)", false},
        {"probe-length", TSR_OPT_INT, &o.probe_length, "N",
         "run the retrieval probe: a key early in an N-token prompt, asked for at its end "
         "(0 = no probe; at most the context)", false},
        {"document", TSR_OPT_FLAG, &o.document, NULL,
         "the whole --text is one document from BOS (no blank-line split), cut to "
         "--doc-tokens", false},
        {"doc-tokens", TSR_OPT_INT, &o.doc_tokens, "N",
         "with --document: its first N tokens (0 = as many as the context holds)", false},
        {"tail", TSR_OPT_INT, &o.tail, "N",
         "score only the last N positions of each sequence; the rest goes in first as a "
         "prompt prefilled in chunks of --chunk (0 = score every position)", false},
        {"decode-prefix", TSR_OPT_FLAG, &o.decode_prefix, NULL,
         "with --tail: feed the unscored prefix one token per call (decode-only scoring) "
         "instead of as a prompt", false},
        {"prompt-tokens", TSR_OPT_INT, &o.prompt_tokens, "N",
         "without --tail: the first N tokens of each sequence go in as one prompt chunk, "
         "the rest one token per call (0 = decode mode throughout)", false},
        {"max-tokens", TSR_OPT_INT, &o.max_tokens, "N",
         "score at most N positions of the text (0 = all)", false},
        {"gen-tokens", TSR_OPT_INT, &o.gen_tokens, "N",
         "after each text sequence, N greedy tokens of the full cache fed to both caches: "
         "gen_agreement and gen_kl over them (0 = none)", false},
        {"max-context", TSR_OPT_INT, &o.max_context, "N",
         "context length in tokens (0 = the model's maximum)", false},
        {"chunk", TSR_OPT_INT, &o.chunk, "N", "prefill chunk (the probe, --tail prefixes), tokens",
         false},
        {"dtype", TSR_OPT_STRING, &o.dtype, TSR_CLI_DTYPE_VALUES, TSR_CLI_DTYPE_HELP, false},
        {"threads", TSR_OPT_INT, &o.threads, "N", "CPU threads", false},
        {"reference-dir", TSR_OPT_STRING, &o.ref_dir, "DIR",
         "keep the full cache's logits over --text in DIR and reuse them when the same model, "
         "text and options come again (a study's policies share one; the full cache is then "
         "not run). Not with --gen-tokens or without --text: a line then says nothing was kept",
         false},
        {"ref-kv-dtype", TSR_OPT_STRING, &o.ref_kv_dtype, "T",
         "KV dtype of the full cache (default: the backend's; --kv-dtype sets the policy's)",
         false},
        {"backend", TSR_OPT_STRING, &o.backend, "NAME", tsr_backend_names(),
         false},
        {"json", TSR_OPT_STRING, &o.json, "OUT.json",
         "write the result here (default: stdout)", false},
        {"quiet", TSR_OPT_FLAG, &o.quiet, NULL, "no summary line on stderr", false},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    tsr_cli_opt opts[N_BASE + TSR_KV_CLI_N_OPTS];
    memcpy(opts, base, sizeof base);
    /* only the entries written: a zeroed entry has no name to compare an option with */
    int n_kv = tsr_kv_cli_opts(&o.kv, opts + N_BASE);
    tsr_cli cli = {
        .cmd = "fidelity",
        .synopsis = "--model PATH (--text FILE | --probe-length N) [--kv-policy P ...] "
                    "[--json OUT.json]",
        .about =
            "Runs the full cache (paged) and the cache of --kv-policy side by side on the same\n"
            "tokens, one token per forward call as in generation, and reports in one JSON "
            "object:\n"
            "  tokens, nll, ppl, nll_full, ppl_full  text positions scored, mean NLL (nats) "
            "and\n"
            "                                        perplexity of the policy and of the full "
            "cache\n"
            "  agreement   share of positions where both caches' greedy next tokens agree\n"
            "  kl          KL(full || policy) of the next-token distributions, mean over "
            "positions\n"
            "  probe_attention_recall  share of (layer, key token) pairs still in the "
            "policy's\n"
            "              cache when the probe's question is answered\n"
            "  probe_text_recall       share of the key's tokens greedy decoding repeats "
            "(needs a\n"
            "              tokenizer; meaningful on a real model only)\n"
            "  gen_agreement, gen_kl   the same over --gen-tokens greedy tokens of the full "
            "cache\n"
            "              after each text sequence (teacher-forced on the full cache's "
            "tokens)\n"
            "  wall_s, and the policy cache's stats under \"kv\". A field not measured is "
            "null.\n"
            "--kv-policy paged against itself gives agreement 1 and kl 0 exactly. Exit "
            "status 0 on\nsuccess, 1 when the run fails, 2 on usage errors.",
        .opts = opts,
        .n_opts = N_BASE + n_kv};
    tsr_cli_result r = tsr_cli_parse(&cli, argc, argv);
    if (r == TSR_CLI_HELP) return 0;
    if (r != TSR_CLI_OK) return 2;
    if (!o.model) return tsr_cli_usage_error(&cli, "--model is required");
    if (!o.text && o.probe_length <= 0)
        return tsr_cli_usage_error(&cli, "--text or --probe-length is required");
    if (o.probe_length < 0) return tsr_cli_usage_error(&cli, "--probe-length must be >= 0");
    if (o.max_tokens < 0) return tsr_cli_usage_error(&cli, "--max-tokens must be >= 0");
    if (o.gen_tokens < 0) return tsr_cli_usage_error(&cli, "--gen-tokens must be >= 0");
    if (o.gen_tokens > 0 && !o.text)
        return tsr_cli_usage_error(&cli, "--gen-tokens needs --text (it continues the text)");
    if (o.max_context < 0) return tsr_cli_usage_error(&cli, "--max-context must be >= 0");
    if (o.tail < 0 || o.doc_tokens < 0 || o.prompt_tokens < 0)
        return tsr_cli_usage_error(&cli, "--tail, --doc-tokens and --prompt-tokens must be >= 0");
    if (o.decode_prefix && o.tail == 0)
        return tsr_cli_usage_error(&cli, "--decode-prefix needs --tail");
    if (o.prompt_tokens > o.chunk)
        return tsr_cli_usage_error(&cli, "--prompt-tokens needs --chunk >= it (one chunk)");
    if ((o.document || o.tail > 0) && !o.text)
        return tsr_cli_usage_error(&cli, "--document and --tail need --text");
    if (o.chunk < 1) return tsr_cli_usage_error(&cli, "--chunk must be >= 1");
    if (tsr_cli_check_threads(&cli, o.threads) != TSR_CLI_OK) return 2;
    if (tsr_cli_check_dtype(&cli, o.dtype) != TSR_CLI_OK) return 2;
    o.kv.quiet = o.quiet;
    if (tsr_kv_cli_check(&cli, &o.kv) != TSR_CLI_OK) return 2;
    if (tsr__fidelity(&o) != TSR_OK) return tsr_cmd_fail("fidelity");
    return 0;
}
