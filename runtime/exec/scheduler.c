/* Continuous batching over one KV cache (see scheduler.h). A request's tokens (prompt plus
 * what it generated) are kept whole, so a preempted request can be recomputed by prefilling
 * them again; under --preempt swap its KV goes to the host pool instead and comes back
 * intact. Its sampler state travels with it, so preemption does not change the draws.
 * Every decision follows from the cache's answers (reserve, swap), which the distributed
 * cache (memory/kv_dist.c) makes the same on every rank, so all ranks preempt, swap and
 * resume the same sequences at the same step. */
#include "runtime/exec/scheduler.h"

#include <string.h>

#include "base/alloc.h"

typedef struct tsr__req {
    uint64_t tag;
    int32_t *tokens;     /* prompt + generated */
    int32_t n_tokens, cap;
    int32_t n_prompt;
    int32_t n_computed;  /* tokens held by the KV cache */
    int32_t n_generated;
    int32_t max_new;
    tsr_sampler_params sp;
    tsr_sampler sampler; /* initialised at first admission */
    bool sampler_ready;
    int slot;            /* KV sequence id, -1 when not resident */
} tsr__req;

struct tsr_sched {
    tsr_sched_config cfg;
    tsr_kv_cache *kv;
    tsr_sched_exec_fn exec;
    void *exec_ctx;
    /* waiting: a ring of request pointers (preempted requests go back to the front) */
    tsr__req **wq;
    int wq_cap, wq_head, wq_len;
    /* running, in admission order (the last is the newest: preempted first) */
    tsr__req **run;
    int n_run;
    /* swapped out, in preemption order (the first resumes first); each keeps its slot */
    tsr__req **swq;
    int n_swq;
    bool *slot_used;
    /* per step */
    tsr_batch_seq *plan;
    tsr__req **plan_req;
    float *logits; /* host logits for an exec other than the forward's (NULL with fwd) */
    int32_t *ids; /* the step's sampled tokens, one per row with logits */
    tsr_sampler **samp; /* the rows' samplers, for tsr_forward_sample */
    /* set by tsr_sched_sample_last_stage: the logits stay in backend memory, on the last
     * stage, and the scheduler samples through tsr_forward_sample */
    tsr_forward *fwd;
    tsr_sched_event *ev;
    int n_ev, ev_cap;
    tsr_sched_totals totals;
};

tsr_status tsr_sched_exec_forward(void *exec_ctx, tsr_kv_cache *kv, const tsr_batch_seq *seqs,
                                  int n_seqs, float *logits, int *n_rows) {
    return tsr_forward_run((tsr_forward *)exec_ctx, kv, seqs, n_seqs, logits, n_rows);
}

static void tsr__req_free(tsr__req *r) {
    if (!r) return;
    if (r->sampler_ready) tsr_sampler_free(&r->sampler);
    tsr_free(r->tokens);
    tsr_free(r);
}

void tsr_sched_destroy(tsr_sched *s) {
    if (!s) return;
    for (int i = 0; i < s->n_run; i++) {
        if (s->run[i]->slot >= 0) s->kv->ops->seq_free(s->kv, s->run[i]->slot);
        tsr__req_free(s->run[i]);
    }
    for (int i = 0; i < s->n_swq; i++) {
        s->kv->ops->seq_free(s->kv, s->swq[i]->slot);
        tsr__req_free(s->swq[i]);
    }
    for (int i = 0; i < s->wq_len; i++) tsr__req_free(s->wq[(s->wq_head + i) % s->wq_cap]);
    tsr_free(s->wq);
    tsr_free(s->swq);
    tsr_free(s->run);
    tsr_free(s->slot_used);
    tsr_free(s->plan);
    tsr_free(s->plan_req);
    tsr_free(s->logits);
    tsr_free(s->ids);
    tsr_free(s->samp);
    tsr_free(s->ev);
    tsr_free(s);
}

