/* Graceful stop of long jobs: SIGTERM, SIGINT and SIGUSR1 (what Slurm sends before a time
 * limit, `--signal=USR1@T`, and at cancel/preemption) only set a flag; the job checks it
 * between scheduler steps, leaves every finished record flushed and exits so that a rerun
 * resumes. */
#ifndef TSR_JOBS_SIGNALS_H
#define TSR_JOBS_SIGNALS_H

#include <stdbool.h>

#include "base/status.h"

/* Exit code of a job that stopped on a signal with work left (rerun to resume). */
#define TSR_EXIT_STOPPED 3

/* Installs the handlers for SIGTERM, SIGINT and SIGUSR1 (SA_RESTART, so I/O in progress is
 * not interrupted). Calling it again is harmless. */
tsr_status tsr_signals_install(void);

/* Puts the three signals back to their default action (the flag is kept). */
void tsr_signals_restore(void);

/* Whether one of the signals arrived; *signo (may be NULL) gets the first one, 0 if none. */
bool tsr_signals_stop_requested(int *signo);

/* Forgets a received signal (tests, and a job that decides to go on). */
void tsr_signals_clear(void);

/* "SIGTERM", "SIGINT", "SIGUSR1", or "signal N" for others (static storage). */
const char *tsr_signals_name(int signo);

#endif
