/* comm over MPI, run under mpiexec with 2 or 4 ranks: deterministic sums, rings, stage
 * messages, control-plane collectives, agree() and layout errors. After each test the ranks
 * agree on the outcome, so one failing rank fails the test everywhere instead of hanging. */
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "base/alloc.h"
#include "runtime/exec/parallel.h"
#include "tests/test.h"

int tsr_test_failed_flag;
static tsr_comm *C;
static int W, R;

/* Values spanning many magnitudes, so float addition order shows in the low bits. */
static float tsr__val(int who, size_t i) {
    uint32_t h = (uint32_t)who * 2654435761u ^ (uint32_t)i * 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    float mant = (float)((int)(h % 2001u) - 1000) / 7.0f;
    int e = (int)((h >> 11) % 24u) - 12;
    return ldexpf(mant, e);
}

enum { N = 1031 };

/* The sum over the TP group of vectors tsr__val(tp_rank, i) equals the serial sum in rank
 * order, bit for bit, for every layout the world allows. */
TSR_TEST(test_allreduce_rank_order) {
    int tps[3] = {W, 2, 1};
    for (int k = 0; k < 3; k++) {
        int tp = tps[k];
        if (W % tp) continue;
        ASSERT_OK(tsr_comm_set_layout(C, tp, W / tp));
        ASSERT_EQ_INT(tsr_comm_size(C, TSR_COMM_TP), tp);
        float buf[N], want[N], rev[N];
        for (size_t i = 0; i < N; i++) buf[i] = tsr__val(tsr_comm_tp_rank(C), i);
        ASSERT_OK(tsr_comm_allreduce_sum_f32(C, TSR_COMM_TP, buf, N));
        int diff = 0;
        for (size_t i = 0; i < N; i++) {
            want[i] = tsr__val(0, i);
            for (int r = 1; r < tp; r++) want[i] += tsr__val(r, i);
            rev[i] = tsr__val(tp - 1, i);
            for (int r = tp - 2; r >= 0; r--) rev[i] += tsr__val(r, i);
            diff += memcmp(&rev[i], &want[i], sizeof(float)) != 0;
        }
        ASSERT_TRUE(memcmp(buf, want, sizeof buf) == 0);
        /* The data are order-sensitive, so the check above means something. */
        if (tp >= 3) ASSERT_TRUE(diff > 0);
    }
}

/* A canonical list of S = 8 partial vectors spread over tp = 1, 2, 4 ranks sums to the
 * same bits each time: what makes tp=1 and tp=2 forward passes reproducible. */
TSR_TEST(test_allreduce_parts_layout_independent) {
    enum { S = 8 };
    static float want[N], got[N], pairwise[N];
    int diff = 0;
    for (size_t i = 0; i < N; i++) {
        want[i] = tsr__val(100, i);
        for (int s = 1; s < S; s++) want[i] += tsr__val(100 + s, i);
        float a = tsr__val(100, i) + tsr__val(101, i), b = tsr__val(102, i) + tsr__val(103, i);
        float c = tsr__val(104, i) + tsr__val(105, i), d = tsr__val(106, i) + tsr__val(107, i);
        pairwise[i] = ((a + b) + c) + d;
        diff += memcmp(&pairwise[i], &want[i], sizeof(float)) != 0;
    }
    ASSERT_TRUE(diff > 0); /* pre-summing locally would break reproducibility */
    float *parts = tsr_malloc(sizeof(float) * N * S);
    ASSERT_TRUE(parts != NULL);
    int tps[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int tp = tps[k];
        if (W % tp) continue;
        ASSERT_OK(tsr_comm_set_layout(C, tp, W / tp));
        int per = S / tp, first = tsr_comm_tp_rank(C) * per;
        for (int p = 0; p < per; p++)
            for (size_t i = 0; i < N; i++) parts[(size_t)p * N + i] = tsr__val(100 + first + p, i);
        memset(got, 0, sizeof got);
        ASSERT_OK(tsr_comm_allreduce_sum_f32_parts(C, TSR_COMM_TP, parts, per, N, got));
        if (memcmp(got, want, sizeof got) != 0) {
            tsr_free(parts);
            TSR_FAIL_("tp=%d: parts sum differs from the serial sum", tp);
        }
    }
    tsr_free(parts);
}

