/* "synthetic:NAME[,dtype=bf16][,seed=N][,layers=N][,ctx=N]": models with real shapes and
 * seeded random weights, built in memory (benchmarks and tests without checkpoints).
 *
 * Every element is a pure function of (seed, tensor id, row, column), so values do not
 * depend on the thread count, and ",layers=N" keeps the first layers' weights unchanged.
 * Matrices are uniform in [-1, 1) / sqrt(cols) (activations stay O(1)); norms are 1 + small
 * noise. Default dtypes follow the real models: f32 for tiny and stories*, bf16 for Llama 3;
 * a config.json path uses its torch_dtype. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "runtime/model/config.h"
#include "runtime/model/loader.h"

typedef struct tsr__preset {
    const char *name;
    tsr_model_config cfg;
} tsr__preset;

#define TSR__LLAMA3_EOS .eos_id = 128001, .n_eos_ids = 3, .eos_ids = {128001, 128008, 128009}

#define TSR__GPT_OSS                                                                      \
    .dim = 2880, .hidden_dim = 2880, .n_heads = 64, .n_kv_heads = 8, .head_dim = 64,      \
    .vocab_size = 201088, .max_seq_len = 131072, .norm_eps = 1e-5f, .rope_theta = 150000.0f, \
    .rope_scaling = TSR_ROPE_YARN, .rope_factor = 32.0f, .rope_beta_fast = 32.0f,            \
    .rope_beta_slow = 1.0f, .rope_original_max_pos = 4096, .rope_truncate = false,           \
    .rope_attn_factor = 1.3465736f, .tied_embeddings = false, .dtype = TSR_BF16,             \
    .bos_id = 199998, .eos_id = 200002, .n_eos_ids = 3, .eos_ids = {200002, 199999, 200012}, \
    .arch = TSR_ARCH_GPT_OSS, .qkv_bias = true, .o_bias = true, .attn_sinks = true,          \
    .sliding_window = 128, .sliding_layers = {0x5555555555555555ull}, .n_experts_used = 4,   \
    .swiglu_limit = 7.0f, .swiglu_alpha = 1.702f

static const tsr__preset tsr__presets[] = {
    {"tiny", {.dim = 64, .hidden_dim = 172, .n_layers = 5, .n_heads = 8, .n_kv_heads = 4,
              .vocab_size = 512, .max_seq_len = 2048, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
              .tied_embeddings = true, .dtype = TSR_F32, .bos_id = 1, .eos_id = 2,
              .n_eos_ids = 1, .eos_ids = {2}}},
    {"stories15M", {.dim = 288, .hidden_dim = 768, .n_layers = 6, .n_heads = 6,
                    .n_kv_heads = 6, .vocab_size = 32000, .max_seq_len = 1024,
                    .norm_eps = 1e-5f, .rope_theta = 10000.0f, .tied_embeddings = true,
                    .dtype = TSR_F32, .bos_id = 1, .eos_id = 2, .n_eos_ids = 1,
                    .eos_ids = {2}}},
    {"stories110M", {.dim = 768, .hidden_dim = 2048, .n_layers = 12, .n_heads = 12,
                     .n_kv_heads = 12, .vocab_size = 32000, .max_seq_len = 1024,
                     .norm_eps = 1e-5f, .rope_theta = 10000.0f, .tied_embeddings = true,
                     .dtype = TSR_F32, .bos_id = 1, .eos_id = 2, .n_eos_ids = 1,
                     .eos_ids = {2}}},
    {"llama-3.2-1b", {.dim = 2048, .hidden_dim = 8192, .n_layers = 16, .n_heads = 32,
                      .n_kv_heads = 8, .head_dim = 64, .vocab_size = 128256,
                      .max_seq_len = 131072, .norm_eps = 1e-5f, .rope_theta = 500000.0f,
                      .rope_scaling = TSR_ROPE_LLAMA3, .rope_factor = 32.0f,
                      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                      .rope_original_max_pos = 8192, .tied_embeddings = true,
                      .dtype = TSR_BF16, .bos_id = 128000, TSR__LLAMA3_EOS}},
    {"llama-3.1-8b", {.dim = 4096, .hidden_dim = 14336, .n_layers = 32, .n_heads = 32,
                      .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256,
                      .max_seq_len = 131072, .norm_eps = 1e-5f, .rope_theta = 500000.0f,
                      .rope_scaling = TSR_ROPE_LLAMA3, .rope_factor = 8.0f,
                      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                      .rope_original_max_pos = 8192, .tied_embeddings = false,
                      .dtype = TSR_BF16, .bos_id = 128000, TSR__LLAMA3_EOS}},
    /* GPT-OSS (openai/gpt-oss-20b's config.json; 120b: 36 layers, 128 experts): experts in
     * MXFP4 (random codes, scales near 1/sqrt(cols)), the rest bf16 */
    {"gpt-oss-20b", {TSR__GPT_OSS, .n_layers = 24, .n_experts = 32}},
    {"gpt-oss-120b", {TSR__GPT_OSS, .n_layers = 36, .n_experts = 128}},
};

