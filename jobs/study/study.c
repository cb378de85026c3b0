#include "jobs/study/study.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/file.h"
#include "jobs/cli.h"
#include "policies/policy.h"
#include "runtime/model/model.h"

/* One error line for a malformed study: the file, the key, what was expected. */
static tsr_status tsr__bad(const tsr_study *s, const char *key, const char *expected) {
    return tsr_error_set(TSR_ERR_INVALID, "%s: key '%s': expected %s", s->path, key, expected);
}

static char *tsr__dup(const char *s) { return s ? tsr_strdup(s) : NULL; }

/* A key that must be a non-empty array; *out NULL when the key is absent and optional. */
static tsr_status tsr__array(const tsr_study *s, const cJSON *root, const char *key,
                             bool required, const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!*out) return required ? tsr__bad(s, key, "a non-empty array (the key is missing)") : TSR_OK;
    if (!cJSON_IsArray(*out) || cJSON_GetArraySize(*out) == 0)
        return tsr__bad(s, key, "a non-empty array");
    return TSR_OK;
}

static tsr_status tsr__ints(const tsr_study *s, const cJSON *root, const char *key, int lo,
                            int **vals, int *n) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, key, true, &a));
    int cnt = cJSON_GetArraySize(a);
    *vals = tsr_calloc((size_t)cnt, sizeof **vals);
    if (!*vals) return TSR_ERR_NOMEM;
    *n = cnt;
    for (int i = 0; i < cnt; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        char k[96], want[64];
        snprintf(k, sizeof k, "%s[%d]", key, i);
        snprintf(want, sizeof want, "an integer >= %d", lo);
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            v->valuedouble < lo || v->valuedouble > 1e9)
            return tsr__bad(s, k, want);
        (*vals)[i] = (int)v->valuedouble;
    }
    return TSR_OK;
}

static tsr_status tsr__int_key(const tsr_study *s, const cJSON *o, const char *key,
                               const char *name, int lo, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return TSR_OK;
    char want[64];
    snprintf(want, sizeof want, "an integer >= %d", lo);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > 1e9)
        return tsr__bad(s, name, want);
    *out = (int)v->valuedouble;
    return TSR_OK;
}

static tsr_status tsr__str_key(const tsr_study *s, const cJSON *o, const char *key,
                               const char *name, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return TSR_OK;
    if (!cJSON_IsString(v) || !v->valuestring[0]) return tsr__bad(s, name, "a non-empty string");
    *out = tsr_strdup(v->valuestring);
    return *out ? TSR_OK : TSR_ERR_NOMEM;
}

static tsr_status tsr__models(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "models", true, &a));
    int n = cJSON_GetArraySize(a);
    s->models = tsr_calloc((size_t)n, sizeof *s->models);
    if (!s->models) return TSR_ERR_NOMEM;
    s->n_models = n;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(a, i);
        tsr_study_model *sm = &s->models[i];
        char k[96];
        snprintf(k, sizeof k, "models[%d]", i);
        if (cJSON_IsString(m) && m->valuestring[0]) {
            sm->spec = tsr_strdup(m->valuestring);
        } else if (cJSON_IsObject(m)) {
            snprintf(k, sizeof k, "models[%d].path", i);
            TSR_TRY(tsr__str_key(s, m, "path", k, &sm->spec));
            if (!sm->spec) return tsr__bad(s, k, "a model path or synthetic:NAME (missing)");
            snprintf(k, sizeof k, "models[%d].label", i);
            TSR_TRY(tsr__str_key(s, m, "label", k, &sm->label));
            snprintf(k, sizeof k, "models[%d].tokenizer", i);
            TSR_TRY(tsr__str_key(s, m, "tokenizer", k, &sm->tokenizer));
            snprintf(k, sizeof k, "models[%d].context", i);
            TSR_TRY(tsr__int_key(s, m, "context", k, 1, &sm->context));
            snprintf(k, sizeof k, "models[%d].heads", i);
            TSR_TRY(tsr__int_key(s, m, "heads", k, 1, &sm->heads));
        } else {
            return tsr__bad(s, k, "a string (model path) or an object with \"path\"");
        }
        if (!sm->spec) return TSR_ERR_NOMEM;
        if (!sm->label) {
            /* the file name without extension, or the synthetic name up to its options */
            const char *b = strrchr(sm->spec, '/');
            b = b ? b + 1 : (!strncmp(sm->spec, "synthetic:", 10) ? sm->spec + 10 : sm->spec);
            size_t l = strcspn(b, ",.");
            sm->label = tsr_malloc(l + 1);
            if (!sm->label) return TSR_ERR_NOMEM;
            memcpy(sm->label, b, l);
            sm->label[l] = '\0';
        }
    }
    return TSR_OK;
}

