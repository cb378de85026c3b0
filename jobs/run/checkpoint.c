/* HDF5 checkpoints (see checkpoint.h). Layout (docs/jobs.md), HDF5 1.10 file format,
 * every non-empty dataset chunked with Fletcher-32:
 *   /                      attributes: the tsr_ckpt_meta fields, n_requests, checksum (the
 *                          sum of the hashes of everything else)
 *   /requests/NNNNNN       one group per request in scheduler order (running first):
 *                          attributes (ids, counters, sampler), datasets tokens, text
 *   /requests/NNNNNN/kv    running requests: attribute len, dataset tokens, and groups
 *                          layerL with attributes slots, dense and datasets k, v, pos,
 *                          score (with scores) */
#include "jobs/run/checkpoint.h"

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

/* The fields of tsr_ckpt_meta that a checkpoint stores, in file order after
 * format_version: I(int field), U(uint64 field), S(string field). One list serves the writer
 * and the reader, so they cannot drift apart; tsr_ckpt_check names each in its own words. */
#define TSR__CKPT_FIELDS(I, U, S)                                                        \
    S(model) I(dim) I(n_layers) I(n_heads) I(n_kv_heads) I(vocab_size) S(dtype)          \
    U(model_config) U(model_tensors) U(model_weights) S(tokenizer) U(tokenizer_id)       \
    S(policy) S(policy_options) I(block_size) I(tp) I(pp) I(rank) I(world)               \
    I(max_batch_seqs) I(max_context) I(no_bos) U(seed) I(kv_layers) I(kv_dim) S(output)

#define TSR__CK_I(f)                                                                    \
    if (saved->f != job->f)                                                             \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint %s is %lld, this job has %lld", \
                             path, #f, (long long)saved->f, (long long)job->f);
#define TSR__CK_U(f)                                                                    \
    if (saved->f != job->f)                                                             \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint %s is %llu, this job has %llu", \
                             path, #f, (unsigned long long)saved->f,                    \
                             (unsigned long long)job->f);
#define TSR__CK_S(f)                                                                    \
    if (strcmp(saved->f, job->f))                                                       \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint %s is \"%s\", this job has \"%s\"", \
                             path, #f, saved->f, job->f);
/* An identity hash: what differs is said in words (the hashes mean nothing to a user). */
#define TSR__CK_H(f, what, fmt, ...)                                                    \
    if (saved->f != job->f)                                                             \
        return tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint " what " " fmt, path, __VA_ARGS__);

tsr_status tsr_ckpt_check(const char *path, const tsr_ckpt_meta *saved,
                          const tsr_ckpt_meta *job) {
    TSR__CK_I(format_version)
    TSR__CK_I(dim) TSR__CK_I(n_layers) TSR__CK_I(n_heads) TSR__CK_I(n_kv_heads)
    TSR__CK_I(vocab_size) TSR__CK_S(dtype)
    TSR__CK_H(model_config, "model", "%s has another configuration than this job's model %s",
              saved->model, job->model)
    TSR__CK_H(model_tensors, "model", "%s has other tensors (names, shapes or dtypes) than "
              "this job's model %s", saved->model, job->model)
    TSR__CK_H(model_weights, "model", "%s has other weights than this job's model %s (same "
              "tensors and shapes, other contents)", saved->model, job->model)
    TSR__CK_H(tokenizer_id, "tokenizer", "%s differs from this job's tokenizer %s (its "
              "contents or the chat template)", saved->tokenizer, job->tokenizer)
    TSR__CK_S(policy) TSR__CK_S(policy_options)
    TSR__CK_I(block_size) TSR__CK_I(tp) TSR__CK_I(pp) TSR__CK_I(rank) TSR__CK_I(world)
    TSR__CK_I(max_batch_seqs) TSR__CK_I(max_context) TSR__CK_I(no_bos) TSR__CK_U(seed)
    TSR__CK_I(kv_layers) TSR__CK_I(kv_dim) TSR__CK_S(output)
    return TSR_OK;
}

