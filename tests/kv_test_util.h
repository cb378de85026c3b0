/* Helpers of the KV tests: every KV test runs once per backend of {"cpu", "cpu-fenced"}
 * (a backend whose create answers TSR_ERR_UNSUPPORTED is skipped with a note), and reads
 * K/V only through gathers and downloads, so that it is device-correct: on the fenced
 * device a host read of backend memory faults. The forward-pass tests (TSR_KV_FWD_TEST)
 * also get the model's weights in backend memory, through the engine. */
#ifndef TSR_TESTS_KV_TEST_UTIL_H
#define TSR_TESTS_KV_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "base/status.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "tests/test.h"

static const char *const kvt_names[] = {"cpu", "cpu-fenced"};
/* The KV storage dtype of the caches a test makes (TSR_TEST_KV_DTYPE, as --kv-dtype names
 * it; unset: f32): tests/CMakeLists.txt runs the KV tests again with bf16. */
static inline const char *kvt_dtype_name(void) { return getenv("TSR_TEST_KV_DTYPE"); }
static inline int kvt_dtype(void) {
    int d = tsr_kv_dtype_parse(kvt_dtype_name());
    return d < 0 ? TSR_KV_F32 : d;
}

/* x as the KV dtype stores it (bf16: rounded; f32 and the 8-bit dtypes, whose rounding
 * depends on the row: x), so that test values can be chosen exact. */
static inline float kvt_round(float x) {
    return kvt_dtype() == TSR_KV_BF16 ? tsr_bf16_to_f32(tsr_f32_to_bf16(x)) : x;
}

/* The backend of the round in progress. */
static tsr_backend *kvt_be;

/* Opens backend b for a round; false (with a note, or a failure) when it cannot run. */
static inline int kvt_open(int b) {
    kvt_be = NULL;
    tsr_status st = tsr_backend_create(kvt_names[b], 1, &kvt_be);
    if (st == TSR_ERR_UNSUPPORTED) {
        fprintf(stderr, "  skip %s: %s\n", kvt_names[b], tsr_last_error());
        return 0;
    }
    if (st != TSR_OK) {
        fprintf(stderr, "  %s: backend create failed: %s\n", kvt_names[b], tsr_last_error());
        tsr_test_failed_flag = 1;
        return 0;
    }
    return 1;
}

static inline void kvt_close(void) {
    tsr_backend_destroy(kvt_be);
    kvt_be = NULL;
}

/* The engine of a forward-pass round (TSR_KV_FWD_TEST): stories260K with its weights
 * placed in kvt_be's memory, which a forward on cpu-fenced needs. Hand kvt_eng->weights to
 * tsr_forward_create, never kvt_eng->model (host tensors, views of the file). */
static tsr_engine *kvt_eng;

/* Opens backend b for a forward-pass round: kvt_eng owns the model and kvt_be. The
 * engine's own cache and forward go unused (each test builds its caches on kvt_be and its
 * forwards over kvt_eng->weights), so they are the smallest the engine makes. */
static inline int kvt_open_engine(int b) {
    kvt_be = NULL;
    kvt_eng = NULL;
    tsr_model *m = NULL;
    tsr_status st = tsr_model_load(TSR_SOURCE_DIR "/models/stories260K.bin", &m);
    tsr_engine_spec eo = {.backend = kvt_names[b], .threads = 1, .max_tokens = 1,
                             .kv = {.max_seqs = 1}, .dense_kv_tokens = 1};
    eo.model = m;
    if (st == TSR_OK) st = tsr_engine_create(&eo, &kvt_eng);
    if (st == TSR_ERR_UNSUPPORTED) {
        fprintf(stderr, "  skip %s: %s\n", kvt_names[b], tsr_last_error());
        return 0;
    }
    if (st != TSR_OK) {
        fprintf(stderr, "  %s: engine create failed: %s\n", kvt_names[b], tsr_last_error());
        tsr_test_failed_flag = 1;
        return 0;
    }
    kvt_be = kvt_eng->be;
    return 1;
}

