/* Logits of one backend against another backend and against reference files, on one model:
 * the logits part of the device check (tests/device/run.sh) and, on the CPU, of CI
 * (test_logits_check: cpu-fenced against cpu and the bundled golden files).
 *
 *   tsr_logits_check MODEL [--backend B] [--against A] [--ref NAME=FILE.json]...
 *                    [--random N] [--greedy G] [--tol-rel X] [--label L] [--threads T]
 *
 * References are JSON files in the layout of tests/data/golden (tools/hf_reference.py) and
 * of tools/torch_reference.py: vocab_size and prompts [{ids, logits ([rows][vocab] flat),
 * optional rows (prompt positions of the logits rows; default every position), greedy,
 * optional step_margins (top-1 minus top-2 logit of each greedy step) or min_margin}]. The
 * prompts come from the first reference; without one, --random N ids (BOS, then
 * pseudo-random) and --greedy G steps (default 16).
 *
 * Per prompt, on each backend: the prompt's logits (one forward call with every row, in
 * chunks of 512 beyond that), then G greedy steps. Each pair (B vs A, B vs each reference, A
 * vs each reference) prints:
 *   max_abs   the largest |logit difference| over the compared rows and the whole vocab
 *   max_rel   max_abs / the largest |logit| of the second side (the scale of the logits)
 *   top1      rows whose argmax agrees / rows compared
 *   greedy    tokens of the free-running greedy continuation that agree before the first
 *             difference / G
 * The tolerance (docs/build.md, "The GPU device machine"): max_rel <= tol_rel, which is by
 * default 1e-4 for F32 weights (F32 math everywhere; only the summation order differs) and
 * 2e-2 for BF16/F16 weights (the CUDA GEMM rounds activations to BF16: the deviation of
 * transformers' own BF16 math from its F32 math on tests/data/synth_bf16_gqa is 1.2e-2).
 * A top-1 or greedy difference passes only where the second side's top-1 margin there is
 * at most 2 * tol_rel * max|logit| (a near tie that the tolerance allows to flip; for a
 * reference with only min_margin, that margin stands for every step).
 * Last line: "RESULT logits LABEL: PASS|FAIL (...)". Exit 0 pass, 1 fail, 2 usage or setup
 * error. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "base/alloc.h"
#include "base/sys.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"

#define TSR__MAX_REFS 4
#define TSR__MAX_PROMPTS 8
#define TSR__CHUNK 512

typedef struct tsr__ref_prompt {
    int32_t *ids;
    int n;
    int32_t *rows; /* positions of the stored logits rows */
    int n_rows;
    float *logits; /* [n_rows][vocab] */
    int32_t *greedy;
    int n_greedy;
    float *margins; /* [n_greedy], or NULL: min_margin for every step */
    float min_margin;
} tsr__ref_prompt;

typedef struct tsr__ref {
    const char *name;
    int vocab;
    int n_prompts;
    tsr__ref_prompt p[TSR__MAX_PROMPTS];
} tsr__ref;

/* One backend's run of one prompt. */
typedef struct tsr__run {
    float *logits;      /* [n][vocab] */
    int32_t *greedy;    /* [G] */
    float *step_logits; /* [G][vocab] */
} tsr__run;

/* One comparison's worst figures over the prompts. */
typedef struct tsr__pair {
    char name[48];
    double max_rel;
    int greedy_agree, greedy_total;
    bool fail;
} tsr__pair;

static char *tsr__read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? tsr_malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        tsr_free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int32_t *tsr__ints(const cJSON *a, int *n) {
    *n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    int32_t *v = tsr_malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    int i = 0;
    const cJSON *e;
    if (v && *n) cJSON_ArrayForEach(e, a) v[i++] = (int32_t)e->valuedouble;
    return v;
}

static float *tsr__floats(const cJSON *a, int *n) {
    *n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    float *v = tsr_malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    int i = 0;
    const cJSON *e;
    if (v && *n) cJSON_ArrayForEach(e, a) v[i++] = (float)e->valuedouble;
    return v;
}

static void tsr__ref_free(tsr__ref *r) {
    for (int i = 0; i < r->n_prompts; i++) {
        tsr__ref_prompt *p = &r->p[i];
        tsr_free(p->ids);
        tsr_free(p->rows);
        tsr_free(p->logits);
        tsr_free(p->greedy);
        tsr_free(p->margins);
    }
    r->n_prompts = 0;
}

