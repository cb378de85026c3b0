/* The chain sum and the traffic counters, under mpiexec with 2 or 4 ranks: the MPI sums
 * equal, bit for bit, a serial left-to-right sum over the global list of parts (values
 * chosen so that the order shows), across chunk boundaries, on world and TP groups; the
 * chain's own messages never match the caller's; each rank's counters match what its
 * algorithm moves. After each test the ranks agree on the outcome (no hang on a failure). */
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/comm_impl.h"
#include "base/alloc.h"
#include "tests/test.h"

int tsr_test_failed_flag;
static tsr_comm *C;
static int W, R;

/* Mixtures of +-1e8, +-1 and small fractions: 1e8 + 1 - 1e8 is 0 in float, 1e8 - 1e8 + 1
 * is 1, so any change of order changes bits. */
static float tsr__val(int part, size_t i) {
    uint32_t h = (uint32_t)part * 2654435761u ^ (uint32_t)(i + 1) * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    switch (h % 5u) {
    case 0: return 1e8f;
    case 1: return -1e8f;
    case 2: return 1.0f;
    case 3: return -1.0f;
    default: return (float)((int)(h >> 8) % 1000) / 64.0f;
    }
}

/* Fills the whole global list (n_parts x n) and my slice of it. */
static void tsr__fill(float *global, int n_parts, size_t n) {
    for (int p = 0; p < n_parts; p++)
        for (size_t i = 0; i < n; i++) global[(size_t)p * n + i] = tsr__val(p, i);
}

/* Sizes: one element, under a chunk, and across two chunk boundaries (2 x 65536 + 5). */
static const size_t tsr__ns[] = {1, 1031, 131077};

static void tsr__check_parts(tsr_comm_group grp, const char *what) {
    int gs = tsr_comm_size(C, grp), gr = tsr_comm_rank(C, grp);
    for (int n_local = 1; n_local <= 4; n_local++) {
        for (size_t k = 0; k < sizeof tsr__ns / sizeof tsr__ns[0]; k++) {
            size_t n = tsr__ns[k];
            int n_parts = n_local * gs;
            float *global = tsr_malloc(sizeof(float) * n * (size_t)n_parts);
            float *want = tsr_malloc(sizeof(float) * n), *got = tsr_malloc(sizeof(float) * n);
            float *rev = tsr_malloc(sizeof(float) * n);
            ASSERT_TRUE(global && want && got && rev);
            tsr__fill(global, n_parts, n);
            tsr__comm_self_sum_parts(global, n_parts, n, want);
            const float *mine = global + (size_t)gr * n_local * n;
            memset(got, 0xff, sizeof(float) * n);
            tsr_status st = tsr_comm_allreduce_sum_f32_parts(C, grp, mine, n_local, n, got);
            int same = st == TSR_OK && memcmp(got, want, sizeof(float) * n) == 0;
            /* The data are order-sensitive: the reversed list sums to other bits. */
            int differs = 0;
            for (size_t i = 0; i < n; i++) {
                rev[i] = global[(size_t)(n_parts - 1) * n + i];
                for (int p = n_parts - 2; p >= 0; p--) rev[i] += global[(size_t)p * n + i];
                differs += memcmp(&rev[i], &want[i], sizeof(float)) != 0;
            }
            tsr_free(global);
            tsr_free(want);
            tsr_free(got);
            tsr_free(rev);
            ASSERT_OK(st);
            if (!same) TSR_FAIL_("%s: n_local %d, n %zu: chain sum differs", what, n_local, n);
            if (n > 1 && n_parts >= 3) ASSERT_TRUE(differs > 0);
        }
    }
}

TSR_TEST(test_chain_parts_bitwise) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    tsr__check_parts(TSR_COMM_WORLD, "world");
    tsr__check_parts(TSR_COMM_TP, "tp = world");
    if (W == 4) {
        ASSERT_OK(tsr_comm_set_layout(C, 2, 2));
        tsr__check_parts(TSR_COMM_TP, "tp 2 x pp 2, tp group");
        tsr__check_parts(TSR_COMM_PP, "tp 2 x pp 2, pp group");
    }
}

/* The in-place sum: ((p0 + p1) + p2) + ... in group-rank order. */
TSR_TEST(test_chain_plain_rank_order) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    for (size_t k = 0; k < sizeof tsr__ns / sizeof tsr__ns[0]; k++) {
        size_t n = tsr__ns[k];
        float *global = tsr_malloc(sizeof(float) * n * (size_t)W);
        float *want = tsr_malloc(sizeof(float) * n), *buf = tsr_malloc(sizeof(float) * n);
        ASSERT_TRUE(global && want && buf);
        tsr__fill(global, W, n);
        tsr__comm_self_sum_parts(global, W, n, want);
        memcpy(buf, global + (size_t)R * n, sizeof(float) * n);
        tsr_status st = tsr_comm_allreduce_sum_f32(C, TSR_COMM_TP, buf, n);
        int same = memcmp(buf, want, sizeof(float) * n) == 0;
        tsr_free(global);
        tsr_free(want);
        tsr_free(buf);
        ASSERT_OK(st);
        if (!same) TSR_FAIL_("n %zu: in-place chain sum differs", n);
    }
}

