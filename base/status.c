#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char tsr__errbuf[1024];

static const char *const tsr__names[TSR_STATUS_COUNT] = {
    [TSR_OK] = "ok",
    [TSR_ERR_INVALID] = "invalid argument",
    [TSR_ERR_NOMEM] = "out of memory",
    [TSR_ERR_IO] = "I/O error",
    [TSR_ERR_FORMAT] = "malformed file",
    [TSR_ERR_UNSUPPORTED] = "unsupported",
    [TSR_ERR_NO_BLOCKS] = "no free KV blocks",
    [TSR_ERR_BUDGET] = "exceeds memory budget",
    [TSR_ERR_CUDA] = "CUDA error",
    [TSR_ERR_CUBLAS] = "cuBLAS error",
    [TSR_ERR_NCCL] = "NCCL error",
    [TSR_ERR_MPI] = "MPI error",
    [TSR_ERR_HDF5] = "HDF5 error",
    [TSR_ERR_INTERNAL] = "internal error",
};

const char *tsr_strerror(tsr_status st) {
    if ((unsigned)st >= TSR_STATUS_COUNT) return "unknown status";
    return tsr__names[st];
}

tsr_status tsr_error_set(tsr_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tsr__errbuf, sizeof tsr__errbuf, fmt, ap);
    va_end(ap);
    /* Keep the message to one line, whatever the inputs contained. */
    for (char *p = tsr__errbuf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return st;
}

const char *tsr_last_error(void) { return tsr__errbuf; }

void tsr_error_clear(void) { tsr__errbuf[0] = '\0'; }

void tsr__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "tessera: internal assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
