/* `tessera characterize --study STUDY.json --out DIR`: the KV-policy characterization
 * study of issue 18 (docs/characterize.md). The study file is expanded into cells (model x
 * layout x policy x budget x prompt length x batch x request rate, and fidelity cells of
 * model x policy x budget); each cell runs `tessera run` (or `tessera fidelity`) as its own
 * process under the study's memory and time limits (jobs/study/cell_runner.h), and its record
 * is written to DIR/cells/ID.json atomically when it ends, so a rerun with the same --out
 * skips finished cells and reruns a cell that was cut off. Then the outputs are written
 * from all records (jobs/study/char_report.h). --list-cells and --cell ID split the study into
 * steps for a scheduler (slurm/characterize.sh). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/sys.h"
#include "jobs/study/cell_runner.h"
#include "jobs/study/char_report.h"
#include "jobs/cli.h"
#include "jobs/commands.h"
#include "jobs/signals.h"
#include "jobs/study/study.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr__char_opts {
    const char *study, *out, *cell;
    bool list, quiet;
} tsr__char_opts;

typedef struct tsr__char {
    const tsr__char_opts *o;
    tsr_study st;
    tsr_cell *cells;
    size_t n_cells;
    char self[4096];
    bool has_fidelity, has_arrival, has_needle;
    /* progress */
    size_t total, done, ran;
    double t0, ran_s;
    const tsr_cell *cur;
} tsr__char;

static const char tsr__char_about[] =
    "Runs a characterization study of the KV-cache policies: every cell of the study's\n"
    "matrix (model x layout x policy x KV budget x prompt length x batch size x request\n"
    "rate) as its own `tessera run` process under the study's memory limit (RLIMIT_AS)\n"
    "and time limit (SIGTERM, then SIGKILL), plus a `tessera fidelity` cell per model x\n"
    "policy x budget when the study has \"fidelity\". A cell that runs out of memory, runs\n"
    "out of time or crashes is recorded as such (oom / timeout / crash / error, with the\n"
    "reason) and the study goes on. Each cell's record is written to DIR/cells/ID.json\n"
    "when the cell ends; rerunning with the same --out skips finished cells. Then DIR gets\n"
    "cells.csv, summary.json, report.md (the paper's findings next to the measured ones)\n"
    "and PNG plots (gnuplot). Progress (cells done / total, the current cell, ETA) goes\n"
    "to stderr. Exit 0 when the study ran (failed cells included), 1 on fatal errors,\n"
    "2 for usage errors and malformed studies, 3 when SIGTERM/SIGINT/SIGUSR1 stopped it\n"
    "(rerun to resume).\n"
    "\n"
    "Study file (JSON; every key but models, policies and prompt_lengths is optional):\n"
    "  {\n"
    "    \"name\": \"cpu-small\",\n"
    "    \"models\": [\"models/stories260K.bin\",\n"
    "               {\"label\": \"tiny\", \"path\": \"synthetic:tiny,ctx=131072,layers=1\",\n"
    "                \"tokenizer\": \"models/tok512.bin\", \"context\": 131072, \"heads\": 8}],\n"
    "    \"policies\": [\"paged\", \"h2o\", \"offload\", \"h2o-materialize\",\n"
    "                 {\"label\": \"h2o-r25\", \"policy\": \"h2o\", \"args\": [\"--h2o-recent\", \"0.25\"],\n"
    "                  \"whole_prefill\": false}],\n"
    "    \"prompt_lengths\": [256, 1024, 4096],\n"
    "    \"batch_sizes\": [1, 4],\n"
    "    \"request_rates\": [\"offline\", 2, 8],\n"
    "    \"rate_sweep\": {\"prompt_length\": 256, \"batch\": 8},\n"
    "    \"kv_budgets\": [0.1, 0.2, 0.5],\n"
    "    \"layouts\": [\"tp1\", \"tp2\", \"pp2\", {\"tp\": 2, \"pp\": 2}],\n"
    "    \"gen_tokens\": 16,\n"
    "    \"threads\": 2,\n"
    "    \"kv_memory\": \"256M\",\n"
    "    \"limits\": {\"memory\": \"1G\", \"time_s\": 120},\n"
    "    \"launcher\": \"mpirun -np {ranks}\",\n"
    "    \"fidelity\": {\"text\": \"bench/data/heldout.txt\", \"probe_length\": 256,\n"
    "                 \"max_tokens\": 400},\n"
    "    \"needle\": {\"haystack\": \"bench/data/gpl-3.txt\", \"lengths\": [1024],\n"
    "               \"needles\": [1, 3]}\n"
    "  }\n"
    "models: a path or synthetic:NAME, or an object (label, path, tokenizer; context and\n"
    "  heads spare loading the model to learn them). policies: any --kv-policy name;\n"
    "  NAME-materialize runs a policy that has a materialize mode in it, with the whole\n"
    "  prompt in one forward call (h2o-materialize: h2o with --h2o-scores materialize, the\n"
    "  original n x n baseline); an object gives a label, the policy,\n"
    "  extra `tessera run` options (args), whole_prefill and its own budgets. A policy\n"
    "  that reads no --kv-budget (paged) ignores kv_budgets (one\n"
    "  cell, the full cache). request_rates: \"offline\" (all requests at once) or Poisson\n"
    "  arrivals of R requests/s (needs `tessera run --arrival-rate`); with rate_sweep the\n"
    "  numeric rates run at that one point only. kv_budgets: a\n"
    "  fraction of the sequence (<= 1) or tokens (> 1); default 0.2. layouts with more\n"
    "  than one rank run under the launcher ({ranks} is replaced). limits.memory: address\n"
    "  space per cell (e.g. \"1G\"; 0 none), limits.time_s: seconds per cell (0 none).\n"
    "  A prompt longer than the model's context (less gen_tokens) is a skipped cell.\n"
    "\n"
    "Scheduler steps: --list-cells prints each cell's id and state (done, pending or\n"
    "skipped: reason); --cell ID runs that cell only (no outputs); a final run without\n"
    "--cell writes the outputs. See slurm/characterize.sh and docs/characterize.md.\n";