/* A receive the caller has posted (same peer, tag 0, the world group) stays untouched by
 * the chain's messages, which travel on the group's internal twin communicator. */
TSR_TEST(test_chain_does_not_match_user_messages) {
    int next = (R + 1) % W, prev = (R + W - 1) % W;
    int64_t in = -1, out = 1000 + R;
    tsr_comm_request rq;
    ASSERT_OK(tsr_comm_irecv(C, TSR_COMM_WORLD, &in, sizeof in, prev, 0, &rq));
    float v[3] = {(float)R, 1.0f, 2.0f};
    ASSERT_OK(tsr_comm_allreduce_sum_f32(C, TSR_COMM_WORLD, v, 3));
    ASSERT_EQ_INT((int)v[0], W * (W - 1) / 2);
    ASSERT_EQ_INT((int)v[2], 2 * W);
    ASSERT_OK(tsr_comm_send(C, TSR_COMM_WORLD, &out, sizeof out, next, 0));
    ASSERT_OK(tsr_comm_wait(C, &rq));
    ASSERT_EQ_INT(in, 1000 + prev);
}

/* Children of each rank in a binomial broadcast tree from the last rank (W = 2, 4). */
static int tsr__bcast_children_from_last(int rank) {
    if (W == 2) return rank == 1 ? 1 : 0;
    static const int four[4] = {0, 1, 0, 2}; /* v = rank + 1 mod 4: 1, 2, 3, 0 */
    return four[rank];
}

/* Every byte sent by one rank is received by another. */
static void tsr__check_balanced(const tsr_comm_stats *s) {
    int64_t v[2] = {s->bytes_sent, s->bytes_recv};
    ASSERT_OK(tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, v, 2, TSR_COMM_SUM));
    ASSERT_EQ_INT(v[0], v[1]);
}

TSR_TEST(test_counters_chain) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    tsr_comm_stats s;
    tsr_comm_reset_stats(C);
    tsr_comm_get_stats(C, &s);
    ASSERT_TRUE(s.bytes_sent == 0 && s.bytes_recv == 0 && s.messages == 0);
    /* Two chunks per hop (65536 + 10 floats), three parts per rank: the parts never
     * travel, only the running sum does. */
    size_t n = 65546, bytes = n * sizeof(float);
    float *parts = tsr_calloc(3 * n, sizeof(float)), *out = tsr_malloc(bytes);
    ASSERT_TRUE(parts && out);
    tsr_status st = tsr_comm_allreduce_sum_f32_parts(C, TSR_COMM_WORLD, parts, 3, n, out);
    tsr_free(parts);
    tsr_free(out);
    ASSERT_OK(st);
    tsr_comm_get_stats(C, &s);
    int kids = tsr__bcast_children_from_last(R);
    int64_t chain_sent = R < W - 1 ? (int64_t)bytes : 0, chain_recv = R > 0 ? (int64_t)bytes : 0;
    int64_t bcast_recv = R != W - 1 ? (int64_t)bytes : 0;
    ASSERT_EQ_INT(s.bytes_sent, chain_sent + kids * (int64_t)bytes);
    ASSERT_EQ_INT(s.bytes_recv, chain_recv + bcast_recv);
    ASSERT_EQ_INT(s.messages, (R < W - 1) * 2 + (R > 0) * 2 + kids + (R != W - 1));
    tsr__check_balanced(&s);
    /* O(n) per rank, whatever the number of parts: at most 2 n in the chain plus the
     * broadcast tree's fan-out. */
    ASSERT_TRUE(s.bytes_recv <= 2 * (int64_t)bytes);
}

