/* Needle retrieval on an instruct model (runtime/eval/needle.h). */
#include "runtime/eval/needle.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "policies/policy.h"
#include "runtime/eval/fidelity.h"
#include "runtime/eval/fullref.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

bool tsr_needle_match(const char *answer, const char *key) {
    const char *p = answer;
    while (*p && !isdigit((unsigned char)*p)) p++;
    size_t n = 0;
    while (isdigit((unsigned char)p[n])) n++;
    return n > 0 && n == strlen(key) && strncmp(p, key, n) == 0;
}

static const char *const tsr__keys[3] = {"58316", "71432", "90274"};
static const char *const tsr__doors[3] = {"red", "blue", "green"};

typedef struct tsr__nd {
    const tsr_needle_options *o;
    tsr_engine *full, *pol;
    const tsr_tokenizer *tok;
    tsr_chat_template tmpl;
    float *logits;
    int V, ctx, chunk;
    char *hay; /* the haystack, cycled to enough characters */
    size_t hay_len;
} tsr__nd;

/* The asked needle: the only one, or the blue door's (index 1). */
static void tsr__needle_text(int needles, int i, char *buf, size_t cap) {
    if (needles == 1)
        snprintf(buf, cap, "The pass key is %s. Remember it.", tsr__keys[1]);
    else
        snprintf(buf, cap, "The pass key of the %s door is %s. Remember it.", tsr__doors[i],
                 tsr__keys[i]);
}

/* A place at most 300 characters before `at` where a sentence or line starts, so that the
 * needle does not split a word; `at` itself when there is none. */
static size_t tsr__snap(const char *s, size_t at) {
    for (size_t k = at, lim = at > 300 ? at - 300 : 0; k > lim; k--)
        if (s[k - 1] == '\n' || (k >= 2 && s[k - 2] == '.' && s[k - 1] == ' ')) return k;
    return at;
}

/* The rendered prompt with the first `chars` characters of the haystack, the needles at
 * their depths; *needle_at: the asked needle's character offset in it. */