static uint64_t tsr__splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills a [rows, cols] tensor of `dtype` with center + scale * U[-1, 1). */
static void tsr__fill(void *data, tsr_dtype dtype, int64_t rows, int64_t cols, uint64_t seed,
                      uint64_t id, float center, float scale) {
    size_t esz = tsr_dtype_size(dtype);
/* the thread count is named: the CPU backend leaves the OpenMP default at 1 (backend_cpu.c) */
#pragma omp parallel for schedule(static) num_threads(tsr_sys_cpus()) if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        uint64_t s = seed * 0x2545f4914f6cdd1dull ^ (id << 40) ^ (uint64_t)r;
        tsr__splitmix64(&s);
        char *row = (char *)data + (size_t)r * (size_t)cols * esz;
        for (int64_t j = 0; j < cols; j += 2) {
            /* One 64-bit draw gives two 24-bit uniforms. */
            uint64_t z = tsr__splitmix64(&s);
            for (int64_t k = j; k < j + 2 && k < cols; k++, z >>= 32) {
                float u = (float)(z & 0xffffff) * (2.0f / 16777216.0f) - 1.0f;
                float v = center + scale * u;
                if (dtype == TSR_F32) {
                    ((float *)(void *)row)[k] = v;
                } else {
                    ((uint16_t *)(void *)row)[k] =
                        dtype == TSR_BF16 ? tsr_f32_to_bf16(v) : tsr_f32_to_f16(v);
                }
            }
        }
    }
}

static tsr_status tsr__make(tsr_model *m, tsr_tensor *t, tsr_dtype dtype, int64_t rows,
                            int64_t cols, uint64_t seed, uint64_t id, bool norm) {
    void *buf;
    TSR_TRY(tsr_model_alloc(m, (size_t)rows * (size_t)cols * tsr_dtype_size(dtype), &buf));
    if (norm)
        tsr__fill(buf, dtype, rows, cols, seed, id, 1.0f, 0.05f);
    else
        tsr__fill(buf, dtype, rows, cols, seed, id, 0.0f, 1.0f / sqrtf((float)cols));
    *t = (tsr_tensor){.dtype = dtype, .rows = rows, .cols = cols, .data = buf};
    return TSR_OK;
}

/* GPT-OSS experts in MXFP4: random codes, every scale byte 127 + round(log2(1 / (3 *
 * sqrt(cols)))) (|code| averages ~2.6, so a row's products stay O(1)); biases small. */
static tsr_status tsr__make_experts(tsr_model *m, tsr_experts *x, int n, int64_t rows,
                                    int64_t cols, uint64_t seed, uint64_t id) {
    *x = (tsr_experts){.n = n, .rows = rows, .cols = cols, .mxfp4 = 1};
    int64_t R = (int64_t)n * rows;
    uint8_t *blocks, *scales;
    TSR_TRY(tsr_model_alloc(m, (size_t)R * (size_t)(cols / 2), (void **)&blocks));
    TSR_TRY(tsr_model_alloc(m, (size_t)R * (size_t)(cols / 32), (void **)&scales));
    int sb = 127 + (int)lround(log2(1.0 / (3.0 * sqrt((double)cols))));
#pragma omp parallel for schedule(static) num_threads(tsr_sys_cpus()) if (R > 256)
    for (int64_t r = 0; r < R; r++) {
        uint64_t s = seed * 0x2545f4914f6cdd1dull ^ (id << 40) ^ (uint64_t)r;
        tsr__splitmix64(&s);
        uint8_t *row = blocks + (size_t)r * (size_t)(cols / 2);
        for (int64_t j = 0; j < cols / 2; j += 8) {
            uint64_t z = tsr__splitmix64(&s);
            for (int64_t k = j; k < j + 8 && k < cols / 2; k++, z >>= 8) row[k] = (uint8_t)z;
        }
        memset(scales + (size_t)r * (size_t)(cols / 32), sb, (size_t)(cols / 32));
    }
    x->w = (tsr_tensor){.dtype = TSR_U8, .rows = R, .cols = cols / 2, .data = blocks};
    x->scales = (tsr_tensor){.dtype = TSR_U8, .rows = R, .cols = cols / 32, .data = scales};
    void *b;
    TSR_TRY(tsr_model_alloc(m, (size_t)R * sizeof(float), &b));
    tsr__fill(b, TSR_F32, n, rows, seed, id + 1, 0.0f, 0.01f);
    x->bias = (tsr_tensor){.dtype = TSR_F32, .rows = n, .cols = rows, .data = b};
    return TSR_OK;
}

