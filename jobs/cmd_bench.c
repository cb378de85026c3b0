/* `tessera bench`: prefill and decode throughput of one model on one backend (the CPU by
 * default).
 *
 * One sequence (or --batch B): N pseudo-random prompt ids as one prefill chunk (logits for
 * the last row only), then M greedy decode steps of one token each (B rows per forward call
 * with --batch). Prefill and decode are timed separately; R repeats, each on fresh
 * sequences, report the median. The derived figures
 * (bytes per decode token, flops per prefill token) are stated in --help and docs/perf.md
 * so that bench/decode.sh can set them against the measured ceilings. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "jobs/cli.h"
#include "jobs/commands.h"
#include "kernels/backend.h"
#include "kernels/kv_dtype.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "base/sys.h"
#include "base/dtype.h"
#include "base/membw.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"

typedef struct tsr__bench_opts {
    const char *model;
    int prompt_tokens;
    int gen_tokens;
    int threads;
    const char *dtype_name;
    int dtype; /* -1: as loaded */
    int repeat;
    int warmup;
    const char *kv;
    const char *kv_dtype; /* NULL: the backend's default */
    const char *backend;
    int membw_mib;
    int batch; /* sequences decoded together */
    bool json;
} tsr__bench_opts;

static const char tsr__bench_about[] =
    "Measures prefill and decode throughput on one backend (--backend, default cpu). Feeds\n"
    "N pseudo-random prompt token ids (fixed seed) as ONE prefill chunk (logits for the last\n"
    "row only), then decodes M tokens greedily, one token per forward call. Prefill and\n"
    "decode are timed separately (CLOCK_MONOTONIC); each repeat uses a fresh sequence and\n"
    "the median is reported.\n"
    "--batch B: B sequences, each prefilled as its own chunk (prefill_s covers all B), then\n"
    "M decode steps of B rows per forward call (the batched decode of tessera run);\n"
    "decode_tok_s counts all B sequences' tokens (B x M / decode_s) and the per-token\n"
    "figures below divide a step's bytes by B (the weights are read once per step).\n"
    "The KV cache is the paged pool of generate and run (--kv dense: one buffer instead).\n"
    "A short prefill is also timed in extra prefill-only rounds until its samples add up to\n"
    "0.2 s (at most 1000): one 128-token chunk of stories260K takes ~1.5 ms, and three such\n"
    "samples moved by 25 % from run to run.\n"
    "SPEC: a llama2.c .bin, a Hugging Face directory, or synthetic:NAME[,dtype=bf16].\n"
    "--dtype is appended as ,dtype= to a synthetic SPEC; a file holding another dtype is\n"
    "converted in memory (matrices only; norms stay f32).\n"
    "\n"
    "Derived figures (L layers, d dim, h hidden, H heads, G kv heads, hd head dim, V vocab,\n"
    "N prompt tokens, M gen tokens):\n"
    "  active_weight_bytes = the weight bytes one decode token reads: weight_bytes (layer\n"
    "      matrices and norms, final norm, classifier); for a mixture of experts (E experts,\n"
    "      K routed per token) only K/E of the expert tensors (weights, MXFP4 scales, biases)\n"
    "  decode_bytes_per_token = active_weight_bytes + one embedding row + the KV bytes\n"
    "      read, averaged over the M steps: 2 (K and V) * L * R * (N + (M+1)/2), R the\n"
    "      stored bytes of a G*hd row (--kv-dtype: f32 4 a value, bf16 2, q8 1.125, fp8 1\n"
    "      plus a 4-byte scale a row);\n"
    "      with --batch B: (active_weight_bytes + B * (the row + the KV bytes)) / B\n"
    "  prefill_flops_per_token = 2*P + 4*L*H*hd*(N+1)/2 + 2*V*d/N, where\n"
    "      P = L*(d*H*hd + 2*d*G*hd + H*hd*d + 3*d*h) counts the layer matrices (not the\n"
    "      classifier; a mixture of experts: K*3*d*h + d*E for the FFN), the middle term is\n"
    "      QK^T and PV over the causal average of (N+1)/2 keys, and the classifier runs\n"
    "      once per chunk\n"
    "  prefill_gflops = prefill_flops_per_token * prefill_tok_s / 1e9\n"
    "  decode_gb_s = decode_bytes_per_token * decode_tok_s / 1e9\n"
    "  weight_gb_s = active_weight_bytes * decode_tok_s / B / 1e9: the weights alone (the\n"
    "      figure that differs by dtype: f32, bf16, q8_0 at 34 bytes per 32 weights, ...)\n"
    "  bytes_per_weight = weight_bytes / the weights it holds (classifier, layer matrices,\n"
    "      norms; not the embedding table unless tied): 4, 2, 1.0625 for q8_0 when every\n"
    "      matrix is quantized\n"
    "  peak_rss_bytes = getrusage ru_maxrss of the whole process (with --membw-mib, its\n"
    "      buffer too)\n"
    "  huge_page_bytes = of the process, backed by transparent huge pages at the end (the\n"
    "      weights ask for them; -1: unknown)\n"
    "\n"
    "JSON keys: model, dtype, threads, batch, prompt_tokens, gen_tokens, repeat, prefill_samples,\n"
    "prefill_s, prefill_tok_s, prefill_gflops, decode_s, decode_tok_s, decode_gb_s,\n"
    "weight_gb_s, bytes_per_weight, weight_bytes, active_weight_bytes, decode_bytes_per_token, prefill_flops_per_token,\n"
    "peak_rss_bytes, huge_page_bytes, kv_memory (KV bytes per token of the full and of the\n"
    "sliding-window layers, their counts and window), dim, hidden_dim, n_layers, n_heads,\n"
    "n_kv_heads, head_dim, vocab_size,\n"
    "last_token (the final greedy token, a determinism check); with --membw-mib also\n"
    "membw_bytes, read_passes, read_gb_s, read_best_gb_s, decode_read_ratio; on a backend\n"
    "that counts its transfers (cpu-fenced) also step_counters: the means of the timed\n"
    "decode steps (a step: B tokens) and per layer of uploads, upload_bytes, downloads,\n"
    "download_bytes, waits (host synchronisations), host_arrays (metadata an op stages),\n"
    "pageable (transfers and host arrays in pageable memory) and ops (backend calls).\n"
    "\n"
    "--membw-mib MIB: 3 streaming-read passes (xor of MIB MiB in transparent huge pages, the\n"
    "decode's threads, tsr_membw's loop) before each timed repeat and 3 after the last.\n"
    "read_gb_s is the median pass, read_best_gb_s the fastest, and\n"
    "decode_read_ratio = decode_gb_s / read_gb_s: the decode against the machine's read\n"
    "bandwidth at the same moments (on a shared machine both move with the neighbours).\n"
    "A MIB over half of the memory available (MemAvailable) is refused as a usage error.\n"
    "\n"
    "Exit status: 0 success, 1 runtime failure, 2 usage error.";

