#include <stdio.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/status.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

#include "tests/policy_util.h"

#include <math.h>

#include "kernels/rope_freq.h"
#include "policies/offload_skew.h"


/* A policy stat by its declared name. */
#define TSR__PS(name) ((int64_t)tsr_kv_policy_stat(&ps, name))
#define TSR__PSD(name) tsr_kv_policy_stat(&ps, name)
#define HD_ 8

/* One layer, one KV head, two query heads; keys are small noise except `hot` positions,
 * which point along the query direction: the speculative score must find them. */
TSR_KV_TEST(test_speculative_selection_and_bytes) {
    tsr_host_pool *host = NULL;
    ASSERT_OK(tsr_host_pool_create(0, &host));
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = HD_,
                              .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                              .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = 32 * tsr_kv_paged_block_bytes(&kc);
    static const tsr_kv_policy_arg args[] = {{"offload-pairs", "2"}, {"offload-recall", "1"}};
    tsr_kv_policy_config pc = {.budget = 12, .args = args, .n_args = 2,
                               .n_heads = 2, .rope_interleaved = 1, .host = host,
                               .owns_host = 1};
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_policy_cache_create(tsr_kv_policy_find("offload"), &pc, &kc, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    enum { N = 100 };
    static float k[N * HD_], v[N * HD_];
    int hot[6] = {3, 17, 42, 55, 71, 90};
    uint32_t r = 7;
    for (int i = 0; i < N * HD_; i++) {
        r = r * 1664525u + 1013904223u;
        k[i] = ((float)((r >> 8) % 1000) / 1000.0f - 0.5f) * 0.2f;
        v[i] = (float)(i / HD_);
    }
    for (int h = 0; h < 6; h++) {
        k[hot[h] * HD_ + 2] = 4.0f; /* channel pair (2, 3): the high-energy pair */
        k[hot[h] * HD_ + 3] = 4.0f;
    }
    int32_t toks[N] = {0};
    ASSERT_OK(kv->ops->reserve(kv, 0, N));
    ASSERT_OK(kvt_write(kv, 0, 0, N, k, v));
    const tsr_kv_span *sp;
    int ns;
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns)); /* prefill: all current tokens resident */
    ASSERT_OK(kv->ops->commit(kv, 0, toks, N));
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(TSR__PS("bytes_offloaded"), N * HD_ * 8);
    /* Decode one token whose queries align with the hot keys. */
    float q[2 * HD_] = {0}, k1[HD_] = {0}, v1[HD_] = {0};
    q[2] = q[3] = 1.0f;
    q[HD_ + 2] = q[HD_ + 3] = 1.0f;
    int32_t qpos = N;
    ASSERT_OK(kv->ops->reserve(kv, 0, 1));
    ASSERT_OK(kvt_write(kv, 0, 0, 1, k1, v1));
    ASSERT_OK(kv->ops->queries(kv, 0, 0, q, &qpos, 1, 2));
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
    int present[N + 1] = {0}, total = 0;
    for (int j = 0; j < ns; j++)
        for (int32_t i = 0; i < sp[j].n; i++, total++) {
            int32_t pos = sp[j].pos ? sp[j].pos[i] : sp[j].pos0 + i;
            present[pos] = 1;
            float v0[HD_]; /* the fetched rows came back through the scatter (a whole row) */
            ASSERT_OK(kvt_read_rows(v0, tsr_kv_rows_at((float *)sp[j].v, sp[j].dtype, HD_,
                                                       i * sp[j].stride), sp[j].dtype, 1,
                                    HD_));
            ASSERT_NEAR(v0[0], pos < N ? (float)pos : 0.0f, 0);
        }
    ASSERT_EQ_INT(total, 12); /* budget: 11 prior + the new token */
    for (int h = 0; h < 6; h++) ASSERT_EQ_INT(present[hot[h]], 1);
    ASSERT_EQ_INT(present[N], 1);
    ASSERT_OK(kv->ops->commit(kv, 0, toks, 1));
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(TSR__PS("spec_selections"), 1);
    ASSERT_TRUE(TSR__PS("spec_recall_n") == 1 && TSR__PSD("spec_recall") >= 6.0 / 11.0);
    ASSERT_EQ_INT(TSR__PS("evictions"), N - 11);
    ASSERT_EQ_INT(TSR__PS("bytes_fetched"), 0); /* all 11 were resident from the prefill */
    /* Next step with queries pointing elsewhere: some tokens must be fetched back. */
    float q2[2 * HD_] = {0};
    q2[0] = q2[1] = 1.0f;
    q2[HD_] = q2[HD_ + 1] = 1.0f;
    for (int i = 0; i < 8; i++) k[10 * HD_ + i] = 0.0f;
    qpos = N + 1;
    ASSERT_OK(kv->ops->reserve(kv, 0, 1));
    ASSERT_OK(kvt_write(kv, 0, 0, 1, k1, v1));
    ASSERT_OK(kv->ops->queries(kv, 0, 0, q2, &qpos, 1, 2));
    ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
    ASSERT_OK(kv->ops->commit(kv, 0, toks, 1));
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_TRUE(TSR__PS("bytes_fetched") > 0 && TSR__PS("bytes_fetched") % (HD_ * 8) == 0);
    ASSERT_EQ_INT(tsr_kv_paged_slots(tsr_kv_policy_mech(kv), 0, 0), 12);
    ASSERT_TRUE(host->used >= (N + 2) * HD_ * 8);
    char json[1024];
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    ASSERT_TRUE(tsr_kv_detail_json(&d, json, sizeof json) > 0);
    ASSERT_EQ_INT((int64_t)tsr_kv_policy_stat(&d.pol, "bytes_fetched"), TSR__PS("bytes_fetched"));
    ASSERT_EQ_INT(d.blocks.block_size, 4);
    ASSERT_STR_CONTAINS(json, "\"policy\":\"offload\"");
    ASSERT_STR_CONTAINS(json, "\"bytes_fetched\":");
    tsr_kv_cache_destroy(kv);
}

