/* `tessera run --checkpoint` (jobs/run_job.h): the glue between the job's state and the
 * HDF5 checkpoint (jobs/checkpoint.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"
#include "jobs/checkpoint.h"
#include "jobs/run_job.h"
#include "memory/kv_dist.h"
#include "policies/policy.h"

static int tsr__cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

bool tsr_run_ckpt_resumed(const tsr_run_job *g, int64_t line) {
    return g->n_ck_lines > 0 &&
           bsearch(&line, g->ck_lines, (size_t)g->n_ck_lines, sizeof line, tsr__cmp_i64);
}

/* What a checkpoint of this job records and a resumed one must match. */
static void tsr__ckpt_meta(const tsr_run_job *g, int64_t records, tsr_ckpt_meta *m) {
    const tsr_model_config *c = &g->model->cfg;
    tsr_kv_cache *mech = tsr_ckpt_kv_mech(g->kv);
    bool multi = g->dist.world > 1;
    *m = (tsr_ckpt_meta){.format_version = TSR_CKPT_VERSION, .dim = c->dim,
                         .n_layers = c->n_layers, .n_heads = c->n_heads,
                         .n_kv_heads = c->n_kv_heads, .vocab_size = c->vocab_size,
                         .block_size = mech ? tsr_kv_block_size(mech) : 0,
                         .tp = multi ? tsr_comm_size(g->dist.comm, TSR_COMM_TP) : 1,
                         .pp = multi ? tsr_comm_size(g->dist.comm, TSR_COMM_PP) : 1,
                         .rank = g->dist.rank, .world = multi ? g->dist.world : 1,
                         .max_batch_seqs = g->o->max_batch_seqs, .max_context = g->ctx,
                         .kv_layers = mech ? mech->n_layers : 0,
                         .kv_dim = mech ? mech->kv_dim : 0, .output_records = records};
    snprintf(m->model, sizeof m->model, "%s", g->o->model);
    snprintf(m->dtype, sizeof m->dtype, "%s", tsr_dtype_name(c->dtype));
    tsr_kv_detail d;
    tsr_kv_cache_detail(g->kv, &d);
    snprintf(m->policy, sizeof m->policy, "%s", d.policy);
    snprintf(m->output, sizeof m->output, "%s", g->o->output);
}

/* Local: every request the scheduler holds, with the KV of the running ones. */
tsr_status tsr_run_ckpt_save(tsr_run_job *g, int *n_saved) {
    tsr_ckpt ck = {0};
    tsr__ckpt_meta(g, g->resume.n_records + g->records_this_run, &ck.meta);
    tsr_kv_cache *mech = tsr_ckpt_kv_mech(g->kv);
    if (!mech)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: the KV cache is not paged",
                             g->ck_path);
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
    if (st == TSR_OK) st = tsr_ckpt_write(g->ck_path, &ck);
    for (int i = 0; i < ck.n_reqs; i++) tsr_kv_seq_state_free(&ck.reqs[i].kv);
    tsr_free(ck.reqs);
    tsr_free(sv);
    *n_saved = n;
    return st;
}

/* Local: reads this rank's checkpoint and checks it against the job. */
static tsr_status tsr__ckpt_load(tsr_run_job *g, tsr_ckpt *ck) {
    TSR_TRY(tsr_ckpt_read(g->ck_path, ck));
    tsr_ckpt_meta job;
    tsr__ckpt_meta(g, g->resume.n_records, &job);
    TSR_TRY(tsr_ckpt_check(g->ck_path, &ck->meta, &job));
    for (int i = 0; i < ck->n_reqs; i++) {
        uint64_t tag = ck->reqs[i].s.tag;
        if (tag >= (uint64_t)g->n_reqs || g->reqs[tag].used ||
            ck->reqs[i].prev >= g->model->cfg.vocab_size)
            return tsr_error_set(TSR_ERR_FORMAT, "%s: request %d is inconsistent (corrupt "
                                 "checkpoint?)", g->ck_path, i);
        g->reqs[tag].used = true; /* released again below, before the restore */
        if (tsr_batch_resume_has(&g->resume, ck->reqs[i].custom_id, ck->reqs[i].line))
            return tsr_error_set(TSR_ERR_FORMAT,
                                 "%s: request of line %lld already has a record in %s",
                                 g->ck_path, (long long)ck->reqs[i].line, g->o->output);
    }
    for (int i = 0; i < ck->n_reqs; i++) g->reqs[ck->reqs[i].s.tag].used = false;
    return TSR_OK;
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

/* At the start: resumes from this rank's checkpoint when every rank has one. Collective. */
tsr_status tsr_run_ckpt_start(tsr_run_job *g, int *n_resumed) {
    *n_resumed = 0;
    tsr_ckpt_rank_path(g->o->checkpoint, g->dist.rank, g->dist.world, g->ck_path,
                       sizeof g->ck_path);
    int64_t have[2] = {access(g->ck_path, F_OK) == 0, 0};
    have[1] = -have[0];
    if (g->dist.world > 1)
        TSR_TRY(tsr_comm_allreduce_i64(g->dist.comm, TSR_COMM_WORLD, have, 2, TSR_COMM_MAX));
    if (have[0] != -have[1])
        return tsr_dist_agree(&g->dist, tsr_error_set(TSR_ERR_INVALID,
                              "%s: some ranks have a checkpoint file and others not",
                              g->ck_path));
    if (!have[0]) return TSR_OK;
    tsr_ckpt ck;
    tsr_status st = tsr_dist_agree(&g->dist, tsr__ckpt_load(g, &ck));
    if (st == TSR_OK) {
        st = tsr__ckpt_restore(g, &ck);
        if (st != TSR_OK && st != TSR_ERR_NOMEM) { /* name the file */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", tsr_last_error());
            st = tsr_error_set(st, "%s: cannot resume: %s", g->ck_path, msg);
        }
        st = tsr_dist_must(&g->dist, st);
    }
    if (st == TSR_OK) *n_resumed = ck.n_reqs;
    tsr_ckpt_free(&ck);
    /* Resumed: from here on the output and this run's next checkpoint are the state (a
     * kill now resumes by records, never from a stale checkpoint). */
    if (st == TSR_OK && remove(g->ck_path) != 0 && errno != ENOENT)
        TSR_LOG_WARN("%s: cannot remove the resumed checkpoint: %s", g->ck_path,
                     strerror(errno));
    return st;
}