static int tsr__check_range(tsr_cli *cli, const char *name, int v, int lo, int hi) {
    if (v >= lo && v <= hi) return 0;
    return tsr_cli_usage_error(cli, "--%s %d: expected an integer in [%d, %d]", name, v, lo, hi);
}

/* Returns 0 to run, else the exit code (0 after --help, 2 on a usage error). */
static int tsr__bench_parse(int argc, char **argv, tsr__bench_opts *o, int *exit_code) {
    *o = (tsr__bench_opts){.prompt_tokens = 128, .gen_tokens = 128, .threads = tsr_sys_cpus(),
                           .dtype = -1, .repeat = 3, .warmup = 1, .batch = 1};
    tsr_cli_opt opts[] = {
        {"model", TSR_OPT_STRING, &o->model, "SPEC", "model to load (required)", false},
        {"prompt-tokens", TSR_OPT_INT, &o->prompt_tokens, "N", "prefill chunk length", false},
        {"gen-tokens", TSR_OPT_INT, &o->gen_tokens, "M", "decode steps (0: prefill only)",
         false},
        {"threads", TSR_OPT_INT, &o->threads, "T",
         "CPU kernel threads (the default is the CPUs this process may run on; at most 4 per "
         "such CPU)", false},
        {"dtype", TSR_OPT_STRING, &o->dtype_name, "f32|bf16|q8_0|q4_0|q4_1|fp8",
         "weight dtype (default: as the model stores it; fp8: cuda, Q8_0 elsewhere); on the "
         "CPU a quantized dtype also runs MXFP4 experts with 8-bit activations", false},
        {"repeat", TSR_OPT_INT, &o->repeat, "R", "timed repeats, median reported", false},
        {"warmup", TSR_OPT_INT, &o->warmup, "W",
         "untimed rounds of the same prefill and decode steps (they also fault in the KV "
         "pool's pages, as llama.cpp's benchmarks clear their KV buffer before timing)",
         false},
        {"kv", TSR_OPT_STRING, &o->kv, "paged|dense|offload",
         "KV cache: the paged pool of generate and run (16-token blocks, no prefix sharing), "
         "one contiguous buffer, or the offload policy (InfiniGen's skew mode at a 20 % "
         "budget, its copies on copy streams; the JSON adds its kv_stats, copy_hidden the "
         "share of the fetch's copy time the compute stream did not wait for, -1 where the "
         "backend times no events) (default: paged)", false},
        {"kv-dtype", TSR_OPT_STRING, &o->kv_dtype, "f32|bf16|q8|fp8",
         "KV storage dtype (default: the backend's, f32 on the CPU, bf16 on cuda)", false},
        {"backend", TSR_OPT_STRING, &o->backend, "NAME",
         "auto, cpu, cpu-fenced or cuda (default: cpu)", false},
        {"membw-mib", TSR_OPT_INT, &o->membw_mib, "MIB",
         "also measure the streaming-read bandwidth beside the decode: passes over a MIB MiB "
         "buffer before each timed repeat and after the last (0: off)", false},
        {"batch", TSR_OPT_INT, &o->batch, "B",
         "sequences decoded together, B rows per decode call (default 1; --kv paged only)",
         false},
        {"json", TSR_OPT_FLAG, &o->json, NULL, "print one JSON line instead of text", false},
    };
    tsr_cli cli = {"bench", "--model SPEC [options]", tsr__bench_about, opts,
                   (int)(sizeof opts / sizeof opts[0])};
    *exit_code = 0;
    tsr_cli_result res = tsr_cli_parse(&cli, argc, argv);
    if (res != TSR_CLI_OK) {
        *exit_code = res == TSR_CLI_HELP ? 0 : 2;
        return 1;
    }
    *exit_code = 2;
    if (!o->model || !*o->model) return tsr_cli_usage_error(&cli, "--model SPEC is required");
    if (tsr__check_range(&cli, "prompt-tokens", o->prompt_tokens, 1, 1 << 20) ||
        tsr__check_range(&cli, "gen-tokens", o->gen_tokens, 0, 1 << 20) ||
        tsr__check_range(&cli, "repeat", o->repeat, 1, 1000) ||
        tsr__check_range(&cli, "warmup", o->warmup, 0, 1000) ||
        tsr__check_range(&cli, "membw-mib", o->membw_mib, 0, 1 << 20) ||
        tsr__check_range(&cli, "batch", o->batch, 1, 4096) ||
        tsr_cli_check_threads(&cli, o->threads) != TSR_CLI_OK)
        return 1;
    int64_t avail;
    if (o->membw_mib > 0 && !tsr_membw_fits((size_t)o->membw_mib << 20, &avail))
        return tsr_cli_usage_error(&cli, "--membw-mib %d: more than half of the %lld MiB of "
                                   "memory available", o->membw_mib, (long long)(avail >> 20));
    if (!o->kv) o->kv = "paged";
    if (!o->backend) o->backend = "cpu";
    if (strcmp(o->kv, "paged") != 0 && strcmp(o->kv, "dense") != 0 &&
        strcmp(o->kv, "offload") != 0)
        return tsr_cli_usage_error(&cli, "--kv '%s': expected paged, dense or offload", o->kv);
    if (o->kv_dtype && tsr_kv_dtype_parse(o->kv_dtype) < 0)
        return tsr_cli_usage_error(&cli, "--kv-dtype %s: unknown (use f32, bf16, q8 or fp8)",
                                   o->kv_dtype);
    if (o->batch > 1 && strcmp(o->kv, "paged") != 0)
        return tsr_cli_usage_error(&cli, "--batch %d: only with --kv paged", o->batch);
    if (o->dtype_name) {
        o->dtype = tsr_dtype_parse(o->dtype_name);
        if (o->dtype != TSR_F32 && o->dtype != TSR_BF16 && o->dtype != TSR_Q8_0 &&
            o->dtype != TSR_Q4_0 && o->dtype != TSR_Q4_1 && o->dtype != TSR_F8_E4M3)
            return tsr_cli_usage_error(&cli, "--dtype '%s': expected f32, bf16, q8_0, q4_0, q4_1 or fp8",
                                       o->dtype_name);
    }
    *exit_code = 0;
    return 0;
}