TSR_KV_FWD_TEST(test_forward_full_budget_equals_paged) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 50 };
    int32_t tp[GEN], to[GEN], tb[GEN];
    float *lp = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    float *lo = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    tsr_kv_cache *paged = NULL, *off = NULL, *small = NULL;
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "paged", 0, &paged));
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "offload", 1.0, &off));
    ASSERT_OK(tsr__greedy(m, be, paged, prompt, 48, 16, GEN, tp, lp));
    ASSERT_OK(tsr__greedy(m, be, off, prompt, 48, 16, GEN, to, lo));
    for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(tp[g], to[g]);
    for (int i = 0; i < m->cfg.vocab_size; i++) ASSERT_NEAR(lp[i], lo[i], 1e-5);
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(off, &ps);
    ASSERT_EQ_INT(TSR__PS("bytes_offloaded"),
                  (int64_t)(48 + GEN) * m->cfg.n_layers * m->cfg.n_kv_heads * m->cfg.head_dim * 8);
    ASSERT_EQ_INT(TSR__PS("evictions"), 0);
    /* 24-token budget: the resident set stays bounded, the host copy holds everything. */
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "offload", 24, &small));
    ASSERT_OK(tsr__greedy(m, be, small, prompt, 48, 16, GEN, tb, NULL));
    tsr_kv_stats s;
    small->ops->stats(small, &s);
    ASSERT_TRUE(s.tokens_resident <= 24);
    ASSERT_EQ_INT(small->ops->seq_len(small, 0), 48 + GEN);
    tsr_kv_cache_destroy(paged);
    tsr_kv_cache_destroy(off);
    tsr_kv_cache_destroy(small);
    tsr_free(lp);
    tsr_free(lo);
}

/* Through the forward pass (which gives the `queries` hook): decode with a 25 % budget must
 * use the speculative selection, never the recent-window fallback; with every channel pair
 * the speculation is exact (recall 1), and the resident set is not just the newest tokens. */
