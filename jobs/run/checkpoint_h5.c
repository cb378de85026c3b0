/* libtessera-hdf5.so: the HDF5 reader and writer of checkpoints (jobs/run/checkpoint.h),
 * a run-time module that jobs/run/checkpoint.c loads on the first checkpoint, so that a
 * run without one maps neither HDF5 nor its dependencies (curl, gnutls, krb5, ldap...).
 * Its calls into the runtime (tsr_error_set, tsr_ckpt_hash, tsr_comm_agree...) resolve
 * against the executable that loads it, as the CUDA module's do.
 *
 * Layout (docs/jobs.md), HDF5 1.10 file format,
 * contiguous datasets (each rank writes its hyperslab of the KV pools in place):
 *   /                      attributes: the tsr_ckpt_meta fields, n_requests, checksum (the
 *                          sum of the hashes of everything else)
 *   /requests/NNNNNN       one group per request in scheduler order (running first):
 *                          attributes (ids, counters, sampler), datasets tokens, text;
 *                          running ones also attributes kv_seq, kv_len, dataset kv_tokens
 *   /kv                    attributes n_seqs, has_scores, n_kv_heads, head_dim; datasets
 *                          slots, dense, offset [n_seqs x n_layers]: the rows of running
 *                          request j in layer l are rows offset..offset+slots of layer l
 *   /kv/layerL             datasets k, v [rows x n_kv_heads x head_dim] (f32), pos [rows]
 *                          (i32), score [rows] (f32, with has_scores)
 * Checksum: every attribute and small dataset is hashed once (rank 0's reads), each KV row
 * of each KV head once (the rank that owns it), pos and score of a layer once (its
 * owner); the ranks' sums add up to the stored one whatever the layout. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "jobs/run/checkpoint.h"
#include "jobs/run/checkpoint_module.h"

#include <hdf5.h>

#if defined(TSR_HAVE_MPI) && defined(H5_HAVE_PARALLEL)
#include <mpi.h>
#define TSR__PARALLEL 1
#endif

/* The fields of tsr_ckpt_meta that a checkpoint stores, in file order after
 * format_version: I(int field), U(uint64 field), S(string field). One list serves the writer
 * and the reader, so they cannot drift apart; tsr_ckpt_check (checkpoint.c) names each in
 * its own words. */
#define TSR__CKPT_FIELDS(I, U, S)                                                        \
    S(model) I(dim) I(n_layers) I(n_heads) I(n_kv_heads) I(vocab_size) S(dtype)          \
    U(model_config) U(model_tensors) U(model_weights) S(tokenizer) U(tokenizer_id)       \
    S(policy) S(policy_options) I(block_size) I(tp) I(pp) I(rank) I(world)               \
    I(max_batch_seqs) I(max_context) I(no_bos) U(seed) I(kv_layers) I(kv_dim) S(output)

/* One file being written or read; the first failure is kept, later calls do nothing.
 * sum: the sum of the hashes of the items this rank counts (each hashed with its object's
 * path and its name, so the sum does not depend on the order of the reads and a missing
 * or extra item changes it too). count: this rank counts the items every rank writes or
 * reads alike (attributes, requests, the index): rank 0. */
typedef struct tsr__h5 {
    const char *path;
    tsr_status st;
    uint64_t sum;
    bool count;
    hid_t dx_coll; /* collective transfer (H5P_DEFAULT in one process) */
    /* A multi-rank write: the metadata calls (collective in parallel HDF5) and the
     * collective writes go on after a local failure, so that the ranks' sequences of calls
     * stay the same and nobody waits for a rank that stopped; data is no longer written. */
    bool force;
} tsr__h5;

static bool tsr__ok(tsr__h5 *h) { return h->st == TSR_OK; }
/* Whether a (collective) metadata call is to be made. */
static bool tsr__go(tsr__h5 *h) { return h->st == TSR_OK || h->force; }

static void tsr__fail(tsr__h5 *h, const char *what, const char *name) {
    if (h->st == TSR_OK)
        h->st = tsr_error_set(TSR_ERR_HDF5, "%s: cannot %s %s (truncated or corrupt checkpoint?)",
                              h->path, what, name);
}

static tsr_status tsr__corrupt(tsr__h5 *h, const char *what) {
    if (h->st == TSR_OK)
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: %s (corrupt checkpoint?)", h->path, what);
    return h->st;
}

static void tsr__sum(tsr__h5 *h, hid_t obj, const char *name, const void *v, size_t n) {
    if (!h->count) return;
    char at[512] = "";
    if (H5Iget_name(obj, at, sizeof at) < 0) at[0] = '\0';
    uint64_t x = tsr_ckpt_hash(0x636b7074ull, at, strlen(at));
    x = tsr_ckpt_hash(x, name, strlen(name));
    h->sum += tsr_ckpt_hash(x, v, n);
}

/* One KV row of one head (kind 0: K, 1: V) of layer l at pool row r. */
static uint64_t tsr__row_hash(int kind, int l, int head, int64_t r, const float *x, int hd) {
    int64_t key[4] = {kind, l, head, r};
    return tsr_ckpt_hash(tsr_ckpt_hash(0x6b76726f77ull, key, sizeof key), x,
                         (size_t)hd * sizeof *x);
}

/* The ranks of the job: agree on a status, sum the checksums (one process: as is). */
static tsr_status tsr__agree(const tsr_ckpt_part *p, tsr_status st) {
    return p && p->comm && tsr_comm_world_size(p->comm) > 1 ? tsr_comm_agree(p->comm, st) : st;
}

static tsr_status tsr__allsum(const tsr_ckpt_part *p, uint64_t *sum) {
    if (!p || !p->comm || tsr_comm_world_size(p->comm) < 2) return TSR_OK;
    int64_t v = (int64_t)*sum;
    TSR_TRY(tsr_comm_allreduce_i64(p->comm, TSR_COMM_WORLD, &v, 1, TSR_COMM_SUM));
    *sum = (uint64_t)v;
    return TSR_OK;
}

/* File access: MPI-IO over the job's ranks when it has several, else the default driver;
 * the 1.10 file format (checksummed superblock, object headers, heaps), so damaged
 * metadata fails in HDF5's reader instead of being parsed. */
static hid_t tsr__fapl(const tsr_ckpt_part *p) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return -1;
    if (H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_LATEST) < 0) {
        H5Pclose(fapl);
        return -1;
    }