static tsr_status tsr__parse_option(const char *spec, const char *opt, tsr_model_config *c,
                                    uint64_t *seed) {
    const char *eq = strchr(opt, '=');
    size_t klen = eq ? (size_t)(eq - opt) : strlen(opt);
    const char *val = eq ? eq + 1 : "";
    char *end = NULL;
    errno = 0;
    if (klen == 5 && !strncmp(opt, "dtype", 5)) {
        int d = tsr_dtype_parse(val);
        /* q8_0, q4_*, fp8: made in bf16, then quantized by the engine */
        if (d < 0 || d == TSR_Q8_0 || d == TSR_Q4_0 || d == TSR_Q4_1 || d == TSR_F8_E4M3)
            return tsr_error_set(TSR_ERR_INVALID, "synthetic:%s: unknown dtype \"%s\" (f32, f16, "
                                 "bf16)", spec, val);
        c->dtype = (tsr_dtype)d;
        return TSR_OK;
    }
    if (klen == 4 && !strncmp(opt, "seed", 4)) {
        unsigned long long v = strtoull(val, &end, 0);
        if (!*val || *end || errno || *val == '-')
            return tsr_error_set(TSR_ERR_INVALID, "synthetic:%s: invalid seed \"%s\"", spec, val);
        *seed = v;
        return TSR_OK;
    }
    bool layers = klen == 6 && !strncmp(opt, "layers", 6);
    bool ctx = klen == 3 && !strncmp(opt, "ctx", 3);
    if (layers || ctx) {
        long v = strtol(val, &end, 10);
        if (!*val || *end || errno || v <= 0 || v > (1 << 24))
            return tsr_error_set(TSR_ERR_INVALID, "synthetic:%s: invalid %s \"%s\"", spec,
                                 layers ? "layers" : "ctx", val);
        if (layers)
            c->n_layers = (int)v;
        else
            c->max_seq_len = (int)v;
        return TSR_OK;
    }
    return tsr_error_set(TSR_ERR_INVALID,
                         "synthetic:%s: unknown option \"%s\" (dtype=, seed=, layers=, ctx=)",
                         spec, opt);
}

static tsr_status tsr__base_config(const char *spec, const char *base, tsr_model_config *c) {
    for (size_t i = 0; i < sizeof tsr__presets / sizeof tsr__presets[0]; i++) {
        if (!strcmp(base, tsr__presets[i].name)) {
            *c = tsr__presets[i].cfg;
            tsr_config_defaults(c);
            return TSR_OK;
        }
    }
    struct stat sb;
    if (stat(base, &sb) == 0) {
        char path[4096];
        snprintf(path, sizeof path, S_ISDIR(sb.st_mode) ? "%s/config.json" : "%s", base);
        return tsr_config_from_hf_json(path, c);
    }
    return tsr_error_set(TSR_ERR_INVALID,
                         "synthetic:%s: unknown model \"%s\" (tiny, stories15M, stories110M, "
                         "llama-3.2-1b, llama-3.1-8b, gpt-oss-20b, gpt-oss-120b, or a "
                         "config.json path)",
                         spec, base);
}

