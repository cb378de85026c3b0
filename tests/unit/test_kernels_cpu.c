/* CPU backend kernels vs naive scalar references (double accumulation): matmul for F32,
 * BF16 and F16 on every SIMD path, rmsnorm, rope (both conventions, Llama-3.1 scaling
 * checked against values produced by Hugging Face transformers), swiglu, add, embed; the
 * attention kernels' row-order variants against their chunked twins, bit for bit; and
 * bitwise-identical results for 1 and 2 threads. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/kv_dtype.h"
#include "kernels/rope_freq.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "tests/test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void fill(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = frand();
}

/* Weights in dtype dt plus their exact f32 values (the reference's input). */
typedef struct wmat {
    tsr_tensor t;
    void *data;
    float *f;
} wmat;

static void wmat_make(wmat *w, tsr_dtype dt, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)cols;
    w->f = tsr_malloc(n * 4);
    w->data = tsr_malloc(n * tsr_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == TSR_F32) {
            ((float *)w->data)[i] = v;
            w->f[i] = v;
        } else if (dt == TSR_BF16) {
            uint16_t h = tsr_f32_to_bf16(v);
            ((uint16_t *)w->data)[i] = h;
            w->f[i] = tsr_bf16_to_f32(h);
        } else {
            uint16_t h = tsr_f32_to_f16(v);
            ((uint16_t *)w->data)[i] = h;
            w->f[i] = tsr_f16_to_f32(h);
        }
    }
    w->t.dtype = dt;
    w->t.rows = rows;
    w->t.cols = cols;
    w->t.data = w->data;
}

static void wmat_free(wmat *w) {
    tsr_free(w->f);
    tsr_free(w->data);
}

/* Max over outputs of |y - ref| / (sum_k |w x| + tiny): a scale-free dot product error. */
static double matmul_err(const float *x, int64_t n, const wmat *w, const float *y) {
    double worst = 0;
    int64_t rows = w->t.rows, cols = w->t.cols;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < cols; k++) {
                double p = (double)w->f[r * cols + k] * x[i * cols + k];
                s += p;
                a += fabs(p);
            }
            double e = fabs(y[i * rows + r] - s) / (a + 1e-30);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

static const tsr_dtype dtypes[3] = {TSR_F32, TSR_BF16, TSR_F16};

/* Every SIMD path this CPU has, over column counts that hit every tail case. */
TSR_TEST(test_matvec_kernels_all_isas) {
    static const int64_t colss[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 172, 288};
    for (int isa = TSR__ISA_SCALAR; isa <= TSR__ISA_AVX512; isa++) {
        const tsr__cpu_kernels *k = tsr__cpu_kernels_for((tsr__cpu_isa)isa);
        if (!k) continue;
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
            for (int d = 0; d < 3; d++) {
                int64_t rows = 37, cols = colss[ci];
                wmat w;
                wmat_make(&w, dtypes[d], rows, cols);
                float x[4 * 288], y[4 * 37], y1[37];
                fill(x, (size_t)(4 * cols));
                /* x as the BF16 kernel reads it, where it wants pairs (cpu_internal.h) */
                float xp[4 * 288];
                int32_t whole[2] = {0, (int32_t)cols};
                if (k->bf16_pairs) tsr__cpu_bf16_pairs(x, cols, 4, whole, 1, xp);
                else memcpy(xp, x, (size_t)(4 * cols) * sizeof *x);
                for (int nx = 1; nx <= 4; nx++) {
                    if (dtypes[d] == TSR_F32)
                        k->matvec_f32(w.data, cols, 0, rows, x, nx, y, rows);
                    else if (dtypes[d] == TSR_BF16)
                        k->matvec_bf16(w.data, cols, 0, rows, xp, nx, y, rows);
                    else
                        k->matvec_f16(w.data, cols, 0, rows, x, nx, y, rows);
                    double e = matmul_err(x, nx, &w, y);
                    if (e > 1e-6)
                        TSR_FAIL_("%s dtype %d cols %lld nx %d: rel err %g", k->name, d,
                                  (long long)cols, nx, e);
                    /* Row 0 of a multi-row pass equals the single-row result bitwise. */
                    if (nx == 1) memcpy(y1, y, sizeof y1);
                    else if (memcmp(y1, y, (size_t)rows * 4) != 0)
                        TSR_FAIL_("%s: nx=%d changes row 0", k->name, nx);
                }
                /* Conversions. */
                if (dtypes[d] != TSR_F32) {
                    float cv[288];
                    if (dtypes[d] == TSR_BF16) k->cvt_bf16(w.data, cv, cols);
                    else k->cvt_f16(w.data, cv, cols);
                    ASSERT_TRUE(memcmp(cv, w.f, (size_t)cols * 4) == 0);
                }
                wmat_free(&w);
            }
        }
    }
}

