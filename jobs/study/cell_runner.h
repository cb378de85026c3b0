/* One cell of `tessera characterize` as its own process: fork, an address-space limit
 * (RLIMIT_AS) in the child, exec, and a wall-time limit the parent enforces (SIGTERM to
 * the child's process group, SIGKILL after a grace period), so a cell that runs out of
 * memory, hangs or crashes cannot take the study down. The outcome is classified from
 * the exit status and the child's stderr: tessera's own last line where there is one (a
 * launcher such as mpirun prints its help text after a rank's message, in either order),
 * else the last line, and what the launcher says of a rank that a signal ended. Also: the prompts of a cell, N tokens
 * of filler text for the model's tokenizer. */
#ifndef TSR_JOBS_CELL_RUNNER_H
#define TSR_JOBS_CELL_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Seconds between SIGTERM and SIGKILL when a cell runs past its time limit. */
#define TSR_CELL_KILL_GRACE_S 5.0

typedef struct tsr_cell_proc {
    int exit_code;        /* when it exited; -1 when killed by a signal */
    int signal;           /* the signal that ended it (0: exited) */
    bool timed_out;       /* the parent stopped it at the time limit */
    bool stopped;         /* the parent stopped it because the driver was asked to stop */
    double wall_s;
    int64_t maxrss_bytes; /* of the child and its descendants (wait4), 0 when unknown */
    char last_line[512];  /* the last non-empty line of its stderr */
    char own_line[512];   /* the last line of tessera's own ("tessera..."), "" when none */
    int rank_signal;      /* a signal that ended a rank, as the launcher reports it (0: none) */
} tsr_cell_proc;

/* Called about every 0.5 s while the child runs; returning true stops the child (as a
 * time limit does, but marked `stopped`). */
typedef bool (*tsr_cell_tick_fn)(void *ctx, double elapsed_s);

/* Runs argv[0] (a path; NULL-terminated argv) with stdin from /dev/null and stdout and
 * stderr appended to the two files, under `mem_limit` bytes of address space (0: none)
 * and `time_limit` seconds (0: none). Fails only when the child cannot be started. */
tsr_status tsr_cell_spawn(char *const argv[], const char *stdout_path, const char *stderr_path,
                          int64_t mem_limit, double time_limit, tsr_cell_tick_fn tick,
                          void *ctx, tsr_cell_proc *out);

/* "ok", "oom", "timeout", "crash" or "error" for a finished child, with a one-line reason
 * ("" for ok) and the tokens the sequence reached when the failure says (else -1). The
 * reason is tessera's own line when the child (or one of its ranks) printed one. */
const char *tsr_cell_classify(const tsr_cell_proc *p, double time_limit, char *reason,
                              size_t cap, int64_t *reached);

/* Reads the tail of a child's stderr into p->last_line, p->own_line and p->rank_signal
 * (tsr_cell_spawn does this; tests call it on a file of their own). */
void tsr_cell_read_stderr(const char *stderr_path, tsr_cell_proc *p);

/* The path of this executable (/proc/self/exe resolved), for the children. */
tsr_status tsr_cell_self_exe(char *buf, size_t cap);

/* Writes a completions request per prompt to `path` (OpenAI batch JSONL): `n` prompts of
 * `tokens` tokens each for the tokenizer (BOS included, as `tessera run` prepends it),
 * cut from filler text (text_path's contents, or built-in sentences when NULL) at a
 * different offset per prompt so that no two share a prefix, each asking for
 * `max_tokens`. *actual gets the prompt tokens of the first prompt after re-encoding. */
tsr_status tsr_cell_write_prompts(const char *path, const char *tokenizer_path,
                                  const char *text_path, int n, int tokens, int max_tokens,
                                  int *actual);

#endif
