/* Fidelity of a KV policy against the full cache: two engines on the same model, one with
 * the paged cache (keeps every token), one with the policy under test, fed the same tokens
 * side by side. Used by `tessera fidelity`, bench/quality.sh and `tessera characterize`.
 *
 * Held-out text (blank-line separated stories, each one sequence from BOS; a story longer
 * than the context is scored in windows of the context) is scored in decode mode: one token
 * per forward call, so a policy evicts exactly as in generation. At each position both
 * caches get the same token (the text's: teacher forcing on the reference tokens, which the
 * full cache is fed too), and from the two next-token distributions come:
 * - nll / nll_full: mean negative log-likelihood (nats/token) of the text's next token, and
 *   the perplexities exp(nll);
 * - agreement: the share of positions where the greedy (argmax, first index on ties) next
 *   tokens of policy and full cache are the same;
 * - kl: KL(full || policy) of the next-token distributions (nats), mean over positions.
 * The paged policy against itself gives agreement 1 and kl 0.0 exactly: both engines
 * compute the same bits and each KL term is p * (x - x).
 * With gen_tokens > 0 every scored sequence then goes on for that many greedy tokens of the
 * full cache (as the context allows), fed to both caches (teacher forcing on the full
 * cache's own tokens): gen_agreement and gen_kl are agreement and KL over those positions,
 * where the inputs are the full cache's generation rather than reference text.
 *
 * The retrieval probe (passkey / needle): a key of a few tokens placed early in a long
 * filler context, then a question that asks for it, probe_length tokens in all; the prompt
 * is prefilled in chunks through the policy's cache as a generation request is, then:
 * - attention recall: the share of (layer, key token) pairs still resident in the policy's
 *   cache once the prompt is in (when the answer's first token is computed), read from the
 *   cache's slot positions (host metadata, no K/V bytes move). Meaningful on any model;
 * - text recall: greedy decoding after the question; the share of the key's tokens it
 *   reproduces in place. Only with a tokenizer (the probe is text), meaningful only on a
 *   real model within its context. Without a tokenizer the probe is made of token ids and
 *   text recall is not measured. */
#ifndef TSR_RUNTIME_FIDELITY_H
#define TSR_RUNTIME_FIDELITY_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/exec/kv_setup.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr_fidelity_options {
    const char *backend;  /* auto, cpu, cpu-fenced, cuda (NULL: cpu) */
    int threads;          /* CPU kernel threads (0: 1) */
    /* The policy under test and its options; the full cache gets the same pool, block
     * size and context with policy paged and no budget. max_seqs is set to 1. */
    tsr_kv_options kv;
    int chunk_tokens;     /* probe prefill chunk (0: 256) */
    int64_t max_tokens;   /* text positions scored at most (0: all of the text) */
    int probe_length;     /* tokens of the retrieval probe's prompt (0: no probe) */
    int gen_tokens;       /* greedy continuation after each text sequence (0: none) */
    /* Text: the first prompt_tokens of each sequence go in as one prefill chunk (a prompt;
     * only its last position is scored), the rest one token per call. What a policy does at
     * the end of a prompt (snapkv's selection) is measured only this way. 0: every position
     * in decode mode. Needs chunk_tokens >= prompt_tokens. */
    int prompt_tokens;
    /* The full cache's KV dtype (--ref-kv-dtype; NULL: the backend's default), so that a KV
     * dtype is measured against another (kernels/kv_dtype.h). */
    const char *ref_kv_dtype;
    /* Documents: the whole text is one sequence (no blank-line split), its first
     * doc_tokens tokens from BOS (0: as many as the context holds). */
    bool document;
    int doc_tokens;
    /* Tail scoring: only the last tail_tokens positions of each sequence are scored. The
     * rest goes in first, as a prompt prefilled in chunks (an 8K document costs one
     * prefill and tail_tokens decode steps per cache), or with decode_prefix one token per
     * call without scoring (decode-only: a policy evicts through the whole prefix as in
     * generation). 0: the modes above. */
    int tail_tokens;
    bool decode_prefix;
    /* A directory of full-cache references (runtime/eval/fullref.h; NULL: none): the full
     * cache's logits at the scored positions are read from there when a reference of the
     * same model, text and options exists (the full cache's engine is then never made),
     * else computed and written there. Text scoring only, without gen_tokens; the results
     * are the same bits either way. Needs model->model_path. Where it serves no reference,
     * the result's reference_unused says why. */
    const char *ref_dir;
} tsr_fidelity_options;

typedef struct tsr_fidelity_result {
    const char *policy;  /* the policy's name (static) */
    int64_t tokens;      /* text positions scored (0: no text) */
    int windows;         /* sequences scored (stories, or windows of long ones) */
    double nll, ppl;           /* the policy's */
    double nll_full, ppl_full; /* the full cache's */
    double agreement;          /* [0, 1] */
    double kl;                 /* >= 0 */
    int64_t gen_tokens;        /* continuation positions compared (0: none) */
    double gen_agreement, gen_kl;
    int probe_tokens;          /* the probe's prompt length (0: no probe ran) */
    int probe_key_tokens;      /* key tokens (the answer's length) */
    int probe_key_pos;         /* position of the key's first token */
    double probe_text_recall;      /* [0, 1]; < 0: not measured (no tokenizer) */
    double probe_attention_recall; /* [0, 1]; < 0: no probe */
    double wall_s;
    /* the full cache's side: "none" (computed, not kept), "computed" (and written to
     * ref_dir) or "reused" (read from ref_dir) (static) */
    const char *reference;
    /* ref_dir was given but serves no reference for this run: why (static), else NULL */
    const char *reference_unused;
    const char *dtype; /* the dtype the model's matrices ran in (static) */
    char kv_json[2048];  /* the policy cache's stats at the end (tsr_kv_stats_json) */
} tsr_fidelity_result;

/* Runs text (may be NULL: no text scoring) and the probe (o->probe_length > 0) through
 * both caches. `model` says where the model comes from (an engine spec's model_path, or
 * model with borrow_model; load_tokenizer, tokenizer_path): the policy's engine starts
 * from it, the full cache's engine borrows its model; fidelity sets the rest (backend,
 * threads, KV, chunk). `tok` NULL: the engine's tokenizer, if it loaded one; without one
 * there is no text (the probe is then made of token ids). Fails with one line when the
 * text is empty, a probe does not fit the context, or an engine cannot start. */
tsr_status tsr_fidelity_run(const tsr_engine_spec *model, const tsr_tokenizer *tok,
                            const char *text, size_t text_len, const tsr_fidelity_options *o,
                            tsr_fidelity_result *out);

/* (layer, token) pairs of positions [pos, pos + n) resident in sequence 0 of kv, out of
 * n_layers * n: the attention recall of a probe or needle (host metadata, no K/V moves). */
tsr_status tsr_fidelity_resident(const tsr_kv_cache *kv, int32_t pos, int32_t n, int64_t *hit,
                                 int64_t *total);

/* Log-softmax helpers, exposed for tests: the natural-log NLL of `next` under logits, and
 * KL(p || q) of softmax(p) against softmax(q) over n entries. */
double tsr_fidelity_nll(const float *logits, int n, int32_t next);
double tsr_fidelity_kl(const float *p, const float *q, int n);

#endif
