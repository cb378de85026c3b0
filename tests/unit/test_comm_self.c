/* comm without mpirun: the self backend (world size 1, no MPI_Init) and its local paths. */
#include <stdlib.h>

#include "comm/comm.h"
#include "comm/comm_impl.h"
#include "tests/test.h"

/* Unit tests may themselves run inside an srun step or mpirun: forget the launcher. */
static void tsr__forget_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                                       "PMI_RANK", "PMIX_RANK", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                                       "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "TSR_COMM"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

TSR_TEST(test_self_bootstrap) {
    tsr__forget_launcher();
    ASSERT_TRUE(!tsr_comm_launched_by_mpi(NULL));
    tsr_comm *c = NULL;
    ASSERT_OK(tsr_comm_init(NULL, &c));
    ASSERT_STR_EQ(tsr_comm_backend_name(c), "self");
    ASSERT_EQ_INT(tsr_comm_world_size(c), 1);
    ASSERT_EQ_INT(tsr_comm_world_rank(c), 0);
    ASSERT_EQ_INT(tsr_comm_local_rank(c), 0);
    ASSERT_EQ_INT(tsr_comm_size(c, TSR_COMM_TP), 0); /* no layout yet */
    int x = 1;
    ASSERT_EQ_INT(tsr_comm_barrier(c, TSR_COMM_TP), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "no layout set yet");
    ASSERT_EQ_INT(tsr_comm_set_layout(c, 2, 1), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--tp 2 x --pp 1 needs 2 ranks, but the job has 1");
    ASSERT_OK(tsr_comm_set_layout(c, 1, 1));
    ASSERT_EQ_INT(tsr_comm_size(c, TSR_COMM_TP), 1);
    ASSERT_EQ_INT(tsr_comm_rank(c, TSR_COMM_PP), 0);
    ASSERT_OK(tsr_comm_barrier(c, TSR_COMM_WORLD));
    ASSERT_OK(tsr_comm_bcast(c, TSR_COMM_TP, &x, sizeof x, 0));
    ASSERT_EQ_INT(tsr_comm_send(c, TSR_COMM_PP, &x, sizeof x, 0, 0), TSR_ERR_INVALID);
    tsr_comm_destroy(c);
    tsr_comm_destroy(NULL);
}

TSR_TEST(test_self_collectives) {
    tsr_comm *c = NULL;
    tsr__forget_launcher();
    tsr_comm_options o = {.backend = TSR_COMM_SELF};
    ASSERT_OK(tsr_comm_init(&o, &c));
    ASSERT_OK(tsr_comm_set_layout(c, 1, 1));
    float v[3] = {1.5f, -2.0f, 3.25f};
    ASSERT_OK(tsr_comm_allreduce_sum_f32(c, TSR_COMM_TP, v, 3));
    ASSERT_NEAR(v[1], -2.0, 0);
    /* Parts: the same left-to-right order as a multi-rank run. */
    float parts[3][2] = {{1e8f, 1.0f}, {1.0f, 1e8f}, {-1e8f, -1e8f}}, out[2];
    ASSERT_OK(tsr_comm_allreduce_sum_f32_parts(c, TSR_COMM_TP, &parts[0][0], 3, 2, out));
    float want0 = (1e8f + 1.0f) + -1e8f, want1 = (1.0f + 1e8f) + -1e8f;
    ASSERT_TRUE(memcmp(&out[0], &want0, sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(&out[1], &want1, sizeof(float)) == 0);
    int32_t a = 42, b = 0;
    ASSERT_OK(tsr_comm_allgather(c, TSR_COMM_WORLD, &a, sizeof a, &b));
    ASSERT_EQ_INT(b, 42);
    int64_t m = 7;
    ASSERT_OK(tsr_comm_allreduce_i64(c, TSR_COMM_WORLD, &m, 1, TSR_COMM_MIN));
    ASSERT_EQ_INT(m, 7);
    tsr_comm_request rq = {0};
    ASSERT_OK(tsr_comm_wait(c, &rq));
    /* agree in one process: the status and its line, unchanged. */
    ASSERT_OK(tsr_comm_agree(c, TSR_OK));
    tsr_status st = tsr_error_set(TSR_ERR_IO, "x.bin: short read");
    ASSERT_EQ_INT(tsr_comm_agree(c, st), TSR_ERR_IO);
    ASSERT_STR_EQ(tsr_last_error(), "x.bin: short read");
    /* One process moves nothing over any network. */
    tsr_comm_stats s;
    tsr_comm_get_stats(c, &s);
    ASSERT_TRUE(s.bytes_sent == 0 && s.bytes_recv == 0 && s.messages == 0);
    tsr_comm_destroy(c);
}

/* The binomial-tree model of the bcast counters: every non-root rank receives once, the
 * sends add up to the receives, no rank sends more than ceil(log2 size) times, and the
 * tree's shape follows the root. */
TSR_TEST(test_bcast_tree_counts) {
    for (int size = 2; size <= 37; size++) {
        int log2 = 0;
        while ((1 << log2) < size) log2++;
        for (int root = 0; root < size; root += 3) {
            int64_t sent = 0, recv = 0;
            for (int r = 0; r < size; r++) {
                tsr_comm_stats s = {0};
                tsr__comm_tally_bcast(&s, r, size, root, 10);
                ASSERT_EQ_INT(s.bytes_recv, r == root ? 0 : 10);
                ASSERT_TRUE(s.bytes_sent <= 10 * log2);
                ASSERT_EQ_INT(s.messages, (s.bytes_sent + s.bytes_recv) / 10);
                sent += s.bytes_sent;
                recv += s.bytes_recv;
            }
            ASSERT_EQ_INT(sent, 10 * (size - 1));
            ASSERT_EQ_INT(recv, sent);
        }
    }
    tsr_comm_stats s = {0};
    tsr__comm_tally_bcast(&s, 0, 8, 0, 4);
    ASSERT_EQ_INT(s.bytes_sent, 12); /* the root of 8 sends to 1, 2 and 4 */
    tsr__comm_tally_bcast(&s, 0, 1, 0, 4);
    ASSERT_EQ_INT(s.messages, 3); /* a one-rank group: nothing */
}

TSR_TEST(test_env_override_and_launcher_detection) {
    tsr__forget_launcher();
    setenv("TSR_COMM", "bogus", 1);
    tsr_comm *c = NULL;
    ASSERT_EQ_INT(tsr_comm_init(NULL, &c), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "TSR_COMM=bogus");
    unsetenv("TSR_COMM");
    int n = 0;
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    ASSERT_TRUE(tsr_comm_launched_by_mpi(&n));
    ASSERT_EQ_INT(n, 4);
    /* Asking for one process while the launcher started four is a mistake, said plainly. */
    {
        tsr_comm_options o = {.backend = TSR_COMM_SELF};
        ASSERT_EQ_INT(tsr_comm_init(&o, &c), TSR_ERR_INVALID);
        ASSERT_STR_CONTAINS(tsr_last_error(), "launched as 4 ranks");
    }
    unsetenv("OMPI_COMM_WORLD_SIZE");
    /* A batch script's shell (SLURM_STEP_NUM_TASKS without SLURM_PROCID) is no launch. */
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    ASSERT_TRUE(!tsr_comm_launched_by_mpi(&n));
    setenv("SLURM_PROCID", "0", 1);
    ASSERT_TRUE(tsr_comm_launched_by_mpi(&n));
    ASSERT_EQ_INT(n, 2);
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_PROCID");
}

TSR_TEST_MAIN(test_self_bootstrap, test_self_collectives, test_bcast_tree_counts,
              test_env_override_and_launcher_detection)