static tsr_status tsr__policy_args(tsr_study *s, const cJSON *args, const char *name,
                                   tsr_study_policy *p) {
    if (!cJSON_IsArray(args)) return tsr__bad(s, name, "an array of strings");
    int n = cJSON_GetArraySize(args);
    if (n > TSR_STUDY_MAX_ARGS - 2) return tsr__bad(s, name, "at most 14 arguments");
    for (int j = 0; j < n; j++) {
        const cJSON *v = cJSON_GetArrayItem(args, j);
        if (!cJSON_IsString(v)) return tsr__bad(s, name, "an array of strings");
        p->args[p->n_args] = tsr_strdup(v->valuestring);
        if (!p->args[p->n_args]) return TSR_ERR_NOMEM;
        p->n_args++;
        /* "--OPTION materialize" or "--OPTION=materialize": the n x n baseline */
        const char *eq = strchr(v->valuestring, '=');
        if (!strcmp(v->valuestring, "materialize") ||
            (eq && !strncmp(v->valuestring, "--", 2) && !strcmp(eq + 1, "materialize")))
            p->materialize = true;
    }
    return TSR_OK;
}

/* "NAME-materialize" where NAME is a registered policy with an ENUM option that accepts
 * "materialize": true, with NAME in base and that option in *opt. */
static bool tsr__materialize_of(const char *label, char *base, size_t cap,
                                const tsr_kv_policy_option **opt) {
    static const char suffix[] = "-materialize";
    size_t n = strlen(label), k = sizeof suffix - 1;
    if (n <= k || strcmp(label + n - k, suffix) != 0 || n - k >= cap) return false;
    memcpy(base, label, n - k);
    base[n - k] = '\0';
    const tsr_kv_policy_decl *ops = tsr_kv_policy_find(base);
    for (int i = 0; ops && i < ops->n_options; i++) {
        const tsr_kv_policy_option *o = &ops->options[i];
        if (o->kind != TSR_KV_OPT_ENUM || !o->values) continue;
        for (const char *const *v = o->values; *v; v++)
            if (!strcmp(*v, "materialize")) {
                *opt = o;
                return true;
            }
    }
    return false;
}

/* a followed by b, allocated (NULL when out of memory) */
static char *tsr__strcat2(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *r = tsr_malloc(na + nb + 1);
    if (!r) return NULL;
    memcpy(r, a, na);
    memcpy(r + na, b, nb + 1);
    return r;
}

