/* HDF5 checkpoints (see checkpoint.h). Layout (docs/jobs.md):
 *   /                      attributes: the tsr_ckpt_meta fields, n_requests
 *   /requests/NNNNNN       one group per request in scheduler order (running first):
 *                          attributes (ids, counters, sampler), datasets tokens, text
 *   /requests/NNNNNN/kv    running requests: attribute len, dataset tokens, and groups
 *                          layerL with attributes slots, dense and datasets k, v, pos,
 *                          score (with scores) */
#include "jobs/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"

void tsr_ckpt_rank_path(const char *path, int rank, int world, char *buf, size_t cap) {
    if (world <= 1) {
        snprintf(buf, cap, "%s", path);
        return;
    }
    size_t n = strlen(path);
    int stem = n > 3 && !strcmp(path + n - 3, ".h5") ? (int)(n - 3) : (int)n;
    snprintf(buf, cap, "%.*s.rank%d.h5", stem, path, rank);
}

tsr_kv_cache *tsr_ckpt_kv_mech(tsr_kv_cache *kv) {
    return kv && kv->ops->export_seq && kv->ops->import_seq ? kv : NULL;
}

void tsr_ckpt_free(tsr_ckpt *c) {
    if (c->reqs)
        for (int i = 0; i < c->n_reqs; i++) {
            tsr_ckpt_req *r = &c->reqs[i];
            tsr_free((void *)r->s.tokens);
            tsr_free(r->custom_id);
            for (int j = 0; j < r->n_stops; j++) tsr_free(r->stops[j]);
            tsr_free(r->text);
            tsr_kv_seq_state_free(&r->kv);
        }
    tsr_free(c->reqs);
    memset(c, 0, sizeof *c);
}

/* The fields of tsr_ckpt_meta that a checkpoint stores and a resumed job must match, in
 * file order after format_version: I(int field), S(string field). One list serves the
 * writer, the reader and the check, so they cannot drift apart. */
#define TSR__CKPT_FIELDS(I, S)                                                          \
    S(model) I(dim) I(n_layers) I(n_heads) I(n_kv_heads) I(vocab_size) S(dtype) S(policy)  \
    I(block_size) I(tp) I(pp) I(rank) I(world) I(max_batch_seqs) I(max_context)          \
    I(kv_layers) I(kv_dim) S(output)

#define TSR__CK_I(f)                                                                    \
    if (saved->f != job->f)                                                             \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint %s is %lld, this job has %lld", \
                             path, #f, (long long)saved->f, (long long)job->f);
#define TSR__CK_S(f)                                                                    \
    if (strcmp(saved->f, job->f))                                                       \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint %s is \"%s\", this job has \"%s\"", \
                             path, #f, saved->f, job->f);

tsr_status tsr_ckpt_check(const char *path, const tsr_ckpt_meta *saved,
                          const tsr_ckpt_meta *job) {
    TSR__CK_I(format_version)
    TSR__CKPT_FIELDS(TSR__CK_I, TSR__CK_S)
    if (saved->output_records != job->output_records)
        return tsr_error_set(TSR_ERR_INVALID,
                             "%s: checkpoint was written when %s held %lld records, it holds "
                             "%lld now (edited or lost output?); remove the checkpoint to "
                             "resume by records", path, job->output,
                             (long long)saved->output_records, (long long)job->output_records);
    return TSR_OK;
}

#ifndef TSR_HAVE_HDF5

#define TSR__NO_HDF5 "this build has no HDF5 (configure with -DTESSERA_HDF5=ON)"

bool tsr_ckpt_available(void) { return false; }

tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c) {
    (void)c;
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: " TSR__NO_HDF5, path);
}

tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out) {
    memset(out, 0, sizeof *out);
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: " TSR__NO_HDF5, path);
}

#else

#include <hdf5.h>

bool tsr_ckpt_available(void) { return true; }

/* One file being written or read; the first failure is kept, later calls do nothing. */
typedef struct tsr__h5 {
    const char *path;
    tsr_status st;
} tsr__h5;

static bool tsr__ok(tsr__h5 *h) { return h->st == TSR_OK; }