tsr_status tsr_sched_create(const tsr_sched_config *cfg, tsr_kv_cache *kv, tsr_sched_exec_fn exec,
                            void *exec_ctx, tsr_sched **out) {
    *out = NULL;
    if (!kv || !exec || cfg->max_seqs < 1 || cfg->max_tokens < cfg->max_seqs ||
        cfg->max_context < 2 || cfg->vocab_size < 1 || cfg->n_eos < 0 || cfg->n_eos > 9 ||
        (cfg->preempt != TSR_PREEMPT_RECOMPUTE && cfg->preempt != TSR_PREEMPT_SWAP))
        return tsr_error_set(TSR_ERR_INVALID,
                             "scheduler: need max_seqs >= 1, max_tokens >= max_seqs (%d, %d), "
                             "context >= 2 (%d)",
                             cfg->max_seqs, cfg->max_tokens, cfg->max_context);
    tsr_sched *s = tsr_calloc(1, sizeof *s);
    if (!s) return TSR_ERR_NOMEM;
    s->cfg = *cfg;
    s->kv = kv;
    s->exec = exec;
    s->exec_ctx = exec_ctx;
    size_t n = (size_t)cfg->max_seqs;
    s->wq_cap = 64;
    s->wq = tsr_malloc((size_t)s->wq_cap * sizeof *s->wq);
    s->run = tsr_calloc(n, sizeof *s->run);
    s->swq = tsr_calloc(n, sizeof *s->swq);
    s->slot_used = tsr_calloc(n, sizeof *s->slot_used);
    s->plan = tsr_calloc(n, sizeof *s->plan);
    s->plan_req = tsr_calloc(n, sizeof *s->plan_req);
    s->ids = tsr_calloc(n, sizeof *s->ids);
    s->samp = tsr_calloc(n, sizeof *s->samp);
    s->ev_cap = (int)n + 16;
    s->ev = tsr_calloc((size_t)s->ev_cap, sizeof *s->ev);
    size_t nl;
    if (tsr_mul_size(n, (size_t)cfg->vocab_size * sizeof(float), &nl))
        s->logits = tsr_malloc(nl);
    if (!s->wq || !s->run || !s->swq || !s->slot_used || !s->plan || !s->plan_req || !s->ev ||
        !s->logits || !s->ids || !s->samp) {
        tsr_sched_destroy(s);
        return TSR_ERR_NOMEM;
    }
    *out = s;
    return TSR_OK;
}

tsr_status tsr_sched_sample_last_stage(tsr_sched *s, tsr_forward *f) {
    if (s->exec != tsr_sched_exec_forward || s->exec_ctx != (void *)f)
        return tsr_error_set(TSR_ERR_INVALID, "scheduler: sampling on the last stage needs "
                             "the forward it executes");
    tsr_forward_sample_last_stage(f, true);
    s->fwd = f;
    tsr_free(s->logits); /* the logits never come to the host from here on */
    s->logits = NULL;
    return TSR_OK;
}

int tsr_sched_n_waiting(const tsr_sched *s) { return s->wq_len + s->n_swq; }
int tsr_sched_n_running(const tsr_sched *s) { return s->n_run; }

void tsr_sched_get_totals(const tsr_sched *s, tsr_sched_totals *out) { *out = s->totals; }

static tsr_status tsr__wq_grow(tsr_sched *s) {
    if (s->wq_len < s->wq_cap) return TSR_OK;
    int cap = s->wq_cap * 2;
    tsr__req **q = tsr_malloc((size_t)cap * sizeof *q);
    if (!q) return TSR_ERR_NOMEM;
    for (int i = 0; i < s->wq_len; i++) q[i] = s->wq[(s->wq_head + i) % s->wq_cap];
    tsr_free(s->wq);
    s->wq = q;
    s->wq_cap = cap;
    s->wq_head = 0;
    return TSR_OK;
}

static tsr_status tsr__wq_push_back(tsr_sched *s, tsr__req *r) {
    TSR_TRY(tsr__wq_grow(s));
    s->wq[(s->wq_head + s->wq_len) % s->wq_cap] = r;
    s->wq_len++;
    return TSR_OK;
}

static tsr_status tsr__wq_push_front(tsr_sched *s, tsr__req *r) {
    TSR_TRY(tsr__wq_grow(s));
    s->wq_head = (s->wq_head + s->wq_cap - 1) % s->wq_cap;
    s->wq[s->wq_head] = r;
    s->wq_len++;
    return TSR_OK;
}

