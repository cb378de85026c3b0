#include "jobs/study/char_report.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "jobs/study/cell_runner.h"
#include "policies/policy.h"

const tsr_char_col tsr_char_cols[] = {
    {"id", "", "the cell's id (DIR/cells/ID.json, DIR/work/ID/)"},
    {"kind", "", "perf (tessera run), fidelity (tessera fidelity) or needle (tessera needle)"},
    {"model", "", "the model's label"},
    {"layout", "", "tpN, ppN or tpNppM (perf cells)"},
    {"tp", "", "tensor-parallel ranks"},
    {"pp", "", "pipeline stages"},
    {"policy", "", "the policy's label (NAME-materialize: the n x n baseline)"},
    {"kv_policy", "", "--kv-policy"},
    {"budget", "", "--kv-budget: fraction of the sequence (<= 1) or tokens; 0 = full cache"},
    {"prompt_tokens", "tokens", "prompt length asked for (BOS included)"},
    {"prompt_tokens_actual", "tokens", "mean prompt tokens tessera run counted"},
    {"batch", "", "requests in the cell (--max-batch-seqs)"},
    {"request_rate", "req/s", "offline (all at once) or the Poisson arrival rate"},
    {"gen_tokens", "tokens", "max_tokens per request"},
    {"status", "", "ok, oom, timeout, crash, error or skipped"},
    {"reason", "", "why it is not ok (tessera's line from the cell's stderr, the limit, the signal)"},
    {"reached_tokens", "tokens", "keys the sequence had when it ran out of memory, when known"},
    {"wall_s", "s", "the cell process's wall time"},
    {"exit_code", "", "exit status of the cell process"},
    {"signal", "", "the signal that ended it"},
    {"ttft_p50_s", "s", "time to first token, median"},
    {"ttft_p90_s", "s", "time to first token, 90th percentile"},
    {"ttft_p99_s", "s", "time to first token, 99th percentile"},
    {"tpot_p50_s", "s", "time per output token after the first (per request), median"},
    {"tpot_p90_s", "s", "time per output token, 90th percentile"},
    {"tpot_p99_s", "s", "time per output token, 99th percentile"},
    {"itl_p50_s", "s", "inter-token latency (each gap between tokens), median"},
    {"itl_p90_s", "s", "inter-token latency, 90th percentile"},
    {"itl_p99_s", "s", "inter-token latency, 99th percentile"},
    {"e2e_p50_s", "s", "end-to-end request latency, median"},
    {"e2e_p90_s", "s", "end-to-end request latency, 90th percentile"},
    {"e2e_p99_s", "s", "end-to-end request latency, 99th percentile"},
    {"input_tok_s", "tokens/s", "prompt tokens per second of the job's wall time"},
    {"output_tok_s", "tokens/s", "generated tokens per second of the job's wall time"},
    {"completion_tokens", "tokens", "generated tokens in all"},
    {"requests_ok", "", "requests that completed"},
    {"requests_failed", "", "requests that got an error record"},
    {"peak_host_bytes", "bytes", "peak resident host memory (rank 0; of the process for failed cells)"},
    {"peak_device_bytes", "bytes", "peak device memory (0 on the CPU)"},
    {"kv_peak_bytes", "bytes", "peak bytes of the KV block pool in use"},
    {"bytes_moved", "bytes", "host<->device KV traffic: offloaded + fetched + swapped out + in"},
    {"bytes_offloaded", "bytes", "KV bytes written to a host tier"},
    {"bytes_fetched", "bytes", "KV bytes fetched back from a host tier"},
    {"evictions", "", "tokens that left the resident set"},
    {"preemptions", "", "sequences the scheduler preempted"},
    {"score_matrix_bytes_peak", "bytes", "largest n x n score matrix built (materialize)"},
    {"heads", "", "query heads of the model (all ranks)"},
    {"nxn_bytes", "bytes", "heads x n x n x 4: the original H2O's score matrix at this prompt"},
    {"mem_limit_bytes", "bytes", "the cell's address-space limit (RLIMIT_AS)"},
    {"time_limit_s", "s", "the cell's wall-time limit"},
    {"fid_tokens", "tokens", "fidelity: tokens scored"},
    {"fid_nll", "nats", "fidelity: mean negative log-likelihood of the text under the policy"},
    {"fid_ppl", "", "fidelity: perplexity under the policy"},
    {"fid_nll_full", "nats", "fidelity: NLL with the full cache"},
    {"fid_ppl_full", "", "fidelity: perplexity with the full cache"},
    {"fid_agreement", "", "fidelity: top-1 agreement with the full cache's greedy tokens (0..1)"},
    {"fid_kl", "nats", "fidelity: mean KL(full || policy) of the next-token distributions"},
    {"fid_probe_text_recall", "", "fidelity: the early key recalled in the generated text (0..1)"},
    {"fid_probe_attention_recall", "", "fidelity: the key's tokens kept resident (0..1)"},
    {"fid_wall_s", "s", "fidelity: wall time"},
    {"fid_scoring", "", "fidelity: text, document, tail-prompt (prefix prefilled) or tail-decode"},
    {"needles", "", "needle: keys planted (1, or 3 asked for one)"},
    {"needle_full_accuracy", "", "needle: exact-match share over the depths, full cache"},
    {"needle_accuracy", "", "needle: exact-match share over the depths, the policy"},
    {"needle_accuracy_where_full_passes", "", "needle: the policy's share where the full cache passes"},
    {"needle_attention_recall", "", "needle: the needle's tokens kept resident (0..1), mean over depths"},
    {"needle_by_depth", "", "needle: depth%:full/policy correct (1/0; - not run) per depth"},
    {"reference", "", "fidelity, needle: the full cache's side computed in this cell, reused "
                      "from DIR/refs, or none"},
};
const size_t tsr_char_n_cols = sizeof tsr_char_cols / sizeof tsr_char_cols[0];

typedef const cJSON *rec_t;

static double tsr__n(rec_t r, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, k);
    return v && cJSON_IsNumber(v) ? v->valuedouble : NAN;
}
static const char *tsr__s(rec_t r, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, k);
    return v && cJSON_IsString(v) ? v->valuestring : "";
}
static bool tsr__is(rec_t r, const char *k, const char *v) { return !strcmp(tsr__s(r, k), v); }
static bool tsr__ok(rec_t r) { return tsr__is(r, "status", "ok"); }
static bool tsr__perf(rec_t r) { return tsr__is(r, "kind", "perf"); }
static bool tsr__materialize(const tsr_study *s, rec_t r) {
    for (int i = 0; i < s->n_policies; i++)
        if (tsr__is(r, "policy", s->policies[i].label)) return s->policies[i].materialize;
    return false;
}
static double tsr__mib(double b) { return b / 1048576.0; }
/* the budget a policy's plotted series uses: its first (0 for the full cache) */
/* The first budget of a policy's perf cells (memory/throughput), as study.c builds them:
 * "perf_budgets" when the study has them, else the policy's own, else kv_budgets. */
static double tsr__bud0(const tsr_study *s, const tsr_study_policy *p) {
    return !p->budgeted       ? 0
           : s->perf_budgets  ? s->perf_budgets[0]
           : p->budgets       ? p->budgets[0]
                              : s->budgets[0];
}

/* Text accuracy of random weights means nothing: the findings' accuracy side uses the
 * real models' fidelity and needle cells only (the synthetic ones stay in the CSV and the
 * plots). */

/* Same coordinates but policy and budget. */
static bool tsr__same_point(rec_t a, rec_t b) {
    return tsr__is(a, "model", tsr__s(b, "model")) && tsr__is(a, "layout", tsr__s(b, "layout")) &&
           tsr__n(a, "prompt_tokens") == tsr__n(b, "prompt_tokens") &&
           tsr__n(a, "batch") == tsr__n(b, "batch") &&
           tsr__is(a, "request_rate", tsr__s(b, "request_rate"));
}

/* The paper's systems are roles that a policy's declaration gives it, never names: the
 * full cache (vLLM) reads no budget; a host tier (InfiniGen) reports the bytes it fetches
 * back; eviction by the attention kernel's key scores (H2O) wants those scores. A policy
 * registered later takes its role from what it declares. */
typedef enum tsr__role {
    TSR__ROLE_NONE = 0,
    TSR__ROLE_FULL,   /* keeps every token */
    TSR__ROLE_SCORES, /* evicts by accumulated key scores */
    TSR__ROLE_HOST,   /* keeps evicted KV in a host tier and fetches it back */
    TSR__N_ROLES
} tsr__role;

static const char *const tsr__role_paper[TSR__N_ROLES] = {"", "vLLM", "H2O", "InfiniGen"};
static const char *const tsr__role_what[TSR__N_ROLES] = {
    "", "the full cache", "eviction by the attention kernel's key scores",
    "a host tier with fetches back"};

static tsr__role tsr__role_of(const tsr_kv_policy_decl *ops) {
    if (!ops) return TSR__ROLE_NONE;
    if (!ops->uses_budget) return TSR__ROLE_FULL;
    for (int i = 0; i < ops->n_stats; i++)
        if (!strcmp(ops->stat_fields[i].name, "bytes_fetched")) return TSR__ROLE_HOST;
    if (ops->reads_scores) return TSR__ROLE_SCORES;
    return TSR__ROLE_NONE;
}

