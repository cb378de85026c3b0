#include "jobs/run/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/alloc.h"

tsr_status tsr_samples_add(tsr_samples *s, double x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        double *v = tsr_realloc(s->v, cap * sizeof *v);
        if (!v) return TSR_ERR_NOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return TSR_OK;
}

void tsr_samples_free(tsr_samples *s) {
    tsr_free(s->v);
    memset(s, 0, sizeof *s);
}

static int tsr__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static double tsr__pct(const double *v, size_t n, double p) {
    double r = p * (double)(n - 1);
    size_t lo = (size_t)r;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (r - (double)lo) * (v[lo + 1] - v[lo]);
}

void tsr_samples_summary(tsr_samples *s, tsr_summary *out) {
    memset(out, 0, sizeof *out);
    if (s->n == 0) return;
    qsort(s->v, s->n, sizeof *s->v, tsr__cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->v[i];
    out->count = s->n;
    out->mean = sum / (double)s->n;
    out->p50 = tsr__pct(s->v, s->n, 0.50);
    out->p90 = tsr__pct(s->v, s->n, 0.90);
    out->p99 = tsr__pct(s->v, s->n, 0.99);
    out->max = s->v[s->n - 1];
}

void tsr_metrics_free(tsr_metrics *m) {
    tsr_samples_free(&m->ttft);
    tsr_samples_free(&m->tpot);
    tsr_samples_free(&m->e2e);
    tsr_samples_free(&m->itl);
}

static void tsr__add_summary(cJSON *parent, const char *name, tsr_samples *s) {
    tsr_summary q;
    tsr_samples_summary(s, &q);
    cJSON *o = cJSON_AddObjectToObject(parent, name);
    if (!o) return;
    cJSON_AddNumberToObject(o, "count", (double)q.count);
    cJSON_AddNumberToObject(o, "mean", q.mean);
    cJSON_AddNumberToObject(o, "p50", q.p50);
    cJSON_AddNumberToObject(o, "p90", q.p90);
    cJSON_AddNumberToObject(o, "p99", q.p99);
    cJSON_AddNumberToObject(o, "max", q.max);
}

/* kv.bytes_moved: host<->device KV traffic, the sum of the cache's swap and offload byte
 * counters (whichever it reports). */
static void tsr__add_bytes_moved(cJSON *kv) {
    static const char *const parts[] = {"swap_out_bytes", "swap_in_bytes", "bytes_offloaded",
                                        "bytes_fetched"};
    double sum = 0.0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(kv, parts[i]);
        if (cJSON_IsNumber(x)) sum += x->valuedouble;
    }
    if (!cJSON_GetObjectItemCaseSensitive(kv, "bytes_moved"))
        cJSON_AddNumberToObject(kv, "bytes_moved", sum);
}

static double tsr__rate(double x, double t) { return t > 0 ? x / t : 0.0; }