static tsr__req *tsr__wq_pop_front(tsr_sched *s) {
    tsr__req *r = s->wq[s->wq_head];
    s->wq_head = (s->wq_head + 1) % s->wq_cap;
    s->wq_len--;
    return r;
}

tsr_status tsr_sched_submit(tsr_sched *s, const tsr_sched_request *r) {
    if (r->n_prompt < 1 || !r->prompt)
        return tsr_error_set(TSR_ERR_INVALID, "scheduler: request %llu has an empty prompt",
                             (unsigned long long)r->tag);
    if (r->n_prompt >= s->cfg.max_context)
        return tsr_error_set(TSR_ERR_BUDGET,
                             "prompt of %d tokens does not fit the context of %d tokens "
                             "(leaves no room to generate)",
                             r->n_prompt, s->cfg.max_context);
    if (r->max_new_tokens < 0)
        return tsr_error_set(TSR_ERR_INVALID, "scheduler: max_new_tokens must be >= 0");
    tsr_sampler_params sp = r->sampling;
    if (sp.temperature < 0.0f || !(sp.top_p > 0.0f && sp.top_p <= 1.0f) || sp.top_k < 0)
        return tsr_error_set(TSR_ERR_INVALID,
                             "sampler: need temperature >= 0, 0 < top-p <= 1, top-k >= 0");
    tsr__req *q = tsr_calloc(1, sizeof *q);
    if (!q) return TSR_ERR_NOMEM;
    /* Never more than the context holds, plus the last sampled token (never fed). */
    int64_t cap = (int64_t)r->n_prompt + r->max_new_tokens;
    if (cap > s->cfg.max_context) cap = s->cfg.max_context;
    q->cap = (int32_t)cap + 1;
    q->tokens = tsr_malloc((size_t)q->cap * sizeof *q->tokens);
    if (!q->tokens) {
        tsr_free(q);
        return TSR_ERR_NOMEM;
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    q->tag = r->tag;
    q->n_tokens = q->n_prompt = r->n_prompt;
    q->max_new = r->max_new_tokens;
    q->sp = sp;
    q->slot = -1;
    tsr_status st = tsr__wq_push_back(s, q);
    if (st != TSR_OK) tsr__req_free(q);
    return st;
}

static tsr_status tsr__emit(tsr_sched *s, const tsr__req *r, int32_t token,
                            tsr_finish_reason fin) {
    if (s->n_ev == s->ev_cap) {
        tsr_sched_event *e = tsr_realloc(s->ev, (size_t)s->ev_cap * 2 * sizeof *e);
        if (!e) return TSR_ERR_NOMEM;
        s->ev = e;
        s->ev_cap *= 2;
    }
    s->ev[s->n_ev++] = (tsr_sched_event){.tag = r->tag, .token = token,
                                         .n_generated = r->n_generated, .finish = fin,
                                         .eos = -1};
    return TSR_OK;
}

/* Removes running[i] (order kept), releasing its KV; returns the request. */
static tsr__req *tsr__run_remove(tsr_sched *s, int i) {
    tsr__req *r = s->run[i];
    if (r->slot >= 0) {
        s->kv->ops->seq_free(s->kv, r->slot);
        s->slot_used[r->slot] = false;
        r->slot = -1;
    }
    memmove(&s->run[i], &s->run[i + 1], (size_t)(s->n_run - i - 1) * sizeof *s->run);
    s->n_run--;
    return r;
}

/* Removes swq[i] (order kept). */
static tsr__req *tsr__swq_remove(tsr_sched *s, int i) {
    tsr__req *r = s->swq[i];
    memmove(&s->swq[i], &s->swq[i + 1], (size_t)(s->n_swq - i - 1) * sizeof *s->swq);
    s->n_swq--;
    return r;
}

/* Sends r (no longer running or swapped) to the front of the queue with its KV freed: its
 * tokens are prefilled again when it is admitted. */
static tsr_status tsr__to_recompute(tsr_sched *s, tsr__req *r) {
    if (r->slot >= 0) {
        s->kv->ops->seq_free(s->kv, r->slot);
        s->slot_used[r->slot] = false;
        r->slot = -1;
    }
    r->n_computed = 0;
    return tsr__wq_push_front(s, r);
}

/* The newest running request leaves the running set. Under swap its KV goes to the host
 * pool and it keeps its slot; else (recompute, nothing computed yet, or the host pool
 * short: a fallback) it goes back to the front of the queue, its KV dropped. */
static tsr_status tsr__preempt_newest(tsr_sched *s, tsr_sched_step_info *info) {
    tsr__req *r = s->run[s->n_run - 1];
    s->totals.preemptions++;
    info->n_preempted++;
    if (s->cfg.preempt == TSR_PREEMPT_SWAP && r->n_computed > 0) {
        int64_t bytes = 0;
        tsr_status st = tsr_kv_swap_out(s->kv, r->slot, 0, &bytes);
        if (st == TSR_OK) {
            s->n_run--;
            s->swq[s->n_swq++] = r;
            s->totals.swaps_out++;
            s->totals.swap_out_bytes += bytes;
            info->n_swapped_out++;
            return TSR_OK;
        }
        if (st != TSR_ERR_NO_BLOCKS && st != TSR_ERR_BUDGET && st != TSR_ERR_UNSUPPORTED)
            return st;
        s->totals.swap_fallbacks++;
    }
    s->n_run--;
    return tsr__to_recompute(s, r);
}

/* Brings swapped requests back, first swapped first, while the cache has room for them
 * (and their next token). One that cannot come back while nothing runs never will: it is
 * recomputed instead (a fallback). */
static tsr_status tsr__swap_in(tsr_sched *s, tsr_sched_step_info *info) {
    while (s->n_swq > 0) {
        tsr__req *r = s->swq[0];
        int64_t bytes = 0;
        tsr_status st = tsr_kv_swap_in(s->kv, r->slot, 0, &bytes);
        if (st == TSR_ERR_NO_BLOCKS && s->n_run > 0) break;
        if (st == TSR_ERR_NO_BLOCKS || st == TSR_ERR_BUDGET) {
            s->totals.swap_fallbacks++;
            TSR_TRY(tsr__to_recompute(s, tsr__swq_remove(s, 0)));
            continue;
        }
        TSR_TRY(st);
        tsr__swq_remove(s, 0);
        s->run[s->n_run++] = r;
        s->totals.swaps_in++;
        s->totals.swap_in_bytes += bytes;
        info->n_swapped_in++;
    }
    return TSR_OK;
}

bool tsr_sched_finish(tsr_sched *s, uint64_t tag) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->tag == tag) {
            tsr__req_free(tsr__run_remove(s, i));
            return true;
        }
    for (int i = 0; i < s->n_swq; i++)
        if (s->swq[i]->tag == tag) {
            tsr__req *r = tsr__swq_remove(s, i);
            s->kv->ops->seq_free(s->kv, r->slot);
            s->slot_used[r->slot] = false;
            tsr__req_free(r);
            return true;
        }
    for (int i = 0; i < s->wq_len; i++) {
        int at = (s->wq_head + i) % s->wq_cap;
        if (s->wq[at]->tag != tag) continue;
        tsr__req_free(s->wq[at]);
        for (int j = i; j + 1 < s->wq_len; j++)
            s->wq[(s->wq_head + j) % s->wq_cap] = s->wq[(s->wq_head + j + 1) % s->wq_cap];
        s->wq_len--;
        return true;
    }
    return false;
}