/* The role of a record's policy (a materialize baseline is only that: NONE here). */
static tsr__role tsr__role_rec(const tsr_study *s, rec_t r) {
    if (tsr__materialize(s, r)) return TSR__ROLE_NONE;
    return tsr__role_of(tsr_kv_policy_find(tsr__s(r, "kv_policy")));
}

/* The registered policies in a role, "a/b" ("none registered" when none). */
static const char *tsr__role_names(tsr__role role, char *buf, size_t cap) {
    size_t l = 0;
    buf[0] = '\0';
    for (int i = 0; i < tsr_kv_policy_count() && l + 1 < cap; i++) {
        const tsr_kv_policy_decl *ops = tsr_kv_policy_at(i);
        if (tsr__role_of(ops) != role) continue;
        int w = snprintf(buf + l, cap - l, "%s%s", l ? "/" : "", ops->name);
        if (w < 0) break;
        l += (size_t)w;
    }
    if (!buf[0]) snprintf(buf, cap, "none registered");
    return buf;
}

static void tsr__csv_str(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

static tsr_status tsr__write_csv(cJSON *const *recs, size_t n, const char *path) {
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    for (size_t c = 0; c < tsr_char_n_cols; c++)
        fprintf(f, "%s%s", c ? "," : "", tsr_char_cols[c].name);
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        for (size_t c = 0; c < tsr_char_n_cols; c++) {
            if (c) fputc(',', f);
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(recs[i], tsr_char_cols[c].name);
            if (v && cJSON_IsString(v)) tsr__csv_str(f, v->valuestring);
            else if (v && cJSON_IsNumber(v)) {
                double x = v->valuedouble;
                if (x == floor(x) && fabs(x) < 1e15) fprintf(f, "%.0f", x);
                else fprintf(f, "%.6g", x);
            }
        }
        fputc('\n', f);
    }
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", path, strerror(errno));
    }
    return TSR_OK;
}

/* ---- findings ---- */

#define TSR__MAX_DEPTHS 16
static int tsr__by_depth(rec_t r, double *depth, int *full, int *pol);

/* A policy's needle figures at a budget, pooled over the lengths, needle counts and the
 * depths up to max_depth (percent): keys found where the full cache found them, of those. */
static void tsr__needle_pool(cJSON *const *r, size_t n, const char *model, const char *policy,
                             double budget, double max_depth, int *found, int *full_ok) {
    *found = *full_ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tsr__is(r[i], "kind", "needle") || !tsr__ok(r[i]) || !tsr__is(r[i], "model", model) ||
            !tsr__is(r[i], "policy", policy) || tsr__n(r[i], "budget") != budget)
            continue;
        double d[TSR__MAX_DEPTHS];
        int fu[TSR__MAX_DEPTHS], po[TSR__MAX_DEPTHS];
        int k = tsr__by_depth(r[i], d, fu, po);
        for (int j = 0; j < k; j++) {
            if (d[j] > max_depth || fu[j] != 1) continue;
            (*full_ok)++;
            *found += po[j] == 1;
        }
    }
}

/* The fidelity record of a model x policy label x budget (NULL: none completed). */
static rec_t tsr__fid_label(cJSON *const *r, size_t n, const char *model, const char *policy,
                            double budget) {
    for (size_t i = 0; i < n; i++)
        if (tsr__is(r[i], "kind", "fidelity") && tsr__ok(r[i]) && tsr__is(r[i], "model", model) &&
            tsr__is(r[i], "policy", policy) && tsr__n(r[i], "budget") == budget)
            return r[i];
    return NULL;
}

/* The budgets a policy's accuracy cells ran at. */
static int tsr__pol_budgets(const tsr_study *s, const tsr_study_policy *p, const double **bv) {
    *bv = p->budgets ? p->budgets : s->budgets;
    return p->budgets ? p->n_budgets : s->n_budgets;
}

typedef struct tsr__finding {
    const char *key, *paper;
    char measured[2048];
    const char *verdict; /* agree, disagree, partly, no clear difference, not measured */
} tsr__finding;

static int tsr__cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double tsr__median(double *v, int n) {
    if (n == 0 || !v) return NAN;
    qsort(v, (size_t)n, sizeof *v, tsr__cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* the full cache fastest: in each group of cells at the same point, the full cache's
 * output throughput against every other policy's that completed there. */
static void tsr__f_full_fastest(const tsr_study *s, cJSON *const *r, size_t n, tsr__finding *f) {
    char full[128];
    tsr__role_names(TSR__ROLE_FULL, full, sizeof full);
    int pairs = 0, wins = 0, nr = 0;
    double *ratio = NULL;
    /* two passes: count the pairs, then keep their ratios for the median */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && pairs > 0) ratio = tsr_calloc((size_t)pairs, sizeof *ratio);
        pairs = wins = nr = 0;
        for (size_t i = 0; i < n; i++) {
            if (!tsr__perf(r[i]) || !tsr__ok(r[i]) || tsr__role_rec(s, r[i]) != TSR__ROLE_FULL)
                continue;
            for (size_t j = 0; j < n; j++) {
                if (j == i || !tsr__perf(r[j]) || !tsr__ok(r[j]) ||
                    tsr__role_rec(s, r[j]) == TSR__ROLE_FULL || !tsr__same_point(r[i], r[j]))
                    continue;
                double a = tsr__n(r[i], "output_tok_s"), b = tsr__n(r[j], "output_tok_s");
                if (!(a > 0 && b > 0)) continue;
                pairs++;
                wins += a >= b;
                if (ratio) ratio[nr++] = a / b;
            }
        }
    }
    if (pairs == 0) {
        snprintf(f->measured, sizeof f->measured,
                 "no point where the full cache (%s) and another policy both completed", full);
        f->verdict = "not measured";
    } else {
        snprintf(f->measured, sizeof f->measured,
                 "the full cache (%s) had the higher output throughput in %d of %d comparisons "
                 "with another policy at the same model, layout, prompt length, batch and rate "
                 "(median full/other ratio %.2f)", full, wins, pairs, tsr__median(ratio, nr));
        /* A coin flip is not a finding: the full cache must win clearly (3 of 5 comparisons and a
         * median ratio >= 1.05) to agree, and lose as clearly to disagree. */
        double med = tsr__median(ratio, nr);
        f->verdict = 5 * wins >= 3 * pairs && med >= 1.05   ? "agree"
                     : 5 * wins <= 2 * pairs && med <= 0.95 ? "disagree"
                                                            : "no clear difference";
    }
    tsr_free(ratio);
}

static void tsr__f_scores_memory(const tsr_study *s, cJSON *const *r, size_t n,
                                 tsr__finding *f) {
    char full[128], sc[128];
    tsr__role_names(TSR__ROLE_FULL, full, sizeof full);
    tsr__role_names(TSR__ROLE_SCORES, sc, sizeof sc);
    double best = -1, best_b = 0, best_n = 0;
    int cmp = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tsr__perf(r[i]) || !tsr__ok(r[i]) || tsr__role_rec(s, r[i]) != TSR__ROLE_SCORES)
            continue;
        for (size_t j = 0; j < n; j++) {
            if (!tsr__perf(r[j]) || !tsr__ok(r[j]) || tsr__role_rec(s, r[j]) != TSR__ROLE_FULL ||
                !tsr__same_point(r[i], r[j]))
                continue;
            double a = tsr__n(r[i], "kv_peak_bytes"), b = tsr__n(r[j], "kv_peak_bytes");
            if (!(b > 0) || !isfinite(a)) continue;
            cmp++;
            double sv = 1 - a / b;
            if (sv > best) {
                best = sv;
                best_b = tsr__n(r[i], "budget");
                best_n = tsr__n(r[i], "prompt_tokens");
            }
        }
    }
    /* the accuracy side: the score-evicting policy's fidelity and needle retrieval at its
     * budgets, on the real models */
    char acc[1400] = "";
    size_t al = 0;
    bool cost = false, have_fid = false;
    for (int m = 0; m < s->n_models; m++) {
        if (!strncmp(s->models[m].spec, "synthetic:", 10)) continue;
        const char *ml = s->models[m].label;
        for (int p = 0; p < s->n_policies; p++) {
            const tsr_study_policy *pol = &s->policies[p];
            if (pol->materialize || tsr__role_of(tsr_kv_policy_find(pol->policy)) != TSR__ROLE_SCORES)
                continue;
            const double *bv;
            int nb = tsr__pol_budgets(s, pol, &bv);
            for (int b = 0; b < nb; b++) {
                rec_t fr = tsr__fid_label(r, n, ml, pol->label, bv[b]);
                int found = 0, full_ok = 0;
                tsr__needle_pool(r, n, ml, pol->label, bv[b], 100, &found, &full_ok);
                if (!fr && !full_ok) continue;
                have_fid = true;
                char fs[200] = "", ns[120] = "";
                if (fr) {
                    double ag = tsr__n(fr, "fid_agreement"), kl = tsr__n(fr, "fid_kl");
                    double pp = tsr__n(fr, "fid_ppl"), pf = tsr__n(fr, "fid_ppl_full");
                    if ((isfinite(ag) && ag < 1) || (isfinite(kl) && kl > 1e-6) ||
                        (pp > pf * 1.0001))
                        cost = true;
                    snprintf(fs, sizeof fs, "agreement %.3f, KL %.4f, ppl %.3f vs %.3f full", ag,
                             kl, pp, pf);
                }
                if (full_ok) {
                    cost = cost || found < full_ok;
                    snprintf(ns, sizeof ns, "%sneedle %d of the %d keys the full cache found",
                             fr ? ", " : "", found, full_ok);
                }
                if (al < sizeof acc - 360)
                    al += (size_t)snprintf(acc + al, sizeof acc - al, "%s%s %s at budget %g: %s%s",
                                           al ? "; " : "", ml, pol->label, bv[b], fs, ns);
            }
        }
    }
    if (cmp == 0) {
        snprintf(f->measured, sizeof f->measured,
                 "no point where score eviction (%s) and the full cache (%s) both completed", sc,
                 full);
        f->verdict = "not measured";
        return;
    }
    snprintf(f->measured, sizeof f->measured,
             "score eviction's (%s) KV pool peak was up to %.0f %% below the full cache's (%s) "
             "(budget %g, %g-token prompt; %d comparisons). Accuracy: %s", sc, 100 * best, full,
             best_b, best_n, cmp,
             have_fid ? acc : "not measured (no fidelity or needle cell of a real model ran)");
    bool mem = best >= 0.5;
    f->verdict = mem && have_fid && cost ? "agree" : mem ? "partly" : "disagree";
}

