/* Fidelity of a KV policy against the full cache (runtime/eval/fidelity.h). */
#include "runtime/eval/fidelity.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "runtime/engine/engine.h"
#include "runtime/eval/fullref.h"
#include "runtime/exec/forward.h"

double tsr_fidelity_nll(const float *logits, int n, int32_t next) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - logits[next];
}

/* log(sum(exp(x))) in double, from the maximum. */
static double tsr__lse(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return log(sum) + mx;
}

double tsr_fidelity_kl(const float *p, const float *q, int n) {
    double lp = tsr__lse(p, n), lq = tsr__lse(q, n), kl = 0.0;
    for (int i = 0; i < n; i++) {
        double a = (double)p[i] - lp, b = (double)q[i] - lq;
        /* Identical rows give a - b == 0 in every term: exactly 0, not rounding noise. */
        kl += exp(a) * (a - b);
    }
    /* A sum of terms of both signs can round below zero when the rows nearly agree. */
    return kl > 0.0 ? kl : 0.0;
}

static int32_t tsr__argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct tsr__fid {
    const tsr_fidelity_options *o;
    tsr_engine *full, *pol;
    float *lf, *lp; /* one logits row each */
    int V, ctx, chunk;
    /* running sums of the text scoring */
    double nll, nll_full, kl;
    int64_t agree, count;
    double gen_kl; /* the greedy continuations */
    int64_t gen_agree, gen_count;
    /* the full cache's reference (runtime/eval/fullref.h): rows of V logits, one per
     * position where the full cache's logits are used, in order */
    enum { TSR__REF_NONE, TSR__REF_RECORD, TSR__REF_REPLAY } ref;
    float *ref_rows;
    size_t ref_n, ref_cap, ref_at;
    uint64_t ids_hash;     /* of every sequence scored (from TSR_FULLREF_HASH0) */
    uint64_t ref_ids_hash; /* a replayed reference's: the same tokens, or not this run's */
} tsr__fid;

/* The reference payload's head (then n_rows x V floats). */
typedef struct tsr__ref_head {
    uint64_t ids_hash, n_rows, vocab;
} tsr__ref_head;

/* Feeds n tokens of sequence 0 to engine e; the last one's logits go to `logits`. */
static tsr_status tsr__feed(tsr_engine *e, const int32_t *ids, int32_t n, float *logits) {
    int rows = 0;
    tsr_batch_seq b = {.seq = 0, .tokens = ids, .n_tokens = n, .want_logits = true};
    return tsr_forward_run(e->fwd, e->kv, &b, 1, logits, &rows);
}

/* The full cache's part of a step: its engine fed, unless a reference replays it. */
static tsr_status tsr__feed_full(tsr__fid *f, const int32_t *ids, int32_t n) {
    return f->ref == TSR__REF_REPLAY ? TSR_OK : tsr__feed(f->full, ids, n, f->lf);
}

/* The full cache's logits where they are used: kept for the reference being recorded, or
 * the reference's next row replayed into f->lf. */
static tsr_status tsr__full_row(tsr__fid *f) {
    size_t V = (size_t)f->V;
    if (f->ref == TSR__REF_REPLAY) {
        if (f->ref_at >= f->ref_n)
            return tsr_error_set(TSR_ERR_FORMAT, "fidelity: the full cache's reference has %zu "
                                 "rows and this run scores more", f->ref_n);
        memcpy(f->lf, f->ref_rows + f->ref_at * V, V * sizeof *f->lf);
        f->ref_at++;
    } else if (f->ref == TSR__REF_RECORD) {
        if (f->ref_n == f->ref_cap) {
            size_t cap = f->ref_cap ? 2 * f->ref_cap : 64;
            float *p = tsr_realloc(f->ref_rows, cap * V * sizeof *p);
            if (!p) return TSR_ERR_NOMEM;
            f->ref_rows = p;
            f->ref_cap = cap;
        }
        memcpy(f->ref_rows + f->ref_n * V, f->lf, V * sizeof *f->lf);
        f->ref_n++;
    }
    return TSR_OK;
}