/* Brings swapped requests back, then (when none is left out) moves waiting requests into
 * free sequence slots until the running set is full or the cache is short
 * (TSR_ERR_NO_BLOCKS: try again after something finishes). */
static tsr_status tsr__admit(tsr_sched *s, tsr_sched_step_info *info) {
    tsr_kv_cache *kv = s->kv;
    TSR_TRY(tsr__swap_in(s, info));
    while (s->n_swq == 0 && s->wq_len > 0 && s->n_run < s->cfg.max_seqs) {
        tsr__req *r = s->wq[s->wq_head];
        if (r->max_new == 0) { /* nothing to compute: done at once */
            tsr__wq_pop_front(s);
            tsr_status st = tsr__emit(s, r, -1, TSR_FINISH_LENGTH);
            tsr__req_free(r);
            TSR_TRY(st);
            continue;
        }
        int slot = 0;
        while (s->slot_used[slot]) slot++;
        tsr_status st = kv->ops->seq_add(kv, slot);
        if (st == TSR_ERR_NO_BLOCKS) break;
        TSR_TRY(st);
        if (!r->sampler_ready) {
            st = tsr_sampler_init(&r->sampler, s->cfg.vocab_size, &r->sp);
            if (st != TSR_OK) {
                kv->ops->seq_free(kv, slot);
                return st;
            }
            r->sampler_ready = true;
        }
        tsr__wq_pop_front(s);
        s->slot_used[slot] = true;
        r->slot = slot;
        r->n_computed = 0;
        if (kv->ops->prefix_attach) {
            int32_t got = kv->ops->prefix_attach(kv, slot, r->tokens, r->n_tokens);
            if (got > 0 && got < r->n_tokens) r->n_computed = got;
        }
        s->run[s->n_run++] = r;
        info->n_admitted++;
    }
    if (s->n_run > s->totals.max_running) s->totals.max_running = s->n_run;
    return TSR_OK;
}

