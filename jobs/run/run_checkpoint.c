/* `tessera run --checkpoint` (jobs/run/run_job.h): the glue between the job's state and the
 * HDF5 checkpoint (jobs/run/checkpoint.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"
#include "jobs/run/checkpoint.h"
#include "jobs/run/run_job.h"
#include "memory/kv_dist.h"
#include "policies/policy.h"
#include "runtime/text/tokenizer.h"

static int tsr__cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

bool tsr_run_ckpt_resumed(const tsr_run_job *g, int64_t line) {
    return g->n_ck_lines > 0 &&
           bsearch(&line, g->ck_lines, (size_t)g->n_ck_lines, sizeof line, tsr__cmp_i64);
}

/* Strings are hashed with their length, so ("ab", "c") and ("a", "bc") differ; NULL is not
 * "". */
static uint64_t tsr__hstr(uint64_t h, const char *s) {
    int64_t present = s != NULL;
    h = tsr_ckpt_hash(h, &present, sizeof present);
    return s ? tsr_ckpt_hash(h, s, strlen(s)) : h;
}

static uint64_t tsr__hval(uint64_t h, const void *v, size_t n) { return tsr_ckpt_hash(h, v, n); }

uint64_t tsr_run_req_body_hash(const tsr_batch_request *r) {
    uint64_t h = 0x626f6479ull;
    h = tsr__hstr(h, r->custom_id);
    int64_t ints[] = {r->kind, r->n_messages, r->max_tokens, r->has_seed,
                      r->has_seed ? (int64_t)r->seed : 0, r->n_stops};
    h = tsr__hval(h, ints, sizeof ints);
    float fl[] = {r->temperature, r->top_p};
    h = tsr__hval(h, fl, sizeof fl);
    h = tsr__hstr(h, r->prompt);
    for (int i = 0; i < r->n_messages; i++) {
        h = tsr__hstr(h, r->messages[i].role);
        h = tsr__hstr(h, r->messages[i].content);
    }
    for (int i = 0; i < r->n_stops; i++) h = tsr__hstr(h, r->stops[i]);
    if (r->force_call) h = tsr__hstr(h, r->force_name ? r->force_name : "tool_choice=required");
    return h;
}

void tsr_run_ckpt_model_loaded(void *ctx, const tsr_model *m) {
    tsr_run_job *g = ctx;
    tsr_ckpt_model_identity(m, &g->ck_model_config, &g->ck_model_tensors,
                            &g->ck_model_weights);
    g->ck_model_done = true;
}

/* The model's and the tokenizer's identity, once per job. The model's was taken of the
 * whole model as loaded (tsr_run_ckpt_model_loaded, before the engine cut it to this
 * rank's shard), so that it is the same on every layout. */
static tsr_status tsr__ckpt_identity(tsr_run_job *g) {
    if (g->ck_id_done) return TSR_OK;
    if (!g->ck_model_done)
        return tsr_error_set(TSR_ERR_INVALID, "checkpoint: the model's identity was not taken "
                             "at load");
    if (g->o->tokenizer)
        snprintf(g->ck_tokenizer, sizeof g->ck_tokenizer, "%s", g->o->tokenizer);
    else
        TSR_TRY(tsr_tokenizer_find(g->o->model, g->model->cfg.vocab_size, g->ck_tokenizer,
                                   sizeof g->ck_tokenizer));
    uint64_t h = 0;
    TSR_TRY(tsr_ckpt_file_hash(g->ck_tokenizer, &h));
    /* The chat template renders chat prompts: part of what the tokens mean. */
    int64_t kind = g->chat.kind;
    h = tsr__hval(h, &kind, sizeof kind);
    h = tsr__hval(h, &g->chat.source_hash, sizeof g->chat.source_hash);
    g->ck_tokenizer_id = tsr__hstr(h, g->chat.bos);
    g->ck_id_done = true;
    return TSR_OK;
}

