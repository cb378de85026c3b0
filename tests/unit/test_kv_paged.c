#include <stdint.h>

#include "kernels/backend.h"
#include "memory/host_pool.h"
#include "memory/kv_cache.h"
#include "memory/kv_paged.h"
#include "base/alloc.h"
#include "base/status.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

#define L_ 2
#define G_ 2
#define HD_ 4
#define KVD_ (G_ * HD_)

static float tsr__val(int layer, int32_t pos, int c, int is_v) {
    return kvt_round((float)(layer * 100000 + pos * 10 + c) * (is_v ? -1.0f : 1.0f));
}

static tsr_status tsr__mk(int block, int64_t blocks, int prefix, tsr_host_pool *host,
                          tsr_kv_cache **kv) {
    tsr_kv_paged_config c = {.n_layers = L_, .n_kv_heads = G_, .head_dim = HD_,
                             .block_size = block, .max_seqs = 4, .max_seq_len = 8192,
                             .prefix_caching = prefix, .keep_scores = 1, .host = host,
                             .be = kvt_be, .kv_dtype = kvt_dtype()};
    c.memory_bytes = blocks * tsr_kv_paged_block_bytes(&c);
    return tsr_kv_paged_create(&c, kv);
}

/* One step of the forward's call order with synthetic rows derived from (layer, pos). */
static tsr_status tsr__step(tsr_kv_cache *kv, int seq, const int32_t *toks, int32_t n) {
    TSR_TRY(kv->ops->reserve(kv, seq, n));
    int32_t len = kv->ops->seq_len(kv, seq);
    float *k = tsr_malloc((size_t)n * KVD_ * 4), *v = tsr_malloc((size_t)n * KVD_ * 4);
    for (int l = 0; l < L_; l++) {
        for (int32_t i = 0; i < n; i++)
            for (int c = 0; c < KVD_; c++) {
                k[i * KVD_ + c] = tsr__val(l, len + i, c, 0);
                v[i * KVD_ + c] = tsr__val(l, len + i, c, 1);
            }
        TSR_TRY(kvt_write(kv, l, seq, n, k, v));
    }
    tsr_free(k);
    tsr_free(v);
    return kv->ops->commit(kv, seq, toks, n);
}

/* A span's K and V rows, downloaded from backend memory into k, v ([n][KVD_]). */
static int tsr__span_rows(const tsr_kv_span *sp, float *k, float *v) {
    if (sp->stride != KVD_) return 0;
    return kvt_read_rows(k, sp->k, sp->dtype, (size_t)sp->n, KVD_) == TSR_OK &&
           kvt_read_rows(v, sp->v, sp->dtype, (size_t)sp->n, KVD_) == TSR_OK;
}

/* Every span row holds the value of its position (and contiguous positions 0..n-1), read
 * through the spans (downloads) and through the gather of table slots. */
static int tsr__check_rows(tsr_kv_cache *kv, int seq, int32_t n) {
    float k[64 * KVD_], v[64 * KVD_];
    for (int l = 0; l < L_; l++) {
        const tsr_kv_span *sp;
        int ns;
        if (kv->ops->spans(kv, l, seq, &sp, &ns) != TSR_OK) return 0;
        int32_t total = 0;
        for (int j = 0; j < ns; j++) {
            if (sp[j].n > 64 || !tsr__span_rows(&sp[j], k, v)) return 0;
            for (int32_t i = 0; i < sp[j].n; i++, total++) {
                int32_t pos = sp[j].pos ? sp[j].pos[i] : sp[j].pos0 + i;
                if (pos != total) return 0;
                for (int c = 0; c < KVD_; c++)
                    if (k[i * KVD_ + c] != tsr__val(l, pos, c, 0) ||
                        v[i * KVD_ + c] != tsr__val(l, pos, c, 1))
                        return 0;
            }
        }
        if (total != n) return 0;
        for (int32_t at = 0; at < n; at += 64) {
            int32_t m = n - at < 64 ? n - at : 64, slots[64];
            for (int32_t i = 0; i < m; i++) slots[i] = at + i;
            if (tsr_kv_paged_gather(kv, l, seq, slots, m, k, v) != TSR_OK) return 0;
            for (int32_t i = 0; i < m; i++)
                for (int c = 0; c < KVD_; c++)
                    if (k[i * KVD_ + c] != tsr__val(l, at + i, c, 0) ||
                        v[i * KVD_ + c] != tsr__val(l, at + i, c, 1))
                        return 0;
        }
    }
    return 1;
}