static void tsr__fail(tsr__h5 *h, const char *what, const char *name) {
    if (h->st == TSR_OK)
        h->st = tsr_error_set(TSR_ERR_HDF5, "%s: cannot %s %s (truncated or corrupt checkpoint?)",
                              h->path, what, name);
}

/* --- writing ------------------------------------------------------------------------- */

static void tsr__wattr(tsr__h5 *h, hid_t obj, const char *name, hid_t type, const void *v) {
    if (!tsr__ok(h)) return;
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp >= 0 ? H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (a < 0 || H5Awrite(a, type, v) < 0) tsr__fail(h, "write attribute", name);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
}

static void tsr__wi64(tsr__h5 *h, hid_t obj, const char *name, int64_t v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_INT64, &v);
}
static void tsr__wu64(tsr__h5 *h, hid_t obj, const char *name, uint64_t v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_UINT64, &v);
}
static void tsr__wf32(tsr__h5 *h, hid_t obj, const char *name, float v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_FLOAT, &v);
}

static void tsr__wstr(tsr__h5 *h, hid_t obj, const char *name, const char *s) {
    if (!tsr__ok(h)) return;
    size_t n = strlen(s);
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, n ? n : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0) {
        tsr__fail(h, "write attribute", name);
    } else if (n) {
        tsr__wattr(h, obj, name, t, s);
    } else {
        char z = 0;
        tsr__wattr(h, obj, name, t, &z);
    }
    if (t >= 0) H5Tclose(t);
}

/* A 1-D or 2-D dataset (cols 0: 1-D). */
static void tsr__wdata(tsr__h5 *h, hid_t obj, const char *name, hid_t type, const void *data,
                       hsize_t rows, hsize_t cols) {
    if (!tsr__ok(h)) return;
    hsize_t dims[2] = {rows, cols};
    hid_t sp = H5Screate_simple(cols ? 2 : 1, dims, NULL);
    hid_t d = sp >= 0 ? H5Dcreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)
                      : -1;
    if (d < 0 || (rows > 0 && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        tsr__fail(h, "write dataset", name);
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
}

static hid_t tsr__wgroup(tsr__h5 *h, hid_t parent, const char *name) {
    if (!tsr__ok(h)) return -1;
    hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) tsr__fail(h, "create group", name);
    return g;
}

static void tsr__wmeta(tsr__h5 *h, hid_t f, const tsr_ckpt_meta *m, int n_reqs) {
    tsr__wi64(h, f, "format_version", m->format_version);
#define TSR__W_I(x) tsr__wi64(h, f, #x, m->x);
#define TSR__W_S(x) tsr__wstr(h, f, #x, m->x);
    TSR__CKPT_FIELDS(TSR__W_I, TSR__W_S)
#undef TSR__W_I
#undef TSR__W_S
    tsr__wi64(h, f, "output_records", m->output_records);
    tsr__wi64(h, f, "n_requests", n_reqs);
}

static void tsr__wkv(tsr__h5 *h, hid_t rg, const tsr_kv_seq_state *kv) {
    hid_t g = tsr__wgroup(h, rg, "kv");
    if (g < 0) return;
    tsr__wi64(h, g, "len", kv->len);
    tsr__wi64(h, g, "has_scores", kv->has_scores);
    tsr__wdata(h, g, "tokens", H5T_NATIVE_INT32, kv->tokens, (hsize_t)kv->len, 0);
    for (int l = 0; l < kv->n_layers && tsr__ok(h); l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        hid_t lg = tsr__wgroup(h, g, name);
        if (lg < 0) break;
        const tsr_kv_seq_layer *L = &kv->layers[l];
        tsr__wi64(h, lg, "slots", L->slots);
        tsr__wi64(h, lg, "dense", L->dense);
        tsr__wdata(h, lg, "k", H5T_NATIVE_FLOAT, L->k, (hsize_t)L->slots, (hsize_t)kv->kv_dim);
        tsr__wdata(h, lg, "v", H5T_NATIVE_FLOAT, L->v, (hsize_t)L->slots, (hsize_t)kv->kv_dim);
        tsr__wdata(h, lg, "pos", H5T_NATIVE_INT32, L->pos, (hsize_t)L->slots, 0);
        if (kv->has_scores)
            tsr__wdata(h, lg, "score", H5T_NATIVE_FLOAT, L->score, (hsize_t)L->slots, 0);
        H5Gclose(lg);
    }
    H5Gclose(g);
}

