/* The MXFP4 product's AVX2 and AVX-512 variants (kernels/cpu/mxfp4_avx2.c, mxfp4_avx512.c)
 * against the scalar kernel, bit for bit: every code in both nibbles under every scale byte
 * (NaN where the scalar gives NaN), odd shapes (1 to 17 rows, 32 to 2880 columns, 1 to 9
 * inputs: the fused path up to 4 inputs, the decoded-row path beyond), and the threaded
 * tsr__mxfp4_matmul the backend calls. A variant this CPU lacks is reported and skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/mxfp4_internal.h"
#include "tests/test.h"

static uint32_t rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void fill(float *x, size_t n, uint32_t *s) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(rnd(s) % 20001) - 10000) / 5000.0f;
}

/* Same bits, or both NaN (a NaN's payload is not part of the contract). */
static bool same(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static const char *isa_name[] = {"scalar", "avx2", "avx512"};

/* y of variant isa against the scalar kernel's for one shape; returns the mismatches. */
static int compare(tsr__cpu_isa isa, const uint8_t *q, const uint8_t *sc, int64_t rows,
                   int64_t cols, const float *x, int64_t nx) {
    tsr__mxfp4_rows_fn ref = tsr__mxfp4_rows_for(TSR__ISA_SCALAR), fn = tsr__mxfp4_rows_for(isa);
    float *y0 = malloc((size_t)(rows * nx) * sizeof(float));
    float *y1 = malloc((size_t)(rows * nx) * sizeof(float));
    float *w = malloc((size_t)cols * sizeof(float));
    ref(q, sc, 0, rows, rows, cols, x, nx, y0, w);
    fn(q, sc, 0, rows, rows, cols, x, nx, y1, w);
    int bad = 0;
    for (int64_t i = 0; i < rows * nx; i++)
        if (!same(y0[i], y1[i]) && bad++ < 3)
            fprintf(stderr, "%s rows %lld cols %lld nx %lld: y[%lld] %a, scalar %a\n",
                    isa_name[isa], (long long)rows, (long long)cols, (long long)nx, (long long)i,
                    (double)y1[i], (double)y0[i]);
    free(y0);
    free(y1);
    free(w);
    return bad;
}

/* 256 rows, row s under scale byte s in every block; 512 columns = 16 blocks holding
 * every byte once, so every code meets every scale in both nibble positions. One-hot and
 * random inputs: a one-hot input reads single decoded weights back. */
TSR_TEST(test_every_code_and_scale) {
    const int64_t rows = 256, cols = 512;
    uint8_t *q = malloc((size_t)(rows * cols / 2)), *sc = malloc((size_t)(rows * cols / 32));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols / 2; j++) q[r * cols / 2 + j] = (uint8_t)j;
        memset(sc + r * cols / 32, (int)r, (size_t)(cols / 32));
    }
    float *x = malloc((size_t)(9 * cols) * sizeof(float));
    uint32_t seed = 7;
    for (int isa = TSR__ISA_AVX2; isa <= TSR__ISA_AVX512; isa++) {
        if (!tsr__mxfp4_rows_for((tsr__cpu_isa)isa)) {
            printf("  %s: not on this CPU, skipped\n", isa_name[isa]);
            continue;
        }
        for (int64_t c = 0; c < cols; c += 37) { /* one-hot inputs: single weights */
            memset(x, 0, (size_t)cols * sizeof(float));
            x[c] = 1.0f;
            ASSERT_EQ_INT(compare((tsr__cpu_isa)isa, q, sc, rows, cols, x, 1), 0);
        }
        for (int64_t nx = 1; nx <= 9; nx += 4) {
            fill(x, (size_t)(nx * cols), &seed);
            ASSERT_EQ_INT(compare((tsr__cpu_isa)isa, q, sc, rows, cols, x, nx), 0);
        }
    }
    free(q);
    free(sc);
    free(x);
}

TSR_TEST(test_odd_shapes) {
    static const int64_t rows_l[] = {1, 3, 17}, cols_l[] = {32, 96, 2880};
    uint32_t seed = 11;
    for (int isa = TSR__ISA_AVX2; isa <= TSR__ISA_AVX512; isa++) {
        if (!tsr__mxfp4_rows_for((tsr__cpu_isa)isa)) continue;
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                int64_t rows = rows_l[a], cols = cols_l[b];
                uint8_t *q = malloc((size_t)(rows * cols / 2));
                uint8_t *sc = malloc((size_t)(rows * cols / 32));
                float *x = malloc((size_t)(9 * cols) * sizeof(float));
                for (int64_t i = 0; i < rows * cols / 2; i++) q[i] = (uint8_t)rnd(&seed);
                for (int64_t i = 0; i < rows * cols / 32; i++) sc[i] = (uint8_t)(110 + rnd(&seed) % 30);
                fill(x, (size_t)(9 * cols), &seed);
                for (int64_t nx = 1; nx <= 9; nx++)
                    ASSERT_EQ_INT(compare((tsr__cpu_isa)isa, q, sc, rows, cols, x, nx), 0);
                free(q);
                free(sc);
                free(x);
            }
    }
}

/* The backend's entry (the ISA the CPU backend picked, 1 and 2 threads) equals the scalar
 * kernel. */
TSR_TEST(test_matmul_entry) {
    const int64_t rows = 67, cols = 2880;
    uint32_t seed = 5;
    uint8_t *q = malloc((size_t)(rows * cols / 2)), *sc = malloc((size_t)(rows * cols / 32));
    float *x = malloc((size_t)(6 * cols) * sizeof(float)), *w = malloc((size_t)cols * sizeof(float));
    float y0[6 * 67], y1[6 * 67];
    for (int64_t i = 0; i < rows * cols / 2; i++) q[i] = (uint8_t)rnd(&seed);
    for (int64_t i = 0; i < rows * cols / 32; i++) sc[i] = (uint8_t)(115 + rnd(&seed) % 20);
    fill(x, (size_t)(6 * cols), &seed);
    printf("  the backend's kernel: %s\n", isa_name[tsr__cpu_kernels_get()->isa]);
    for (int64_t nx = 1; nx <= 6; nx += 5)
        for (int threads = 1; threads <= 2; threads++) {
            tsr__mxfp4_rows_for(TSR__ISA_SCALAR)(q, sc, 0, rows, rows, cols, x, nx, y0, w);
            tsr__mxfp4_matmul(q, sc, rows, cols, x, nx, y1, threads);
            ASSERT_TRUE(memcmp(y0, y1, (size_t)(rows * nx) * sizeof(float)) == 0);
        }
    free(q);
    free(sc);
    free(x);
    free(w);
}

TSR_TEST_MAIN(test_every_code_and_scale, test_odd_shapes, test_matmul_entry)
