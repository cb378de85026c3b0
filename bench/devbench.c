/* Throughput driver for tests/device/run.sh: prefill tokens/s of one chunk, and decode
 * tokens/s at several batch sizes, on one backend, with the bytes and flops each step must
 * move and do, so that the caller can set them against the ceilings measured on the same
 * machine (bench/gpu_roofline.cu: copy bandwidth, BF16 GEMM rate).
 *
 *   tsr_devbench SPEC [--backend B] [--threads T] [--prefill N] [--repeat R]
 *                [--batch B1,B2,...] [--ctx C] [--gen M]
 *
 * Prefill: one sequence, N pseudo-random ids as ONE forward call (logits for the last row),
 * 1 untimed + R timed rounds on fresh sequences, median. Decode at batch B: B sequences
 * each prefilled with C tokens (several sequences per call), 2 untimed steps, then M timed
 * steps of one token per sequence in one forward call each. Decode feeds pseudo-random ids
 * (the work does not depend on them) and leaves the host argmax out; each step's logits
 * ([B][vocab] f32) still come back to the host, as they do for generate and run today.
 * The forward call returns once its logits are on the host, so host clocks time the device.
 *
 * Output, one line each (key=value):
 *   model spec= device= layers= dim= ... weight_bytes= (every matrix and norm one decode
 *         step reads: layers, final norm, classifier; not the embedding table)
 *   prefill tokens=N seconds= tok_s= flops_per_token= bytes=
 *   decode batch=B ctx=C steps=M seconds= step_s= tok_s= bytes_per_step= flops_per_step=
 * Derived (L layers, d dim, H heads, G kv heads, hd head dim, V vocab, P the layer matrices'
 * parameters, W weight_bytes, kv = the K and V bytes per token as the paged pool stores them,
 * L * block bytes / block rows: 2*L*G*hd*4 for f32 rows, plus the positions):
 *   prefill flops_per_token = 2P + 4*L*H*hd*(N+1)/2 + 2*V*d/N (as tessera bench)
 *   prefill bytes = W + N*kv (each weight read once, K/V written once)
 *   decode bytes_per_step = W + B*d*esize (embedding rows) + B*kv*(c + 1), c the mean
 *       context over the timed steps (C + 2 + (M-1)/2): K/V read, plus the row written
 *   decode flops_per_step = B*(2P + 2*V*d + 4*L*H*hd*c)
 * Exit 0, or 1 with one line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_time.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "base/sys.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"

#define TSR__MAX_BATCHES 8

typedef struct tsr__db {
    tsr_engine *eng;
    float *logits;  /* [max rows][vocab] */
    int32_t *ids;   /* pseudo-random ids */
    int n_ids;
    uint32_t rng;
} tsr__db;

static int32_t tsr__next_id(tsr__db *d) {
    d->rng = d->rng * 1664525u + 1013904223u;
    return (int32_t)((d->rng >> 8) % (uint32_t)d->eng->model->cfg.vocab_size);
}

/* Bytes of every tensor one decode step reads, the embedding table aside. */
static double tsr__weight_bytes(const tsr_model *m) {
    double b = (double)tsr_tensor_bytes(&m->out_norm) + (double)tsr_tensor_bytes(&m->classifier);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        const tsr_tensor *ts[] = {&w->attn_norm, &w->wq,     &w->wk,   &w->wv,    &w->wo,
                                  &w->ffn_norm,  &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) b += (double)tsr_tensor_bytes(ts[i]);
    }
    return b;
}

static tsr_status tsr__prefill(tsr__db *d, int n, int repeat, double *median_s) {
    tsr_kv_cache *kv = d->eng->kv;
    double *t = tsr_calloc((size_t)repeat, sizeof *t);
    if (!t) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    for (int r = -1; r < repeat && st == TSR_OK; r++) {
        st = kv->ops->seq_add(kv, 0);
        if (st != TSR_OK) break;
        tsr_batch_seq b = {.seq = 0, .tokens = d->ids, .n_tokens = n, .want_logits = true};
        int rows = 0;
        double t0 = tsr_sys_now();
        st = tsr_forward_run(d->eng->fwd, kv, &b, 1, d->logits, &rows);
        if (r >= 0) t[r] = tsr_sys_now() - t0;
        kv->ops->seq_free(kv, 0);
    }
    *median_s = tsr_bench_time_median(t, repeat);
    tsr_free(t);
    return st;
}

