/* GGUF parsing and dequantization (layout: llama.cpp's docs/gguf.md and ggml-common.h block
 * definitions). Every read goes through a cursor that checks the bytes left first. */
#include "runtime/format/gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

#define TSR__GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define TSR__MAX_DIMS 4
/* Keys and tensor names longer than this are refused (llama.cpp caps names at 64). */
#define TSR__MAX_NAME 65536

typedef struct tsr__cur {
    const uint8_t *p;
    size_t left;
    const char *path;
} tsr__cur;

static tsr_status tsr__short(const tsr__cur *c, const char *what) {
    return tsr_error_set(TSR_ERR_FORMAT, "%s: truncated GGUF file (reading %s)", c->path, what);
}

static tsr_status tsr__take(tsr__cur *c, size_t n, const char *what, const uint8_t **out) {
    if (n > c->left) return tsr__short(c, what);
    *out = c->p;
    c->p += n;
    c->left -= n;
    return TSR_OK;
}

static tsr_status tsr__u32(tsr__cur *c, const char *what, uint32_t *v) {
    const uint8_t *p = NULL;
    TSR_TRY(tsr__take(c, 4, what, &p));
    memcpy(v, p, 4);
    return TSR_OK;
}

static tsr_status tsr__u64(tsr__cur *c, const char *what, uint64_t *v) {
    const uint8_t *p = NULL;
    TSR_TRY(tsr__take(c, 8, what, &p));
    memcpy(v, p, 8);
    return TSR_OK;
}

/* A GGUF string: u64 length then bytes (no NUL). */
static tsr_status tsr__str(tsr__cur *c, const char *what, const uint8_t **s, uint64_t *len) {
    TSR_TRY(tsr__u64(c, what, len));
    if (*len > c->left) return tsr__short(c, what);
    return tsr__take(c, (size_t)*len, what, s);
}

static char *tsr__dup(const uint8_t *s, uint64_t len) {
    char *d = tsr_malloc((size_t)len + 1);
    if (!d) return NULL;
    memcpy(d, s, (size_t)len);
    d[len] = '\0';
    return d;
}

static size_t tsr__scalar_size(uint32_t t) {
    switch (t) {
    case TSR_GGUF_U8: case TSR_GGUF_I8: case TSR_GGUF_BOOL: return 1;
    case TSR_GGUF_U16: case TSR_GGUF_I16: return 2;
    case TSR_GGUF_U32: case TSR_GGUF_I32: case TSR_GGUF_F32: return 4;
    case TSR_GGUF_U64: case TSR_GGUF_I64: case TSR_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Skips (validates) one value of type t; depth bounds nested arrays. */
static tsr_status tsr__skip_value(tsr__cur *c, uint32_t t, const char *key, int depth) {
    const uint8_t *p;
    size_t sz = tsr__scalar_size(t);
    if (sz) return tsr__take(c, sz, key, &p);
    if (t == TSR_GGUF_STRING) {
        uint64_t len;
        return tsr__str(c, key, &p, &len);
    }
    if (t != TSR_GGUF_ARRAY)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: metadata %s has unknown type %u", c->path, key,
                             t);
    if (depth > 4)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: metadata %s nests arrays too deeply",
                             c->path, key);
    uint32_t et;
    uint64_t n;
    TSR_TRY(tsr__u32(c, key, &et));
    TSR_TRY(tsr__u64(c, key, &n));
    size_t esz = tsr__scalar_size(et);
    if (esz) {
        if (n > c->left / esz) return tsr__short(c, key);
        return tsr__take(c, (size_t)n * esz, key, &p);
    }
    /* Strings and arrays take at least 8 bytes each: a huge count fails here, not later. */
    if (n > c->left / 8) return tsr__short(c, key);
    for (uint64_t i = 0; i < n; i++) TSR_TRY(tsr__skip_value(c, et, key, depth + 1));
    return TSR_OK;
}

