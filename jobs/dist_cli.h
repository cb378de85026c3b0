/* Distributed-job options shared by `tessera generate` and `tessera run`: --tp, --pp, --ep,
 * --micro-batches, --bind, --comm-timeout. They fill the engine spec's tsr_dist_options;
 * the engine (runtime/engine/engine.h, runtime/engine/dist.h) starts the job. */
#ifndef TSR_JOBS_DIST_CLI_H
#define TSR_JOBS_DIST_CLI_H

#include <stdbool.h>

#include "jobs/cli.h"
#include "runtime/engine/dist.h"

#define TSR_DIST_CLI_N_OPTS 6

/* The options as parsed: what the engine spec takes (tsr_engine_spec.dist). */
typedef tsr_dist_options tsr_dist_cli;

void tsr_dist_cli_init(tsr_dist_cli *d);
/* Writes the TSR_DIST_CLI_N_OPTS option entries (bound to d) at `out`. */
void tsr_dist_cli_opts(tsr_dist_cli *d, tsr_cli_opt *out);
tsr_cli_result tsr_dist_cli_check(const tsr_cli *cli, const tsr_dist_cli *d);

/* "tessera CMD: <error>" on rank 0 only (every rank has the agreed line); returns rank 0's
 * exit status, 1, and 0 on the other ranks (the launcher reports rank 0's: see the .c).
 * `rank` is the job's (tsr_engine_spec.rank_out: known even when the start failed). */
int tsr_dist_fail(int rank, const char *cmd);

#endif