static tsr_status tsr__render(tsr__nd *d, size_t chars, double depth, char **out, size_t *len,
                              size_t *needle_at, size_t *needle_len) {
    int nn = d->o->needles;
    size_t at[3];
    int order[3] = {0, 1, 2};
    char nt[3][96];
    for (int i = 0; i < nn; i++) {
        int which = nn == 1 ? 1 : i;
        /* the asked one (1) at depth, the others a third and two thirds further */
        double dep = nn == 1 ? depth : fmod(depth + (double)((i - 1 + 3) % 3) / 3.0, 1.0 + 1e-9);
        at[i] = tsr__snap(d->hay, (size_t)(dep * (double)chars + 0.5) < chars
                                      ? (size_t)(dep * (double)chars + 0.5)
                                      : chars);
        tsr__needle_text(nn, which, nt[i], sizeof nt[i]);
    }
    for (int i = 0; i < nn; i++) /* insertion order by position */
        for (int j = i + 1; j < nn; j++)
            if (at[order[j]] < at[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    char q[160];
    if (nn == 1)
        snprintf(q, sizeof q, "\n\nWhat is the pass key? Answer with the number only.");
    else
        snprintf(q, sizeof q, "\n\nWhat is the pass key of the blue door? Answer with the "
                              "number only.");
    size_t cap = chars + sizeof nt + sizeof q + 16;
    char *c = tsr_malloc(cap);
    if (!c) return TSR_ERR_NOMEM;
    size_t n = 0, from = 0, asked_in_content = 0;
    for (int k = 0; k < nn; k++) {
        int i = order[k];
        memcpy(c + n, d->hay + from, at[i] - from);
        n += at[i] - from;
        from = at[i];
        if (n > 0 && c[n - 1] != '\n' && c[n - 1] != ' ') c[n++] = ' ';
        if ((nn == 1 ? 1 : i) == 1) asked_in_content = n;
        size_t l = strlen(nt[i]);
        memcpy(c + n, nt[i], l);
        n += l;
        c[n++] = ' ';
    }
    memcpy(c + n, d->hay + from, chars - from);
    n += chars - from;
    memcpy(c + n, q, strlen(q) + 1);
    n += strlen(q);
    tsr_chat_message msg = {.role = "user", .content = c};
    tsr_chat_opts co = {.add_generation_prompt = true, .now = 0};
    tsr_status st = tsr_chat_render_opts(&d->tmpl, &msg, 1, &co, out, len);
    if (st == TSR_OK) {
        /* the content appears once, verbatim, in the rendered text */
        const char *p = strstr(*out, c);
        *needle_at = p ? (size_t)(p - *out) + asked_in_content : 0;
        *needle_len = strlen(nt[nn == 1 ? 0 : 1]);
        if (!p) st = tsr_error_set(TSR_ERR_INVALID, "needle: the chat template changed the "
                                                    "user message; the needle cannot be found");
    }
    tsr_free(c);
    return st;
}

static tsr_status tsr__count(const tsr__nd *d, const char *s, size_t n, size_t *count) {
    int32_t *ids = NULL;
    TSR_TRY(tsr_tokenizer_encode(d->tok, s, n, false, false, &ids, count));
    tsr_free(ids);
    return TSR_OK;
}

/* The prompt of at most o->length tokens with the most haystack: a binary search on the
 * haystack's characters (the template and the needles are fixed). */
static tsr_status tsr__prompt(tsr__nd *d, double depth, int32_t **ids, size_t *n_ids,
                              int *needle_pos, int *needle_n) {
    size_t lo = 0, hi = d->hay_len, best = 0;
    tsr_status st = TSR_OK;
    while (st == TSR_OK && lo <= hi) {
        size_t mid = lo + (hi - lo) / 2, len = 0, at = 0, nl = 0, cnt = 0;
        char *r = NULL;
        st = tsr__render(d, mid, depth, &r, &len, &at, &nl);
        if (st == TSR_OK) st = tsr__count(d, r, len, &cnt);
        tsr_free(r);
        if (st != TSR_OK) break;
        if (cnt <= (size_t)d->o->length) {
            best = mid;
            lo = mid + 1;
        } else {
            if (mid == 0) break;
            hi = mid - 1;
        }
    }
    char *r = NULL;
    size_t len = 0, at = 0, nl = 0, before = 0, through = 0;
    if (st == TSR_OK) st = tsr__render(d, best, depth, &r, &len, &at, &nl);
    if (st == TSR_OK) st = tsr_tokenizer_encode(d->tok, r, len, false, false, ids, n_ids);
    if (st == TSR_OK) st = tsr__count(d, r, at, &before);
    if (st == TSR_OK) st = tsr__count(d, r, at + nl, &through);
    tsr_free(r);
    *needle_pos = (int)before;
    *needle_n = (int)(through - before);
    return st;
}

static tsr_status tsr__feed(tsr_engine *e, const int32_t *ids, int32_t n, float *logits) {
    int rows = 0;
    tsr_batch_seq b = {.seq = 0, .tokens = ids, .n_tokens = n, .want_logits = true};
    return tsr_forward_run(e->fwd, e->kv, &b, 1, logits, &rows);
}

static int32_t tsr__argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One cache answers the prompt: chunked prefill, recall, greedy answer. */
static tsr_status tsr__answer(tsr__nd *d, tsr_engine *e, const int32_t *ids, int32_t n,
                              int needle_pos, int needle_n, tsr_needle_answer *a) {
    tsr_kv_cache *kv = e->kv;
    TSR_TRY(kv->ops->seq_add(kv, 0));
    tsr_status st = TSR_OK;
    for (int32_t at = 0; st == TSR_OK && at < n; at += d->chunk) {
        int32_t k = n - at < d->chunk ? n - at : d->chunk;
        st = tsr__feed(e, ids + at, k, d->logits);
    }
    int64_t hit = 0, total = 0;
    if (st == TSR_OK) st = tsr_fidelity_resident(kv, needle_pos, needle_n, &hit, &total);
    a->attention_recall = total > 0 ? (double)hit / (double)total : 0.0;
    int max = d->o->answer_tokens > 0 ? d->o->answer_tokens : 16;
    size_t tl = 0;
    int32_t prev = -1;
    for (int i = 0; st == TSR_OK && i < max && n + i < d->ctx; i++) {
        int32_t next = tsr__argmax(d->logits, d->V);
        if (tsr_tokenizer_is_eos(d->tok, next)) break;
        char b[64];
        int w = tsr_tokenizer_decode(d->tok, prev, next, b, sizeof b);
        if (w > 0 && tl + (size_t)w < sizeof a->text) {
            memcpy(a->text + tl, b, (size_t)w);
            tl += (size_t)w;
        }
        prev = next;
        if (i + 1 < max) st = tsr__feed(e, &next, 1, d->logits);
    }
    a->text[tl] = '\0';
    kv->ops->seq_free(kv, 0);
    return st;
}

static tsr_status tsr__engine_pol(tsr__nd *d, const tsr_engine_spec *model) {
    const tsr_needle_options *o = d->o;
    tsr_engine_spec eo = *model;
    eo.backend = o->backend ? o->backend : "cpu";
    eo.threads = o->threads > 0 ? o->threads : 1;
    eo.max_tokens = o->chunk_tokens > 0 ? o->chunk_tokens : 256;
    eo.one_sequence = true;
    eo.load_tokenizer = true;
    eo.kv = o->kv;
    eo.kv.max_seqs = 1;
    TSR_TRY(tsr_engine_create(&eo, &d->pol));
    d->V = d->pol->model->cfg.vocab_size;
    d->ctx = d->pol->ctx;
    d->chunk = d->pol->max_tokens;
    d->tok = d->pol->tok;
    return TSR_OK;
}

/* The full cache: the same pool, blocks and context, nothing a policy adds. */
static tsr_status tsr__engine_full(tsr__nd *d) {
    const tsr_needle_options *o = d->o;
    const tsr_kv_options *k = &o->kv;
    tsr_engine_spec eo = {.model = d->pol->model, .borrow_model = true,
                          .backend = o->backend ? o->backend : "cpu", .threads = d->pol->threads,
                          .max_tokens = d->chunk};
    eo.kv = (tsr_kv_options){.policy = &tsr_kv_policy_paged, .memory_bytes = k->memory_bytes,
                             .memory_fraction = k->memory_fraction,
                             .block_size = k->block_size, .max_seqs = 1,
                             .host_bytes = k->host_bytes, .chunk_tokens = d->chunk,
                             .max_context = d->ctx};
    return tsr_engine_create(&eo, &d->full);
}

/* One depth of the reference payload; the prompt's ids follow it. */
typedef struct tsr__nd_ref {
    int32_t prompt_n, needle_pos, needle_n, correct;
    double recall;
    char text[96];
} tsr__nd_ref;

static tsr_status tsr__ref_key(const tsr__nd *d, const tsr_engine_spec *model,
                               const char *haystack, size_t len, tsr_fullref_key *k) {
    const tsr_needle_options *o = d->o;
    tsr_fullref_key_init(k, "needle");
    TSR_TRY(tsr_fullref_key_file(k, "model", model->model_path));
    if (model->tokenizer_path) TSR_TRY(tsr_fullref_key_file(k, "tokenizer", model->tokenizer_path));
    else tsr_fullref_key_add(k, "tokenizer", "the model's");
    tsr_fullref_key_bytes(k, "haystack", haystack, len);
    char dl[TSR_NEEDLE_MAX_DEPTHS * 26] = "";
    size_t l = 0;
    for (int i = 0; i < o->n_depths && l < sizeof dl; i++)
        l += (size_t)snprintf(dl + l, sizeof dl - l, "%s%.17g", i ? "," : "", o->depths[i]);
    tsr_fullref_key_add(k, "prompt", "length=%d needles=%d depths=%s answer_tokens=%d",
                        o->length, o->needles, dl, o->answer_tokens > 0 ? o->answer_tokens : 16);
    tsr_fullref_key_add(k, "engine", "backend=%s threads=%d chunk=%d ctx=%d vocab=%d",
                        d->pol->be->ops->name, d->pol->threads, d->chunk, d->ctx, d->V);
    /* what the matrices ran in: a run quantized at load (--dtype) computes other logits */
    tsr_fullref_key_add(k, "weights", "dtype=%s", tsr_dtype_name(d->pol->model->cfg.dtype));
    tsr_fullref_key_add(k, "kv", "block_size=%d dtype=default", o->kv.block_size);
    tsr_fullref_key_exe(k);
    return TSR_OK;
}

/* Parses a reference payload into per-depth entries and prompts (pointers into data);
 * false when its shape is not n_depths entries. */
static bool tsr__ref_parse(const char *data, size_t len, int n_depths, tsr__nd_ref *e,
                           const int32_t **ids) {
    size_t at = 0;
    for (int i = 0; i < n_depths; i++) {
        if (len - at < sizeof *e) return false;
        memcpy(&e[i], data + at, sizeof *e);
        at += sizeof *e;
        size_t b = (size_t)(e[i].prompt_n > 0 ? e[i].prompt_n : 0) * sizeof(int32_t);
        if (e[i].prompt_n <= 0 || len - at < b || e[i].text[sizeof e[i].text - 1] != '\0')
            return false;
        ids[i] = (const int32_t *)(const void *)(data + at);
        at += b;
    }
    return at == len;
}

tsr_status tsr_needle_run(const tsr_engine_spec *model, const char *haystack, size_t len,
                          const tsr_needle_options *o, tsr_needle_result *out) {
    memset(out, 0, sizeof *out);
    double t0 = tsr_sys_now();
    if (o->needles != 1 && o->needles != 3)
        return tsr_error_set(TSR_ERR_INVALID, "needle: needles must be 1 or 3, not %d",
                             o->needles);
    if (o->n_depths < 1 || o->n_depths > TSR_NEEDLE_MAX_DEPTHS)
        return tsr_error_set(TSR_ERR_INVALID, "needle: 1 to %d depths", TSR_NEEDLE_MAX_DEPTHS);
    if (len == 0) return tsr_error_set(TSR_ERR_INVALID, "needle: the haystack is empty");
    tsr__nd d = {.o = o};
    TSR_TRY(tsr_model_chat_template(model->model_path, &d.tmpl));
    tsr_status st = TSR_OK;
    if (d.tmpl.kind == TSR_CHAT_NONE)
        st = tsr_error_set(TSR_ERR_INVALID, "needle: %s has no chat template (the question is "
                           "asked through it)", model->model_path ? model->model_path : "model");
    if (st == TSR_OK) st = tsr__engine_pol(&d, model);
    if (st == TSR_OK && o->length + (o->answer_tokens > 0 ? o->answer_tokens : 16) > d.ctx)
        st = tsr_error_set(TSR_ERR_BUDGET, "needle: a %d-token prompt and its answer exceed the "
                           "context of %d tokens", o->length, d.ctx);
    if (st == TSR_OK) {
        /* the haystack cycled to 8 characters a prompt token: more than any tokenizer's
         * characters per token on prose or code */
        d.hay_len = (size_t)o->length * 8;
        d.hay = tsr_malloc(d.hay_len + 1);
        d.logits = tsr_malloc((size_t)d.V * sizeof *d.logits);
        if (!d.hay || !d.logits) st = TSR_ERR_NOMEM;
        for (size_t i = 0; st == TSR_OK && i < d.hay_len; i += len)
            memcpy(d.hay + i, haystack, d.hay_len - i < len ? d.hay_len - i : len);
        if (d.hay) d.hay[d.hay_len] = '\0';
    }
    if (st == TSR_OK) {
        out->policy = tsr_kv_policy_name(d.pol->kv);
        out->dtype = tsr_dtype_name(d.pol->model->cfg.dtype);
        out->key = tsr__keys[1];
    }
    /* the policy is the full cache: paged, with the full cache's KV dtype */
    out->policy_is_full = st == TSR_OK && o->kv.policy == &tsr_kv_policy_paged && !o->kv.kv_dtype;
    /* the full cache's side from a reference when one is kept */
    tsr_fullref_key key;
    bool use_ref = st == TSR_OK && o->ref_dir && model->model_path;
    void *ref = NULL;
    size_t ref_len = 0;
    tsr__nd_ref ent[TSR_NEEDLE_MAX_DEPTHS];
    const int32_t *ref_ids[TSR_NEEDLE_MAX_DEPTHS];
    bool replay = false;
    if (use_ref) st = tsr__ref_key(&d, model, haystack, len, &key);
    const char *why = use_ref && st == TSR_OK ? tsr_fullref_key_unusable(&key) : NULL;
    if (why) {
        /* say so rather than report a reference that was never written */
        fprintf(stderr, "tessera needle: --reference-dir %s: nothing kept: %s\n", o->ref_dir,
                why);
        use_ref = false;
    }
    if (use_ref && st == TSR_OK) st = tsr_fullref_load(o->ref_dir, &key, &ref, &ref_len);
    if (st == TSR_OK && ref) {
        replay = tsr__ref_parse(ref, ref_len, o->n_depths, ent, ref_ids);
        if (!replay)
            fprintf(stderr, "tessera needle: the full cache's reference in %s has the wrong "
                            "shape; computing it anew\n", o->ref_dir);
    }
    if (st == TSR_OK && !replay && !out->policy_is_full) st = tsr__engine_full(&d);
    /* the reference being written: each depth's entry and prompt */
    char *rec = NULL;
    size_t rec_len = 0;
    for (int i = 0; st == TSR_OK && i < o->n_depths; i++) {
        tsr_needle_cell *c = &out->cells[i];
        int32_t *ids = NULL;
        size_t n = 0;
        c->depth = o->depths[i];
        if (replay) {
            /* the prompt and the full cache's answer as recorded */
            n = (size_t)ent[i].prompt_n;
            ids = tsr_malloc(n * sizeof *ids);
            if (!ids) st = TSR_ERR_NOMEM;
            else memcpy(ids, ref_ids[i], n * sizeof *ids);
            c->needle_pos = ent[i].needle_pos;
            c->needle_tokens = ent[i].needle_n;
            c->full.correct = ent[i].correct != 0;
            c->full.attention_recall = ent[i].recall;
            memcpy(c->full.text, ent[i].text, sizeof c->full.text);
        } else {
            st = tsr__prompt(&d, o->depths[i], &ids, &n, &c->needle_pos, &c->needle_tokens);
            if (st == TSR_OK)
                st = tsr__answer(&d, out->policy_is_full ? d.pol : d.full, ids, (int32_t)n,
                                 c->needle_pos, c->needle_tokens, &c->full);
            c->full.correct = tsr_needle_match(c->full.text, out->key);
        }
        c->prompt_tokens = (int)n;
        c->policy_ran = st == TSR_OK && (c->full.correct || !o->skip_where_full_fails);
        if (c->policy_ran && out->policy_is_full) c->policy = c->full;
        else if (c->policy_ran)
            st = tsr__answer(&d, d.pol, ids, (int32_t)n, c->needle_pos, c->needle_tokens,
                             &c->policy);
        c->policy.correct = c->policy_ran && tsr_needle_match(c->policy.text, out->key);
        if (st == TSR_OK && use_ref && !replay) {
            tsr__nd_ref e = {.prompt_n = (int32_t)n, .needle_pos = c->needle_pos,
                             .needle_n = c->needle_tokens, .correct = c->full.correct,
                             .recall = c->full.attention_recall};
            memcpy(e.text, c->full.text, sizeof e.text);
            e.text[sizeof e.text - 1] = '\0';
            char *r = tsr_realloc(rec, rec_len + sizeof e + n * sizeof *ids);
            if (!r) {
                st = TSR_ERR_NOMEM;
            } else {
                rec = r;
                memcpy(rec + rec_len, &e, sizeof e);
                memcpy(rec + rec_len + sizeof e, ids, n * sizeof *ids);
                rec_len += sizeof e + n * sizeof *ids;
            }
        }
        tsr_free(ids);
        out->n_cells = i + 1;
    }
    if (st == TSR_OK && use_ref && !replay) st = tsr_fullref_save(o->ref_dir, &key, rec, rec_len);
    out->reference = replay ? "reused" : use_ref ? "computed" : "none";
    tsr_free(rec);
    tsr_free(ref);
    if (st == TSR_OK) tsr_kv_stats_json(d.pol->kv, out->kv_json, sizeof out->kv_json);
    tsr_free(d.hay);
    tsr_free(d.logits);
    tsr_engine_destroy(d.full);
    tsr_engine_destroy(d.pol);
    tsr_chat_template_free(&d.tmpl);
    out->wall_s = tsr_sys_now() - t0;
    return st;
}