TSR_KV_TEST(test_write_spans_blocks) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 64, 1, NULL, &kv));
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = i % 7;
    ASSERT_OK(tsr__step(kv, 0, toks, 37));
    ASSERT_OK(tsr__step(kv, 0, toks + 37, 1));
    ASSERT_OK(tsr__step(kv, 0, toks + 38, 30));
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 68);
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, 0, 0, NULL), 5);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 68));
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.tokens_resident, 68);
    ASSERT_EQ_INT(s.bytes_used, 10 * (s.bytes_capacity / 64));
    kv->ops->seq_free(kv, 0);
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), 64);
    tsr_kv_cache_destroy(kv);
}

/* Each layer's blocks follow each other in the stores (one run of rows for attention to
 * read), through a prefill, single-token steps and a second sequence after the first. */
static int tsr__layers_adjacent(tsr_kv_cache *kv, int seq) {
    for (int l = 0; l < L_; l++) {
        const tsr_kv_span *sp;
        int ns;
        if (kv->ops->spans(kv, l, seq, &sp, &ns) != TSR_OK) return 0;
        for (int j = 1; j < ns; j++)
            if (sp[j].k != tsr_kv_rows_at((float *)sp[j - 1].k, sp[j].dtype, KVD_, 32 * KVD_) ||
                sp[j].v != tsr_kv_rows_at((float *)sp[j - 1].v, sp[j].dtype, KVD_, 32 * KVD_))
                return 0;
    }
    return 1;
}

