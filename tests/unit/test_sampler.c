#include <math.h>
#include "base/status.h"
#include "runtime/sampler.h"
#include "tests/test.h"

TSR_TEST(test_greedy_picks_argmax) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .seed = 1};
    ASSERT_OK(tsr_sampler_init(&s, 5, &p));
    float logits[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
    ASSERT_EQ_INT(tsr_sampler_sample(&s, logits), 1); /* lowest index on ties */
    tsr_sampler_free(&s);
}

/* tsr_argmax equals the plain first-maximum scan, ties, signed zeros and NaNs included. */
TSR_TEST(test_argmax_equals_scan) {
    float x[77];
    uint32_t r = 7;
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + trial % 77;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            int v = (int)(r >> 24) % 9 - 4; /* few distinct values: many ties */
            x[i] = (float)v;
            if (v == 0 && (r & 1)) x[i] = -0.0f;
            if ((r >> 8) % 29 == 0) x[i] = NAN;
            if ((r >> 8) % 31 == 0) x[i] = -INFINITY;
        }
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[best]) best = i;
        if (tsr_argmax(x, n) != best)
            TSR_FAIL_("trial %d (n %d): argmax %d, scan %d", trial, n, tsr_argmax(x, n), best);
    }
}

static void draw(uint64_t seed, float temp, float top_p, int top_k, int32_t *out, int n) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = temp, .top_p = top_p, .top_k = top_k, .seed = seed};
    if (tsr_sampler_init(&s, 8, &p) != TSR_OK) return;
    for (int i = 0; i < n; i++) {
        float logits[8] = {1.0f, 0.5f, 0.2f, 0.1f, 0.0f, -0.5f, -1.0f, -2.0f};
        out[i] = tsr_sampler_sample(&s, logits);
    }
    tsr_sampler_free(&s);
}

TSR_TEST(test_seeded_reproducible) {
    int32_t a[64], b[64], c[64];
    draw(7, 1.0f, 1.0f, 0, a, 64);
    draw(7, 1.0f, 1.0f, 0, b, 64);
    draw(8, 1.0f, 1.0f, 0, c, 64);
    int same = 1, differ = 0;
    for (int i = 0; i < 64; i++) {
        same &= a[i] == b[i];
        differ |= a[i] != c[i];
    }
    ASSERT_TRUE(same);
    ASSERT_TRUE(differ);
}

TSR_TEST(test_top_k_restricts) {
    int32_t a[200];
    draw(3, 1.0f, 1.0f, 2, a, 200);
    int seen[8] = {0};
    for (int i = 0; i < 200; i++) seen[a[i]]++;
    ASSERT_TRUE(seen[0] > 0 && seen[1] > 0);
    for (int i = 2; i < 8; i++) ASSERT_EQ_INT(seen[i], 0);
}

TSR_TEST(test_top_p_restricts) {
    /* softmax of the logits: p0 ~ 0.33, p1 ~ 0.20; top-p 0.3 keeps only token 0. */
    int32_t a[100];
    draw(5, 1.0f, 0.3f, 0, a, 100);
    for (int i = 0; i < 100; i++) ASSERT_EQ_INT(a[i], 0);
}

TSR_TEST(test_distribution_matches_softmax) {
    int32_t a[20000];
    draw(11, 1.0f, 1.0f, 0, a, 20000);
    float logits[8] = {1.0f, 0.5f, 0.2f, 0.1f, 0.0f, -0.5f, -1.0f, -2.0f};
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp(logits[i]);
    int count0 = 0;
    for (int i = 0; i < 20000; i++) count0 += a[i] == 0;
    ASSERT_NEAR(count0 / 20000.0, exp(1.0) / z, 0.02);
}

TSR_TEST(test_rejects_bad_params) {
    tsr_sampler s;
    tsr_sampler_params p = {.temperature = -1.0f, .top_p = 1.0f};
    ASSERT_EQ_INT(tsr_sampler_init(&s, 4, &p), TSR_ERR_INVALID);
    p = (tsr_sampler_params){.temperature = 1.0f, .top_p = 0.0f};
    ASSERT_EQ_INT(tsr_sampler_init(&s, 4, &p), TSR_ERR_INVALID);
}

TSR_TEST_MAIN(test_greedy_picks_argmax, test_argmax_equals_scan, test_seeded_reproducible, test_top_k_restricts,
              test_top_p_restricts, test_distribution_matches_softmax, test_rejects_bad_params)