/* What a checkpoint of this job records and a resumed one must match. */
static tsr_status tsr__ckpt_meta(tsr_run_job *g, int64_t records, tsr_ckpt_meta *m) {
    TSR_TRY(tsr__ckpt_identity(g));
    const tsr_model_config *c = &g->model->cfg;
    tsr_kv_cache *mech = tsr_ckpt_kv_mech(g->kv);
    bool multi = g->dist->world > 1;
    /* The layout is recorded (tp, pp, world) for `tessera checkpoint inspect`, not checked;
     * the KV is the model's whole (kv_layers x kv_dim), whichever part this rank holds. */
    *m = (tsr_ckpt_meta){.format_version = TSR_CKPT_VERSION, .dim = c->dim,
                         .n_layers = c->n_layers, .n_heads = c->n_heads,
                         .n_kv_heads = c->n_kv_heads, .vocab_size = c->vocab_size,
                         .model_config = g->ck_model_config,
                         .model_tensors = g->ck_model_tensors,
                         .model_weights = g->ck_model_weights,
                         .tokenizer_id = g->ck_tokenizer_id,
                         .block_size = mech ? tsr_kv_block_size(mech) : 0,
                         .tp = multi ? tsr_comm_size(g->dist->comm, TSR_COMM_TP) : 1,
                         .pp = multi ? tsr_comm_size(g->dist->comm, TSR_COMM_PP) : 1,
                         .rank = 0, .world = multi ? g->dist->world : 1,
                         .max_batch_seqs = g->o->max_batch_seqs, .max_context = g->ctx,
                         .no_bos = g->o->no_bos, .seed = g->o->seed,
                         .kv_layers = c->n_layers, .kv_dim = c->n_kv_heads * c->head_dim,
                         .output_records = records};
    snprintf(m->model, sizeof m->model, "%s", g->o->model);
    snprintf(m->dtype, sizeof m->dtype, "%s", tsr_dtype_name(c->dtype));
    snprintf(m->tokenizer, sizeof m->tokenizer, "%.1023s", g->ck_tokenizer);
    tsr_kv_detail d;
    tsr_kv_cache_detail(g->kv, &d);
    snprintf(m->policy, sizeof m->policy, "%s", d.policy);
    /* The options that change the rows a policy keeps (the pool size changes only when
     * requests run, not their tokens): all of the policy's declared options and its budget,
     * as the registry writes them. */
    snprintf(m->policy_options, sizeof m->policy_options, "%s",
             d.policy_options ? d.policy_options : "none");
    snprintf(m->output, sizeof m->output, "%s", g->o->output);
    return TSR_OK;
}

/* The part of the model's KV this rank holds (its shard), and the job's ranks. */
static tsr_ckpt_part tsr__ckpt_part(const tsr_run_job *g) {
    const tsr_model_config *c = &g->model->cfg;
    if (g->dist->world <= 1)
        return (tsr_ckpt_part){.layer_begin = 0, .layer_end = c->n_layers, .kv_head_begin = 0,
                               .kv_head_end = c->n_kv_heads, .head_owner = true};
    const tsr_parallel_shard *s = &g->dist->shard;
    return (tsr_ckpt_part){.comm = g->dist->comm, .layer_begin = s->layer_begin,
                           .layer_end = s->layer_end, .kv_head_begin = s->kv_head_begin,
                           .kv_head_end = s->kv_head_end,
                           .head_owner = s->tp_rank == s->kv_share_begin};
}

/* Collective: every request the scheduler holds, with the KV of the running ones, each
 * rank its part, into one file. */