static tsr_status tsr__parse_kv(tsr_gguf *g, tsr__cur *c, tsr_gguf_kv *kv) {
    const uint8_t *ks;
    uint64_t klen;
    TSR_TRY(tsr__str(c, "a metadata key", &ks, &klen));
    if (klen == 0 || klen > TSR__MAX_NAME || memchr(ks, 0, (size_t)klen))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid metadata key", g->path);
    kv->key = tsr__dup(ks, klen);
    if (!kv->key) return TSR_ERR_NOMEM;
    uint32_t t;
    TSR_TRY(tsr__u32(c, kv->key, &t));
    kv->type = (tsr_gguf_vtype)t;
    kv->n = 1;
    kv->data = c->p;
    if (t == TSR_GGUF_STRING) {
        const uint8_t *s;
        TSR_TRY(tsr__str(c, kv->key, &s, &kv->str_len));
        kv->str = tsr__dup(s, kv->str_len);
        return kv->str ? TSR_OK : TSR_ERR_NOMEM;
    }
    if (t != TSR_GGUF_ARRAY) return tsr__skip_value(c, t, kv->key, 0);
    uint32_t et;
    TSR_TRY(tsr__u32(c, kv->key, &et));
    TSR_TRY(tsr__u64(c, kv->key, &kv->n));
    kv->elem = (tsr_gguf_vtype)et;
    kv->data = c->p;
    size_t esz = tsr__scalar_size(et);
    if (esz) {
        if (kv->n > c->left / esz) return tsr__short(c, kv->key);
        const uint8_t *p;
        return tsr__take(c, (size_t)kv->n * esz, kv->key, &p);
    }
    if (et != TSR_GGUF_STRING && et != TSR_GGUF_ARRAY)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: metadata %s has unknown element type %u",
                             g->path, kv->key, et);
    if (kv->n > c->left / 8) return tsr__short(c, kv->key);
    if (et == TSR_GGUF_STRING) {
        kv->str_off = tsr_malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_off);
        if (!kv->str_off) return TSR_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < kv->n; i++) {
        if (kv->str_off) kv->str_off[i] = (uint64_t)(c->p - kv->data);
        TSR_TRY(tsr__skip_value(c, et, kv->key, 1));
    }
    return TSR_OK;
}

const int8_t tsr_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

/* Block size (elements) and bytes per block; 0 for a type tessera does not know. */
static void tsr__type_layout(uint32_t t, int64_t *blk, size_t *bytes) {
    static const struct { uint32_t t; int blk; size_t bytes; } tab[] = {
        {TSR_GGML_F32, 1, 4},     {TSR_GGML_F16, 1, 2},     {TSR_GGML_Q4_0, 32, 18},
        {TSR_GGML_Q4_1, 32, 20},  {TSR_GGML_Q5_0, 32, 22},  {TSR_GGML_Q5_1, 32, 24},
        {TSR_GGML_Q8_0, 32, 34},  {TSR_GGML_Q8_1, 32, 36},  {TSR_GGML_Q2_K, 256, 84},
        {TSR_GGML_Q3_K, 256, 110}, {TSR_GGML_Q4_K, 256, 144}, {TSR_GGML_Q5_K, 256, 176},
        {TSR_GGML_Q6_K, 256, 210}, {TSR_GGML_Q8_K, 256, 292}, {TSR_GGML_I8, 1, 1},
        {TSR_GGML_I16, 1, 2},     {TSR_GGML_I32, 1, 4},     {TSR_GGML_I64, 1, 8},
        {TSR_GGML_F64, 1, 8},     {TSR_GGML_BF16, 1, 2},    {TSR_GGML_IQ4_NL, 32, 18},
        {TSR_GGML_IQ4_XS, 256, 136},
    };
    *blk = 0;
    *bytes = 0;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (tab[i].t == t) {
            *blk = tab[i].blk;
            *bytes = tab[i].bytes;
        }
}

const char *tsr_gguf_type_name(uint32_t t) {
    switch (t) {
    case TSR_GGML_F32: return "F32";
    case TSR_GGML_F16: return "F16";
    case TSR_GGML_Q4_0: return "Q4_0";
    case TSR_GGML_Q4_1: return "Q4_1";
    case TSR_GGML_Q5_0: return "Q5_0";
    case TSR_GGML_Q5_1: return "Q5_1";
    case TSR_GGML_Q8_0: return "Q8_0";
    case TSR_GGML_Q8_1: return "Q8_1";
    case TSR_GGML_Q2_K: return "Q2_K";
    case TSR_GGML_Q3_K: return "Q3_K";
    case TSR_GGML_Q4_K: return "Q4_K";
    case TSR_GGML_Q5_K: return "Q5_K";
    case TSR_GGML_Q6_K: return "Q6_K";
    case TSR_GGML_Q8_K: return "Q8_K";
    case TSR_GGML_IQ4_NL: return "IQ4_NL";
    case TSR_GGML_IQ4_XS: return "IQ4_XS";
    case TSR_GGML_I8: return "I8";
    case TSR_GGML_I16: return "I16";
    case TSR_GGML_I32: return "I32";
    case TSR_GGML_I64: return "I64";
    case TSR_GGML_F64: return "F64";
    case TSR_GGML_BF16: return "BF16";
    default: return "unknown";
    }
}

