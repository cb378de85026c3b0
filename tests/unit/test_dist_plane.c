/* The data-plane choice of a distributed job (jobs/dist_cli.c): a host backend keeps MPI, a
 * device backend asks for NCCL, and what cannot be made correct is refused with one line
 * instead of handing GPU pointers to MPI. Runs without a GPU; when one answers (the device
 * machine), the real CUDA backend goes through the same path. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "jobs/cli.h"
#include "jobs/dist_cli.h"
#include "kernels/backend.h"
#include "base/status.h"
#include "tests/test.h"

static void tsr__forget_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                                       "PMI_RANK", "PMIX_RANK", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                                       "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "TSR_COMM"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static tsr_dist_plane_query tsr__q(int world, int tp, int device_ranks, bool nccl,
                                   const char *policy) {
    return (tsr_dist_plane_query){.world = world, .tp = tp, .device_ranks = device_ranks,
                                  .nccl_built = nccl, .backend = device_ranks ? "cuda" : "cpu",
                                  .kv_policy = policy ? tsr_kv_policy_find(policy) : NULL};
}

TSR_TEST(test_cpu_backend_keeps_mpi) {
    tsr_dist_plane p = TSR_DIST_PLANE_NCCL;
    tsr_dist_plane_query q = tsr__q(1, 1, 0, true, NULL);
    ASSERT_OK(tsr_dist_plane_choose(&q, &p));
    ASSERT_EQ_INT(p, TSR_DIST_PLANE_LOCAL);
    /* whatever the build and the policy: host activations, host MPI */
    const char *pols[] = {NULL, "paged", "h2o", "offload"};
    for (int nccl = 0; nccl < 2; nccl++)
        for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
            q = tsr__q(4, 2, 0, nccl, pols[i]);
            ASSERT_OK(tsr_dist_plane_choose(&q, &p));
            ASSERT_EQ_INT(p, TSR_DIST_PLANE_MPI);
        }
    ASSERT_STR_EQ(tsr_dist_plane_name(TSR_DIST_PLANE_MPI), "mpi");
}

TSR_TEST(test_device_backend_asks_for_nccl) {
    tsr_dist_plane p = TSR_DIST_PLANE_MPI;
    tsr_dist_plane_query q = tsr__q(1, 1, 1, false, "h2o");
    ASSERT_OK(tsr_dist_plane_choose(&q, &p)); /* one GPU rank: nothing crosses ranks */
    ASSERT_EQ_INT(p, TSR_DIST_PLANE_LOCAL);
    q = tsr__q(2, 2, 2, true, NULL);
    ASSERT_OK(tsr_dist_plane_choose(&q, &p));
    ASSERT_EQ_INT(p, TSR_DIST_PLANE_NCCL);
    q = tsr__q(4, 2, 4, true, "paged");
    ASSERT_OK(tsr_dist_plane_choose(&q, &p));
    ASSERT_EQ_INT(p, TSR_DIST_PLANE_NCCL);
    /* score policies are fine without TP: their sums stay within the rank */
    q = tsr__q(2, 1, 2, true, "h2o");
    ASSERT_OK(tsr_dist_plane_choose(&q, &p));
    ASSERT_EQ_INT(p, TSR_DIST_PLANE_NCCL);
    ASSERT_STR_EQ(tsr_dist_plane_name(p), "nccl");
}