/* Scores one sequence (at most ctx tokens) through both caches, position by position. */
static tsr_status tsr__score(tsr__fid *f, const int32_t *ids, int32_t n) {
    f->ids_hash = tsr_fullref_hash(f->ids_hash, &n, sizeof n);
    f->ids_hash = tsr_fullref_hash(f->ids_hash, ids, (size_t)n * sizeof *ids);
    tsr_kv_cache *kf = f->ref == TSR__REF_REPLAY ? NULL : f->full->kv, *kp = f->pol->kv;
    if (kf) TSR_TRY(kf->ops->seq_add(kf, 0));
    tsr_status st = kp->ops->seq_add(kp, 0);
    if (st != TSR_OK) {
        if (kf) kf->ops->seq_free(kf, 0);
        return st;
    }
    int32_t t = 0, pr = f->o->prompt_tokens < f->chunk ? f->o->prompt_tokens : f->chunk;
    int32_t tail = f->o->tail_tokens;
    if (tail > 0 && tail + 1 < n) {
        /* The prefix ids[0, n - tail): unscored. As a prompt, in chunks: the last chunk's
         * logits predict ids[n - tail] (the first scored position); decode-only, one token a
         * call up to ids[n - tail - 2], and the loop below scores from n - tail - 1. */
        int32_t pre = n - tail;
        pr = 0;
        if (f->o->decode_prefix) {
            for (; st == TSR_OK && t < pre - 1; t++) {
                st = tsr__feed_full(f, ids + t, 1);
                if (st == TSR_OK) st = tsr__feed(f->pol, ids + t, 1, f->lp);
            }
        } else {
            for (int32_t at = 0; st == TSR_OK && at < pre; at += f->chunk) {
                int32_t k = pre - at < f->chunk ? pre - at : f->chunk;
                st = tsr__feed_full(f, ids + at, k);
                if (st == TSR_OK) st = tsr__feed(f->pol, ids + at, k, f->lp);
            }
            if (st == TSR_OK) st = tsr__full_row(f);
            if (st == TSR_OK) {
                f->nll_full += tsr_fidelity_nll(f->lf, f->V, ids[pre]);
                f->nll += tsr_fidelity_nll(f->lp, f->V, ids[pre]);
                f->kl += tsr_fidelity_kl(f->lf, f->lp, f->V);
                f->agree += tsr__argmax(f->lf, f->V) == tsr__argmax(f->lp, f->V);
                f->count++;
                t = pre;
            }
        }
    } else if (pr > 1 && pr + 1 < n) { /* the prompt: one chunk, its last position scored */
        st = tsr__feed_full(f, ids, pr);
        if (st == TSR_OK) st = tsr__feed(f->pol, ids, pr, f->lp);
        if (st == TSR_OK) st = tsr__full_row(f);
        if (st == TSR_OK) {
            f->nll_full += tsr_fidelity_nll(f->lf, f->V, ids[pr]);
            f->nll += tsr_fidelity_nll(f->lp, f->V, ids[pr]);
            f->kl += tsr_fidelity_kl(f->lf, f->lp, f->V);
            f->agree += tsr__argmax(f->lf, f->V) == tsr__argmax(f->lp, f->V);
            f->count++;
            t = pr;
        }
    }
    for (; st == TSR_OK && t + 1 < n; t++) {
        if (f->o->max_tokens > 0 && f->count >= f->o->max_tokens) break;
        st = tsr__feed_full(f, ids + t, 1);
        if (st == TSR_OK) st = tsr__feed(f->pol, ids + t, 1, f->lp);
        if (st == TSR_OK) st = tsr__full_row(f);
        if (st != TSR_OK) break;
        f->nll_full += tsr_fidelity_nll(f->lf, f->V, ids[t + 1]);
        f->nll += tsr_fidelity_nll(f->lp, f->V, ids[t + 1]);
        f->kl += tsr_fidelity_kl(f->lf, f->lp, f->V);
        f->agree += tsr__argmax(f->lf, f->V) == tsr__argmax(f->lp, f->V);
        f->count++;
    }
    /* A scored window goes on with the full cache's greedy tokens, fed to both: positions
     * n-1 .. n+g-2, as many as the context holds. */
    int32_t g = f->o->gen_tokens;
    if (g > f->ctx - n + 1) g = f->ctx - n + 1;
    int32_t next = n > 0 ? ids[n - 1] : 0;
    for (int32_t i = 0; st == TSR_OK && t + 1 == n && i < g; i++) {
        st = tsr__feed_full(f, &next, 1);
        if (st == TSR_OK) st = tsr__feed(f->pol, &next, 1, f->lp);
        if (st == TSR_OK) st = tsr__full_row(f);
        if (st != TSR_OK) break;
        next = tsr__argmax(f->lf, f->V);
        f->gen_kl += tsr_fidelity_kl(f->lf, f->lp, f->V);
        f->gen_agree += next == tsr__argmax(f->lp, f->V);
        f->gen_count++;
    }
    kp->ops->seq_free(kp, 0);
    if (kf) kf->ops->seq_free(kf, 0);
    return st;
}