/* Builds the batch: decodes first (one token each), then prefill chunks in admission order
 * while the token budget lasts. Reserves KV for every entry before anything runs. */
static tsr_status tsr__plan(tsr_sched *s, int *n_plan, tsr_sched_step_info *info) {
    tsr_kv_cache *kv = s->kv;
    for (;;) {
        int n = 0, budget = s->cfg.max_tokens;
        bool restart = false;
        for (int pass = 0; pass < 2 && !restart; pass++) {
            for (int i = 0; i < s->n_run && budget > 0; i++) {
                tsr__req *r = s->run[i];
                int32_t rem = r->n_tokens - r->n_computed;
                if ((pass == 0) != (rem == 1)) continue;
                int32_t chunk = rem < budget ? rem : budget;
                tsr_status st = kv->ops->reserve(kv, r->slot, chunk);
                if (st == TSR_ERR_NO_BLOCKS) {
                    if (pass == 1) continue; /* this prefill waits a step */
                    /* A decode must progress: make room by preempting the newest. */
                    TSR_TRY(tsr__preempt_newest(s, info));
                    restart = true;
                    break;
                }
                if (st == TSR_ERR_BUDGET) {
                    /* Never fits: report it and drop it. */
                    tsr__req *q = tsr__run_remove(s, i);
                    st = tsr__emit(s, q, -1, TSR_FINISH_ERROR);
                    tsr__req_free(q);
                    TSR_TRY(st);
                    restart = true;
                    break;
                }
                TSR_TRY(st);
                s->plan[n] = (tsr_batch_seq){.seq = r->slot,
                                             .tokens = r->tokens + r->n_computed,
                                             .n_tokens = chunk,
                                             .want_logits = r->n_computed + chunk == r->n_tokens};
                s->plan_req[n] = r;
                n++;
                budget -= chunk;
            }
        }
        if (restart) continue;
        if (n == 0 && s->n_run > 1) {
            /* Every prefill is short of blocks: free the newest and try again. */
            TSR_TRY(tsr__preempt_newest(s, info));
            continue;
        }
        if (n == 0 && s->n_run == 1) {
            tsr__req *q = tsr__run_remove(s, 0);
            tsr_status st = tsr__emit(s, q, -1, TSR_FINISH_ERROR);
            tsr__req_free(q);
            TSR_TRY(st);
        }
        *n_plan = n;
        return TSR_OK;
    }
}

static bool tsr__is_eos(const tsr_sched *s, int32_t id) {
    for (int i = 0; i < s->cfg.n_eos; i++)
        if (s->cfg.eos_ids[i] == id) return true;
    return false;
}

