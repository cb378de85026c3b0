/* `tessera generate`: one prompt in, its continuation out (stdout), a summary line on
 * stderr. The single-sequence path of the engine, kept small so that it doubles as the
 * reference the bulk job is compared with. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs/cli.h"
#include "jobs/commands.h"
#include "jobs/dist_cli.h"
#include "jobs/kv_cli.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "base/sys.h"
#include "base/file.h"
#include "base/log.h"
#include "base/dtype.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"
#include "runtime/text/harmony.h"
#include "runtime/text/tokenizer.h"

int tsr_cmd_fail(const char *cmd) {
    const char *msg = tsr_last_error();
    fprintf(stderr, "tessera %s: %s\n", cmd, *msg ? msg : "failed");
    return 1;
}

typedef struct tsr__gen_opts {
    const char *model, *tokenizer, *prompt, *prompt_file, *backend, *dtype;
    int max_tokens, top_k, threads, max_context, chunk;
    float temperature, top_p;
    uint64_t seed;
    bool no_bos, chat, harmony_raw, verbose, threads_given;
    tsr_kv_cli kv;
    tsr_dist_cli dist;
} tsr__gen_opts;

typedef struct tsr__gen {
    tsr_engine *eng; /* the job, model, tokenizer, prompt ids, backend, KV cache, forward */
    tsr_sampler sampler;
    int rank;        /* this rank's (tsr_engine_spec.rank_out), for the failure message */
} tsr__gen;

static void tsr__gen_free(tsr__gen *g) {
    tsr_sampler_free(&g->sampler);
    tsr_engine_destroy(g->eng); /* the comm last */
}