TSR_KV_TEST(test_layer_blocks_adjacent) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 64, 1, NULL, &kv));
    int32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = i % 11;
    for (int round = 0; round < 2; round++) {
        ASSERT_OK(kv->ops->seq_add(kv, 0));
        ASSERT_OK(tsr__step(kv, 0, toks, 40));
        for (int i = 40; i < 200; i++) ASSERT_OK(tsr__step(kv, 0, toks + i, 1));
        ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, 0, 0, NULL), 13);
        ASSERT_TRUE(tsr__check_rows(kv, 0, 200));
        ASSERT_TRUE(tsr__layers_adjacent(kv, 0));
        kv->ops->seq_free(kv, 0);
        ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), 64);
    }
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_shared_prefix_one_copy) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 400, 1, NULL, &kv));
    enum { P = 1024 };
    static int32_t a[P + 5], b[P + 7];
    for (int i = 0; i < P; i++) a[i] = b[i] = (i * 31) % 500;
    for (int i = 0; i < 5; i++) a[P + i] = 1;
    for (int i = 0; i < 7; i++) b[P + i] = 2;
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_EQ_INT(kv->ops->prefix_attach(kv, 0, a, P + 5), 0);
    ASSERT_OK(tsr__step(kv, 0, a, 512));
    ASSERT_OK(tsr__step(kv, 0, a + 512, P + 5 - 512));
    int32_t used_a = 400 - tsr_kv_paged_free_blocks(kv);
    ASSERT_EQ_INT(used_a, L_ * 65); /* 1029 tokens: 65 blocks per layer */
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    int32_t hit = kv->ops->prefix_attach(kv, 1, b, P + 7);
    ASSERT_EQ_INT(hit, P);
    ASSERT_OK(tsr__step(kv, 1, b + P, 7));
    /* The shared 1K prefix exists once: b adds only its own tail block per layer. */
    ASSERT_EQ_INT(400 - tsr_kv_paged_free_blocks(kv), L_ * 65 + L_ * 1);
    for (int l = 0; l < L_; l++) {
        const int32_t *ia, *ib;
        ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, l, 0, &ia), 65);
        ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, l, 1, &ib), 65);
        for (int i = 0; i < 64; i++) ASSERT_EQ_INT(ia[i], ib[i]);
        ASSERT_NE_INT(ia[64], ib[64]);
    }
    ASSERT_TRUE(tsr__check_rows(kv, 1, P + 7));
    /* The cap: a prompt that is exactly the cached prefix still computes its last token. */
    ASSERT_OK(kv->ops->seq_add(kv, 2));
    ASSERT_EQ_INT(kv->ops->prefix_attach(kv, 2, a, P), P - 16);
    tsr_kv_paged_stats ps;
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.prefix_hit_tokens, P + P - 16);
    /* A differing first block misses. */
    ASSERT_OK(kv->ops->seq_add(kv, 3));
    int32_t c[40] = {9};
    ASSERT_EQ_INT(kv->ops->prefix_attach(kv, 3, c, 40), 0);
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_copy_on_write) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 64, 1, NULL, &kv));
    int32_t toks[40] = {0};
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, toks, 21)); /* 2 blocks, the second holds 5 */
    ASSERT_OK(tsr_kv_paged_fork(kv, 0, 1));
    ASSERT_EQ_INT(64 - tsr_kv_paged_free_blocks(kv), L_ * 2); /* all shared */
    const int32_t *i0, *i1;
    /* Writing seq 1's next token copies its shared partial block first. */
    ASSERT_OK(kv->ops->reserve(kv, 1, 1));
    float k[KVD_], v[KVD_];
    for (int c = 0; c < KVD_; c++) k[c] = v[c] = 777.0f;
    for (int l = 0; l < L_; l++) ASSERT_OK(kvt_write(kv, l, 1, 1, k, v));
    ASSERT_OK(kv->ops->commit(kv, 1, toks, 1));
    tsr_kv_paged_stats ps;
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.cow_copies, L_);
    ASSERT_EQ_INT(64 - tsr_kv_paged_free_blocks(kv), L_ * 3);
    for (int l = 0; l < L_; l++) {
        tsr_kv_paged_seq_blocks(kv, l, 0, &i0);
        tsr_kv_paged_seq_blocks(kv, l, 1, &i1);
        ASSERT_EQ_INT(i0[0], i1[0]);
        ASSERT_NE_INT(i0[1], i1[1]);
    }
    /* seq 0 is untouched; seq 1 has the copied rows and its own new one. */
    ASSERT_TRUE(tsr__check_rows(kv, 0, 21));
    float rk[2 * KVD_], rv[2 * KVD_];
    int32_t rows[2] = {20, 21};
    ASSERT_OK(tsr_kv_paged_gather(kv, 1, 1, rows, 2, rk, rv));
    ASSERT_NEAR(rk[3], tsr__val(1, 20, 3, 0), 0);
    ASSERT_NEAR(rv[3], tsr__val(1, 20, 3, 1), 0);
    ASSERT_NEAR(rk[KVD_ + 3], kvt_round(777.0f), 0);
    ASSERT_OK(tsr_kv_paged_gather(kv, 1, 1, rows + 1, 1, NULL, rv)); /* V only */
    ASSERT_NEAR(rv[3], kvt_round(777.0f), 0);
    int32_t bad[1] = {22};
    ASSERT_EQ_INT(tsr_kv_paged_gather(kv, 1, 1, bad, 1, rk, rv), TSR_ERR_INVALID);
    /* seq 0 writing its own next token: its block is private again (ref 1), no copy. */
    ASSERT_OK(tsr__step(kv, 0, toks, 1));
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.cow_copies, L_);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 22));
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_cached_blocks_lru_eviction) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(4, 16, 1, NULL, &kv)); /* 8 blocks per layer of 4 tokens */
    int32_t a[17], z[32];
    for (int i = 0; i < 17; i++) a[i] = 100 + i;
    for (int i = 0; i < 32; i++) z[i] = 300 + i;
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, a, 17)); /* 5 blocks per layer, 4 full (hashed) */
    kv->ops->seq_free(kv, 0);
    tsr_kv_paged_stats ps;
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.blocks_used, 0);
    ASSERT_EQ_INT(ps.blocks_cached, L_ * 4);
    /* Freed blocks remain hits. */
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    ASSERT_EQ_INT(kv->ops->prefix_attach(kv, 1, a, 17), 16);
    kv->ops->seq_free(kv, 1);
    /* A new sequence takes 3 never-used blocks per layer... then the LRU ones: the freed
     * tails go first (reverse order), so the head of a's prefix survives longest. */
    ASSERT_OK(kv->ops->seq_add(kv, 2));
    ASSERT_OK(tsr__step(kv, 2, z, 20)); /* 5 blocks per layer = 10 blocks */
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_TRUE(ps.cached_evictions > 0);
    ASSERT_OK(kv->ops->seq_add(kv, 3));
    int32_t hit = kv->ops->prefix_attach(kv, 3, a, 17);
    ASSERT_TRUE(hit > 0 && hit < 16);
    ASSERT_TRUE(tsr__check_rows(kv, 2, 20));
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_no_blocks_vs_budget) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 8, 0, NULL, &kv)); /* 8 blocks: 64 tokens per sequence max */
    int32_t toks[80] = {0};
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    ASSERT_EQ_INT(kv->ops->reserve(kv, 0, 65), TSR_ERR_BUDGET);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--kv-memory");
    ASSERT_OK(tsr__step(kv, 0, toks, 40)); /* 6 blocks */
    int32_t free0 = tsr_kv_paged_free_blocks(kv);
    ASSERT_EQ_INT(kv->ops->reserve(kv, 1, 40), TSR_ERR_NO_BLOCKS);
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), free0); /* nothing changed */
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, 0, 1, NULL), 0);
    ASSERT_OK(tsr__step(kv, 1, toks, 16));
    kv->ops->seq_free(kv, 0);
    ASSERT_OK(tsr__step(kv, 1, toks, 40));
    ASSERT_TRUE(tsr__check_rows(kv, 1, 56));
    tsr_kv_cache_destroy(kv);
    tsr_kv_paged_config c = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .max_seqs = 1,
                             .max_seq_len = 10, .memory_bytes = 10, .be = kvt_be, .kv_dtype = kvt_dtype()};
    ASSERT_EQ_INT(tsr_kv_paged_create(&c, &kv), TSR_ERR_BUDGET);
    /* The store is backend memory: no backend, no cache (one clear line). */
    c.memory_bytes = 1 << 20;
    c.be = NULL;
    ASSERT_EQ_INT(tsr_kv_paged_create(&c, &kv), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "no backend");
}

