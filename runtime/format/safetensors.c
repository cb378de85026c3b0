#include "runtime/format/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define TSR__ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct tsr__st_dtype_info {
    const char *name;
    size_t size;
    int tsr; /* tsr_dtype or -1 */
} tsr__st_dtype_info;

/* Every dtype of the spec, so that sizes of tensors we cannot use are still checked. */
static const tsr__st_dtype_info tsr__st_dtypes[] = {
    {"F32", 4, TSR_F32},  {"F16", 2, TSR_F16},    {"BF16", 2, TSR_BF16}, {"F64", 8, -1},
    {"I64", 8, -1},       {"U64", 8, -1},         {"I32", 4, -1},        {"U32", 4, -1},
    {"I16", 2, -1},       {"U16", 2, -1},         {"I8", 1, -1},         {"U8", 1, -1},
    {"BOOL", 1, -1},      {"F8_E4M3", 1, -1},     {"F8_E5M2", 1, -1},
};

const char *tsr_st_dtype_name(tsr_dtype t) {
    switch (t) {
    case TSR_F32: return "F32";
    case TSR_F16: return "F16";
    case TSR_BF16: return "BF16";
    case TSR_U8: return "U8";
    case TSR_Q8_0: break; /* no safetensors dtype: written as I8 + F16 scales */
    case TSR_F8_E4M3: return "F8_E4M3"; /* the codes; scales are separate tensors */
    case TSR_Q4_0:
    case TSR_Q4_1:
    case TSR_Q4_K:
    case TSR_Q5_K:
    case TSR_Q6_K:
    case TSR_MXFP4: break; /* no safetensors dtype */
    }
    return "?";
}

/* JSON number -> non-negative int64 when it is an exact integer that fits. */
static bool tsr__st_json_u64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d > 9.0e15 || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

static tsr_status tsr__st_parse_tensor(const char *path, const cJSON *e, size_t data_len,
                                       const uint8_t *data, tsr_st_tensor *t) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: header entry %s is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s lacks dtype, shape or data_offsets", path, name);
    const tsr__st_dtype_info *info = NULL;
    for (size_t i = 0; i < sizeof tsr__st_dtypes / sizeof tsr__st_dtypes[0]; i++)
        if (!strcmp(dt->valuestring, tsr__st_dtypes[i].name)) info = &tsr__st_dtypes[i];
    if (!info)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has unknown dtype \"%.16s\"", path,
                             name, dt->valuestring);
    snprintf(t->st_dtype, sizeof t->st_dtype, "%s", info->name);
    t->supported = info->tsr >= 0;
    t->dtype = info->tsr >= 0 ? (tsr_dtype)info->tsr : TSR_F32;

    int nd = cJSON_GetArraySize(shape);
    if (nd > TSR_ST_MAX_DIMS)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has %d dimensions (max %d)", path,
                             name, nd, TSR_ST_MAX_DIMS);
    t->n_dims = nd;
    uint64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        int64_t d;
        if (!tsr__st_json_u64(cJSON_GetArrayItem(shape, i), &d))
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has an invalid shape", path,
                                 name);
        t->shape[i] = d;
        /* Bounded by the file size below; a product beyond 2^62 cannot be a real tensor. */
        if (d != 0 && numel > (UINT64_C(1) << 62) / (uint64_t)d)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s shape is too large", path, name);
        numel *= (uint64_t)d;
    }
    t->numel = (int64_t)numel;

    int64_t b, en;
    if (cJSON_GetArraySize(offs) != 2 || !tsr__st_json_u64(cJSON_GetArrayItem(offs, 0), &b) ||
        !tsr__st_json_u64(cJSON_GetArrayItem(offs, 1), &en) || en < b)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has invalid data_offsets", path,
                             name);
    if ((uint64_t)en > data_len)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s data_offsets [%lld, %lld] exceed the data region "
                             "(%zu bytes)",
                             path, name, (long long)b, (long long)en, data_len);
    if (numel > (UINT64_C(1) << 62) / info->size ||
        (uint64_t)(en - b) != numel * info->size)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s has %lld bytes but its shape and dtype %s need %llu",
                             path, name, (long long)(en - b), info->name,
                             (unsigned long long)(numel * info->size));
    t->data = data + b;
    t->nbytes = (size_t)(en - b);
    t->name = tsr_strdup(name);
    if (!t->name) return TSR_ERR_NOMEM;
    return TSR_OK;
}

tsr_status tsr_st_open(const char *path, tsr_st_file **out) {
    *out = NULL;
    tsr_status st = TSR_OK;
    cJSON *root = NULL;
    tsr_st_file *f = tsr_calloc(1, sizeof *f);
    if (!f) return TSR_ERR_NOMEM;
    f->path = tsr_strdup(path);
    if (!f->path) {
        st = TSR_ERR_NOMEM;
        goto fail;
    }

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        st = tsr_error_set(TSR_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        st = tsr_error_set(TSR_ERR_FORMAT,
                           "%s: file is %zu bytes, too short for a safetensors header", path, size);
        goto fail;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        st = tsr_error_set(TSR_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        goto fail;
    }
    f->map = map;
    f->map_len = size;
    f->owns_map = true;

    const uint8_t *bytes = map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > size - 8) {
        st = tsr_error_set(TSR_ERR_FORMAT,
                           "%s: header length %llu exceeds the file size (%zu bytes); "
                           "truncated or not a safetensors file",
                           path, (unsigned long long)n, size);
        goto fail;
    }
    if (n < 2 || n > TSR__ST_MAX_HEADER) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: implausible header length %llu", path,
                           (unsigned long long)n);
        goto fail;
    }
    root = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)n);
    if (!cJSON_IsObject(root)) {
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: header is not a valid JSON object", path);
        goto fail;
    }
    const uint8_t *data = bytes + 8 + n;
    size_t data_len = size - 8 - (size_t)n;

    int count = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) count++;
    f->tensors = tsr_calloc((size_t)(count ? count : 1), sizeof *f->tensors);
    if (!f->tensors) {
        st = TSR_ERR_NOMEM;
        goto fail;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        st = tsr__st_parse_tensor(path, e, data_len, data, &f->tensors[f->n_tensors]);
        if (st != TSR_OK) goto fail;
        f->n_tensors++;
    }
    cJSON_Delete(root);
    *out = f;
    return TSR_OK;

