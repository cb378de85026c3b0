/* Needle retrieval on an instruct model: a key sentence ("The pass key is 71432. Remember
 * it.") planted at a depth of a real-text haystack, the question asked through the model's
 * own chat template (tsr_model_chat_template), the prompt `length` tokens in all, prefilled
 * in chunks through the cache as a request is, then a greedy answer. Used by
 * `tessera needle` and the study's needle cells.
 *
 * Both caches answer, on the same prompt: the full cache (paged, every token kept) and the
 * policy under test (when the policy is paged with the full cache's KV dtype, one engine
 * answers for both: the same computation). The full cache's score comes first: where it fails, the cell measures
 * the model (its context use), not the policy. Scoring is exact match: the first run of
 * digits in the generated answer equals the key. Attention recall is the share of
 * (layer, needle token) pairs resident in the policy's cache once the prompt is in
 * (tsr_fidelity_resident).
 *
 * Multi-needle (needles = 3): three keys for three doors ("The pass key of the blue door is
 * 58316. Remember it."), the asked one (blue) at `depth`, the two others a third and two
 * thirds of the haystack further on (wrapping around); the question asks for the blue
 * door's key. */
#ifndef TSR_RUNTIME_NEEDLE_H
#define TSR_RUNTIME_NEEDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/engine/engine.h"
#include "runtime/exec/kv_setup.h"

#define TSR_NEEDLE_MAX_DEPTHS 16

typedef struct tsr_needle_options {
    const char *backend;   /* NULL: cpu */
    int threads;           /* 0: 1 */
    tsr_kv_options kv;     /* the policy under test; max_seqs is set to 1 */
    int chunk_tokens;      /* prefill chunk (0: 256) */
    int length;            /* prompt tokens, rendered template included (the haystack fills
                              what the needle, question and template leave) */
    int n_depths;          /* 1 .. TSR_NEEDLE_MAX_DEPTHS */
    double depths[TSR_NEEDLE_MAX_DEPTHS]; /* [0, 1]: where the asked needle goes */
    int needles;           /* 1 or 3 */
    int answer_tokens;     /* greedy tokens generated at most (0: 16) */
    /* A directory of full-cache references (runtime/eval/fullref.h; NULL: none): the
     * prompts and the full cache's answers are read from there when a reference of the
     * same model, haystack and options exists (the full cache's engine is then never made),
     * else computed and written there. Needs model->model_path. */
    const char *ref_dir;
    /* The policy is not run at a depth where the full cache fails (the cell measures the
     * model there, not the policy): its answer is recorded as not run. */
    bool skip_where_full_fails;
} tsr_needle_options;

typedef struct tsr_needle_answer {
    bool correct;          /* exact match of the key */
    double attention_recall; /* [0, 1] */
    char text[96];         /* the generated answer (cut) */
} tsr_needle_answer;

typedef struct tsr_needle_cell {
    double depth;
    bool policy_ran;       /* false: skipped where the full cache fails (options above) */
    int prompt_tokens;     /* the rendered prompt's length */
    int needle_pos, needle_tokens; /* the asked needle's span in the prompt */
    tsr_needle_answer full, policy;
} tsr_needle_cell;

typedef struct tsr_needle_result {
    const char *policy;    /* static */
    const char *dtype;     /* the dtype the model's matrices ran in (static) */
    const char *key;       /* the asked key (static) */
    int n_cells;
    tsr_needle_cell cells[TSR_NEEDLE_MAX_DEPTHS];
    double wall_s;
    /* the full cache's side: "none" (computed, not kept), "computed" (and written to
     * ref_dir), "reused" (read from ref_dir) (static) */
    const char *reference;
    /* the policy is the full cache itself (paged, the full cache's KV dtype): one engine
     * answered for both */
    bool policy_is_full;
    char kv_json[2048];    /* the policy cache's stats at the end */
} tsr_needle_result;

/* `model`: as tsr_fidelity_run's (model_path needed: the chat template is read from it).
 * The haystack text is cycled when it holds fewer tokens than the prompt needs. Fails with
 * one line when the model has no chat template, the prompt does not fit the context, or an
 * engine cannot start. */
tsr_status tsr_needle_run(const tsr_engine_spec *model, const char *haystack, size_t len,
                          const tsr_needle_options *o, tsr_needle_result *out);

/* Exact match, exposed for tests: the first run of digits in `answer` is `key`. */
bool tsr_needle_match(const char *answer, const char *key);

#endif