TSR_KV_FWD_TEST(test_forward_uses_speculation) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = 1 + (i * 37) % (m->cfg.vocab_size - 1);
    enum { GEN = 80 };
    int32_t toks[GEN];
    for (int exact = 0; exact < 2; exact++) {
        char pairs[16];
        snprintf(pairs, sizeof pairs, "%d", exact ? m->cfg.head_dim / 2 : 1);
        tsr_kv_policy_arg args[] = {{"offload-pairs", pairs}, {"offload-recall", "1"}};
        tsr_kv_options o = {.policy = &tsr_kv_policy_offload, .memory_bytes = 8 << 20,
                            .block_size = 16,
                            .budget = 0.25, .max_seqs = 1, .policy_args = args,
                            .n_policy_args = 2, .be = be, .kv_dtype = kvt_dtype_name()};
        tsr_kv_cache *kv = NULL;
        ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
        ASSERT_OK(tsr__greedy(m, be, kv, prompt, 8, 1, GEN, toks, NULL));
        tsr_kv_policy_stats ps;
        tsr_kv_policy_get_stats(kv, &ps);
        ASSERT_TRUE(TSR__PS("spec_selections") > 0);
        ASSERT_EQ_INT(TSR__PS("spec_fallbacks"), 0);
        ASSERT_TRUE(TSR__PS("spec_recall_n") > 0);
        double recall = TSR__PSD("spec_recall");
        if (exact) ASSERT_NEAR(recall, 1.0, 1e-9);
        else ASSERT_TRUE(recall > 0.2 && recall < 1.0);
        ASSERT_TRUE(TSR__PS("bytes_fetched") > 0);
        /* Some layer keeps a token older than the budget's recent window. */
        tsr_kv_cache *mech = tsr_kv_policy_mech(kv);
        int32_t len = kv->ops->seq_len(kv, 0), budget = (len + 3) / 4, old = 0;
        int32_t pos[64];
        for (int l = 0; l < m->cfg.n_layers; l++) {
            int32_t ns = tsr_kv_paged_slots(mech, l, 0);
            ASSERT_TRUE(ns <= budget && ns <= 64);
            ASSERT_OK(tsr_kv_paged_read_slots(mech, l, 0, pos, NULL));
            for (int32_t i = 0; i < ns; i++) old += pos[i] < len - budget;
        }
        ASSERT_TRUE(old > 0);
        tsr_kv_cache_destroy(kv);
    }
}