TSR_TEST(test_counters_p2p_collectives) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    int next = (R + 1) % W, prev = (R + W - 1) % W;
    tsr_comm_stats s;
    tsr_comm_reset_stats(C);
    /* Control plane: not counted. */
    int64_t v = R;
    ASSERT_OK(tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &v, 1, TSR_COMM_SUM));
    ASSERT_OK(tsr_comm_barrier(C, TSR_COMM_WORLD));
    ASSERT_OK(tsr_comm_agree(C, TSR_OK));
    ASSERT_EQ_INT(tsr_comm_agree(C, R == 0 ? tsr_error_set(TSR_ERR_IO, "x: y") : TSR_OK),
                  TSR_ERR_IO);
    tsr_comm_get_stats(C, &s);
    ASSERT_TRUE(s.bytes_sent == 0 && s.bytes_recv == 0 && s.messages == 0);
    /* Blocking and non-blocking point-to-point: exact. */
    char a[100] = {0}, b[100];
    if (R % 2 == 0) {
        ASSERT_OK(tsr_comm_send(C, TSR_COMM_WORLD, a, sizeof a, next, 3));
        ASSERT_OK(tsr_comm_recv(C, TSR_COMM_WORLD, b, sizeof b, prev, 3));
    } else {
        ASSERT_OK(tsr_comm_recv(C, TSR_COMM_WORLD, b, sizeof b, prev, 3));
        ASSERT_OK(tsr_comm_send(C, TSR_COMM_WORLD, a, sizeof a, next, 3));
    }
    tsr_comm_request rq, sq;
    ASSERT_OK(tsr_comm_irecv(C, TSR_COMM_WORLD, b, 40, prev, 4, &rq));
    ASSERT_OK(tsr_comm_isend(C, TSR_COMM_WORLD, a, 40, next, 4, &sq));
    ASSERT_OK(tsr_comm_wait(C, &sq));
    ASSERT_OK(tsr_comm_wait(C, &rq));
    tsr_comm_get_stats(C, &s);
    ASSERT_EQ_INT(s.bytes_sent, 140);
    ASSERT_EQ_INT(s.bytes_recv, 140);
    ASSERT_EQ_INT(s.messages, 4);
    /* All-gather (ring model) and bcast (binomial tree from the last rank). */
    tsr_comm_reset_stats(C);
    int32_t mine = R, all[4];
    ASSERT_OK(tsr_comm_allgather(C, TSR_COMM_WORLD, &mine, sizeof mine, all));
    tsr_comm_get_stats(C, &s);
    ASSERT_EQ_INT(s.bytes_sent, 4 * (W - 1));
    ASSERT_EQ_INT(s.bytes_recv, 4 * (W - 1));
    ASSERT_EQ_INT(s.messages, 2 * (W - 1));
    tsr_comm_reset_stats(C);
    char msg[64] = {0};
    ASSERT_OK(tsr_comm_bcast(C, TSR_COMM_WORLD, msg, sizeof msg, W - 1));
    tsr_comm_get_stats(C, &s);
    ASSERT_EQ_INT(s.bytes_sent, 64 * tsr__bcast_children_from_last(R));
    ASSERT_EQ_INT(s.bytes_recv, R == W - 1 ? 0 : 64);
    tsr__check_balanced(&s);
    /* One-rank groups move nothing. */
    ASSERT_OK(tsr_comm_set_layout(C, 1, W));
    tsr_comm_reset_stats(C);
    float f[8] = {0}, sum[4];
    ASSERT_OK(tsr_comm_allreduce_sum_f32(C, TSR_COMM_TP, f, 8));
    ASSERT_OK(tsr_comm_allreduce_sum_f32_parts(C, TSR_COMM_TP, f, 2, 4, sum));
    ASSERT_OK(tsr_comm_bcast(C, TSR_COMM_TP, msg, sizeof msg, 0));
    tsr_comm_get_stats(C, &s);
    ASSERT_TRUE(s.bytes_sent == 0 && s.bytes_recv == 0 && s.messages == 0);
}

static const struct {
    const char *name;
    tsr_test_fn fn;
} tests[] = {
    {"test_chain_parts_bitwise", test_chain_parts_bitwise},
    {"test_chain_plain_rank_order", test_chain_plain_rank_order},
    {"test_chain_does_not_match_user_messages", test_chain_does_not_match_user_messages},
    {"test_counters_chain", test_counters_chain},
    {"test_counters_p2p_collectives", test_counters_p2p_collectives},
};

int main(int argc, char **argv) {
    tsr_comm_options o = {.backend = TSR_COMM_MPI, .argc = &argc, .argv = &argv};
    if (tsr_comm_init(&o, &C) != TSR_OK) {
        fprintf(stderr, "test_comm_chain: %s\n", tsr_last_error());
        return 1;
    }
    W = tsr_comm_world_size(C);
    R = tsr_comm_world_rank(C);
    int failed = 0, passed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].name) != 0) continue;
        tsr_test_failed_flag = 0;
        tests[i].fn();
        int64_t f = tsr_test_failed_flag;
        if (tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &f, 1, TSR_COMM_MAX) != TSR_OK)
            tsr_comm_abort(C, 2, tsr_last_error());
        if (f) failed++; else passed++;
        if (R == 0) fprintf(stderr, "%s %s (%d ranks)\n", f ? "FAIL" : "ok  ", tests[i].name, W);
    }
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    tsr_comm_destroy(C);
    return failed ? 1 : 0;
}