tsr_status tsr_ckpt_check_records(const char *path, const tsr_ckpt_meta *saved,
                                  const tsr_ckpt_meta *job) {
    if (saved->output_records != job->output_records)
        return tsr_error_set(TSR_ERR_INVALID,
                             "%s: checkpoint was written when %s held %lld records, it holds "
                             "%lld now (edited or lost output?); remove the checkpoint to "
                             "resume by records", path, job->output,
                             (long long)saved->output_records, (long long)job->output_records);
    return TSR_OK;
}

/* --- identity ------------------------------------------------------------------------ */

/* Multiply-xorshift on 8-byte words: xor with the word, a multiplication by an odd constant
 * and a xorshift are each a bijection of the 64-bit state, so one differing word always
 * yields a different result (a single bit flip is never missed). */
#define TSR__HK 0x9fb21c651e98df25ull

static uint64_t tsr__mix(uint64_t h) {
    h ^= h >> 31;
    h *= TSR__HK;
    h ^= h >> 29;
    return h;
}

uint64_t tsr_ckpt_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    h = tsr__mix(h ^ ((uint64_t)n * 0x9e3779b97f4a7c15ull));
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * TSR__HK;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, b, n);
    h = (h ^ w ^ ((uint64_t)n << 59)) * TSR__HK;
    return tsr__mix(h);
}

tsr_status tsr_ckpt_file_hash(const char *path, uint64_t *out) {
    *out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = tsr_malloc(CHUNK);
    if (!buf) {
        fclose(f);
        return TSR_ERR_NOMEM;
    }
    uint64_t h = 0x746f6b656e697a65ull;
    size_t n;
    while ((n = fread(buf, 1, CHUNK, f)) > 0) h = tsr_ckpt_hash(h, buf, n);
    bool bad = ferror(f);
    fclose(f);
    tsr_free(buf);
    if (bad) return tsr_error_set(TSR_ERR_IO, "%s: read error", path);
    *out = h;
    return TSR_OK;
}

static uint64_t tsr__hash_i64(uint64_t h, int64_t v) { return tsr_ckpt_hash(h, &v, sizeof v); }
static uint64_t tsr__hash_f32(uint64_t h, float v) { return tsr_ckpt_hash(h, &v, sizeof v); }
static uint64_t tsr__hash_str(uint64_t h, const char *s) {
    return tsr_ckpt_hash(h, s, strlen(s));
}

enum { TSR__FP_WHOLE = 256 << 10, TSR__FP_BLOCKS = 32, TSR__FP_BLOCK = 4 << 10 };

/* One tensor into the shape hash (name, dtype, rows, cols) and the content fingerprint
 * (its size, then all of it or its sampled blocks). Absent tensors (another pipeline
 * stage's layers: data NULL) count by shape only. */
static void tsr__hash_tensor(uint64_t *shape, uint64_t *content, const char *name,
                             const tsr_tensor *t) {
    *shape = tsr__hash_str(*shape, name);
    *shape = tsr__hash_i64(*shape, t->data ? (int64_t)t->dtype : -1);
    *shape = tsr__hash_i64(*shape, t->data ? t->rows : 0);
    *shape = tsr__hash_i64(*shape, t->data ? t->cols : 0);
    size_t bytes = t->data ? tsr_tensor_bytes(t) : 0;
    *content = tsr__hash_i64(*content, (int64_t)bytes);
    if (!bytes) return;
    const unsigned char *p = t->data;
    if (bytes <= TSR__FP_WHOLE) {
        *content = tsr_ckpt_hash(*content, p, bytes);
        return;
    }
    for (int i = 0; i < TSR__FP_BLOCKS; i++) {
        size_t off = (bytes - TSR__FP_BLOCK) / (TSR__FP_BLOCKS - 1) * (size_t)i;
        if (i == TSR__FP_BLOCKS - 1) off = bytes - TSR__FP_BLOCK;
        *content = tsr_ckpt_hash(*content, p + off, TSR__FP_BLOCK);
    }
}