/* Returns 0, or -1 with a line on stderr. */
static int tsr__ref_load(const char *name, const char *path, tsr__ref *r) {
    memset(r, 0, sizeof *r);
    r->name = name;
    char *text = tsr__read_text(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    tsr_free(text);
    const cJSON *vs = root ? cJSON_GetObjectItem(root, "vocab_size") : NULL;
    const cJSON *ps = root ? cJSON_GetObjectItem(root, "prompts") : NULL;
    if (!cJSON_IsNumber(vs) || !cJSON_IsArray(ps)) {
        fprintf(stderr, "logits_check: %s: not a reference file (vocab_size, prompts)\n", path);
        cJSON_Delete(root);
        return -1;
    }
    r->vocab = vs->valueint;
    const cJSON *pr;
    int bad = 0;
    cJSON_ArrayForEach(pr, ps) {
        if (r->n_prompts == TSR__MAX_PROMPTS) break;
        tsr__ref_prompt *p = &r->p[r->n_prompts++];
        int nl = 0, nm = 0;
        p->ids = tsr__ints(cJSON_GetObjectItem(pr, "ids"), &p->n);
        p->logits = tsr__floats(cJSON_GetObjectItem(pr, "logits"), &nl);
        p->greedy = tsr__ints(cJSON_GetObjectItem(pr, "greedy"), &p->n_greedy);
        const cJSON *rows = cJSON_GetObjectItem(pr, "rows");
        if (rows) {
            p->rows = tsr__ints(rows, &p->n_rows);
        } else {
            p->n_rows = p->n;
            p->rows = tsr_malloc((size_t)(p->n > 0 ? p->n : 1) * sizeof *p->rows);
            for (int i = 0; p->rows && i < p->n; i++) p->rows[i] = i;
        }
        const cJSON *sm = cJSON_GetObjectItem(pr, "step_margins");
        if (sm) {
            p->margins = tsr__floats(sm, &nm);
            if (nm != p->n_greedy) bad = 1;
        }
        const cJSON *mm = cJSON_GetObjectItem(pr, "min_margin");
        p->min_margin = cJSON_IsNumber(mm) ? (float)mm->valuedouble : 0.0f;
        if (!p->ids || !p->logits || !p->greedy || !p->rows || p->n < 1 ||
            (size_t)nl != (size_t)p->n_rows * (size_t)r->vocab)
            bad = 1;
        for (int i = 0; !bad && i < p->n_rows; i++)
            if (p->rows[i] < 0 || p->rows[i] >= p->n) bad = 1;
    }
    cJSON_Delete(root);
    if (bad || r->n_prompts == 0) {
        fprintf(stderr, "logits_check: %s: malformed prompt (ids, rows, logits, greedy, "
                        "step_margins sizes)\n", path);
        tsr__ref_free(r);
        return -1;
    }
    return 0;
}

static int32_t tsr__argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double tsr__margin(const float *x, int n) {
    int32_t b = tsr__argmax(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return (double)x[b] - second;
}

static double tsr__absmax(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)x[i]) <= m)) m = fabs((double)x[i]); /* NaN sticks */
    return m;
}

/* The prompt on one engine: all rows, then g greedy steps from a fresh sequence 0. */
static tsr_status tsr__run_prompt(tsr_engine *e, const int32_t *ids, int n, int g, float *buf,
                                  tsr__run *o) {
    size_t V = (size_t)e->model->cfg.vocab_size;
    tsr_kv_cache *kv = e->kv;
    kv->ops->seq_free(kv, 0);
    TSR_TRY(kv->ops->seq_add(kv, 0));
    for (int off = 0; off < n; off += TSR__CHUNK) {
        int len = n - off < TSR__CHUNK ? n - off : TSR__CHUNK, rows = 0;
        tsr_batch_seq s = {.seq = 0, .tokens = ids + off, .n_tokens = len, .want_logits = true,
                           .all_logits = true};
        TSR_TRY(tsr_forward_run(e->fwd, kv, &s, 1, buf, &rows));
        memcpy(o->logits + (size_t)off * V, buf, (size_t)len * V * sizeof(float));
    }
    const float *last = o->logits + (size_t)(n - 1) * V;
    for (int i = 0; i < g; i++) {
        memcpy(o->step_logits + (size_t)i * V, last, V * sizeof(float));
        o->greedy[i] = tsr__argmax(last, (int)V);
        if (i + 1 == g) break;
        tsr_batch_seq s = {.seq = 0, .tokens = &o->greedy[i], .n_tokens = 1,
                           .want_logits = true};
        int rows = 0;
        TSR_TRY(tsr_forward_run(e->fwd, kv, &s, 1, buf, &rows));
        last = buf;
    }
    kv->ops->seq_free(kv, 0);
    return TSR_OK;
}

