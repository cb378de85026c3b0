/* jobs/study/cell_runner.h: a cell's outcome from its stderr. Under mpirun a rank's own line and
 * the launcher's help text come in either order; the reason is tessera's line, a rank that
 * ran out of memory makes the cell `oom`, and a rank the kernel killed is `oom` too. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "jobs/study/cell_runner.h"
#include "tests/test.h"

static const char tsr__help[] =
    "--------------------------------------------------------------------------\n"
    "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
    "with errorcode 1.\n"
    "\n"
    "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n"
    "You may or may not see output from other processes, depending on\n"
    "exactly when Open MPI kills them.\n"
    "--------------------------------------------------------------------------\n";

static const char tsr__oom[] =
    "tessera: rank 1: h2o --h2o-scores=materialize: cannot allocate the 1073741824-byte "
    "score matrix\n";

/* Classifies a child that exited with `code` and wrote `text` to stderr. */
static const char *tsr__classify(const char *text, int code, char *reason, size_t cap,
                                 int64_t *reached) {
    char path[] = "/tmp/tsr_cell_classify_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return "no temp file";
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    if (w != (ssize_t)strlen(text)) return "short write";
    tsr_cell_proc p;
    memset(&p, 0, sizeof p);
    p.exit_code = code;
    tsr_cell_read_stderr(path, &p);
    unlink(path);
    return tsr_cell_classify(&p, 60, reason, cap, reached);
}

TSR_TEST(test_classify_rank_oom_either_order) {
    char buf[4096], reason[1024];
    int64_t reached;
    /* the help text after the rank's line (the order that made it `error` before) */
    snprintf(buf, sizeof buf, "%s%s", tsr__oom, tsr__help);
    ASSERT_STR_EQ(tsr__classify(buf, 1, reason, sizeof reason, &reached), "oom");
    ASSERT_STR_CONTAINS(reason, "tessera: rank 1: h2o --h2o-scores=materialize: cannot allocate");
    ASSERT_TRUE(strstr(reason, "MPI_ABORT") == NULL);
    /* before it, with another rank's line after the help text: the line that says why */
    snprintf(buf, sizeof buf, "%s%stessera: rank 0: aborted by rank 1\n", tsr__help, tsr__oom);
    ASSERT_STR_EQ(tsr__classify(buf, 1, reason, sizeof reason, &reached), "oom");
    ASSERT_STR_CONTAINS(reason, "rank 1: h2o");
    /* a rank's warning does not stand for the failure */
    snprintf(buf, sizeof buf, "tessera error: weights: bad magic\n"
                              "tessera[rank 1] warning: slow start\n%s", tsr__help);
    ASSERT_STR_EQ(tsr__classify(buf, 1, reason, sizeof reason, &reached), "error");
    ASSERT_STR_CONTAINS(reason, "tessera error: weights: bad magic (exit 1)");
}

TSR_TEST(test_classify_launcher_lines) {
    char reason[1024];
    int64_t reached;
    /* a rank the OOM killer ended says nothing; mpirun says which signal */
    const char *killed =
        "--------------------------------------------------------------------------\n"
        "mpirun noticed that process rank 1 with PID 4242 on node n1 exited on signal 9 "
        "(Killed).\n"
        "--------------------------------------------------------------------------\n";
    ASSERT_STR_EQ(tsr__classify(killed, 137, reason, sizeof reason, &reached), "oom");
    ASSERT_STR_CONTAINS(reason, "SIGKILL");
    ASSERT_STR_EQ(tsr__classify("srun: error: n1: task 0: Killed\n", 137, reason,
                                sizeof reason, &reached),
                  "oom");
    const char *segv =
        "--------------------------------------------------------------------------\n"
        "mpirun noticed that process rank 0 with PID 7 on node n1 exited on signal 11 "
        "(Segmentation fault).\n"
        "--------------------------------------------------------------------------\n";
    ASSERT_STR_EQ(tsr__classify(segv, 139, reason, sizeof reason, &reached), "crash");
    ASSERT_STR_CONTAINS(reason, "signal 11");
    /* a help block alone: its first line, not the rule under it */
    const char *root =
        "--------------------------------------------------------------------------\n"
        "mpirun has detected an attempt to run as root.\n"
        "\n"
        "We strongly suggest that you run mpirun as a non-root user.\n"
        "--------------------------------------------------------------------------\n";
    ASSERT_STR_EQ(tsr__classify(root, 1, reason, sizeof reason, &reached), "error");
    ASSERT_STR_CONTAINS(reason, "mpirun has detected an attempt to run as root. (exit 1)");
    ASSERT_STR_EQ(tsr__classify("", 0, reason, sizeof reason, &reached), "ok");
}

TSR_TEST(test_classify_reached) {
    char reason[1024];
    int64_t reached;
    const char *line = "tessera: h2o --h2o-scores=materialize: the 8 x 512 x 9000 score matrix "
                       "needs more memory\n";
    ASSERT_STR_EQ(tsr__classify(line, 1, reason, sizeof reason, &reached), "oom");
    ASSERT_EQ_INT((int)reached, 9000);
}

TSR_TEST_MAIN(test_classify_rank_oom_either_order, test_classify_launcher_lines,
              test_classify_reached)