const char *tsr_gguf_file_type_name(int64_t ftype) {
    static const char *const names[] = {
        [0] = "F32",      [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",
        [8] = "Q5_0",     [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S", [12] = "Q3_K_M",
        [13] = "Q3_K_L",  [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",
        [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S", [22] = "IQ3_XS",
        [23] = "IQ3_XXS", [24] = "IQ1_S",  [25] = "IQ4_NL", [26] = "IQ3_S",  [27] = "IQ3_M",
        [28] = "IQ2_S",   [29] = "IQ2_M",  [30] = "IQ4_XS", [31] = "IQ1_M",  [32] = "BF16",
        [36] = "TQ1_0",   [37] = "TQ2_0",  [38] = "MXFP4_MOE",
    };
    if (ftype < 0) return NULL;
    ftype &= ~(int64_t)1024;
    if (ftype >= (int64_t)(sizeof names / sizeof names[0])) return NULL;
    return names[ftype];
}

bool tsr_gguf_type_supported(uint32_t t) {
    return t == TSR_GGML_F32 || t == TSR_GGML_F16 || t == TSR_GGML_BF16 || t == TSR_GGML_Q8_0 ||
           t == TSR_GGML_Q4_0 || t == TSR_GGML_Q4_1 || t == TSR_GGML_Q4_K ||
           t == TSR_GGML_Q5_0 || t == TSR_GGML_Q5_1 || t == TSR_GGML_Q5_K || t == TSR_GGML_Q6_K ||
           t == TSR_GGML_Q3_K || t == TSR_GGML_IQ4_NL;
}

static tsr_status tsr__parse_tensor(tsr_gguf *g, tsr__cur *c, tsr_gguf_tensor *t) {
    const uint8_t *ns;
    uint64_t nlen;
    TSR_TRY(tsr__str(c, "a tensor name", &ns, &nlen));
    if (nlen == 0 || nlen > TSR__MAX_NAME || memchr(ns, 0, (size_t)nlen))
        return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid tensor name", g->path);
    t->name = tsr__dup(ns, nlen);
    if (!t->name) return TSR_ERR_NOMEM;
    uint32_t nd;
    TSR_TRY(tsr__u32(c, t->name, &nd));
    if (nd < 1 || nd > TSR__MAX_DIMS)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has %u dimensions (1 to 4 allowed)",
                             g->path, t->name, nd);
    t->n_dims = (int)nd;
    /* Products stay below 2^62: each dimension and the running product are bounded. */
    int64_t numel = 1;
    for (int i = 0; i < TSR__MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d;
        TSR_TRY(tsr__u64(c, t->name, &d));
        if (d == 0 || d > ((uint64_t)1 << 40) || (uint64_t)numel > ((uint64_t)1 << 62) / d)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has invalid dimension %llu",
                                 g->path, t->name, (unsigned long long)d);
        t->ne[i] = (int64_t)d;
        numel *= (int64_t)d;
    }
    t->numel = numel;
    TSR_TRY(tsr__u32(c, t->name, &t->type));
    TSR_TRY(tsr__u64(c, t->name, &t->offset));
    int64_t blk;
    size_t bb;
    tsr__type_layout(t->type, &blk, &bb);
    if (!blk)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor %s has unknown type %u", g->path,
                             t->name, t->type);
    if (t->ne[0] % blk)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: tensor %s: row length %lld is not a multiple of %s's block "
                             "of %lld", g->path, t->name, (long long)t->ne[0],
                             tsr_gguf_type_name(t->type), (long long)blk);
    t->nbytes = (uint64_t)(numel / blk) * bb; /* numel < 2^62, bb <= 292: fits */
    return TSR_OK;
}