/* Every rank runs this with the same inputs and takes the same steps; rank 0 prints. */
static tsr_status tsr__generate(const tsr__gen_opts *o, tsr__gen *g) {
    tsr_engine_spec spec = {.model_path = o->model, .load_tokenizer = true,
                            .tokenizer_path = o->tokenizer,
                            .prompt = {.text = o->prompt, .file = o->prompt_file,
                                       .no_bos = o->no_bos, .chat = o->chat},
                            .distributed = true, .dist = o->dist, .backend = o->backend,
                            .threads = o->threads_given ? o->threads : 0,
                            .max_tokens = o->chunk, .kv = o->kv.kv, .pack_weights = true,
                            .rank_out = &g->rank};
    tsr_engine_spec_dtype(&spec, o->dtype); /* converted after the shard cut */
    spec.kv.max_seqs = 1;
    spec.kv.max_context = o->max_context; /* 0: the model's; the engine holds it to it */
    TSR_TRY(tsr_engine_create(&spec, &g->eng));
    tsr_dist *d = &g->eng->dist;
    const tsr_model_config *c = &g->eng->model->cfg;
    const int32_t *ids = g->eng->prompt_ids;
    size_t n_ids = g->eng->n_prompt;
    int ctx = g->eng->ctx, chunk = g->eng->max_tokens; /* held to the prompt */
    bool root = tsr_dist_is_root(d);
    tsr_tokenizer *tok = g->eng->tok;
    tsr_backend *be = g->eng->be;
    tsr_kv_cache *kv = g->eng->kv;
    tsr_forward *fwd = g->eng->fwd;
    tsr_status st = kv->ops->seq_add(kv, 0);
    tsr_sampler_params sp = {.temperature = o->temperature, .top_p = o->top_p,
                             .top_k = o->top_k, .seed = o->seed};
    if (st == TSR_OK) st = tsr_sampler_init(&g->sampler, c->vocab_size, &sp);
    TSR_TRY(tsr_dist_agree(d, st));
    if (o->verbose) {
        if (root)
            TSR_LOG_INFO("model %s: dim %d, %d layers, %d heads (%d kv), vocab %d, %s%s%s; "
                         "backend %s, %d threads; prompt %zu tokens; %d ranks (%s)",
                         o->model, c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
                         c->vocab_size, tsr_dtype_name(c->dtype),
                         g->eng->model->file_type[0] ? " from a GGUF " : "",
                         g->eng->model->file_type,
                         tsr_engine_device_name(g->eng), be->threads, n_ids, d->world, tsr_comm_backend_name(d->comm));
        tsr_dist_log_layout(d);
    }

    /* The logits stay in backend memory and the backend samples them (tsr_forward_sample):
     * only the token id comes to the host, and with --pp the last stage samples and sends
     * it, not the logits, to the others. */
    tsr_forward_sample_last_stage(fwd, true);
    /* Prefill in chunks; logits only for the last prompt token. */
    double t0 = tsr_sys_now();
    int rows = 0;
    for (size_t done = 0; done < n_ids;) {
        int n = (int)(n_ids - done) < chunk ? (int)(n_ids - done) : chunk;
        tsr_batch_seq b = {.seq = 0, .tokens = ids + done, .n_tokens = n,
                           .want_logits = done + (size_t)n == n_ids};
        TSR_TRY(tsr_dist_must(d, tsr_forward_run(fwd, kv, &b, 1, NULL, &rows)));
        done += (size_t)n;
    }
    double t1 = tsr_sys_now();
    tsr_comm_stats cs_prefill, cs_decode;
    tsr_comm_get_stats(d->comm, &cs_prefill);
    tsr_comm_reset_stats(d->comm);

    /* --chat with a harmony vocabulary (GPT-OSS): only the final channel's text is the
     * answer (--harmony-raw: all of it, channels and special tokens) */
    tsr_harmony_ids hids;
    tsr_harmony_parser hp;
    bool harmony = o->chat && !o->harmony_raw && tsr_harmony_ids_find(tok, &hids);
    if (harmony) tsr_harmony_parser_init(&hp, &hids);
    int generated = 0, fed = 0; /* fed: decode tokens that went through the forward */
    int32_t prev = ids[n_ids - 1];
    const char *stop = "length";
    char piece[512];
    int32_t pos = (int32_t)n_ids;
    while (generated < o->max_tokens) {
        int32_t next = -1;
        if (tsr_forward_has_logits(fwd)) {
            tsr_sampler *sm = &g->sampler;
            TSR_TRY(tsr_dist_must(d, tsr_forward_sample(fwd, &sm, 1, &next)));
        } else { /* an earlier stage: its sampler advances alike, the id comes from the last */
            tsr_sampler_skip(&g->sampler);
        }
        TSR_TRY(tsr_dist_must(d, tsr_forward_share_tokens(fwd, &next, 1)));
        if (tsr_tokenizer_is_eos(tok, next)) {
            stop = "eos";
            break;
        }
        int nb = tsr_tokenizer_decode(tok, prev, next, piece, sizeof piece);
        if (harmony &&
            tsr_harmony_feed(&hp, next, piece, nb > 0 ? (size_t)nb : 0) != TSR_HARMONY_FINAL)
            nb = 0; /* markup or another channel: not printed */
        if (nb > 0 && root) {
            fwrite(piece, 1, (size_t)nb, stdout);
            fflush(stdout);
        }
        generated++;
        prev = next;
        if (generated == o->max_tokens) break;
        if (pos + 1 > ctx) {
            stop = "context";
            break;
        }
        tsr_batch_seq b = {.seq = 0, .tokens = &next, .n_tokens = 1, .want_logits = true};
        TSR_TRY(tsr_dist_must(d, tsr_forward_run(fwd, kv, &b, 1, NULL, &rows)));
        fed++;
        pos++;
    }
    double t2 = tsr_sys_now();
    tsr_comm_get_stats(d->comm, &cs_decode);
    char comm_js[768];
    if (o->kv.stats) /* collective: every rank takes this branch */
        tsr_dist_comm_json(d, &cs_prefill, (int64_t)n_ids, &cs_decode, fed, comm_js,
                           sizeof comm_js);
    if (!root) return TSR_OK;
    printf("\n");
    fflush(stdout);
    double tp = t1 - t0, td = t2 - t1;
    fprintf(stderr,
            "tessera generate: prompt %zu tokens in %.3f s (%.1f tok/s), generated %d tokens "
            "in %.3f s (%.1f tok/s), stop: %s\n",
            n_ids, tp, tp > 0 ? (double)n_ids / tp : 0.0, generated, td,
            td > 0 ? generated / td : 0.0, stop);
    /* KV memory by layer type: a sliding layer's stops growing at its window */
    tsr_kv_options kvo = o->kv.kv;
    kvo.be = be;
    tsr_kv_layer_bytes lb;
    TSR_TRY(tsr_kv_layer_bytes_of(&kvo, c, &lb));
    char kvl[256];
    if (lb.sliding_layers > 0 && tsr_kv_layer_bytes_line(&lb, kvl, sizeof kvl) > 0)
        fprintf(stderr, "tessera generate: %s\n", kvl);
    if (o->kv.stats) {
        char js[2048];
        tsr_kv_stats_json(kv, js, sizeof js);
        tsr_kv_layer_bytes_json(&lb, kvl, sizeof kvl);
        fprintf(stderr, "%s\n%s\n{\"kv_memory\":%s}\n", js, comm_js, kvl);
    }
    return TSR_OK;
}