static inline void kvt_close_engine(void) {
    tsr_engine_destroy(kvt_eng);
    kvt_eng = NULL;
    kvt_be = NULL;
}

/* The rounds of one test: body runs once per backend that `open` opened, and `close` runs
 * after it, also when an assert left it early. */
#define TSR__KV_ROUNDS(name, open, close)                                               \
    static void name##_on(void);                                                        \
    TSR_TEST(name) {                                                                    \
        for (int b_ = 0; b_ < (int)(sizeof kvt_names / sizeof kvt_names[0]); b_++) {    \
            if (!open(b_)) continue;                                                    \
            int failed_ = tsr_test_failed_flag;                                         \
            tsr_test_failed_flag = 0;                                                   \
            name##_on();                                                                \
            if (tsr_test_failed_flag) fprintf(stderr, "  (on %s)\n", kvt_names[b_]);    \
            tsr_test_failed_flag |= failed_;                                            \
            close();                                                                    \
        }                                                                               \
    }                                                                                   \
    static void name##_on(void)

/* TSR_KV_TEST(name) { body }: body runs once per backend with kvt_be set; the backend
 * is destroyed after the body, also when an assert left it early. */
#define TSR_KV_TEST(name) TSR__KV_ROUNDS(name, kvt_open, kvt_close)

/* TSR_KV_FWD_TEST(name) { body }: the same for a test that runs the forward pass, with
 * kvt_eng (stories260K placed on kvt_be) set as well. */
#define TSR_KV_FWD_TEST(name) TSR__KV_ROUNDS(name, kvt_open_engine, kvt_close_engine)

/* A backend copy of n host floats (activations for a cache's write); NULL on failure. */
static inline float *kvt_dev(const float *host, size_t n) {
    void *p = NULL;
    if (kvt_be->ops->buffer_alloc(kvt_be, (n ? n : 1) * sizeof(float), &p) != TSR_OK)
        return NULL;
    if (tsr_backend_upload(kvt_be, p, host, n * sizeof(float)) != TSR_OK) {
        kvt_be->ops->buffer_free(kvt_be, p);
        return NULL;
    }
    return p;
}

static inline void kvt_dev_free(void *p) {
    if (p) kvt_be->ops->buffer_free(kvt_be, p);
}

/* Writes n host rows k, v ([n][kv_dim]) of `layer` through the cache's write, from
 * backend memory as the forward pass does. */
static inline tsr_status kvt_write(tsr_kv_cache *kv, int layer, int seq, int32_t n, const float *k,
                            const float *v) {
    size_t nf = (size_t)n * (size_t)kv->kv_dim;
    float *dk = kvt_dev(k, nf), *dv = kvt_dev(v, nf);
    tsr_status st = dk && dv ? kv->ops->write(kv, layer, seq, n, dk, dv) : TSR_ERR_NOMEM;
    kvt_dev_free(dk);
    kvt_dev_free(dv);
    return st;
}

/* n stored rows of `row` elements of `dtype` at src (a span's k or v: backend memory) to
 * host f32 rows dst. */
static inline tsr_status kvt_read_rows(float *dst, const float *src, int dtype, size_t n,
                                       int row) {
    size_t rb = tsr_kv_row_bytes(dtype, row);
    void *tmp = tsr_malloc(n * rb + 1);
    if (!tmp) return TSR_ERR_NOMEM;
    tsr_status st = tsr_backend_download(kvt_be, tmp, src, n * rb);
    if (st == TSR_OK) tsr_kv_rows_decode(dtype, tmp, dst, row, (int64_t)n, row);
    tsr_free(tmp);
    return st;
}

/* n floats of backend memory src to host dst. */
static inline tsr_status kvt_read(float *dst, const float *src, size_t n) {
    return tsr_backend_download(kvt_be, dst, src, n * sizeof(float));
}

#endif