/* One-line usage error after parsing (same shape as tsr_cli_usage_error). */
__attribute__((format(printf, 1, 2))) static int tsr__bench_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see tessera bench --help)\n");
    va_end(ap);
    return 2;
}

static int tsr__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double tsr__median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, tsr__cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A synthetic SPEC that names a dtype other than --dtype is a usage error: the engine
 * makes a synthetic SPEC in --dtype (",dtype=" appended) and converts any other model. */
static int tsr__bench_check_dtype(const tsr__bench_opts *o) {
    const char *spec = o->model;
    if (o->dtype < 0 || o->dtype == TSR_Q8_0 || o->dtype == TSR_Q4_0 || o->dtype == TSR_Q4_1 ||
        o->dtype == TSR_F8_E4M3 ||
        strncmp(spec, "synthetic:", 10) != 0)
        return 0;
    const char *have = strstr(spec, ",dtype=");
    if (!have) return 0;
    char given[16];
    size_t len = strcspn(have + 7, ",");
    snprintf(given, sizeof given, "%.*s", (int)(len < 15 ? len : 15), have + 7);
    if (tsr_dtype_parse(given) == o->dtype) return 0;
    return tsr__bench_usage_error("--dtype %s conflicts with the model spec '%s'",
                                  tsr_dtype_name((tsr_dtype)o->dtype), spec);
}