static void run_matmul_case(tsr_dtype dt, int64_t n, int64_t rows, int64_t cols) {
    wmat w;
    wmat_make(&w, dt, rows, cols);
    float *x = tsr_malloc((size_t)(n * cols) * 4);
    float *y[2];
    fill(x, (size_t)(n * cols));
    for (int t = 0; t < 2; t++) {
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(t + 1, &be));
        y[t] = tsr_malloc((size_t)(n * rows) * 4);
        ASSERT_OK(be->ops->matmul(be, x, n, &w.t, y[t]));
        tsr_backend_destroy(be);
    }
    double e = matmul_err(x, n, &w, y[0]);
    if (e > 1e-5)
        TSR_FAIL_("dtype %s n %lld %lldx%lld: rel err %g", tsr_dtype_name(dt), (long long)n,
                  (long long)rows, (long long)cols, e);
    if (memcmp(y[0], y[1], (size_t)(n * rows) * 4) != 0)
        TSR_FAIL_("dtype %s n %lld %lldx%lld: 1 and 2 threads differ", tsr_dtype_name(dt),
                  (long long)n, (long long)rows, (long long)cols);
    tsr_free(y[0]);
    tsr_free(y[1]);
    tsr_free(x);
    wmat_free(&w);
}

TSR_TEST(test_matmul_all_dtypes) {
    static const int64_t ns[] = {1, 2, 3, 4, 5, 12, 13, 17, 64};
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            run_matmul_case(dtypes[d], ns[i], 37, 172);
            if (tsr_test_failed_flag) return;
            /* Big enough for the threaded matvec and several BF16/F16 panels. */
            run_matmul_case(dtypes[d], ns[i], 600, 288);
            if (tsr_test_failed_flag) return;
        }
    }
}

TSR_TEST(test_matmul_rejects_bad_input) {
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    float x[4] = {0}, y[4];
    tsr_tensor w = {TSR_F32, 0, 4, x};
    ASSERT_EQ_INT(be->ops->matmul(be, x, 1, &w, y), TSR_ERR_INVALID);
    w.rows = 1;
    w.dtype = (tsr_dtype)7;
    ASSERT_EQ_INT(be->ops->matmul(be, x, 1, &w, y), TSR_ERR_UNSUPPORTED);
    tsr_backend_destroy(be);
}

TSR_TEST(test_rmsnorm) {
    enum { N = 5, D = 172 };
    float x[N * D], w[D], out[2][N * D];
    fill(x, N * D);
    fill(w, D);
    tsr_tensor wt = {TSR_F32, 1, D, w};
    for (int t = 0; t < 2; t++) {
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(t + 1, &be));
        ASSERT_OK(be->ops->rmsnorm(be, x, &wt, N, D, 1e-5f, out[t]));
        tsr_backend_destroy(be);
    }
    ASSERT_TRUE(memcmp(out[0], out[1], sizeof out[0]) == 0);
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        double rs = 1.0 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++) {
            double ref = x[r * D + i] * rs * w[i];
            ASSERT_NEAR(out[0][r * D + i], ref, 1e-6 * fabs(ref) + 1e-7);
        }
    }
    /* In place. */
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    ASSERT_OK(be->ops->rmsnorm(be, x, &wt, N, D, 1e-5f, x));
    ASSERT_TRUE(memcmp(x, out[0], sizeof x) == 0);
    tsr_backend_destroy(be);
}

static tsr_model_config rope_cfg(int hd, float theta, int interleaved, int llama3) {
    tsr_model_config c;
    memset(&c, 0, sizeof c);
    c.head_dim = hd;
    c.rope_theta = theta;
    c.rope_interleaved = interleaved;
    if (llama3) {
        c.rope_scaling = TSR_ROPE_LLAMA3;
        c.rope_factor = 8.0f;
        c.rope_low_freq_factor = 1.0f;
        c.rope_high_freq_factor = 4.0f;
        c.rope_original_max_pos = 8192;
    }
    return c;
}