TSR_KV_TEST(test_swap_out_in) {
    tsr_host_pool *host = NULL;
    ASSERT_OK(tsr_host_pool_create(1 << 20, &host));
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 12, 1, host, &kv));
    int32_t toks[90] = {0};
    for (int i = 0; i < 90; i++) toks[i] = i;
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    ASSERT_OK(tsr__step(kv, 0, toks, 40)); /* 6 blocks */
    ASSERT_EQ_INT(kv->ops->reserve(kv, 1, 90), TSR_ERR_NO_BLOCKS);
    /* Preempt seq 0 by swapping; seq 1 runs; then seq 0 comes back intact. */
    ASSERT_OK(tsr_kv_paged_swap_out(kv, 0));
    ASSERT_TRUE(tsr_kv_paged_is_swapped(kv, 0));
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), 12);
    ASSERT_TRUE(host->used > 0);
    ASSERT_EQ_INT(kv->ops->reserve(kv, 0, 1), TSR_ERR_INVALID);
    ASSERT_OK(tsr__step(kv, 1, toks, 90));
    ASSERT_EQ_INT(tsr_kv_paged_swap_in(kv, 0), TSR_ERR_NO_BLOCKS);
    kv->ops->seq_free(kv, 1);
    ASSERT_OK(tsr_kv_paged_swap_in(kv, 0));
    ASSERT_EQ_INT(host->used, 0);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 40);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 40));
    ASSERT_OK(tsr__step(kv, 0, toks + 40, 9));
    ASSERT_TRUE(tsr__check_rows(kv, 0, 49));
    tsr_kv_paged_stats ps;
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.swap_out_bytes, ps.swap_in_bytes);
    ASSERT_EQ_INT(ps.swap_out_bytes, 40 * L_ * (KVD_ * 8 + 8));
    tsr_kv_cache_destroy(kv);
    tsr_host_pool_destroy(host);
}

/* The interface's swap ops: the check answers without a change (the host pool's budget for
 * a swap-out, free blocks for the rows and the next token for a swap-in), a step reserved
 * but not run is abandoned by the swap-out, and the rows come back intact. */