TSR_TEST(test_send_recv_ring) {
    int next = (R + 1) % W, prev = (R + W - 1) % W;
    int64_t out[4] = {R, R * 10, R * 100, -R}, in[4] = {0};
    /* Even ranks send first, odd ranks receive first: no reliance on eager buffering. */
    if (R % 2 == 0) {
        ASSERT_OK(tsr_comm_send(C, TSR_COMM_WORLD, out, sizeof out, next, 7));
        ASSERT_OK(tsr_comm_recv(C, TSR_COMM_WORLD, in, sizeof in, prev, 7));
    } else {
        ASSERT_OK(tsr_comm_recv(C, TSR_COMM_WORLD, in, sizeof in, prev, 7));
        ASSERT_OK(tsr_comm_send(C, TSR_COMM_WORLD, out, sizeof out, next, 7));
    }
    ASSERT_EQ_INT(in[0], prev);
    ASSERT_EQ_INT(in[2], prev * 100);
    /* Non-blocking, 1 MB each way (past any eager limit), both directions at once. */
    size_t n = 1 << 18;
    float *s = tsr_malloc(n * sizeof(float)), *r = tsr_malloc(n * sizeof(float));
    ASSERT_TRUE(s && r);
    for (size_t i = 0; i < n; i++) s[i] = (float)(R * 1000003 + (int)i);
    tsr_comm_request rq, sq;
    ASSERT_OK(tsr_comm_irecv(C, TSR_COMM_WORLD, r, n * sizeof(float), prev, 9, &rq));
    ASSERT_OK(tsr_comm_isend(C, TSR_COMM_WORLD, s, n * sizeof(float), next, 9, &sq));
    ASSERT_OK(tsr_comm_wait(C, &sq));
    ASSERT_OK(tsr_comm_wait(C, &rq));
    ASSERT_OK(tsr_comm_wait(C, &rq)); /* completed: returns at once */
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += r[i] != (float)(prev * 1000003 + (int)i);
    tsr_free(s);
    tsr_free(r);
    ASSERT_EQ_INT(bad, 0);
}

/* Stage s sends an activation row to stage s + 1 over the PP group, overlapped (isend,
 * then other work, then wait); the receiver checks it came from its own TP slice. */
TSR_TEST(test_pipeline_stage_messages) {
    int tp = W >= 4 ? 2 : 1;
    ASSERT_OK(tsr_comm_set_layout(C, tp, W / tp));
    int pp = tsr_comm_pp(C), s = tsr_comm_pp_rank(C), t = tsr_comm_tp_rank(C);
    ASSERT_EQ_INT(tsr_comm_rank(C, TSR_COMM_PP), s);
    ASSERT_EQ_INT(tsr_comm_size(C, TSR_COMM_PP), pp);
    ASSERT_EQ_INT(R, s * tp + t);
    float act[64], got[64];
    tsr_comm_request sq = {0}, rq = {0};
    if (s > 0) ASSERT_OK(tsr_comm_irecv(C, TSR_COMM_PP, got, sizeof got, s - 1, 1, &rq));
    for (int i = 0; i < 64; i++) act[i] = (float)(t * 1000 + s * 100 + i);
    if (s < pp - 1) ASSERT_OK(tsr_comm_isend(C, TSR_COMM_PP, act, sizeof act, s + 1, 1, &sq));
    ASSERT_OK(tsr_comm_wait(C, &sq));
    ASSERT_OK(tsr_comm_wait(C, &rq));
    if (s > 0)
        for (int i = 0; i < 64; i++) ASSERT_EQ_INT((int)got[i], t * 1000 + (s - 1) * 100 + i);
    /* The layout agrees with runtime/parallel's mapping. */
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(tp, W / tp, W, &l));
    ASSERT_EQ_INT(tsr_parallel_tp_rank(&l, R), t);
    ASSERT_EQ_INT(tsr_parallel_pp_rank(&l, R), s);
}