/* Stories: runs of text separated by blank lines, each encoded from BOS; one longer than
 * the context is scored in windows of ctx tokens. */
static tsr_status tsr__score_text(tsr__fid *f, const tsr_tokenizer *tok, const char *text,
                                  size_t len, int *windows) {
    const char *p = text, *end_all = text + len;
    tsr_status st = TSR_OK;
    if (f->o->document) { /* one sequence: the document's first tokens from BOS */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        TSR_TRY(tsr_tokenizer_encode(tok, text, len, true, false, &ids, &n_ids));
        size_t cap = f->o->doc_tokens > 0 && f->o->doc_tokens < f->ctx ? (size_t)f->o->doc_tokens
                                                                       : (size_t)f->ctx;
        if (n_ids > cap) n_ids = cap;
        if (f->o->tail_tokens > 0 && (size_t)f->o->tail_tokens + 1 >= n_ids)
            st = tsr_error_set(TSR_ERR_INVALID, "fidelity: --tail %d needs a document longer "
                               "than it (%zu tokens)", f->o->tail_tokens, n_ids);
        if (st == TSR_OK) st = tsr__score(f, ids, (int32_t)n_ids);
        (*windows)++;
        tsr_free(ids);
        return st;
    }
    while (st == TSR_OK && p < end_all) {
        if (f->o->max_tokens > 0 && f->count >= f->o->max_tokens) break;
        while (p < end_all && (*p == '\n' || *p == ' ' || *p == '\r' || *p == '\t')) p++;
        if (p >= end_all) break;
        const char *e = p;
        while (e < end_all && !(e[0] == '\n' && e + 1 < end_all &&
                                (e[1] == '\n' || (e[1] == '\r' && e + 2 < end_all &&
                                                  e[2] == '\n'))))
            e++;
        size_t n = (size_t)(e - p);
        while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == ' ' || p[n - 1] == '\r')) n--;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        st = tsr_tokenizer_encode(tok, p, n, true, false, &ids, &n_ids);
        for (size_t at = 0; st == TSR_OK && at + 1 < n_ids; at += (size_t)f->ctx) {
            if (f->o->max_tokens > 0 && f->count >= f->o->max_tokens) break;
            size_t w = n_ids - at < (size_t)f->ctx ? n_ids - at : (size_t)f->ctx;
            st = tsr__score(f, ids + at, (int32_t)w);
            (*windows)++;
        }
        tsr_free(ids);
        p = e;
    }
    return st;
}

/* ---- the retrieval probe ---------------------------------------------------------------- */

typedef struct tsr__probe {
    int32_t *ids; /* [n] the prompt */
    int32_t n;
    int32_t key_pos, key_n;
    const int32_t *key; /* ids + key_pos */
} tsr__probe;

