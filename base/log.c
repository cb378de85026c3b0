#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static tsr_log_level tsr__level = TSR_LOG_WARN;
static int tsr__rank = -1;

void tsr_log_set_level(tsr_log_level level) { tsr__level = level; }
tsr_log_level tsr_log_get_level(void) { return tsr__level; }
void tsr_log_set_rank(int rank) { tsr__rank = rank; }

void tsr_log(tsr_log_level level, const char *fmt, ...) {
    if (level > tsr__level) return;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so that ranks sharing a log do not interleave mid-line. */
    if (tsr__rank >= 0)
        fprintf(stderr, "tessera[rank %d] %s: %s\n", tsr__rank, names[level], line);
    else
        fprintf(stderr, "tessera %s: %s\n", names[level], line);
}