void tsr_ckpt_model_identity(const tsr_model *m, uint64_t *config, uint64_t *tensors,
                             uint64_t *weights) {
    const tsr_model_config *c = &m->cfg;
    /* Field by field (the struct's padding is not part of the identity). */
    int64_t ints[] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                      c->head_dim, c->vocab_size, c->max_seq_len, c->rope_interleaved,
                      c->rope_scaling, c->rope_original_max_pos, c->tied_embeddings,
                      c->dtype, c->bos_id, c->eos_id, c->n_eos_ids};
    uint64_t h = 0x636f6e666967ull;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) h = tsr__hash_i64(h, ints[i]);
    for (int i = 0; i < c->n_eos_ids && i < 8; i++) h = tsr__hash_i64(h, c->eos_ids[i]);
    float fl[] = {c->norm_eps, c->rope_theta, c->rope_factor, c->rope_low_freq_factor,
                  c->rope_high_freq_factor};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) h = tsr__hash_f32(h, fl[i]);
    *config = h;
    uint64_t sh = 0x74656e736f7273ull, ct = 0x77656967687473ull;
    tsr__hash_tensor(&sh, &ct, "tok_emb", &m->tok_emb);
    for (int l = 0; l < c->n_layers && m->layers; l++) {
        const tsr_layer_weights *w = &m->layers[l];
        const struct {
            const char *name;
            const tsr_tensor *t;
        } lt[] = {{"attn_norm", &w->attn_norm}, {"wq", &w->wq}, {"wk", &w->wk},
                  {"wv", &w->wv}, {"wo", &w->wo}, {"ffn_norm", &w->ffn_norm},
                  {"w_gate", &w->w_gate}, {"w_up", &w->w_up}, {"w_down", &w->w_down}};
        for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.%s", l, lt[i].name);
            tsr__hash_tensor(&sh, &ct, name, lt[i].t);
        }
    }
    tsr__hash_tensor(&sh, &ct, "out_norm", &m->out_norm);
    tsr__hash_tensor(&sh, &ct, "classifier", &m->classifier);
    *tensors = sh;
    *weights = ct;
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

/* One file being written or read; the first failure is kept, later calls do nothing.
 * sum: the sum of the hashes of every attribute and dataset written or read (each hashed
 * with its object's path and its name, so the sum does not depend on the order of the
 * reads and a missing or extra item changes it too). */
typedef struct tsr__h5 {
    const char *path;
    tsr_status st;
    uint64_t sum;
} tsr__h5;

static bool tsr__ok(tsr__h5 *h) { return h->st == TSR_OK; }

static void tsr__fail(tsr__h5 *h, const char *what, const char *name) {
    if (h->st == TSR_OK)
        h->st = tsr_error_set(TSR_ERR_HDF5, "%s: cannot %s %s (truncated or corrupt checkpoint?)",
                              h->path, what, name);
}

static void tsr__sum(tsr__h5 *h, hid_t obj, const char *name, const void *v, size_t n) {
    char at[512] = "";
    if (H5Iget_name(obj, at, sizeof at) < 0) at[0] = '\0';
    uint64_t x = tsr_ckpt_hash(0x636b7074ull, at, strlen(at));
    x = tsr_ckpt_hash(x, name, strlen(name));
    h->sum += tsr_ckpt_hash(x, v, n);
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
    tsr__sum(h, obj, name, s, n);
}

/* A 1-D or 2-D dataset (cols 0: 1-D) of `esize`-byte elements. Chunked (1 MiB chunks at
 * most) with the Fletcher-32 filter, so HDF5 checks every chunk when it reads it back; an
 * empty one has no data to check. */