#ifdef TSR__PARALLEL
    const void *mc = p && p->comm ? tsr_comm_mpi_handle(p->comm, TSR_COMM_WORLD) : NULL;
    if (mc && H5Pset_fapl_mpio(fapl, *(const MPI_Comm *)mc, MPI_INFO_NULL) < 0) {
        H5Pclose(fapl);
        return -1;
    }
#else
    (void)p;
#endif
    return fapl;
}

static hid_t tsr__dxpl_coll(const tsr_ckpt_part *p) {
#ifdef TSR__PARALLEL
    if (p && p->comm && tsr_comm_mpi_handle(p->comm, TSR_COMM_WORLD)) {
        hid_t x = H5Pcreate(H5P_DATASET_XFER);
        if (x >= 0 && H5Pset_dxpl_mpio(x, H5FD_MPIO_COLLECTIVE) >= 0) return x;
        if (x >= 0) H5Pclose(x);
        return -1;
    }
#else
    (void)p;
#endif
    return H5P_DEFAULT;
}

static bool tsr__multi(const tsr_ckpt_part *p) {
    return p && p->comm && tsr_comm_world_size(p->comm) > 1;
}

/* A multi-rank job needs HDF5 built for MPI-IO (hdf5-openmpi), whose driver the ranks share
 * one file through; serial HDF5 would have every rank write the file on its own. */
static tsr_status tsr__need_parallel(const char *path, const tsr_ckpt_part *p) {
#ifdef TSR__PARALLEL
    if (!tsr__multi(p) || tsr_comm_mpi_handle(p->comm, TSR_COMM_WORLD)) return TSR_OK;
#else
    if (!tsr__multi(p)) return TSR_OK;
#endif
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: a checkpoint of a multi-rank job needs HDF5 "
                         "built for MPI (parallel HDF5: Debian's libhdf5-openmpi-dev)", path);
}

/* --- writing ------------------------------------------------------------------------- */

static void tsr__wattr(tsr__h5 *h, hid_t obj, const char *name, hid_t type, const void *v) {
    if (!tsr__go(h) || obj < 0) return;
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp >= 0 ? H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (a < 0 || H5Awrite(a, type, v) < 0) tsr__fail(h, "write attribute", name);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
}

static void tsr__wi64(tsr__h5 *h, hid_t obj, const char *name, int64_t v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_INT64, &v);
    tsr__sum(h, obj, name, &v, sizeof v);
}
static void tsr__wu64(tsr__h5 *h, hid_t obj, const char *name, uint64_t v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_UINT64, &v);
    tsr__sum(h, obj, name, &v, sizeof v);
}
static void tsr__wf32(tsr__h5 *h, hid_t obj, const char *name, float v) {
    tsr__wattr(h, obj, name, H5T_NATIVE_FLOAT, &v);
    tsr__sum(h, obj, name, &v, sizeof v);
}

static void tsr__wstr(tsr__h5 *h, hid_t obj, const char *name, const char *s) {
    if (!tsr__go(h)) return;
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
    tsr__sum(h, obj, name, s, n);
}

/* A contiguous dataset of nd (1 to 3) dims, created by every rank (collective metadata);
 * -1 on failure. */
static hid_t tsr__wcreate(tsr__h5 *h, hid_t obj, const char *name, hid_t type, int nd,
                          const hsize_t *dims) {
    if (!tsr__go(h) || obj < 0) return -1;
    hid_t sp = H5Screate_simple(nd, dims, NULL);
    hid_t d = sp >= 0 ? H5Dcreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)
                      : -1;
    if (sp >= 0) H5Sclose(sp);
    if (d < 0) tsr__fail(h, "create dataset", name);
    return d;
}

/* A 1-D or 2-D dataset (cols 0: 1-D) every rank holds alike: created by all, its data
 * written by `writer` alone (the others write nothing; contiguous storage is allocated at
 * creation, so an independent write by one rank is enough) and counted by it. */
static void tsr__wdata_by(tsr__h5 *h, hid_t obj, const char *name, hid_t type,
                          const void *data, hsize_t rows, hsize_t cols, bool writer) {
    hsize_t dims[2] = {rows, cols};
    hid_t d = tsr__wcreate(h, obj, name, type, cols ? 2 : 1, dims);
    if (d < 0) return;
    if (writer && rows > 0 && tsr__ok(h) &&
        H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        tsr__fail(h, "write dataset", name);
    H5Dclose(d);
    bool c = h->count;
    h->count = writer;
    tsr__sum(h, obj, name, data, (size_t)(rows * (cols ? cols : 1)) * H5Tget_size(type));
    h->count = c;
}

static void tsr__wdata(tsr__h5 *h, hid_t obj, const char *name, hid_t type, const void *data,
                       hsize_t rows, hsize_t cols) {
    tsr__wdata_by(h, obj, name, type, data, rows, cols, h->count);
}

static hid_t tsr__wgroup(tsr__h5 *h, hid_t parent, const char *name) {
    if (!tsr__go(h) || parent < 0) return -1;
    hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) tsr__fail(h, "create group", name);
    return g;
}

static void tsr__wmeta(tsr__h5 *h, hid_t f, const tsr_ckpt_meta *m, int n_reqs) {
    tsr__wi64(h, f, "format_version", m->format_version);
#define TSR__W_I(x) tsr__wi64(h, f, #x, m->x);
#define TSR__W_U(x) tsr__wu64(h, f, #x, m->x);
#define TSR__W_S(x) tsr__wstr(h, f, #x, m->x);
    TSR__CKPT_FIELDS(TSR__W_I, TSR__W_U, TSR__W_S)
#undef TSR__W_I
#undef TSR__W_U
#undef TSR__W_S
    tsr__wi64(h, f, "output_records", m->output_records);
    tsr__wi64(h, f, "n_requests", n_reqs);
}

static void tsr__wreq(tsr__h5 *h, hid_t reqs, int i, const tsr_ckpt_req *r, int kv_seq) {
    char name[32];
    snprintf(name, sizeof name, "%06d", i);
    hid_t g = tsr__wgroup(h, reqs, name);
    if (g < 0) return;
    const tsr_sched_saved *s = &r->s;
    if (r->custom_id) tsr__wstr(h, g, "custom_id", r->custom_id);
    tsr__wi64(h, g, "line", r->line);
    tsr__wu64(h, g, "body_hash", r->body_hash);
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
    if (r->has_kv) {
        tsr__wi64(h, g, "kv_seq", kv_seq);
        tsr__wi64(h, g, "kv_len", r->kv.len);
        tsr__wdata(h, g, "kv_tokens", H5T_NATIVE_INT32, r->kv.tokens, (hsize_t)r->kv.len, 0);
    }
    H5Gclose(g);
}