static tsr_status tsr__mkdir(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create the directory: %s", path,
                             strerror(errno));
    return TSR_OK;
}

static void tsr__path(char *buf, size_t cap, const char *a, const char *b, const char *c) {
    snprintf(buf, cap, "%s/%s%s%s", a, b, c ? "/" : "", c ? c : "");
}

/* A cell's record when it exists and is complete JSON; NULL otherwise. */
static cJSON *tsr__load_record(const char *out, const char *id) {
    char p[4096];
    snprintf(p, sizeof p, "%s/cells/%s.json", out, id);
    char *text = NULL;
    size_t len = 0;
    if (access(p, F_OK) != 0) return NULL;
    if (tsr_file_read(p, "cell record", 0, &text, &len) != TSR_OK) {
        tsr_error_clear();
        return NULL;
    }
    cJSON *r = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    if (r && !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "status"))) {
        cJSON_Delete(r);
        r = NULL;
    }
    return r;
}

/* tmp + fsync + rename: a record is either whole or absent. */
static tsr_status tsr__write_record(const char *out, const char *id, cJSON *rec) {
    char p[4096], tmp[4200];
    snprintf(p, sizeof p, "%s/cells/%s.json", out, id);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    char *js = cJSON_Print(rec);
    if (!js) return TSR_ERR_NOMEM;
    tsr_status st = TSR_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t l = strlen(js);
        if (fwrite(js, 1, l, f) != l || fputc('\n', f) == EOF || fflush(f) != 0 ||
            fsync(fileno(f)) != 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
        if (fclose(f) != 0 && st == TSR_OK)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
        if (st == TSR_OK && rename(tmp, p) != 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename into place: %s", p, strerror(errno));
        if (st != TSR_OK) remove(tmp);
    }
    cJSON_free(js);
    return st;
}

static cJSON *tsr__json_file(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return NULL;
    if (tsr_file_read(path, "metrics", 0, &text, &len) != TSR_OK) {
        tsr_error_clear();
        return NULL;
    }
    cJSON *r = cJSON_ParseWithLength(text, len);
    tsr_free(text);
    return r;
}

/* obj.a.b.c as a number; NAN when missing or not a number */
static double tsr__num(const cJSON *o, const char *a, const char *b, const char *c) {
    const char *keys[3] = {a, b, c};
    for (int i = 0; i < 3 && keys[i] && o; i++) o = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
    return o && cJSON_IsNumber(o) ? o->valuedouble : NAN;
}

static void tsr__set(cJSON *rec, const char *key, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(rec, key);
    if (isfinite(v)) cJSON_AddNumberToObject(rec, key, v);
    else cJSON_AddNullToObject(rec, key);
}

static void tsr__set_str(cJSON *rec, const char *key, const char *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(rec, key);
    cJSON_AddStringToObject(rec, key, v ? v : "");
}

/* The coordinates of a cell, every other column null. */
static cJSON *tsr__base_record(const tsr__char *c, const tsr_cell *cell) {
    const tsr_study *s = &c->st;
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    for (size_t i = 0; i < tsr_char_n_cols; i++) cJSON_AddNullToObject(r, tsr_char_cols[i].name);
    const tsr_study_model *m = &s->models[cell->model];
    const tsr_study_policy *p = &s->policies[cell->policy];
    const tsr_study_layout *l = &s->layouts[cell->layout];
    tsr__set_str(r, "id", cell->id);
    tsr__set_str(r, "kind", cell->kind == TSR_CELL_PERF       ? "perf"
                            : cell->kind == TSR_CELL_NEEDLE ? "needle"
                                                            : "fidelity");
    if (cell->kind == TSR_CELL_FIDELITY)
        tsr__set_str(r, "fid_scoring", s->fid_tail <= 0 ? (s->fid_document ? "document" : "text")
                                       : cell->decode_prefix ? "tail-decode" : "tail-prompt");
    if (cell->kind == TSR_CELL_NEEDLE) {
        tsr__set(r, "prompt_tokens", cell->prompt_len);
        tsr__set(r, "needles", cell->needles);
    }
    tsr__set_str(r, "model", m->label);
    tsr__set_str(r, "policy", p->label);
    tsr__set_str(r, "kv_policy", p->policy);
    tsr__set(r, "budget", cell->budget);
    tsr__set(r, "heads", m->heads);
    tsr__set(r, "mem_limit_bytes", s->mem_limit > 0 ? (double)s->mem_limit : NAN);
    tsr__set(r, "time_limit_s", s->time_limit > 0 ? s->time_limit : NAN);
    if (cell->kind == TSR_CELL_PERF) {
        tsr__set_str(r, "layout", l->label);
        tsr__set(r, "tp", l->tp);
        tsr__set(r, "pp", l->pp);
        tsr__set(r, "prompt_tokens", cell->prompt_len);
        tsr__set(r, "batch", cell->batch);
        char rs[32];
        tsr_study_rate_str(cell->rate, rs, sizeof rs);
        tsr__set_str(r, "request_rate", rs);
        tsr__set(r, "gen_tokens", s->gen_tokens);
        /* the original H2O's score matrix for this prompt: heads x n x n x 4 bytes */
        double n = cell->prompt_len;
        tsr__set(r, "nxn_bytes", (double)m->heads * n * n * 4.0);
    }
    return r;
}

static bool tsr__tick(void *ctx, double elapsed) {
    tsr__char *c = ctx;
    static double last_print = 0;
    if (!c->o->quiet && elapsed - last_print >= 30) {
        fprintf(stderr, "tessera characterize: [%zu/%zu] %s: running for %.0f s\n", c->done + 1,
                c->total, c->cur ? c->cur->id : "", elapsed);
        last_print = elapsed;
    }
    if (elapsed < last_print) last_print = 0;
    return tsr_signals_stop_requested(NULL);
}

static tsr_status tsr__tokenizer_path(const tsr__char *c, const tsr_study_model *m, char *buf,
                                      size_t cap) {
    if (m->tokenizer) {
        snprintf(buf, cap, "%s", m->tokenizer);
        return TSR_OK;
    }
    if (!strncmp(m->spec, "synthetic:", 10))
        return tsr_error_set(TSR_ERR_INVALID,
                             "%s: key 'models[%d].tokenizer': expected a tokenizer path for a "
                             "synthetic model (e.g. models/tok512.bin)", c->st.path,
                             (int)(m - c->st.models));
    return tsr_tokenizer_find(m->spec, m->vocab, buf, cap);
}

/* argv builder: strings copied into one pool */
typedef struct tsr__argv {
    char *v[96];
    int n;
    char pool[16384];
    size_t used;
} tsr__argv;

static void tsr__arg(tsr__argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tsr__arg(tsr__argv *a, const char *fmt, ...) {
    if (a->n >= 94 || a->used >= sizeof a->pool - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(a->pool + a->used, sizeof a->pool - a->used, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= sizeof a->pool - a->used) return;
    a->v[a->n++] = a->pool + a->used;
    a->v[a->n] = NULL;
    a->used += (size_t)w + 1;
}

/* The launcher's words ({ranks} replaced) for a multi-rank layout. */
static void tsr__launcher(tsr__argv *a, const char *launcher, int ranks) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", launcher);
    for (char *w = strtok(buf, " \t"); w; w = strtok(NULL, " \t")) {
        char *r = strstr(w, "{ranks}");
        if (r) tsr__arg(a, "%.*s%d%s", (int)(r - w), w, ranks, r + 7);
        else tsr__arg(a, "%s", w);
    }
}

/* The cell's policy, its budget and options, and the study's threads: the same words for
 * every command a cell runs (run, fidelity, needle). */
static void tsr__policy_args(tsr__argv *a, const tsr_study *s, const tsr_study_policy *p,
                             const tsr_cell *cell) {
    tsr__arg(a, "--kv-policy");
    tsr__arg(a, "%s", p->policy);
    if (p->budgeted && cell->budget > 0) {
        tsr__arg(a, "--kv-budget");
        tsr__arg(a, "%g", cell->budget);
    }
    for (int i = 0; i < p->n_args; i++) tsr__arg(a, "%s", p->args[i]);
    if (s->threads > 0) {
        tsr__arg(a, "--threads");
        tsr__arg(a, "%d", s->threads);
    }
}

static void tsr__clean_work(const char *dir) {
    static const char *const names[] = {"input.jsonl", "output.jsonl", "output.errors.jsonl",
                                        "metrics.json", "metrics.json.tmp", "stdout.txt",
                                        "stderr.txt", "fidelity.json", "fidelity.json.tmp"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
}

static void tsr__fill_metrics(cJSON *rec, const cJSON *m) {
    static const char *const lat[] = {"ttft", "tpot", "itl", "e2e"};
    static const char *const pct[] = {"p50", "p90", "p99"};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            char k[32];
            snprintf(k, sizeof k, "%s_%s_s", lat[i], pct[j]);
            double v = tsr__num(m, "latency_s", lat[i], pct[j]);
            /* a summary of no samples is all zeros: unknown, not zero */
            if (tsr__num(m, "latency_s", lat[i], "count") == 0) v = NAN;
            tsr__set(rec, k, v);
        }
    tsr__set(rec, "input_tok_s", tsr__num(m, "throughput", "input_tokens_per_s", NULL));
    tsr__set(rec, "output_tok_s", tsr__num(m, "throughput", "output_tokens_per_s", NULL));
    tsr__set(rec, "peak_host_bytes", tsr__num(m, "memory", "peak_host_rss_bytes", NULL));
    tsr__set(rec, "peak_device_bytes", tsr__num(m, "memory", "peak_device_bytes", NULL));
    tsr__set(rec, "kv_peak_bytes", tsr__num(m, "kv", "bytes_peak", NULL));
    double off = tsr__num(m, "kv", "bytes_offloaded", NULL), fet = tsr__num(m, "kv", "bytes_fetched", NULL);
    double so = tsr__num(m, "kv", "swap_out_bytes", NULL), si = tsr__num(m, "kv", "swap_in_bytes", NULL);
    double moved = 0;
    moved += isfinite(off) ? off : 0;
    moved += isfinite(fet) ? fet : 0;
    moved += isfinite(so) ? so : 0;
    moved += isfinite(si) ? si : 0;
    tsr__set(rec, "bytes_offloaded", off);
    tsr__set(rec, "bytes_fetched", fet);
    /* tessera run's own total when it reports one */
    double own = tsr__num(m, "kv", "bytes_moved", NULL);
    tsr__set(rec, "bytes_moved", isfinite(own) ? own : moved);
    tsr__set(rec, "evictions", tsr__num(m, "kv", "evictions", NULL));
    tsr__set(rec, "preemptions", tsr__num(m, "scheduler", "preemptions", NULL));
    tsr__set(rec, "score_matrix_bytes_peak", tsr__num(m, "kv", "score_matrix_bytes_peak", NULL));
    tsr__set(rec, "requests_ok", tsr__num(m, "requests", "ok", NULL));
    tsr__set(rec, "requests_failed", tsr__num(m, "requests", "failed", NULL));
    double ok = tsr__num(m, "requests", "ok", NULL), pt = tsr__num(m, "tokens", "prompt", NULL);
    tsr__set(rec, "prompt_tokens_actual", ok > 0 ? pt / ok : NAN);
    tsr__set(rec, "completion_tokens", tsr__num(m, "tokens", "completion", NULL));
}

/* Where the full cache's side came from (computed / reused / none). */
static void tsr__fill_reference(cJSON *rec, const cJSON *f) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(f, "reference");
    if (cJSON_IsString(r)) tsr__set_str(rec, "reference", r->valuestring);
}

static void tsr__fill_fidelity(cJSON *rec, const cJSON *f) {
    tsr__fill_reference(rec, f);
    static const char *const keys[] = {"tokens", "nll", "ppl", "nll_full", "ppl_full",
                                       "agreement", "kl", "probe_text_recall",
                                       "probe_attention_recall", "wall_s"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char k[64];
        snprintf(k, sizeof k, "fid_%s", keys[i]);
        tsr__set(rec, k, tsr__num(f, keys[i], NULL, NULL));
    }
}

/* A needle cell's figures: both caches' accuracy over the depths, the policy's where the
 * full cache passes, the mean attention recall of the needle, and a per-depth string
 * "depth:full/policy" (1 correct, 0 not) for the heat map. */
static void tsr__fill_needle(cJSON *rec, const cJSON *f) {
    tsr__fill_reference(rec, f);
    tsr__set(rec, "needle_full_accuracy", tsr__num(f, "full_accuracy", NULL, NULL));
    tsr__set(rec, "needle_accuracy", tsr__num(f, "accuracy", NULL, NULL));
    tsr__set(rec, "needle_accuracy_where_full_passes",
             tsr__num(f, "accuracy_where_full_passes", NULL, NULL));
    const cJSON *cells = cJSON_GetObjectItemCaseSensitive(f, "cells");
    double rsum = 0;
    int n = 0;
    char by[256];
    size_t bl = 0;
    by[0] = '\0';
    const cJSON *e;
    cJSON_ArrayForEach(e, cells) {
        const cJSON *fu = cJSON_GetObjectItemCaseSensitive(e, "full");
        const cJSON *po = cJSON_GetObjectItemCaseSensitive(e, "policy");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "depth");
        double rc = tsr__num(po, "attention_recall", NULL, NULL);
        if (isfinite(rc)) {
            rsum += rc;
            n++;
        }
        /* the policy's mark: 1, 0, or - where it did not run (the full cache failed) */
        if (bl + 24 < sizeof by && cJSON_IsNumber(d))
            bl += (size_t)snprintf(by + bl, sizeof by - bl, "%s%g:%d/%s", bl ? " " : "",
                                   d->valuedouble * 100,
                                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fu, "correct")),
                                   !cJSON_IsObject(po) ? "-"
                                   : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(po, "correct"))
                                       ? "1"
                                       : "0");
    }
    tsr__set(rec, "needle_attention_recall", n > 0 ? rsum / n : NAN);
    tsr__set_str(rec, "needle_by_depth", by);
    tsr__set(rec, "fid_wall_s", tsr__num(f, "wall_s", NULL, NULL));
}