static tsr_status tsr__append_ids(int32_t *dst, int32_t *n, int32_t cap, const int32_t *src,
                                  size_t k, int need_room) {
    if ((int64_t)*n + (int64_t)k + need_room > cap) return TSR_ERR_BUDGET;
    memcpy(dst + *n, src, k * sizeof *src);
    *n += (int32_t)k;
    return TSR_OK;
}

/* The probe's prompt, exactly `len` tokens: BOS, a lead-in, the key, filler, the question.
 * With a tokenizer each part is text, encoded on its own (so the key's tokens are exactly
 * the ones a correct answer repeats); without, fixed patterns of ids. */
static tsr_status tsr__probe_make(const tsr_model_config *c, const tsr_tokenizer *tok,
                                  int32_t len, tsr__probe *pr) {
    memset(pr, 0, sizeof *pr);
    static const char *const text[4] = {
        "Here is a secret. The pass key is", " 4 7 2 9 5",
        (". Remember it. The grass is green. The sky is blue. The sun is warm. A cat sat on "
         "the mat and a dog ran in the park."),
        " What is the pass key? The pass key is"};
    int32_t *part[4] = {NULL, NULL, NULL, NULL};
    size_t np[4] = {0, 0, 0, 0};
    int32_t V = c->vocab_size;
    tsr_status st = TSR_OK;
    if (tok) {
        for (int i = 0; i < 4 && st == TSR_OK; i++)
            st = tsr_tokenizer_encode(tok, text[i], strlen(text[i]), false, false, &part[i],
                                      &np[i]);
    } else {
        /* lead 8, key 5, filler 23 (cycled), question 8 ids, away from the low ids that are
         * often special */
        static const size_t lens[4] = {8, 5, 23, 8};
        for (int i = 0; i < 4 && st == TSR_OK; i++) {
            np[i] = lens[i];
            part[i] = tsr_malloc(lens[i] * sizeof *part[i]);
            if (!part[i]) st = TSR_ERR_NOMEM;
            for (size_t j = 0; st == TSR_OK && j < lens[i]; j++)
                part[i][j] = (int32_t)(3 + ((uint64_t)(i * 131 + 7) * 2654435761u +
                                            (uint64_t)j * 40503u) % (uint64_t)(V > 4 ? V - 3 : 1));
        }
    }
    for (int i = 0; i < 4 && st == TSR_OK; i++)
        if (np[i] == 0)
            st = tsr_error_set(TSR_ERR_INVALID, "fidelity: a part of the probe encodes to no "
                                                "tokens");
    int bos = tok ? tok->bos_id : c->bos_id;
    int32_t fixed = (bos >= 0) + (int32_t)(np[0] + np[1] + np[2] + np[3]);
    if (st == TSR_OK && len < fixed + 1)
        st = tsr_error_set(TSR_ERR_INVALID, "fidelity: --probe-length %d is too short: the "
                                            "probe needs at least %d tokens", len, fixed + 1);
    if (st == TSR_OK) {
        pr->ids = tsr_malloc((size_t)len * sizeof *pr->ids);
        if (!pr->ids) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK) {
        int32_t n = 0;
        if (bos >= 0) pr->ids[n++] = bos;
        (void)tsr__append_ids(pr->ids, &n, len, part[0], np[0], 0);
        pr->key_pos = n;
        pr->key_n = (int32_t)np[1];
        (void)tsr__append_ids(pr->ids, &n, len, part[1], np[1], 0);
        (void)tsr__append_ids(pr->ids, &n, len, part[2], np[2], 0);
        /* filler: the third part again, cycled, up to the question */
        for (int32_t j = 0; n < len - (int32_t)np[3]; j++)
            pr->ids[n++] = part[2][(size_t)j % np[2]];
        (void)tsr__append_ids(pr->ids, &n, len, part[3], np[3], 0);
        pr->n = n;
        pr->key = pr->ids + pr->key_pos;
    }
    for (int i = 0; i < 4; i++) tsr_free(part[i]);
    if (st != TSR_OK) {
        tsr_free(pr->ids);
        pr->ids = NULL;
    }
    return st;
}