static void tsr__wreq(tsr__h5 *h, hid_t reqs, int i, const tsr_ckpt_req *r) {
    char name[32];
    snprintf(name, sizeof name, "%06d", i);
    hid_t g = tsr__wgroup(h, reqs, name);
    if (g < 0) return;
    const tsr_sched_saved *s = &r->s;
    if (r->custom_id) tsr__wstr(h, g, "custom_id", r->custom_id);
    tsr__wi64(h, g, "line", r->line);
    tsr__wi64(h, g, "kind", r->kind);
    tsr__wu64(h, g, "tag", s->tag);
    tsr__wi64(h, g, "n_prompt", s->n_prompt);
    tsr__wi64(h, g, "n_computed", s->n_computed);
    tsr__wi64(h, g, "n_generated", s->n_generated);
    tsr__wi64(h, g, "max_new_tokens", s->max_new_tokens);
    tsr__wf32(h, g, "temperature", s->sampling.temperature);
    tsr__wf32(h, g, "top_p", s->sampling.top_p);
    tsr__wi64(h, g, "top_k", s->sampling.top_k);
    tsr__wu64(h, g, "seed", s->sampling.seed);
    tsr__wu64(h, g, "rng", s->rng);
    tsr__wi64(h, g, "sampler_ready", s->sampler_ready);
    tsr__wi64(h, g, "slot", s->slot);
    tsr__wi64(h, g, "job_prev", r->prev);
    tsr__wi64(h, g, "job_n_prompt", r->n_prompt);
    tsr__wi64(h, g, "job_n_gen", r->n_gen);
    tsr__wi64(h, g, "n_stops", r->n_stops);
    for (int j = 0; j < r->n_stops; j++) {
        char sn[16];
        snprintf(sn, sizeof sn, "stop%d", j);
        tsr__wstr(h, g, sn, r->stops[j]);
    }
    tsr__wdata(h, g, "tokens", H5T_NATIVE_INT32, s->tokens, (hsize_t)s->n_tokens, 0);
    tsr__wdata(h, g, "text", H5T_NATIVE_UCHAR, r->text, (hsize_t)r->len, 0);
    if (r->has_kv) tsr__wkv(h, g, &r->kv);
    H5Gclose(g);
}

tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tsr__h5 h = {.path = tmp, .st = TSR_OK};
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return tsr_error_set(TSR_ERR_HDF5, "%s: cannot create the checkpoint", tmp);
    tsr__wmeta(&h, f, &c->meta, c->n_reqs);
    hid_t reqs = tsr__wgroup(&h, f, "requests");
    for (int i = 0; i < c->n_reqs && tsr__ok(&h); i++) tsr__wreq(&h, reqs, i, &c->reqs[i]);
    if (reqs >= 0) H5Gclose(reqs);
    if (tsr__ok(&h) && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) tsr__fail(&h, "flush", "the file");
    if (H5Fclose(f) < 0) tsr__fail(&h, "close", "the file");
    if (h.st == TSR_OK) {
        FILE *fp = fopen(tmp, "rb+");
        if (fp) { /* on disk before the rename makes it the checkpoint */
            fflush(fp);
            (void)fsync(fileno(fp));
            fclose(fp);
        }
        if (rename(tmp, path) != 0)
            h.st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp,
                                 strerror(errno));
    }
    if (h.st != TSR_OK) remove(tmp);
    return h.st;
}

/* --- reading ------------------------------------------------------------------------- */

static bool tsr__has(hid_t obj, const char *name) { return H5Aexists(obj, name) > 0; }

static void tsr__rattr(tsr__h5 *h, hid_t obj, const char *name, hid_t type, void *v) {
    if (!tsr__ok(h)) return;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0 || H5Aread(a, type, v) < 0) tsr__fail(h, "read attribute", name);
    if (a >= 0) H5Aclose(a);
}