/* Double-precision rope at small positions (where the f32 angle is exact enough). */
TSR_TEST(test_rope_vs_reference) {
    enum { N = 4, H = 3, HD = 20 };
    const int32_t pos[N] = {0, 1, 13, 50};
    for (int inter = 0; inter < 2; inter++) {
        tsr_model_config cfg = rope_cfg(HD, 10000.0f, inter, 0);
        float x[N * H * HD], ref[N * H * HD];
        fill(x, N * H * HD);
        for (int r = 0; r < N; r++) {
            for (int h = 0; h < H; h++) {
                const float *v = x + (r * H + h) * HD;
                float *o = ref + (r * H + h) * HD;
                for (int j = 0; j < HD / 2; j++) {
                    double f = pow(10000.0, -2.0 * j / HD), a = pos[r] * f;
                    int i0 = inter ? 2 * j : j, i1 = inter ? 2 * j + 1 : j + HD / 2;
                    o[i0] = (float)(v[i0] * cos(a) - v[i1] * sin(a));
                    o[i1] = (float)(v[i0] * sin(a) + v[i1] * cos(a));
                }
            }
        }
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(2, &be));
        ASSERT_OK(be->ops->rope(be, x, pos, N, H, &cfg));
        tsr_backend_destroy(be);
        for (int i = 0; i < N * H * HD; i++) ASSERT_NEAR(x[i], ref[i], 2e-6);
    }
}

/* Interleaved pairs are the halves convention on a permuted vector, bit for bit. */
TSR_TEST(test_rope_interleaved_is_permuted_halves) {
    enum { N = 3, H = 2, HD = 16 };
    const int32_t pos[N] = {5, 700, 4000};
    float a[N * H * HD], b[N * H * HD];
    fill(a, N * H * HD);
    for (int r = 0; r < N * H; r++)
        for (int j = 0; j < HD / 2; j++) {
            b[r * HD + j] = a[r * HD + 2 * j];
            b[r * HD + j + HD / 2] = a[r * HD + 2 * j + 1];
        }
    tsr_model_config ci = rope_cfg(HD, 500000.0f, 1, 1), ch = rope_cfg(HD, 500000.0f, 0, 1);
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    ASSERT_OK(be->ops->rope(be, a, pos, N, H, &ci));
    ASSERT_OK(be->ops->rope(be, b, pos, N, H, &ch));
    tsr_backend_destroy(be);
    for (int r = 0; r < N * H; r++)
        for (int j = 0; j < HD / 2; j++) {
            ASSERT_TRUE(b[r * HD + j] == a[r * HD + 2 * j]);
            ASSERT_TRUE(b[r * HD + j + HD / 2] == a[r * HD + 2 * j + 1]);
        }
}

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* inv_freq tables from transformers (ROPE_INIT_FUNCTIONS / LlamaRotaryEmbedding.inv_freq),
 * as float32 bit patterns: Llama-3.1 (hd 128, theta 5e5, factor 8, 1/4, 8192) and the
 * default (hd 64, theta 1e4). */
static const uint32_t hf_inv_freq_llama3_128[64] = {
    0x3f800000u, 0x3f508ac1u, 0x3f29e1c6u, 0x3f0a6384u, 0x3ee177bcu, 0x3eb7ab7du,
    0x3e959ee3u, 0x3e73c461u, 0x3e4693b0u, 0x3e21c3a0u, 0x3e03c6a0u, 0x3dd6b19cu,
    0x3daee4adu, 0x3d8e7898u, 0x3d681e67u, 0x3d3d1684u, 0x3d1a08c8u, 0x3cfaf53fu,
    0x3ccc6f49u, 0x3ca68939u, 0x3c87a9c3u, 0x3c5d06ecu, 0x3c340d6du, 0x3c12ac7fu,
    0x3beef74fu, 0x3bc2aa76u, 0x3b9e9402u, 0x3b812e35u, 0x3b527720u, 0x3b0dfd06u,
    0x3ab3d11du, 0x3a60979eu, 0x3a0995d2u, 0x39a3f108u, 0x393b2dd2u, 0x38c86886u,
    0x38a3418du, 0x3884fdbfu, 0x3858ac81u, 0x38308199u, 0x380fc8f8u, 0x37ea426fu,
    0x37bed4f4u, 0x379b7475u, 0x377d45c3u, 0x374e51f5u, 0x3728126bu, 0x3708ea0fu,
    0x36df10c4u, 0x36b5b687u, 0x369406cbu, 0x36712b80u, 0x36447610u, 0x36200a69u,
    0x36025f34u, 0x35d46808u, 0x35ad07a7u, 0x358cf400u, 0x3565a54du, 0x353b12c7u,
    0x351864a7u, 0x34f848c2u, 0x34ca41b0u, 0x34a4c2ffu,
};
static const uint32_t hf_inv_freq_default_64[32] = {
    0x3f800000u, 0x3f3ff911u, 0x3f0ff59au, 0x3ed7e89bu, 0x3ea1e89bu, 0x3e72d423u,
    0x3e361887u, 0x3e088d77u, 0x3dcccccdu, 0x3d99940du, 0x3d6655c2u, 0x3d2cba15u,
    0x3d0186e3u, 0x3cc2434fu, 0x3c91ad39u, 0x3c5a7bf2u, 0x3c23d70au, 0x3bf5b9b0u,
    0x3bb8449cu, 0x3b8a2e77u, 0x3b4f3e38u, 0x3b1b690du, 0x3ae91528u, 0x3aaec98eu,
    0x3a83126fu, 0x3a44948cu, 0x3a136a16u, 0x39dd1725u, 0x39a5cb60u, 0x3978a815u,
    0x393a7753u, 0x390bd472u,
};

