/* The backend registry (kernels/backend.h): the table behind --backend, its names for help
 * texts, capabilities, devices, and what a module backend that cannot run says. No GPU is
 * needed: the CUDA entry is checked for a clean refusal where it cannot run. */
#include <string.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "tests/test.h"

TSR_TEST(test_table) {
    const tsr_backend_info *cpu = tsr_backend_find("cpu");
    const tsr_backend_info *fenced = tsr_backend_find("cpu-fenced");
    const tsr_backend_info *cuda = tsr_backend_find("cuda");
    ASSERT_TRUE(cpu && fenced && cuda);
    ASSERT_TRUE(cpu->caps & TSR_BACKEND_CAP_HOST_MEMORY);
    ASSERT_TRUE(!cpu->module);
    ASSERT_TRUE(fenced->caps & TSR_BACKEND_CAP_FENCED);
    ASSERT_TRUE((cuda->caps & TSR_BACKEND_CAP_GPU) && (cuda->caps & TSR_BACKEND_CAP_MODULE));
    ASSERT_STR_EQ(cuda->module, "libtessera-cuda.so");
    ASSERT_TRUE(tsr_backend_find("auto") == NULL);
    ASSERT_TRUE(tsr_backend_find("tpu") == NULL);
    ASSERT_TRUE(tsr_backend_find(NULL) == NULL);
    int n = 0;
    while (tsr_backend_info_at(n)) n++;
    ASSERT_EQ_INT(n, 3);
    ASSERT_TRUE(tsr_backend_info_at(-1) == NULL);
    /* every entry is named in the help text, after "auto" */
    const char *names = tsr_backend_names();
    ASSERT_STR_EQ(names, "auto, cpu, cpu-fenced or cuda");
    for (int i = 0; i < n; i++) ASSERT_STR_CONTAINS(names, tsr_backend_info_at(i)->name);
}

TSR_TEST(test_unknown_lists_names) {
    tsr_backend *be = NULL;
    ASSERT_EQ_INT(tsr_backend_create("tpu", 1, &be), TSR_ERR_INVALID);
    ASSERT_TRUE(be == NULL);
    ASSERT_STR_CONTAINS(tsr_last_error(), "unknown backend 'tpu'");
    ASSERT_STR_CONTAINS(tsr_last_error(), tsr_backend_names());
}

TSR_TEST(test_cpu_devices) {
    tsr_device_info d[2];
    int n = 0;
    ASSERT_OK(tsr_backend_devices("cpu", d, 2, &n));
    ASSERT_EQ_INT(n, 1);
    ASSERT_EQ_INT(d[0].index, -1);
    ASSERT_STR_EQ(d[0].backend, "cpu");
    ASSERT_TRUE(d[0].memory_bytes > 0);
    ASSERT_EQ_INT(tsr_backend_devices("nope", d, 2, &n), TSR_ERR_INVALID);
}

/* Whatever this machine lacks (module, CUDA libraries, driver, GPU), --backend cuda is one
 * line naming the backend and what to do, and auto runs on the CPU. Where a GPU answers,
 * cuda runs and its devices have names and memory. */
TSR_TEST(test_cuda_runs_or_says_why) {
    tsr_backend *be = NULL;
    tsr_status st = tsr_backend_create("cuda", 1, &be);
    tsr_device_info d[8];
    int n = 0;
    if (st == TSR_OK) {
        ASSERT_STR_EQ(be->ops->name, "cuda");
        tsr_backend_destroy(be);
        ASSERT_OK(tsr_backend_devices("cuda", d, 8, &n));
        ASSERT_TRUE(n >= 1 && d[0].memory_bytes > 0 && d[0].name[0]);
        fprintf(stderr, "  cuda: %d GPU(s), %s\n", n, d[0].name);
        return;
    }
    ASSERT_TRUE(be == NULL);
    const char *e = tsr_last_error();
    ASSERT_STR_CONTAINS(e, "backend 'cuda': ");
    ASSERT_STR_CONTAINS(e, "--backend cpu");
    ASSERT_TRUE(strchr(e, '\n') == NULL);
    fprintf(stderr, "  cuda: %s\n", e);
    /* asked again: the same answer (the module is tried once per process) */
    char first[1024];
    snprintf(first, sizeof first, "%s", e);
    ASSERT_EQ_INT(tsr_backend_create("cuda", 1, &be), st);
    ASSERT_STR_EQ(tsr_last_error(), first);
    ASSERT_EQ_INT(tsr_backend_devices("cuda", d, 8, &n), st);
    ASSERT_EQ_INT(n, 0);
    ASSERT_OK(tsr_backend_create("auto", 1, &be));
    ASSERT_STR_EQ(be->ops->name, "cpu");
    tsr_backend_destroy(be);
}

TSR_TEST_MAIN(test_table, test_unknown_lists_names, test_cpu_devices, test_cuda_runs_or_says_why)