static int64_t tsr__ri64(tsr__h5 *h, hid_t obj, const char *name) {
    int64_t v = 0;
    tsr__rattr(h, obj, name, H5T_NATIVE_INT64, &v);
    return v;
}
static uint64_t tsr__ru64(tsr__h5 *h, hid_t obj, const char *name) {
    uint64_t v = 0;
    tsr__rattr(h, obj, name, H5T_NATIVE_UINT64, &v);
    return v;
}
static float tsr__rf32(tsr__h5 *h, hid_t obj, const char *name) {
    float v = 0;
    tsr__rattr(h, obj, name, H5T_NATIVE_FLOAT, &v);
    return v;
}

/* An int attribute that must lie in [lo, hi]. */
static int tsr__rint(tsr__h5 *h, hid_t obj, const char *name, int64_t lo, int64_t hi) {
    int64_t v = tsr__ri64(h, obj, name);
    if (tsr__ok(h) && (v < lo || v > hi)) {
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: attribute %s = %lld is out of range", h->path,
                              name, (long long)v);
        return 0;
    }
    return (int)v;
}

/* A string attribute: allocated (tsr_free), "" on failure paths. */
static char *tsr__rstr(tsr__h5 *h, hid_t obj, const char *name) {
    if (!tsr__ok(h)) return NULL;
    char *out = NULL;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t ft = a >= 0 ? H5Aget_type(a) : -1;
    size_t n = ft >= 0 && H5Tget_class(ft) == H5T_STRING && !H5Tis_variable_str(ft)
                   ? H5Tget_size(ft) : 0;
    hid_t mt = n ? H5Tcopy(H5T_C_S1) : -1;
    if (mt >= 0 && H5Tset_size(mt, n) >= 0 && H5Tset_strpad(mt, H5T_STR_NULLPAD) >= 0 &&
        (out = tsr_calloc(n + 1, 1)) != NULL) {
        if (H5Aread(a, mt, out) < 0) {
            tsr_free(out);
            out = NULL;
        }
    }
    if (!out) tsr__fail(h, "read attribute", name);
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    return out;
}

static void tsr__rstr_into(tsr__h5 *h, hid_t obj, const char *name, char *buf, size_t cap) {
    char *s = tsr__rstr(h, obj, name);
    if (s) snprintf(buf, cap, "%s", s);
    tsr_free(s);
}

/* A dataset of `want` rows x cols (cols 0: 1-D) read into data (want * max(cols,1));
 * data NULL: only its shape is checked. */
static void tsr__rdata(tsr__h5 *h, hid_t obj, const char *name, hid_t type, void *data,
                       hsize_t want, hsize_t cols) {
    if (!tsr__ok(h)) return;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t dims[2] = {0, 0};
    if (nd == (cols ? 2 : 1) && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0 &&
        dims[0] == want && (!cols || dims[1] == cols)) {
        if (want > 0 && data && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
            tsr__fail(h, "read dataset", name);
    } else if (tsr__ok(h)) {
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: dataset %s is missing or has the wrong shape",
                              h->path, name);
    }
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
}

/* Rows of a 1-D dataset (-1 on failure). */
static int64_t tsr__rlen(tsr__h5 *h, hid_t obj, const char *name) {
    if (!tsr__ok(h)) return -1;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t dims[1] = {0};
    int64_t n = -1;
    if (sp >= 0 && H5Sget_simple_extent_ndims(sp) == 1 &&
        H5Sget_simple_extent_dims(sp, dims, NULL) >= 0)
        n = (int64_t)dims[0];
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    if (n < 0) tsr__fail(h, "read dataset", name);
    return n;
}

static hid_t tsr__rgroup(tsr__h5 *h, hid_t parent, const char *name) {
    if (!tsr__ok(h)) return -1;
    hid_t g = H5Gopen2(parent, name, H5P_DEFAULT);
    if (g < 0) tsr__fail(h, "open group", name);
    return g;
}

static void tsr__rmeta(tsr__h5 *h, hid_t f, tsr_ckpt_meta *m) {
    const int64_t big = 1 << 30;
    m->format_version = tsr__rint(h, f, "format_version", 0, big);
    if (tsr__ok(h) && m->format_version != TSR_CKPT_VERSION) {
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: checkpoint format %d, this tessera reads %d",
                              h->path, m->format_version, TSR_CKPT_VERSION);
        return;
    }
