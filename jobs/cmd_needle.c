/* `tessera needle`: needle retrieval on an instruct model, the policy under test against
 * the full cache on the same prompts (runtime/eval/needle.h). One JSON object out (--json
 * FILE, else stdout), for `tessera characterize`'s needle cells. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/sys.h"
#include "jobs/cli.h"
#include "jobs/commands.h"
#include "jobs/kv_cli.h"
#include "kernels/backend.h"
#include "runtime/eval/needle.h"

typedef struct tsr__nd_opts {
    const char *model, *haystack, *depths, *json, *backend, *ref_dir, *dtype;
    int length, needles, chunk, threads, answer_tokens, max_context;
    bool quiet, skip_failed;
    tsr_kv_cli kv;
} tsr__nd_opts;

static cJSON *tsr__answer_json(const tsr_needle_answer *a) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddBoolToObject(o, "correct", a->correct);
    cJSON_AddNumberToObject(o, "attention_recall", a->attention_recall);
    cJSON_AddStringToObject(o, "answer", a->text);
    return o;
}

static tsr_status tsr__write(const tsr__nd_opts *o, const tsr_needle_result *r) {
    cJSON *d = cJSON_CreateObject(), *cells = cJSON_CreateArray();
    if (!d || !cells) {
        cJSON_Delete(d);
        cJSON_Delete(cells);
        return TSR_ERR_NOMEM;
    }
    cJSON_AddNumberToObject(d, "schema_version", 1);
    cJSON_AddStringToObject(d, "policy", r->policy ? r->policy : "");
    char b[32];
    snprintf(b, sizeof b, "%.7g", o->kv.kv.budget);
    cJSON_AddNumberToObject(d, "budget", strtod(b, NULL));
    cJSON_AddStringToObject(d, "model", o->model);
    cJSON_AddStringToObject(d, "dtype", r->dtype ? r->dtype : "");
    cJSON_AddNumberToObject(d, "length", o->length);
    cJSON_AddNumberToObject(d, "needles", o->needles);
    cJSON_AddStringToObject(d, "key", r->key ? r->key : "");
    int full_ok = 0, pol_ok = 0, both = 0, ran = 0;
    for (int i = 0; i < r->n_cells; i++) {
        const tsr_needle_cell *c = &r->cells[i];
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddNumberToObject(e, "depth", c->depth);
        cJSON_AddNumberToObject(e, "prompt_tokens", c->prompt_tokens);
        cJSON_AddNumberToObject(e, "needle_position", c->needle_pos);
        cJSON_AddNumberToObject(e, "needle_tokens", c->needle_tokens);
        /* a cell the full cache fails measures the model, not the policy */
        cJSON_AddBoolToObject(e, "measures_model", !c->full.correct);
        cJSON_AddItemToObject(e, "full", tsr__answer_json(&c->full));
        /* null: not run where the full cache fails (--skip-where-full-fails) */
        cJSON_AddItemToObject(e, "policy", c->policy_ran ? tsr__answer_json(&c->policy)
                                                         : cJSON_CreateNull());
        cJSON_AddItemToArray(cells, e);
        full_ok += c->full.correct;
        pol_ok += c->policy_ran && c->policy.correct;
        ran += c->policy_ran;
        both += c->full.correct && c->policy.correct;
    }
    double n = r->n_cells > 0 ? r->n_cells : 1;
    cJSON_AddNumberToObject(d, "full_accuracy", full_ok / n);
    /* over the depths where the policy ran */
    if (ran > 0) cJSON_AddNumberToObject(d, "accuracy", (double)pol_ok / ran);
    else cJSON_AddNullToObject(d, "accuracy");
    /* the policy's accuracy where the full cache passes: what the policy loses */
    if (full_ok > 0)
        cJSON_AddNumberToObject(d, "accuracy_where_full_passes", (double)both / full_ok);
    else
        cJSON_AddNullToObject(d, "accuracy_where_full_passes");
    cJSON_AddItemToObject(d, "cells", cells);
    cJSON_AddNumberToObject(d, "wall_s", r->wall_s);
    cJSON_AddStringToObject(d, "reference", r->reference ? r->reference : "none");
    cJSON_AddBoolToObject(d, "policy_is_full", r->policy_is_full);
    cJSON *kv = r->kv_json[0] ? cJSON_Parse(r->kv_json) : NULL;
    if (kv) cJSON_AddItemToObject(d, "kv", kv);
    return tsr_cli_write_json(d, o->json);
}