/* x against y at rows[] (x rows are prompt positions, y rows are in rows' order when y_dense
 * is false, else prompt positions too). Greedy: x's tokens against y's; margins: y's top-1
 * margin per greedy step. Prints one line, updates pair. */
static void tsr__compare(tsr__pair *pr, const char *what, int vocab, const float *x,
                         const float *y, const int32_t *rows, int n_rows, bool y_dense,
                         const int32_t *gx, const int32_t *gy, int g, const float *y_margins,
                         double y_min_margin, double tol_rel) {
    size_t V = (size_t)vocab;
    double amax = 0, dmax = 0;
    int top1 = 0;
    bool fail = false;
    for (int r = 0; r < n_rows; r++) {
        const float *yr = y + (size_t)(y_dense ? rows[r] : r) * V;
        amax = fmax(amax, tsr__absmax(yr, V));
    }
    double tol_abs = tol_rel * amax;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)rows[r] * V, *yr = y + (size_t)(y_dense ? rows[r] : r) * V;
        for (size_t i = 0; i < V; i++) {
            double d = fabs((double)xr[i] - (double)yr[i]);
            if (!(d <= dmax)) dmax = d;
        }
        if (tsr__argmax(xr, vocab) == tsr__argmax(yr, vocab))
            top1++;
        else if (tsr__margin(yr, vocab) > 2 * tol_abs)
            fail = true;
    }
    double rel = amax > 0 ? dmax / amax : dmax;
    if (!(rel <= tol_rel)) fail = true;
    int agree = 0;
    while (agree < g && gx[agree] == gy[agree]) agree++;
    if (agree < g) {
        double m = y_margins ? (double)y_margins[agree] : y_min_margin;
        if (!(m <= 2 * tol_abs)) fail = true;
    }
    printf("  %-20s max_abs %.3e max_rel %.3e top1 %d/%d greedy %d/%d %s\n", what, dmax, rel,
           top1, n_rows, agree, g, fail ? "FAIL" : "ok");
    if (!(rel <= pr->max_rel)) pr->max_rel = rel;
    pr->greedy_agree += agree;
    pr->greedy_total += g;
    pr->fail |= fail;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s MODEL [--backend B] [--against A] [--ref NAME=FILE]... "
                        "[--random N] [--greedy G] [--tol-rel X] [--label L] [--threads T]\n",
                argv[0]);
        return 2;
    }
    const char *model = argv[1], *bname = "cuda", *aname = "cpu", *label = NULL;
    const char *ref_arg[TSR__MAX_REFS];
    int n_refs = 0, n_random = 0, greedy = 16, threads = tsr_sys_cpus();
    double tol_rel = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "logits_check: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--backend")) bname = v;
        else if (!strcmp(a, "--against")) aname = v;
        else if (!strcmp(a, "--label")) label = v;
        else if (!strcmp(a, "--random")) n_random = atoi(v);
        else if (!strcmp(a, "--greedy")) greedy = atoi(v);
        else if (!strcmp(a, "--tol-rel")) tol_rel = atof(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--ref") && n_refs < TSR__MAX_REFS && strchr(v, '='))
            ref_arg[n_refs++] = v;
        else {
            fprintf(stderr, "logits_check: bad option %s %s\n", a, v);
            return 2;
        }
    }
    if (!label) label = model;
    if ((n_refs == 0 && n_random <= 0) || greedy < 1 || threads < 1) {
        fprintf(stderr, "logits_check: give --ref NAME=FILE or --random N (and G, T >= 1)\n");
        return 2;
    }

    int rc = 2;
    tsr__ref refs[TSR__MAX_REFS];
    char names[TSR__MAX_REFS][32];
    int loaded = 0;
    tsr_engine *eb = NULL, *ea = NULL;
    float *buf = NULL;
    tsr__run rb = {0}, ra = {0};
    int32_t *rand_ids = NULL;
    for (; loaded < n_refs; loaded++) {
        const char *eq = strchr(ref_arg[loaded], '=');
        snprintf(names[loaded], sizeof names[loaded], "%.*s",
                 (int)(eq - ref_arg[loaded] < 31 ? eq - ref_arg[loaded] : 31), ref_arg[loaded]);
        if (tsr__ref_load(names[loaded], eq + 1, &refs[loaded]) != 0) goto done;
    }
    /* Both backends must come up before a model is built (an 8B shape takes seconds). */
    const char *names2[2] = {bname, aname};
    for (int i = 0; i < 2; i++) {
        tsr_backend *probe = NULL;
        tsr_status pst = tsr_backend_create(names2[i], 1, &probe);
        tsr_backend_destroy(probe);
        if (pst != TSR_OK) {
            fprintf(stderr, "logits_check: backend %s: %s\n", names2[i], tsr_last_error());
            goto done;
        }
    }
    /* The prompts: the first reference's, or one random one (its ids once the model's
     * vocabulary is known). */
    int n_prompts = n_refs ? refs[0].n_prompts : 1, max_n = 0, max_g = 0;
    for (int i = 0; i < n_prompts; i++) {
        int n = n_refs ? refs[0].p[i].n : n_random, g = n_refs ? refs[0].p[i].n_greedy : greedy;
        if (n > max_n) max_n = n;
        if (g > max_g) max_g = g;
    }
    if (max_g < 1) max_g = 1;
    int step = max_n < TSR__CHUNK ? max_n : TSR__CHUNK;
    /* One model for both engines: the first loads it, the second borrows it (and is
     * destroyed first). */
    tsr_model_config cfg;
    tsr_engine_spec eo = {.model_path = model, .config_out = &cfg, .threads = threads,
                          .max_tokens = step, .kv = {.max_seqs = 1},
                          .dense_kv_tokens = max_n + max_g + 16};
    eo.backend = bname;
    if (tsr_engine_create(&eo, &eb) != TSR_OK) {
        if (cfg.vocab_size == 0) /* the model did not load */
            fprintf(stderr, "logits_check: %s\n", tsr_last_error());
        else
            fprintf(stderr, "logits_check: backend %s: %s\n", bname, tsr_last_error());
        goto done;
    }
    const tsr_model_config *c = &eb->model->cfg;
    int V = c->vocab_size;
    for (int i = 0; i < n_refs; i++)
        if (refs[i].vocab != V) {
            fprintf(stderr, "logits_check: reference %s has vocab %d, the model %d\n",
                    refs[i].name, refs[i].vocab, V);
            goto done;
        }
    if (tol_rel <= 0) tol_rel = c->dtype == TSR_F32 ? 1e-4 : 2e-2;
    if (!n_refs) {
        rand_ids = tsr_malloc((size_t)n_random * sizeof *rand_ids);
        if (!rand_ids) goto done;
        uint32_t s = 7;
        rand_ids[0] = c->bos_id;
        for (int i = 1; i < n_random; i++) {
            s = s * 1664525u + 1013904223u;
            rand_ids[i] = (int32_t)(3 + (s >> 8) % (uint32_t)(V - 3));
        }
    }
    size_t Vs = (size_t)V;
    eo = (tsr_engine_spec){.model = eb->model, .borrow_model = true, .threads = threads,
                           .max_tokens = step, .kv = {.max_seqs = 1},
                           .dense_kv_tokens = max_n + max_g + 16};
    eo.backend = aname;
    if (tsr_engine_create(&eo, &ea) != TSR_OK) {
        fprintf(stderr, "logits_check: backend %s: %s\n", aname, tsr_last_error());
        goto done;
    }
    buf = tsr_malloc((size_t)step * Vs * sizeof *buf);
    rb.logits = tsr_malloc((size_t)max_n * Vs * sizeof(float));
    ra.logits = tsr_malloc((size_t)max_n * Vs * sizeof(float));
    rb.step_logits = tsr_malloc((size_t)max_g * Vs * sizeof(float));
    ra.step_logits = tsr_malloc((size_t)max_g * Vs * sizeof(float));
    rb.greedy = tsr_malloc((size_t)max_g * sizeof(int32_t));
    ra.greedy = tsr_malloc((size_t)max_g * sizeof(int32_t));
    if (!buf || !rb.logits || !ra.logits || !rb.step_logits || !ra.step_logits || !rb.greedy ||
        !ra.greedy)
        goto done;

    printf("== logits %s: %s (%s weights), %s (%s) against %s%s", label, model,
           tsr_dtype_name(c->dtype), bname, tsr_engine_device_name(eb), aname,
           n_refs ? " and" : "");
    for (int i = 0; i < n_refs; i++) printf(" %s", refs[i].name);
    printf("; tol max_rel %.0e\n", tol_rel);
    tsr__pair pairs[1 + 2 * TSR__MAX_REFS];
    int n_pairs = 1 + 2 * n_refs;
    memset(pairs, 0, sizeof pairs);
    snprintf(pairs[0].name, sizeof pairs[0].name, "%s-%s", bname, aname);
    for (int i = 0; i < n_refs; i++) {
        snprintf(pairs[1 + 2 * i].name, sizeof pairs[0].name, "%s-%s", bname, refs[i].name);
        snprintf(pairs[2 + 2 * i].name, sizeof pairs[0].name, "%s-%s", aname, refs[i].name);
    }
    int32_t *all_rows = tsr_malloc((size_t)max_n * sizeof *all_rows);
    if (!all_rows) goto done;
    for (int i = 0; i < max_n; i++) all_rows[i] = i;
    for (int pi = 0; pi < n_prompts; pi++) {
        const int32_t *ids = n_refs ? refs[0].p[pi].ids : rand_ids;
        int n = n_refs ? refs[0].p[pi].n : n_random;
        int g = n_refs ? refs[0].p[pi].n_greedy : greedy;
        if (tsr__run_prompt(eb, ids, n, g, buf, &rb) != TSR_OK ||
            tsr__run_prompt(ea, ids, n, g, buf, &ra) != TSR_OK) {
            fprintf(stderr, "logits_check: prompt %d: %s\n", pi, tsr_last_error());
            tsr_free(all_rows);
            goto done;
        }
        printf("prompt %d: %d ids, %d greedy steps\n", pi, n, g);
        /* backend vs against: every prompt row; greedy margins from against's steps */
        float *am = tsr_malloc((size_t)g * sizeof *am);
        for (int s = 0; am && s < g; s++)
            am[s] = (float)tsr__margin(ra.step_logits + (size_t)s * Vs, V);
        tsr__compare(&pairs[0], pairs[0].name, V, rb.logits, ra.logits, all_rows, n, true,
                     rb.greedy, ra.greedy, g, am, 0, tol_rel);
        tsr_free(am);
        for (int ri = 0; ri < n_refs; ri++) {
            const tsr__ref_prompt *rp = &refs[ri].p[pi];
            if (pi >= refs[ri].n_prompts || rp->n != n || rp->n_greedy != g ||
                memcmp(rp->ids, ids, (size_t)n * sizeof *ids) != 0) {
                printf("  %s: prompt %d differs from %s's: not compared\n", refs[ri].name, pi,
                       refs[0].name);
                pairs[1 + 2 * ri].fail = pairs[2 + 2 * ri].fail = true;
                continue;
            }
            tsr__compare(&pairs[1 + 2 * ri], pairs[1 + 2 * ri].name, V, rb.logits, rp->logits,
                         rp->rows, rp->n_rows, false, rb.greedy, rp->greedy, g, rp->margins,
                         rp->min_margin, tol_rel);
            tsr__compare(&pairs[2 + 2 * ri], pairs[2 + 2 * ri].name, V, ra.logits, rp->logits,
                         rp->rows, rp->n_rows, false, ra.greedy, rp->greedy, g, rp->margins,
                         rp->min_margin, tol_rel);
        }
        fflush(stdout);
    }
    tsr_free(all_rows);
    bool fail = false;
    for (int i = 0; i < n_pairs; i++) fail |= pairs[i].fail;
    printf("RESULT logits %s: %s (max_rel", label, fail ? "FAIL" : "PASS");
    for (int i = 0; i < n_pairs; i++) printf(" %s %.1e", pairs[i].name, pairs[i].max_rel);
    printf("; greedy");
    for (int i = 0; i < n_pairs; i++)
        printf(" %s %d/%d", pairs[i].name, pairs[i].greedy_agree, pairs[i].greedy_total);
    printf("; tol %.0e)\n", tol_rel);
    rc = fail ? 1 : 0;

done:
    tsr_free(buf);
    tsr_free(rb.logits);
    tsr_free(ra.logits);
    tsr_free(rb.step_logits);
    tsr_free(ra.step_logits);
    tsr_free(rb.greedy);
    tsr_free(ra.greedy);
    tsr_free(rand_ids);
    if (ea) tsr_engine_destroy(ea); /* borrows eb's model */
    if (eb) tsr_engine_destroy(eb);
    for (int i = 0; i < loaded; i++) tsr__ref_free(&refs[i]);
    return rc;
}