/* The KV index every rank agrees on: slots and dense of each running request in every
 * layer (each rank knows its own layers: the job's maximum of -1 elsewhere), has_scores,
 * and the pool rows of each layer. */
typedef struct tsr__kvix {
    int n_seqs, n_layers, n_heads, head_dim, has_scores;
    const tsr_ckpt_req **seq; /* [n_seqs] (writer) */
    int32_t *slots, *dense;   /* [n_seqs][n_layers] */
    int64_t *offset;          /* [n_seqs][n_layers] */
    int64_t *rows;            /* [n_layers] */
} tsr__kvix;

static void tsr__kvix_free(tsr__kvix *x) {
    tsr_free(x->seq);
    tsr_free(x->slots);
    tsr_free(x->dense);
    tsr_free(x->offset);
    tsr_free(x->rows);
    memset(x, 0, sizeof *x);
}

static tsr_status tsr__kvix_alloc(tsr__kvix *x) {
    size_t n = (size_t)(x->n_seqs ? x->n_seqs : 1) * (size_t)x->n_layers;
    x->slots = tsr_calloc(n, sizeof *x->slots);
    x->dense = tsr_calloc(n, sizeof *x->dense);
    x->offset = tsr_calloc(n, sizeof *x->offset);
    x->rows = tsr_calloc((size_t)x->n_layers, sizeof *x->rows);
    return x->slots && x->dense && x->offset && x->rows ? TSR_OK : TSR_ERR_NOMEM;
}

/* Offsets and rows from slots. */
static void tsr__kvix_offsets(tsr__kvix *x) {
    for (int l = 0; l < x->n_layers; l++) {
        int64_t o = 0;
        for (int j = 0; j < x->n_seqs; j++) {
            x->offset[(size_t)j * x->n_layers + l] = o;
            o += x->slots[(size_t)j * x->n_layers + l];
        }
        x->rows[l] = o;
    }
}

/* Local part of the writer's preparation: the geometry of every request's KV against the
 * part, this rank's layers of the index. */
static tsr_status tsr__kvix_local(const tsr_ckpt *c, const tsr_ckpt_part *p, tsr__kvix *x,
                                  int64_t *all) {
    const tsr_ckpt_meta *m = &c->meta;
    int nl = p->layer_end - p->layer_begin, nh = p->kv_head_end - p->kv_head_begin;
    int L = x->n_layers;
    for (int j = 0, k = 0; j < c->n_reqs; j++) {
        const tsr_ckpt_req *r = &c->reqs[j];
        if (!r->has_kv) continue;
        if (r->kv.n_layers != nl || r->kv.kv_dim != nh * x->head_dim)
            return tsr_error_set(TSR_ERR_INVALID, "checkpoint: a request's KV has %d layers x "
                                 "%d, this rank holds %d x %d", r->kv.n_layers, r->kv.kv_dim,
                                 nl, nh * x->head_dim);
        if (r->kv.len > m->max_context || r->kv.len < 0)
            return tsr_error_set(TSR_ERR_INVALID, "checkpoint: a request's KV has %d tokens",
                                 r->kv.len);
        x->seq[k] = r;
        for (int l = 0; l < nl; l++) {
            const tsr_kv_seq_layer *Ls = &r->kv.layers[l];
            all[(size_t)k * L + p->layer_begin + l] = Ls->slots;
            all[(size_t)(x->n_seqs + k) * L + p->layer_begin + l] = Ls->dense;
        }
        all[(size_t)2 * x->n_seqs * L] = r->kv.has_scores;
        k++;
    }
    return TSR_OK;
}

/* Layer l's pools: k and v [rows][heads][head_dim] (this rank's heads, one collective
 * write each, every rank taking part), pos and score [rows] (the layer's owner). */
static void tsr__wlayer(tsr__h5 *h, hid_t kvg, const tsr__kvix *x, const tsr_ckpt_part *p,
                        int l, float *buf, int32_t *ibuf, float *sbuf) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", l);
    hid_t g = tsr__wgroup(h, kvg, name);
    if (g < 0) return;
    hsize_t rows = (hsize_t)x->rows[l];
    bool mine = l >= p->layer_begin && l < p->layer_end;
    bool heads = mine && p->head_owner;
    bool layer_owner = heads && p->kv_head_begin == 0;
    int nh = p->kv_head_end - p->kv_head_begin, hd = x->head_dim;
    size_t row = (size_t)nh * (size_t)hd;
    int li = l - p->layer_begin;
    for (int kind = 0; kind < 2; kind++) {
        hsize_t dims[3] = {rows, (hsize_t)x->n_heads, (hsize_t)hd};
        hid_t d = tsr__wcreate(h, g, kind ? "v" : "k", H5T_NATIVE_FLOAT, 3, dims);
        if (d < 0) break;
        bool put = heads && tsr__ok(h); /* after a failure: part of the call, no data */
        if (put)
            for (int j = 0; j < x->n_seqs; j++) {
                const tsr_kv_seq_layer *Ls = &x->seq[j]->kv.layers[li];
                size_t off = (size_t)x->offset[(size_t)j * x->n_layers + l];
                memcpy(buf + off * row, kind ? Ls->v : Ls->k,
                       (size_t)Ls->slots * row * sizeof *buf);
            }
        if (rows > 0) { /* every rank calls the collective write, selecting its part */
            hid_t fs = H5Dget_space(d);
            hsize_t start[3] = {0, (hsize_t)p->kv_head_begin, 0};
            hsize_t cnt[3] = {rows, (hsize_t)nh, (hsize_t)hd};
            hid_t ms = H5Screate_simple(3, cnt, NULL);
            herr_t e = fs >= 0 && ms >= 0 ? 0 : -1;
            if (e >= 0 && put)
                e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, cnt, NULL);
            else if (e >= 0)
                e = H5Sselect_none(fs) < 0 || H5Sselect_none(ms) < 0 ? -1 : 0;
            if (e < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, h->dx_coll, buf) < 0)
                tsr__fail(h, "write dataset", kind ? "v" : "k");
            if (ms >= 0) H5Sclose(ms);
            if (fs >= 0) H5Sclose(fs);
        }
        H5Dclose(d);
        if (put)
            for (hsize_t r = 0; r < rows; r++)
                for (int k = 0; k < nh; k++)
                    h->sum += tsr__row_hash(kind, l, p->kv_head_begin + k, (int64_t)r,
                                            buf + r * row + (size_t)k * hd, hd);
    }
    if (layer_owner)
        for (int j = 0; j < x->n_seqs; j++) {
            const tsr_kv_seq_layer *Ls = &x->seq[j]->kv.layers[li];
            size_t off = (size_t)x->offset[(size_t)j * x->n_layers + l];
            memcpy(ibuf + off, Ls->pos, (size_t)Ls->slots * sizeof *ibuf);
            if (x->has_scores)
                memcpy(sbuf + off, Ls->score, (size_t)Ls->slots * sizeof *sbuf);
        }
    tsr__wdata_by(h, g, "pos", H5T_NATIVE_INT32, ibuf, rows, 0, layer_owner);
    if (x->has_scores) tsr__wdata_by(h, g, "score", H5T_NATIVE_FLOAT, sbuf, rows, 0, layer_owner);
    H5Gclose(g);
}

