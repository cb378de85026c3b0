/* Progress of a bulk job on stderr: a one-line bar redrawn in place (\r) when the stream is
 * a terminal, plain periodic lines otherwise (batch logs), and a final line either way. */
#ifndef TSR_JOBS_PROGRESS_H
#define TSR_JOBS_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct tsr_progress {
    FILE *out;
    const char *name;  /* "tessera run" */
    bool tty;          /* redraw one line instead of printing lines */
    bool quiet;        /* print nothing */
    double interval;   /* seconds between plain lines */
    double t0, last;   /* start, last print */
    int64_t total;     /* requests this run will process */
    bool drawn;        /* a bar is on screen (needs a newline before other output) */
} tsr_progress;

/* interval <= 0: only the final line. */
void tsr_progress_init(tsr_progress *p, FILE *out, const char *name, int64_t total,
                       double interval, bool quiet, double now);

/* Prints when due (every `interval` s in line mode, at most 5 times a second as a bar). */
void tsr_progress_update(tsr_progress *p, double now, int64_t done, int64_t out_tokens);

/* The final line (always printed unless quiet). */
void tsr_progress_finish(tsr_progress *p, double now, int64_t done, int64_t out_tokens);

/* "tessera run: 120/200 requests, 1534 tok/s, ETA 12 s" (bar_width > 0 adds a bar). */
void tsr_progress_format(char *buf, size_t cap, const char *name, int64_t done, int64_t total,
                         double elapsed, int64_t out_tokens, int bar_width);

#endif