static tsr_status tsr__policies(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "policies", true, &a));
    int n = cJSON_GetArraySize(a);
    s->policies = tsr_calloc((size_t)n, sizeof *s->policies);
    if (!s->policies) return TSR_ERR_NOMEM;
    s->n_policies = n;
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        tsr_study_policy *p = &s->policies[i];
        char k[96];
        snprintf(k, sizeof k, "policies[%d]", i);
        if (cJSON_IsString(v) && v->valuestring[0]) {
            p->label = tsr_strdup(v->valuestring);
            /* The faithful baseline has its own name, NAME-materialize: a policy that
             * declares a "materialize" mode, run in it with the whole prompt in one
             * forward call, as the original code does. */
            const tsr_kv_policy_option *mo = NULL;
            char base[96];
            if (tsr__materialize_of(v->valuestring, base, sizeof base, &mo)) {
                p->policy = tsr_strdup(base);
                p->args[p->n_args++] = tsr__strcat2("--", mo->name);
                p->args[p->n_args++] = tsr_strdup("materialize");
                if (!p->args[0] || !p->args[1]) return TSR_ERR_NOMEM;
                p->whole_prefill = p->materialize = true;
            } else {
                p->policy = tsr_strdup(v->valuestring);
            }
            if (!p->label || !p->policy) return TSR_ERR_NOMEM;
        } else if (cJSON_IsObject(v)) {
            snprintf(k, sizeof k, "policies[%d].policy", i);
            TSR_TRY(tsr__str_key(s, v, "policy", k, &p->policy));
            if (!p->policy) return tsr__bad(s, k, "a --kv-policy name (missing)");
            snprintf(k, sizeof k, "policies[%d].label", i);
            TSR_TRY(tsr__str_key(s, v, "label", k, &p->label));
            if (!p->label && !(p->label = tsr_strdup(p->policy))) return TSR_ERR_NOMEM;
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(v, "args");
            snprintf(k, sizeof k, "policies[%d].args", i);
            if (args) TSR_TRY(tsr__policy_args(s, args, k, p));
            const cJSON *wp = cJSON_GetObjectItemCaseSensitive(v, "whole_prefill");
            snprintf(k, sizeof k, "policies[%d].whole_prefill", i);
            if (wp && !cJSON_IsBool(wp)) return tsr__bad(s, k, "true or false");
            p->whole_prefill = wp ? cJSON_IsTrue(wp) : p->materialize;
            const cJSON *bud = cJSON_GetObjectItemCaseSensitive(v, "budgets");
            if (bud) {
                snprintf(k, sizeof k, "policies[%d].budgets", i);
                int nb = cJSON_IsArray(bud) ? cJSON_GetArraySize(bud) : 0;
                if (nb == 0) return tsr__bad(s, k, "a non-empty array of budgets");
                p->budgets = tsr_calloc((size_t)nb, sizeof *p->budgets);
                if (!p->budgets) return TSR_ERR_NOMEM;
                p->n_budgets = nb;
                for (int j = 0; j < nb; j++) {
                    const cJSON *x = cJSON_GetArrayItem(bud, j);
                    if (!cJSON_IsNumber(x) || !(x->valuedouble > 0) || x->valuedouble > 1e9)
                        return tsr__bad(s, k, "budgets in (0, 1] or token counts > 1");
                    p->budgets[j] = x->valuedouble;
                }
            }
        } else {
            return tsr__bad(s, k, "a policy name or an object with \"policy\"");
        }
        /* any registered policy; one that reads no --kv-budget (paged keeps every token)
         * is one cell per point, not one per budget */
        const tsr_kv_policy_decl *ops = tsr_kv_policy_find(p->policy);
        if (!ops) {
            char want[256];
            snprintf(want, sizeof want, "a registered policy (%s)", tsr_kv_policy_names());
            snprintf(k, sizeof k, cJSON_IsObject(v) ? "policies[%d].policy" : "policies[%d]", i);
            return tsr__bad(s, k, want);
        }
        p->budgeted = ops->uses_budget != 0;
        for (const char *c = p->label; *c; c++)
            if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
                  (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z'))) {
                snprintf(k, sizeof k, "policies[%d].label", i);
                return tsr__bad(s, k, "letters, digits, '-', '_' or '.' only");
            }
        for (int j = 0; j < i; j++)
            if (!strcmp(s->policies[j].label, p->label)) {
                snprintf(k, sizeof k, "policies[%d].label", i);
                return tsr__bad(s, k, "a label not used by another policy");
            }
    }
    return TSR_OK;
}

static tsr_status tsr__rates(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "request_rates", false, &a));
    int n = a ? cJSON_GetArraySize(a) : 1;
    s->rates = tsr_calloc((size_t)n, sizeof *s->rates);
    if (!s->rates) return TSR_ERR_NOMEM;
    s->n_rates = n;
    for (int i = 0; a && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        char k[96];
        snprintf(k, sizeof k, "request_rates[%d]", i);
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "offline")) s->rates[i] = 0;
        else if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e6)
            s->rates[i] = v->valuedouble;
        else return tsr__bad(s, k, "\"offline\" or a number of requests per second > 0");
    }
    return TSR_OK;
}

static tsr_status tsr__budgets(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "kv_budgets", false, &a));
    int n = a ? cJSON_GetArraySize(a) : 1;
    s->budgets = tsr_calloc((size_t)n, sizeof *s->budgets);
    if (!s->budgets) return TSR_ERR_NOMEM;
    s->n_budgets = n;
    if (!a) s->budgets[0] = 0.2; /* the paper's middle sparsity level */
    for (int i = 0; a && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        char k[96];
        snprintf(k, sizeof k, "kv_budgets[%d]", i);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e9)
            return tsr__bad(s, k, "a fraction of the sequence in (0, 1] or a token count > 1");
        s->budgets[i] = v->valuedouble;
    }
    return TSR_OK;
}