/* (layer, key token) pairs resident in sequence 0 of kv: from the paged cache's slot
 * positions under a policy (host metadata), else from an exported copy. */
tsr_status tsr_fidelity_resident(const tsr_kv_cache *kv, int32_t key_pos, int32_t key_n,
                                 int64_t *hit, int64_t *total) {
    *hit = 0;
    *total = (int64_t)kv->n_layers * key_n;
    const tsr_kv_cache *mech = tsr_kv_policy_mech(kv);
    if (mech && tsr_kv_paged_block_size(mech) > 0) {
        tsr_status st = TSR_OK;
        int32_t *pos = NULL;
        for (int l = 0; st == TSR_OK && l < kv->n_layers; l++) {
            int32_t n = tsr_kv_paged_slots(mech, l, 0);
            int32_t *p = tsr_realloc(pos, (size_t)(n > 0 ? n : 1) * sizeof *p);
            if (!p) {
                st = TSR_ERR_NOMEM;
                break;
            }
            pos = p;
            st = tsr_kv_paged_read_slots(mech, l, 0, pos, NULL);
            for (int32_t s = 0; st == TSR_OK && s < n; s++)
                *hit += pos[s] >= key_pos && pos[s] < key_pos + key_n;
        }
        tsr_free(pos);
        return st;
    }
    tsr_kv_seq_state ss;
    TSR_TRY(tsr_kv_export_seq(kv, 0, &ss));
    for (int l = 0; l < ss.n_layers; l++) {
        const tsr_kv_seq_layer *L = &ss.layers[l];
        for (int32_t s = 0; s < L->slots; s++) {
            int32_t p = L->dense ? s : L->pos[s];
            *hit += p >= key_pos && p < key_pos + key_n;
        }
    }
    tsr_kv_seq_state_free(&ss);
    return TSR_OK;
}

