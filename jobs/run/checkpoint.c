/* Checkpoints (checkpoint.h): what needs no HDF5 (identities, hashes, the checks of a
 * resume) and the loader of the HDF5 reader and writer, libtessera-hdf5.so
 * (jobs/run/checkpoint_h5.c, which has the file layout). */
#include "jobs/run/checkpoint.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/module.h"
#include "jobs/run/checkpoint_module.h"

void tsr_ckpt_rank_path(const char *path, int rank, int world, char *buf, size_t cap) {
    (void)world;
    size_t n = strlen(path);
    int stem = n > 3 && !strcmp(path + n - 3, ".h5") ? (int)(n - 3) : (int)n;
    snprintf(buf, cap, "%.*s.rank%d.h5", stem, path, rank);
}

tsr_ckpt_part tsr_ckpt_part_whole(const tsr_ckpt_meta *m) {
    return (tsr_ckpt_part){.layer_begin = 0, .layer_end = m->kv_layers, .kv_head_begin = 0,
                           .kv_head_end = m->n_kv_heads, .head_owner = true};
}

tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c) {
    tsr_ckpt_part p = tsr_ckpt_part_whole(&c->meta);
    return tsr_ckpt_write_part(path, c, &p);
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
    TSR__CK_I(block_size) /* not tp, pp, rank, world: any layout resumes */
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


tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out) {
    return tsr_ckpt_read_part(path, NULL, out);
}

/* --- the HDF5 module ------------------------------------------------------------------- */

#ifndef TSR_HAVE_HDF5

static tsr_status tsr__ckpt_module(const char *path, const tsr_ckpt_module **out) {
    *out = NULL;
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s%sthis build has no HDF5 (configure with "
                         "-DTESSERA_HDF5=ON)", path ? path : "", path ? ": " : "");
}

#else

/* Loaded at most once per process (HDF5 is never unloaded: it registers atexit and MPI
 * finalize hooks); the failure is kept as its line. The first call comes from start-up or
 * the first checkpoint, on the main thread. */
static struct {
    bool tried;
    const tsr_ckpt_module *mod;
    tsr_status st;
    char err[PATH_MAX + 2048]; /* a path and the directories looked in */
} tsr__ckpt_slot;

static void tsr__ckpt_load(void) {
    char path[PATH_MAX], looked[1024];
    /* A program with the HDF5 code linked in (the checkpoint fuzzer) uses its own. */
    tsr_ckpt_module_entry_fn entry =
        (tsr_ckpt_module_entry_fn)dlsym(RTLD_DEFAULT, TSR_CKPT_MODULE_ENTRY);
    snprintf(path, sizeof path, "%s", "the executable");
    if (!entry) {
        if (!tsr_module_find(TSR_CKPT_MODULE_FILE, path, sizeof path, looked, sizeof looked)) {
            tsr__ckpt_slot.st = TSR_ERR_UNSUPPORTED;
            snprintf(tsr__ckpt_slot.err, sizeof tsr__ckpt_slot.err,
                     "checkpoints need the HDF5 module %s, which is not installed (looked in "
                     "%s): install it with the binary (lib/tessera/) or set TSR_MODULE_DIR "
                     "to its directory", TSR_CKPT_MODULE_FILE, looked);
            return;
        }
        /* RTLD_NOW: a missing HDF5 library or symbol is this error, never a crash later. */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *why = dlerror();
            tsr__ckpt_slot.st = TSR_ERR_UNSUPPORTED;
            snprintf(tsr__ckpt_slot.err, sizeof tsr__ckpt_slot.err,
                     "checkpoints: cannot load %s (%s): if the HDF5 library it needs is "
                     "what is missing, load the site's HDF5 module or add its lib directory "
                     "to LD_LIBRARY_PATH", path, why ? why : "?");
            return;
        }
        entry = (tsr_ckpt_module_entry_fn)dlsym(h, TSR_CKPT_MODULE_ENTRY);
    }
    const tsr_ckpt_module *m = entry ? entry() : NULL;
    if (!m || m->abi != TSR_CKPT_MODULE_ABI || m->ckpt_size != sizeof(tsr_ckpt) ||
        m->part_size != sizeof(tsr_ckpt_part) || !m->write_part || !m->read_part ||
        !m->inspect) {
        tsr__ckpt_slot.st = TSR_ERR_UNSUPPORTED;
        snprintf(tsr__ckpt_slot.err, sizeof tsr__ckpt_slot.err,
                 "checkpoints: %s is not the HDF5 module of this tessera build (ABI %u, this "
                 "binary's %u): install the module built with this binary", path,
                 m ? m->abi : 0u, TSR_CKPT_MODULE_ABI);
        return;
    }
    TSR_LOG_DEBUG("checkpoints: HDF5 module %s", path);
    tsr__ckpt_slot.mod = m;
}

/* The module; its failure is the error line, naming `path` (the checkpoint asked for)
 * when there is one. */
static tsr_status tsr__ckpt_module(const char *path, const tsr_ckpt_module **out) {
    if (!tsr__ckpt_slot.tried) {
        tsr__ckpt_slot.tried = true;
        tsr__ckpt_load();
    }
    *out = tsr__ckpt_slot.mod;
    if (*out) return TSR_OK;
    if (!path) return tsr_error_set(tsr__ckpt_slot.st, "%s", tsr__ckpt_slot.err);
    return tsr_error_set(tsr__ckpt_slot.st, "%s: %s", path, tsr__ckpt_slot.err);
}

#endif

bool tsr_ckpt_available(void) {
    const tsr_ckpt_module *m;
    return tsr__ckpt_module(NULL, &m) == TSR_OK;
}

tsr_status tsr_ckpt_write_part(const char *path, const tsr_ckpt *c, const tsr_ckpt_part *part) {
    const tsr_ckpt_module *m;
    TSR_TRY(tsr__ckpt_module(path, &m));
    return m->write_part(path, c, part);
}

tsr_status tsr_ckpt_read_part(const char *path, const tsr_ckpt_part *part, tsr_ckpt *out) {
    memset(out, 0, sizeof *out);
    const tsr_ckpt_module *m;
    TSR_TRY(tsr__ckpt_module(path, &m));
    return m->read_part(path, part, out);
}

tsr_status tsr_ckpt_inspect(const char *path, FILE *f) {
    const tsr_ckpt_module *m;
    TSR_TRY(tsr__ckpt_module(path, &m));
    return m->inspect(path, f);
}