static tsr_status tsr__layouts(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "layouts", false, &a));
    int n = a ? cJSON_GetArraySize(a) : 1;
    s->layouts = tsr_calloc((size_t)n, sizeof *s->layouts);
    if (!s->layouts) return TSR_ERR_NOMEM;
    s->n_layouts = n;
    for (int i = 0; i < n; i++) {
        tsr_study_layout *l = &s->layouts[i];
        l->tp = l->pp = 1;
        const cJSON *v = a ? cJSON_GetArrayItem(a, i) : NULL;
        char k[96];
        snprintf(k, sizeof k, "layouts[%d]", i);
        if (v && cJSON_IsObject(v)) {
            char kk[112];
            snprintf(kk, sizeof kk, "%s.tp", k);
            TSR_TRY(tsr__int_key(s, v, "tp", kk, 1, &l->tp));
            snprintf(kk, sizeof kk, "%s.pp", k);
            TSR_TRY(tsr__int_key(s, v, "pp", kk, 1, &l->pp));
        } else if (v) {
            /* "tpN", "ppN" or "tpNppM" */
            int tp = 1, pp = 1, used = 0;
            const char *str = cJSON_IsString(v) ? v->valuestring : "";
            if (sscanf(str, "tp%dpp%d%n", &tp, &pp, &used) == 2 && !str[used]) {
            } else if (tp = 1, pp = 1, used = 0,
                       sscanf(str, "tp%d%n", &tp, &used) == 1 && !str[used]) {
            } else if (tp = 1, pp = 1, used = 0,
                       sscanf(str, "pp%d%n", &pp, &used) == 1 && !str[used]) {
            } else {
                return tsr__bad(s, k, "\"tpN\", \"ppN\", \"tpNppM\" or {\"tp\": N, \"pp\": M}");
            }
            if (tp < 1 || pp < 1 || tp > 4096 || pp > 4096)
                return tsr__bad(s, k, "tp and pp of at least 1");
            l->tp = tp;
            l->pp = pp;
        }
        if (l->pp > 1 && l->tp > 1) snprintf(l->label, sizeof l->label, "tp%dpp%d", l->tp, l->pp);
        else if (l->pp > 1) snprintf(l->label, sizeof l->label, "pp%d", l->pp);
        else snprintf(l->label, sizeof l->label, "tp%d", l->tp);
    }
    return TSR_OK;
}

static tsr_status tsr__limits(tsr_study *s, const cJSON *root) {
    const cJSON *lim = cJSON_GetObjectItemCaseSensitive(root, "limits");
    if (!lim) return TSR_OK;
    if (!cJSON_IsObject(lim)) return tsr__bad(s, "limits", "an object {\"memory\", \"time_s\"}");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(lim, "memory");
    if (m) {
        if (cJSON_IsNumber(m) && m->valuedouble >= 0) s->mem_limit = (int64_t)m->valuedouble;
        else if (!cJSON_IsString(m) || tsr_cli_parse_bytes(m->valuestring, &s->mem_limit) != 0)
            return tsr__bad(s, "limits.memory", "a size such as \"512M\" or \"2G\", or bytes");
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(lim, "time_s");
    if (t) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0)
            return tsr__bad(s, "limits.time_s", "seconds >= 0 (0: no limit)");
        s->time_limit = t->valuedouble;
    }
    return TSR_OK;
}

static tsr_status tsr__fidelity(tsr_study *s, const cJSON *root) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "fidelity");
    if (!f) return TSR_OK;
    if (!cJSON_IsObject(f))
        return tsr__bad(s, "fidelity", "an object {\"text\", \"probe_length\"}");
    TSR_TRY(tsr__str_key(s, f, "text", "fidelity.text", &s->fid_text));
    if (!s->fid_text) return tsr__bad(s, "fidelity.text", "a text file path (missing)");
    TSR_TRY(tsr__int_key(s, f, "max_tokens", "fidelity.max_tokens", 0, &s->fid_max_tokens));
    const cJSON *doc = cJSON_GetObjectItemCaseSensitive(f, "document");
    if (doc && !cJSON_IsBool(doc)) return tsr__bad(s, "fidelity.document", "true or false");
    s->fid_document = cJSON_IsTrue(doc);
    TSR_TRY(tsr__int_key(s, f, "doc_tokens", "fidelity.doc_tokens", 0, &s->fid_doc_tokens));
    TSR_TRY(tsr__int_key(s, f, "tail", "fidelity.tail", 0, &s->fid_tail));
    /* "scoring": ["prompt", "decode"]: which tail scorings get cells (default prompt) */
    s->fid_modes = 1;
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(f, "scoring");
    if (sc) {
        s->fid_modes = 0;
        if (!cJSON_IsArray(sc) || cJSON_GetArraySize(sc) == 0)
            return tsr__bad(s, "fidelity.scoring", "a non-empty array of \"prompt\", \"decode\"");
        const cJSON *v;
        cJSON_ArrayForEach(v, sc) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "prompt")) s->fid_modes |= 1;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "decode")) s->fid_modes |= 2;
            else return tsr__bad(s, "fidelity.scoring", "\"prompt\" or \"decode\"");
        }
    }
    return tsr__int_key(s, f, "probe_length", "fidelity.probe_length", 0, &s->fid_probe_length);
}