typedef struct tsr__bench_run {
    tsr_forward *fwd; /* the engine's */
    tsr_kv_cache *kv; /* the engine's */
    tsr_backend *be;  /* the engine's */
    tsr_sampler *smp; /* greedy, one per sequence */
    tsr_sampler **smp_of;
    int batch;
    tsr_batch_seq *seqs;
    int32_t *tok, *in; /* per sequence: the last token drawn, the step's input */
    int32_t *prompt;
    int vocab;
    /* The backend's counters over the timed decode steps (their sums; steps counted) */
    tsr_backend_counters cnt;
    int64_t cnt_steps;
} tsr__bench_run;

static void tsr__cnt_add(tsr_backend_counters *a, const tsr_backend_counters *b) {
    a->uploads += b->uploads;
    a->upload_bytes += b->upload_bytes;
    a->downloads += b->downloads;
    a->download_bytes += b->download_bytes;
    a->syncs += b->syncs;
    a->host_args += b->host_args;
    a->host_arg_bytes += b->host_arg_bytes;
    a->ops += b->ops;
    a->pageable += b->pageable;
    a->stream_copies += b->stream_copies;
}

/* Rows per block of the paged cache (the default of generate and run). */
#define TSR__BENCH_BLOCK 16

/* Prefill samples: at least this much time in all, with at most this many extra rounds. */
#define TSR__BENCH_MIN_PREFILL_S 0.2
#define TSR__BENCH_MAX_EXTRA 1000

/* One forward call over n sequences and their greedy tokens, drawn on the backend as
 * generate and run draw them (logits kept there, only the ids come back). */
static tsr_status tsr__bench_step(tsr__bench_run *r, int n, int32_t *tok) {
    int rows = 0;
    TSR_TRY(tsr_forward_run(r->fwd, r->kv, r->seqs, n, NULL, &rows));
    return tsr_forward_sample(r->fwd, r->smp_of, rows, tok);
}

/* Fresh sequences 0..batch-1: each prefilled with n_prompt tokens in its own call, then
 * n_gen greedy steps of one token for every sequence (counted: `cnt` adds the backend's
 * counters of the steps). */
static tsr_status tsr__bench_once(tsr__bench_run *r, int n_prompt, int n_gen, double *prefill_s,
                                  double *decode_s, int32_t *last, bool cnt) {
    tsr_status st = TSR_OK;
    int added = 0;
    double t0 = tsr_sys_now();
    for (int s = 0; s < r->batch; s++) {
        TSR_TRY_GOTO(r->kv->ops->seq_add(r->kv, s), st, done);
        added = s + 1;
        r->seqs[0] = (tsr_batch_seq){.seq = s, .tokens = r->prompt, .n_tokens = n_prompt,
                                     .want_logits = true, .all_logits = false};
        TSR_TRY_GOTO(tsr__bench_step(r, 1, &r->tok[s]), st, done);
    }
    double t1 = tsr_sys_now();
    tsr_backend_counters c;
    bool counting = cnt && r->be->ops->counters && n_gen > 0;
    if (counting) r->be->ops->counters(r->be, &c, true);
    for (int s = 0; s < r->batch; s++)
        r->seqs[s] = (tsr_batch_seq){.seq = s, .tokens = &r->in[s], .n_tokens = 1,
                                     .want_logits = true, .all_logits = false};
    for (int g = 0; g < n_gen; g++) {
        memcpy(r->in, r->tok, (size_t)r->batch * sizeof *r->in);
        TSR_TRY_GOTO(tsr__bench_step(r, r->batch, r->tok), st, done);
    }
    double t2 = tsr_sys_now();
    if (counting) {
        r->be->ops->counters(r->be, &c, true);
        tsr__cnt_add(&r->cnt, &c);
        r->cnt_steps += n_gen;
    }
    *prefill_s = t1 - t0;
    *decode_s = t2 - t1;
    *last = r->tok[0];
done:
    for (int s = 0; s < added; s++) r->kv->ops->seq_free(r->kv, s);
    return st;
}