TSR_TEST(test_rope_inv_freq_matches_hf) {
    float f[64];
    tsr_model_config c = rope_cfg(128, 500000.0f, 0, 1);
    tsr_rope_inv_freq(&c, f);
    for (int j = 0; j < 64; j++) {
        float want = f32_of_bits(hf_inv_freq_llama3_128[j]);
        if (f[j] != want) TSR_FAIL_("llama3 inv_freq[%d] = %.9g, HF %.9g", j, f[j], want);
    }
    c = rope_cfg(64, 10000.0f, 0, 0);
    tsr_rope_inv_freq(&c, f);
    for (int j = 0; j < 32; j++) {
        float want = f32_of_bits(hf_inv_freq_default_64[j]);
        if (f[j] != want) TSR_FAIL_("default inv_freq[%d] = %.9g, HF %.9g", j, f[j], want);
    }
}

/* transformers LlamaRotaryEmbedding + apply_rotary_pos_emb on x[i] = sin(0.37 i + 0.1),
 * hd 16, 2 heads, positions 1, 100, 5000; Llama-3.1 scaling, theta 5e5 (the 8 frequencies
 * cover the high, medium and low bands). */
static const float hf_rope_llama3[3][32] = {
    {-1.464146748e-02f, 4.992088675e-01f, 7.671207190e-01f, 9.418371320e-01f,
     1.000474572e+00f, 9.289933443e-01f, 7.322370410e-01f, 4.363998473e-01f,
     1.280427277e-01f, -1.918188334e-01f, -5.834288001e-01f, -8.496321440e-01f,
     -9.846528172e-01f, -9.805065393e-01f, -8.431828618e-01f, -5.917150378e-01f,
     -5.026128292e-01f, 9.021633863e-02f, 4.695659578e-01f, 7.536556721e-01f,
     9.384511709e-01f, 9.999055266e-01f, 9.264219999e-01f, 7.275743484e-01f,
     1.355414093e-02f, 9.385304153e-02f, -2.734912932e-01f, -6.117540598e-01f,
     -8.594832420e-01f, -9.862896204e-01f, -9.791715741e-01f, -8.395035267e-01f},
    {1.273581386e-01f, 5.347062349e-01f, -9.614948034e-01f, 1.268345356e+00f,
     1.050263643e+00f, 9.323156476e-01f, 7.327917814e-01f, 4.364753664e-01f,
     1.972863078e-02f, -9.654447436e-03f, 6.626576185e-02f, -1.522183418e-02f,
     -9.313628674e-01f, -9.773480296e-01f, -8.427007794e-01f, -5.916593075e-01f,
     -6.471112370e-03f, 5.270787701e-02f, -5.426135063e-01f, 9.699088931e-01f,
     9.818230867e-01f, 1.003247023e+00f, 9.270662069e-01f, 7.276815176e-01f,
     5.027539730e-01f, 1.190347075e-01f, -2.933011949e-02f, 3.894335032e-02f,
     -8.095835447e-01f, -9.828903675e-01f, -9.785615802e-01f, -8.394106627e-01f},
    {9.596246481e-02f, 6.844638288e-02f, 3.908477724e-01f, -5.012533069e-01f,
     -3.818312287e-01f, 1.082594395e+00f, 7.598488331e-01f, 4.402041137e-01f,
     -8.602625132e-02f, 5.303952098e-01f, -8.809661865e-01f, -1.165194035e+00f,
     1.350812912e+00f, -8.077197075e-01f, -8.183875680e-01f, -5.888903737e-01f,
     3.848417997e-01f, -1.125104353e-01f, 2.795610428e-01f, -3.366075158e-01f,
     -3.899058104e-01f, 1.153454065e+00f, 9.584450126e-01f, 7.329694629e-01f,
     3.235741258e-01f, 6.548880041e-02f, -4.659778178e-01f, -9.104588032e-01f,
     1.211352825e+00f, -8.013252020e-01f, -9.478490949e-01f, -8.347972631e-01f},
};