tsr_status tsr_run_ckpt_save(tsr_run_job *g, int *n_saved) {
    tsr_ckpt ck = {0};
    *n_saved = 0;
    tsr_status st0 = tsr__ckpt_meta(g, g->resume.n_records + g->records_this_run, &ck.meta);
    tsr_kv_cache *mech = tsr_ckpt_kv_mech(g->kv);
    if (st0 == TSR_OK && !mech)
        st0 = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: the KV cache is not paged", g->ck_path);
    TSR_TRY(tsr_dist_agree(g->dist, st0));
    int n = tsr_sched_n_requests(g->sched);
    tsr_sched_saved *sv = tsr_calloc((size_t)(n ? n : 1), sizeof *sv);
    ck.reqs = tsr_calloc((size_t)(n ? n : 1), sizeof *ck.reqs);
    tsr_status st = sv && ck.reqs ? TSR_OK : TSR_ERR_NOMEM;
    if (st == TSR_OK) tsr_sched_export(g->sched, sv);
    for (int i = 0; i < n && st == TSR_OK; i++) {
        tsr_ckpt_req *r = &ck.reqs[i];
        const tsr_run_req *q = &g->reqs[sv[i].tag];
        TSR_ASSERT(sv[i].tag < (uint64_t)g->n_reqs && q->used);
        r->s = sv[i];
        r->custom_id = q->custom_id;
        r->line = q->line;
        r->body_hash = q->body_hash;
        r->kind = (int)q->kind;
        for (int j = 0; j < q->n_stops; j++) r->stops[j] = q->stops[j];
        r->n_stops = q->n_stops;
        r->text = q->text;
        r->len = q->len;
        r->prev = q->prev;
        r->n_prompt = q->n_prompt;
        r->n_gen = q->n_gen;
        r->has_kv = sv[i].slot >= 0;
        ck.n_reqs = i + 1;
        if (r->has_kv) st = tsr_kv_export_seq(mech, sv[i].slot, &r->kv);
    }
    /* the export is local: agreed before the collective write */
    st = tsr_dist_agree(g->dist, st);
    tsr_ckpt_part part = tsr__ckpt_part(g);
    if (st == TSR_OK) st = tsr_ckpt_write_part(g->ck_path, &ck, &part);
    for (int i = 0; i < ck.n_reqs; i++) tsr_kv_seq_state_free(&ck.reqs[i].kv);
    tsr_free(ck.reqs);
    tsr_free(sv);
    *n_saved = n;
    return st;
}

static int tsr__cmp_req_line(const void *a, const void *b) {
    const tsr_ckpt_req *x = *(tsr_ckpt_req *const *)a, *y = *(tsr_ckpt_req *const *)b;
    return (x->line > y->line) - (x->line < y->line);
}

/* How a request is named in messages: its custom_id, else its line. */
static const char *tsr__req_name(const tsr_ckpt_req *r, char *buf, size_t cap) {
    if (r->custom_id) snprintf(buf, cap, "%s", r->custom_id);
    else snprintf(buf, cap, "of line %lld", (long long)r->line);
    return buf;
}

/* Every checkpointed request against this job's input line of the same number: the same
 * custom_id and the same body (tsr_run_req_body_hash), else the checkpoint is another
 * job's. One pass over the input, which is rewound for the job. */
static tsr_status tsr__ckpt_check_input(tsr_run_job *g, const tsr_ckpt *ck) {
    if (ck->n_reqs == 0) return TSR_OK;
    const tsr_ckpt_req **by = tsr_calloc((size_t)ck->n_reqs, sizeof *by);
    if (!by) return TSR_ERR_NOMEM;
    for (int i = 0; i < ck->n_reqs; i++) by[i] = &ck->reqs[i];
    qsort(by, (size_t)ck->n_reqs, sizeof *by, tsr__cmp_req_line);
    char *buf = NULL, name[256];
    size_t cap = 0;
    int64_t line_no = 0;
    uint64_t hash = 0;
    char *id = NULL;       /* the custom_id of line line_no */
    bool parsed = false;   /* line line_no is a valid request */
    tsr_status st = TSR_OK;
    for (int i = 0; i < ck->n_reqs && st == TSR_OK; i++) {
        const tsr_ckpt_req *r = by[i];
        while (line_no < r->line) {
            ssize_t n = getline(&buf, &cap, g->in);
            if (n < 0) break;
            line_no++;
            if (line_no < r->line) continue;
            while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
            tsr_batch_request q;
            tsr_batch_error e;
            tsr_status pst = tsr_batch_parse_line(buf, (size_t)n, line_no, &q, &e);
            parsed = pst == TSR_OK;
            hash = parsed ? tsr_run_req_body_hash(&q) : 0;
            tsr_free(id);
            id = q.custom_id;
            q.custom_id = NULL;
            tsr_batch_request_free(&q);
            if (pst != TSR_OK && pst != TSR_ERR_INVALID) st = pst;
        }
        if (st != TSR_OK) break;
        tsr__req_name(r, name, sizeof name);
        if (line_no < r->line)
            st = tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint request %s is input line %lld, "
                               "this job's input %s has %lld lines", g->ck_path, name,
                               (long long)r->line, g->o->input, (long long)line_no);
        else if (r->custom_id && (!id || strcmp(id, r->custom_id)))
            st = tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint request %s is input line %lld, "
                               "this job's line %lld is %s%s", g->ck_path, name,
                               (long long)r->line, (long long)r->line, id ? "" : "not ",
                               id ? id : "a request with a custom_id");
        else if (!parsed || hash != r->body_hash)
            st = tsr_error_set(TSR_ERR_INVALID, "%s: checkpoint request %s has another body "
                               "than this job's input line %lld", g->ck_path, name,
                               (long long)r->line);
    }
    tsr_free(id);
    free(buf);
    tsr_free(by);
    clearerr(g->in);
    if (fseek(g->in, 0, SEEK_SET) != 0 && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot rewind the input", g->o->input);
    return st;
}