/* Runs one cell to its record. Fails only when the cell cannot be started or recorded. */
static tsr_status tsr__run_cell(tsr__char *c, const tsr_cell *cell, cJSON **out_rec) {
    const tsr_study *s = &c->st;
    const tsr_study_model *m = &s->models[cell->model];
    const tsr_study_policy *p = &s->policies[cell->policy];
    const tsr_study_layout *l = &s->layouts[cell->layout];
    char work[4096], tok[4096], in[4200], outp[4200], met[4200], so[4200], se[4200];
    snprintf(work, sizeof work, "%s/work/%s", c->o->out, cell->id);
    TSR_TRY(tsr__mkdir(work));
    tsr__clean_work(work);
    snprintf(in, sizeof in, "%s/input.jsonl", work);
    snprintf(outp, sizeof outp, "%s/output.jsonl", work);
    snprintf(so, sizeof so, "%s/stdout.txt", work);
    snprintf(se, sizeof se, "%s/stderr.txt", work);
    TSR_TRY(tsr__tokenizer_path(c, m, tok, sizeof tok));
    cJSON *rec = tsr__base_record(c, cell);
    if (!rec) return TSR_ERR_NOMEM;
    tsr__argv *a = tsr_calloc(1, sizeof *a);
    if (!a) {
        cJSON_Delete(rec);
        return TSR_ERR_NOMEM;
    }
    tsr_status st = TSR_OK;
    if (cell->kind == TSR_CELL_PERF) {
        int actual = 0;
        st = tsr_cell_write_prompts(in, tok, NULL, cell->batch, cell->prompt_len,
                                    s->gen_tokens, &actual);
        if (st == TSR_OK) {
            int ranks = l->tp * l->pp;
            if (ranks > 1) tsr__launcher(a, s->launcher, ranks);
            snprintf(met, sizeof met, "%s/metrics.json", work);
            tsr__arg(a, "%s", c->self);
            tsr__arg(a, "run");
            tsr__arg(a, "--model");
            tsr__arg(a, "%s", m->spec);
            tsr__arg(a, "--tokenizer");
            tsr__arg(a, "%s", tok);
            tsr__arg(a, "--input");
            tsr__arg(a, "%s", in);
            tsr__arg(a, "--output");
            tsr__arg(a, "%s", outp);
            tsr__arg(a, "--metrics");
            tsr__arg(a, "%s", met);
            tsr__arg(a, "--quiet");
            tsr__arg(a, "--max-batch-seqs");
            tsr__arg(a, "%d", cell->batch);
            /* the original H2O prefills the prompt in one call (n_q = n); the tiled
             * policies in tessera run's default chunks */
            int chunk = p->whole_prefill ? cell->batch * (cell->prompt_len + 1) : 512;
            if (chunk < cell->batch) chunk = cell->batch;
            tsr__arg(a, "--max-batch-tokens");
            tsr__arg(a, "%d", chunk);
            /* the context the cell needs: the pool is sized from it, not the model's 128K */
            tsr__arg(a, "--max-context");
            tsr__arg(a, "%d", cell->prompt_len + s->gen_tokens + 8);
            tsr__policy_args(a, s, p, cell);
            if (s->kv_memory) {
                tsr__arg(a, "--kv-memory");
                tsr__arg(a, "%s", s->kv_memory);
            }
            if (cell->rate > 0) {
                tsr__arg(a, "--arrival-rate");
                tsr__arg(a, "%g", cell->rate);
            }
            if (l->tp > 1 || l->pp > 1) {
                tsr__arg(a, "--tp");
                tsr__arg(a, "%d", l->tp);
                tsr__arg(a, "--pp");
                tsr__arg(a, "%d", l->pp);
            }
        }
    } else if (cell->kind == TSR_CELL_NEEDLE) {
        snprintf(met, sizeof met, "%s/fidelity.json", work);
        tsr__arg(a, "%s", c->self);
        tsr__arg(a, "needle");
        tsr__arg(a, "--model");
        tsr__arg(a, "%s", m->spec);
        tsr__arg(a, "--haystack");
        tsr__arg(a, "%s", s->needle_haystack);
        tsr__arg(a, "--length");
        tsr__arg(a, "%d", cell->prompt_len);
        tsr__arg(a, "--needles");
        tsr__arg(a, "%d", cell->needles);
        if (s->needle_depths) {
            tsr__arg(a, "--depths");
            tsr__arg(a, "%s", s->needle_depths);
        }
        if (s->needle_skip_failed) tsr__arg(a, "--skip-where-full-fails");
    } else {
        snprintf(met, sizeof met, "%s/fidelity.json", work);
        tsr__arg(a, "%s", c->self);
        tsr__arg(a, "fidelity");
        tsr__arg(a, "--model");
        tsr__arg(a, "%s", m->spec);
        tsr__arg(a, "--tokenizer");
        tsr__arg(a, "%s", tok);
        tsr__arg(a, "--text");
        tsr__arg(a, "%s", s->fid_text);
        if (s->fid_probe_length > 0) {
            tsr__arg(a, "--probe-length");
            tsr__arg(a, "%d", s->fid_probe_length);
        }
        if (s->fid_max_tokens > 0) {
            tsr__arg(a, "--max-tokens");
            tsr__arg(a, "%d", s->fid_max_tokens);
        }
        if (s->fid_document) tsr__arg(a, "--document");
        if (s->fid_doc_tokens > 0) {
            tsr__arg(a, "--doc-tokens");
            tsr__arg(a, "%d", s->fid_doc_tokens);
        }
        if (s->fid_tail > 0) {
            tsr__arg(a, "--tail");
            tsr__arg(a, "%d", s->fid_tail);
            if (cell->decode_prefix) tsr__arg(a, "--decode-prefix");
        }
    }
    if (cell->kind != TSR_CELL_PERF) { /* needle and fidelity: a JSON of their own */
        /* the full cache's side once per model and input, shared by the policies' cells */
        tsr__arg(a, "--reference-dir");
        tsr__arg(a, "%s/refs", c->o->out);
        tsr__policy_args(a, s, p, cell);
        tsr__arg(a, "--quiet");
        tsr__arg(a, "--json");
        tsr__arg(a, "%s", met);
    }
    if (st != TSR_OK) {
        /* the prompts could not be built (tokenizer): the cell's own error */
        tsr__set_str(rec, "status", "error");
        tsr__set_str(rec, "reason", tsr_last_error());
        tsr_free(a);
        *out_rec = rec;
        return TSR_OK;
    }
    /* the command line, for reproducing a cell by hand */
    {
        FILE *f = fopen(so, "w");
        if (f) {
            for (int i = 0; i < a->n; i++) fprintf(f, "%s%s", i ? " " : "# ", a->v[i]);
            fputc('\n', f);
            fclose(f);
        }
    }
    tsr_cell_proc pr;
    st = tsr_cell_spawn(a->v, so, se, s->mem_limit, s->time_limit, tsr__tick, c, &pr);
    tsr_free(a);
    if (st != TSR_OK) {
        cJSON_Delete(rec);
        return st;
    }
    if (pr.stopped) { /* the driver is stopping: no record, the cell reruns */
        cJSON_Delete(rec);
        *out_rec = NULL;
        return TSR_OK;
    }
    char reason[1024];
    int64_t reached = -1;
    const char *status = tsr_cell_classify(&pr, s->time_limit, reason, sizeof reason, &reached);
    /* "cannot allocate the B-byte score matrix": heads x n x n x 4 = B gives n, with the
     * heads of one rank (tensor parallelism splits them) */
    const char *why = pr.own_line[0] ? pr.own_line : pr.last_line;
    const char *sm = strstr(why, "cannot allocate the ");
    double mb = 0;
    int rank_heads = m->heads / (l->tp > 0 ? l->tp : 1);
    if (reached < 0 && sm && sscanf(sm, "cannot allocate the %lf-byte score matrix", &mb) == 1 &&
        rank_heads > 0 && mb > 0)
        reached = (int64_t)llround(sqrt(mb / (4.0 * rank_heads)));
    cJSON *mj = tsr__json_file(met);
    if (!strcmp(status, "ok") && !mj) {
        status = "error";
        snprintf(reason, sizeof reason, "exited 0 but wrote no %s",
                 cell->kind == TSR_CELL_PERF ? "metrics" : "fidelity JSON");
    }
    if (mj && cell->kind == TSR_CELL_PERF) {
        tsr__fill_metrics(rec, mj);
        double failed = tsr__num(mj, "requests", "failed", NULL);
        if (!strcmp(status, "ok") && failed > 0) {
            status = "error";
            char line[512];
            /* the first error record says why */
            char ep[4200];
            snprintf(ep, sizeof ep, "%s/output.errors.jsonl", work);
            FILE *f = fopen(ep, "r");
            line[0] = '\0';
            if (f) {
                if (!fgets(line, sizeof line, f)) line[0] = '\0';
                fclose(f);
            }
            line[strcspn(line, "\n")] = '\0';
            snprintf(reason, sizeof reason, "%.0f of %d requests failed: %.400s", failed,
                     cell->batch, line);
        }
    } else if (mj && cell->kind == TSR_CELL_NEEDLE) {
        tsr__fill_needle(rec, mj);
    } else if (mj) {
        tsr__fill_fidelity(rec, mj);
    }
    cJSON_Delete(mj);
    /* a cell that failed still shows how far its memory went */
    if (cell->kind == TSR_CELL_PERF && !isfinite(tsr__num(rec, "peak_host_bytes", NULL, NULL)) &&
        pr.maxrss_bytes > 0)
        tsr__set(rec, "peak_host_bytes", (double)pr.maxrss_bytes);
    tsr__set_str(rec, "status", status);
    tsr__set_str(rec, "reason", reason);
    tsr__set(rec, "reached_tokens", reached >= 0 ? (double)reached : NAN);
    tsr__set(rec, "wall_s", pr.wall_s);
    tsr__set(rec, "exit_code", pr.exit_code >= 0 ? pr.exit_code : NAN);
    tsr__set(rec, "signal", pr.signal ? pr.signal : NAN);
    *out_rec = rec;
    return TSR_OK;
}