/* The same input, default rope, theta 1e4. */
static const float hf_rope_default[3][32] = {
    {-1.464146748e-02f, 5.188817978e-01f, 8.020068407e-01f, 9.622279406e-01f,
     1.009759188e+00f, 9.320558310e-01f, 7.330742478e-01f, 4.365861714e-01f,
     1.280427277e-01f, -1.294823289e-01f, -5.344609022e-01f, -8.264679313e-01f,
     -9.751290679e-01f, -9.775958657e-01f, -8.424550891e-01f, -5.915775299e-01f,
     -5.026128292e-01f, 7.809233665e-02f, 4.857054055e-01f, 7.683151960e-01f,
     9.465526938e-01f, 1.002985716e+00f, 9.273942709e-01f, 7.278386950e-01f,
     1.355414093e-02f, 1.041583940e-01f, -2.436800450e-01f, -5.932382941e-01f,
     -8.505527973e-01f, -9.831570983e-01f, -9.782508016e-01f, -8.392743468e-01f},
    {1.273581386e-01f, 5.016466975e-01f, -9.576724172e-01f, -9.531310797e-01f,
     1.369277954e+00f, 1.187828898e+00f, 8.127516508e-01f, 4.548894763e-01f,
     1.972863078e-02f, -1.853498518e-01f, 1.082909405e-01f, 8.369426727e-01f,
     3.091414571e-01f, -6.430273652e-01f, -7.658741474e-01f, -5.776218772e-01f,
     -6.471112370e-03f, 8.899562806e-02f, -5.433772802e-01f, -7.617807984e-01f,
     1.230448127e+00f, 1.257023931e+00f, 1.019541979e+00f, 7.537525296e-01f,
     5.027539730e-01f, 9.501136839e-02f, -5.549520254e-03f, 6.016060710e-01f,
     3.246528506e-01f, -6.264735460e-01f, -8.817986846e-01f, -8.160806894e-01f},
    {9.596246481e-02f, -5.010902882e-01f, -9.443620443e-01f, 1.214381218e+00f,
     7.064393163e-01f, -1.025227785e+00f, -6.008468270e-01f, 5.871704817e-01f,
     -8.602625132e-02f, -1.868488342e-01f, 1.924670935e-01f, 3.663469255e-01f,
     -1.213026762e+00f, 8.793916106e-01f, -9.413350224e-01f, 4.424955249e-01f,
     3.848417997e-01f, -5.450047553e-03f, -5.417431593e-01f, 9.134527445e-01f,
     6.795021296e-01f, -1.096358180e+00f, -6.761682034e-01f, 8.319346905e-01f,
     3.235741258e-01f, -1.300679743e-01f, 4.247342050e-02f, 3.283960819e-01f,
     -1.075954914e+00f, 8.778251410e-01f, -1.166118026e+00f, 7.362169027e-01f},
};

TSR_TEST(test_rope_matches_hf) {
    const int32_t pos[3] = {1, 100, 5000};
    for (int l3 = 0; l3 < 2; l3++) {
        tsr_model_config c = rope_cfg(16, l3 ? 500000.0f : 10000.0f, 0, l3);
        float x[3 * 32];
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < 32; i++) x[r * 32 + i] = (float)sin(0.37 * i + 0.1);
        tsr_backend *be;
        ASSERT_OK(tsr_backend_cpu_create(1, &be));
        ASSERT_OK(be->ops->rope(be, x, pos, 3, 2, &c));
        tsr_backend_destroy(be);
        const float(*want)[32] = l3 ? hf_rope_llama3 : hf_rope_default;
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < 32; i++)
                if (fabsf(x[r * 32 + i] - want[r][i]) > 1e-6f)
                    TSR_FAIL_("llama3=%d pos %d [%d]: %.9g vs HF %.9g", l3, pos[r], i,
                              x[r * 32 + i], want[r][i]);
    }
}