static void tsr__f_host_tier(const tsr_study *s, cJSON *const *r, size_t n, tsr__finding *f) {
    char host[128], sc[128];
    tsr__role_names(TSR__ROLE_HOST, host, sizeof host);
    tsr__role_names(TSR__ROLE_SCORES, sc, sizeof sc);
    double moved_off = 0, moved_h2o = 0;
    int n_off = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tsr__perf(r[i]) || !tsr__ok(r[i])) continue;
        double m = tsr__n(r[i], "bytes_moved");
        if (!isfinite(m)) continue;
        tsr__role role = tsr__role_rec(s, r[i]);
        if (role == TSR__ROLE_HOST) {
            moved_off = fmax(moved_off, m);
            n_off++;
        } else if (role == TSR__ROLE_SCORES) {
            moved_h2o = fmax(moved_h2o, m);
        }
    }
    /* accuracy: the host tier's best policy against the best of every other policy with a
     * budget, at the same real model and budget: KL of the document's scored positions
     * (lower is better) and the needle keys found where the full cache found them (early
     * facts: depths up to 25 %); a budget counts for the host tier when it is at least as
     * good on every figure both sides have */
    int better = 0, pairs = 0;
    char acc[1400] = "";
    size_t al = 0;
    for (int m = 0; m < s->n_models; m++) {
        if (!strncmp(s->models[m].spec, "synthetic:", 10)) continue;
        const char *ml = s->models[m].label;
        for (int bi = 0; bi < s->n_budgets; bi++) {
            double b = s->budgets[bi];
            /* [0]: the host tier, [1]: the others; their best KL and needle share */
            double kl[2] = {INFINITY, INFINITY}, nd[2] = {-1, -1}, early[2] = {-1, -1};
            const char *kl_who[2] = {NULL, NULL}, *nd_who[2] = {NULL, NULL};
            for (int p = 0; p < s->n_policies; p++) {
                const tsr_study_policy *pol = &s->policies[p];
                tsr__role role = tsr__role_of(tsr_kv_policy_find(pol->policy));
                if (!pol->budgeted || pol->materialize || role == TSR__ROLE_FULL) continue;
                int side = role == TSR__ROLE_HOST ? 0 : 1;
                rec_t fr = tsr__fid_label(r, n, ml, pol->label, b);
                double k = fr ? tsr__n(fr, "fid_kl") : NAN;
                if (isfinite(k) && k < kl[side]) {
                    kl[side] = k;
                    kl_who[side] = pol->label;
                }
                int found = 0, full_ok = 0, ef = 0, eo = 0;
                tsr__needle_pool(r, n, ml, pol->label, b, 100, &found, &full_ok);
                tsr__needle_pool(r, n, ml, pol->label, b, 25, &ef, &eo);
                if (full_ok && (double)found / full_ok > nd[side]) {
                    nd[side] = (double)found / full_ok;
                    nd_who[side] = pol->label;
                }
                if (eo && (double)ef / eo > early[side]) early[side] = (double)ef / eo;
            }
            bool kl_cmp = kl_who[0] && kl_who[1], nd_cmp = nd_who[0] && nd_who[1];
            if (!kl_cmp && !nd_cmp) continue;
            pairs++;
            bool win = (!kl_cmp || kl[0] <= kl[1]) && (!nd_cmp || nd[0] >= nd[1]);
            better += win;
            if (al >= sizeof acc - 360) continue;
            al += (size_t)snprintf(acc + al, sizeof acc - al, "%s%s budget %g: ", al ? "; " : "",
                                   ml, b);
            if (kl_cmp)
                al += (size_t)snprintf(acc + al, sizeof acc - al, "KL %s %.4f vs %s %.4f",
                                       kl_who[0], kl[0], kl_who[1], kl[1]);
            if (nd_cmp)
                al += (size_t)snprintf(acc + al, sizeof acc - al,
                                       "%sneedle %s %.2f vs %s %.2f (early keys %.2f vs %.2f)",
                                       kl_cmp ? ", " : "", nd_who[0], nd[0], nd_who[1], nd[1],
                                       early[0], early[1]);
            al += (size_t)snprintf(acc + al, sizeof acc - al, win ? " (host tier best)" : "");
        }
    }
    if (n_off == 0) {
        snprintf(f->measured, sizeof f->measured, "no cell of a host-tier policy (%s) completed",
                 host);
        f->verdict = "not measured";
        return;
    }
    snprintf(f->measured, sizeof f->measured,
             "the host tier (%s) moved up to %.1f MiB between the host and the pool in a cell "
             "(score eviction, %s: %.1f MiB). Accuracy against the best other policy at the "
             "same budget: %s%s%s", host, tsr__mib(moved_off), sc, tsr__mib(moved_h2o),
             pairs ? "" : "not measured (no fidelity or needle cell of a real model ran)",
             pairs ? acc : "", "");
    if (pairs) {
        size_t ml = strlen(f->measured);
        snprintf(f->measured + ml, sizeof f->measured - ml,
                 ". The host tier was the most accurate at %d of %d budgets", better, pairs);
    }
    bool traffic = moved_off > moved_h2o;
    f->verdict = traffic && pairs && 2 * better >= pairs ? "agree"
                 : traffic && !pairs                     ? "partly"
                                                         : "disagree";
    if (traffic && pairs && 2 * better < pairs) f->verdict = "partly";
}

/* least-squares line of y on x: slope and R^2 */
static void tsr__fit(const double *x, const double *y, int n, double *slope, double *r2) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
    for (int i = 0; i < n; i++) {
        sx += x[i];
        sy += y[i];
        sxx += x[i] * x[i];
        sxy += x[i] * y[i];
        syy += y[i] * y[i];
    }
    double cx = sxx - sx * sx / n, cy = syy - sy * sy / n, cxy = sxy - sx * sy / n;
    *slope = cx > 0 ? cxy / cx : NAN;
    *r2 = cx > 0 && cy > 0 ? cxy * cxy / (cx * cy) : (cy == 0 ? 1 : NAN);
}

/* The materialize baseline against the arithmetic, and the tiled policies' longest
 * prompt and memory slope. Writes its tables into md. */
