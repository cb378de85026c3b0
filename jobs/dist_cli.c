/* --tp/--pp/--ep options of a distributed job (the start-up itself is runtime/engine/dist.c). */
#include "jobs/dist_cli.h"

#include <string.h>

#include "jobs/commands.h"

void tsr_dist_cli_init(tsr_dist_cli *d) { tsr_dist_options_init(d); }

void tsr_dist_cli_opts(tsr_dist_cli *d, tsr_cli_opt *out) {
    const tsr_cli_opt opts[TSR_DIST_CLI_N_OPTS] = {
        {"tp", TSR_OPT_INT, &d->tp, "N",
         "tensor-parallel ranks per pipeline stage (default: the job's ranks / --pp)", false},
        {"pp", TSR_OPT_INT, &d->pp, "N", "pipeline stages (default 1); ranks = tp x pp", false},
        {"ep", TSR_OPT_INT, &d->ep, "N",
         "expert parallelism (mixture-of-experts models): the experts spread over the N "
         "tensor-parallel ranks of a stage, E/N contiguous experts each, tokens exchanged "
         "all-to-all; N must be the tp size (--tp, whose default is the job's ranks / --pp) "
         "and divide the expert count, a dense model is refused; one process's tokens on "
         "the CPU backends (off by default: every rank holds every expert)", false},
        {"micro-batches", TSR_OPT_INT, &d->micro_batches, "N",
         "pipeline micro-batches per step (default: --pp; 1 keeps results bit-identical to "
         "one process for batches of several sequences)", false},
        {"bind", TSR_OPT_FLAG, &d->bind, NULL,
         "bind each rank to its share of its NUMA node's cores (default: leave binding to "
         "the launcher, e.g. srun --cpu-bind or mpirun --bind-to)", false},
        {"comm-timeout", TSR_OPT_FLOAT, &d->comm_timeout, "SECONDS",
         "end the job with a message naming the operation (and the rank, where known) when "
         "a collective or a pipeline transfer makes no progress for this long (0: off)", false},
    };
    memcpy(out, opts, sizeof opts);
}

/* 0 in the struct means "not given" (a default); given, it must be a real count. */
static bool tsr__bad_count(const tsr_cli *cli, const char *name, int v) {
    const tsr_cli_opt *o = tsr_cli_find(cli, name);
    return v < 0 || (o && o->seen && v < 1);
}

tsr_cli_result tsr_dist_cli_check(const tsr_cli *cli, const tsr_dist_cli *d) {
    if (tsr__bad_count(cli, "tp", d->tp)) return tsr_cli_usage_error(cli, "--tp must be >= 1");
    if (tsr__bad_count(cli, "pp", d->pp)) return tsr_cli_usage_error(cli, "--pp must be >= 1");
    if (tsr__bad_count(cli, "ep", d->ep)) return tsr_cli_usage_error(cli, "--ep must be >= 1");
    if (tsr__bad_count(cli, "micro-batches", d->micro_batches))
        return tsr_cli_usage_error(cli, "--micro-batches must be >= 1");
    if (!(d->comm_timeout >= 0) || d->comm_timeout > 1e9f) /* also NaN */
        return tsr_cli_usage_error(cli, "--comm-timeout must be between 0 (off) and 1e9 seconds");
    return TSR_CLI_OK;
}

int tsr_dist_fail(int rank, const char *cmd) {
    /* The job's exit status is rank 0's. Were the others to exit non-zero too, the one that
     * exits first makes Open MPI's launcher abort the job, and the output rank 0 has written
     * but the launcher not yet read is lost: the error line, 1 run in 8 with 3 ranks on 2
     * cores. */
    if (rank != 0) return 0;
    return tsr_cmd_fail(cmd);
}