/* The streaming-read probe of --membw-mib: TSR__BENCH_PROBE_PASSES passes over its own
 * buffer, with the decode's threads, before each timed repeat and after the last, so that
 * the read and the decode see the same moments of a shared machine (docs/perf.md). */
#define TSR__BENCH_PROBE_PASSES 3 /* --help says 3 */

typedef struct tsr__bench_probe {
    void *buf; /* NULL: no probe */
    size_t bytes;
    int threads;
    double *sec; /* seconds per pass */
    int n, cap;
} tsr__bench_probe;

static tsr_status tsr__probe_init(tsr__bench_probe *p, int mib, int threads, int repeat) {
    if (mib <= 0) return TSR_OK;
    p->bytes = (size_t)mib << 20;
    p->threads = threads;
    p->cap = TSR__BENCH_PROBE_PASSES * (repeat + 1);
    p->sec = tsr_calloc((size_t)p->cap, sizeof *p->sec);
    p->buf = tsr_malloc_huge(p->bytes);
    if (!p->sec || !p->buf) return TSR_ERR_NOMEM;
    tsr_membw_fill(p->buf, p->bytes, threads);
    volatile uint64_t sink = 0;
    tsr_membw_pass(p->buf, p->bytes, threads, &sink); /* warm-up: page tables, frequency */
    return TSR_OK;
}

static void tsr__probe_run(tsr__bench_probe *p) {
    volatile uint64_t sink = 0;
    for (int i = 0; p->buf && i < TSR__BENCH_PROBE_PASSES && p->n < p->cap; i++)
        p->sec[p->n++] = tsr_membw_pass(p->buf, p->bytes, p->threads, &sink);
}

static void tsr__probe_free(tsr__bench_probe *p) {
    if (p->buf) tsr_free_huge(p->buf, p->bytes);
    tsr_free(p->sec);
}

static void tsr__json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

