#include "runtime/model/gguf_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"

#define TSR__GGUF_ALIGN 32

/* A growable byte buffer: the metadata and the tensor infos are kept in memory until the
 * header is written (their counts come first in the file). */
typedef struct tsr__buf {
    uint8_t *p;
    size_t len, cap;
} tsr__buf;

typedef struct tsr__tinfo {
    uint64_t nbytes;
} tsr__tinfo;

struct tsr_gguf_writer {
    char *path, *tmp;
    FILE *fp;
    tsr__buf kv, infos;
    uint64_t n_kv, n_tensors;
    tsr__tinfo *tensors;
    uint64_t cap_tensors;
    uint64_t data_off; /* the next tensor's offset from the data section's start */
    bool started;      /* header written */
    uint64_t cur;      /* tensor being written */
    uint64_t cur_done; /* its bytes written so far */
    tsr_status failed; /* sticky: a failed add makes close fail too */
};

static tsr_status tsr__put(tsr_gguf_writer *w, tsr__buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *q = tsr_realloc(b->p, cap);
        if (!q) return w->failed = tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", w->path);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    return TSR_OK;
}

static tsr_status tsr__put_u32(tsr_gguf_writer *w, tsr__buf *b, uint32_t v) {
    return tsr__put(w, b, &v, 4);
}
static tsr_status tsr__put_u64(tsr_gguf_writer *w, tsr__buf *b, uint64_t v) {
    return tsr__put(w, b, &v, 8);
}
static tsr_status tsr__put_str(tsr_gguf_writer *w, tsr__buf *b, const char *s, uint64_t n) {
    TSR_TRY(tsr__put_u64(w, b, n));
    return tsr__put(w, b, s, (size_t)n);
}

static size_t tsr__vsize(tsr_gguf_vtype t) {
    switch (t) {
    case TSR_GGUF_U8: case TSR_GGUF_I8: case TSR_GGUF_BOOL: return 1;
    case TSR_GGUF_U16: case TSR_GGUF_I16: return 2;
    case TSR_GGUF_U32: case TSR_GGUF_I32: case TSR_GGUF_F32: return 4;
    case TSR_GGUF_U64: case TSR_GGUF_I64: case TSR_GGUF_F64: return 8;
    case TSR_GGUF_STRING: case TSR_GGUF_ARRAY: break;
    }
    return 0;
}