static void tsr__f_oom(const tsr_study *s, cJSON *const *r, size_t n, tsr__finding *f, FILE *md) {
    fprintf(md, "The original H2O (and InfiniGen's reference code) builds the attention "
                "probabilities as a heads x n x n matrix of 4-byte floats per layer, so its "
                "memory is **heads x n^2 x 4 bytes**: it passes a memory limit M at n* = "
                "sqrt(M / (4 x heads)). On the paper's setting (OPT-13B, 40 heads, an 80 GB "
                "GPU) one prompt's matrix is 40 x 10,000^2 x 4 B = 16 GB at 10K tokens, and "
                "five sequences of 10K would fill the GPU before any weight or KV byte; at "
                "32K one matrix alone is 164 GB. Under tensor parallelism each rank holds its "
                "own heads' part, under its own limit, so the table gives one rank's heads "
                "and bytes. ");
    {
        /* the study's own labels: which are the baseline and which are tiled */
        char mat[512] = "", til[512] = "";
        size_t ml = 0, tl = 0;
        for (int p = 0; p < s->n_policies; p++) {
            const tsr_study_policy *pol = &s->policies[p];
            if (pol->materialize && ml + 80 < sizeof mat)
                ml += (size_t)snprintf(mat + ml, sizeof mat - ml, "%s`%s`", ml ? ", " : "",
                                       pol->label);
            else if (!pol->materialize && pol->budgeted && tl + 80 < sizeof til)
                tl += (size_t)snprintf(til + tl, sizeof til - tl, "%s`%s`", tl ? ", " : "",
                                       pol->label);
        }
        if (ml) fprintf(md, "Here %s %s that baseline (the whole prompt in one forward call). ",
                        mat, strchr(mat, ',') ? "are" : "is");
        if (tl) fprintf(md, "%s never hold the matrix: their scores, where they read any, come "
                        "from the tiled attention kernel.", til);
        fprintf(md, "\n\n");
    }
    fprintf(md, "| model | policy | n (tokens) | batch | heads | n x n bytes | limit | predicted | "
                "measured | peak host |\n|---|---|---:|---:|---:|---:|---:|---|---|---:|\n");
    int match = 0, total = 0, fails = 0;
    double first_fail = INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!tsr__perf(r[i]) || !tsr__materialize(s, r[i]) || tsr__is(r[i], "status", "skipped"))
            continue;
        /* one rank's share: tensor parallelism splits the heads, each rank has the limit */
        double tp = tsr__n(r[i], "tp");
        if (!(tp >= 1)) tp = 1;
        double nx = tsr__n(r[i], "nxn_bytes") / tp, lim = tsr__n(r[i], "mem_limit_bytes");
        bool pred = isfinite(lim) && nx >= lim; /* the matrix alone fills it */
        bool oom = tsr__is(r[i], "status", "oom");
        total++;
        match += pred == oom;
        if (oom) {
            fails++;
            first_fail = fmin(first_fail, tsr__n(r[i], "prompt_tokens"));
        }
        char lims[32] = "none";
        if (isfinite(lim)) snprintf(lims, sizeof lims, "%.0f MiB", tsr__mib(lim));
        fprintf(md, "| %s | %s | %.0f | %.0f | %.0f | %.1f MiB | %s | %s | %s | %.1f MiB |\n",
                tsr__s(r[i], "model"), tsr__s(r[i], "policy"), tsr__n(r[i], "prompt_tokens"),
                tsr__n(r[i], "batch"), tsr__n(r[i], "heads") / tp, tsr__mib(nx), lims,
                pred ? "out of memory" : "fits",
                tsr__s(r[i], "status"), tsr__mib(tsr__n(r[i], "peak_host_bytes")));
    }
    fputc('\n', md);
    /* the tiled policies: longest prompt, memory per token */
    fprintf(md, "Tiled policies, peak host memory against the prompt length (least-squares "
                "line over the completed cells at the first budget, batch and rate):\n\n"
                "| model | policy | budget | longest ok (tokens) | longest asked | MiB per 1K "
                "tokens (line) | R^2 | MiB per 1K tokens, last step | failed |\n"
                "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    int tiled_ok = 0, tiled_total = 0;
    for (int m = 0; m < s->n_models; m++)
        for (int p = 0; p < s->n_policies; p++) {
            const tsr_study_policy *pol = &s->policies[p];
            if (pol->materialize || !pol->budgeted) continue;
            double x[64], y[64], longest = 0, asked = 0;
            int k = 0, failed = 0;
            for (size_t i = 0; i < n; i++) {
                rec_t c = r[i];
                if (!tsr__perf(c) || !tsr__is(c, "model", s->models[m].label) ||
                    !tsr__is(c, "policy", pol->label) || tsr__n(c, "budget") != tsr__bud0(s, pol) ||
                    tsr__n(c, "batch") != s->batch_sizes[0] ||
                    !tsr__is(c, "layout", s->layouts[0].label) || tsr__is(c, "status", "skipped"))
                    continue;
                char rs[32];
                tsr_study_rate_str(s->rates[0], rs, sizeof rs);
                if (!tsr__is(c, "request_rate", rs)) continue;
                asked = fmax(asked, tsr__n(c, "prompt_tokens"));
                if (!tsr__ok(c)) {
                    failed++;
                    continue;
                }
                longest = fmax(longest, tsr__n(c, "prompt_tokens"));
                if (k < 64 && isfinite(tsr__n(c, "peak_host_bytes"))) {
                    x[k] = tsr__n(c, "prompt_tokens");
                    y[k] = tsr__n(c, "peak_host_bytes");
                    k++;
                }
            }
            if (asked == 0) continue;
            double slope = NAN, r2 = NAN, last = NAN;
            if (k >= 2) tsr__fit(x, y, k, &slope, &r2);
            /* the growth between the two longest prompts: an n^2 term would make it many
             * times the line's slope (the n x n matrix grows 2n^2 x heads x 4 B per step) */
            int a = -1, b = -1;
            for (int j = 0; j < k; j++)
                if (b < 0 || x[j] > x[b]) b = j;
            for (int j = 0; j < k; j++)
                if (j != b && (a < 0 || x[j] > x[a])) a = j;
            if (a >= 0 && b >= 0 && x[b] > x[a]) last = (y[b] - y[a]) / (x[b] - x[a]);
            bool linear = k < 3 || r2 >= 0.95 ||
                          (isfinite(last) && last <= 2 * fabs(slope) + 64.0); /* 64 B/token */
            tiled_total++;
            if (longest == asked && failed == 0 && linear) tiled_ok++;
            char sl[32] = "-", rr[32] = "-", ls[32] = "-";
            if (isfinite(slope)) snprintf(sl, sizeof sl, "%.3f", tsr__mib(slope) * 1000);
            if (isfinite(r2)) snprintf(rr, sizeof rr, "%.4f", r2);
            if (isfinite(last)) snprintf(ls, sizeof ls, "%.3f", tsr__mib(last) * 1000);
            fprintf(md, "| %s | %s | %g | %.0f | %.0f | %s | %s | %s | %d |\n",
                    s->models[m].label, pol->label, tsr__bud0(s, pol), longest, asked, sl, rr,
                    ls, failed);
        }
    fputc('\n', md);
    if (total == 0) {
        snprintf(f->measured, sizeof f->measured,
                 "no materialize cell ran (the study has no NAME-materialize policy)");
        f->verdict = "not measured";
        return;
    }
    snprintf(f->measured, sizeof f->measured,
             "the materialize baseline ran out of memory in %d of %d cells (first at %.0f "
             "tokens); the arithmetic heads x n^2 x 4 B > limit predicted %d of %d outcomes. "
             "The tiled policies (every other policy with a budget) completed every "
             "prompt length asked with memory growing "
             "linearly (R^2 >= 0.95, or the last step's growth at most twice the line's slope "
             "+ 64 B/token) in %d of %d policy series.",
             fails, total, isfinite(first_fail) ? first_fail : 0, match, total, tiled_ok,
             tiled_total);
    f->verdict = match == total && fails > 0 && tiled_ok == tiled_total ? "agree"
                 : fails > 0                                            ? "partly"
                                                                        : "disagree";
}

/* ---- plots ---- */

static bool tsr__have_gnuplot(char *path, size_t cap) {
    const char *pathenv = getenv("PATH");
    if (!pathenv) pathenv = "/usr/bin:/bin";
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", pathenv);
    for (char *d = strtok(buf, ":"); d; d = strtok(NULL, ":")) {
        snprintf(path, cap, "%s/gnuplot", d);
        if (access(path, X_OK) == 0) return true;
    }
    return false;
}

static bool tsr__gnuplot(const char *gp, const char *script, const char *dir) {
    char so[4200], se[4200];
    snprintf(so, sizeof so, "%s/plots/gnuplot.out", dir);
    snprintf(se, sizeof se, "%s/plots/gnuplot.err", dir);
    char *argv[] = {(char *)gp, (char *)script, NULL};
    tsr_cell_proc pr;
    if (tsr_cell_spawn(argv, so, se, 0, 60, NULL, NULL, &pr) != TSR_OK) {
        tsr_error_clear();
        return false;
    }
    if (pr.exit_code != 0)
        fprintf(stderr, "tessera characterize: gnuplot %s failed: %s\n", script, pr.last_line);
    return pr.exit_code == 0;
}

static const char tsr__gp_head[] =
    "set terminal pngcairo size 960,640 enhanced font 'Sans,11'\n"
    "set grid\nset key outside right top\n"
    "set datafile missing '?'\n";

/* Memory against prompt length for one model: a series per policy (first budget, batch,
 * rate, layout), out-of-memory points marked, heads x n^2 x 4 and the limit as lines. */