/* Reads the checkpoint (collective: each rank its part of the KV, the same status
 * everywhere) and checks it against the job (local, the same answer on every rank): its
 * identity, its requests against the input, the output's records. */
static tsr_status tsr__ckpt_load(tsr_run_job *g, tsr_ckpt *ck) {
    tsr_ckpt_part part = tsr__ckpt_part(g);
    TSR_TRY(tsr_ckpt_read_part(g->ck_path, &part, ck));
    tsr_ckpt_meta job;
    TSR_TRY(tsr__ckpt_meta(g, g->resume.n_records, &job));
    TSR_TRY(tsr_ckpt_check(g->ck_path, &ck->meta, &job));
    TSR_TRY(tsr__ckpt_check_input(g, ck));
    TSR_TRY(tsr_ckpt_check_records(g->ck_path, &ck->meta, &job));
    tsr_status st = TSR_OK;
    for (int i = 0; i < ck->n_reqs && st == TSR_OK; i++) {
        uint64_t tag = ck->reqs[i].s.tag;
        if (tag >= (uint64_t)g->n_reqs || g->reqs[tag].used ||
            ck->reqs[i].prev >= g->model->cfg.vocab_size)
            st = tsr_error_set(TSR_ERR_FORMAT, "%s: request %d is inconsistent (corrupt "
                               "checkpoint?)", g->ck_path, i);
        else if (tsr_batch_resume_has(&g->resume, ck->reqs[i].custom_id, ck->reqs[i].line))
            st = tsr_error_set(TSR_ERR_FORMAT,
                               "%s: request of line %lld already has a record in %s",
                               g->ck_path, (long long)ck->reqs[i].line, g->o->output);
        else
            g->reqs[tag].used = true; /* a tag twice is caught; released below */
    }
    for (int i = 0; i < g->n_reqs; i++) g->reqs[i].used = false;
    return st;
}

/* Puts the checkpoint's requests back into the scheduler, their KV into the cache and
 * their bookkeeping into g->reqs. seq_add goes through the cache's wrappers (the policy's
 * admit, the dist agreement), so every rank runs it in the same order. */
static tsr_status tsr__ckpt_restore(tsr_run_job *g, tsr_ckpt *ck) {
    tsr_kv_cache *mech = tsr_ckpt_kv_mech(g->kv);
    g->ck_lines = tsr_calloc((size_t)(ck->n_reqs ? ck->n_reqs : 1), sizeof *g->ck_lines);
    if (!g->ck_lines || !mech) return TSR_ERR_NOMEM;
    double now = tsr_sys_now();
    for (int i = 0; i < ck->n_reqs; i++) {
        tsr_ckpt_req *r = &ck->reqs[i];
        if (r->has_kv) {
            TSR_TRY(g->kv->ops->seq_add(g->kv, r->s.slot));
            TSR_TRY(tsr_kv_import_seq(mech, r->s.slot, &r->kv));
        }
        TSR_TRY(tsr_sched_import(g->sched, &r->s));
        tsr_run_req *q = &g->reqs[r->s.tag];
        q->used = true;
        q->custom_id = r->custom_id; /* ownership moves */
        r->custom_id = NULL;
        q->line = r->line;
        q->body_hash = r->body_hash;
        q->kind = (tsr_batch_kind)r->kind;
        for (int j = 0; j < r->n_stops; j++) {
            q->stops[j] = r->stops[j];
            r->stops[j] = NULL;
        }
        q->n_stops = r->n_stops;
        r->n_stops = 0;
        q->text = r->text;
        q->len = r->len;
        q->cap = r->len + 1;
        r->text = NULL;
        q->prev = r->prev;
        q->n_prompt = r->n_prompt;
        q->n_gen = r->n_gen;
        q->t_submit = now;
        q->t_first = r->n_gen > 0 ? now : 0;
        g->m.prompt_tokens += r->n_prompt;
        g->ck_lines[g->n_ck_lines++] = r->line;
    }
    qsort(g->ck_lines, (size_t)g->n_ck_lines, sizeof *g->ck_lines, tsr__cmp_i64);
    return TSR_OK;
}

