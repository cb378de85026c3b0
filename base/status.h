/* tessera status codes and the thread-local last-error line.
 *
 * Every fallible function returns tsr_status. At the failure point the callee records
 * one human line (naming the file/object and the problem) with tsr_error_set(); the
 * caller that finally reports it reads tsr_last_error(). Library code never exits. */
#ifndef TSR_BASE_STATUS_H
#define TSR_BASE_STATUS_H

typedef enum tsr_status {
    TSR_OK = 0,
    TSR_ERR_INVALID,     /* bad argument, config or input */
    TSR_ERR_NOMEM,       /* allocation failed or a budget cannot hold it */
    TSR_ERR_IO,          /* open/read/write/mmap failed */
    TSR_ERR_FORMAT,      /* a file's contents are malformed */
    TSR_ERR_UNSUPPORTED, /* valid but not implemented (architecture, dtype) */
    TSR_ERR_NO_BLOCKS,   /* the KV pool is short right now (retry after frees) */
    TSR_ERR_BUDGET,      /* can never fit the configured budget */
    TSR_ERR_CUDA,
    TSR_ERR_CUBLAS,
    TSR_ERR_NCCL,
    TSR_ERR_MPI,
    TSR_ERR_HDF5,
    TSR_ERR_INTERNAL,
    TSR_STATUS_COUNT
} tsr_status;

/* Short name of a status ("invalid argument", ...). */
const char *tsr_strerror(tsr_status st);

/* Records a one-line message for the current thread (printf format) and returns `st`,
 * so that a failure site reads `return tsr_error_set(TSR_ERR_FORMAT, "%s: ...", path);`. */
tsr_status tsr_error_set(tsr_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last recorded message on this thread, or "" when none. */
const char *tsr_last_error(void);
void tsr_error_clear(void);

#define TSR_TRY(expr)                                                                   \
    do {                                                                                \
        tsr_status tsr__st = (expr);                                                    \
        if (tsr__st != TSR_OK) return tsr__st;                                          \
    } while (0)

/* Sets `st` and jumps to `label` on failure: one cleanup path per function. */
#define TSR_TRY_GOTO(expr, st, label)                                                   \
    do {                                                                                \
        (st) = (expr);                                                                  \
        if ((st) != TSR_OK) goto label;                                                 \
    } while (0)

/* Invariants only (programming errors), on in every build. */
#define TSR_ASSERT(cond)                                                                \
    do {                                                                                \
        if (!(cond)) tsr__assert_fail(#cond, __FILE__, __LINE__);                       \
    } while (0)
_Noreturn void tsr__assert_fail(const char *expr, const char *file, int line);

#endif