tsr_status tsr_gguf_writer_create(const char *path, tsr_gguf_writer **out) {
    *out = NULL;
    tsr_gguf_writer *w = tsr_calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (w) w->path = tsr_malloc(n + 1);
    if (w && w->path) w->tmp = tsr_malloc(n + 5);
    if (!w || !w->path || !w->tmp) {
        if (w) tsr_free(w->path);
        tsr_free(w);
        return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(w->path, path, n + 1);
    snprintf(w->tmp, n + 5, "%s.tmp", path);
    *out = w;
    return TSR_OK;
}

/* The key, checked: the header must not be written yet. */
static tsr_status tsr__key(tsr_gguf_writer *w, const char *key, tsr_gguf_vtype type) {
    if (w->failed != TSR_OK) return w->failed;
    if (w->started)
        return w->failed = tsr_error_set(TSR_ERR_INTERNAL, "%s: key %s added after the data",
                                         w->path, key);
    TSR_TRY(tsr__put_str(w, &w->kv, key, strlen(key)));
    TSR_TRY(tsr__put_u32(w, &w->kv, (uint32_t)type));
    w->n_kv++;
    return TSR_OK;
}

tsr_status tsr_gguf_writer_add_str(tsr_gguf_writer *w, const char *key, const char *value) {
    TSR_TRY(tsr__key(w, key, TSR_GGUF_STRING));
    return tsr__put_str(w, &w->kv, value, strlen(value));
}

tsr_status tsr_gguf_writer_add_u32(tsr_gguf_writer *w, const char *key, uint32_t value) {
    TSR_TRY(tsr__key(w, key, TSR_GGUF_U32));
    return tsr__put(w, &w->kv, &value, 4);
}

tsr_status tsr_gguf_writer_add_i32(tsr_gguf_writer *w, const char *key, int32_t value) {
    TSR_TRY(tsr__key(w, key, TSR_GGUF_I32));
    return tsr__put(w, &w->kv, &value, 4);
}

tsr_status tsr_gguf_writer_add_f32(tsr_gguf_writer *w, const char *key, float value) {
    TSR_TRY(tsr__key(w, key, TSR_GGUF_F32));
    return tsr__put(w, &w->kv, &value, 4);
}

tsr_status tsr_gguf_writer_add_bool(tsr_gguf_writer *w, const char *key, bool value) {
    uint8_t b = value ? 1 : 0;
    TSR_TRY(tsr__key(w, key, TSR_GGUF_BOOL));
    return tsr__put(w, &w->kv, &b, 1);
}

tsr_status tsr_gguf_writer_add_arr(tsr_gguf_writer *w, const char *key, tsr_gguf_vtype elem,
                                   const void *values, uint64_t n) {
    size_t es = tsr__vsize(elem);
    if (!es)
        return w->failed = tsr_error_set(TSR_ERR_INVALID, "%s: key %s: not a fixed-size "
                                         "element type", w->path, key);
    TSR_TRY(tsr__key(w, key, TSR_GGUF_ARRAY));
    TSR_TRY(tsr__put_u32(w, &w->kv, (uint32_t)elem));
    TSR_TRY(tsr__put_u64(w, &w->kv, n));
    return tsr__put(w, &w->kv, values, (size_t)n * es);
}

tsr_status tsr_gguf_writer_add_arr_str(tsr_gguf_writer *w, const char *key,
                                       const char *const *strs, const uint64_t *lens,
                                       uint64_t n) {
    TSR_TRY(tsr__key(w, key, TSR_GGUF_ARRAY));
    TSR_TRY(tsr__put_u32(w, &w->kv, (uint32_t)TSR_GGUF_STRING));
    TSR_TRY(tsr__put_u64(w, &w->kv, n));
    for (uint64_t i = 0; i < n; i++) TSR_TRY(tsr__put_str(w, &w->kv, strs[i], lens[i]));
    return TSR_OK;
}

tsr_status tsr_gguf_writer_add_kv(tsr_gguf_writer *w, const tsr_gguf_kv *kv) {
    if (kv->type == TSR_GGUF_STRING) {
        TSR_TRY(tsr__key(w, kv->key, TSR_GGUF_STRING));
        return tsr__put_str(w, &w->kv, kv->str, kv->str_len);
    }
    if (kv->type != TSR_GGUF_ARRAY) {
        size_t es = tsr__vsize(kv->type);
        if (!es)
            return w->failed = tsr_error_set(TSR_ERR_INVALID, "%s: key %s has an unknown type",
                                             w->path, kv->key);
        TSR_TRY(tsr__key(w, kv->key, kv->type));
        return tsr__put(w, &w->kv, kv->data, es);
    }
    if (kv->elem != TSR_GGUF_STRING) {
        if (!tsr__vsize(kv->elem))
            return w->failed = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: key %s is an array of "
                                             "arrays (not copied)", w->path, kv->key);
        return tsr_gguf_writer_add_arr(w, kv->key, kv->elem, kv->data, kv->n);
    }
    TSR_TRY(tsr__key(w, kv->key, TSR_GGUF_ARRAY));
    TSR_TRY(tsr__put_u32(w, &w->kv, (uint32_t)TSR_GGUF_STRING));
    TSR_TRY(tsr__put_u64(w, &w->kv, kv->n));
    for (uint64_t i = 0; i < kv->n; i++) {
        const char *s;
        uint64_t len;
        tsr_gguf_arr_str(kv, i, &s, &len);
        TSR_TRY(tsr__put_str(w, &w->kv, s, len));
    }
    return TSR_OK;
}

tsr_status tsr_gguf_writer_add_tensor(tsr_gguf_writer *w, const char *name, uint32_t type,
                                      int n_dims, const int64_t *ne) {
    if (w->failed != TSR_OK) return w->failed;
    if (w->started)
        return w->failed = tsr_error_set(TSR_ERR_INTERNAL, "%s: tensor %s added after the data",
                                         w->path, name);
    if (n_dims < 1 || n_dims > 4)
        return w->failed = tsr_error_set(TSR_ERR_INVALID, "%s: tensor %s: %d dimensions",
                                         w->path, name, n_dims);
    uint64_t numel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0)
            return w->failed = tsr_error_set(TSR_ERR_INVALID, "%s: tensor %s: dimension %d is "
                                             "%lld", w->path, name, d, (long long)ne[d]);
        numel *= (uint64_t)ne[d];
    }
    uint64_t nbytes;
    switch (type) {
    case TSR_GGML_F32: nbytes = numel * 4; break;
    case TSR_GGML_F16:
    case TSR_GGML_BF16: nbytes = numel * 2; break;
    case TSR_GGML_Q8_0:
        if (ne[0] % 32)
            return w->failed = tsr_error_set(TSR_ERR_INVALID, "%s: tensor %s: Q8_0 needs rows "
                                             "of whole 32-value blocks, not %lld", w->path,
                                             name, (long long)ne[0]);
        nbytes = numel / 32 * 34;
        break;
    default:
        return w->failed = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tensor %s: writing type %s "
                                         "is not supported", w->path, name,
                                         tsr_gguf_type_name(type));
    }
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        tsr__tinfo *t = tsr_realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return w->failed = tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", w->path);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    TSR_TRY(tsr__put_str(w, &w->infos, name, strlen(name)));
    TSR_TRY(tsr__put_u32(w, &w->infos, (uint32_t)n_dims));
    for (int d = 0; d < n_dims; d++) TSR_TRY(tsr__put_u64(w, &w->infos, (uint64_t)ne[d]));
    TSR_TRY(tsr__put_u32(w, &w->infos, type));
    TSR_TRY(tsr__put_u64(w, &w->infos, w->data_off));
    w->tensors[w->n_tensors++].nbytes = nbytes;
    w->data_off += (nbytes + TSR__GGUF_ALIGN - 1) / TSR__GGUF_ALIGN * TSR__GGUF_ALIGN;
    return TSR_OK;
}