static bool tsr__plot_memory(const tsr_study *s, cJSON *const *r, size_t n, int m,
                             const char *dir, const char *gp, char *png, size_t cap) {
    char script[4200];
    snprintf(png, cap, "memory_vs_prompt_%s.png", s->models[m].label);
    snprintf(script, sizeof script, "%s/plots/memory_%s.gp", dir, s->models[m].label);
    char rs[32];
    tsr_study_rate_str(s->rates[0], rs, sizeof rs);
    double lim = s->mem_limit > 0 ? tsr__mib((double)s->mem_limit) : NAN;
    double xmin = INFINITY, xmax = 0, ymax = 1;
    FILE *g = fopen(script, "w");
    if (!g) return false;
    fprintf(g, "%s", tsr__gp_head);
    fprintf(g, "set key below box\nset terminal pngcairo size 960,760\n");
    fprintf(g, "set output '%s/%s'\n", dir, png);
    fprintf(g, "set title \"%s: peak host memory vs prompt length (batch %d, %s; policies with a budget "
               "at their first budget)\"\n", s->models[m].label, s->batch_sizes[0], rs);
    fprintf(g, "set xlabel 'prompt length (tokens)'\nset ylabel 'peak host memory (MiB)'\n");
    fprintf(g, "set logscale xy 2\n");
    fprintf(g, "nxn(x) = %d * x * x * 4 / 1048576.0\n", s->models[m].heads);
    /* one data file per policy and outcome; only series with points are plotted */
    char plot[8192] = "";
    size_t pl = 0;
    for (int p = 0; p < s->n_policies; p++) {
        const tsr_study_policy *pol = &s->policies[p];
        double bud = tsr__bud0(s, pol);
        char bs[48] = "full cache";
        if (pol->budgeted) snprintf(bs, sizeof bs, "budget %g", bud);
        for (int pass = 0; pass < 2; pass++) {
            char dat[4200];
            snprintf(dat, sizeof dat, "%s/plots/memory_%s_%s_%s.dat", dir, s->models[m].label,
                     pol->label, pass ? "failed" : "ok");
            FILE *d = fopen(dat, "w");
            if (!d) {
                fclose(g);
                return false;
            }
            int pts = 0;
            for (size_t i = 0; i < n; i++) {
                rec_t c = r[i];
                if (!tsr__perf(c) || !tsr__is(c, "model", s->models[m].label) ||
                    !tsr__is(c, "policy", pol->label) || tsr__n(c, "budget") != bud ||
                    tsr__n(c, "batch") != s->batch_sizes[0] || !tsr__is(c, "request_rate", rs) ||
                    !tsr__is(c, "layout", s->layouts[0].label) || tsr__is(c, "status", "skipped"))
                    continue;
                if (tsr__ok(c) == (pass == 1)) continue;
                double y = tsr__mib(tsr__n(c, "peak_host_bytes"));
                if (!isfinite(y)) y = isfinite(lim) ? lim : 1;
                double x = tsr__n(c, "prompt_tokens");
                fprintf(d, "%g %g\n", x, y);
                pts++;
                xmin = fmin(xmin, x);
                xmax = fmax(xmax, x);
                ymax = fmax(ymax, y);
            }
            fclose(d);
            if (!pts || pl > sizeof plot - 600) continue;
            if (pass == 0)
                pl += (size_t)snprintf(plot + pl, sizeof plot - pl,
                                       "%s'%s' using 1:2 with linespoints lw 2 pt 7 lc %d title "
                                       "'%s (%s)'", pl ? ", \\\n     " : "", dat, p + 1,
                                       pol->label, bs);
            else
                pl += (size_t)snprintf(plot + pl, sizeof plot - pl,
                                       "%s'%s' using 1:2 with points pt 2 ps 3 lw 3 lc %d title "
                                       "'%s: out of memory / failed (memory reached)'",
                                       pl ? ", \\\n     " : "", dat, p + 1, pol->label);
        }
    }
    if (xmax == 0) {
        fclose(g);
        return false;
    }
    double top = fmax(ymax, isfinite(lim) ? lim : 0) * 4;
    fprintf(g, "set xrange [%g:%g]\nset yrange [%g:%g]\n", xmin / 1.5, xmax * 1.5, 1.0, top);
    fprintf(g, "plot %s, \\\n     nxn(x) with lines dt 2 lw 2 lc rgb 'black' title 'n x n "
               "scores: %d heads x n^2 x 4 B'", plot, s->models[m].heads);
    if (isfinite(lim))
        fprintf(g, ", \\\n     %g with lines dt 3 lw 2 lc rgb 'red' title 'cell memory limit "
                   "(%.0f MiB)'", lim, lim);
    fprintf(g, "\n");
    fclose(g);
    return tsr__gnuplot(gp, script, dir);
}

/* y (a column) against the numeric request rates: a series per policy. */
static bool tsr__plot_rate(const tsr_study *s, cJSON *const *r, size_t n, const char *col,
                           double scale, const char *ylabel, const char *name, const char *dir,
                           const char *gp, char *png, size_t cap) {
    int numeric = 0;
    for (int i = 0; i < s->n_rates; i++) numeric += s->rates[i] > 0;
    if (numeric == 0) return false;
    int batch = s->sweep_batch ? s->sweep_batch : s->batch_sizes[s->n_batch_sizes - 1];
    int plen = s->sweep_len ? s->sweep_len : s->prompt_lengths[0];
    char script[4200], plot[8192] = "";
    size_t pl = 0;
    snprintf(png, cap, "%s_vs_rate.png", name);
    snprintf(script, sizeof script, "%s/plots/%s_rate.gp", dir, name);
    double xmin = INFINITY, xmax = 0;
    for (int p = 0; p < s->n_policies; p++) {
        const tsr_study_policy *pol = &s->policies[p];
        double bud = tsr__bud0(s, pol);
        char dat[4200];
        snprintf(dat, sizeof dat, "%s/plots/%s_rate_%s.dat", dir, name, pol->label);
        FILE *d = fopen(dat, "w");
        if (!d) return false;
        int pts = 0;
        for (int k = 0; k < s->n_rates; k++) {
            if (s->rates[k] <= 0) continue;
            char rs[32];
            tsr_study_rate_str(s->rates[k], rs, sizeof rs);
            for (size_t i = 0; i < n; i++) {
                rec_t c = r[i];
                if (!tsr__perf(c) || !tsr__ok(c) || !tsr__is(c, "model", s->models[0].label) ||
                    !tsr__is(c, "policy", pol->label) || tsr__n(c, "budget") != bud ||
                    tsr__n(c, "batch") != batch || !tsr__is(c, "request_rate", rs) ||
                    !tsr__is(c, "layout", s->layouts[0].label) ||
                    tsr__n(c, "prompt_tokens") != plen)
                    continue;
                double y = tsr__n(c, col);
                if (!isfinite(y)) continue;
                fprintf(d, "%g %g\n", s->rates[k], y * scale);
                pts++;
                xmin = fmin(xmin, s->rates[k]);
                xmax = fmax(xmax, s->rates[k]);
            }
        }
        fclose(d);
        if (!pts || pl > sizeof plot - 400) continue;
        pl += (size_t)snprintf(plot + pl, sizeof plot - pl,
                               "%s'%s' using 1:2 with linespoints lw 2 pt 7 lc %d title '%s%s'",
                               pl ? ", \\\n     " : "", dat, p + 1, pol->label,
                               pol->budgeted ? " (first budget)" : "");
    }
    if (!pl) return false;
    FILE *g = fopen(script, "w");
    if (!g) return false;
    fprintf(g, "%s", tsr__gp_head);
    fprintf(g, "set key inside top left box opaque\n");
    fprintf(g, "set output '%s/%s'\n", dir, png);
    fprintf(g, "set title \"%s: %s vs request rate (Poisson arrivals; %d requests of %d "
               "tokens)\"\n", s->models[0].label, ylabel, batch, plen);
    fprintf(g, "set xlabel 'request rate (requests/s, log scale)'\nset ylabel '%s'\n", ylabel);
    fprintf(g, "set logscale x 2\nset xrange [%g:%g]\nset yrange [0:*]\n", xmin / 1.5,
            xmax * 1.5);
    fprintf(g, "plot %s\n", plot);
    fclose(g);
    return tsr__gnuplot(gp, script, dir);
}

/* Agreement (left axis) and KL (right axis) against the budget for one model, a series per
 * policy; the full cache at budget 1. */
static bool tsr__plot_fidelity(const tsr_study *s, cJSON *const *r, size_t n, int m,
                               const char *dir, const char *gp, char *png, size_t cap) {
    char script[4200], plot[16384] = "";
    size_t pl = 0;
    snprintf(png, cap, "fidelity_vs_budget_%s.png", s->models[m].label);
    snprintf(script, sizeof script, "%s/plots/fidelity_%s.gp", dir, s->models[m].label);
    for (int p = 0; p < s->n_policies; p++) {
        {
            char dat[4200];
            snprintf(dat, sizeof dat, "%s/plots/fidelity_%s_%s.dat", dir, s->models[m].label,
                     s->policies[p].label);
            FILE *d = fopen(dat, "w");
            if (!d) return false;
            int pts = 0;
            for (size_t i = 0; i < n; i++) {
                rec_t c = r[i];
                if (!tsr__is(c, "kind", "fidelity") || !tsr__ok(c) ||
                    !tsr__is(c, "model", s->models[m].label) ||
                    !tsr__is(c, "policy", s->policies[p].label))
                    continue;
                double b = tsr__n(c, "budget");
                double ag = tsr__n(c, "fid_agreement"), kl = tsr__n(c, "fid_kl");
                char as[32] = "?", ks[32] = "?";
                if (isfinite(ag)) snprintf(as, sizeof as, "%g", ag);
                if (isfinite(kl)) snprintf(ks, sizeof ks, "%g", kl);
                fprintf(d, "%g %s %s\n", b > 0 && b <= 1 ? b : 1.0, as, ks);
                pts += isfinite(ag) || isfinite(kl);
            }
            fclose(d);
            if (!pts || pl > sizeof plot - 800) continue;
            pl += (size_t)snprintf(
                plot + pl, sizeof plot - pl,
                "%s'%s' using 1:2 with linespoints lw 2 pt 7 lc %d title '%s agreement', "
                "'%s' using 1:3 axes x1y2 with linespoints dt 2 lw 2 pt 6 lc %d title '%s KL'",
                pl ? ", \\\n     " : "", dat, p + 1, s->policies[p].label, dat, p + 1,
                s->policies[p].label);
        }
    }
    if (!pl) return false;
    FILE *g = fopen(script, "w");
    if (!g) return false;
    fprintf(g, "%s", tsr__gp_head);
    fprintf(g, "set output '%s/%s'\n", dir, png);
    fprintf(g, "set key below box maxrows 4\nset terminal pngcairo size 1100,760\n");
    fprintf(g, "set title '%s: fidelity against the full cache vs KV budget (full cache = "
               "budget 1)%s'\n", s->models[m].label,
            strncmp(s->models[m].spec, "synthetic:", 10) ? "" : "; random weights: text figures mean little");
    fprintf(g, "set xlabel 'KV budget (fraction of the sequence kept)'\n");
    fprintf(g, "set ylabel 'top-1 agreement with the full cache (solid)'\n");
    fprintf(g, "set y2label 'KL(full || policy), nats (dashed)'\nset y2tics\nset ytics nomirror\n");
    fprintf(g, "set xrange [0:1.05]\nset yrange [0:1.05]\nset y2range [0:*]\n");
    fprintf(g, "plot %s\n", plot);
    fclose(g);
    return tsr__gnuplot(gp, script, dir);
}