TSR_KV_TEST(test_swap_ops_check_and_abandon) {
    int64_t one = 40 * L_ * (KVD_ * 8 + 8); /* a 40-token sequence swapped out */
    tsr_host_pool *host = NULL;
    ASSERT_OK(tsr_host_pool_create(one, &host));
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 12, 1, host, &kv));
    ASSERT_TRUE(tsr_kv_can_swap(kv));
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = i;
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(kv->ops->seq_add(kv, 1));
    ASSERT_OK(tsr__step(kv, 0, toks, 40));
    ASSERT_OK(tsr__step(kv, 1, toks, 16));
    int32_t free0 = tsr_kv_paged_free_blocks(kv);
    int64_t b = 0;
    ASSERT_OK(tsr_kv_swap_out(kv, 0, 1, &b));
    ASSERT_EQ_INT(b, one);
    ASSERT_TRUE(!tsr_kv_paged_is_swapped(kv, 0));
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), free0);
    ASSERT_EQ_INT(host->used, 0);
    /* reserved for 8 more tokens, then preempted before the step ran */
    ASSERT_OK(kv->ops->reserve(kv, 0, 8));
    ASSERT_OK(tsr_kv_swap_out(kv, 0, 0, &b));
    ASSERT_EQ_INT(b, one);
    ASSERT_TRUE(tsr_kv_paged_is_swapped(kv, 0));
    ASSERT_EQ_INT(host->used, one);
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), 12 - L_); /* seq 1's block per layer */
    /* the host pool is full: seq 1 stays, both as check and as call */
    ASSERT_EQ_INT(tsr_kv_swap_out(kv, 1, 1, &b), TSR_ERR_NO_BLOCKS);
    ASSERT_EQ_INT(tsr_kv_swap_out(kv, 1, 0, &b), TSR_ERR_NO_BLOCKS);
    ASSERT_TRUE(!tsr_kv_paged_is_swapped(kv, 1));
    ASSERT_TRUE(tsr__check_rows(kv, 1, 16));
    /* seq 1 grows to 6 blocks: 6 free, seq 0 needs 3 per layer (40 rows and one more) */
    ASSERT_OK(tsr__step(kv, 1, toks + 16, 32));
    ASSERT_OK(tsr_kv_swap_in(kv, 0, 1, NULL));
    ASSERT_OK(tsr__step(kv, 1, toks + 48, 1)); /* 4 blocks a layer: 4 free */
    ASSERT_EQ_INT(tsr_kv_swap_in(kv, 0, 1, NULL), TSR_ERR_NO_BLOCKS);
    ASSERT_EQ_INT(tsr_kv_swap_in(kv, 0, 0, NULL), TSR_ERR_NO_BLOCKS);
    ASSERT_TRUE(tsr_kv_paged_is_swapped(kv, 0));
    kv->ops->seq_free(kv, 1);
    ASSERT_OK(tsr_kv_swap_in(kv, 0, 0, &b));
    ASSERT_EQ_INT(b, one);
    ASSERT_EQ_INT(host->used, 0);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 40);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 40));
    ASSERT_OK(tsr__step(kv, 0, toks + 40, 8));
    ASSERT_TRUE(tsr__check_rows(kv, 0, 48));
    tsr_kv_cache_destroy(kv);
    tsr_host_pool_destroy(host);
}

TSR_KV_TEST(test_drop_recompute) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(16, 16, 1, NULL, &kv));
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = i + 3;
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, toks, 40));
    const int32_t *hist;
    int32_t n;
    ASSERT_OK(tsr_kv_paged_drop(kv, 0, &hist, &n));
    ASSERT_EQ_INT(n, 40);
    ASSERT_EQ_INT(hist[39], 42);
    ASSERT_EQ_INT(kv->ops->seq_len(kv, 0), 0);
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(kv), 16);
    /* Recompute: the full blocks are still cached, only the tail is fed again. */
    int32_t hit = kv->ops->prefix_attach(kv, 0, hist, n);
    ASSERT_EQ_INT(hit, 32);
    ASSERT_OK(tsr__step(kv, 0, hist + hit, n - hit));
    ASSERT_TRUE(tsr__check_rows(kv, 0, 40));
    tsr_kv_cache_destroy(kv);
}