TSR_TEST(test_swiglu_add) {
    enum { N = 100003 }; /* above the threading threshold, odd */
    float *g = tsr_malloc(N * 4), *u = tsr_malloc(N * 4), *g2 = tsr_malloc(N * 4);
    fill(g, N);
    fill(u, N);
    for (int i = 0; i < N; i++) g[i] *= 8.0f;
    memcpy(g2, g, N * 4);
    tsr_backend *b1, *b2;
    ASSERT_OK(tsr_backend_cpu_create(1, &b1));
    ASSERT_OK(tsr_backend_cpu_create(2, &b2));
    float *ref = tsr_malloc(N * 4);
    for (int i = 0; i < N; i++) ref[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    ASSERT_OK(b1->ops->swiglu(b1, g, u, N));
    ASSERT_OK(b2->ops->swiglu(b2, g2, u, N));
    ASSERT_TRUE(memcmp(g, g2, N * 4) == 0);
    for (int i = 0; i < N; i++) ASSERT_NEAR(g[i], ref[i], 1e-6 * fabs(ref[i]) + 1e-7);
    for (int i = 0; i < N; i++) ref[i] = g[i] + u[i];
    ASSERT_OK(b2->ops->add(b2, g, u, N));
    ASSERT_TRUE(memcmp(g, ref, N * 4) == 0);
    tsr_backend_destroy(b1);
    tsr_backend_destroy(b2);
    tsr_free(g);
    tsr_free(g2);
    tsr_free(u);
    tsr_free(ref);
}

TSR_TEST(test_embed) {
    enum { V = 11, D = 37 };
    const int32_t ids[4] = {3, 0, 10, 3};
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    for (int d = 0; d < 3; d++) {
        wmat w;
        wmat_make(&w, dtypes[d], V, D);
        float out[4 * D];
        ASSERT_OK(be->ops->embed(be, &w.t, ids, 4, out));
        for (int i = 0; i < 4; i++)
            ASSERT_TRUE(memcmp(out + i * D, w.f + ids[i] * D, D * 4) == 0);
        const int32_t bad = V;
        ASSERT_EQ_INT(be->ops->embed(be, &w.t, &bad, 1, out), TSR_ERR_INVALID);
        wmat_free(&w);
    }
    tsr_backend_destroy(be);
}

TSR_TEST(test_buffers) {
    tsr_backend *be;
    ASSERT_OK(tsr_backend_cpu_create(2, &be));
    ASSERT_STR_EQ(be->ops->name, "cpu");
    ASSERT_EQ_INT(be->device, -1);
    ASSERT_EQ_INT(be->threads, 2);
    void *p;
    ASSERT_OK(be->ops->buffer_alloc(be, 1000, &p));
    ASSERT_EQ_INT((uintptr_t)p % 64, 0);
    memset(p, 1, 1000);
    be->ops->buffer_free(be, p);
    ASSERT_OK(be->ops->synchronize(be));
    tsr_backend_destroy(be);
}


/* dot_heads / acc_heads (one key row for all query heads) give the bits of dot_rows /
 * acc_rows (16-key groups per head), whatever the head count, head size (tails), GQA
 * grouping and position of the key in a group. Only the kernel sets that have them. */
TSR_TEST(test_attention_row_kernels_match_chunked) {
    static const int dims[] = {13, 16, 40, 64, 80, 128};
    static const int heads[][2] = {{1, 1}, {5, 5}, {12, 12}, {12, 4}, {17, 17}, {32, 8}};
    for (int isa = TSR__ISA_SCALAR; isa <= TSR__ISA_AVX512; isa++) {
        const tsr__cpu_kernels *k = tsr__cpu_kernels_for((tsr__cpu_isa)isa);
        if (!k || !k->dot_heads || !k->acc_heads) continue;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
                int d = dims[di], nh = heads[hi][0], g = heads[hi][1], group = nh / g, nk = 21;
                int64_t stride = (int64_t)g * d + 3; /* padded rows */
                float *q = tsr_malloc((size_t)nh * d * 4);
                float *kv = tsr_malloc((size_t)nk * (size_t)stride * 4);
                float *p = tsr_malloc((size_t)nh * 64 * 4);
                float *acc1 = tsr_malloc((size_t)nh * d * 4), *acc2 = tsr_malloc((size_t)nh * d * 4);
                float out1[32 * 64], out2[32 * 64];
                int32_t koff[32];
                fill(q, (size_t)nh * d);
                fill(kv, (size_t)nk * (size_t)stride);
                fill(p, (size_t)nh * 64);
                fill(acc1, (size_t)nh * d);
                memcpy(acc2, acc1, (size_t)nh * d * 4);
                for (int h = 0; h < nh; h++) koff[h] = h / group * d;
                for (int j = 0; j < nk; j++)
                    k->dot_heads(q, kv + (size_t)j * stride, koff, nh, d, 0.125f, out1 + j, 64);
                for (int h = 0; h < nh; h++)
                    k->dot_rows(q + (size_t)h * d, kv + koff[h], stride, nk, d, 0.125f,
                                out2 + h * 64);
                for (int h = 0; h < nh; h++)
                    ASSERT_TRUE(!memcmp(out1 + h * 64, out2 + h * 64, (size_t)nk * 4));
                k->acc_heads(acc1, p, 64, kv, stride, koff, nk, nh, d);
                for (int h = 0; h < nh; h++)
                    k->acc_rows(acc2 + (size_t)h * d, 1.0f, p + h * 64, kv + koff[h], stride, nk,
                                d);
                ASSERT_TRUE(!memcmp(acc1, acc2, (size_t)nh * d * 4));
                tsr_free(q), tsr_free(kv), tsr_free(p), tsr_free(acc1), tsr_free(acc2);
            }
        }
    }
}