/* ---- needle plots ---- */

/* A needle record's per-depth marks ("0:1/1 25:1/0 50:0/-"): depth (percent), the full
 * cache's (1/0) and the policy's (1, 0, -1 not run); the count. */
static int tsr__by_depth(rec_t r, double *depth, int *full, int *pol) {
    const char *p = tsr__s(r, "needle_by_depth");
    int n = 0;
    while (*p && n < TSR__MAX_DEPTHS) {
        char pm[4] = "";
        int fu = 0, used = 0;
        if (sscanf(p, "%lf:%d/%3[-01]%n", &depth[n], &fu, pm, &used) != 3 || used <= 0) break;
        full[n] = fu;
        pol[n] = pm[0] == '-' ? -1 : pm[0] == '1';
        n++;
        p += used;
        while (*p == ' ') p++;
    }
    return n;
}

/* The needle cell of a model x policy x budget x length x needle count (NULL: none ran). */
static rec_t tsr__needle_rec(cJSON *const *r, size_t n, const char *model, const char *policy,
                             double budget, int length, int needles) {
    for (size_t i = 0; i < n; i++)
        if (tsr__is(r[i], "kind", "needle") && tsr__ok(r[i]) && tsr__is(r[i], "model", model) &&
            tsr__is(r[i], "policy", policy) && tsr__n(r[i], "budget") == budget &&
            tsr__n(r[i], "prompt_tokens") == length && tsr__n(r[i], "needles") == needles)
            return r[i];
    return NULL;
}

static void tsr__len_label(int len, char *buf, size_t cap) {
    if (len % 1024 == 0) snprintf(buf, cap, "%dK", len / 1024);
    else snprintf(buf, cap, "%d", len);
}

/* The heat map of one model and needle count: a row per policy and budget, a column per
 * length and depth; green where the policy found the key, red where it did not and the
 * full cache did, grey where the full cache failed (the cell measures the model), white
 * where nothing ran. */
static bool tsr__plot_heatmap(const tsr_study *s, cJSON *const *r, size_t n, int m, int needles,
                              const char *dir, const char *gp, char *png, size_t cap) {
    const char *ml = s->models[m].label;
    char script[4200], dat[4200];
    snprintf(png, cap, "needle_heatmap_%s_x%d.png", ml, needles);
    snprintf(script, sizeof script, "%s/plots/needle_heatmap_%s_x%d.gp", dir, ml, needles);
    snprintf(dat, sizeof dat, "%s/plots/needle_heatmap_%s_x%d.dat", dir, ml, needles);
    FILE *d = fopen(dat, "w");
    if (!d) return false;
    char ytics[8192] = "", xtics[8192] = "";
    size_t yl = 0, xl = 0;
    int rows = 0, cols = 0, pts = 0;
    /* columns: the lengths in the study's order, the depths of the first cell found */
    double depth[TSR__MAX_DEPTHS];
    int fu[TSR__MAX_DEPTHS], po[TSR__MAX_DEPTHS], nd = 0;
    for (size_t i = 0; i < n && nd == 0; i++)
        if (tsr__is(r[i], "kind", "needle") && tsr__ok(r[i]) && tsr__is(r[i], "model", ml) &&
            tsr__n(r[i], "needles") == needles)
            nd = tsr__by_depth(r[i], depth, fu, po);
    if (nd == 0) {
        fclose(d);
        return false;
    }
    /* the lengths this needle count ran at */
    bool len_on[64] = {false};
    for (size_t i = 0; i < n; i++)
        if (tsr__is(r[i], "kind", "needle") && tsr__is(r[i], "model", ml) &&
            tsr__n(r[i], "needles") == needles && !tsr__is(r[i], "status", "skipped"))
            for (int li = 0; li < s->n_needle_lengths && li < 64; li++)
                len_on[li] = len_on[li] || tsr__n(r[i], "prompt_tokens") == s->needle_lengths[li];
    for (int li = 0; li < s->n_needle_lengths && li < 64; li++)
        for (int k = 0; len_on[li] && k < nd; k++) {
            char lb[32];
            tsr__len_label(s->needle_lengths[li], lb, sizeof lb);
            /* a tic label is a format: the percent sign doubled */
            if (xl < sizeof xtics - 64)
                xl += (size_t)snprintf(xtics + xl, sizeof xtics - xl, "%s\"%s %g%%%%\" %d",
                                       xl ? ", " : "", lb, depth[k], cols);
            cols++;
        }
    for (int p = s->n_policies - 1; p >= 0; p--) { /* the first policy on top */
        const tsr_study_policy *pol = &s->policies[p];
        int nb = !pol->budgeted ? 1 : pol->budgets ? pol->n_budgets : s->n_budgets;
        const double *bv = pol->budgets ? pol->budgets : s->budgets;
        for (int b = nb - 1; b >= 0; b--) {
            double bud = pol->budgeted ? bv[b] : 0;
            char name[160];
            if (pol->budgeted) snprintf(name, sizeof name, "%s %g%%%%", pol->label, bud * 100);
            else snprintf(name, sizeof name, "%s (full cache)", pol->label);
            int col = 0;
            for (int li = 0; li < s->n_needle_lengths && li < 64; li++) {
                if (!len_on[li]) continue;
                rec_t c = tsr__needle_rec(r, n, ml, pol->label, bud, s->needle_lengths[li],
                                          needles);
                double dd[TSR__MAX_DEPTHS];
                int f2[TSR__MAX_DEPTHS], p2[TSR__MAX_DEPTHS];
                int k2 = c ? tsr__by_depth(c, dd, f2, p2) : 0;
                /* a box per point that ran; nothing (white) where none did */
                for (int k = 0; k < nd; k++, col++) {
                    if (k >= k2 || (f2[k] && p2[k] < 0)) continue;
                    fprintf(d, "%d %d %s\n", col, rows,
                            !f2[k] ? "0.5" : p2[k] == 1 ? "1" : "0");
                    pts++;
                }
            }
            if (yl < sizeof ytics - 200)
                yl += (size_t)snprintf(ytics + yl, sizeof ytics - yl, "%s\"%s\" %d",
                                       yl ? ", " : "", name, rows);
            rows++;
        }
    }
    fclose(d);
    if (!pts) return false;
    FILE *g = fopen(script, "w");
    if (!g) return false;
    fprintf(g, "%s", tsr__gp_head);
    fprintf(g, "set terminal pngcairo size %d,%d enhanced font 'Sans,10'\n",
            (cols < 10 ? 400 : 0) + 160 + 40 * cols, 220 + 28 * rows);
    fprintf(g, "set output '%s/%s'\n", dir, png);
    fprintf(g, "set title \"%s: needle retrieval, %d key%s\\ngreen: found; red: missed where "
               "the full cache found it;\\ngrey: the full cache missed it too (the model's "
               "limit); white: not run\" font 'Sans,9'\n",
            ml, needles, needles > 1 ? "s, asked for one" : "");
    fprintf(g, "unset key\nunset colorbox\nunset grid\n");
    fprintf(g, "set palette defined (0 '#d73027', 0.5 '#bdbdbd', 1 '#1a9850')\n");
    fprintf(g, "set cbrange [0:1]\n");
    fprintf(g, "set xrange [-0.5:%g]\nset yrange [-0.5:%g]\n", cols - 0.5, rows - 0.5);
    fprintf(g, "set xtics rotate by 45 right (%s)\nset ytics (%s)\n", xtics, ytics);
    fprintf(g, "set xlabel 'prompt length and depth of the asked key'\n");
    fprintf(g, "set style fill solid 1.0 border lc rgb 'white'\n");
    fprintf(g, "plot '%s' using 1:2:(0.5):(0.5):3 with boxxyerror fc palette\n", dat);
    fclose(g);
    return tsr__gnuplot(gp, script, dir);
}

/* Needle accuracy against the budget for one model: a series per policy and needle count,
 * the share of (length, depth) points where the policy found the key among those where the
 * full cache did (the full cache at budget 1). */