tsr_status tsr_sched_step(tsr_sched *s, const tsr_sched_event **events, int *n_events,
                          tsr_sched_step_info *info) {
    tsr_sched_step_info local = {0};
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    s->n_ev = 0;
    *events = s->ev;
    *n_events = 0;

    TSR_TRY(tsr__admit(s, info));
    int n = 0;
    TSR_TRY(tsr__plan(s, &n, info));
    if (n == 0 && s->n_run == 0 && s->n_swq == 0 && s->wq_len > 0) {
        /* Nothing runs and the front request cannot even be admitted: it never fits. */
        tsr__req *r = tsr__wq_pop_front(s);
        tsr_status st = tsr__emit(s, r, -1, TSR_FINISH_ERROR);
        tsr__req_free(r);
        TSR_TRY(st);
    }
    if (n > 0) {
        int rows = 0;
        TSR_TRY(s->exec(s->exec_ctx, s->kv, s->plan, n, s->logits, &rows));
        /* Draw every row's token first: where the logits stayed on the last pipeline
         * stage, the other stages advance their samplers alike and get the ids from it.
         * With fwd the logits are in backend memory and the backend's sample op draws
         * them (only the ids come to the host); else on the host from s->logits. */
        bool here = !s->fwd || tsr_forward_has_logits(s->fwd);
        int n_ids = 0;
        for (int i = 0; i < n; i++) {
            if (!s->plan[i].want_logits) continue;
            if (n_ids >= rows)
                return tsr_error_set(TSR_ERR_INTERNAL, "scheduler: forward returned %d rows",
                                     rows);
            tsr_sampler *sm = &s->plan_req[i]->sampler;
            if (!here)
                tsr_sampler_skip(sm);
            else if (s->fwd)
                s->samp[n_ids] = sm;
            else
                s->ids[n_ids] = tsr_sampler_sample(
                    sm, s->logits + (size_t)n_ids * (size_t)s->cfg.vocab_size);
            n_ids++;
        }
        if (s->fwd && here) TSR_TRY(tsr_forward_sample(s->fwd, s->samp, n_ids, s->ids));
        if (s->fwd) TSR_TRY(tsr_forward_share_tokens(s->fwd, s->ids, n_ids));
        int row = 0;
        for (int i = 0; i < n; i++) {
            tsr__req *r = s->plan_req[i];
            int32_t chunk = s->plan[i].n_tokens;
            r->n_computed += chunk;
            info->n_tokens += chunk;
            if (r->n_tokens - (r->n_computed - chunk) == 1) {
                info->n_decode++;
                s->totals.decode_tokens += chunk;
            } else {
                info->n_prefill++;
                s->totals.prefill_tokens += chunk;
            }
            if (!s->plan[i].want_logits) continue;
            int32_t t = s->ids[row++];
            tsr_finish_reason fin = TSR_FINISH_NONE;
            int32_t eos = -1;
            if (tsr__is_eos(s, t)) {
                fin = TSR_FINISH_EOS;
                eos = t;
                t = -1;
            } else {
                r->tokens[r->n_tokens++] = t;
                r->n_generated++;
                if (r->n_generated >= r->max_new)
                    fin = TSR_FINISH_LENGTH;
                else if (r->n_computed + 1 > s->cfg.max_context || r->n_tokens >= r->cap)
                    fin = TSR_FINISH_CONTEXT;
            }
            TSR_TRY(tsr__emit(s, r, t, fin));
            s->ev[s->n_ev - 1].eos = eos;
        }
        info->n_seqs = n;
        s->totals.steps++;
        s->totals.batch_tokens += info->n_tokens;
        /* Finished sequences leave now, so their slots are free for the next step. */
        for (int e = 0; e < s->n_ev; e++) {
            if (s->ev[e].finish == TSR_FINISH_NONE) continue;
            for (int i = 0; i < s->n_run; i++)
                if (s->run[i]->tag == s->ev[e].tag) {
                    tsr__req_free(tsr__run_remove(s, i));
                    break;
                }
        }
    }
    *n_events = s->n_ev;
    return TSR_OK;
}

static void tsr__save(const tsr__req *r, tsr_sched_saved *o) {
    *o = (tsr_sched_saved){.tag = r->tag, .tokens = r->tokens, .n_tokens = r->n_tokens,
                           .n_prompt = r->n_prompt, .n_computed = r->n_computed,
                           .n_generated = r->n_generated, .max_new_tokens = r->max_new,
                           .sampling = r->sp, .rng = r->sampler_ready ? r->sampler.rng : 0,
                           .sampler_ready = r->sampler_ready, .slot = r->slot};
}