/* Whether `SELF ARGS...` exits 0 and (needle) prints needle on stdout. */
static bool tsr__probe(const tsr__char *c, const char *cmd, const char *needle) {
    char so[4200], se[4200];
    snprintf(so, sizeof so, "%s/work/probe.out", c->o->out);
    snprintf(se, sizeof se, "%s/work/probe.err", c->o->out);
    unlink(so);
    unlink(se);
    char *argv[] = {(char *)c->self, (char *)cmd, (char *)"--help", NULL};
    tsr_cell_proc pr;
    if (tsr_cell_spawn(argv, so, se, 0, 30, NULL, NULL, &pr) != TSR_OK) {
        tsr_error_clear();
        return false;
    }
    bool ok = pr.exit_code == 0;
    if (ok && needle) {
        char *text = NULL;
        size_t len = 0;
        ok = tsr_file_read(so, "help", 0, &text, &len) == TSR_OK && strstr(text, needle);
        tsr_error_clear();
        tsr_free(text);
    }
    unlink(so);
    unlink(se);
    return ok;
}

/* Why a cell will not run in this build (NULL: it will). */
static const char *tsr__cannot_run(const tsr__char *c, const tsr_cell *cell) {
    if (cell->skip) return cell->skip;
    if (cell->kind == TSR_CELL_FIDELITY && !c->has_fidelity)
        return "this tessera has no `fidelity` command";
    if (cell->kind == TSR_CELL_NEEDLE && !c->has_needle)
        return "this tessera has no `needle` command";
    if (cell->kind == TSR_CELL_PERF && cell->rate > 0 && !c->has_arrival)
        return "this tessera's `run` has no --arrival-rate";
    return NULL;
}