/* dot_heads_kv / acc_heads_kv over stored rows (each dtype a table reads in place) give the
 * bits of dot_heads / acc_heads over the rows tsr_kv_rows_decode converts, for every head
 * size the dtype stores (tails for BF16 and FP8), GQA grouping and key; and every E4M3
 * code (NaNs and both zeros included) decodes as tsr_kv_rows_decode's. */
TSR_TEST(test_attention_stored_rows_match_converted) {
    static const int dims[] = {13, 16, 40, 64, 80, 128};
    static const int heads[][2] = {{1, 1}, {5, 5}, {12, 4}, {17, 17}, {32, 8}};
    int checked = 0;
    for (int isa = TSR__ISA_SCALAR; isa <= TSR__ISA_AVX512; isa++) {
        const tsr__cpu_kernels *k = tsr__cpu_kernels_for((tsr__cpu_isa)isa);
        if (!k || !k->kv_rows) continue;
        for (int dt = TSR_KV_BF16; dt <= TSR_KV_FP8; dt++) {
            if (!(k->kv_rows >> dt & 1u)) continue;
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
                for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
                    int d = dims[di], nh = heads[hi][0], g = heads[hi][1], group = nh / g;
                    int nk = 21;
                    int64_t kvd = (int64_t)g * d;
                    size_t rb = tsr_kv_row_bytes(dt, kvd);
                    if (!tsr_kv_dtype_fits(dt, d) || rb == 0) continue;
                    float *q = tsr_malloc((size_t)nh * d * 4);
                    float *src = tsr_malloc((size_t)nk * (size_t)kvd * 4);
                    float *dec = tsr_malloc((size_t)nk * (size_t)kvd * 4);
                    uint8_t *raw = tsr_malloc((size_t)nk * rb);
                    float *p = tsr_malloc((size_t)nh * 64 * 4);
                    float *acc1 = tsr_malloc((size_t)nh * d * 4);
                    float *acc2 = tsr_malloc((size_t)nh * d * 4);
                    float out1[32 * 64], out2[32 * 64];
                    int32_t koff[32];
                    fill(q, (size_t)nh * d);
                    fill(src, (size_t)nk * (size_t)kvd);
                    fill(p, (size_t)nh * 64);
                    fill(acc1, (size_t)nh * d);
                    memcpy(acc2, acc1, (size_t)nh * d * 4);
                    tsr_kv_rows_encode(dt, src, kvd, raw, nk, kvd);
                    tsr_kv_rows_decode(dt, raw, dec, kvd, nk, kvd);
                    for (int h = 0; h < nh; h++) koff[h] = h / group * d;
                    for (int j = 0; j < nk; j++) {
                        k->dot_heads_kv(q, raw + (size_t)j * rb, dt, koff, nh, d, 0.125f,
                                        out1 + j, 64);
                        k->dot_heads(q, dec + (size_t)j * (size_t)kvd, koff, nh, d, 0.125f,
                                     out2 + j, 64);
                    }
                    for (int h = 0; h < nh; h++)
                        ASSERT_TRUE(!memcmp(out1 + h * 64, out2 + h * 64, (size_t)nk * 4));
                    k->acc_heads_kv(acc1, p, 64, raw, (int64_t)rb, dt, koff, nk, nh, d);
                    k->acc_heads(acc2, p, 64, dec, kvd, koff, nk, nh, d);
                    ASSERT_TRUE(!memcmp(acc1, acc2, (size_t)nh * d * 4));
                    checked++;
                    tsr_free(q), tsr_free(src), tsr_free(dec), tsr_free(raw), tsr_free(p);
                    tsr_free(acc1), tsr_free(acc2);
                }
            }
        }
        if (k->kv_rows >> TSR_KV_FP8 & 1u) {
            /* one row of all 256 codes: with p = 1 over a zero accumulator acc_heads_kv
             * leaves fma(1, v, 0), acc_heads the same of the decoded value */
            uint8_t raw[4 + 256];
            float dec[256], acc1[256] = {0}, acc2[256] = {0}, one = 1.0f, sc = 0.37f;
            int32_t koff0 = 0;
            memcpy(raw, &sc, 4);
            for (int c = 0; c < 256; c++) raw[4 + c] = (uint8_t)c;
            tsr_kv_rows_decode(TSR_KV_FP8, raw, dec, 256, 1, 256);
            k->acc_heads_kv(acc1, &one, 1, raw, (int64_t)sizeof raw, TSR_KV_FP8, &koff0, 1, 1,
                            256);
            k->acc_heads(acc2, &one, 1, dec, 256, &koff0, 1, 1, 256);
            ASSERT_TRUE(!memcmp(acc1, acc2, sizeof acc1));
            ASSERT_TRUE(isnan(acc1[0x7f]) && isnan(acc1[0xff]));
        }
    }
    /* the AVX2 table reads BF16, Q8 and FP8 (every x86-64 CPU in use has AVX2) */
    const tsr__cpu_kernels *y = tsr__cpu_kernels_for(TSR__ISA_AVX2);
    if (y) ASSERT_TRUE(checked > 0);
}