TSR_KV_TEST(test_evict_compacts) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(4, 16, 0, NULL, &kv));
    int32_t toks[10] = {0};
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, toks, 10)); /* 3 blocks per layer */
    int32_t ev[4] = {1, 4, 9, 5};
    ASSERT_OK(tsr_kv_paged_evict(kv, 1, 0, ev, 4));
    ASSERT_EQ_INT(tsr_kv_paged_slots(kv, 1, 0), 6);
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, 1, 0, NULL), 2);
    ASSERT_EQ_INT(tsr_kv_paged_seq_blocks(kv, 0, 0, NULL), 3);
    const tsr_kv_span *sp;
    int ns;
    ASSERT_OK(kv->ops->spans(kv, 1, 0, &sp, &ns));
    int seen[10] = {0}, total = 0;
    float rk[4 * KVD_], rv[4 * KVD_];
    for (int j = 0; j < ns; j++) {
        ASSERT_TRUE(tsr__span_rows(&sp[j], rk, rv));
        for (int32_t i = 0; i < sp[j].n; i++, total++) {
            int32_t pos = sp[j].pos ? sp[j].pos[i] : sp[j].pos0 + i;
            seen[pos]++;
            ASSERT_NEAR(rk[i * KVD_ + 2], tsr__val(1, pos, 2, 0), 0);
            ASSERT_NEAR(rv[i * KVD_ + 2], tsr__val(1, pos, 2, 1), 0);
        }
    }
    ASSERT_EQ_INT(total, 6);
    int expect[10] = {1, 0, 1, 1, 0, 0, 1, 1, 1, 0};
    for (int i = 0; i < 10; i++) ASSERT_EQ_INT(seen[i], expect[i]);
    /* The next token lands after the compacted rows. */
    ASSERT_OK(tsr__step(kv, 0, toks, 1));
    ASSERT_EQ_INT(tsr_kv_paged_slots(kv, 1, 0), 7);
    ASSERT_EQ_INT(tsr_kv_paged_slots(kv, 0, 0), 11);
    tsr_kv_stats s;
    kv->ops->stats(kv, &s);
    ASSERT_EQ_INT(s.evictions, 4);
    tsr_kv_cache_destroy(kv);
}

/* Eviction in a forked sequence: the blocks that receive rows are shared, so they are
 * copied first, and those copies and the compaction's moves run as one ordered kv_copy.
 * The source sequence keeps every row; the fork keeps exactly the rows not evicted. */
TSR_KV_TEST(test_evict_shared_blocks) {
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr__mk(4, 32, 0, NULL, &kv));
    int32_t toks[14] = {0};
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, toks, 14)); /* 4 blocks per layer, all shared after fork */
    ASSERT_OK(tsr_kv_paged_fork(kv, 0, 1));
    int32_t ev[5] = {0, 2, 5, 9, 12};
    ASSERT_OK(tsr_kv_paged_evict(kv, 0, 1, ev, 5));
    tsr_kv_paged_stats ps;
    tsr_kv_paged_get_stats(kv, &ps);
    ASSERT_TRUE(ps.cow_copies >= 2);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 14));
    int32_t n = tsr_kv_paged_slots(kv, 0, 1);
    ASSERT_EQ_INT(n, 9);
    int32_t pos[9];
    float k[9 * KVD_], v[9 * KVD_];
    ASSERT_OK(tsr_kv_paged_read_slots(kv, 0, 1, pos, NULL));
    ASSERT_OK(tsr_kv_paged_gather(kv, 0, 1, NULL, n, k, v));
    int seen[14] = {0};
    for (int32_t i = 0; i < n; i++) {
        seen[pos[i]]++;
        for (int c = 0; c < KVD_; c++) {
            ASSERT_NEAR(k[i * KVD_ + c], tsr__val(0, pos[i], c, 0), 0);
            ASSERT_NEAR(v[i * KVD_ + c], tsr__val(0, pos[i], c, 1), 0);
        }
    }
    int expect[14] = {0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1};
    for (int i = 0; i < 14; i++) ASSERT_EQ_INT(seen[i], expect[i]);
    tsr_kv_cache_destroy(kv);
}

/* One backend call per operation, never one per row (a GPU launch per row would be slow):
 * the KV row ops of kvt_be, counted through a wrapping vtable. */
static const tsr_backend_ops *tsr__inner_ops;
static int tsr__n_write, tsr__n_copy, tsr__n_gather, tsr__n_scatter;
static tsr_backend *tsr__inner_be;