/* "needle": {"haystack", "lengths": [...], "needles": [1, 3], "depths": "0,25,..."} */
static tsr_status tsr__needle(tsr_study *s, const cJSON *root) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "needle");
    if (!f) return TSR_OK;
    if (!cJSON_IsObject(f))
        return tsr__bad(s, "needle", "an object {\"haystack\", \"lengths\", \"needles\"}");
    TSR_TRY(tsr__str_key(s, f, "haystack", "needle.haystack", &s->needle_haystack));
    if (!s->needle_haystack) return tsr__bad(s, "needle.haystack", "a text file path (missing)");
    TSR_TRY(tsr__ints(s, f, "lengths", 16, &s->needle_lengths, &s->n_needle_lengths));
    if (cJSON_GetObjectItemCaseSensitive(f, "needles")) {
        TSR_TRY(tsr__ints(s, f, "needles", 1, &s->needle_counts, &s->n_needle_counts));
        for (int i = 0; i < s->n_needle_counts; i++)
            if (s->needle_counts[i] != 1 && s->needle_counts[i] != 3)
                return tsr__bad(s, "needle.needles", "1 and/or 3");
    } else {
        s->needle_counts = tsr_calloc(1, sizeof *s->needle_counts);
        if (!s->needle_counts) return TSR_ERR_NOMEM;
        s->needle_counts[0] = 1;
        s->n_needle_counts = 1;
    }
    TSR_TRY(tsr__str_key(s, f, "depths", "needle.depths", &s->needle_depths));
    if (cJSON_GetObjectItemCaseSensitive(f, "policy_lengths"))
        TSR_TRY(tsr__ints(s, f, "policy_lengths", 16, &s->needle_policy_lengths,
                          &s->n_needle_policy_lengths));
    if (cJSON_GetObjectItemCaseSensitive(f, "multi_lengths"))
        TSR_TRY(tsr__ints(s, f, "multi_lengths", 16, &s->needle_multi_lengths,
                          &s->n_needle_multi_lengths));
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(f, "skip_where_full_fails");
    if (sk && !cJSON_IsBool(sk)) return tsr__bad(s, "needle.skip_where_full_fails", "true or false");
    s->needle_skip_failed = cJSON_IsTrue(sk);
    return TSR_OK;
}

/* "perf_budgets": [...], the perf cells' budgets */
static tsr_status tsr__perf_budgets(tsr_study *s, const cJSON *root) {
    const cJSON *a;
    TSR_TRY(tsr__array(s, root, "perf_budgets", false, &a));
    if (!a) return TSR_OK;
    int n = cJSON_GetArraySize(a);
    s->perf_budgets = tsr_calloc((size_t)n, sizeof *s->perf_budgets);
    if (!s->perf_budgets) return TSR_ERR_NOMEM;
    s->n_perf_budgets = n;
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        char k[96];
        snprintf(k, sizeof k, "perf_budgets[%d]", i);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e9)
            return tsr__bad(s, k, "a fraction of the sequence in (0, 1] or a token count > 1");
        s->perf_budgets[i] = v->valuedouble;
    }
    return TSR_OK;
}

static const char *const tsr__known_keys[] = {
    "name", "models", "policies", "prompt_lengths", "batch_sizes", "request_rates",
    "kv_budgets", "layouts", "gen_tokens", "threads", "limits", "kv_memory", "launcher",
    "fidelity", "comment", "rate_sweep", "needle", "perf_budgets"};