TSR_TEST(test_control_plane) {
    ASSERT_EQ_INT(tsr_comm_world_size(C), W);
    ASSERT_STR_EQ(tsr_comm_backend_name(C), "mpi");
    /* mpiexec on one machine: the node is the world. */
    ASSERT_EQ_INT(tsr_comm_local_rank(C), R);
    ASSERT_EQ_INT(tsr_comm_local_size(C), W);
    char msg[32] = {0};
    if (R == W - 1) snprintf(msg, sizeof msg, "from the last rank");
    ASSERT_OK(tsr_comm_bcast(C, TSR_COMM_WORLD, msg, sizeof msg, W - 1));
    ASSERT_STR_EQ(msg, "from the last rank");
    int32_t mine = R * R, all[8] = {0};
    ASSERT_OK(tsr_comm_allgather(C, TSR_COMM_WORLD, &mine, sizeof mine, all));
    for (int r = 0; r < W; r++) ASSERT_EQ_INT(all[r], r * r);
    int64_t v[3] = {R + 5, R + 5, R + 5};
    ASSERT_OK(tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &v[0], 1, TSR_COMM_MIN));
    ASSERT_OK(tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &v[1], 1, TSR_COMM_MAX));
    ASSERT_OK(tsr_comm_allreduce_i64(C, TSR_COMM_WORLD, &v[2], 1, TSR_COMM_SUM));
    ASSERT_EQ_INT(v[0], 5);
    ASSERT_EQ_INT(v[1], W + 4);
    ASSERT_EQ_INT(v[2], W * 5 + W * (W - 1) / 2);
    ASSERT_OK(tsr_comm_barrier(C, TSR_COMM_WORLD));
}

/* tsr_comm_alltoallv: rank r sends (r + q) % 3 ints to rank q (empty blocks included),
 * each holding 100 r + q + k, laid out in reverse peer order so that offsets matter; the
 * received blocks land in peer order. The stats count the bytes to and from other ranks. */
TSR_TEST(test_alltoallv) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    size_t sb[8], so[8], rb[8], ro[8];
    int32_t send[64], recv[64];
    size_t at = 0, sent = 0, got = 0;
    for (int q = W - 1; q >= 0; q--) {
        sb[q] = (size_t)((R + q) % 3) * sizeof(int32_t);
        so[q] = at * sizeof(int32_t);
        for (int k = 0; k < (R + q) % 3; k++) send[at++] = 100 * R + q + k;
        if (q != R) sent += sb[q];
    }
    at = 0;
    for (int q = 0; q < W; q++) {
        rb[q] = (size_t)((q + R) % 3) * sizeof(int32_t);
        ro[q] = at * sizeof(int32_t);
        at += (size_t)((q + R) % 3);
        if (q != R) got += rb[q];
    }
    memset(recv, 0xff, sizeof recv);
    tsr_comm_reset_stats(C);
    ASSERT_OK(tsr_comm_alltoallv(C, TSR_COMM_TP, send, sb, so, recv, rb, ro));
    tsr_comm_stats st;
    tsr_comm_get_stats(C, &st);
    ASSERT_EQ_INT(st.bytes_sent, (int64_t)sent);
    ASSERT_EQ_INT(st.bytes_recv, (int64_t)got);
    at = 0;
    for (int q = 0; q < W; q++)
        for (int k = 0; k < (q + R) % 3; k++) ASSERT_EQ_INT(recv[at++], 100 * q + R + k);
    /* one block to every rank (the rows' all-gather of expert parallelism) */
    int32_t mine[2] = {R, -R}, all[16];
    for (int q = 0; q < W; q++) {
        sb[q] = sizeof mine;
        so[q] = 0;
        rb[q] = sizeof mine;
        ro[q] = (size_t)q * sizeof mine;
    }
    ASSERT_OK(tsr_comm_alltoallv(C, TSR_COMM_TP, mine, sb, so, all, rb, ro));
    for (int q = 0; q < W; q++) ASSERT_TRUE(all[2 * q] == q && all[2 * q + 1] == -q);
    /* what a rank sends itself must be what it expects from itself */
    rb[R] = 0;
    ASSERT_EQ_INT(tsr_comm_alltoallv(C, TSR_COMM_TP, mine, sb, so, all, rb, ro), TSR_ERR_INVALID);
}