fail:
    cJSON_Delete(root);
    tsr_st_close(f);
    return st;
}

const tsr_st_tensor *tsr_st_find(const tsr_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

void tsr_st_take_map(tsr_st_file *f, void **addr, size_t *len) {
    *addr = f->map;
    *len = f->map_len;
    f->owns_map = false;
}

void tsr_st_close(tsr_st_file *f) {
    if (!f) return;
    if (f->owns_map && f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n_tensors; i++) tsr_free(f->tensors[i].name);
    tsr_free(f->tensors);
    tsr_free(f->path);
    tsr_free(f);
}

/* ---- writer ---------------------------------------------------------------------------- */

struct tsr_st_writer {
    FILE *fp;
    char *path;
    uint64_t expected; /* data bytes declared in the header */
    uint64_t written;
};

tsr_status tsr_st_writer_open(const char *path, const tsr_st_entry *entries, int n,
                              tsr_st_writer **out) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!root || !meta || !cJSON_AddStringToObject(meta, "format", "pt")) {
        cJSON_Delete(root);
        return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const tsr_st_entry *e = &entries[i];
        uint64_t numel = 1;
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!shape || !offs || !cJSON_AddStringToObject(t, "dtype", tsr_st_dtype_name(e->dtype))) {
            cJSON_Delete(root);
            return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory building the header", path);
        }
        for (int d = 0; d < e->n_dims; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
            numel *= (uint64_t)e->shape[d];
        }
        uint64_t bytes = numel * tsr_dtype_size(e->dtype);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory building the header", path);
    /* Pad with spaces so that the data region starts 8-byte aligned (the spec's convention),
     * which keeps every f32 view aligned when tensors are laid out largest dtype first. */
    size_t jlen = strlen(json), padded = (jlen + 7) & ~(size_t)7;

    tsr_status st = TSR_OK;
    tsr_st_writer *w = tsr_calloc(1, sizeof *w);
    if (!w || !(w->path = tsr_strdup(path))) {
        st = TSR_ERR_NOMEM;
        goto fail;
    }
    w->expected = off;
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto fail;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (fwrite(len8, 1, 8, w->fp) != 8 || fwrite(json, 1, jlen, w->fp) != jlen) {
        st = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto fail;
    }
    for (size_t i = jlen; i < padded; i++) {
        if (fputc(' ', w->fp) == EOF) {
            st = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            goto fail;
        }
    }
    cJSON_free(json);
    *out = w;
    return TSR_OK;

fail:
    cJSON_free(json);
    tsr_st_writer_abort(w);
    return st;
}

tsr_status tsr_st_writer_write(tsr_st_writer *w, const void *data, size_t bytes) {
    if (w->written + bytes > w->expected)
        return tsr_error_set(TSR_ERR_INTERNAL, "%s: more data written than the header declares",
                             w->path);
    if (bytes && fwrite(data, 1, bytes, w->fp) != bytes)
        return tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->written += bytes;
    return TSR_OK;
}

tsr_status tsr_st_writer_close(tsr_st_writer *w) {
    tsr_status st = TSR_OK;
    if (w->written != w->expected) {
        st = tsr_error_set(TSR_ERR_INTERNAL, "%s: %llu of %llu data bytes written", w->path,
                           (unsigned long long)w->written, (unsigned long long)w->expected);
    } else if (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0) {
        st = tsr_error_set(TSR_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    if (st != TSR_OK) {
        tsr_st_writer_abort(w);
        return st;
    }
    int rc = fclose(w->fp);
    w->fp = NULL;
    if (rc != 0) {
        st = tsr_error_set(TSR_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
        remove(w->path);
    }
    tsr_free(w->path);
    tsr_free(w);
    return st;
}

void tsr_st_writer_abort(tsr_st_writer *w) {
    if (!w) return;
    if (w->fp) {
        fclose(w->fp);
        remove(w->path);
    }
    tsr_free(w->path);
    tsr_free(w);
}

tsr_status tsr_st_write_file(const char *path, const tsr_st_entry *entries,
                             const void *const *datas, int n) {
    tsr_st_writer *w;
    TSR_TRY(tsr_st_writer_open(path, entries, n, &w));
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < entries[i].n_dims; d++) numel *= (size_t)entries[i].shape[d];
        tsr_status st = tsr_st_writer_write(w, datas[i], numel * tsr_dtype_size(entries[i].dtype));
        if (st != TSR_OK) {
            tsr_st_writer_abort(w);
            return st;
        }
    }
    return tsr_st_writer_close(w);
}