/* With --checkpoint-discard: a checkpoint that cannot be resumed is removed (by rank 0)
 * and its requests are recomputed from their input lines, which have no records. */
static tsr_status tsr__ckpt_discard(tsr_run_job *g, tsr_status why) {
    if (!g->o->checkpoint_discard || why == TSR_ERR_NOMEM) return why;
    if (g->root && !g->o->quiet)
        fprintf(stderr, "tessera run: warning: %s; --checkpoint-discard: removed, its requests "
                "are recomputed\n", tsr_last_error());
    if (g->root && remove(g->ck_path) != 0 && errno != ENOENT)
        return tsr_dist_agree(g->dist, tsr_error_set(TSR_ERR_IO, "%s: cannot remove the "
                              "discarded checkpoint: %s", g->ck_path, strerror(errno)));
    return tsr_dist_agree(g->dist, TSR_OK);
}

/* At the start: resumes from the job's checkpoint when there is one (rank 0 looks; every
 * rank must be able to read it: a shared file system). Collective. */
tsr_status tsr_run_ckpt_start(tsr_run_job *g, int *n_resumed) {
    *n_resumed = 0;
    snprintf(g->ck_path, sizeof g->ck_path, "%s", g->o->checkpoint);
    char old[sizeof g->ck_path + 16];
    tsr_ckpt_rank_path(g->o->checkpoint, 0, 2, old, sizeof old);
    /* have[0]: the checkpoint; have[1]: a per-rank file of format 2 in its place */
    int64_t have[2] = {0, 0};
    if (g->root) {
        have[0] = access(g->ck_path, F_OK) == 0;
        have[1] = !have[0] && access(old, F_OK) == 0;
    }
    if (g->dist->world > 1)
        TSR_TRY(tsr_comm_allreduce_i64(g->dist->comm, TSR_COMM_WORLD, have, 2, TSR_COMM_MAX));
    if (have[1])
        return tsr_dist_agree(g->dist, tsr_error_set(TSR_ERR_FORMAT, "%s: a per-rank checkpoint "
                              "of an older tessera (format 2); this tessera reads one file per "
                              "job (format %d): remove the %s files to recompute their "
                              "requests", old, TSR_CKPT_VERSION, "*.rank<R>.h5"));
    if (!have[0]) return TSR_OK;
    tsr_ckpt ck;
    tsr_status st = tsr_dist_agree(g->dist, tsr__ckpt_load(g, &ck));
    if (st != TSR_OK) {
        tsr_ckpt_free(&ck);
        return tsr__ckpt_discard(g, st);
    }
    st = tsr__ckpt_restore(g, &ck);
    if (st != TSR_OK && st != TSR_ERR_NOMEM) { /* name the file */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tsr_last_error());
        st = tsr_error_set(st, "%s: cannot resume: %s", g->ck_path, msg);
    }
    st = tsr_dist_must(g->dist, st);
    if (st == TSR_OK) *n_resumed = ck.n_reqs;
    tsr_ckpt_free(&ck);
    /* Resumed: from here on the output and this run's next checkpoint are the state (a
     * kill now resumes by records, never from a stale checkpoint). */
    if (st == TSR_OK && g->root && remove(g->ck_path) != 0 && errno != ENOENT)
        TSR_LOG_WARN("%s: cannot remove the resumed checkpoint: %s", g->ck_path,
                     strerror(errno));
    return st;
}