/* Buffers for one layer's pools of this rank's heads. */
typedef struct tsr__kvbuf {
    float *k;
    int32_t *pos;
    float *score;
} tsr__kvbuf;

static tsr_status tsr__kvbuf_alloc(tsr__kvbuf *b, const tsr__kvix *x, const tsr_ckpt_part *p) {
    int64_t most = 1;
    for (int l = p->layer_begin; l < p->layer_end && l < x->n_layers; l++)
        if (x->rows[l] > most) most = x->rows[l];
    size_t row = (size_t)(p->kv_head_end - p->kv_head_begin) * (size_t)x->head_dim;
    b->k = tsr_malloc((size_t)most * (row ? row : 1) * sizeof *b->k);
    b->pos = tsr_malloc((size_t)most * sizeof *b->pos);
    b->score = tsr_malloc((size_t)most * sizeof *b->score);
    return b->k && b->pos && b->score ? TSR_OK : TSR_ERR_NOMEM;
}

static void tsr__kvbuf_free(tsr__kvbuf *b) {
    tsr_free(b->k);
    tsr_free(b->pos);
    tsr_free(b->score);
}

/* The index and the pools (after the requests). */
static void tsr__wkv(tsr__h5 *h, hid_t f, const tsr__kvix *x, const tsr_ckpt_part *p,
                     tsr__kvbuf *b) {
    hid_t g = tsr__wgroup(h, f, "kv");
    if (g < 0) return;
    tsr__wi64(h, g, "n_seqs", x->n_seqs);
    tsr__wi64(h, g, "has_scores", x->has_scores);
    tsr__wi64(h, g, "n_kv_heads", x->n_heads);
    tsr__wi64(h, g, "head_dim", x->head_dim);
    hsize_t ns = (hsize_t)x->n_seqs, nl = (hsize_t)x->n_layers;
    tsr__wdata(h, g, "slots", H5T_NATIVE_INT32, x->slots, ns, nl);
    tsr__wdata(h, g, "dense", H5T_NATIVE_INT32, x->dense, ns, nl);
    tsr__wdata(h, g, "offset", H5T_NATIVE_INT64, x->offset, ns, nl);
    for (int l = 0; l < x->n_layers && tsr__go(h); l++)
        tsr__wlayer(h, g, x, p, l, b->k, b->pos, b->score);
    H5Gclose(g);
}