TSR_TEST(test_agree) {
    ASSERT_OK(tsr_comm_agree(C, TSR_OK));
    /* One rank fails (as when it cannot read its shard): every rank sees its error. */
    int bad = W > 2 ? 2 : 1;
    tsr_status st = TSR_OK;
    tsr_error_clear();
    if (R == bad) st = tsr_error_set(TSR_ERR_FORMAT, "shard.bin: bad header");
    ASSERT_EQ_INT(tsr_comm_agree(C, st), TSR_ERR_FORMAT);
    char want[64];
    snprintf(want, sizeof want, "rank %d: shard.bin: bad header", bad);
    ASSERT_STR_EQ(tsr_last_error(), want);
    /* Several fail: the lowest rank's reason wins, everywhere. */
    st = R >= 1 ? tsr_error_set(R == 1 ? TSR_ERR_IO : TSR_ERR_NOMEM, "rank-%d reason", R)
                : TSR_OK;
    ASSERT_EQ_INT(tsr_comm_agree(C, st), TSR_ERR_IO);
    ASSERT_STR_EQ(tsr_last_error(), "rank 1: rank-1 reason");
    /* All fail: the lowest rank's reason, with no rank named (it is everyone's). */
    st = tsr_error_set(TSR_ERR_INVALID, "--tp 3 does not divide the 8 heads (rank %d)", R);
    ASSERT_EQ_INT(tsr_comm_agree(C, st), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--tp 3 does not divide the 8 heads (rank 0)");
}

TSR_TEST(test_bad_layouts_and_args) {
    ASSERT_OK(tsr_comm_set_layout(C, W, 1));
    ASSERT_EQ_INT(tsr_comm_set_layout(C, 3, 1), TSR_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof want, "layout --tp 3 x --pp 1 needs 3 ranks, but the job has %d", W);
    ASSERT_STR_CONTAINS(tsr_last_error(), want);
    /* The old layout survives a rejected one. */
    ASSERT_EQ_INT(tsr_comm_tp(C), W);
    ASSERT_EQ_INT(tsr_comm_set_layout(C, 0, W), TSR_ERR_INVALID);
    int x = 0;
    ASSERT_EQ_INT(tsr_comm_send(C, TSR_COMM_WORLD, &x, sizeof x, R, 0), TSR_ERR_INVALID);
    ASSERT_EQ_INT(tsr_comm_send(C, TSR_COMM_WORLD, &x, sizeof x, W, 0), TSR_ERR_INVALID);
    ASSERT_EQ_INT(tsr_comm_bcast(C, TSR_COMM_WORLD, &x, sizeof x, W), TSR_ERR_INVALID);
    ASSERT_OK(tsr_comm_barrier(C, TSR_COMM_TP));
}

static const struct {
    const char *name;
    tsr_test_fn fn;
} tests[] = {
    {"test_allreduce_rank_order", test_allreduce_rank_order},
    {"test_allreduce_parts_layout_independent", test_allreduce_parts_layout_independent},
    {"test_send_recv_ring", test_send_recv_ring},
    {"test_pipeline_stage_messages", test_pipeline_stage_messages},
    {"test_control_plane", test_control_plane},
    {"test_alltoallv", test_alltoallv},
    {"test_agree", test_agree},
    {"test_bad_layouts_and_args", test_bad_layouts_and_args},
};

int main(int argc, char **argv) {
    tsr_comm_options o = {.backend = TSR_COMM_MPI, .argc = &argc, .argv = &argv};
    if (tsr_comm_init(&o, &C) != TSR_OK) {
        fprintf(stderr, "test_comm: %s\n", tsr_last_error());
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
