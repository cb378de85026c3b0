/* Per-run metrics of a bulk job: latency samples per request (TTFT, time per output token,
 * end-to-end), their percentiles, and a JSON report written atomically (tmp + rename).
 * The fields are documented in docs/jobs.md. */
#ifndef TSR_JOBS_METRICS_H
#define TSR_JOBS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "memory/kv_cache.h"
#include "base/status.h"

typedef struct tsr_samples {
    double *v;
    size_t n, cap;
} tsr_samples;

tsr_status tsr_samples_add(tsr_samples *s, double x);
void tsr_samples_free(tsr_samples *s);

typedef struct tsr_summary {
    size_t count;
    double mean, p50, p90, p99, max;
} tsr_summary;

/* Percentiles by linear interpolation between closest ranks (numpy's default); all zero
 * when there are no samples. Sorts s->v in place. */
void tsr_samples_summary(tsr_samples *s, tsr_summary *out);

typedef struct tsr_metrics {
    /* what ran */
    const char *model, *input, *output, *backend;
    int threads, max_batch_seqs, max_batch_tokens, max_context;
    /* requests (lines of the input) */
    int64_t lines, ok, failed, skipped, finish_stop, finish_length, finish_tool_calls;
    /* tokens of the requests that ran */
    int64_t prompt_tokens, completion_tokens;
    double wall_s;   /* from the first request to the last record */
    double setup_s;  /* model load and resume scan */
    /* per-request samples, seconds; itl: every gap between successive output tokens of a
     * request */
    tsr_samples ttft, tpot, e2e, itl;
    double arrival_rate; /* --arrival-rate, requests/s (0: offline) */
    /* scheduler */
    int64_t steps, batch_tokens, prefill_tokens, decode_tokens, preemptions;
    int max_running;
    const char *preempt; /* "swap" or "recompute" */
    int64_t swaps_out, swaps_in, swap_out_bytes, swap_in_bytes, swap_fallbacks;
    /* memory */
    int rank;
    int64_t peak_host_rss_bytes, peak_device_bytes;
    const char *kv_json; /* tsr_kv_stats_json of the cache (borrowed) */
    const char *kv_memory_json; /* tsr_kv_layer_bytes_json (borrowed; NULL: none) */
} tsr_metrics;

void tsr_metrics_free(tsr_metrics *m);


/* Writes the report to path (path.tmp, fsync, rename). */
tsr_status tsr_metrics_write(tsr_metrics *m, const char *path);

#endif