/* B sequences of C tokens, then 2 + M steps; *secs: the M timed steps. */
static tsr_status tsr__decode(tsr__db *d, int batch, int ctx, int gen, int max_tokens,
                              double *secs) {
    tsr_kv_cache *kv = d->eng->kv;
    tsr_status st = TSR_OK;
    int added = 0;
    tsr_batch_seq *b = tsr_calloc((size_t)batch, sizeof *b);
    int32_t *step = tsr_calloc((size_t)batch, sizeof *step);
    if (!b || !step) st = TSR_ERR_NOMEM;
    for (; st == TSR_OK && added < batch; added++) st = kv->ops->seq_add(kv, added);
    /* Prefill: as many whole prompts per call as max_tokens allows. */
    for (int s = 0; st == TSR_OK && s < batch;) {
        int nb = 0, tokens = 0;
        while (s + nb < batch && tokens + ctx <= max_tokens) {
            b[nb] = (tsr_batch_seq){.seq = s + nb, .tokens = d->ids, .n_tokens = ctx,
                                    .want_logits = true};
            tokens += ctx;
            nb++;
        }
        int rows = 0;
        st = tsr_forward_run(d->eng->fwd, kv, b, nb, d->logits, &rows);
        s += nb;
    }
    double t0 = 0;
    for (int g = -2; st == TSR_OK && g < gen; g++) {
        if (g == 0) t0 = tsr_sys_now();
        for (int s = 0; s < batch; s++) {
            step[s] = tsr__next_id(d);
            b[s] = (tsr_batch_seq){.seq = s, .tokens = &step[s], .n_tokens = 1,
                                   .want_logits = true};
        }
        int rows = 0;
        st = tsr_forward_run(d->eng->fwd, kv, b, batch, d->logits, &rows);
    }
    *secs = tsr_sys_now() - t0;
    for (int s = 0; s < added; s++) kv->ops->seq_free(kv, s);
    tsr_free(b);
    tsr_free(step);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s SPEC [--backend B] [--threads T] [--prefill N] [--repeat R] "
                        "[--batch B1,B2,...] [--ctx C] [--gen M]\n", argv[0]);
        return 1;
    }
    const char *spec = argv[1], *backend = "cpu", *batches = "1,64";
    int threads = tsr_sys_cpus(), prefill = 2048, repeat = 3, ctx = 512, gen = 32;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "devbench: %s needs a value\n", a);
            return 1;
        }
        i++;
        if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--prefill")) prefill = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--batch")) batches = v;
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "--gen")) gen = atoi(v);
        else {
            fprintf(stderr, "devbench: unknown option %s\n", a);
            return 1;
        }
    }
    int bs[TSR__MAX_BATCHES], nbs = 0, max_b = 0;
    for (const char *p = batches; *p && nbs < TSR__MAX_BATCHES;) {
        bs[nbs] = atoi(p);
        if (bs[nbs] <= 0) {
            fprintf(stderr, "devbench: --batch %s: expected positive integers\n", batches);
            return 1;
        }
        if (bs[nbs] > max_b) max_b = bs[nbs];
        nbs++;
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    if (prefill <= 0 || repeat <= 0 || ctx <= 0 || gen <= 0 || threads <= 0 || nbs == 0) {
        fprintf(stderr, "devbench: sizes must be positive\n");
        return 1;
    }

    tsr__db d = {.rng = 12345u};
    int max_tokens = prefill > ctx ? prefill : ctx;
    if (max_b > max_tokens) max_tokens = max_b;
    /* The pool: max_b sequences of ctx + gen + 2 tokens, or the prefill, with a block of
     * slack each; the model must hold either with a block to spare. */
    int64_t per = ctx + gen + 2 + 16, toks = (int64_t)max_b * (per + 16);
    if (toks < prefill + 32) toks = prefill + 32;
    int need = (prefill > ctx + gen ? prefill : ctx + gen) + 16;
    tsr_model_config loaded;
    tsr_engine_spec eo = {
        .model_path = spec, .backend = backend, .threads = threads, .max_tokens = max_tokens,
        .min_context = need, .config_out = &loaded, .kv_blocks = toks / 16 + max_b + 1,
        .kv = {.policy = &tsr_kv_policy_paged, .block_size = 16, .max_seqs = max_b,
               .no_prefix_cache = 1, .chunk_tokens = max_tokens,
               .max_context = (int)(per > prefill + 16 ? per : prefill + 16)}};
    tsr_status st = tsr_engine_create(&eo, &d.eng);
    if (st == TSR_ERR_BUDGET && loaded.max_seq_len > 0 && loaded.max_seq_len < need)
        st = tsr_error_set(TSR_ERR_INVALID, "devbench: %s holds %d positions, fewer than "
                           "the prefill or ctx + gen asked for", spec, loaded.max_seq_len);
    if (st == TSR_OK) {
        d.n_ids = prefill > ctx ? prefill : ctx;
        d.ids = tsr_malloc((size_t)d.n_ids * sizeof *d.ids);
        d.logits = tsr_malloc((size_t)max_tokens * (size_t)d.eng->model->cfg.vocab_size *
                              sizeof *d.logits);
        if (!d.ids || !d.logits) st = TSR_ERR_NOMEM;
        for (int i = 0; st == TSR_OK && i < d.n_ids; i++) d.ids[i] = tsr__next_id(&d);
    }
    if (st == TSR_OK) {
        const tsr_model *hm = d.eng->model;
        const tsr_model_config *c = &hm->cfg;
        double L = c->n_layers, dm = c->dim, H = c->n_heads, G = c->n_kv_heads, hd = c->head_dim,
               V = c->vocab_size, h = c->hidden_dim;
        double P = L * (dm * H * hd + 2 * dm * G * hd + H * hd * dm + 3 * dm * h);
        /* K/V bytes per token as the pool stores them (a block's bytes over its rows), so
         * the figure follows the storage type. */
        tsr_kv_paged_config kc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                                  .head_dim = c->head_dim, .block_size = 16};
        double W = tsr__weight_bytes(hm), kv = L * (double)tsr_kv_paged_block_bytes(&kc) / 16;
        double esize = (double)tsr_dtype_size(hm->tok_emb.dtype);
        printf("model spec=%s device=%s layers=%d dim=%d hidden=%d heads=%d kv_heads=%d "
               "head_dim=%d vocab=%d dtype=%s weight_bytes=%.0f kv_bytes_per_token=%.0f\n",
               spec, tsr_engine_device_name(d.eng), c->n_layers, c->dim, c->hidden_dim,
               c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
               tsr_dtype_name(c->dtype), W, kv);
        fflush(stdout);
        double s = 0;
        st = tsr__prefill(&d, prefill, repeat, &s);
        if (st == TSR_OK) {
            double n = prefill;
            double fpt = 2 * P + 4 * L * H * hd * (n + 1) / 2 + 2 * V * dm / n;
            printf("prefill tokens=%d seconds=%.6f tok_s=%.1f flops_per_token=%.6g "
                   "bytes=%.6g\n", prefill, s, n / s, fpt, W + n * kv);
            fflush(stdout);
        }
        for (int i = 0; st == TSR_OK && i < nbs; i++) {
            int B = bs[i];
            st = tsr__decode(&d, B, ctx, gen, max_tokens, &s);
            if (st != TSR_OK) break;
            double cm = ctx + 2 + (gen - 1) / 2.0;
            printf("decode batch=%d ctx=%d steps=%d seconds=%.6f step_s=%.6g tok_s=%.1f "
                   "bytes_per_step=%.6g flops_per_step=%.6g\n",
                   B, ctx, gen, s, s / gen, B * gen / s, W + B * dm * esize + B * kv * (cm + 1),
                   B * (2 * P + 2 * V * dm + 4 * L * H * hd * cm));
            fflush(stdout);
        }
    }
    int rc = 0;
    if (st != TSR_OK) {
        fprintf(stderr, "devbench: %s: %s\n", tsr_strerror(st), tsr_last_error());
        rc = 1;
    }
    tsr_free(d.ids);
    tsr_free(d.logits);
    if (d.eng) tsr_engine_destroy(d.eng);
    return rc;
}