static tsr_status tsr__h5_write_part(const char *path, const tsr_ckpt *c,
                                      const tsr_ckpt_part *p) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    const tsr_ckpt_meta *m = &c->meta;
    bool multi = tsr__multi(p);
    int rank = multi ? tsr_comm_world_rank(p->comm) : 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tsr__h5 h = {.path = tmp, .st = TSR_OK, .count = rank == 0, .dx_coll = H5P_DEFAULT,
                 .force = multi};
    /* The index: local geometry first, then the job's maximum of everyone's layers. */
    tsr__kvix x = {.n_layers = m->kv_layers, .n_heads = m->n_kv_heads,
                   .head_dim = m->n_kv_heads > 0 ? m->kv_dim / m->n_kv_heads : 0};
    for (int i = 0; i < c->n_reqs; i++) x.n_seqs += c->reqs[i].has_kv;
    tsr_status st = tsr__need_parallel(path, p);
    if (st == TSR_OK && (m->kv_layers < 1 || m->n_kv_heads < 1 || m->kv_dim % m->n_kv_heads != 0 ||
        p->layer_begin < 0 || p->layer_end > m->kv_layers || p->layer_begin >= p->layer_end ||
        p->kv_head_begin < 0 || p->kv_head_end > m->n_kv_heads ||
        p->kv_head_begin >= p->kv_head_end))
        st = tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint of %d layers x %d KV heads (kv_dim "
                           "%d): this rank's part (layers %d-%d, heads %d-%d) does not fit",
                           path, m->kv_layers, m->n_kv_heads, m->kv_dim, p->layer_begin,
                           p->layer_end, p->kv_head_begin, p->kv_head_end);
    size_t nall = (size_t)2 * (size_t)x.n_seqs * (size_t)(x.n_layers > 0 ? x.n_layers : 1) + 1;
    int64_t *all = st == TSR_OK ? tsr_malloc(nall * sizeof *all) : NULL;
    if (st == TSR_OK) {
        x.seq = tsr_calloc((size_t)(x.n_seqs ? x.n_seqs : 1), sizeof *x.seq);
        st = all && x.seq ? tsr__kvix_alloc(&x) : TSR_ERR_NOMEM;
    }
    if (st == TSR_OK) {
        for (size_t i = 0; i < nall; i++) all[i] = -1;
        all[nall - 1] = 0;
        st = tsr__kvix_local(c, p, &x, all);
    }
    st = tsr__agree(p, st);
    if (st == TSR_OK && multi)
        st = tsr_comm_allreduce_i64(p->comm, TSR_COMM_WORLD, all, nall, TSR_COMM_MAX);
    if (st == TSR_OK) {
        size_t n = (size_t)x.n_seqs * (size_t)x.n_layers;
        for (size_t i = 0; i < n; i++) {
            if (all[i] < 0 && st == TSR_OK)
                st = tsr_error_set(TSR_ERR_INVALID, "%s: no rank holds layer %d of the KV",
                                   path, (int)(i % (size_t)x.n_layers));
            x.slots[i] = (int32_t)all[i];
            x.dense[i] = (int32_t)all[n + i];
        }
        x.has_scores = (int)all[nall - 1];
        tsr__kvix_offsets(&x);
    }
    tsr_free(all);
    /* every rank has its buffers before the collective writes start */
    tsr__kvbuf b = {0};
    if (st == TSR_OK) st = tsr__agree(p, tsr__kvbuf_alloc(&b, &x, p));
    if (st != TSR_OK) {
        tsr__kvbuf_free(&b);
        tsr__kvix_free(&x);
        return st;
    }
    hid_t fapl = tsr__fapl(p);
    h.dx_coll = tsr__dxpl_coll(p);
    hid_t f = fapl >= 0 && h.dx_coll >= 0 ? H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    st = tsr__agree(p, f < 0 ? tsr_error_set(TSR_ERR_HDF5, "%s: cannot create the checkpoint",
                                             tmp) : TSR_OK);
    if (st != TSR_OK) {
        if (f >= 0) H5Fclose(f);
        if (h.dx_coll > 0 && h.dx_coll != H5P_DEFAULT) H5Pclose(h.dx_coll);
        tsr__kvbuf_free(&b);
        tsr__kvix_free(&x);
        return st;
    }
    tsr__wmeta(&h, f, m, c->n_reqs);
    hid_t reqs = tsr__wgroup(&h, f, "requests");
    for (int i = 0, k = 0; i < c->n_reqs && tsr__go(&h); i++) {
        tsr__wreq(&h, reqs, i, &c->reqs[i], k);
        k += c->reqs[i].has_kv;
    }
    if (reqs >= 0) H5Gclose(reqs);
    tsr__wkv(&h, f, &x, p, &b);
    /* Last: the sum of everything above over the ranks (not part of itself). */
    st = tsr__agree(p, h.st);
    uint64_t sum = h.sum;
    if (st == TSR_OK) st = tsr__allsum(p, &sum);
    if (st == TSR_OK) {
        h.count = true; /* the same value on every rank */
        tsr__wattr(&h, f, "checksum", H5T_NATIVE_UINT64, &sum);
        if (tsr__ok(&h) && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) tsr__fail(&h, "flush", "the file");
        st = h.st;
    }
    if (H5Fclose(f) < 0 && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_HDF5, "%s: cannot close the checkpoint", tmp);
    if (h.dx_coll != H5P_DEFAULT) H5Pclose(h.dx_coll);
    tsr__kvbuf_free(&b);
    tsr__kvix_free(&x);
    st = tsr__agree(p, st);
    /* Every rank's data is in the file (closed collectively): rank 0 makes it durable and
     * renames it over the previous checkpoint, which stays until then. */
    tsr_status rn = TSR_OK;
    if (st == TSR_OK && rank == 0) {
        int fd = open(tmp, O_RDONLY);
        if (fd >= 0) {
            (void)fsync(fd);
            close(fd);
        }
        if (rename(tmp, path) != 0)
            rn = tsr_error_set(TSR_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp,
                               strerror(errno));
    }
    if (st == TSR_OK) st = tsr__agree(p, rn);
    if (st != TSR_OK && rank == 0) remove(tmp);
    return st;
}

/* --- reading ------------------------------------------------------------------------- */

static bool tsr__has(hid_t obj, const char *name) { return H5Aexists(obj, name) > 0; }

static void tsr__rattr(tsr__h5 *h, hid_t obj, const char *name, hid_t type, void *v) {
    if (!tsr__ok(h)) return;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0 || H5Aread(a, type, v) < 0) tsr__fail(h, "read attribute", name);
    if (a >= 0) H5Aclose(a);
    if (tsr__ok(h)) tsr__sum(h, obj, name, v, H5Tget_size(type));
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
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: attribute %s = %lld is out of range "
                              "(corrupt checkpoint?)", h->path, name, (long long)v);
        return 0;
    }
    return (int)v;
}

/* A string attribute: allocated (tsr_free), NULL on failure. */
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
    if (out) tsr__sum(h, obj, name, out, strlen(out));
    return out;
}

static void tsr__rstr_into(tsr__h5 *h, hid_t obj, const char *name, char *buf, size_t cap) {
    char *s = tsr__rstr(h, obj, name);
    if (s) snprintf(buf, cap, "%s", s);
    tsr_free(s);
}

/* The dims of an nd-dataset (false, with an error, when it is missing or has another
 * rank). */
static bool tsr__rdims(tsr__h5 *h, hid_t obj, const char *name, int nd, hsize_t *dims) {
    if (!tsr__ok(h)) return false;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
    bool ok = sp >= 0 && H5Sget_simple_extent_ndims(sp) == nd &&
              H5Sget_simple_extent_dims(sp, dims, NULL) >= 0;
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    if (!ok) {
        char what[96];
        snprintf(what, sizeof what, "dataset %s is missing or has the wrong shape", name);
        tsr__corrupt(h, what);
    }
    return ok;
}

/* A dataset of `want` rows x cols (cols 0: 1-D) read into data (want * max(cols,1));
 * data NULL: only its shape is checked. count: it goes into this rank's sum. */