static tsr_status tsr__cnt_write(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                                 int64_t n, const float *k, const float *v) {
    (void)be;
    tsr__n_write++;
    return tsr__inner_ops->kv_write(tsr__inner_be, lay, slots, n, k, v);
}
static tsr_status tsr__cnt_copy(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *dst,
                                const int32_t *src, int64_t n) {
    (void)be;
    tsr__n_copy++;
    return tsr__inner_ops->kv_copy(tsr__inner_be, lay, dst, src, n);
}
static tsr_status tsr__cnt_gather(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                                  int64_t n, float *k, float *v, tsr_stream *stream) {
    (void)be;
    tsr__n_gather++;
    return tsr__inner_ops->kv_gather(tsr__inner_be, lay, slots, n, k, v, stream);
}
static tsr_status tsr__cnt_scatter(tsr_backend *be, const tsr_kv_layout *lay,
                                   const int32_t *slots, int64_t n, const float *k,
                                   const float *v, tsr_stream *stream) {
    (void)be;
    tsr__n_scatter++;
    return tsr__inner_ops->kv_scatter(tsr__inner_be, lay, slots, n, k, v, stream);
}

TSR_KV_TEST(test_one_backend_call_per_operation) {
    tsr_backend_ops ops = *kvt_be->ops;
    ops.kv_write = tsr__cnt_write;
    ops.kv_copy = tsr__cnt_copy;
    ops.kv_gather = tsr__cnt_gather;
    ops.kv_scatter = tsr__cnt_scatter;
    tsr__inner_ops = kvt_be->ops;
    tsr__inner_be = kvt_be;
    tsr_backend counted = *kvt_be;
    counted.ops = &ops;
    tsr_host_pool *host = NULL;
    ASSERT_OK(tsr_host_pool_create(0, &host));
    tsr_kv_paged_config c = {.n_layers = L_, .n_kv_heads = G_, .head_dim = HD_,
                             .block_size = 4, .max_seqs = 2, .max_seq_len = 256,
                             .keep_scores = 1, .host = host, .be = &counted, .kv_dtype = kvt_dtype()};
    c.memory_bytes = 64 * tsr_kv_paged_block_bytes(&c);
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_paged_create(&c, &kv));
    tsr__n_write = tsr__n_copy = tsr__n_gather = tsr__n_scatter = 0;
    int32_t toks[37] = {0};
    ASSERT_OK(kv->ops->seq_add(kv, 0));
    ASSERT_OK(tsr__step(kv, 0, toks, 37)); /* 10 blocks per layer */
    ASSERT_EQ_INT(tsr__n_write, L_);       /* one per layer chunk */
    ASSERT_OK(tsr_kv_paged_fork(kv, 0, 1));
    int32_t ev[6] = {0, 3, 8, 17, 22, 30};
    ASSERT_OK(tsr_kv_paged_evict(kv, 1, 1, ev, 6)); /* copy-on-write and moves */
    ASSERT_EQ_INT(tsr__n_copy, 1);
    ASSERT_OK(tsr_kv_paged_swap_out(kv, 0));
    ASSERT_EQ_INT(tsr__n_gather, 1); /* every layer at once */
    ASSERT_OK(tsr_kv_paged_swap_in(kv, 0));
    ASSERT_EQ_INT(tsr__n_scatter, 1);
    ASSERT_TRUE(tsr__check_rows(kv, 0, 37));
    int32_t pos[3] = {40, 41, 42};
    float k[3 * KVD_] = {0}, v[3 * KVD_] = {0};
    ASSERT_OK(tsr_kv_paged_reserve_rows(kv, 1, 1, 3));
    ASSERT_OK(tsr_kv_paged_insert(kv, 1, 1, pos, 3, k, v));
    ASSERT_EQ_INT(tsr__n_scatter, 2);
    ASSERT_EQ_INT(tsr_kv_paged_slots(kv, 1, 1), 37 - 6 + 3);
    tsr_kv_cache_destroy(kv);
    tsr_host_pool_destroy(host);
}

/* --- forward pass: paged == dense on the real model ----------------------------------- */