static void tsr__wdata(tsr__h5 *h, hid_t obj, const char *name, hid_t type, const void *data,
                       hsize_t rows, hsize_t cols) {
    if (!tsr__ok(h)) return;
    size_t esize = H5Tget_size(type);
    hsize_t dims[2] = {rows, cols};
    hid_t sp = H5Screate_simple(cols ? 2 : 1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    bool ok = sp >= 0 && dcpl >= 0;
    if (ok && rows > 0) {
        hsize_t row_bytes = (cols ? cols : 1) * esize;
        hsize_t chunk[2] = {(1u << 20) / row_bytes, cols};
        if (chunk[0] < 1) chunk[0] = 1;
        if (chunk[0] > rows) chunk[0] = rows;
        ok = H5Pset_chunk(dcpl, cols ? 2 : 1, chunk) >= 0 && H5Pset_fletcher32(dcpl) >= 0;
    }
    hid_t d = ok ? H5Dcreate2(obj, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
    if (d < 0 || (rows > 0 && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        tsr__fail(h, "write dataset", name);
    if (d >= 0) H5Dclose(d);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    tsr__sum(h, obj, name, data, (size_t)(rows * (cols ? cols : 1)) * esize);
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
#define TSR__W_U(x) tsr__wu64(h, f, #x, m->x);
#define TSR__W_S(x) tsr__wstr(h, f, #x, m->x);
    TSR__CKPT_FIELDS(TSR__W_I, TSR__W_U, TSR__W_S)
#undef TSR__W_I
#undef TSR__W_U
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
    if (r->has_kv) tsr__wkv(h, g, &r->kv);
    H5Gclose(g);
}

tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tsr__h5 h = {.path = tmp, .st = TSR_OK};
    /* The 1.10 file format: checksummed superblock, object headers, heaps and chunk
     * indexes, so damaged metadata fails in HDF5's reader instead of being parsed. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    hid_t f = fapl >= 0 && H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_LATEST) >= 0
                  ? H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    if (f < 0)
        return tsr_error_set(TSR_ERR_HDF5, "%s: cannot create the checkpoint", tmp);
    tsr__wmeta(&h, f, &c->meta, c->n_reqs);
    hid_t reqs = tsr__wgroup(&h, f, "requests");
    for (int i = 0; i < c->n_reqs && tsr__ok(&h); i++) tsr__wreq(&h, reqs, i, &c->reqs[i]);
    if (reqs >= 0) H5Gclose(reqs);
    /* Last: the sum of everything above (not part of itself). */
    tsr__wattr(&h, f, "checksum", H5T_NATIVE_UINT64, &h.sum);
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

/* A dataset of `want` rows x cols (cols 0: 1-D) read into data (want * max(cols,1));
 * data NULL: only its shape is checked. HDF5 verifies each chunk's Fletcher-32 checksum as
 * it reads it. */
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
        h->st = tsr_error_set(TSR_ERR_FORMAT, "%s: dataset %s is missing or has the wrong shape "
                              "(corrupt checkpoint?)", h->path, name);
    }
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    if (tsr__ok(h) && data) /* a shape check alone adds nothing: the read adds it once */
        tsr__sum(h, obj, name, data, (size_t)(want * (cols ? cols : 1)) * H5Tget_size(type));
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
#define TSR__R_U(x) m->x = tsr__ru64(h, f, #x);
#define TSR__R_S(x) tsr__rstr_into(h, f, #x, m->x, sizeof m->x);
    TSR__CKPT_FIELDS(TSR__R_I, TSR__R_U, TSR__R_S)
#undef TSR__R_I
#undef TSR__R_U
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
    uint64_t stored = 0, sum = h.sum;
    if (tsr__ok(&h)) {
        hid_t a = H5Aopen(f, "checksum", H5P_DEFAULT);
        if (a < 0 || H5Aread(a, H5T_NATIVE_UINT64, &stored) < 0)
            tsr__fail(&h, "read attribute", "checksum");
        if (a >= 0) H5Aclose(a);
    }
    if (tsr__ok(&h) && stored != sum)
        h.st = tsr_error_set(TSR_ERR_FORMAT, "%s: checksum mismatch: the checkpoint is corrupt "
                             "(its contents are not what was written)", path);
    H5Fclose(f);
    if (h.st != TSR_OK) tsr_ckpt_free(out);
    return h.st;
}

#endif