static bool tsr__plot_needle_budget(const tsr_study *s, cJSON *const *r, size_t n, int m,
                                    const char *dir, const char *gp, char *png, size_t cap) {
    const char *ml = s->models[m].label;
    char script[4200], plot[16384] = "";
    size_t pl = 0;
    snprintf(png, cap, "needle_vs_budget_%s.png", ml);
    snprintf(script, sizeof script, "%s/plots/needle_budget_%s.gp", dir, ml);
    for (int p = 0; p < s->n_policies; p++) {
        const tsr_study_policy *pol = &s->policies[p];
        int nb = !pol->budgeted ? 1 : pol->budgets ? pol->n_budgets : s->n_budgets;
        const double *bv = pol->budgets ? pol->budgets : s->budgets;
        for (int ni = 0; ni < s->n_needle_counts; ni++) {
            int nn = s->needle_counts[ni];
            char dat[4200];
            snprintf(dat, sizeof dat, "%s/plots/needle_budget_%s_%s_x%d.dat", dir, ml,
                     pol->label, nn);
            FILE *d = fopen(dat, "w");
            if (!d) return false;
            int pts = 0;
            for (int b = 0; b < nb; b++) {
                double bud = pol->budgeted ? bv[b] : 0;
                int full_ok = 0, both = 0;
                for (int li = 0; li < s->n_needle_lengths; li++) {
                    rec_t c = tsr__needle_rec(r, n, ml, pol->label, bud, s->needle_lengths[li],
                                              nn);
                    double dd[TSR__MAX_DEPTHS];
                    int f2[TSR__MAX_DEPTHS], p2[TSR__MAX_DEPTHS];
                    int k2 = c ? tsr__by_depth(c, dd, f2, p2) : 0;
                    for (int k = 0; k < k2; k++) {
                        full_ok += f2[k] == 1;
                        both += f2[k] == 1 && p2[k] == 1;
                    }
                }
                if (!full_ok) continue;
                fprintf(d, "%g %g\n", bud > 0 && bud <= 1 ? bud : 1.0, (double)both / full_ok);
                pts++;
            }
            fclose(d);
            if (!pts || pl > sizeof plot - 400) continue;
            pl += (size_t)snprintf(plot + pl, sizeof plot - pl,
                                   "%s'%s' using 1:2 with linespoints lw 2 pt %d dt %d lc %d "
                                   "title '%s, %d key%s'", pl ? ", \\\n     " : "", dat,
                                   nn > 1 ? 6 : 7, nn > 1 ? 2 : 1, p + 1, pol->label, nn,
                                   nn > 1 ? "s" : "");
        }
    }
    if (!pl) return false;
    FILE *g = fopen(script, "w");
    if (!g) return false;
    fprintf(g, "%s", tsr__gp_head);
    fprintf(g, "set output '%s/%s'\n", dir, png);
    fprintf(g, "set key below box maxrows 4\nset terminal pngcairo size 1100,760\n");
    fprintf(g, "set title \"%s: needle accuracy vs KV budget where the full cache finds the key "
               "(all lengths and depths; full cache = budget 1)\"\n", ml);
    fprintf(g, "set xlabel 'KV budget (fraction of the sequence kept)'\n");
    fprintf(g, "set ylabel 'keys found / keys the full cache found'\n");
    fprintf(g, "set xrange [0:1.05]\nset yrange [-0.05:1.05]\n");
    fprintf(g, "plot %s\n", plot);
    fclose(g);
    return tsr__gnuplot(gp, script, dir);
}

/* The accuracy tables of the report: the full cache's own needle score per length, then
 * per policy and budget the fidelity figures and the needle keys found. */
