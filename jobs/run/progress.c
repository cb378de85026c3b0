#include "jobs/run/progress.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

void tsr_progress_init(tsr_progress *p, FILE *out, const char *name, int64_t total,
                       double interval, bool quiet, double now) {
    memset(p, 0, sizeof *p);
    p->out = out;
    p->name = name;
    p->tty = out && isatty(fileno(out));
    p->quiet = quiet || !out;
    p->interval = interval;
    p->t0 = p->last = now;
    p->total = total;
}

void tsr_progress_format(char *buf, size_t cap, const char *name, int64_t done, int64_t total,
                         double elapsed, int64_t out_tokens, int bar_width) {
    double tps = elapsed > 0 ? (double)out_tokens / elapsed : 0.0;
    char eta[32] = "ETA -";
    if (done >= total)
        snprintf(eta, sizeof eta, "done in %.1f s", elapsed);
    else if (done > 0 && elapsed > 0)
        snprintf(eta, sizeof eta, "ETA %.0f s", elapsed / (double)done * (double)(total - done));
    char bar[80] = "";
    if (bar_width > 0) {
        if (bar_width > 60) bar_width = 60;
        int fill = total > 0 ? (int)((double)bar_width * (double)done / (double)total) : bar_width;
        if (fill > bar_width) fill = bar_width;
        bar[0] = '[';
        for (int i = 0; i < bar_width; i++) bar[1 + i] = i < fill ? '#' : '.';
        bar[1 + bar_width] = ']';
        bar[2 + bar_width] = ' ';
        bar[3 + bar_width] = '\0';
    }
    snprintf(buf, cap, "%s: %s%" PRId64 "/%" PRId64 " requests, %.0f tok/s, %s", name, bar, done,
             total, tps, eta);
}

void tsr_progress_update(tsr_progress *p, double now, int64_t done, int64_t out_tokens) {
    if (p->quiet) return;
    double every = p->tty ? 0.2 : p->interval;
    if (every <= 0 || now - p->last < every) return;
    p->last = now;
    char line[256];
    tsr_progress_format(line, sizeof line, p->name, done, p->total, now - p->t0, out_tokens,
                        p->tty ? 30 : 0);
    if (p->tty) {
        fprintf(p->out, "\r%s\x1b[K", line);
        p->drawn = true;
    } else {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
}

void tsr_progress_finish(tsr_progress *p, double now, int64_t done, int64_t out_tokens) {
    if (p->quiet) return;
    char line[256];
    tsr_progress_format(line, sizeof line, p->name, done, p->total, now - p->t0, out_tokens,
                        p->tty ? 30 : 0);
    fprintf(p->out, p->tty ? "\r%s\x1b[K\n" : "%s\n", line);
    p->drawn = false;
    fflush(p->out);
}