static void tsr__rdata_by(tsr__h5 *h, hid_t obj, const char *name, hid_t type, void *data,
                          hsize_t want, hsize_t cols, bool count) {
    hsize_t dims[2] = {0, 0};
    if (!tsr__rdims(h, obj, name, cols ? 2 : 1, dims)) return;
    if (dims[0] != want || (cols && dims[1] != cols)) {
        char what[96];
        snprintf(what, sizeof what, "dataset %s is missing or has the wrong shape", name);
        tsr__corrupt(h, what);
        return;
    }
    if (!data) return; /* a shape check alone adds nothing: the read adds it once */
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    if (d < 0 || (want > 0 && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        tsr__fail(h, "read dataset", name);
    if (d >= 0) H5Dclose(d);
    bool c = h->count;
    h->count = count;
    if (tsr__ok(h))
        tsr__sum(h, obj, name, data, (size_t)(want * (cols ? cols : 1)) * H5Tget_size(type));
    h->count = c;
}

static void tsr__rdata(tsr__h5 *h, hid_t obj, const char *name, hid_t type, void *data,
                       hsize_t want, hsize_t cols) {
    tsr__rdata_by(h, obj, name, type, data, want, cols, h->count);
}

/* Rows of a 1-D dataset (-1 on failure). */
static int64_t tsr__rlen(tsr__h5 *h, hid_t obj, const char *name) {
    hsize_t dims[1] = {0};
    return tsr__rdims(h, obj, name, 1, dims) ? (int64_t)dims[0] : -1;
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
    if (tsr__ok(h) && m->format_version == 2) {
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: a checkpoint of format 2 (one file per rank, "
                              "an older tessera); this tessera reads format %d: remove it to "
                              "recompute its requests", h->path, TSR_CKPT_VERSION);
        return;
    }
    if (tsr__ok(h) && m->format_version != TSR_CKPT_VERSION) {
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: checkpoint format %d, this tessera reads %d",
                              h->path, m->format_version, TSR_CKPT_VERSION);
        return;
    }
#define TSR__R_I(x) m->x = tsr__rint(h, f, #x, 0, big);
#define TSR__R_U(x) m->x = tsr__ru64(h, f, #x);
#define TSR__R_S(x) tsr__rstr_into(h, f, #x, m->x, sizeof m->x);
    TSR__CKPT_FIELDS(TSR__R_I, TSR__R_U, TSR__R_S)
#undef TSR__R_I
#undef TSR__R_U
#undef TSR__R_S
    m->output_records = tsr__ri64(h, f, "output_records");
    if (tsr__ok(h) && (m->kv_layers != m->n_layers || m->n_kv_heads < 1 ||
                       m->kv_dim % m->n_kv_heads != 0 || m->kv_dim < 1))
        tsr__corrupt(h, "the KV geometry does not match the model's");
}

static void tsr__rreq(tsr__h5 *h, hid_t reqs, int i, const tsr_ckpt_meta *m,
                      tsr_ckpt_req *r, int *kv_seq) {
    char name[32];
    snprintf(name, sizeof name, "%06d", i);
    hid_t g = tsr__rgroup(h, reqs, name);
    if (g < 0) return;
    tsr_sched_saved *s = &r->s;
    if (tsr__has(g, "custom_id")) r->custom_id = tsr__rstr(h, g, "custom_id");
    r->line = tsr__ri64(h, g, "line");
    r->body_hash = tsr__ru64(h, g, "body_hash");
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
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: request %d has %lld tokens (corrupt "
                              "checkpoint?)", h->path, i, (long long)nt);
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
    if (r->has_kv) {
        int seq = tsr__rint(h, g, "kv_seq", *kv_seq, *kv_seq);
        (void)seq;
        (*kv_seq)++;
        r->kv.len = tsr__rint(h, g, "kv_len", 0, m->max_context);
        if (tsr__ok(h) && (r->kv.tokens = tsr_malloc((size_t)(r->kv.len ? r->kv.len : 1) *
                                                     sizeof *r->kv.tokens)) == NULL)
            h->st = TSR_ERR_NOMEM;
        tsr__rdata(h, g, "kv_tokens", H5T_NATIVE_INT32, r->kv.tokens, (hsize_t)r->kv.len, 0);
    }
    H5Gclose(g);
}

/* The index: n_seqs running requests, checked against the requests (their kv_len) before
 * anything is sized from it. */
static void tsr__rkvix(tsr__h5 *h, hid_t g, const tsr_ckpt *c, tsr__kvix *x) {
    const tsr_ckpt_meta *m = &c->meta;
    int want = 0;
    for (int i = 0; i < c->n_reqs; i++) want += c->reqs[i].has_kv;
    x->n_seqs = tsr__rint(h, g, "n_seqs", want, want);
    x->has_scores = tsr__rint(h, g, "has_scores", 0, 1);
    x->n_heads = tsr__rint(h, g, "n_kv_heads", m->n_kv_heads, m->n_kv_heads);
    x->head_dim = tsr__rint(h, g, "head_dim", m->kv_dim / m->n_kv_heads,
                            m->kv_dim / m->n_kv_heads);
    x->n_layers = m->kv_layers;
    if (!tsr__ok(h)) return;
    if (tsr__kvix_alloc(x) != TSR_OK) {
        h->st = TSR_ERR_NOMEM;
        return;
    }
    hsize_t ns = (hsize_t)x->n_seqs, nl = (hsize_t)x->n_layers;
    tsr__rdata(h, g, "slots", H5T_NATIVE_INT32, x->slots, ns, nl);
    tsr__rdata(h, g, "dense", H5T_NATIVE_INT32, x->dense, ns, nl);
    int64_t *off = tsr_calloc((size_t)(ns ? ns : 1) * nl, sizeof *off);
    if (!off && tsr__ok(h)) h->st = TSR_ERR_NOMEM;
    tsr__rdata(h, g, "offset", H5T_NATIVE_INT64, off, ns, nl);
    if (!tsr__ok(h)) {
        tsr_free(off);
        return;
    }
    int j = 0;
    for (int i = 0; i < c->n_reqs && tsr__ok(h); i++) {
        if (!c->reqs[i].has_kv) continue;
        int32_t len = c->reqs[i].kv.len;
        for (int l = 0; l < x->n_layers; l++) {
            int32_t s = x->slots[(size_t)j * nl + l], d = x->dense[(size_t)j * nl + l];
            if (s < 0 || s > len || d < 0 || d > 1 || (d && s != len)) {
                tsr__corrupt(h, "the KV index does not fit its requests");
                break;
            }
        }
        j++;
    }
    if (tsr__ok(h)) tsr__kvix_offsets(x);
    for (size_t i = 0; i < (size_t)ns * nl && tsr__ok(h); i++)
        if (off[i] != x->offset[i]) tsr__corrupt(h, "the KV index offsets do not add up");
    tsr_free(off);
}

/* Layer l's rows of this rank's heads into each running request's KV (layer l - begin). */
static void tsr__rlayer(tsr__h5 *h, hid_t kvg, const tsr__kvix *x, const tsr_ckpt_part *p,
                        tsr_ckpt *c, int l, float *buf, int32_t *ibuf, float *sbuf) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", l);
    hid_t g = tsr__rgroup(h, kvg, name);
    if (g < 0) return;
    hsize_t rows = (hsize_t)x->rows[l];
    int nh = p->kv_head_end - p->kv_head_begin, hd = x->head_dim;
    size_t row = (size_t)nh * (size_t)hd;
    int li = l - p->layer_begin;
    bool layer_owner = p->head_owner && p->kv_head_begin == 0;
    for (int kind = 0; kind < 2 && tsr__ok(h); kind++) {
        const char *dn = kind ? "v" : "k";
        hsize_t dims[3];
        if (!tsr__rdims(h, g, dn, 3, dims)) break;
        if (dims[0] != rows || dims[1] != (hsize_t)x->n_heads || dims[2] != (hsize_t)hd) {
            tsr__corrupt(h, "a KV pool has another shape than its index");
            break;
        }
        if (rows > 0) {
            hid_t d = H5Dopen2(g, dn, H5P_DEFAULT);
            hid_t fs = d >= 0 ? H5Dget_space(d) : -1;
            hsize_t start[3] = {0, (hsize_t)p->kv_head_begin, 0};
            hsize_t cnt[3] = {rows, (hsize_t)nh, (hsize_t)hd};
            hid_t ms = H5Screate_simple(3, cnt, NULL);
            if (fs < 0 || ms < 0 ||
                H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, cnt, NULL) < 0 ||
                H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0)
                tsr__fail(h, "read dataset", dn);
            if (ms >= 0) H5Sclose(ms);
            if (fs >= 0) H5Sclose(fs);
            if (d >= 0) H5Dclose(d);
        }
        if (!tsr__ok(h)) break;
        if (p->head_owner)
            for (hsize_t r = 0; r < rows; r++)
                for (int k = 0; k < nh; k++)
                    h->sum += tsr__row_hash(kind, l, p->kv_head_begin + k, (int64_t)r,
                                            buf + r * row + (size_t)k * hd, hd);
        for (int i = 0, j = 0; i < c->n_reqs; i++) {
            if (!c->reqs[i].has_kv) continue;
            tsr_kv_seq_layer *Ls = &c->reqs[i].kv.layers[li];
            size_t off = (size_t)x->offset[(size_t)j * x->n_layers + l];
            memcpy(kind ? Ls->v : Ls->k, buf + off * row, (size_t)Ls->slots * row * sizeof *buf);
            j++;
        }
    }
    tsr__rdata_by(h, g, "pos", H5T_NATIVE_INT32, ibuf, rows, 0, layer_owner);
    if (x->has_scores) tsr__rdata_by(h, g, "score", H5T_NATIVE_FLOAT, sbuf, rows, 0, layer_owner);
    for (int i = 0, j = 0; i < c->n_reqs && tsr__ok(h); i++) {
        if (!c->reqs[i].has_kv) continue;
        tsr_kv_seq_layer *Ls = &c->reqs[i].kv.layers[li];
        size_t off = (size_t)x->offset[(size_t)j * x->n_layers + l];
        memcpy(Ls->pos, ibuf + off, (size_t)Ls->slots * sizeof *ibuf);
        if (x->has_scores) memcpy(Ls->score, sbuf + off, (size_t)Ls->slots * sizeof *sbuf);
        j++;
    }
    H5Gclose(g);
}