static void tsr__accuracy_tables(const tsr_study *s, cJSON *const *r, size_t n, FILE *md) {
    bool any = false;
    for (size_t i = 0; i < n && !any; i++)
        any = (tsr__is(r[i], "kind", "needle") || tsr__is(r[i], "kind", "fidelity")) &&
              tsr__ok(r[i]);
    if (!any) return;
    fprintf(md, "## Accuracy per policy and budget\n\n");
    bool hdr = false;
    for (int m = 0; m < s->n_models; m++)
        for (int li = 0; li < s->n_needle_lengths; li++)
            for (int ni = 0; ni < s->n_needle_counts; ni++) {
                /* the full cache's score: from any cell of this length (all share it) */
                for (size_t i = 0; i < n; i++) {
                    rec_t c = r[i];
                    if (!tsr__is(c, "kind", "needle") || !tsr__ok(c) ||
                        !tsr__is(c, "model", s->models[m].label) ||
                        tsr__n(c, "prompt_tokens") != s->needle_lengths[li] ||
                        tsr__n(c, "needles") != s->needle_counts[ni])
                        continue;
                    double d[TSR__MAX_DEPTHS];
                    int fu[TSR__MAX_DEPTHS], po[TSR__MAX_DEPTHS];
                    int k = tsr__by_depth(c, d, fu, po), ok = 0;
                    char where[160] = "";
                    size_t wl = 0;
                    for (int j = 0; j < k; j++) {
                        ok += fu[j] == 1;
                        if (fu[j] != 1 && wl < sizeof where - 16)
                            wl += (size_t)snprintf(where + wl, sizeof where - wl, "%s%g %%",
                                                   wl ? ", " : "", d[j]);
                    }
                    if (!hdr) {
                        fprintf(md, "The full cache's own needle score (a depth it misses "
                                    "measures the model, not a policy):\n\n| model | length | "
                                    "keys | found by the full cache | missed at |\n"
                                    "|---|---|---|---|---|\n");
                        hdr = true;
                    }
                    fprintf(md, "| %s | %d | %d | %d of %d | %s |\n", s->models[m].label,
                            s->needle_lengths[li], s->needle_counts[ni], ok, k,
                            where[0] ? where : "-");
                    break;
                }
            }
    if (hdr) fprintf(md, "\n");
    fprintf(md, "Per policy and budget: fidelity on the document (top-1 agreement and KL against "
                "the full cache, perplexity against the full cache's) and the needle keys the "
                "policy found of those the full cache found (all lengths and depths):\n\n"
                "| model | policy | budget | agreement | KL | ppl (full) | needle, 1 key | "
                "needle, 3 keys |\n|---|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < s->n_models; m++)
        for (int p = 0; p < s->n_policies; p++) {
            const tsr_study_policy *pol = &s->policies[p];
            const double *bv = NULL;
            int nb = pol->budgeted ? tsr__pol_budgets(s, pol, &bv) : 1;
            for (int b = 0; b < nb; b++) {
                double bud = pol->budgeted ? bv[b] : 0;
                rec_t fr = tsr__fid_label(r, n, s->models[m].label, pol->label, bud);
                char nd[2][48] = {"-", "-"};
                bool have = fr != NULL;
                for (int x = 0; x < 2; x++) {
                    int found = 0, full_ok = 0;
                    for (int li = 0; li < s->n_needle_lengths; li++) {
                        rec_t c = tsr__needle_rec(r, n, s->models[m].label, pol->label, bud,
                                                  s->needle_lengths[li], x ? 3 : 1);
                        double d[TSR__MAX_DEPTHS];
                        int fu[TSR__MAX_DEPTHS], po[TSR__MAX_DEPTHS];
                        int k = c ? tsr__by_depth(c, d, fu, po) : 0;
                        for (int j = 0; j < k; j++) {
                            full_ok += fu[j] == 1;
                            found += fu[j] == 1 && po[j] == 1;
                        }
                        have = have || c;
                    }
                    if (full_ok) snprintf(nd[x], sizeof nd[x], "%d of %d", found, full_ok);
                }
                if (!have) continue;
                char bs[32] = "full cache";
                if (pol->budgeted) snprintf(bs, sizeof bs, "%g", bud);
                if (fr)
                    fprintf(md, "| %s | %s | %s | %.3f | %.4f | %.3f (%.3f) | %s | %s |\n",
                            s->models[m].label, pol->label, bs, tsr__n(fr, "fid_agreement"),
                            tsr__n(fr, "fid_kl"), tsr__n(fr, "fid_ppl"),
                            tsr__n(fr, "fid_ppl_full"), nd[0], nd[1]);
                else
                    fprintf(md, "| %s | %s | %s | - | - | - | %s | %s |\n", s->models[m].label,
                            pol->label, bs, nd[0], nd[1]);
            }
        }
    fprintf(md, "\n");
}

tsr_status tsr_char_report(const tsr_study *s, cJSON *const *recs, size_t n, const char *dir,
                           double study_wall_s, const char *self_exe) {
    (void)self_exe;
    char p[4200];
    snprintf(p, sizeof p, "%s/cells.csv", dir);
    TSR_TRY(tsr__write_csv(recs, n, p));
    snprintf(p, sizeof p, "%s/plots", dir);
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", p, strerror(errno));

    /* counts */
    static const char *const sts[] = {"ok", "oom", "timeout", "crash", "error", "skipped"};
    int counts[6] = {0};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 6; k++) counts[k] += tsr__is(recs[i], "status", sts[k]);

    /* plots */
    char gp[4096], pngs[80][256];
    int n_png = 0;
    char plot_note[512] = "";
    bool have_gp = tsr__have_gnuplot(gp, sizeof gp);
    if (!have_gp) {
        snprintf(plot_note, sizeof plot_note,
                 "gnuplot is not installed (Debian: apt-get install gnuplot-nox): no plots; "
                 "the CSV, JSON and report are complete");
        fprintf(stderr, "tessera characterize: %s\n", plot_note);
    } else {
        for (int m = 0; m < s->n_models && n_png < 60; m++)
            if (tsr__plot_memory(s, recs, n, m, dir, gp, pngs[n_png], sizeof pngs[0])) n_png++;
        if (tsr__plot_rate(s, recs, n, "output_tok_s", 1.0, "output throughput (tokens/s)",
                           "throughput", dir, gp, pngs[n_png], sizeof pngs[0]))
            n_png++;
        if (tsr__plot_rate(s, recs, n, "ttft_p50_s", 1000.0, "median TTFT (ms)", "ttft", dir, gp,
                           pngs[n_png], sizeof pngs[0]))
            n_png++;
        for (int m = 0; m < s->n_models && n_png < 70; m++)
            if (tsr__plot_fidelity(s, recs, n, m, dir, gp, pngs[n_png], sizeof pngs[0])) n_png++;
        for (int m = 0; m < s->n_models && s->needle_haystack && n_png < 72; m++) {
            if (tsr__plot_needle_budget(s, recs, n, m, dir, gp, pngs[n_png], sizeof pngs[0]))
                n_png++;
            for (int ni = 0; ni < s->n_needle_counts && n_png < 78; ni++)
                if (tsr__plot_heatmap(s, recs, n, m, s->needle_counts[ni], dir, gp,
                                      pngs[n_png], sizeof pngs[0]))
                    n_png++;
        }
    }

    /* report */
    char mdp[4200], tmp[4300];
    snprintf(mdp, sizeof mdp, "%s/report.md", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", mdp);
    FILE *md = fopen(tmp, "w");
    if (!md) return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    /* the n x n section is written first into a scratch file, then placed in order */
    char oomp[4300];
    snprintf(oomp, sizeof oomp, "%s/plots/oom_section.md", dir);
    FILE *oom = fopen(oomp, "w+");
    tsr__finding f[4] = {
        {"full_cache_fastest", "vLLM (the full cache) is the fastest policy", "", NULL},
        {"score_eviction_memory", "H2O saves up to about 70 % of KV memory at some cost in accuracy", "", NULL},
        {"host_tier_accuracy", "InfiniGen keeps accuracy best (early facts retained) and pays in "
                             "host<->device traffic", "", NULL},
        {"nxn_oom", "H2O and InfiniGen run out of memory near 10K tokens of prefill because "
                    "their code materializes the n x n score matrix; tessera's tiled policies "
                    "do not", "", NULL},
    };
    tsr__f_full_fastest(s, recs, n, &f[0]);
    tsr__f_scores_memory(s, recs, n, &f[1]);
    tsr__f_host_tier(s, recs, n, &f[2]);
    if (oom) tsr__f_oom(s, recs, n, &f[3], oom);
    else {
        snprintf(f[3].measured, sizeof f[3].measured, "(scratch file failed)");
        f[3].verdict = "not measured";
    }

    fprintf(md, "# Characterization: %s\n\n", s->name);
    if (s->comment) fprintf(md, "> %s\n\n", s->comment); /* what the study is, its own words */
    char lims[64] = "none";
    if (s->mem_limit > 0)
        snprintf(lims, sizeof lims, "%.0f MiB of address space", tsr__mib((double)s->mem_limit));
    double cell_s = 0;
    for (size_t i = 0; i < n; i++) {
        double w = tsr__n(recs[i], "wall_s");
        if (isfinite(w)) cell_s += w;
    }
    fprintf(md, "Generated by `tessera characterize --study %s` (the cells ran for %.0f s in "
                "all, %.0f s of them in the last invocation). "
                "%zu cells: %d ok, %d out of memory, %d time limit, %d crashed, %d errors, %d "
                "skipped. Per-cell memory limit: %s; time limit: %g s; %d generated tokens per "
                "request. Every figure is in `cells.csv` (columns in docs/characterize.md); "
                "the records in `cells/`, each cell's command line and stderr in `work/ID/`.\n\n",
            s->path, cell_s, study_wall_s, n, counts[0], counts[1], counts[2], counts[3], counts[4],
            counts[5], lims, s->time_limit, s->gen_tokens);
    {
        time_t now = time(NULL);
        struct tm tm;
        char when[64] = "?";
        if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
        fprintf(md, "Written %s on a machine with %d CPUs for this process and %.1f GiB of "
                    "memory.\n\n", when, tsr_sys_cpus(),
                (double)tsr_sys_mem_total() / 1073741824.0);
    }
    fprintf(md, "Reference: Mamo, Kogiou, Yi and Yu (2026), \"Comparative Characterization of KV "
                "Cache Management Strategies for LLM Inference\", arXiv 2604.05012. Each of "
                "their systems is the role a registered policy declares:");
    for (int role = TSR__ROLE_FULL; role < TSR__N_ROLES; role++) {
        char names[128];
        fprintf(md, "%s their %s is %s (%s)", role == TSR__ROLE_FULL ? "" : ";",
                tsr__role_paper[role], tsr__role_what[role],
                tsr__role_names((tsr__role)role, names, sizeof names));
    }
    fprintf(md, "; a policy with a `materialize` mode, labelled NAME-materialize, is the "
                "original n x n code.\n\n");
    fprintf(md, "## Findings\n\n| # | the paper | measured here | verdict |\n|---|---|---|---|\n");
    for (int i = 0; i < 4; i++) {
        fprintf(md, "| %d | %s | ", i + 1, f[i].paper);
        for (const char *c = f[i].measured; *c; c++) fputc(*c == '|' ? '/' : *c, md);
        fprintf(md, " | **%s** |\n", f[i].verdict);
    }
    fprintf(md, "\nScale: these cells run on the machine at hand (a CPU run is not a GPU's "
                "throughput); the comparisons are between policies on the same inputs, which "
                "is what the findings are about. Accuracy in findings 2 and 3 comes from the "
                "fidelity and needle cells of real models; a synthetic model's figures (random "
                "weights) are in the CSV and the plots only.\n\n");
    tsr__accuracy_tables(s, recs, n, md);
    fprintf(md, "## The n x n arithmetic\n\n");
    if (oom) {
        rewind(oom);
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, oom)) > 0) fwrite(buf, 1, k, md);
        fclose(oom);
        remove(oomp);
    }
    fprintf(md, "## Plots\n\n");
    if (plot_note[0]) fprintf(md, "%s.\n\n", plot_note);
    for (int i = 0; i < n_png; i++) fprintf(md, "![%s](%s)\n\n", pngs[i], pngs[i]);
    if (have_gp && n_png == 0) fprintf(md, "No series had data to plot.\n\n");
    fprintf(md, "## Cells that did not complete\n\n");
    int shown = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        if (tsr__ok(recs[i])) continue;
        if (tsr__is(recs[i], "status", "skipped")) {
            skipped++;
            continue;
        }
        if (shown++ == 0) fprintf(md, "| cell | status | reason |\n|---|---|---|\n");
        fprintf(md, "| %s | %s | ", tsr__s(recs[i], "id"), tsr__s(recs[i], "status"));
        for (const char *c = tsr__s(recs[i], "reason"); *c; c++) fputc(*c == '|' ? '/' : *c, md);
        fprintf(md, " |\n");
    }
    if (!shown) fprintf(md, "Every cell that ran completed.\n");
    if (skipped) {
        /* the distinct reasons, with their counts */
        fprintf(md, "\n%d cells were skipped (not run):\n\n", skipped);
        bool *seen = tsr_calloc(n, sizeof *seen);
        for (size_t i = 0; seen && i < n; i++) {
            if (seen[i] || !tsr__is(recs[i], "status", "skipped")) continue;
            const char *why = tsr__s(recs[i], "reason");
            int cnt = 0;
            for (size_t j = i; j < n; j++)
                if (!seen[j] && tsr__is(recs[j], "status", "skipped") &&
                    tsr__is(recs[j], "reason", why)) {
                    seen[j] = true;
                    cnt++;
                }
            fprintf(md, "- %d: %s\n", cnt, why);
        }
        tsr_free(seen);
    }
    bool bad = ferror(md) != 0;
    if (fclose(md) != 0 || bad || rename(tmp, mdp) != 0) {
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", mdp, strerror(errno));
    }

    /* summary.json */
    cJSON *sm = cJSON_CreateObject();
    if (!sm) return TSR_ERR_NOMEM;
    cJSON_AddNumberToObject(sm, "schema_version", 1);
    cJSON_AddStringToObject(sm, "study", s->name);
    cJSON_AddStringToObject(sm, "study_file", s->path);
    cJSON_AddNumberToObject(sm, "cells", (double)n);
    cJSON *cs = cJSON_AddObjectToObject(sm, "status_counts");
    for (int k = 0; cs && k < 6; k++) cJSON_AddNumberToObject(cs, sts[k], counts[k]);
    cJSON_AddNumberToObject(sm, "wall_s", study_wall_s);
    cJSON_AddNumberToObject(sm, "mem_limit_bytes", (double)s->mem_limit);
    cJSON_AddNumberToObject(sm, "time_limit_s", s->time_limit);
    cJSON_AddBoolToObject(sm, "gnuplot", have_gp);
    cJSON *pl = cJSON_AddArrayToObject(sm, "plots");
    for (int i = 0; pl && i < n_png; i++) cJSON_AddItemToArray(pl, cJSON_CreateString(pngs[i]));
    cJSON *fa = cJSON_AddArrayToObject(sm, "findings");
    for (int i = 0; fa && i < 4; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) continue;
        cJSON_AddStringToObject(o, "id", f[i].key);
        cJSON_AddStringToObject(o, "paper", f[i].paper);
        cJSON_AddStringToObject(o, "measured", f[i].measured);
        cJSON_AddStringToObject(o, "verdict", f[i].verdict);
        cJSON_AddItemToArray(fa, o);
    }
    cJSON *ra = cJSON_AddArrayToObject(sm, "records");
    for (size_t i = 0; ra && i < n; i++) cJSON_AddItemToArray(ra, cJSON_Duplicate(recs[i], 1));
    char *js = cJSON_Print(sm);
    cJSON_Delete(sm);
    if (!js) return TSR_ERR_NOMEM;
    snprintf(p, sizeof p, "%s/summary.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *sf = fopen(tmp, "w");
    tsr_status st = TSR_OK;
    if (!sf || fputs(js, sf) < 0 || fputc('\n', sf) == EOF) st = TSR_ERR_IO;
    if (sf && fclose(sf) != 0) st = TSR_ERR_IO;
    if (st == TSR_OK && rename(tmp, p) != 0) st = TSR_ERR_IO;
    cJSON_free(js);
    if (st != TSR_OK) {
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", p, strerror(errno));
    }
    return TSR_OK;
}