static tsr_status tsr__parse(tsr_gguf *g) {
    tsr__cur c = {g->base, g->size, g->path};
    uint32_t magic;
    TSR_TRY(tsr__u32(&c, "the magic", &magic));
    if (magic != TSR__GGUF_MAGIC)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->path);
    TSR_TRY(tsr__u32(&c, "the version", &g->version));
    if (g->version != 2 && g->version != 3)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: GGUF version %u (tessera reads versions 2 and 3)", g->path,
                             g->version);
    /* g->n_kv/n_tensors count what is parsed so far, so close frees only that. */
    uint64_t n_kv, n_t;
    TSR_TRY(tsr__u64(&c, "the tensor count", &n_t));
    TSR_TRY(tsr__u64(&c, "the metadata count", &n_kv));
    /* A key/value takes at least 13 bytes and a tensor info 28: counts beyond what the file
     * could hold are refused before anything is allocated from them. */
    if (n_kv > c.left / 13 || n_t > c.left / 28)
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: header claims %llu metadata entries and %llu tensors, more "
                             "than the file holds", g->path, (unsigned long long)n_kv,
                             (unsigned long long)n_t);
    g->kv = tsr_calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kv);
    g->tensors = tsr_calloc((size_t)(n_t ? n_t : 1), sizeof *g->tensors);
    if (!g->kv || !g->tensors) return TSR_ERR_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv++;
        TSR_TRY(tsr__parse_kv(g, &c, &g->kv[i]));
    }
    g->alignment = 32;
    const tsr_gguf_kv *al = tsr_gguf_find(g, "general.alignment");
    if (al) {
        int64_t a;
        TSR_TRY(tsr_gguf_get_int(g, "general.alignment", &a, NULL));
        if (a <= 0 || a > (1 << 20) || (a & (a - 1)))
            return tsr_error_set(TSR_ERR_FORMAT,
                                 "%s: general.alignment %lld is not a power of two", g->path,
                                 (long long)a);
        g->alignment = (uint64_t)a;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        g->n_tensors++;
        TSR_TRY(tsr__parse_tensor(g, &c, &g->tensors[i]));
    }
    uint64_t pos = (uint64_t)(c.p - g->base);
    uint64_t data_start = (pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tsr_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return tsr_error_set(TSR_ERR_FORMAT,
                                 "%s: tensor %s offset %llu is not aligned to %llu", g->path,
                                 t->name, (unsigned long long)t->offset,
                                 (unsigned long long)g->alignment);
        if (data_start > g->size || t->offset > g->size - data_start ||
            t->nbytes > g->size - data_start - t->offset)
            return tsr_error_set(TSR_ERR_FORMAT,
                                 "%s: tensor %s (%llu bytes at offset %llu) runs past the end "
                                 "of the file (%zu bytes)", g->path, t->name,
                                 (unsigned long long)t->nbytes,
                                 (unsigned long long)(data_start + t->offset), g->size);
        t->data = g->base + data_start + t->offset;
    }
    return TSR_OK;
}

bool tsr_gguf_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char b[4] = {0};
    size_t n = fread(b, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(b, "GGUF", 4);
}

static tsr_status tsr__open_common(tsr_gguf *g, tsr_gguf **out) {
    tsr_status st = g->path ? tsr__parse(g) : TSR_ERR_NOMEM;
    if (st != TSR_OK) {
        tsr_gguf_close(g);
        return st;
    }
    *out = g;
    return TSR_OK;
}

tsr_status tsr_gguf_open_mem(const void *data, size_t size, const char *name, tsr_gguf **out) {
    *out = NULL;
    tsr_gguf *g = tsr_calloc(1, sizeof *g);
    if (!g) return TSR_ERR_NOMEM;
    g->path = tsr_strdup(name ? name : "(memory)");
    g->base = data;
    g->size = size;
    return tsr__open_common(g, out);
}