void tsr_sched_export(const tsr_sched *s, tsr_sched_saved *out) {
    int n = 0;
    for (int i = 0; i < s->n_run; i++) tsr__save(s->run[i], &out[n++]);
    for (int i = 0; i < s->n_swq; i++) { /* their KV is in the host pool: recomputed */
        tsr__save(s->swq[i], &out[n]);
        out[n].slot = -1;
        out[n++].n_computed = 0;
    }
    for (int i = 0; i < s->wq_len; i++) tsr__save(s->wq[(s->wq_head + i) % s->wq_cap], &out[n++]);
}

tsr_status tsr_sched_import(tsr_sched *s, const tsr_sched_saved *r) {
    int64_t cap = (int64_t)r->n_prompt + r->max_new_tokens;
    if (cap > s->cfg.max_context) cap = s->cfg.max_context;
    cap++;
    tsr_sampler_params sp = r->sampling;
    bool running = r->slot >= 0;
    if (!r->tokens || r->n_prompt < 1 || r->n_prompt >= s->cfg.max_context ||
        r->max_new_tokens < 0 || r->n_tokens < r->n_prompt || r->n_tokens > cap ||
        r->n_generated < 0 || r->n_generated > r->n_tokens - r->n_prompt ||
        r->n_computed < 0 || r->n_computed > r->n_tokens || (!running && r->n_computed) ||
        (running && !r->sampler_ready) ||
        sp.temperature < 0.0f || !(sp.top_p > 0.0f && sp.top_p <= 1.0f) || sp.top_k < 0)
        return tsr_error_set(TSR_ERR_INVALID, "scheduler: saved request %llu is inconsistent",
                             (unsigned long long)r->tag);
    if (running) {
        if (r->slot >= s->cfg.max_seqs || s->slot_used[r->slot] || s->n_run >= s->cfg.max_seqs)
            return tsr_error_set(TSR_ERR_INVALID,
                                 "scheduler: saved request %llu: KV sequence %d is not free "
                                 "(max %d running)", (unsigned long long)r->tag, r->slot,
                                 s->cfg.max_seqs);
        if (s->kv->ops->seq_len(s->kv, r->slot) != r->n_computed)
            return tsr_error_set(TSR_ERR_INVALID,
                                 "scheduler: saved request %llu: KV sequence %d holds %d "
                                 "tokens, want %d", (unsigned long long)r->tag, r->slot,
                                 s->kv->ops->seq_len(s->kv, r->slot), r->n_computed);
    }
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= s->cfg.vocab_size)
            return tsr_error_set(TSR_ERR_INVALID,
                                 "scheduler: saved request %llu has token %d outside the "
                                 "vocabulary of %d", (unsigned long long)r->tag, r->tokens[i],
                                 s->cfg.vocab_size);
    tsr__req *q = tsr_calloc(1, sizeof *q);
    if (!q) return TSR_ERR_NOMEM;
    q->cap = (int32_t)cap;
    q->tokens = tsr_malloc((size_t)q->cap * sizeof *q->tokens);
    if (!q->tokens) {
        tsr_free(q);
        return TSR_ERR_NOMEM;
    }
    memcpy(q->tokens, r->tokens, (size_t)r->n_tokens * sizeof *q->tokens);
    q->tag = r->tag;
    q->n_tokens = r->n_tokens;
    q->n_prompt = r->n_prompt;
    q->n_computed = r->n_computed;
    q->n_generated = r->n_generated;
    q->max_new = r->max_new_tokens;
    q->sp = sp;
    q->slot = -1;
    if (r->sampler_ready) {
        tsr_status st = tsr_sampler_init(&q->sampler, s->cfg.vocab_size, &sp);
        if (st != TSR_OK) {
            tsr__req_free(q);
            return st;
        }
        q->sampler.rng = r->rng;
        q->sampler_ready = true;
    }
    if (!running) {
        tsr_status st = tsr__wq_push_back(s, q);
        if (st != TSR_OK) tsr__req_free(q);
        return st;
    }
    q->slot = r->slot;
    s->slot_used[r->slot] = true;
    s->run[s->n_run++] = q;
    if (s->n_run > s->totals.max_running) s->totals.max_running = s->n_run;
    return TSR_OK;
}