static tsr_status tsr__run_probe(tsr__fid *f, const tsr_tokenizer *tok,
                                 tsr_fidelity_result *r) {
    const tsr_model_config *c = &f->pol->model->cfg;
    tsr__probe pr;
    int32_t len = f->o->probe_length;
    TSR_TRY(tsr__probe_make(c, tok, len, &pr));
    tsr_status st = TSR_OK;
    if ((int64_t)pr.n + pr.key_n - 1 > f->ctx)
        st = tsr_error_set(TSR_ERR_BUDGET, "fidelity: a probe of %d tokens and a %d-token "
                                           "answer exceed the context of %d tokens",
                           pr.n, pr.key_n, f->ctx);
    tsr_kv_cache *kv = f->pol->kv;
    int added = 0;
    if (st == TSR_OK) st = kv->ops->seq_add(kv, 0);
    if (st == TSR_OK) added = 1;
    /* The prompt in chunks, as a request's prefill. */
    for (int32_t at = 0; st == TSR_OK && at < pr.n; at += f->chunk) {
        int32_t n = pr.n - at < f->chunk ? pr.n - at : f->chunk;
        st = tsr__feed(f->pol, pr.ids + at, n, f->lp);
    }
    int64_t hit = 0, total = 0;
    if (st == TSR_OK) st = tsr_fidelity_resident(kv, pr.key_pos, pr.key_n, &hit, &total);
    /* Greedy answer: the first token from the prompt's last logits, then one a step. */
    int32_t match = 0;
    for (int32_t i = 0; st == TSR_OK && i < pr.key_n; i++) {
        int32_t next = tsr__argmax(f->lp, f->V);
        match += next == pr.key[i];
        if (i + 1 < pr.key_n) st = tsr__feed(f->pol, &next, 1, f->lp);
    }
    if (added) kv->ops->seq_free(kv, 0);
    if (st == TSR_OK) {
        r->probe_tokens = pr.n;
        r->probe_key_tokens = pr.key_n;
        r->probe_key_pos = pr.key_pos;
        r->probe_attention_recall = total > 0 ? (double)hit / (double)total : 0.0;
        r->probe_text_recall = tok ? (double)match / (double)pr.key_n : -1.0;
    }
    tsr_free(pr.ids);
    return st;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* The key of the full cache's reference: everything its logits depend on. */
static tsr_status tsr__ref_key(const tsr__fid *f, const tsr_engine_spec *model,
                               const char *text, size_t text_len, tsr_fullref_key *k) {
    const tsr_fidelity_options *o = f->o;
    tsr_fullref_key_init(k, "fidelity");
    TSR_TRY(tsr_fullref_key_file(k, "model", model->model_path));
    if (model->tokenizer_path) TSR_TRY(tsr_fullref_key_file(k, "tokenizer", model->tokenizer_path));
    else tsr_fullref_key_add(k, "tokenizer", "the model's");
    tsr_fullref_key_bytes(k, "text", text, text_len);
    tsr_fullref_key_add(k, "scoring", "document=%d doc_tokens=%d tail=%d decode_prefix=%d "
                        "prompt_tokens=%d max_tokens=%lld", o->document, o->doc_tokens,
                        o->tail_tokens, o->decode_prefix, o->prompt_tokens,
                        (long long)o->max_tokens);
    tsr_fullref_key_add(k, "engine", "backend=%s threads=%d chunk=%d ctx=%d vocab=%d",
                        f->pol->be->ops->name, f->pol->threads, f->chunk, f->ctx, f->V);
    /* what the matrices ran in: a run quantized at load (--dtype) computes other logits */
    tsr_fullref_key_add(k, "weights", "dtype=%s", tsr_dtype_name(f->pol->model->cfg.dtype));
    tsr_fullref_key_add(k, "kv", "block_size=%d dtype=%s", o->kv.block_size,
                        o->ref_kv_dtype ? o->ref_kv_dtype : "default");
    tsr_fullref_key_exe(k);
    return TSR_OK;
}

/* Why o->ref_dir can serve no reference for this run (static text for the caller to show),
 * or NULL when it does (or none is asked for). */
static const char *tsr__ref_unusable(const tsr_fidelity_options *o, const tsr_engine_spec *model,
                                     const tsr_tokenizer *tok, const char *text) {
    if (!o->ref_dir) return NULL;
    if (!text)
        return "a reference holds the full cache's logits over --text, and there is no text "
               "(the probe runs on the policy's cache alone)";
    if (o->gen_tokens > 0)
        return "--gen-tokens continues the text with the full cache's greedy tokens, which a "
               "reference does not hold";
    if (tok) return "the caller's tokenizer is not part of a reference's key";
    if (!model->model_path) return "the model is not named by a path (a reference's key)";
    return NULL;
}

/* The reference when ref_dir has it: replay (no full-cache engine); else record. */
static tsr_status tsr__ref_open(tsr__fid *f, const tsr_fullref_key *k) {
    void *data = NULL;
    size_t len = 0;
    TSR_TRY(tsr_fullref_load(f->o->ref_dir, k, &data, &len));
    f->ref = TSR__REF_RECORD;
    if (!data) return TSR_OK;
    tsr__ref_head h;
    size_t row = (size_t)f->V * sizeof(float);
    if (len >= sizeof h) memcpy(&h, data, sizeof h);
    if (len < sizeof h || h.vocab != (uint64_t)f->V || len != sizeof h + h.n_rows * row) {
        fprintf(stderr, "tessera fidelity: the full cache's reference in %s has the wrong size; "
                        "computing it anew\n", f->o->ref_dir);
        tsr_free(data);
        return TSR_OK;
    }
    f->ref_rows = tsr_malloc(h.n_rows ? h.n_rows * row : 1);
    if (!f->ref_rows) {
        tsr_free(data);
        return TSR_ERR_NOMEM;
    }
    memcpy(f->ref_rows, (char *)data + sizeof h, h.n_rows * row);
    f->ref_n = f->ref_cap = h.n_rows;
    f->ref_ids_hash = h.ids_hash; /* checked when the replay ends */
    f->ref = TSR__REF_REPLAY;
    tsr_free(data);
    return TSR_OK;
}

static tsr_status tsr__ref_save(tsr__fid *f, const tsr_fullref_key *k) {
    tsr__ref_head h = {.ids_hash = f->ids_hash, .n_rows = f->ref_n, .vocab = (uint64_t)f->V};
    size_t row = (size_t)f->V * sizeof(float), len = sizeof h + f->ref_n * row;
    char *buf = tsr_malloc(len);
    if (!buf) return TSR_ERR_NOMEM;
    memcpy(buf, &h, sizeof h);
    if (f->ref_n) memcpy(buf + sizeof h, f->ref_rows, f->ref_n * row);
    tsr_status st = tsr_fullref_save(f->o->ref_dir, k, buf, len);
    tsr_free(buf);
    return st;
}

/* The policy's engine from the caller's model spec (it loads or takes the model, and the
 * tokenizer when asked). */
static tsr_status tsr__engine_pol(tsr__fid *f, const tsr_engine_spec *model) {
    const tsr_fidelity_options *o = f->o;
    tsr_engine_spec eo = *model;
    eo.backend = o->backend ? o->backend : "cpu";
    eo.threads = o->threads > 0 ? o->threads : 1;
    eo.max_tokens = o->chunk_tokens > 0 ? o->chunk_tokens : 256;
    eo.one_sequence = true; /* the chunk is held to the context */
    eo.kv = o->kv;
    eo.kv.max_seqs = 1;
    TSR_TRY(tsr_engine_create(&eo, &f->pol));
    f->V = f->pol->model->cfg.vocab_size;
    f->ctx = f->pol->ctx;
    f->chunk = f->pol->max_tokens;
    return TSR_OK;
}

/* The full cache's engine over the policy engine's model (borrowed): the same pool, blocks
 * and context, and nothing a policy adds. */
static tsr_status tsr__engine_full(tsr__fid *f) {
    const tsr_fidelity_options *o = f->o;
    const tsr_kv_options *k = &o->kv;
    tsr_engine_spec eo = {.model = f->pol->model, .borrow_model = true,
                          .backend = o->backend ? o->backend : "cpu", .threads = f->pol->threads,
                          .max_tokens = f->chunk};
    eo.kv = (tsr_kv_options){.policy = &tsr_kv_policy_paged, .memory_bytes = k->memory_bytes,
                             .memory_fraction = k->memory_fraction,
                             .block_size = k->block_size, .max_seqs = 1,
                             .no_prefix_cache = k->no_prefix_cache,
                             .host_bytes = k->host_bytes, .chunk_tokens = f->chunk,
                             .max_context = f->ctx, .kv_dtype = o->ref_kv_dtype};
    return tsr_engine_create(&eo, &f->full);
}

tsr_status tsr_fidelity_run(const tsr_engine_spec *model, const tsr_tokenizer *tok,
                            const char *text, size_t text_len, const tsr_fidelity_options *o,
                            tsr_fidelity_result *out) {
    memset(out, 0, sizeof *out);
    out->probe_text_recall = -1.0;
    out->probe_attention_recall = -1.0;
    double t0 = tsr_sys_now();
    tsr__fid f = {.o = o, .ids_hash = TSR_FULLREF_HASH0};
    tsr_status st = tsr__engine_pol(&f, model);
    /* The full cache's side from a reference when one is kept: text scoring by the
     * engine's own tokenizer, no greedy continuation (the reference holds logits only). */
    tsr_fullref_key key;
    out->reference_unused = tsr__ref_unusable(o, model, tok, text);
    bool use_ref = st == TSR_OK && o->ref_dir && !out->reference_unused;
    if (use_ref) st = tsr__ref_key(&f, model, text, text_len, &key);
    if (use_ref && st == TSR_OK) {
        out->reference_unused = tsr_fullref_key_unusable(&key);
        use_ref = !out->reference_unused;
    }
    if (use_ref && st == TSR_OK) st = tsr__ref_open(&f, &key);
    if (st == TSR_OK && f.ref != TSR__REF_REPLAY) st = tsr__engine_full(&f);
    if (st == TSR_OK && !tok) tok = f.pol->tok;
    if (st == TSR_OK && text && !tok)
        st = tsr_error_set(TSR_ERR_INVALID, "fidelity: scoring text needs a tokenizer");
    if (st == TSR_OK && !text && o->probe_length <= 0)
        st = tsr_error_set(TSR_ERR_INVALID, "fidelity: nothing to measure (no text, no "
                                            "probe)");
    if (st == TSR_OK && o->probe_length > f.ctx)
        st = tsr_error_set(TSR_ERR_INVALID, "fidelity: --probe-length %d exceeds the context "
                                            "of %d tokens", o->probe_length, f.ctx);
    if (st == TSR_OK) {
        out->policy = tsr_kv_policy_name(f.pol->kv);
        out->dtype = tsr_dtype_name(f.pol->model->cfg.dtype);
        f.lf = tsr_malloc((size_t)f.V * sizeof *f.lf);
        f.lp = tsr_malloc((size_t)f.V * sizeof *f.lp);
        if (!f.lf || !f.lp) st = TSR_ERR_NOMEM;
    }
    if (st == TSR_OK && text) {
        st = tsr__score_text(&f, tok, text, text_len, &out->windows);
        if (st == TSR_OK && f.count == 0)
            st = tsr_error_set(TSR_ERR_INVALID, "fidelity: the text has no token to score");
        /* a replay used every row of a reference of the same tokens, or it is not this
         * run's (the key should have said so: the tokenizer beside the model changed) */
        if (st == TSR_OK && f.ref == TSR__REF_REPLAY) {
            if (f.ref_at != f.ref_n || f.ids_hash != f.ref_ids_hash)
                st = tsr_error_set(TSR_ERR_FORMAT, "fidelity: the full cache's reference in %s "
                                   "does not match this run (%zu of its %zu rows used, tokens %s); delete "
                                   "it", o->ref_dir, f.ref_at, f.ref_n,
                                   f.ids_hash == f.ref_ids_hash ? "the same" : "differ");
        }
        if (st == TSR_OK && f.ref == TSR__REF_RECORD) st = tsr__ref_save(&f, &key);
    }
    if (st == TSR_OK && text) {
        out->tokens = f.count;
        out->nll = f.nll / (double)f.count;
        out->nll_full = f.nll_full / (double)f.count;
        out->ppl = exp(out->nll);
        out->ppl_full = exp(out->nll_full);
        out->agreement = (double)f.agree / (double)f.count;
        out->kl = f.kl / (double)f.count;
        out->gen_tokens = f.gen_count;
        if (f.gen_count > 0) {
            out->gen_agreement = (double)f.gen_agree / (double)f.gen_count;
            out->gen_kl = f.gen_kl / (double)f.gen_count;
        }
    }
    if (st == TSR_OK && o->probe_length > 0) st = tsr__run_probe(&f, tok, out);
    if (st == TSR_OK) tsr_kv_stats_json(f.pol->kv, out->kv_json, sizeof out->kv_json);
    out->reference = f.ref == TSR__REF_REPLAY   ? "reused"
                     : f.ref == TSR__REF_RECORD ? "computed"
                                                : "none";
    tsr_free(f.ref_rows);
    tsr_free(f.lf);
    tsr_free(f.lp);
    tsr_engine_destroy(f.full);
    tsr_engine_destroy(f.pol);
    out->wall_s = tsr_sys_now() - t0;
    return st;
}