static tsr_status tsr__fwrite(tsr_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n)
        return w->failed = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", w->tmp,
                                         strerror(errno));
    return TSR_OK;
}

static tsr_status tsr__pad(tsr_gguf_writer *w, uint64_t written) {
    static const uint8_t zeros[TSR__GGUF_ALIGN];
    return tsr__fwrite(w, zeros, (size_t)((TSR__GGUF_ALIGN - written % TSR__GGUF_ALIGN) %
                                          TSR__GGUF_ALIGN));
}

/* Header, metadata and tensor infos, padded to the alignment: the data section follows. */
static tsr_status tsr__start(tsr_gguf_writer *w) {
    w->fp = fopen(w->tmp, "wb");
    if (!w->fp)
        return w->failed = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", w->tmp,
                                         strerror(errno));
    w->started = true;
    uint32_t version = 3;
    TSR_TRY(tsr__fwrite(w, "GGUF", 4));
    TSR_TRY(tsr__fwrite(w, &version, 4));
    TSR_TRY(tsr__fwrite(w, &w->n_tensors, 8));
    TSR_TRY(tsr__fwrite(w, &w->n_kv, 8));
    TSR_TRY(tsr__fwrite(w, w->kv.p, w->kv.len));
    TSR_TRY(tsr__fwrite(w, w->infos.p, w->infos.len));
    return tsr__pad(w, 24 + w->kv.len + w->infos.len);
}

tsr_status tsr_gguf_writer_write(tsr_gguf_writer *w, const void *data, size_t bytes) {
    if (w->failed != TSR_OK) return w->failed;
    if (!w->started) TSR_TRY(tsr__start(w));
    const uint8_t *p = data;
    while (bytes > 0) {
        if (w->cur >= w->n_tensors)
            return w->failed = tsr_error_set(TSR_ERR_INTERNAL, "%s: more data written than the "
                                             "tensor infos declare", w->path);
        uint64_t left = w->tensors[w->cur].nbytes - w->cur_done;
        size_t n = bytes < left ? bytes : (size_t)left;
        TSR_TRY(tsr__fwrite(w, p, n));
        p += n;
        bytes -= n;
        w->cur_done += n;
        if (w->cur_done == w->tensors[w->cur].nbytes) {
            TSR_TRY(tsr__pad(w, w->cur_done));
            w->cur++;
            w->cur_done = 0;
        }
    }
    return TSR_OK;
}

static void tsr__free(tsr_gguf_writer *w) {
    tsr_free(w->kv.p);
    tsr_free(w->infos.p);
    tsr_free(w->tensors);
    tsr_free(w->path);
    tsr_free(w->tmp);
    tsr_free(w);
}

void tsr_gguf_writer_abort(tsr_gguf_writer *w) {
    if (!w) return;
    if (w->fp) {
        fclose(w->fp);
        remove(w->tmp);
    }
    tsr__free(w);
}

tsr_status tsr_gguf_writer_close(tsr_gguf_writer *w) {
    tsr_status st = w->failed;
    /* a file without tensors still gets its header */
    if (st == TSR_OK && !w->started) st = tsr__start(w);
    if (st == TSR_OK && w->cur < w->n_tensors)
        st = tsr_error_set(TSR_ERR_INTERNAL, "%s: %llu of %llu tensors written", w->path,
                           (unsigned long long)w->cur, (unsigned long long)w->n_tensors);
    if (st == TSR_OK && (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0))
        st = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    if (st != TSR_OK) {
        tsr_gguf_writer_abort(w);
        return st;
    }
    int rc = fclose(w->fp);
    w->fp = NULL;
    if (rc != 0)
        st = tsr_error_set(TSR_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
    else if (rename(w->tmp, w->path) != 0)
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename %s to it: %s", w->path, w->tmp,
                           strerror(errno));
    if (st != TSR_OK) remove(w->tmp);
    tsr__free(w);
    return st;
}