static tsr_status tsr__parse(tsr_study *s, const cJSON *root) {
    if (!cJSON_IsObject(root)) return tsr_error_set(TSR_ERR_INVALID, "%s: expected a JSON object", s->path);
    /* a misspelt key would silently fall back to a default: refuse it */
    for (const cJSON *c = root->child; c; c = c->next) {
        bool ok = false;
        for (size_t i = 0; i < sizeof tsr__known_keys / sizeof *tsr__known_keys; i++)
            ok = ok || !strcmp(c->string, tsr__known_keys[i]);
        if (!ok)
            return tsr__bad(s, c->string, "one of name, models, policies, prompt_lengths, "
                                          "batch_sizes, request_rates, kv_budgets, perf_budgets, "
                                          "layouts, gen_tokens, threads, limits, kv_memory, launcher, "
                                          "fidelity, needle, rate_sweep, comment (unknown key)");
    }
    TSR_TRY(tsr__str_key(s, root, "name", "name", &s->name));
    TSR_TRY(tsr__str_key(s, root, "comment", "comment", &s->comment));
    TSR_TRY(tsr__models(s, root));
    TSR_TRY(tsr__policies(s, root));
    TSR_TRY(tsr__ints(s, root, "prompt_lengths", 1, &s->prompt_lengths, &s->n_prompt_lengths));
    if (cJSON_GetObjectItemCaseSensitive(root, "batch_sizes")) {
        TSR_TRY(tsr__ints(s, root, "batch_sizes", 1, &s->batch_sizes, &s->n_batch_sizes));
    } else {
        s->batch_sizes = tsr_calloc(1, sizeof *s->batch_sizes);
        if (!s->batch_sizes) return TSR_ERR_NOMEM;
        s->batch_sizes[0] = 1;
        s->n_batch_sizes = 1;
    }
    TSR_TRY(tsr__rates(s, root));
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "rate_sweep");
    if (sw) {
        if (!cJSON_IsObject(sw))
            return tsr__bad(s, "rate_sweep", "an object {\"prompt_length\": N, \"batch\": B}");
        TSR_TRY(tsr__int_key(s, sw, "prompt_length", "rate_sweep.prompt_length", 1, &s->sweep_len));
        TSR_TRY(tsr__int_key(s, sw, "batch", "rate_sweep.batch", 1, &s->sweep_batch));
        if (!s->sweep_len || !s->sweep_batch)
            return tsr__bad(s, "rate_sweep", "both prompt_length and batch");
    }
    TSR_TRY(tsr__budgets(s, root));
    TSR_TRY(tsr__perf_budgets(s, root));
    TSR_TRY(tsr__layouts(s, root));
    s->gen_tokens = 16;
    TSR_TRY(tsr__int_key(s, root, "gen_tokens", "gen_tokens", 1, &s->gen_tokens));
    TSR_TRY(tsr__int_key(s, root, "threads", "threads", 0, &s->threads));
    TSR_TRY(tsr__limits(s, root));
    TSR_TRY(tsr__str_key(s, root, "kv_memory", "kv_memory", &s->kv_memory));
    int64_t b;
    if (s->kv_memory && tsr_cli_parse_bytes(s->kv_memory, &b) != 0)
        return tsr__bad(s, "kv_memory", "a size such as \"256M\"");
    TSR_TRY(tsr__str_key(s, root, "launcher", "launcher", &s->launcher));
    if (!s->launcher && !(s->launcher = tsr_strdup("mpirun -np {ranks}"))) return TSR_ERR_NOMEM;
    TSR_TRY(tsr__fidelity(s, root));
    TSR_TRY(tsr__needle(s, root));
    if (!s->name) {
        const char *b0 = strrchr(s->path, '/');
        b0 = b0 ? b0 + 1 : s->path;
        size_t l = strcspn(b0, ".");
        s->name = tsr_malloc(l + 1);
        if (!s->name) return TSR_ERR_NOMEM;
        memcpy(s->name, b0, l);
        s->name[l] = '\0';
    }
    return TSR_OK;
}

tsr_status tsr_study_load(const char *path, tsr_study *out) {
    memset(out, 0, sizeof *out);
    out->path = tsr__dup(path);
    if (!out->path) return TSR_ERR_NOMEM;
    char *text = NULL;
    size_t len = 0;
    TSR_TRY(tsr_file_read(path, "study", (size_t)16 << 20, &text, &len));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    tsr_status st;
    if (!root) {
        /* the line of the first byte cJSON could not take */
        int line = 1;
        for (const char *c = text; end && c < end && c < text + len; c++) line += *c == '\n';
        st = tsr_error_set(TSR_ERR_INVALID, "%s: not valid JSON (line %d)", path, line);
    } else {
        st = tsr__parse(out, root);
    }
    cJSON_Delete(root);
    tsr_free(text);
    return st;
}

tsr_status tsr_study_resolve_models(tsr_study *s) {
    for (int i = 0; i < s->n_models; i++) {
        tsr_study_model *m = &s->models[i];
        if (m->context > 0 && m->heads > 0 && m->tokenizer) continue;
        tsr_model *md = NULL;
        tsr_status st = tsr_model_load(m->spec, &md);
        if (st != TSR_OK)
            return tsr_error_set(st, "%s: models[%d] '%s': %s (give \"context\" and \"heads\" "
                                     "to skip loading it)", s->path, i, m->spec,
                                 tsr_last_error());
        if (m->context == 0) m->context = md->cfg.max_seq_len;
        if (m->heads == 0) m->heads = md->cfg.n_heads;
        m->vocab = md->cfg.vocab_size;
        tsr_model_destroy(md);
    }
    return TSR_OK;
}

