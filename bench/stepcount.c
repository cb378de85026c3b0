/* What one decode step moves between host and device and how often it stops the host, per
 * KV policy, counted on the fenced CPU device (kernels/cpu/backend_fenced.c: its op
 * `counters`), so that the transfers a GPU step would pay are checked without a GPU:
 *
 *   tsr_stepcount SPEC [--kv-policy NAME] [--batch B] [--ctx C] [--steps S] [--budget X]
 *                 [--threads T] [--no-fuse] [--POLICY-OPTION V | --POLICY-FLAG]...
 *
 * B sequences of C pseudo-random prompt tokens (one prefill call), then S decode steps of
 * one token per sequence, each taken as generate and run take it: one forward call with the
 * logits kept on the device, then the ids sampled there (greedy). The counters are reset
 * after the prefill; the line gives the means per step and per layer:
 *   step policy= batch= ctx= layers= steps= downloads= download_bytes= uploads=
 *        upload_bytes= waits= host_arrays= host_array_bytes= pageable= ops=
 *        downloads_per_layer= ops_per_layer= stream_copies= waits_per_layer=
 * (docs/perf.md has the counts and what each one is). The arena is TSR_FENCED_MEMORY or
 * the fenced device's default. --no-fuse keeps q/k/v and gate/up apart (the engine's
 * no_fuse: runtime/model/fuse.h), for the counts without fused weights. stream_copies are
 * the transfers queued on copy streams (no host wait; offload's overlapped fetch and
 * write-back); waits_per_layer is waits over layers. Exit 0, or 1 with one line on
 * stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "base/sys.h"
#include "policies/policy.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "runtime/exec/sampler.h"

#define TSR__MAX_ARGS 32

/* Prefill, then `steps` counted decode steps; *c: their sums. */
static tsr_status tsr__run(tsr_engine *e, int batch, int ctx, int steps,
                           tsr_backend_counters *c) {
    const int V = e->model->cfg.vocab_size;
    tsr_kv_cache *kv = e->kv;
    tsr_batch_seq *b = tsr_calloc((size_t)batch, sizeof *b);
    int32_t *prompt = tsr_calloc((size_t)batch * (size_t)ctx, sizeof *prompt);
    int32_t *ids = tsr_calloc((size_t)batch, sizeof *ids);
    tsr_sampler *smp = tsr_calloc((size_t)batch, sizeof *smp);
    tsr_sampler **sp = tsr_calloc((size_t)batch, sizeof *sp);
    tsr_status st = b && prompt && ids && smp && sp ? TSR_OK : TSR_ERR_NOMEM;
    uint32_t rng = 12345u;
    int added = 0;
    for (int s = 0; st == TSR_OK && s < batch; s++) {
        tsr_sampler_params p = {.temperature = 0, .top_p = 1, .seed = 1};
        st = tsr_sampler_init(&smp[s], V, &p);
        sp[s] = &smp[s];
        if (st == TSR_OK) st = kv->ops->seq_add(kv, s);
        if (st == TSR_OK) added++;
        for (int i = 0; i < ctx; i++) {
            rng = rng * 1664525u + 1013904223u;
            prompt[(size_t)s * ctx + i] = (int32_t)((rng >> 8) % (uint32_t)V);
        }
        b[s] = (tsr_batch_seq){.seq = s, .tokens = prompt + (size_t)s * ctx, .n_tokens = ctx,
                               .want_logits = true};
    }
    int rows = 0;
    if (st == TSR_OK) st = tsr_forward_run(e->fwd, kv, b, batch, NULL, &rows);
    if (st == TSR_OK) st = tsr_forward_sample(e->fwd, sp, rows, ids);
    tsr_backend_counters none;
    if (st == TSR_OK) e->be->ops->counters(e->be, &none, true);
    for (int g = 0; st == TSR_OK && g < steps; g++) {
        for (int s = 0; s < batch; s++)
            b[s] = (tsr_batch_seq){.seq = s, .tokens = &ids[s], .n_tokens = 1,
                                   .want_logits = true};
        st = tsr_forward_run(e->fwd, kv, b, batch, NULL, &rows);
        if (st == TSR_OK) st = tsr_forward_sample(e->fwd, sp, rows, ids);
    }
    if (st == TSR_OK) e->be->ops->counters(e->be, c, false);
    for (int s = 0; s < added; s++) kv->ops->seq_free(kv, s);
    for (int s = 0; smp && s < batch; s++) tsr_sampler_free(&smp[s]);
    tsr_free(b);
    tsr_free(prompt);
    tsr_free(ids);
    tsr_free(smp);
    tsr_free(sp);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s SPEC [--kv-policy NAME] [--batch B] [--ctx C] [--steps S] "
                        "[--budget X] [--threads T] [--no-fuse] [--POLICY-OPTION V]...\n",
                argv[0]);
        return 1;
    }
    const char *spec = argv[1], *name = NULL;
    int batch = 1, ctx = 64, steps = 4, threads = tsr_sys_cpus();
    double budget = 0.5;
    bool no_fuse = false;
    tsr_kv_policy_arg args[TSR__MAX_ARGS];
    int n_args = 0;
    const char *opt_name[TSR__MAX_ARGS], *opt_value[TSR__MAX_ARGS];
    int n_opts = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--kv-policy") && v) name = argv[++i];
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--ctx") && v) ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--budget") && v) budget = atof(argv[++i]);
        else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--no-fuse")) no_fuse = true;
        else if (!strncmp(a, "--", 2) && n_opts < TSR__MAX_ARGS) {
            /* a policy option: checked against the declaration once it is known */
            opt_name[n_opts] = a + 2;
            opt_value[n_opts++] = v && strncmp(v, "--", 2) ? argv[++i] : NULL;
        } else {
            fprintf(stderr, "stepcount: unknown or incomplete option %s\n", a);
            return 1;
        }
    }
    const tsr_kv_policy_decl *pol = name ? tsr_kv_policy_find(name) : tsr_kv_policy_default();
    if (!pol) {
        fprintf(stderr, "stepcount: unknown policy %s (use %s)\n", name, tsr_kv_policy_names());
        return 1;
    }
    for (int i = 0; i < n_opts; i++) {
        const tsr_kv_policy_option *po = tsr_kv_policy_option_find(pol, opt_name[i]);
        if (!po || (po->kind != TSR_KV_OPT_FLAG && !opt_value[i])) {
            fprintf(stderr, "stepcount: --%s is no option of %s, or has no value\n",
                    opt_name[i], pol->name);
            return 1;
        }
        args[n_args++] = (tsr_kv_policy_arg){po->name, opt_value[i] ? opt_value[i] : "1"};
    }
    if (batch <= 0 || ctx <= 0 || steps <= 0 || threads <= 0) {
        fprintf(stderr, "stepcount: sizes must be positive\n");
        return 1;
    }

    tsr_engine *e = NULL;
    int max_tokens = batch * ctx, need = ctx + steps + 1;
    tsr_model_config loaded;
    tsr_engine_spec eo = {
        .model_path = spec, .backend = "cpu-fenced", .threads = threads,
        .max_tokens = max_tokens, .min_context = need, .config_out = &loaded,
        .no_fuse = no_fuse,
        .kv = {.policy = pol, .block_size = 16, .max_seqs = batch,
               .budget = pol->uses_budget ? budget : 0, .policy_args = args,
               .n_policy_args = n_args, .no_prefix_cache = 1, .chunk_tokens = max_tokens,
               .max_context = need}};
    tsr_status st = tsr_engine_create(&eo, &e);
    if (st == TSR_ERR_BUDGET && loaded.max_seq_len > 0 && loaded.max_seq_len < need)
        st = tsr_error_set(TSR_ERR_INVALID, "stepcount: %s holds %d positions, fewer than "
                           "ctx + steps", spec, loaded.max_seq_len);
    tsr_backend_counters c = {0};
    if (st == TSR_OK) st = tsr__run(e, batch, ctx, steps, &c);
    int rc = 0;
    if (st == TSR_OK) {
        int L = e->model->cfg.n_layers;
        double n = steps;
        printf("step policy=%s batch=%d ctx=%d layers=%d steps=%d downloads=%.2f "
               "download_bytes=%.0f uploads=%.2f upload_bytes=%.0f waits=%.2f "
               "host_arrays=%.2f host_array_bytes=%.0f pageable=%.2f ops=%.2f "
               "downloads_per_layer=%.2f ops_per_layer=%.2f stream_copies=%.2f "
               "waits_per_layer=%.2f\n",
               pol->name, batch, ctx, L, steps, (double)c.downloads / n,
               (double)c.download_bytes / n, (double)c.uploads / n, (double)c.upload_bytes / n,
               (double)c.syncs / n, (double)c.host_args / n, (double)c.host_arg_bytes / n,
               (double)c.pageable / n, (double)c.ops / n, (double)c.downloads / n / L,
               (double)c.ops / n / L, (double)c.stream_copies / n, (double)c.syncs / n / L);
    } else {
        fprintf(stderr, "stepcount: %s: %s\n", tsr_strerror(st), tsr_last_error());
        rc = 1;
    }
    if (e) tsr_engine_destroy(e);
    return rc;
}