/* The running requests' KV of this rank's part. */
static void tsr__rkv(tsr__h5 *h, hid_t f, const tsr_ckpt_part *p, tsr_ckpt *c) {
    hid_t g = tsr__rgroup(h, f, "kv");
    if (g < 0) return;
    tsr__kvix x = {0};
    tsr__rkvix(h, g, c, &x);
    int nl = p->layer_end - p->layer_begin, nh = p->kv_head_end - p->kv_head_begin;
    for (int i = 0, j = 0; i < c->n_reqs && tsr__ok(h); i++) {
        tsr_ckpt_req *r = &c->reqs[i];
        if (!r->has_kv) continue;
        /* tokens were read with the request: alloc_layers makes them again */
        int32_t *tokens = r->kv.tokens;
        r->kv.tokens = NULL;
        r->kv.n_layers = nl;
        r->kv.kv_dim = nh * x.head_dim;
        r->kv.has_scores = x.has_scores;
        tsr_status st = tsr_kv_seq_state_alloc_layers(&r->kv);
        if (st == TSR_OK) {
            memcpy(r->kv.tokens, tokens, (size_t)r->kv.len * sizeof *tokens);
            for (int l = 0; l < nl; l++) {
                size_t at = (size_t)j * x.n_layers + p->layer_begin + l;
                r->kv.layers[l].slots = x.slots[at];
                r->kv.layers[l].dense = x.dense[at];
            }
            st = tsr_kv_seq_state_alloc_rows(&r->kv);
        }
        tsr_free(tokens);
        if (st != TSR_OK) h->st = TSR_ERR_NOMEM;
        j++;
    }
    int64_t most = 1;
    for (int l = p->layer_begin; l < p->layer_end && tsr__ok(h); l++)
        if (x.rows[l] > most) most = x.rows[l];
    size_t row = (size_t)nh * (size_t)x.head_dim;
    float *buf = tsr__ok(h) ? tsr_malloc((size_t)most * (row ? row : 1) * sizeof *buf) : NULL;
    int32_t *ibuf = tsr__ok(h) ? tsr_malloc((size_t)most * sizeof *ibuf) : NULL;
    float *sbuf = tsr__ok(h) ? tsr_malloc((size_t)most * sizeof *sbuf) : NULL;
    if (tsr__ok(h) && (!buf || !ibuf || !sbuf)) h->st = TSR_ERR_NOMEM;
    for (int l = p->layer_begin; l < p->layer_end && tsr__ok(h); l++)
        tsr__rlayer(h, g, &x, p, c, l, buf, ibuf, sbuf);
    tsr_free(buf);
    tsr_free(ibuf);
    tsr_free(sbuf);
    tsr__kvix_free(&x);
    H5Gclose(g);
}