/* The rope angles of the last position list are reused (q and k of every layer): a
 * sequence of calls on one backend - repeated positions, new positions of the same count,
 * another count, another theta, back to the first - gives the bits of a fresh backend. */
TSR_TEST(test_rope_angle_cache) {
    tsr_model_config cfg = {.head_dim = 16, .rope_theta = 10000.0f};
    const int32_t pa[3] = {0, 5, 9}, pb[3] = {0, 5, 10}, pc[5] = {7, 8, 9, 10, 11};
    const struct {
        const int32_t *pos;
        int64_t n;
        float theta;
    } calls[] = {{pa, 3, 1e4f}, {pa, 3, 1e4f}, {pb, 3, 1e4f}, {pc, 5, 1e4f}, {pc, 5, 5e5f},
                 {pa, 3, 1e4f}, {pa, 0, 1e4f}, {pb, 3, 1e4f}};
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_backend_cpu_create(1, &be));
    float x[5 * 2 * 16], want[5 * 2 * 16];
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        cfg.rope_theta = calls[c].theta;
        fill(x, sizeof x / sizeof x[0]);
        memcpy(want, x, sizeof x);
        tsr_backend *fresh = NULL;
        ASSERT_OK(tsr_backend_cpu_create(1, &fresh));
        ASSERT_OK(fresh->ops->rope(fresh, want, calls[c].pos, calls[c].n, 2, &cfg));
        tsr_backend_destroy(fresh);
        ASSERT_OK(be->ops->rope(be, x, calls[c].pos, calls[c].n, 2, &cfg));
        ASSERT_TRUE(memcmp(x, want, sizeof x) == 0);
    }
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_matvec_kernels_all_isas, test_matmul_all_dtypes, test_matmul_rejects_bad_input,
              test_rmsnorm, test_rope_vs_reference, test_rope_interleaved_is_permuted_halves,
              test_rope_inv_freq_matches_hf, test_rope_matches_hf, test_rope_angle_cache,
              test_swiglu_add, test_embed, test_buffers, test_attention_row_kernels_match_chunked,
              test_attention_stored_rows_match_converted)