void tsr_study_free(tsr_study *s) {
    for (int i = 0; s->models && i < s->n_models; i++) {
        tsr_free(s->models[i].label);
        tsr_free(s->models[i].spec);
        tsr_free(s->models[i].tokenizer);
    }
    for (int i = 0; s->policies && i < s->n_policies; i++) {
        tsr_free(s->policies[i].label);
        tsr_free(s->policies[i].policy);
        for (int j = 0; j < s->policies[i].n_args; j++) tsr_free(s->policies[i].args[j]);
        tsr_free(s->policies[i].budgets);
    }
    tsr_free(s->models);
    tsr_free(s->policies);
    tsr_free(s->prompt_lengths);
    tsr_free(s->batch_sizes);
    tsr_free(s->rates);
    tsr_free(s->budgets);
    tsr_free(s->layouts);
    tsr_free(s->kv_memory);
    tsr_free(s->launcher);
    tsr_free(s->fid_text);
    tsr_free(s->needle_haystack);
    tsr_free(s->needle_lengths);
    tsr_free(s->needle_counts);
    tsr_free(s->needle_depths);
    tsr_free(s->comment);
    tsr_free(s->needle_policy_lengths);
    tsr_free(s->needle_multi_lengths);
    tsr_free(s->perf_budgets);
    tsr_free(s->name);
    tsr_free(s->path);
    memset(s, 0, sizeof *s);
}

void tsr_study_rate_str(double rate, char *buf, size_t cap) {
    if (rate <= 0) snprintf(buf, cap, "offline");
    else snprintf(buf, cap, "%g", rate);
}