tsr_status tsr_gguf_open(const char *path, tsr_gguf **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tsr_error_set(TSR_ERR_IO, "%s: cannot open GGUF file", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tsr_error_set(TSR_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 24) {
        close(fd);
        return tsr_error_set(TSR_ERR_FORMAT, "%s: truncated GGUF file (%lld bytes)", path,
                             (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return tsr_error_set(TSR_ERR_IO, "%s: cannot map the file", path);
    tsr_gguf *g = tsr_calloc(1, sizeof *g);
    if (!g) {
        munmap(map, (size_t)sb.st_size);
        return TSR_ERR_NOMEM;
    }
    g->path = tsr_strdup(path);
    g->base = map;
    g->size = (size_t)sb.st_size;
    g->mapped = true;
    return tsr__open_common(g, out);
}

void tsr_gguf_close(tsr_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        tsr_free(g->kv[i].key);
        tsr_free(g->kv[i].str);
        tsr_free(g->kv[i].str_off);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) tsr_free(g->tensors[i].name);
    tsr_free(g->kv);
    tsr_free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    tsr_free(g->path);
    tsr_free(g);
}

const tsr_gguf_kv *tsr_gguf_find(const tsr_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const tsr_gguf_tensor *tsr_gguf_tensor_find(const tsr_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name && !strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* Integer value of a scalar of type t at p; false when t is not an integer type. */
static bool tsr__int_at(uint32_t t, const uint8_t *p, int64_t *v) {
    switch (t) {
    case TSR_GGUF_U8: *v = p[0]; return true;
    case TSR_GGUF_I8: *v = (int8_t)p[0]; return true;
    case TSR_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case TSR_GGUF_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case TSR_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case TSR_GGUF_I32: { int32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case TSR_GGUF_U64: {
        uint64_t x;
        memcpy(&x, p, 8);
        *v = x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x; /* saturates: range checks fail */
        return true;
    }
    case TSR_GGUF_I64: memcpy(v, p, 8); return true;
    default: return false;
    }
}

static tsr_status tsr__lookup(const tsr_gguf *g, const char *key, bool *present,
                              const tsr_gguf_kv **kv) {
    *kv = tsr_gguf_find(g, key);
    if (present) *present = *kv != NULL;
    if (!*kv && !present)
        return tsr_error_set(TSR_ERR_FORMAT, "%s: missing metadata %s", g->path, key);
    return TSR_OK;
}

static tsr_status tsr__kind(const tsr_gguf *g, const char *key, const char *kind) {
    return tsr_error_set(TSR_ERR_FORMAT, "%s: metadata %s is not %s", g->path, key, kind);
}

tsr_status tsr_gguf_get_int(const tsr_gguf *g, const char *key, int64_t *out, bool *present) {
    const tsr_gguf_kv *kv;
    TSR_TRY(tsr__lookup(g, key, present, &kv));
    if (!kv) return TSR_OK;
    if (kv->type == TSR_GGUF_ARRAY || !tsr__int_at(kv->type, kv->data, out))
        return tsr__kind(g, key, "an integer");
    return TSR_OK;
}

tsr_status tsr_gguf_get_float(const tsr_gguf *g, const char *key, double *out,
                              bool *present) {
    const tsr_gguf_kv *kv;
    TSR_TRY(tsr__lookup(g, key, present, &kv));
    if (!kv) return TSR_OK;
    int64_t i;
    if (kv->type == TSR_GGUF_F32) {
        float f;
        memcpy(&f, kv->data, 4);
        *out = f;
    } else if (kv->type == TSR_GGUF_F64) {
        memcpy(out, kv->data, 8);
    } else if (kv->type != TSR_GGUF_ARRAY && tsr__int_at(kv->type, kv->data, &i)) {
        *out = (double)i;
    } else {
        return tsr__kind(g, key, "a number");
    }
    if (!(*out == *out) || *out > 1e300 || *out < -1e300) return tsr__kind(g, key, "finite");
    return TSR_OK;
}

tsr_status tsr_gguf_get_bool(const tsr_gguf *g, const char *key, bool *out, bool *present) {
    const tsr_gguf_kv *kv;
    TSR_TRY(tsr__lookup(g, key, present, &kv));
    if (!kv) return TSR_OK;
    if (kv->type != TSR_GGUF_BOOL) return tsr__kind(g, key, "a bool");
    *out = kv->data[0] != 0;
    return TSR_OK;
}

tsr_status tsr_gguf_get_str(const tsr_gguf *g, const char *key, const char **out,
                            bool *present) {
    const tsr_gguf_kv *kv;
    TSR_TRY(tsr__lookup(g, key, present, &kv));
    if (!kv) return TSR_OK;
    if (kv->type != TSR_GGUF_STRING) return tsr__kind(g, key, "a string");
    *out = kv->str;
    return TSR_OK;
}

void tsr_gguf_arr_str(const tsr_gguf_kv *kv, uint64_t i, const char **s, uint64_t *len) {
    const uint8_t *p = kv->data + kv->str_off[i];
    memcpy(len, p, 8);
    *s = (const char *)p + 8;
}

int64_t tsr_gguf_arr_int(const tsr_gguf_kv *kv, uint64_t i) {
    int64_t v = 0;
    size_t sz = tsr__scalar_size(kv->elem);
    if (sz && kv->elem != TSR_GGUF_F32 && kv->elem != TSR_GGUF_F64)
        (void)tsr__int_at(kv->elem, kv->data + i * sz, &v);
    return v;
}

/* ---- dequantization --------------------------------------------------------------------- */

static float tsr__h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tsr_f16_to_f32(h);
}

/* llama.cpp's get_scale_min_k4: 6-bit scale and min j of a K-quant super-block. */
static void tsr__scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Dequantizes one block of type t at b into y (block-size floats). */
static void tsr__block(uint32_t t, const uint8_t *b, float *y) {
    switch (t) {
    case TSR_GGML_Q8_0: {
        float d = tsr__h(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
        break;
    }
    case TSR_GGML_Q4_0: {
        float d = tsr__h(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case TSR_GGML_Q4_1: {
        float d = tsr__h(b), m = tsr__h(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0xF) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case TSR_GGML_Q5_0:
    case TSR_GGML_Q5_1: {
        /* d (q - 16), resp. d q + m; the fifth bits of columns j and j + 16 are bits j and
         * j + 16 of the little-endian qh */
        bool q51 = t == TSR_GGML_Q5_1;
        float d = tsr__h(b), m = q51 ? tsr__h(b + 2) : 0.0f;
        const uint8_t *qh = b + (q51 ? 4 : 2), *qs = qh + 4;
        uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                     (uint32_t)qh[3] << 24;
        for (int j = 0; j < 16; j++) {
            int q0 = (qs[j] & 0xF) | (int)(h >> j & 1) << 4;
            int q1 = (qs[j] >> 4) | (int)(h >> (j + 16) & 1) << 4;
            y[j] = q51 ? d * (float)q0 + m : d * (float)(q0 - 16);
            y[j + 16] = q51 ? d * (float)q1 + m : d * (float)(q1 - 16);
        }
        break;
    }
    case TSR_GGML_Q4_K: {
        float d = tsr__h(b), dmin = tsr__h(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
            uint8_t s1, m1, s2, m2;
            tsr__scale_min_k4(is, sc, &s1, &m1);
            tsr__scale_min_k4(is + 1, sc, &s2, &m2);
            float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
            for (int l = 0; l < 32; l++) y[j + l] = d1 * (float)(q[l] & 0xF) - mm1;
            for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * (float)(q[l] >> 4) - mm2;
        }
        break;
    }
    case TSR_GGML_Q5_K: {
        float d = tsr__h(b), dmin = tsr__h(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
            uint8_t s1, m1, s2, m2;
            tsr__scale_min_k4(is, sc, &s1, &m1);
            tsr__scale_min_k4(is + 1, sc, &s2, &m2);
            float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
            for (int l = 0; l < 32; l++)
                y[j + l] = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - mm1;
            for (int l = 0; l < 32; l++)
                y[j + 32 + l] = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - mm2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
        break;
    }
    case TSR_GGML_Q3_K: {
        /* hmask[32], qs[64], 12 bytes of 16 6-bit scales, fp16 d; column c = 128 h + 32 s +
         * l: low 2 bits at bit 2 s of qs[32 h + l], bit 4 h + s of hmask[l] clear means
         * minus 4; sub-block c / 16's scale j: low 4 bits from byte j % 8 (nibble j / 8),
         * high 2 bits at bit 2 (j / 4) of byte 8 + j % 4, minus 32 */
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        float d = tsr__h(b + 108);
        for (int c = 0; c < 256; c++) {
            int h = c / 128, s = c / 32 % 4, l = c % 32, j = c / 16;
            int lo = sc[j % 8] >> (4 * (j / 8)) & 15, hi = sc[8 + j % 4] >> (2 * (j / 4)) & 3;
            float dl = d * (float)((lo | hi << 4) - 32);
            int q = (qs[32 * h + l] >> (2 * s) & 3) - (hm[l] >> (4 * h + s) & 1 ? 0 : 4);
            y[c] = dl * (float)q;
        }
        break;
    }
    case TSR_GGML_IQ4_NL: {
        float d = tsr__h(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)tsr_iq4nl_values[b[2 + j] & 15];
            y[j + 16] = d * (float)tsr_iq4nl_values[b[2 + j] >> 4];
        }
        break;
    }
    case TSR_GGML_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = tsr__h(b + 208);
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[n + l] = d * (float)sc[is] * (float)q1;
                y[n + l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[n + l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[n + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
        break;
    }
    case TSR_GGML_F16: y[0] = tsr__h(b); break;
    case TSR_GGML_BF16: {
        uint16_t h;
        memcpy(&h, b, 2);
        y[0] = tsr_bf16_to_f32(h);
        break;
    }
    default: memcpy(y, b, 4); break; /* F32 */
    }
}

tsr_status tsr_gguf_dequant(const tsr_gguf *g, const tsr_gguf_tensor *t, tsr_dtype dt,
                            void *dst) {
    if (!tsr_gguf_type_supported(t->type))
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "%s: tensor %s has type %s (tessera reads F32, F16, BF16, Q8_0, "
                             "Q4_0, Q4_1, Q3_K, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, IQ4_NL)",
                             g->path, t->name, tsr_gguf_type_name(t->type));
    int64_t blk;
    size_t bb;
    tsr__type_layout(t->type, &blk, &bb);
    uint8_t *d = dst;
    size_t osz = tsr_dtype_size(dt);
    float y[256];
    int64_t nblk = t->numel / blk;
    for (int64_t i = 0; i < nblk; i++) {
        tsr__block(t->type, t->data + (size_t)i * bb, y);
        uint8_t *o = d + (size_t)(i * blk) * osz;
        for (int64_t j = 0; j < blk; j++) {
            if (dt == TSR_F32) {
                memcpy(o + j * 4, &y[j], 4);
            } else {
                uint16_t h = dt == TSR_BF16 ? tsr_f32_to_bf16(y[j]) : tsr_f32_to_f16(y[j]);
                memcpy(o + j * 2, &h, 2);
            }
        }
    }
    return TSR_OK;
}

/* ---- chat template ------------------------------------------------------------------------ */

/* Text of token `key`'s id from tokenizer.ggml.tokens, or NULL. */
static tsr_status tsr__token_text(const tsr_gguf *g, const char *key, char **out) {
    *out = NULL;
    int64_t id;
    bool have;
    TSR_TRY(tsr_gguf_get_int(g, key, &id, &have));
    const tsr_gguf_kv *toks = tsr_gguf_find(g, "tokenizer.ggml.tokens");
    if (!have || !toks || toks->type != TSR_GGUF_ARRAY || toks->elem != TSR_GGUF_STRING ||
        id < 0 || (uint64_t)id >= toks->n)
        return TSR_OK;
    const char *s;
    uint64_t len;
    tsr_gguf_arr_str(toks, (uint64_t)id, &s, &len);
    *out = tsr__dup((const uint8_t *)s, len);
    return *out ? TSR_OK : TSR_ERR_NOMEM;
}

tsr_status tsr_gguf_chat_template(const char *path, char **tpl, char **bos, char **eos) {
    *tpl = *bos = *eos = NULL;
    tsr_gguf *g;
    TSR_TRY(tsr_gguf_open(path, &g));
    const char *t = NULL;
    bool have = false;
    tsr_status st = tsr_gguf_get_str(g, "tokenizer.chat_template", &t, &have);
    if (st == TSR_OK && have) {
        *tpl = tsr_strdup(t);
        if (!*tpl) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK) st = tsr__token_text(g, "tokenizer.ggml.bos_token_id", bos);
    if (st == TSR_OK) st = tsr__token_text(g, "tokenizer.ggml.eos_token_id", eos);
    tsr_gguf_close(g);
    if (st != TSR_OK) {
        tsr_free(*tpl);
        tsr_free(*bos);
        tsr_free(*eos);
        *tpl = *bos = *eos = NULL;
    }
    return st;
}