static uint32_t tsr__rng = 12345u;
static float tsr__rnd(void) { /* uniform in [-0.5, 0.5) */
    tsr__rng = tsr__rng * 1664525u + 1013904223u;
    return (float)((tsr__rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* The skew is exact on rotated vectors: with every column of the transform, (R q) A . (R k)
 * A equals (R q) . (R k) within 1e-5 for queries and keys of the weights at different
 * positions, both rotary layouts; the transform is orthonormal. */
TSR_TEST(test_skew_keeps_qk) {
    enum { HD = 16, DIM = 24, GROUP = 2 };
    static float wq[GROUP * HD * DIM], wk[HD * DIM], norm[DIM];
    for (size_t i = 0; i < sizeof wq / sizeof wq[0]; i++) wq[i] = tsr__rnd();
    for (size_t i = 0; i < sizeof wk / sizeof wk[0]; i++) wk[i] = tsr__rnd();
    for (int i = 0; i < DIM; i++) norm[i] = 0.5f + tsr__rnd();
    tsr_tensor tq = {TSR_F32, GROUP * HD, DIM, wq};
    tsr_tensor tn = {TSR_F32, 1, DIM, norm};
    for (int inter = 0; inter < 2; inter++) {
        tsr_model_config cfg = {.dim = DIM, .head_dim = HD, .n_heads = GROUP, .n_kv_heads = 1,
                                .max_seq_len = 2048, .rope_theta = 10000.0f,
                                .rope_interleaved = inter};
        float inv[HD / 2], a[HD * HD];
        tsr_rope_inv_freq(&cfg, inv);
        ASSERT_OK(tsr_offload_skew_head(&cfg, inv, &tq, 0, GROUP, &tn, HD, a));
        for (int i = 0; i < HD; i++)
            for (int j = 0; j < HD; j++) {
                double d = 0;
                for (int t = 0; t < HD; t++) d += (double)a[i * HD + t] * a[j * HD + t];
                ASSERT_NEAR(d, i == j, 1e-6);
            }
        for (int trial = 0; trial < 20; trial++) {
            float x[DIM], y[DIM], q[GROUP * HD], k[HD];
            for (int i = 0; i < DIM; i++) {
                x[i] = tsr__rnd() * norm[i];
                y[i] = tsr__rnd() * norm[i];
            }
            for (int r = 0; r < GROUP * HD; r++) {
                q[r] = 0;
                for (int i = 0; i < DIM; i++) q[r] += wq[r * DIM + i] * x[i];
            }
            for (int r = 0; r < HD; r++) {
                k[r] = 0;
                for (int i = 0; i < DIM; i++) k[r] += wk[r * DIM + i] * y[i];
            }
            int32_t pq = 17 * trial + 1000, pk = 3 * trial;
            tsr_offload_rope(q, GROUP, HD, inv, inter, pq);
            tsr_offload_rope(k, 1, HD, inv, inter, pk);
            for (int h = 0; h < GROUP; h++) {
                double dot = 0, skew = 0;
                for (int t = 0; t < HD; t++) dot += (double)q[h * HD + t] * k[t];
                for (int c = 0; c < HD; c++) {
                    double qa = 0, ka = 0;
                    for (int t = 0; t < HD; t++) {
                        qa += (double)a[c * HD + t] * q[h * HD + t];
                        ka += (double)a[c * HD + t] * k[t];
                    }
                    skew += qa * ka;
                }
                ASSERT_NEAR(skew, dot, 1e-5);
            }
        }
    }
}

/* The closed-form position average of R(t) C R(t)^T equals the average by brute force,
 * and the first column of a skew holds at least the variance of the best single channel. */
TSR_TEST(test_skew_rope_average) {
    enum { HD = 8, NP = 37 };
    tsr_model_config cfg = {.head_dim = HD, .rope_theta = 10.0f, .max_seq_len = NP};
    float inv[HD / 2];
    tsr_rope_inv_freq(&cfg, inv);
    for (int inter = 0; inter < 2; inter++) {
        double c[HD * HD], ref[HD * HD] = {0};
        for (int i = 0; i < HD; i++)
            for (int j = 0; j <= i; j++) c[i * HD + j] = c[j * HD + i] = tsr__rnd() + (i == j);
        for (int t = 0; t < NP; t++) {
            double r[HD * HD] = {0}, rc[HD * HD] = {0};
            for (int p = 0; p < HD / 2; p++) {
                int a = inter ? 2 * p : p, b = inter ? 2 * p + 1 : p + HD / 2;
                double cs = cos((double)t * inv[p]), sn = sin((double)t * inv[p]);
                r[a * HD + a] = cs;
                r[a * HD + b] = -sn;
                r[b * HD + a] = sn;
                r[b * HD + b] = cs;
            }
            for (int i = 0; i < HD; i++)
                for (int j = 0; j < HD; j++)
                    for (int k = 0; k < HD; k++) rc[i * HD + j] += r[i * HD + k] * c[k * HD + j];
            for (int i = 0; i < HD; i++)
                for (int j = 0; j < HD; j++)
                    for (int k = 0; k < HD; k++)
                        ref[i * HD + j] += rc[i * HD + k] * r[j * HD + k] / NP;
        }
        tsr_offload_rope_average(c, HD, inv, inter, NP);
        for (int i = 0; i < HD * HD; i++) ASSERT_NEAR(c[i], ref[i], 1e-9);
        double w[HD], v[HD * HD], e[HD * HD], best = 0, top = -1;
        memcpy(e, c, sizeof e);
        tsr_offload_eig_sym(e, HD, w, v);
        for (int i = 0; i < HD; i++) {
            best = c[i * HD + i] > best ? c[i * HD + i] : best;
            top = w[i] > top ? w[i] : top;
            double av = 0; /* C v = w v */
            for (int j = 0; j < HD; j++) {
                double cv = 0;
                for (int k = 0; k < HD; k++) cv += c[j * HD + k] * v[k * HD + i];
                av += fabs(cv - w[i] * v[j * HD + i]);
            }
            ASSERT_NEAR(av, 0.0, 1e-9);
        }
        ASSERT_TRUE(top >= best - 1e-12);
    }
}

/* InfiniGen's fetch rule on hand-built logits: per head, the keys within alpha of the
 * head's maximum; the mean over heads, rounded; at least one, at most the cap. */
TSR_TEST(test_alpha_selection) {
    float lg[2][5] = {{10.0f, 7.0f, 5.9f, 6.0f, 1.0f}, {0.0f, 0.5f, 4.0f, -1.0f, 3.9f}};
    ASSERT_NEAR(tsr_offload_alpha_count(lg[0], 1, 5, 4.0f), 3.0, 0); /* 10, 7, 6 */
    ASSERT_NEAR(tsr_offload_alpha_count(lg[1], 1, 5, 4.0f), 4.0, 0); /* 0, .5, 4, 3.9 */
    double n = tsr_offload_alpha_count(&lg[0][0], 2, 5, 4.0f);
    ASSERT_NEAR(n, 7.0, 0);
    ASSERT_EQ_INT(tsr_offload_alpha_fetch(n, 2, 100), 4); /* 3.5 rounds up */
    ASSERT_EQ_INT(tsr_offload_alpha_fetch(n, 2, 3), 3);   /* capped */
    ASSERT_EQ_INT(tsr_offload_alpha_fetch(0.0, 2, 3), 1); /* never nothing */
    ASSERT_NEAR(tsr_offload_alpha_count(&lg[0][0], 2, 5, 0.0f), 2.0, 0); /* the maxima */
    ASSERT_NEAR(tsr_offload_alpha_count(&lg[0][0], 2, 5, 100.0f), 10.0, 0);
}

/* InfiniGen's partial-weight columns on a hand-built head: query energies 8, 7, ... 1 along
 * the unit vectors, keys mostly along the weakest ones: the union of the 2 best by query
 * energy and the 2 best by sum |k.v|; an overlap gives fewer rows (the rest zero); without
 * keys (or width 2) the query side alone. */
TSR_TEST(test_skew_union_cols) {
    enum { HD = 8, NK = 5 };
    double m[HD * HD] = {0}, scratch[2 * HD * HD + 2 * HD];
    for (int i = 0; i < HD; i++) m[i * HD + i] = HD - i;
    for (int i = 0; i < HD; i++) /* upper triangle read: noise below the diagonal */
        for (int j = 0; j < i; j++) m[i * HD + j] = 99.0;
    float k[NK * HD], a[4 * HD];
    int want[3][HD] = {{1, 1, 0, 0, 0, 0, 1, 1}, {1, 1, 0, 1, 0, 0, 0, 0},
                       {1, 1, 0, 0, 0, 0, 0, 0}};
    for (int run = 0; run < 3; run++) {
        for (int t = 0; t < NK; t++)
            for (int i = 0; i < HD; i++) {
                float big = run == 0 ? (i == 7 ? 5.0f : i == 6 ? 2.0f : 0.1f)
                                     : (i == 0 ? 5.0f : i == 3 ? 2.0f : 0.1f);
                k[t * HD + i] = (t & 1 ? -1.0f : 1.0f) * big; /* |k.v| counts either sign */
            }
        int n = tsr_offload_skew_cols(m, HD, run == 2 ? NULL : k, NK, HD, 2, 4, scratch, a);
        int nw = 0, got[HD] = {0};
        for (int i = 0; i < HD; i++) nw += want[run][i];
        ASSERT_EQ_INT(n, nw);
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < HD; i++) {
                double x = fabs(a[r * HD + i]);
                ASSERT_TRUE(x < 1e-6 || (r < n && fabs(x - 1.0) < 1e-6));
                if (x > 0.5) got[i]++;
            }
        for (int i = 0; i < HD; i++) ASSERT_EQ_INT(got[i], want[run][i]);
    }
}

/* The skew mode through the forward pass with the model's weights: at a 100 % budget the
 * same tokens and logits as paged; at 20 % every selection is speculated (none falls back
 * to the recent window), recall is sampled without --measure-recall and bytes are fetched,
 * the resident set stays within the budget; --offload-mode warmup differs in what it picks. */
TSR_KV_FWD_TEST(test_forward_skew_mode) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = 1 + (i * 53) % (m->cfg.vocab_size - 1);
    enum { GEN = 60 };
    int32_t tp[GEN], ts[GEN];
    float *lp = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    float *ls = tsr_malloc((size_t)m->cfg.vocab_size * 4);
    tsr_kv_cache *paged = NULL, *kv = NULL;
    ASSERT_OK(tsr__policy_kv(be, &m->cfg, "paged", 0, &paged));
    ASSERT_OK(tsr__greedy(m, be, paged, prompt, 24, 8, GEN, tp, lp));
    for (int run = 0; run < 3; run++) {
        double budget = run == 0 ? 1.0 : 0.2;
        const tsr_kv_policy_arg warmup[] = {{"offload-mode", "warmup"}};
        tsr_kv_options o = {.policy = &tsr_kv_policy_offload, .memory_bytes = 8 << 20,
                            .block_size = 16,
                            .budget = budget, .max_seqs = 1, .be = be, .kv_dtype = kvt_dtype_name(),
                            .model = kvt_eng->model, .policy_args = warmup,
                            .n_policy_args = run == 2 ? 1 : 0};
        ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
        ASSERT_OK(tsr__greedy(m, be, kv, prompt, 24, run == 0 ? 8 : 1, GEN, ts, ls));
        tsr_kv_policy_stats ps;
        tsr_kv_policy_get_stats(kv, &ps);
        if (run == 0) {
            for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(tp[g], ts[g]);
            for (int i = 0; i < m->cfg.vocab_size; i++) ASSERT_NEAR(lp[i], ls[i], 1e-5);
            ASSERT_EQ_INT(TSR__PS("spec_selections"), 0);
            ASSERT_EQ_INT(TSR__PS("evictions"), 0);
        } else {
            ASSERT_TRUE(TSR__PS("spec_selections") > 0);
            ASSERT_EQ_INT(TSR__PS("spec_fallbacks"), 0);
            ASSERT_TRUE(TSR__PS("spec_recall_n") > 0 &&
                        TSR__PS("spec_recall_n") < TSR__PS("spec_selections"));
            double recall = TSR__PSD("spec_recall");
            ASSERT_TRUE(recall > 0.0 && recall <= 1.0);
            ASSERT_TRUE(TSR__PS("bytes_fetched") > 0);
            tsr_kv_stats s;
            kv->ops->stats(kv, &s);
            int32_t len = kv->ops->seq_len(kv, 0);
            ASSERT_TRUE(s.tokens_resident <= (int64_t)m->cfg.n_layers * ((len + 4) / 5));
            char json[1024];
            tsr_kv_detail d;
            tsr_kv_cache_detail(kv, &d);
            ASSERT_TRUE(tsr_kv_detail_json(&d, json, sizeof json) > 0);
            ASSERT_TRUE(strstr(json, "\"spec_recall\":") && !strstr(json, "\"spec_recall\":-"));
            ASSERT_STR_CONTAINS(json, "\"bytes_fetched_per_token\":");
        }
        tsr_kv_cache_destroy(kv);
    }
    tsr_kv_cache_destroy(paged);
    tsr_free(lp);
    tsr_free(ls);
}

/* --offload-dense-prefill on (the default; run 2 gives no option): a step of several tokens
 * (a prefill chunk) attends to every prior token, fetched back from the host copy, and after
 * its attention (here: the commit, one layer) the resident set is the budgeted selection
 * again, the same tokens as with off, where the chunk keeps budget - chunk of them. A
 * one-token step selects within the budget either way. */
TSR_KV_TEST(test_dense_prefill) {
    int64_t evicted_off = -1;
    for (int run = 0; run < 3; run++) {
        int dense = run > 0;
        tsr_host_pool *host = NULL;
        ASSERT_OK(tsr_host_pool_create(0, &host));
        tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = HD_,
                                  .block_size = 4, .max_seqs = 1, .max_seq_len = 4096,
                                  .be = kvt_be, .kv_dtype = kvt_dtype()};
        kc.memory_bytes = 32 * tsr_kv_paged_block_bytes(&kc);
        const tsr_kv_policy_arg args[] = {{"offload-pairs", "2"},
                                          {"offload-dense-prefill", run == 1 ? "on" : "off"}};
        tsr_kv_policy_config pc = {.budget = 12, .args = args, .n_args = run == 2 ? 1 : 2,
                                   .n_heads = 2, .rope_interleaved = 1, .host = host,
                                   .owns_host = 1};
        tsr_kv_cache *kv = NULL;
        ASSERT_OK(tsr_kv_policy_cache_create(tsr_kv_policy_find("offload"), &pc, &kc, &kv));
        ASSERT_OK(kv->ops->seq_add(kv, 0));
        enum { N = 60, C = 8 };
        static float k[(N + C + 1) * HD_], v[(N + C + 1) * HD_], q[C * 2 * HD_];
        for (int i = 0; i < (N + C + 1) * HD_; i++) {
            k[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
            v[i] = (float)(i / HD_);
        }
        for (int i = 0; i < C * 2 * HD_; i++) q[i] = (float)((i * 13) % 7) / 7.0f - 0.5f;
        int32_t toks[N] = {0}, qpos[C];
        const tsr_kv_span *sp;
        int ns;
        ASSERT_OK(kv->ops->reserve(kv, 0, N));
        ASSERT_OK(kvt_write(kv, 0, 0, N, k, v));
        ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
        ASSERT_OK(kv->ops->commit(kv, 0, toks, N));
        /* a second chunk of C tokens */
        for (int i = 0; i < C; i++) qpos[i] = N + i;
        ASSERT_OK(kv->ops->reserve(kv, 0, C));
        ASSERT_OK(kvt_write(kv, 0, 0, C, k + N * HD_, v + N * HD_));
        ASSERT_OK(kv->ops->queries(kv, 0, 0, q, qpos, C, 2));
        ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
        int total = 0;
        for (int j = 0; j < ns; j++) total += sp[j].n;
        ASSERT_EQ_INT(total, dense ? N + C : 12);
        ASSERT_OK(kv->ops->commit(kv, 0, toks, C));
        /* after the attention: the budgeted set (budget - chunk prior tokens and the chunk),
         * the dense run having evicted the same prior tokens the budgeted selection left */
        tsr_kv_stats s;
        kv->ops->stats(kv, &s);
        ASSERT_EQ_INT(s.tokens_resident, 12);
        tsr_kv_policy_stats ps;
        tsr_kv_policy_get_stats(kv, &ps);
        if (!dense) evicted_off = TSR__PS("evictions");
        else ASSERT_EQ_INT(TSR__PS("evictions"), evicted_off);
        /* a decode step: the budget */
        qpos[0] = N + C;
        ASSERT_OK(kv->ops->reserve(kv, 0, 1));
        ASSERT_OK(kvt_write(kv, 0, 0, 1, k + (N + C) * HD_, v + (N + C) * HD_));
        ASSERT_OK(kv->ops->queries(kv, 0, 0, q, qpos, 1, 2));
        ASSERT_OK(kv->ops->spans(kv, 0, 0, &sp, &ns));
        total = 0;
        for (int j = 0; j < ns; j++) total += sp[j].n;
        ASSERT_EQ_INT(total, 12);
        ASSERT_OK(kv->ops->commit(kv, 0, toks, 1));
        tsr_kv_cache_destroy(kv);
    }
}

/* The overlapped copies (policies/offload_copy.h) against --offload-sync, at 20 %: skew
 * without calibration and with one (--offload-calib 32: the layers' transforms change at
 * 16 and 32 query rows, the steps when the fetch and the write-back of a layer stay
 * synchronous), and warmup (write-backs once the warm-up's 64 rows chose the channels;
 * its selection reads the layer's own queries, so its fetch is queued at the select and
 * waited for there by the compute stream: "late"); the
 * prompt in chunks of 8, then decode: the same tokens and logits, bit for bit. On
 * cpu-fenced the copies go on its streams, which run a copy only when something waits for
 * it, so a missing wait or a staging buffer reused too early changes the bits (or faults):
 * skew's prefetches are taken, write-backs queued, and the run waits fewer times than the
 * synchronous one. On cpu (host memory) nothing is queued. */
TSR_KV_FWD_TEST(test_forward_overlap_same_bits) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    enum { NP = 48, GEN = 40 };
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = 1 + (i * 31) % (m->cfg.vocab_size - 1);
    size_t vb = (size_t)m->cfg.vocab_size * sizeof(float);
    float *lg[2] = {tsr_malloc(vb), tsr_malloc(vb)};
    ASSERT_TRUE(lg[0] && lg[1]);
    for (int run = 0; run < 3; run++) {
        int skew = run < 2;
        int32_t toks[2][GEN];
        int64_t syncs[2] = {0, 0}, streamed[2] = {0, 0};
        for (int sync = 0; sync < 2; sync++) {
            const tsr_kv_policy_arg args[] = {{"offload-mode", skew ? "skew" : "warmup"},
                                              {"offload-calib", run == 1 ? "32" : "0"},
                                              {"offload-sync", "1"}};
            tsr_kv_policy_arg use[3];
            int na = 0;
            use[na++] = args[0];
            if (skew) use[na++] = args[1];
            if (sync) use[na++] = args[2];
            tsr_kv_options o = {.policy = &tsr_kv_policy_offload, .memory_bytes = 8 << 20,
                                .block_size = 16, .budget = 0.2, .max_seqs = 1, .be = be,
                                .kv_dtype = kvt_dtype_name(), .model = kvt_eng->model,
                                .policy_args = use, .n_policy_args = na};
            tsr_kv_cache *kv = NULL;
            ASSERT_OK(tsr_kv_setup(&o, &m->cfg, &kv));
            tsr_backend_counters c;
            if (be->ops->counters) be->ops->counters(be, &c, true);
            ASSERT_OK(tsr__greedy(m, be, kv, prompt, NP, 8, GEN, toks[sync], lg[sync]));
            if (be->ops->counters) {
                be->ops->counters(be, &c, true);
                syncs[sync] = c.syncs;
                streamed[sync] = c.stream_copies;
            }
            tsr_kv_policy_stats ps;
            tsr_kv_policy_get_stats(kv, &ps);
            ASSERT_TRUE(TSR__PS("spec_selections") > 0 && TSR__PS("bytes_fetched") > 0);
            if (sync || be->host_memory) {
                ASSERT_EQ_INT(TSR__PS("copy_prefetches"), 0);
                ASSERT_EQ_INT(TSR__PS("copy_writebacks"), 0);
            } else {
                ASSERT_TRUE(TSR__PS("copy_prefetch_used") > 0);
                if (skew) ASSERT_TRUE(TSR__PS("copy_late") < TSR__PS("copy_prefetch_used"));
                else ASSERT_EQ_INT(TSR__PS("copy_late"), TSR__PS("copy_prefetches"));
                ASSERT_TRUE(TSR__PS("copy_prefetch_used") + TSR__PS("copy_prefetch_dropped") <=
                            TSR__PS("copy_prefetches"));
                ASSERT_TRUE(TSR__PS("copy_writebacks") > 0);
                ASSERT_TRUE(TSR__PS("copy_drains") > 0);
                if (!be->ops->event_elapsed) ASSERT_TRUE(TSR__PSD("copy_hidden") == -1.0);
            }
            tsr_kv_cache_destroy(kv);
        }
        for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(toks[0][g], toks[1][g]);
        ASSERT_TRUE(memcmp(lg[0], lg[1], vb) == 0);
        if (be->ops->counters && !be->host_memory) {
            ASSERT_TRUE(streamed[0] > 0 && streamed[1] == 0);
            ASSERT_TRUE(syncs[0] < syncs[1]);
        }
    }
    tsr_free(lg[0]);
    tsr_free(lg[1]);
}

TSR_TEST_MAIN(test_speculative_selection_and_bytes, test_forward_full_budget_equals_paged,
              test_forward_uses_speculation, test_skew_keeps_qk, test_skew_rope_average,
              test_alpha_selection, test_skew_union_cols, test_forward_skew_mode,
              test_dense_prefill, test_forward_overlap_same_bits)