static void tsr__fmt_dur(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 90) snprintf(buf, cap, "%.0fs", s);
    else if (s < 5400) snprintf(buf, cap, "%.0fm%02.0fs", floor(s / 60), fmod(s, 60));
    else snprintf(buf, cap, "%.0fh%02.0fm", floor(s / 3600), fmod(floor(s / 60), 60));
}

static int tsr__main(tsr__char *c) {
    const tsr__char_opts *o = c->o;
    tsr_status st = tsr_study_load(o->study, &c->st);
    if (st == TSR_ERR_INVALID || st == TSR_ERR_FORMAT || st == TSR_ERR_IO) {
        fprintf(stderr, "tessera characterize: %s\n", tsr_last_error());
        return 2;
    }
    if (st != TSR_OK) return tsr_cmd_fail("characterize");
    st = tsr_study_resolve_models(&c->st);
    if (st != TSR_OK) {
        fprintf(stderr, "tessera characterize: %s\n", tsr_last_error());
        return 2;
    }
    for (int i = 0; i < c->st.n_models; i++) {
        /* tok is not written when no path is found (the error says why) */
        char tok[4096] = "";
        if (tsr__tokenizer_path(c, &c->st.models[i], tok, sizeof tok) != TSR_OK) {
            fprintf(stderr, "tessera characterize: %s\n", tsr_last_error());
            return 2;
        }
        if (access(tok, R_OK) != 0) {
            fprintf(stderr, "tessera characterize: %s: key 'models[%d]': tokenizer %s is not "
                            "readable (%s)\n", c->st.path, i, tok, strerror(errno));
            return 2;
        }
    }
    if (c->st.fid_text && access(c->st.fid_text, R_OK) != 0) {
        fprintf(stderr, "tessera characterize: %s: key 'fidelity.text': expected a readable "
                        "file (%s: %s)\n", c->st.path, c->st.fid_text, strerror(errno));
        return 2;
    }
    if (c->st.needle_haystack && access(c->st.needle_haystack, R_OK) != 0) {
        fprintf(stderr, "tessera characterize: %s: key 'needle.haystack': expected a readable "
                        "file (%s: %s)\n", c->st.path, c->st.needle_haystack, strerror(errno));
        return 2;
    }
    if (tsr_study_cells(&c->st, &c->cells, &c->n_cells) != TSR_OK)
        return tsr_cmd_fail("characterize");
    const tsr_cell *only = NULL;
    if (o->cell) {
        for (size_t i = 0; i < c->n_cells; i++)
            if (!strcmp(c->cells[i].id, o->cell)) only = &c->cells[i];
        if (!only) {
            fprintf(stderr, "tessera characterize: no cell '%s' in %s (see --list-cells)\n",
                    o->cell, o->study);
            return 2;
        }
    }
    char p[4200];
    if (tsr__mkdir(o->out) != TSR_OK) return tsr_cmd_fail("characterize");
    tsr__path(p, sizeof p, o->out, "cells", NULL);
    if (tsr__mkdir(p) != TSR_OK) return tsr_cmd_fail("characterize");
    tsr__path(p, sizeof p, o->out, "work", NULL);
    if (tsr__mkdir(p) != TSR_OK) return tsr_cmd_fail("characterize");
    if (tsr_cell_self_exe(c->self, sizeof c->self) != TSR_OK) return tsr_cmd_fail("characterize");
    c->has_fidelity = c->st.fid_text && tsr__probe(c, "fidelity", NULL);
    c->has_arrival = tsr__probe(c, "run", "--arrival-rate");
    c->has_needle = c->st.needle_haystack && tsr__probe(c, "needle", NULL);

    cJSON **recs = tsr_calloc(c->n_cells ? c->n_cells : 1, sizeof *recs);
    if (!recs) return tsr_cmd_fail("characterize");
    /* what is done already and what will run */
    for (size_t i = 0; i < c->n_cells; i++) {
        recs[i] = tsr__load_record(o->out, c->cells[i].id);
        const char *why = tsr__cannot_run(c, &c->cells[i]);
        if (o->list) {
            printf("%s\t%s%s%s\n", c->cells[i].id,
                   recs[i] ? "done" : why ? "skipped: " : "pending",
                   recs[i] || !why ? "" : why, "");
            continue;
        }
        if (recs[i]) c->done++;
        else if (!why && (!only || only == &c->cells[i])) c->total++;
    }
    int rc = 0;
    if (o->list) goto out;
    if (tsr_signals_install() != TSR_OK) {
        rc = tsr_cmd_fail("characterize");
        goto out;
    }
    size_t all = c->total + c->done;
    if (!o->quiet)
        fprintf(stderr, "tessera characterize: %s: %zu cells, %zu done, %zu to run%s\n",
                c->st.name, c->n_cells, c->done, c->total,
                c->has_fidelity || !c->st.fid_text ? "" : " (no `tessera fidelity`: its cells are skipped)");
    c->t0 = tsr_sys_now();
    size_t k = 0;
    for (size_t i = 0; i < c->n_cells; i++) {
        const tsr_cell *cell = &c->cells[i];
        if (recs[i] || tsr__cannot_run(c, cell) || (only && only != cell)) continue;
        if (tsr_signals_stop_requested(NULL)) break;
        c->cur = cell;
        k++;
        if (!o->quiet) {
            char eta[32];
            tsr__fmt_dur(c->ran ? c->ran_s / (double)c->ran * (double)(c->total - k + 1) : NAN,
                         eta, sizeof eta);
            fprintf(stderr, "tessera characterize: [%zu/%zu] %s (ETA %s)\n",
                    c->done + 1, all, cell->id, eta);
        }
        cJSON *rec = NULL;
        double t = tsr_sys_now();
        st = tsr__run_cell(c, cell, &rec);
        if (st != TSR_OK) {
            rc = tsr_cmd_fail("characterize");
            goto out;
        }
        if (!rec) break; /* stopped */
        if (tsr__write_record(o->out, cell->id, rec) != TSR_OK) {
            cJSON_Delete(rec);
            rc = tsr_cmd_fail("characterize");
            goto out;
        }
        recs[i] = rec;
        c->ran++;
        c->done++;
        c->ran_s += tsr_sys_now() - t;
        if (!o->quiet) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(rec, "status");
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(rec, "reason");
            fprintf(stderr, "tessera characterize: [%zu/%zu] %s: %s in %.1f s%s%.200s\n", c->done,
                    all, cell->id, s->valuestring, tsr_sys_now() - t,
                    r && cJSON_IsString(r) && r->valuestring[0] ? ": " : "",
                    r && cJSON_IsString(r) ? r->valuestring : "");
        }
    }
    int sig = 0;
    if (tsr_signals_stop_requested(&sig)) {
        fprintf(stderr, "tessera characterize: stopped by %s with cells left; rerun the same "
                        "command to resume\n", tsr_signals_name(sig));
        rc = TSR_EXIT_STOPPED;
        goto out;
    }
    if (only) goto out;
    /* skipped cells get a row too */
    for (size_t i = 0; i < c->n_cells; i++) {
        if (recs[i]) continue;
        recs[i] = tsr__base_record(c, &c->cells[i]);
        if (!recs[i]) {
            rc = tsr_cmd_fail("characterize");
            goto out;
        }
        tsr__set_str(recs[i], "status", "skipped");
        tsr__set_str(recs[i], "reason", tsr__cannot_run(c, &c->cells[i]));
    }
    if (tsr_char_report(&c->st, recs, c->n_cells, o->out, tsr_sys_now() - c->t0, c->self) !=
        TSR_OK) {
        rc = tsr_cmd_fail("characterize");
        goto out;
    }
    if (!o->quiet)
        fprintf(stderr, "tessera characterize: wrote %s/cells.csv, summary.json, report.md\n",
                o->out);