#define TSR__R_I(x) m->x = tsr__rint(h, f, #x, 0, big);
#define TSR__R_S(x) tsr__rstr_into(h, f, #x, m->x, sizeof m->x);
    TSR__CKPT_FIELDS(TSR__R_I, TSR__R_S)
#undef TSR__R_I
#undef TSR__R_S
    m->output_records = tsr__ri64(h, f, "output_records");
}

static void tsr__rkv(tsr__h5 *h, hid_t rg, const tsr_ckpt_meta *m, tsr_kv_seq_state *kv) {
    hid_t g = tsr__rgroup(h, rg, "kv");
    if (g < 0) return;
    kv->len = tsr__rint(h, g, "len", 0, m->max_context);
    kv->has_scores = tsr__rint(h, g, "has_scores", 0, 1);
    kv->n_layers = m->kv_layers;
    kv->kv_dim = m->kv_dim;
    /* Counts read from attributes are checked against what the file holds before anything
     * is allocated from them: a corrupt count is refused, never a huge allocation. */
    tsr__rdata(h, g, "tokens", H5T_NATIVE_INT32, NULL, (hsize_t)kv->len, 0);
    char last[32];
    snprintf(last, sizeof last, "layer%d", kv->n_layers - 1);
    if (tsr__ok(h) && kv->n_layers > 0 && H5Lexists(g, last, H5P_DEFAULT) <= 0)
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: a request's KV has no group %s", h->path,
                              last);
    if (tsr__ok(h) && tsr_kv_seq_state_alloc_layers(kv) != TSR_OK) h->st = TSR_ERR_NOMEM;
    tsr__rdata(h, g, "tokens", H5T_NATIVE_INT32, kv->tokens, (hsize_t)kv->len, 0);
    for (int l = 0; l < kv->n_layers && tsr__ok(h); l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        hid_t lg = tsr__rgroup(h, g, name);
        if (lg < 0) break;
        kv->layers[l].slots = tsr__rint(h, lg, "slots", 0, kv->len);
        kv->layers[l].dense = tsr__rint(h, lg, "dense", 0, 1);
        tsr__rdata(h, lg, "k", H5T_NATIVE_FLOAT, NULL, (hsize_t)kv->layers[l].slots,
                   (hsize_t)kv->kv_dim);
        H5Gclose(lg);
    }
    if (tsr__ok(h) && tsr_kv_seq_state_alloc_rows(kv) != TSR_OK) h->st = TSR_ERR_NOMEM;
    for (int l = 0; l < kv->n_layers && tsr__ok(h); l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        hid_t lg = tsr__rgroup(h, g, name);
        if (lg < 0) break;
        tsr_kv_seq_layer *L = &kv->layers[l];
        hsize_t n = (hsize_t)L->slots, kd = (hsize_t)kv->kv_dim;
        tsr__rdata(h, lg, "k", H5T_NATIVE_FLOAT, L->k, n, kd);
        tsr__rdata(h, lg, "v", H5T_NATIVE_FLOAT, L->v, n, kd);
        tsr__rdata(h, lg, "pos", H5T_NATIVE_INT32, L->pos, n, 0);
        if (kv->has_scores) tsr__rdata(h, lg, "score", H5T_NATIVE_FLOAT, L->score, n, 0);
        H5Gclose(lg);
    }
    H5Gclose(g);
}