int tsr_cmd_bench(int argc, char **argv) {
    tsr__bench_opts o;
    int rc;
    if (tsr__bench_parse(argc, argv, &o, &rc)) return rc;

    tsr_engine *eng = NULL;
    tsr__bench_run r = {0};
    tsr__bench_probe probe = {0};
    double *pre = NULL, *dec = NULL;
    int smp_ok = 0; /* samplers initialised */
    rc = tsr__bench_check_dtype(&o);
    if (rc) return rc;
    int n = o.prompt_tokens, g = o.gen_tokens, nb = o.batch;

    /* The engine loads SPEC (in --dtype), packs the weights into huge pages, as generate
     * and run use them, and refuses a model whose context cannot hold n + g tokens. */
    tsr_model_config loaded;
    tsr_engine_spec eo = {.model_path = o.model, .backend = o.backend, .threads = o.threads,
                          .max_tokens = n > nb ? n : nb, .min_context = n + g, .config_out = &loaded,
                          .pack_weights = true};
    tsr_engine_spec_dtype(&eo, o.dtype_name);
    /* offload: InfiniGen's skew mode (the next layer's fetch speculated, so its copy can
     * overlap the layer before) at a 20 % budget */
    static const tsr_kv_policy_arg skew[] = {{"offload-mode", "skew"}};
    if (strcmp(o.kv, "dense") == 0) {
        eo.dense_kv_tokens = n + g;
        eo.kv.max_seqs = 1;
    } else if (strcmp(o.kv, "offload") == 0) {
        eo.kv_blocks = ((int64_t)n + g + TSR__BENCH_BLOCK - 1) / TSR__BENCH_BLOCK;
        eo.kv = (tsr_kv_options){.policy = &tsr_kv_policy_offload,
                                 .block_size = TSR__BENCH_BLOCK, .max_seqs = 1,
                                 .no_prefix_cache = 1, .chunk_tokens = n, .max_context = n + g,
                                 .budget = 0.2, .policy_args = skew, .n_policy_args = 1};
    } else {
        /* The pool holds exactly --batch sequences of n + g tokens: blocks of 16 rows of K
         * and V per layer. No prefix sharing: every sequence and repeat feeds the same
         * prompt. */
        eo.kv_blocks = nb * (((int64_t)n + g + TSR__BENCH_BLOCK - 1) / TSR__BENCH_BLOCK);
        eo.kv = (tsr_kv_options){.policy = &tsr_kv_policy_paged, .block_size = TSR__BENCH_BLOCK,
                                 .max_seqs = nb, .no_prefix_cache = 1, .chunk_tokens = n,
                                 .max_context = n + g};
    }
    eo.kv.kv_dtype = o.kv_dtype;
    tsr_status est = tsr_engine_create(&eo, &eng);
    if (est == TSR_ERR_BUDGET && loaded.max_seq_len > 0 && (int64_t)n + g > loaded.max_seq_len)
        return tsr__bench_usage_error("--prompt-tokens %d + --gen-tokens %d exceed the model's "
                                      "context of %d tokens", n, g, loaded.max_seq_len);
    rc = 1;
    if (est != TSR_OK) goto fail;
    const tsr_model *m = eng->model;
    const tsr_model_config *c = &m->cfg;
    tsr_backend *be = eng->be;
    r.kv = eng->kv;
    r.fwd = eng->fwd;
    r.be = be;
    r.vocab = c->vocab_size;
    r.batch = nb;
    r.smp = tsr_calloc((size_t)nb, sizeof *r.smp);
    r.smp_of = tsr_calloc((size_t)nb, sizeof *r.smp_of);
    r.seqs = tsr_calloc((size_t)nb, sizeof *r.seqs);
    r.tok = tsr_calloc((size_t)nb, sizeof *r.tok);
    r.in = tsr_calloc((size_t)nb, sizeof *r.in);
    r.prompt = tsr_malloc((size_t)n * sizeof *r.prompt);
    pre = tsr_calloc((size_t)o.repeat + TSR__BENCH_MAX_EXTRA, sizeof *pre);
    dec = tsr_calloc((size_t)o.repeat, sizeof *dec);
    if (!r.smp || !r.smp_of || !r.seqs || !r.tok || !r.in || !r.prompt || !pre || !dec)
        goto fail;
    tsr_sampler_params greedy = {.temperature = 0, .top_p = 1, .seed = 1};
    for (; smp_ok < nb; smp_ok++) {
        if (tsr_sampler_init(&r.smp[smp_ok], c->vocab_size, &greedy) != TSR_OK) goto fail;
        r.smp_of[smp_ok] = &r.smp[smp_ok];
    }
    uint64_t s = 0x243f6a8885a308d3ull; /* xorshift64: the same ids every run */
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        r.prompt[i] = (int32_t)(s % (uint64_t)c->vocab_size);
    }

    int32_t last = -1;
    for (int w = 0; w < o.warmup; w++) {
        double a, b;
        if (tsr__bench_once(&r, n, g, &a, &b, &last, false) != TSR_OK) goto fail;
    }
    if (tsr__probe_init(&probe, o.membw_mib, be->threads > 0 ? be->threads : o.threads,
                        o.repeat) != TSR_OK)
        goto fail;
    for (int i = 0; i < o.repeat; i++) {
        tsr__probe_run(&probe);
        if (tsr__bench_once(&r, n, g, &pre[i], &dec[i], &last, true) != TSR_OK) goto fail;
    }
    tsr__probe_run(&probe);
    int npre = o.repeat;
    double pre_sum = 0;
    for (int i = 0; i < npre; i++) pre_sum += pre[i];
    while (pre_sum < TSR__BENCH_MIN_PREFILL_S && npre < o.repeat + TSR__BENCH_MAX_EXTRA) {
        double unused;
        if (tsr__bench_once(&r, n, 0, &pre[npre], &unused, &last, false) != TSR_OK) goto fail;
        pre_sum += pre[npre++];
    }
    double prefill_s = tsr__median(pre, npre), decode_s = tsr__median(dec, o.repeat);

    /* bytes of one embedding value as stored (Q8_0: 34 bytes a block of 32) */
    double wsz = (double)tsr_tensor_bytes(&m->tok_emb) /
                 ((double)m->tok_emb.rows * (double)m->tok_emb.cols);
    double hd = c->head_dim, q = (double)c->n_heads * hd, kvd = (double)c->n_kv_heads * hd;
    double weight_bytes = (double)tsr_model_weight_bytes(m), active_bytes = weight_bytes;
    /* a mixture of experts reads K of its E experts per decode token (MXFP4 scales and
     * the biases included) */
    double ffn = 3.0 * c->dim * (double)c->hidden_dim;
    if (c->n_experts > 0 && c->n_experts_used > 0) {
        double experts = 0.0;
        for (int l = 0; l < c->n_layers; l++) {
            const tsr_experts *xs[2] = {&m->layers[l].gate_up, &m->layers[l].down};
            for (int k = 0; k < 2; k++)
                experts += (double)(tsr_tensor_bytes(&xs[k]->w) +
                                    tsr_tensor_bytes(&xs[k]->scales) +
                                    tsr_tensor_bytes(&xs[k]->bias));
        }
        active_bytes -= experts * (1.0 - (double)c->n_experts_used / c->n_experts);
        ffn = c->n_experts_used * ffn + (double)c->dim * c->n_experts;
    }
    /* K/V rows as stored (kernels/kv_dtype.h: bf16 2 bytes an element, q8 1.125, ...) */
    tsr_kv_options kvo = eo.kv;
    kvo.be = be;
    int kv_dtype = TSR_KV_F32;
    if (tsr_kv_dtype_resolve(&kvo, &kv_dtype) != TSR_OK) goto fail;
    double kv_row = (double)tsr_kv_row_bytes(kv_dtype, (int64_t)kvd);
    double kv_read = 2.0 * c->n_layers * kv_row * (n + (g + 1) / 2.0);
    /* a decode step reads the weights once for its nb rows */
    double dec_bytes = (active_bytes + nb * ((double)c->dim * wsz + kv_read)) / nb;
    double params = (double)c->n_layers *
                    ((double)c->dim * q + 2.0 * c->dim * kvd + q * c->dim + ffn);
    double attn = 4.0 * c->n_layers * q * (n + 1) / 2.0;
    double pre_flops = 2.0 * params + attn + 2.0 * (double)c->vocab_size * c->dim / n;
    double pre_tps = (double)nb * n / prefill_s;
    double dec_tps = g > 0 ? (double)nb * g / decode_s : 0.0;
    double dec_gb = dec_bytes * dec_tps * 1e-9, read_gb = 0.0, read_best = 0.0;
    double n_weights = (double)tsr_config_param_count(c) -
                       (c->tied_embeddings ? 0.0 : (double)c->vocab_size * c->dim);
    double w_gb = active_bytes * dec_tps / nb * 1e-9, bpw = weight_bytes / n_weights;
    if (probe.n > 0) {
        double med = tsr__median(probe.sec, probe.n); /* sorts: sec[0] is the fastest pass */
        read_gb = (double)probe.bytes / med * 1e-9;
        read_best = (double)probe.bytes / probe.sec[0] * 1e-9;
    }
    double rss = (double)tsr_sys_peak_rss(), huge = (double)tsr_sys_anon_huge_bytes();
    const char *dtn = tsr_dtype_name(c->dtype);

    if (o.json) {
        printf("{\"model\":");
        tsr__json_string(o.model);
        if (m->file_type[0]) printf(",\"gguf_file_type\":\"%s\"", m->file_type);
        printf(",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"threads\":%d,\"batch\":%d,\"prompt_tokens\":%d,"
               "\"gen_tokens\":%d,\"repeat\":%d,\"prefill_samples\":%d,\"prefill_s\":%.6f,"
               "\"prefill_tok_s\":%.2f,\"prefill_gflops\":%.3f,"
               "\"decode_s\":%.6f,\"decode_tok_s\":%.2f,\"decode_gb_s\":%.3f,"
               "\"weight_gb_s\":%.3f,\"bytes_per_weight\":%.4f,"
               "\"weight_bytes\":%.0f,\"active_weight_bytes\":%.0f,"
               "\"decode_bytes_per_token\":%.0f,"
               "\"prefill_flops_per_token\":%.0f,\"peak_rss_bytes\":%.0f,"
               "\"huge_page_bytes\":%.0f,",
               dtn, tsr_kv_dtype_name(kv_dtype), be->threads > 0 ? be->threads : o.threads, nb,
               n, g, o.repeat, npre,
               prefill_s,
               pre_tps, pre_flops * pre_tps * 1e-9, decode_s, dec_tps,
               dec_gb, w_gb, bpw, weight_bytes, active_bytes, dec_bytes, pre_flops, rss, huge);
        /* KV bytes per token by layer type (sliding-window layers stop at their window) */
        tsr_kv_layer_bytes lb;
        char kvm[256] = "null";
        if (tsr_kv_layer_bytes_of(&kvo, c, &lb) == TSR_OK)
            tsr_kv_layer_bytes_json(&lb, kvm, sizeof kvm);
        printf("\"kv_memory\":%s,", kvm);
        if (probe.n > 0)
            printf("\"membw_bytes\":%zu,\"read_passes\":%d,\"read_gb_s\":%.3f,"
                   "\"read_best_gb_s\":%.3f,\"decode_read_ratio\":%.4f,",
                   probe.bytes, probe.n, read_gb, read_best, dec_gb / read_gb);
        if (r.cnt_steps > 0) {
            const tsr_backend_counters *k = &r.cnt;
            const char *names[] = {"uploads", "upload_bytes", "downloads", "download_bytes",
                                   "waits", "host_arrays", "pageable", "ops",
                                   "stream_copies"};
            int64_t vals[] = {k->uploads, k->upload_bytes, k->downloads, k->download_bytes,
                              k->syncs, k->host_args, k->pageable, k->ops, k->stream_copies};
            double per[] = {(double)r.cnt_steps, (double)r.cnt_steps * c->n_layers};
            printf("\"step_counters\":{");
            for (int w = 0; w < 2; w++) {
                printf("%s\"%s\":{", w ? "," : "", w ? "per_layer" : "per_token");
                for (size_t j = 0; j < sizeof vals / sizeof vals[0]; j++)
                    printf("%s\"%s\":%.4g", j ? "," : "", names[j], (double)vals[j] / per[w]);
                printf("}");
            }
            printf("},");
        }
        if (strcmp(o.kv, "offload") == 0) {
            char ks[4096];
            if (tsr_kv_stats_json(eng->kv, ks, sizeof ks) > 0) printf("\"kv_stats\":%s,", ks);
        }
        printf("\"dim\":%d,\"hidden_dim\":%d,\"n_layers\":%d,\"n_heads\":%d,"
               "\"n_kv_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,\"last_token\":%d}\n",
               c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
               c->vocab_size, last);
    } else {
        printf("model   %s (%s", o.model, dtn);
        if (m->file_type[0]) printf(" from a GGUF %s", m->file_type);
        printf(", %.1f MB of weights", weight_bytes * 1e-6);
        if (active_bytes != weight_bytes)
            printf(", %.1f MB active per token (%d of %d experts)", active_bytes * 1e-6,
                   c->n_experts_used, c->n_experts);
        printf(", dim %d, %d layers, vocab %d), %s KV, %d thread%s\n", c->dim, c->n_layers,
               c->vocab_size, tsr_kv_dtype_name(kv_dtype), o.threads,
               o.threads == 1 ? "" : "s");
        printf("prefill %d tokens in %.4f s: %.1f tok/s, %.2f GFLOP/s (%.2f MFLOP/token)\n", nb * n,
               prefill_s, pre_tps, pre_flops * pre_tps * 1e-9, pre_flops * 1e-6);
        if (g > 0)
            printf("decode  %d tokens in %.4f s: %.1f tok/s, %.2f GB/s (%.2f MB/token); "
                   "weights %.2f MB/token at %.4f bytes/weight: %.2f GB/s\n", nb * g, decode_s,
                   dec_tps, dec_gb, dec_bytes * 1e-6, active_bytes * 1e-6, bpw, w_gb);
        if (probe.n > 0)
            printf("read    %d MiB streaming read beside the decode: %.2f GB/s (median of %d "
                   "passes; best %.2f); decode at %.1f %% of it\n", o.membw_mib, read_gb,
                   probe.n, read_best, 100.0 * dec_gb / read_gb);
        printf("median of %d repeat%s (prefill: %d samples); peak RSS %.1f MiB", o.repeat,
               o.repeat == 1 ? "" : "s", npre, rss / 1048576.0);
        if (huge >= 0) printf(", %.1f MiB in transparent huge pages", huge / 1048576.0);
        printf("\n");
    }
    rc = 0;
fail:
    if (rc) rc = tsr_cmd_fail("bench");
    tsr_engine_destroy(eng); /* forward, KV cache, placed weights, backend, model */
    for (int i = 0; i < smp_ok; i++) tsr_sampler_free(&r.smp[i]);
    tsr_free(r.smp);
    tsr_free(r.smp_of);
    tsr_free(r.seqs);
    tsr_free(r.tok);
    tsr_free(r.in);
    tsr_free(r.prompt);
    tsr_free(pre);
    tsr_free(dec);
    tsr__probe_free(&probe);
    return rc;
}
