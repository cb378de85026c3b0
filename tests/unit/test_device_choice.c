/* The GPU a rank takes (kernels/device_choice.h): pure functions of the local rank, the
 * visible GPU count and the launcher's environment, checked without a GPU. */
#include <string.h>

#include "kernels/backend.h"
#include "kernels/device_choice.h"
#include "tests/test.h"

TSR_TEST(test_gpu_for_local_rank) {
    int dev = 99;
    /* ranks spread over the node's GPUs */
    for (int r = 0; r < 8; r++) {
        ASSERT_OK(tsr_gpu_for_local_rank(r, 8, false, &dev));
        ASSERT_EQ_INT(dev, r);
    }
    /* no GPU: no device, not an error */
    ASSERT_OK(tsr_gpu_for_local_rank(5, 0, false, &dev));
    ASSERT_EQ_INT(dev, -1);
    /* more ranks than GPUs: a clear error naming the fix */
    ASSERT_EQ_INT(tsr_gpu_for_local_rank(4, 4, false, &dev), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "local rank 4");
    ASSERT_STR_CONTAINS(tsr_last_error(), "4 GPUs");
    ASSERT_STR_CONTAINS(tsr_last_error(), "TSR_GPU_SHARE=1");
    ASSERT_EQ_INT(tsr_gpu_for_local_rank(1, 1, false, &dev), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "1 GPU:");
    /* ... unless sharing is allowed: round robin */
    ASSERT_OK(tsr_gpu_for_local_rank(5, 4, true, &dev));
    ASSERT_EQ_INT(dev, 1);
    ASSERT_OK(tsr_gpu_for_local_rank(8, 4, true, &dev));
    ASSERT_EQ_INT(dev, 0);
    ASSERT_EQ_INT(tsr_gpu_for_local_rank(-1, 4, true, &dev), TSR_ERR_INVALID);
}

/* A fake environment for the getter. */
static const char *env_names[4];
static const char *env_values[4];

static char *fake_getenv(const char *name) {
    for (int i = 0; i < 4; i++)
        if (env_names[i] && strcmp(env_names[i], name) == 0) return (char *)env_values[i];
    return NULL;
}

static void env_set(int i, const char *name, const char *value) {
    env_names[i] = name;
    env_values[i] = value;
}

static void env_clear(void) {
    memset(env_names, 0, sizeof env_names);
    memset(env_values, 0, sizeof env_values);
}

TSR_TEST(test_local_rank_env) {
    env_clear();
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), -1);
    env_set(0, "SLURM_LOCALID", "3");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), 3);
    env_set(1, "MPI_LOCALRANKID", "5");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), 3); /* Slurm's before Hydra's */
    env_set(2, "OMPI_COMM_WORLD_LOCAL_RANK", "1");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), 1); /* Open MPI's first */
    env_set(2, "OMPI_COMM_WORLD_LOCAL_RANK", "x1");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), -1); /* set but not a rank */
    env_set(2, "OMPI_COMM_WORLD_LOCAL_RANK", "-2");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), -1);
    env_set(2, "OMPI_COMM_WORLD_LOCAL_RANK", "99999999999");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), -1);
    env_clear();
    env_set(0, "MPI_LOCALRANKID", "0");
    ASSERT_EQ_INT(tsr_local_rank_env(fake_getenv), 0);
    /* TSR_GPU_SHARE */
    ASSERT_TRUE(!tsr_gpu_share_env(fake_getenv));
    env_set(1, "TSR_GPU_SHARE", "1");
    ASSERT_TRUE(tsr_gpu_share_env(fake_getenv));
    env_set(1, "TSR_GPU_SHARE", "yes");
    ASSERT_TRUE(!tsr_gpu_share_env(fake_getenv));
    env_clear();
}

TSR_TEST(test_local_rank_pick) {
    /* a job of several ranks: MPI's shared-memory split decides */
    ASSERT_EQ_INT(tsr_local_rank_pick(2, 8, 5), 2);
    ASSERT_EQ_INT(tsr_local_rank_pick(0, 8, 5), 0);
    /* alone: the launcher's, else 0 */
    ASSERT_EQ_INT(tsr_local_rank_pick(0, 1, 3), 3);
    ASSERT_EQ_INT(tsr_local_rank_pick(0, 1, -1), 0);
    /* the end to end choice: srun -n 4 of separate processes on a 2-GPU node */
    int dev = -1;
    ASSERT_OK(tsr_gpu_for_local_rank(tsr_local_rank_pick(0, 1, 1), 2, false, &dev));
    ASSERT_EQ_INT(dev, 1);
    ASSERT_EQ_INT(tsr_gpu_for_local_rank(tsr_local_rank_pick(0, 1, 3), 2, false, &dev),
                  TSR_ERR_INVALID);
}

/* The CPU backends ignore the local rank (no GPU to choose). */
TSR_TEST(test_create_local_cpu) {
    tsr_backend *be = NULL;
    ASSERT_OK(tsr_backend_create_local("cpu", 1, 17, &be));
    ASSERT_STR_EQ(be->ops->name, "cpu");
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_gpu_for_local_rank, test_local_rank_env, test_local_rank_pick,
              test_create_local_cpu)