static void tsr__sanitize(char *id) {
    for (char *c = id; *c; c++)
        if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
              (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
            *c = '-';
}

static void tsr__cell(const tsr_study *s, tsr_cell *x, int m, int l, int p, double budget,
                      int len, int batch, double rate) {
    memset(x, 0, sizeof *x);
    const tsr_study_policy *pol = &s->policies[p];
    x->kind = TSR_CELL_PERF;
    x->model = m;
    x->layout = l;
    x->policy = p;
    x->budget = budget;
    x->prompt_len = len;
    x->batch = batch;
    x->rate = rate;
    char rs[32];
    tsr_study_rate_str(rate, rs, sizeof rs);
    snprintf(x->id, sizeof x->id, "%s_%s_%s_k%g_n%d_b%d_r%s", s->models[m].label,
             s->layouts[l].label, pol->label, budget, len, batch, rs);
    tsr__sanitize(x->id);
    int ctx = s->models[m].context;
    if (ctx > 0 && len + s->gen_tokens > ctx) {
        snprintf(x->skip_buf, sizeof x->skip_buf,
                 "prompt %d + %d generated tokens exceed the model's context of %d", len,
                 s->gen_tokens, ctx);
        x->skip = x->skip_buf;
    }
}

static bool tsr__has_int(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

tsr_status tsr_study_cells(const tsr_study *s, tsr_cell **cells, size_t *n) {
    size_t cap = 0;
    for (int p = 0; p < s->n_policies; p++) {
        const tsr_study_policy *pp = &s->policies[p];
        size_t nb = !pp->budgeted ? 1 : pp->budgets ? (size_t)pp->n_budgets : (size_t)s->n_budgets;
        cap += nb * (size_t)s->n_prompt_lengths * (size_t)s->n_batch_sizes * (size_t)s->n_rates +
               nb + nb * (size_t)s->n_rates;
    }
    if (s->perf_budgets) cap += (size_t)s->n_policies * (size_t)s->n_perf_budgets *
                                ((size_t)s->n_prompt_lengths * (size_t)s->n_batch_sizes *
                                     (size_t)s->n_rates + 1 + (size_t)s->n_rates);
    cap *= (size_t)s->n_models * (size_t)s->n_layouts;
    /* the fidelity cells of a second scoring and the needle cells */
    for (int p = 0; p < s->n_policies; p++) {
        const tsr_study_policy *pp = &s->policies[p];
        size_t nb = !pp->budgeted ? 1 : pp->budgets ? (size_t)pp->n_budgets : (size_t)s->n_budgets;
        cap += (size_t)s->n_models * nb *
               (1 + (size_t)s->n_needle_lengths * (size_t)s->n_needle_counts);
    }
    tsr_cell *c = tsr_calloc(cap ? cap : 1, sizeof *c);
    if (!c) return TSR_ERR_NOMEM;
    size_t k = 0;
    for (int m = 0; m < s->n_models; m++)
        for (int l = 0; l < s->n_layouts; l++)
            for (int p = 0; p < s->n_policies; p++) {
                const tsr_study_policy *pol = &s->policies[p];
                int nb = !pol->budgeted ? 1
                         : s->perf_budgets ? s->n_perf_budgets
                         : pol->budgets    ? pol->n_budgets
                                           : s->n_budgets;
                const double *bv = s->perf_budgets ? s->perf_budgets
                                   : pol->budgets  ? pol->budgets
                                                   : s->budgets;
                for (int b = 0; b < nb; b++) {
                    for (int pl = 0; pl < s->n_prompt_lengths; pl++)
                        for (int bs = 0; bs < s->n_batch_sizes; bs++)
                            for (int r = 0; r < s->n_rates; r++) {
                                if (s->sweep_len && s->rates[r] > 0) continue;
                                tsr__cell(s, &c[k++], m, l, p, pol->budgeted ? bv[b] : 0,
                                          s->prompt_lengths[pl], s->batch_sizes[bs],
                                          s->rates[r]);
                            }
                    /* the rate sweep at its one point, offline included unless crossed */
                    for (int r = -1; s->sweep_len && r < s->n_rates; r++) {
                        double rate = r < 0 ? 0 : s->rates[r];
                        if (r >= 0 && rate <= 0) continue;
                        tsr_cell x;
                        tsr__cell(s, &x, m, l, p, pol->budgeted ? bv[b] : 0, s->sweep_len,
                                  s->sweep_batch, rate);
                        bool dup = false;
                        for (size_t j = 0; j < k && !dup; j++) dup = !strcmp(c[j].id, x.id);
                        if (dup) continue;
                        c[k] = x;
                        if (x.skip) c[k].skip = c[k].skip_buf;
                        k++;
                    }
                }
            }
    /* fidelity: model x policy x budget, on the first layout (text figures do not depend
     * on the layout) */
    if (s->fid_text)
        for (int m = 0; m < s->n_models; m++)
            for (int p = 0; p < s->n_policies; p++) {
                const tsr_study_policy *pol = &s->policies[p];
                int nb = !pol->budgeted ? 1 : pol->budgets ? pol->n_budgets : s->n_budgets;
                const double *bv = pol->budgets ? pol->budgets : s->budgets;
                for (int b = 0; b < nb; b++)
                    for (int mode = 1; mode <= 2; mode++) {
                        /* without a tail there is one scoring (the text's own) */
                        if (s->fid_tail > 0 ? !(s->fid_modes & mode) : mode == 2) continue;
                        tsr_cell *x = &c[k++];
                        x->kind = TSR_CELL_FIDELITY;
                        x->model = m;
                        x->policy = p;
                        x->budget = pol->budgeted ? bv[b] : 0;
                        x->decode_prefix = mode == 2;
                        snprintf(x->id, sizeof x->id, "fidelity_%s_%s_k%g%s",
                                 s->models[m].label, pol->label, x->budget,
                                 s->fid_tail <= 0 ? "" : mode == 2 ? "_decode" : "_prompt");
                        tsr__sanitize(x->id);
                    }
            }
    /* needle: model x policy x budget x length x needle count */
    if (s->needle_haystack)
        for (int m = 0; m < s->n_models; m++)
            for (int p = 0; p < s->n_policies; p++) {
                const tsr_study_policy *pol = &s->policies[p];
                int nb = !pol->budgeted ? 1 : pol->budgets ? pol->n_budgets : s->n_budgets;
                const double *bv = pol->budgets ? pol->budgets : s->budgets;
                for (int b = 0; b < nb; b++)
                    for (int li = 0; li < s->n_needle_lengths; li++)
                        for (int ni = 0; ni < s->n_needle_counts; ni++) {
                            int len = s->needle_lengths[li];
                            if (s->needle_counts[ni] == 3 && s->needle_multi_lengths &&
                                !tsr__has_int(s->needle_multi_lengths,
                                              s->n_needle_multi_lengths, len))
                                continue;
                            tsr_cell *x = &c[k++];
                            x->kind = TSR_CELL_NEEDLE;
                            x->model = m;
                            x->policy = p;
                            x->budget = pol->budgeted ? bv[b] : 0;
                            x->prompt_len = s->needle_lengths[li];
                            x->needles = s->needle_counts[ni];
                            snprintf(x->id, sizeof x->id, "needle_%s_%s_k%g_n%d_x%d",
                                     s->models[m].label, pol->label, x->budget, x->prompt_len,
                                     x->needles);
                            tsr__sanitize(x->id);
                            int ctx = s->models[m].context;
                            if (ctx > 0 && x->prompt_len + 16 > ctx) {
                                snprintf(x->skip_buf, sizeof x->skip_buf,
                                         "needle prompt %d + 16 answer tokens exceed the "
                                         "model's context of %d", x->prompt_len, ctx);
                                x->skip = x->skip_buf;
                            } else if (pol->budgeted && s->needle_policy_lengths &&
                                       !tsr__has_int(s->needle_policy_lengths,
                                                     s->n_needle_policy_lengths, len)) {
                                snprintf(x->skip_buf, sizeof x->skip_buf,
                                         "needle at %d tokens: the full cache only "
                                         "(needle.policy_lengths)", len);
                                x->skip = x->skip_buf;
                            }
                        }
            }
    *cells = c;
    *n = k;
    return TSR_OK;
}