TSR_TEST(test_device_backend_refusals) {
    tsr_dist_plane p;
    tsr_dist_plane_query q = tsr__q(2, 2, 2, false, NULL);
    ASSERT_EQ_INT(tsr_dist_plane_choose(&q, &p), TSR_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(tsr_last_error(), "the cuda backend on 2 ranks needs NCCL");
    ASSERT_STR_CONTAINS(tsr_last_error(), "-DTESSERA_NCCL=ON");
    ASSERT_TRUE(strchr(tsr_last_error(), '\n') == NULL);
    q = tsr__q(4, 4, 3, true, NULL);
    ASSERT_EQ_INT(tsr_dist_plane_choose(&q, &p), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "3 of the job's 4 ranks got a GPU backend");
    /* the policies whose declaration sums over the TP group in host memory */
    const char *pols[] = {"h2o", "offload", "snapkv"};
    for (size_t i = 0; i < 3; i++) {
        q = tsr__q(2, 2, 2, true, pols[i]);
        ASSERT_TRUE(q.kv_policy && q.kv_policy->tp_host_sums);
        ASSERT_EQ_INT(tsr_dist_plane_choose(&q, &p), TSR_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(tsr_last_error(), "with tensor parallelism (tp 2) on the cuda backend");
        ASSERT_STR_CONTAINS(tsr_last_error(), pols[i]);
    }
    /* the others run on NCCL under tp */
    const char *fine[] = {"paged", "streaming"};
    for (size_t i = 0; i < 2; i++) {
        q = tsr__q(2, 2, 2, true, fine[i]);
        ASSERT_OK(tsr_dist_plane_choose(&q, &p));
        ASSERT_EQ_INT(p, TSR_DIST_PLANE_NCCL);
    }
}

/* A stand-in for a GPU backend: only the fields the choice reads. */
static const tsr_backend_ops tsr__fake_gpu_ops = {.name = "fakegpu"};

TSR_TEST(test_single_process_stays_local) {
    tsr__forget_launcher();
    tsr_dist d;
    ASSERT_OK(tsr_dist_start(&d));
    tsr_dist_cli dc;
    tsr_dist_cli_init(&dc);
    ASSERT_OK(tsr_comm_set_layout(d.comm, 1, 1));
    tsr_backend gpu = {.ops = &tsr__fake_gpu_ops, .device = 0};
    ASSERT_OK(tsr_dist_data_plane(&d, &gpu, &tsr_kv_policy_h2o));
    ASSERT_EQ_INT(d.plane, TSR_DIST_PLANE_LOCAL);
    ASSERT_TRUE(!tsr_comm_uses_nccl(d.comm));
    tsr_backend *cpu = NULL;
    ASSERT_OK(tsr_backend_cpu_create(1, &cpu));
    ASSERT_OK(tsr_dist_data_plane(&d, cpu, NULL));
    ASSERT_EQ_INT(d.plane, TSR_DIST_PLANE_LOCAL);
    tsr_backend_destroy(cpu);
    tsr_dist_end(&d);
}

TSR_TEST(test_enable_nccl_by_build) {
    tsr__forget_launcher();
    tsr_comm *c = NULL;
    ASSERT_OK(tsr_comm_init(NULL, &c));
    if (tsr_comm_nccl_built()) {
        /* one process: the data plane stays local, device buffers need no NCCL */
        ASSERT_OK(tsr_comm_enable_nccl(c, 0, NULL));
        ASSERT_TRUE(!tsr_comm_uses_nccl(c));
    } else {
        ASSERT_EQ_INT(tsr_comm_enable_nccl(c, 0, NULL), TSR_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(tsr_last_error(), "NCCL requested, but");
        ASSERT_TRUE(!tsr_comm_uses_nccl(c));
    }
    ASSERT_TRUE(tsr_comm_cuda_stream(c) == NULL);
    tsr_comm_destroy(c);
}

/* The usage checks of --tp/--pp/--micro-batches: 0 given explicitly is an error, absent is
 * the default. */
static tsr_cli_result tsr__parse(const char *a, const char *b) {
    tsr_dist_cli d;
    tsr_dist_cli_init(&d);
    tsr_cli_opt opts[TSR_DIST_CLI_N_OPTS];
    tsr_dist_cli_opts(&d, opts);
    tsr_cli cli = {.cmd = "test", .synopsis = "", .about = "", .opts = opts,
                   .n_opts = TSR_DIST_CLI_N_OPTS};
    char *argv[] = {"test", (char *)a, (char *)b, NULL};
    tsr_cli_result r = tsr_cli_parse(&cli, a ? 3 : 1, argv);
    return r != TSR_CLI_OK ? r : tsr_dist_cli_check(&cli, &d);
}

TSR_TEST(test_cli_counts) {
    ASSERT_EQ_INT(tsr__parse(NULL, NULL), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr__parse("--tp", "2"), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr__parse("--tp", "0"), TSR_CLI_USAGE);
    ASSERT_EQ_INT(tsr__parse("--pp", "0"), TSR_CLI_USAGE);
    ASSERT_EQ_INT(tsr__parse("--tp", "-1"), TSR_CLI_USAGE);
    ASSERT_EQ_INT(tsr__parse("--micro-batches", "0"), TSR_CLI_USAGE);
    ASSERT_EQ_INT(tsr__parse("--micro-batches", "1"), TSR_CLI_OK);
}

/* --pp that does not divide the job, without --tp: the message names what was given. */
TSR_TEST(test_layout_names_given_options) {
    tsr__forget_launcher();
    tsr_dist d;
    ASSERT_OK(tsr_dist_start(&d));
    tsr_dist_cli dc;
    tsr_dist_cli_init(&dc);
    dc.pp = 2;
    ASSERT_EQ_INT(tsr_dist_layout(&d, &dc, NULL, "m"), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--pp 2 needs a multiple of 2 ranks (tp x pp), but the job "
                                    "has 1");
    tsr_dist_end(&d);
}

/* With a GPU (the device machine): the real CUDA backend is a device backend, its stream
 * (the vtable's stream_handle) is what NCCL would be ordered on, and a single process keeps
 * the local plane. */
TSR_TEST(test_cuda_backend_if_present) {
    tsr__forget_launcher();
    tsr_backend *be = NULL;
    if (tsr_backend_create("cuda", 1, &be) != TSR_OK) {
        fprintf(stderr, "  (CUDA backend check skipped: %s)\n", tsr_last_error());
        return;
    }
    ASSERT_TRUE(be->device >= 0);
    ASSERT_TRUE(!be->host_memory);
    ASSERT_TRUE(be->ops->stream_handle && be->ops->stream_handle(be) != NULL);
    tsr_dist d;
    ASSERT_OK(tsr_dist_start(&d));
    ASSERT_OK(tsr_comm_set_layout(d.comm, 1, 1));
    ASSERT_OK(tsr_dist_data_plane(&d, be, NULL));
    ASSERT_EQ_INT(d.plane, TSR_DIST_PLANE_LOCAL);
    tsr_dist_plane_query q = {.world = 2, .tp = 2, .device_ranks = 2,
                              .nccl_built = tsr_comm_nccl_built(), .backend = be->ops->name};
    tsr_dist_plane p;
    tsr_status st = tsr_dist_plane_choose(&q, &p);
    if (tsr_comm_nccl_built()) {
        ASSERT_OK(st);
        ASSERT_EQ_INT(p, TSR_DIST_PLANE_NCCL);
    } else {
        ASSERT_EQ_INT(st, TSR_ERR_UNSUPPORTED);
    }
    fprintf(stderr, "  cuda backend on GPU %d: device data plane %s across ranks\n", be->device,
            st == TSR_OK ? "nccl" : "refused (no NCCL in this build)");
    tsr_dist_end(&d);
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_cpu_backend_keeps_mpi, test_device_backend_asks_for_nccl,
              test_device_backend_refusals, test_single_process_stays_local,
              test_enable_nccl_by_build, test_cli_counts, test_layout_names_given_options,
              test_cuda_backend_if_present)