static tsr_status tsr__run_greedy(const tsr_model *m, tsr_backend *be, tsr_kv_cache *kv,
                                  const int32_t *prompt, int np, int gen, int32_t *out_toks,
                                  float *first_logits, float *last_logits) {
    tsr_forward *f = NULL;
    const int V = m->cfg.vocab_size;
    TSR_TRY(tsr_forward_create(m, be, 64, &f));
    float *logits = tsr_malloc((size_t)64 * V * 4);
    tsr_status st = kv->ops->seq_add(kv, 0);
    int32_t cur[64];
    int pos = 0, rows = 0;
    /* Prefill in chunks of 13 with every row's logits (the chunk edges cross blocks). */
    while (st == TSR_OK && pos < np) {
        int n = np - pos < 13 ? np - pos : 13;
        tsr_batch_seq b = {.seq = 0, .tokens = prompt + pos, .n_tokens = n, .all_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
        if (st == TSR_OK && pos == 0) memcpy(first_logits, logits, (size_t)n * V * 4);
        pos += n;
    }
    for (int g = 0; st == TSR_OK && g < gen; g++) {
        const float *row = logits + (size_t)(rows - 1) * V;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (row[i] > row[best]) best = i;
        out_toks[g] = best;
        cur[0] = best;
        tsr_batch_seq b = {.seq = 0, .tokens = cur, .n_tokens = 1, .want_logits = 1};
        st = tsr_forward_run(f, kv, &b, 1, logits, &rows);
    }
    if (st == TSR_OK) memcpy(last_logits, logits, (size_t)V * 4);
    tsr_free(logits);
    tsr_forward_destroy(f);
    return st;
}

TSR_KV_FWD_TEST(test_forward_paged_equals_dense) {
    const tsr_model *m = kvt_eng->weights;
    tsr_backend *be = kvt_be;
    const tsr_model_config *c = &m->cfg;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 1 + (i * 37) % (c->vocab_size - 1);
    enum { GEN = 60 };
    int32_t td[GEN], tp[GEN];
    float *fd = tsr_malloc((size_t)13 * c->vocab_size * 4);
    float *fp = tsr_malloc((size_t)13 * c->vocab_size * 4);
    float *ld = tsr_malloc((size_t)c->vocab_size * 4), *lp = tsr_malloc((size_t)c->vocab_size * 4);
    tsr_kv_cache *dense = NULL, *paged = NULL;
    ASSERT_OK(tsr_kv_dense_create_dtype(be, c->n_layers, c->n_kv_heads, c->head_dim, c->max_seq_len, 1,
                                  kvt_dtype(), &dense));
    tsr_kv_paged_config pc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                              .head_dim = c->head_dim, .block_size = 16, .max_seqs = 1,
                              .max_seq_len = c->max_seq_len, .prefix_caching = 1, .be = be, .kv_dtype = kvt_dtype()};
    pc.memory_bytes = 64LL * c->n_layers * tsr_kv_paged_block_bytes(&pc);
    ASSERT_OK(tsr_kv_paged_create(&pc, &paged));
    ASSERT_OK(tsr__run_greedy(m, be, dense, prompt, 40, GEN, td, fd, ld));
    ASSERT_OK(tsr__run_greedy(m, be, paged, prompt, 40, GEN, tp, fp, lp));
    double md = 0;
    for (int i = 0; i < 13 * c->vocab_size; i++) md = fmax(md, fabs(fd[i] - fp[i]));
    for (int i = 0; i < c->vocab_size; i++) md = fmax(md, fabs(ld[i] - lp[i]));
    /* the CPU's attention tiles the keys as one sequence, so blocks give a dense cache's
     * bits, except in the AVX-512 prefill (attn_qblock), whose tiles stop at each span's
     * end (another softmax summation order): the golden tests' 2e-5 bound */
    ASSERT_TRUE(md <= 2e-5);
    for (int g = 0; g < GEN; g++) ASSERT_EQ_INT(td[g], tp[g]);
    ASSERT_EQ_INT(paged->ops->seq_len(paged, 0), 40 + GEN);
    tsr_kv_cache_destroy(dense);
    tsr_kv_cache_destroy(paged);
    tsr_free(fd);
    tsr_free(fp);
    tsr_free(ld);
    tsr_free(lp);
}

TSR_TEST_MAIN(test_write_spans_blocks, test_layer_blocks_adjacent, test_shared_prefix_one_copy,
              test_copy_on_write,
              test_cached_blocks_lru_eviction, test_no_blocks_vs_budget, test_swap_out_in,
              test_swap_ops_check_and_abandon, test_drop_recompute, test_evict_compacts, test_evict_shared_blocks,
              test_one_backend_call_per_operation,
              test_forward_paged_equals_dense)