out:
    for (size_t i = 0; i < c->n_cells; i++) cJSON_Delete(recs[i]);
    tsr_free(recs);
    return rc;
}

int tsr_cmd_characterize(int argc, char **argv) {
    tsr__char_opts o = {0};
    tsr_cli_opt opts[] = {
        {"study", TSR_OPT_STRING, &o.study, "STUDY.json", "the study (format above) (required)",
         false},
        {"out", TSR_OPT_STRING, &o.out, "DIR",
         "results: cells/ (one record per finished cell), work/, cells.csv, summary.json, "
         "report.md, *.png; an existing DIR resumes (required)", false},
        {"list-cells", TSR_OPT_FLAG, &o.list, NULL,
         "print each cell's id and state (done / pending / skipped: why) and exit", false},
        {"cell", TSR_OPT_STRING, &o.cell, "ID",
         "run this cell only (unless done) and write its record, no outputs (a scheduler "
         "step)", false},
        {"quiet", TSR_OPT_FLAG, &o.quiet, NULL, "no progress on stderr", false},
    };
    tsr_cli cli = {"characterize", "--study STUDY.json --out DIR [options]", tsr__char_about,
                   opts, (int)(sizeof opts / sizeof opts[0])};
    tsr_cli_result r = tsr_cli_parse(&cli, argc, argv);
    if (r == TSR_CLI_HELP) return 0;
    if (r != TSR_CLI_OK) return 2;
    if (!o.study) return tsr_cli_usage_error(&cli, "--study is required");
    if (!o.out) return tsr_cli_usage_error(&cli, "--out is required");
    tsr__char c = {.o = &o};
    int rc = tsr__main(&c);
    tsr_free(c.cells);
    tsr_study_free(&c.st);
    return rc;
}