tsr_status tsr_metrics_write(tsr_metrics *m, const char *path) {
    cJSON *d = cJSON_CreateObject();
    if (!d) return TSR_ERR_NOMEM;
    cJSON_AddNumberToObject(d, "schema_version", 1);
    cJSON *run = cJSON_AddObjectToObject(d, "run");
    if (run) {
        cJSON_AddStringToObject(run, "model", m->model ? m->model : "");
        cJSON_AddStringToObject(run, "input", m->input ? m->input : "");
        cJSON_AddStringToObject(run, "output", m->output ? m->output : "");
        cJSON_AddStringToObject(run, "backend", m->backend ? m->backend : "");
        cJSON_AddNumberToObject(run, "threads", m->threads);
        cJSON_AddNumberToObject(run, "max_batch_seqs", m->max_batch_seqs);
        cJSON_AddNumberToObject(run, "max_batch_tokens", m->max_batch_tokens);
        cJSON_AddNumberToObject(run, "max_context", m->max_context);
        cJSON_AddNumberToObject(run, "setup_s", m->setup_s);
        cJSON_AddNumberToObject(run, "wall_s", m->wall_s);
        cJSON_AddNumberToObject(run, "arrival_rate", m->arrival_rate);
    }
    cJSON *rq = cJSON_AddObjectToObject(d, "requests");
    if (rq) {
        cJSON_AddNumberToObject(rq, "lines", (double)m->lines);
        cJSON_AddNumberToObject(rq, "ok", (double)m->ok);
        cJSON_AddNumberToObject(rq, "failed", (double)m->failed);
        cJSON_AddNumberToObject(rq, "skipped", (double)m->skipped);
        cJSON_AddNumberToObject(rq, "finish_stop", (double)m->finish_stop);
        cJSON_AddNumberToObject(rq, "finish_length", (double)m->finish_length);
        cJSON_AddNumberToObject(rq, "finish_tool_calls", (double)m->finish_tool_calls);
    }
    cJSON *tk = cJSON_AddObjectToObject(d, "tokens");
    if (tk) {
        cJSON_AddNumberToObject(tk, "prompt", (double)m->prompt_tokens);
        cJSON_AddNumberToObject(tk, "completion", (double)m->completion_tokens);
        cJSON_AddNumberToObject(tk, "total", (double)(m->prompt_tokens + m->completion_tokens));
    }
    cJSON *tp = cJSON_AddObjectToObject(d, "throughput");
    if (tp) {
        cJSON_AddNumberToObject(tp, "requests_per_s", tsr__rate((double)m->ok, m->wall_s));
        cJSON_AddNumberToObject(tp, "input_tokens_per_s",
                                tsr__rate((double)m->prompt_tokens, m->wall_s));
        cJSON_AddNumberToObject(tp, "output_tokens_per_s",
                                tsr__rate((double)m->completion_tokens, m->wall_s));
        cJSON_AddNumberToObject(
            tp, "total_tokens_per_s",
            tsr__rate((double)(m->prompt_tokens + m->completion_tokens), m->wall_s));
    }
    cJSON *lat = cJSON_AddObjectToObject(d, "latency_s");
    if (lat) {
        tsr__add_summary(lat, "ttft", &m->ttft);
        tsr__add_summary(lat, "tpot", &m->tpot);
        tsr__add_summary(lat, "e2e", &m->e2e);
        tsr__add_summary(lat, "itl", &m->itl);
    }
    cJSON *sc = cJSON_AddObjectToObject(d, "scheduler");
    if (sc) {
        cJSON_AddNumberToObject(sc, "steps", (double)m->steps);
        cJSON_AddNumberToObject(sc, "batch_tokens_mean",
                                m->steps ? (double)m->batch_tokens / (double)m->steps : 0.0);
        cJSON_AddNumberToObject(sc, "prefill_tokens", (double)m->prefill_tokens);
        cJSON_AddNumberToObject(sc, "decode_tokens", (double)m->decode_tokens);
        cJSON_AddNumberToObject(sc, "preemptions", (double)m->preemptions);
        cJSON_AddNumberToObject(sc, "max_running", m->max_running);
        cJSON_AddStringToObject(sc, "preempt", m->preempt ? m->preempt : "recompute");
        cJSON_AddNumberToObject(sc, "swaps_out", (double)m->swaps_out);
        cJSON_AddNumberToObject(sc, "swaps_in", (double)m->swaps_in);
        cJSON_AddNumberToObject(sc, "swap_out_bytes", (double)m->swap_out_bytes);
        cJSON_AddNumberToObject(sc, "swap_in_bytes", (double)m->swap_in_bytes);
        cJSON_AddNumberToObject(sc, "swap_fallbacks", (double)m->swap_fallbacks);
    }
    cJSON *mem = cJSON_AddObjectToObject(d, "memory");
    if (mem) {
        cJSON_AddNumberToObject(mem, "peak_host_rss_bytes", (double)m->peak_host_rss_bytes);
        cJSON_AddNumberToObject(mem, "peak_device_bytes", (double)m->peak_device_bytes);
        cJSON *ranks = cJSON_AddArrayToObject(mem, "ranks");
        cJSON *r0 = cJSON_CreateObject();
        if (ranks && r0) {
            cJSON_AddNumberToObject(r0, "rank", m->rank);
            cJSON_AddNumberToObject(r0, "peak_host_rss_bytes", (double)m->peak_host_rss_bytes);
            cJSON_AddNumberToObject(r0, "peak_device_bytes", (double)m->peak_device_bytes);
            cJSON_AddItemToArray(ranks, r0);
        } else {
            cJSON_Delete(r0);
        }
    }
    /* The cache's own stats line (runtime/exec/kv_setup.h), so metrics and --stats agree. */
    cJSON *kv = m->kv_json ? cJSON_Parse(m->kv_json) : cJSON_CreateObject();
    if (kv) {
        tsr__add_bytes_moved(kv);
        cJSON_AddItemToObject(d, "kv", kv);
        /* KV bytes per token by layer type (full vs sliding-window layers) */
        cJSON *km = m->kv_memory_json ? cJSON_Parse(m->kv_memory_json) : NULL;
        if (km) cJSON_AddItemToObject(kv, "memory", km);
    }
    char *js = cJSON_Print(d);
    cJSON_Delete(d);
    if (!js) return tsr_error_set(TSR_ERR_NOMEM, "%s: cannot format the metrics", path);

    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tsr_status st = TSR_OK;
    FILE *f = n > 0 && (size_t)n < sizeof tmp ? fopen(tmp, "wb") : NULL;
    if (!f) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(js);
        if (fwrite(js, 1, len, f) != len || fputc('\n', f) == EOF || fflush(f) != 0 ||
            fsync(fileno(f)) != 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
        fclose(f);
        if (st == TSR_OK && rename(tmp, path) != 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename into place: %s", path,
                               strerror(errno));
        if (st != TSR_OK) remove(tmp);
    }
    cJSON_free(js);
    return st;
}