int tsr_cmd_generate(int argc, char **argv) {
    tsr__gen_opts o = {.max_tokens = 256, .temperature = 1.0f, .top_p = 0.9f, .top_k = 0,
                       .seed = 42, .threads = tsr_sys_cpus(), .chunk = 512,
                       .backend = "auto"};
    tsr_kv_cli_init(&o.kv);
    tsr_dist_cli_init(&o.dist);
    tsr_cli_opt base[] = {
        {"model", TSR_OPT_STRING, &o.model, "PATH",
         "model: llama2.c .bin, GGUF file, Hugging Face directory, or synthetic:NAME "
         "(required)", false},
        {"tokenizer", TSR_OPT_STRING, &o.tokenizer, "PATH",
         "tokenizer.bin or tokenizer.json (default: found next to the model)", false},
        {"prompt", TSR_OPT_STRING, &o.prompt, "TEXT", "the prompt", false},
        {"prompt-file", TSR_OPT_STRING, &o.prompt_file, "PATH",
         "read the prompt from a file ('-' for stdin)", false},
        {"max-tokens", TSR_OPT_INT, &o.max_tokens, "N", "tokens to generate at most", false},
        {"temperature", TSR_OPT_FLOAT, &o.temperature, "T", "sampling temperature; 0 = greedy",
         false},
        {"top-p", TSR_OPT_FLOAT, &o.top_p, "P", "nucleus sampling mass, 1 = off", false},
        {"top-k", TSR_OPT_INT, &o.top_k, "K", "sample among the K most likely, 0 = off", false},
        {"seed", TSR_OPT_U64, &o.seed, "S", "random seed (same seed, same tokens)", false},
        {"threads", TSR_OPT_INT, &o.threads, "N",
         "CPU threads per rank (default: the CPUs given to the job over its ranks on the node; "
         "at most 4 per CPU this process may run on)",
         false},
        {"max-context", TSR_OPT_INT, &o.max_context, "N",
         "context length in tokens, prompt included (0 = the model's maximum)", false},
        {"chunk", TSR_OPT_INT, &o.chunk, "N", "prefill chunk size in tokens", false},
        {"backend", TSR_OPT_STRING, &o.backend, "NAME", tsr_backend_names(), false},
        {"no-bos", TSR_OPT_FLAG, &o.no_bos, NULL, "do not prepend the BOS token", false},
        {"chat", TSR_OPT_FLAG, &o.chat, NULL,
         "the prompt is a user message, rendered with the model's chat template (GGUF "
         "metadata or tokenizer_config.json; a GPT-OSS model without one: the built-in "
         "harmony template); on a harmony model the answer printed is the final channel's "
         "text", false},
        {"harmony-raw", TSR_OPT_FLAG, &o.harmony_raw, NULL,
         "with --chat on a harmony model (GPT-OSS): print the whole answer, every channel "
         "with its special tokens, not only the final channel's text", false},
        {"verbose", TSR_OPT_FLAG, &o.verbose, NULL, "log model and backend details", false},
        {"dtype", TSR_OPT_STRING, &o.dtype, TSR_CLI_DTYPE_VALUES, TSR_CLI_DTYPE_HELP, false},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    tsr_cli_opt opts[N_BASE + TSR_KV_CLI_N_OPTS + TSR_DIST_CLI_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_kv = tsr_kv_cli_opts(&o.kv, opts + N_BASE); /* one per policy option */
    tsr_dist_cli_opts(&o.dist, opts + N_BASE + n_kv);
    tsr_cli cli = {.cmd = "generate",
                   .synopsis = "--model PATH (--prompt TEXT | --prompt-file PATH|-) [options]",
                   .about = "Generates a continuation of one prompt. The continuation goes to "
                            "stdout, a summary line\n(tokens, tokens/s) to stderr.",
                   .opts = opts,
                   .n_opts = N_BASE + n_kv + TSR_DIST_CLI_N_OPTS};
    tsr_cli_result r = tsr_cli_parse(&cli, argc, argv);
    if (r == TSR_CLI_HELP) return 0;
    if (r != TSR_CLI_OK) return 2;
    if (!o.model) return tsr_cli_usage_error(&cli, "--model is required");
    if (!o.prompt == !o.prompt_file)
        return tsr_cli_usage_error(&cli, "give exactly one of --prompt and --prompt-file");
    if (o.max_tokens < 0) return tsr_cli_usage_error(&cli, "--max-tokens must be >= 0");
    if (tsr_cli_check_dtype(&cli, o.dtype) != TSR_CLI_OK) return 2;
    if (tsr_cli_check_threads(&cli, o.threads) != TSR_CLI_OK) return 2;
    if (o.chunk < 1) return tsr_cli_usage_error(&cli, "--chunk must be >= 1");
    if (o.max_context < 0) return tsr_cli_usage_error(&cli, "--max-context must be >= 0");
    if (o.temperature < 0) return tsr_cli_usage_error(&cli, "--temperature must be >= 0");
    if (!(o.top_p > 0 && o.top_p <= 1)) return tsr_cli_usage_error(&cli, "--top-p must be in (0, 1]");
    if (o.top_k < 0) return tsr_cli_usage_error(&cli, "--top-k must be >= 0");
    if (tsr_kv_cli_check(&cli, &o.kv) != TSR_CLI_OK) return 2;
    if (tsr_dist_cli_check(&cli, &o.dist) != TSR_CLI_OK) return 2;
    if (o.verbose) tsr_log_set_level(TSR_LOG_INFO);
    o.threads_given = tsr_cli_find(&cli, "threads")->seen;

    tsr__gen g = {0};
    tsr_status st = tsr__generate(&o, &g);
    int rc = st == TSR_OK ? 0 : tsr_dist_fail(g.rank, "generate");
    tsr__gen_free(&g);
    return rc;
}