tsr_status tsr_synthetic_create(const char *name, tsr_model **out) {
    *out = NULL;
    char buf[4096];
    if (!name || !*name) return tsr_error_set(TSR_ERR_INVALID, "synthetic: no model name given");
    if (strlen(name) >= sizeof buf)
        return tsr_error_set(TSR_ERR_INVALID, "synthetic: model name too long");
    snprintf(buf, sizeof buf, "%s", name);
    char *save = NULL;
    char *base = strtok_r(buf, ",", &save);
    if (!base) return tsr_error_set(TSR_ERR_INVALID, "synthetic:%s: no model name given", name);

    tsr_model_config c;
    TSR_TRY(tsr__base_config(name, base, &c));
    uint64_t seed = 1234;
    for (char *opt = strtok_r(NULL, ",", &save); opt; opt = strtok_r(NULL, ",", &save))
        TSR_TRY(tsr__parse_option(name, opt, &c, &seed));
    char what[4200];
    snprintf(what, sizeof what, "synthetic:%s", name);
    TSR_TRY(tsr_config_validate(&c, what));

    /* Refuse up front what cannot fit in RAM: touching an overcommitted 16 GB would end in
     * the OOM killer instead of an error line. */
    int64_t params = tsr_config_param_count(&c);
    double need = (double)params * (double)tsr_dtype_size(c.dtype);
    if (c.n_experts > 0) { /* experts in MXFP4: 17 bytes per 32 weights */
        double ex = 3.0 * (double)c.n_experts * c.hidden_dim * c.dim * c.n_layers;
        need = ((double)params - ex) * (double)tsr_dtype_size(c.dtype) + ex * 17.0 / 32.0;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psize > 0 && need > 0.9 * (double)pages * (double)psize)
        return tsr_error_set(TSR_ERR_NOMEM,
                             "%s: weights need %.1f GiB in %s, more than this machine's %.1f GiB",
                             what, need / (1 << 30), tsr_dtype_name(c.dtype),
                             (double)pages * (double)psize / (1 << 30));

    tsr_model *m;
    TSR_TRY(tsr_model_create(what, &c, &m));
    tsr_dtype dt = c.dtype;
    int64_t d = c.dim, q = (int64_t)c.n_heads * c.head_dim;
    int64_t kv = (int64_t)c.n_kv_heads * c.head_dim, h = c.hidden_dim, V = c.vocab_size;
    tsr_status st = TSR_OK;
    TSR_TRY_GOTO(tsr__make(m, &m->tok_emb, dt, V, d, seed, 0, false), st, fail);
    if (c.tied_embeddings)
        m->classifier = m->tok_emb;
    else
        TSR_TRY_GOTO(tsr__make(m, &m->classifier, dt, V, d, seed, 1, false), st, fail);
    TSR_TRY_GOTO(tsr__make(m, &m->out_norm, TSR_F32, 1, d, seed, 2, true), st, fail);
    for (int l = 0; l < c.n_layers; l++) {
        tsr_layer_weights *w = &m->layers[l];
        uint64_t id = 3 + 9 * (uint64_t)l;
        TSR_TRY_GOTO(tsr__make(m, &w->attn_norm, TSR_F32, 1, d, seed, id + 0, true), st, fail);
        TSR_TRY_GOTO(tsr__make(m, &w->wq, dt, q, d, seed, id + 1, false), st, fail);
        TSR_TRY_GOTO(tsr__make(m, &w->wk, dt, kv, d, seed, id + 2, false), st, fail);
        TSR_TRY_GOTO(tsr__make(m, &w->wv, dt, kv, d, seed, id + 3, false), st, fail);
        TSR_TRY_GOTO(tsr__make(m, &w->wo, dt, d, q, seed, id + 4, false), st, fail);
        TSR_TRY_GOTO(tsr__make(m, &w->ffn_norm, TSR_F32, 1, d, seed, id + 5, true), st, fail);
        if (c.n_experts > 0) { /* GPT-OSS: ids past the biases' and norms' */
            uint64_t id3 = 3 + 14 * (uint64_t)c.n_layers + 10 * (uint64_t)l;
            int64_t E = c.n_experts;
            TSR_TRY_GOTO(tsr__make(m, &w->bo, TSR_F32, 1, d, seed, id3 + 0, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->sinks, TSR_F32, 1, c.n_heads, seed, id3 + 1, true),
                         st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->router, dt, E, d, seed, id3 + 2, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->router_b, TSR_F32, 1, E, seed, id3 + 3, false), st,
                         fail);
            TSR_TRY_GOTO(tsr__make_experts(m, &w->gate_up, c.n_experts, 2 * h, d, seed, id3 + 4),
                         st, fail);
            TSR_TRY_GOTO(tsr__make_experts(m, &w->down, c.n_experts, d, h, seed, id3 + 6), st,
                         fail);
        } else {
            TSR_TRY_GOTO(tsr__make(m, &w->w_gate, dt, h, d, seed, id + 6, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->w_up, dt, h, d, seed, id + 7, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->w_down, dt, d, h, seed, id + 8, false), st, fail);
        }
        /* Qwen2 biases, Qwen3 q/k norms: ids past every layer's nine, so that the Llama
         * tensors keep their values */
        uint64_t id2 = 3 + 9 * (uint64_t)c.n_layers + 5 * (uint64_t)l;
        if (c.qkv_bias) {
            TSR_TRY_GOTO(tsr__make(m, &w->bq, TSR_F32, 1, q, seed, id2 + 0, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->bk, TSR_F32, 1, kv, seed, id2 + 1, false), st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->bv, TSR_F32, 1, kv, seed, id2 + 2, false), st, fail);
        }
        if (c.qk_norm) {
            TSR_TRY_GOTO(tsr__make(m, &w->q_norm, TSR_F32, 1, c.head_dim, seed, id2 + 3, true),
                         st, fail);
            TSR_TRY_GOTO(tsr__make(m, &w->k_norm, TSR_F32, 1, c.head_dim, seed, id2 + 4, true),
                         st, fail);
        }
    }
    *out = m;
    return TSR_OK;

fail:
    tsr_model_destroy(m);
    return st;
}