/* Opens path for reading (collective over the part's ranks); -1 with an error line. */
static hid_t tsr__ropen(const char *path, const tsr_ckpt_part *p) {
    struct stat sb;
    if (stat(path, &sb) != 0) { /* say so, not "truncated or corrupt" */
        tsr_error_set(TSR_ERR_IO, "%s: %s", path, strerror(errno));
        return -1;
    }
    hid_t fapl = tsr__fapl(p);
    hid_t f = fapl >= 0 ? H5Fopen(path, H5F_ACC_RDONLY, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    if (f < 0)
        tsr_error_set(TSR_ERR_HDF5, "%s: not a readable HDF5 checkpoint (truncated or "
                      "corrupt?)", path);
    return f;
}

static tsr_status tsr__h5_read_part(const char *path, const tsr_ckpt_part *part,
                                     tsr_ckpt *out) {
    memset(out, 0, sizeof *out);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int rank = tsr__multi(part) ? tsr_comm_world_rank(part->comm) : 0;
    tsr__h5 h = {.path = path, .st = TSR_OK, .count = rank == 0, .dx_coll = H5P_DEFAULT};
    TSR_TRY(tsr__agree(part, tsr__need_parallel(path, part)));
    hid_t f = tsr__ropen(path, part);
    tsr_status st = tsr__agree(part, f < 0 ? TSR_ERR_HDF5 : TSR_OK);
    if (st != TSR_OK) {
        if (f >= 0) H5Fclose(f);
        return st;
    }
    tsr__rmeta(&h, f, &out->meta);
    tsr_ckpt_part whole = tsr_ckpt_part_whole(&out->meta);
    const tsr_ckpt_part *p = part ? part : &whole;
    if (tsr__ok(&h) && (p->layer_begin < 0 || p->layer_end > out->meta.kv_layers ||
                        p->layer_begin >= p->layer_end || p->kv_head_begin < 0 ||
                        p->kv_head_end > out->meta.n_kv_heads ||
                        p->kv_head_begin >= p->kv_head_end))
        h.st = tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint of %d layers x %d KV heads; this "
                             "job holds layers %d-%d, heads %d-%d (another model?)", path,
                             out->meta.kv_layers, out->meta.n_kv_heads, p->layer_begin,
                             p->layer_end - 1, p->kv_head_begin, p->kv_head_end - 1);
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
    int kv_seq = 0;
    for (int i = 0; i < out->n_reqs && tsr__ok(&h); i++)
        tsr__rreq(&h, reqs, i, &out->meta, &out->reqs[i], &kv_seq);
    if (reqs >= 0) H5Gclose(reqs);
    tsr__rkv(&h, f, p, out);
    uint64_t stored = 0;
    if (tsr__ok(&h)) {
        hid_t a = H5Aopen(f, "checksum", H5P_DEFAULT);
        if (a < 0 || H5Aread(a, H5T_NATIVE_UINT64, &stored) < 0)
            tsr__fail(&h, "read attribute", "checksum");
        if (a >= 0) H5Aclose(a);
    }
    H5Fclose(f); /* collective: every rank gets here, failed or not */
    st = tsr__agree(part, h.st);
    uint64_t sum = h.sum;
    if (st == TSR_OK) st = tsr__allsum(part, &sum);
    if (st == TSR_OK && stored != sum)
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: checksum mismatch: the checkpoint is corrupt "
                           "(its contents are not what was written)", path);
    if (st != TSR_OK) tsr_ckpt_free(out);
    return st;
}

/* --- inspect ------------------------------------------------------------------------- */

static tsr_status tsr__h5_inspect(const char *path, FILE *o) {
    tsr_ckpt c;
    TSR_TRY(tsr_ckpt_read(path, &c)); /* verifies everything, one process */
    const tsr_ckpt_meta *m = &c.meta;
    int running = 0;
    int64_t kv_tokens = 0, gen = 0;
    for (int i = 0; i < c.n_reqs; i++) {
        running += c.reqs[i].has_kv;
        if (c.reqs[i].has_kv) kv_tokens += c.reqs[i].kv.len;
        gen += c.reqs[i].n_gen;
    }
    fprintf(o, "checkpoint %s: format %d, checksum ok\n", path, m->format_version);
    fprintf(o, "model: %s (dim %d, %d layers, %d heads, %d KV heads, vocab %d, %s)\n",
            m->model, m->dim, m->n_layers, m->n_heads, m->n_kv_heads, m->vocab_size, m->dtype);
    fprintf(o, "tokenizer: %s\n", m->tokenizer);
    fprintf(o, "policy: %s (%s), block size %d\n", m->policy, m->policy_options, m->block_size);
    fprintf(o, "written by: tp %d x pp %d (%d rank%s); resumes on any layout\n", m->tp, m->pp,
            m->world, m->world == 1 ? "" : "s");
    fprintf(o, "job: output %s (%lld records), max batch seqs %d, context %d, seed %llu%s\n",
            m->output, (long long)m->output_records, m->max_batch_seqs, m->max_context,
            (unsigned long long)m->seed, m->no_bos ? ", no bos" : "");
    fprintf(o, "requests: %d (%d running with KV, %d waiting); %lld tokens in KV, %lld "
            "generated so far\n", c.n_reqs, running, c.n_reqs - running, (long long)kv_tokens,
            (long long)gen);
    for (int i = 0; i < c.n_reqs; i++) {
        const tsr_ckpt_req *r = &c.reqs[i];
        fprintf(o, "  %s line %lld: %d prompt + %d generated tokens%s", r->custom_id ?
                r->custom_id : "-", (long long)r->line, r->n_prompt, r->n_gen,
                r->has_kv ? "" : ", waiting\n");
        if (r->has_kv) fprintf(o, ", KV of %d tokens\n", r->kv.len);
    }
    int hd = m->kv_dim / m->n_kv_heads;
    int64_t total = 0;
    for (int l = 0; l < m->kv_layers; l++) {
        int64_t rows = 0;
        bool sc = false;
        for (int i = 0; i < c.n_reqs; i++)
            if (c.reqs[i].has_kv) {
                rows += c.reqs[i].kv.layers[l].slots;
                sc = c.reqs[i].kv.has_scores;
            }
        int64_t bytes = rows * (2 * (int64_t)m->kv_dim * 4 + 4 + (sc ? 4 : 0));
        total += bytes;
        fprintf(o, "  layer %d: %lld rows x %d KV heads x %d, %lld bytes\n", l,
                (long long)rows, m->n_kv_heads, hd, (long long)bytes);
    }
    fprintf(o, "KV bytes: %lld\n", (long long)total);
    tsr_ckpt_free(&c);
    return TSR_OK;
}

static const tsr_ckpt_module tsr__h5_module = {
    .abi = TSR_CKPT_MODULE_ABI,
    .ckpt_size = (uint32_t)sizeof(tsr_ckpt),
    .part_size = (uint32_t)sizeof(tsr_ckpt_part),
    .write_part = tsr__h5_write_part,
    .read_part = tsr__h5_read_part,
    .inspect = tsr__h5_inspect,
};

const tsr_ckpt_module *tsr_ckpt_module_entry(void) { return &tsr__h5_module; }