/* "0,25,50,75,100" (percent) into fractions. */
static int tsr__depths(const char *s, double *out, int cap) {
    int n = 0;
    while (*s) {
        char *end = NULL;
        double v = strtod(s, &end);
        if (end == s || v < 0 || v > 100 || n == cap) return -1;
        out[n++] = v / 100.0;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static tsr_status tsr__needle(const tsr__nd_opts *o, const double *depths, int n_depths) {
    char *hay = NULL;
    size_t len = 0;
    TSR_TRY(tsr_file_read(o->haystack, "haystack", 0, &hay, &len));
    tsr_needle_options no = {.backend = o->backend, .threads = o->threads, .kv = o->kv.kv,
                             .chunk_tokens = o->chunk, .length = o->length,
                             .n_depths = n_depths, .needles = o->needles,
                             .answer_tokens = o->answer_tokens, .ref_dir = o->ref_dir,
                             .skip_where_full_fails = o->skip_failed};
    no.kv.max_context = o->max_context;
    memcpy(no.depths, depths, (size_t)n_depths * sizeof *depths);
    tsr_engine_spec spec = {.model_path = o->model, .load_tokenizer = true};
    tsr_engine_spec_dtype(&spec, o->dtype); /* both caches run on the converted matrices */
    tsr_needle_result r;
    tsr_status st = tsr_needle_run(&spec, hay, len, &no, &r);
    tsr_free(hay);
    if (st == TSR_OK) st = tsr__write(o, &r);
    if (st == TSR_OK && !o->quiet) {
        fprintf(stderr, "tessera needle: %s, %d tokens, %d needle%s:", r.policy, o->length,
                o->needles, o->needles > 1 ? "s" : "");
        for (int i = 0; i < r.n_cells; i++)
            fprintf(stderr, " %g%% full %s policy %s (recall %.2f);", r.cells[i].depth * 100,
                    r.cells[i].full.correct ? "ok" : "FAIL",
                    !r.cells[i].policy_ran ? "not run" : r.cells[i].policy.correct ? "ok" : "FAIL",
                    r.cells[i].policy.attention_recall);
        fprintf(stderr, " (%.1f s; full cache: %s)\n", r.wall_s,
                r.policy_is_full ? "the policy itself" : r.reference);
    }
    return st;
}

int tsr_cmd_needle(int argc, char **argv) {
    tsr__nd_opts o = {.threads = tsr_sys_cpus(), .backend = "auto", .chunk = 256,
                      .length = 1024, .needles = 1, .depths = "0,25,50,75,100"};
    tsr_kv_cli_init(&o.kv);
    tsr_cli_opt base[] = {
        {"model", TSR_OPT_STRING, &o.model, "PATH",
         "an instruct model with a chat template (GGUF or Hugging Face directory; required)",
         false},
        {"haystack", TSR_OPT_STRING, &o.haystack, "FILE",
         "real text the needle hides in, cycled when short (required)", false},
        {"length", TSR_OPT_INT, &o.length, "N",
         "prompt tokens, chat template and question included", false},
        {"depths", TSR_OPT_STRING, &o.depths, "LIST",
         "where the asked needle goes, percent of the haystack, comma separated", false},
        {"needles", TSR_OPT_INT, &o.needles, "N",
         "1 (one pass key) or 3 (three doors' keys, asked for the blue door's)", false},
        {"answer-tokens", TSR_OPT_INT, &o.answer_tokens, "N",
         "greedy answer tokens at most (0 = 16)", false},
        {"max-context", TSR_OPT_INT, &o.max_context, "N",
         "context length in tokens (0 = the model's maximum)", false},
        {"chunk", TSR_OPT_INT, &o.chunk, "N", "prefill chunk, tokens", false},
        {"dtype", TSR_OPT_STRING, &o.dtype, TSR_CLI_DTYPE_VALUES, TSR_CLI_DTYPE_HELP, false},
        {"threads", TSR_OPT_INT, &o.threads, "N", "CPU threads", false},
        {"backend", TSR_OPT_STRING, &o.backend, "NAME", tsr_backend_names(), false},
        {"json", TSR_OPT_STRING, &o.json, "OUT.json", "write the result here (default: stdout)",
         false},
        {"reference-dir", TSR_OPT_STRING, &o.ref_dir, "DIR",
         "keep the prompts and the full cache's answers in DIR and reuse them when the same "
         "model, haystack and options come again (a study's policies share one; the full "
         "cache is then not run)", false},
        {"skip-where-full-fails", TSR_OPT_FLAG, &o.skip_failed, NULL,
         "do not run the policy at a depth where the full cache fails (that depth measures "
         "the model; its policy answer is null)", false},
        {"quiet", TSR_OPT_FLAG, &o.quiet, NULL, "no summary line on stderr", false},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    tsr_cli_opt opts[N_BASE + TSR_KV_CLI_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_kv = tsr_kv_cli_opts(&o.kv, opts + N_BASE);
    tsr_cli cli = {
        .cmd = "needle",
        .synopsis = "--model PATH --haystack FILE [--length N] [--depths LIST] [--needles 1|3] "
                    "[--kv-policy P ...] [--json OUT.json]",
        .about =
            "Plants \"The pass key is 71432. Remember it.\" at each depth of a real-text "
            "haystack,\n"
            "asks for it through the model's chat template and answers greedily, with the "
            "full\n"
            "cache (paged) and with the cache of --kv-policy on the same prompt. Exact match: "
            "the\n"
            "first number of the answer is the key. JSON: per depth the full cache's and the\n"
            "policy's answers, whether each is correct, the policy's attention recall of the\n"
            "needle's tokens, and measures_model (the full cache failed: the cell measures "
            "the\n"
            "model, not the policy); full_accuracy, accuracy, accuracy_where_full_passes. "
            "Exit\nstatus 0 on success, 1 when the run fails, 2 on usage errors.",
        .opts = opts,
        .n_opts = N_BASE + n_kv};
    tsr_cli_result r = tsr_cli_parse(&cli, argc, argv);
    if (r == TSR_CLI_HELP) return 0;
    if (r != TSR_CLI_OK) return 2;
    if (!o.model || !o.haystack)
        return tsr_cli_usage_error(&cli, "--model and --haystack are required");
    if (o.length < 16) return tsr_cli_usage_error(&cli, "--length must be >= 16");
    if (o.needles != 1 && o.needles != 3)
        return tsr_cli_usage_error(&cli, "--needles must be 1 or 3");
    if (o.answer_tokens < 0 || o.max_context < 0)
        return tsr_cli_usage_error(&cli, "--answer-tokens and --max-context must be >= 0");
    if (o.chunk < 1) return tsr_cli_usage_error(&cli, "--chunk must be >= 1");
    double depths[TSR_NEEDLE_MAX_DEPTHS];
    int n_depths = tsr__depths(o.depths, depths, TSR_NEEDLE_MAX_DEPTHS);
    if (n_depths < 1)
        return tsr_cli_usage_error(&cli, "--depths: 1 to %d percentages in [0, 100], comma "
                                         "separated", TSR_NEEDLE_MAX_DEPTHS);
    if (tsr_cli_check_threads(&cli, o.threads) != TSR_CLI_OK) return 2;
    if (tsr_cli_check_dtype(&cli, o.dtype) != TSR_CLI_OK) return 2;
    o.kv.quiet = o.quiet;
    if (tsr_kv_cli_check(&cli, &o.kv) != TSR_CLI_OK) return 2;
    if (tsr__needle(&o, depths, n_depths) != TSR_OK) return tsr_cmd_fail("needle");
    return 0;
}