static void tsr__rreq(tsr__h5 *h, hid_t reqs, int i, const tsr_ckpt_meta *m,
                      tsr_ckpt_req *r) {
    char name[32];
    snprintf(name, sizeof name, "%06d", i);
    hid_t g = tsr__rgroup(h, reqs, name);
    if (g < 0) return;
    tsr_sched_saved *s = &r->s;
    if (tsr__has(g, "custom_id")) r->custom_id = tsr__rstr(h, g, "custom_id");
    r->line = tsr__ri64(h, g, "line");
    r->kind = tsr__rint(h, g, "kind", 0, 16);
    s->tag = tsr__ru64(h, g, "tag");
    s->n_prompt = tsr__rint(h, g, "n_prompt", 1, m->max_context);
    s->n_computed = tsr__rint(h, g, "n_computed", 0, m->max_context);
    s->n_generated = tsr__rint(h, g, "n_generated", 0, m->max_context);
    s->max_new_tokens = tsr__rint(h, g, "max_new_tokens", 0, INT32_MAX);
    s->sampling.temperature = tsr__rf32(h, g, "temperature");
    s->sampling.top_p = tsr__rf32(h, g, "top_p");
    s->sampling.top_k = tsr__rint(h, g, "top_k", 0, INT32_MAX);
    s->sampling.seed = tsr__ru64(h, g, "seed");
    s->rng = tsr__ru64(h, g, "rng");
    s->sampler_ready = tsr__rint(h, g, "sampler_ready", 0, 1);
    s->slot = tsr__rint(h, g, "slot", -1, m->max_batch_seqs - 1);
    r->prev = tsr__rint(h, g, "job_prev", -1, INT32_MAX);
    r->n_prompt = tsr__rint(h, g, "job_n_prompt", 0, m->max_context);
    r->n_gen = tsr__rint(h, g, "job_n_gen", 0, m->max_context);
    int n_stops = tsr__rint(h, g, "n_stops", 0, TSR_BATCH_MAX_STOPS);
    for (int j = 0; j < n_stops && tsr__ok(h); j++) {
        char sn[16];
        snprintf(sn, sizeof sn, "stop%d", j);
        r->stops[j] = tsr__rstr(h, g, sn);
        if (r->stops[j]) r->n_stops = j + 1;
    }
    int64_t nt = tsr__rlen(h, g, "tokens");
    if (tsr__ok(h) && (nt < 1 || nt > (int64_t)m->max_context + 1))
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: request %d has %lld tokens", h->path, i,
                              (long long)nt);
    if (tsr__ok(h)) {
        int32_t *t = tsr_malloc((size_t)nt * sizeof *t);
        if (!t) h->st = TSR_ERR_NOMEM;
        s->tokens = t;
        s->n_tokens = (int32_t)nt;
        tsr__rdata(h, g, "tokens", H5T_NATIVE_INT32, t, (hsize_t)nt, 0);
    }
    int64_t nx = tsr__rlen(h, g, "text");
    if (tsr__ok(h)) {
        r->text = tsr_malloc((size_t)nx + 1);
        if (!r->text) h->st = TSR_ERR_NOMEM;
        r->len = (size_t)(nx > 0 ? nx : 0);
        tsr__rdata(h, g, "text", H5T_NATIVE_UCHAR, r->text, (hsize_t)nx, 0);
        if (r->text) r->text[r->len] = '\0';
    }
    r->has_kv = s->slot >= 0;
    if (r->has_kv) tsr__rkv(h, g, m, &r->kv);
    H5Gclose(g);
}

tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out) {
    memset(out, 0, sizeof *out);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    tsr__h5 h = {.path = path, .st = TSR_OK};
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return tsr_error_set(TSR_ERR_HDF5, "%s: not a readable HDF5 checkpoint (truncated or "
                             "corrupt?)", path);
    tsr__rmeta(&h, f, &out->meta);
    int n = tsr__rint(&h, f, "n_requests", 0, 2 * (int64_t)out->meta.max_batch_seqs + 1);
    hid_t reqs = tsr__rgroup(&h, f, "requests");
    H5G_info_t gi; /* n is checked against the groups there before it sizes an allocation */
    if (tsr__ok(&h) && n > 0 && (H5Gget_info(reqs, &gi) < 0 || gi.nlinks < (hsize_t)n))
        h.st = tsr_error_set(TSR_ERR_FORMAT, "%s: n_requests is %d, the file holds fewer",
                             path, n);
    if (tsr__ok(&h) && n > 0) {
        out->reqs = tsr_calloc((size_t)n, sizeof *out->reqs);
        if (!out->reqs) h.st = TSR_ERR_NOMEM;
        else out->n_reqs = n;
    }
    for (int i = 0; i < out->n_reqs && tsr__ok(&h); i++)
        tsr__rreq(&h, reqs, i, &out->meta, &out->reqs[i]);
    if (reqs >= 0) H5Gclose(reqs);
    H5Fclose(f);
    if (h.st != TSR_OK) tsr_ckpt_free(out);
    return h.st;
}

#endif
