/* The checkpoint fuzz_checkpoint starts from: written by tsr_ckpt_write itself, so it
 * follows the format when that changes. Two requests, one running with the KV of 5 tokens in
 * 2 layers of 2 KV heads of 2 (with scores; one layer has an evicted slot), one waiting. */
#ifndef TSR_TESTS_FUZZ_CKPT_BASE_H
#define TSR_TESTS_FUZZ_CKPT_BASE_H

#include <string.h>

#include "jobs/run/checkpoint.h"

#define TSR__KVD 4

static inline tsr_status tsr_fuzz_ckpt_write_base(const char *path) {
    int32_t toks[6] = {1, 2, 3, 4, 5, 9}, pos[5] = {0, 1, 2, 3, 4}, pos1[4] = {0, 2, 3, 4};
    float k[5 * TSR__KVD], v[5 * TSR__KVD], score[5] = {0.5f, 0.25f, 0.125f, 1.0f, 2.0f};
    for (int i = 0; i < 5 * TSR__KVD; i++) {
        k[i] = (float)i * 0.25f;
        v[i] = -(float)i;
    }
    tsr_kv_seq_layer layers[2] = {
        {.slots = 5, .dense = 1, .k = k, .v = v, .pos = pos, .score = score},
        {.slots = 4, .dense = 0, .k = k, .v = v, .pos = pos1, .score = score},
    };
    tsr_ckpt c = {.meta = {.format_version = TSR_CKPT_VERSION, .model = "m.bin", .dim = 16,
                           .n_layers = 2, .n_heads = 2, .n_kv_heads = 2, .vocab_size = 32,
                           .dtype = "f32", .policy = "h2o", .block_size = 4, .tp = 1,
                           .pp = 1, .rank = 0, .world = 1, .max_batch_seqs = 2,
                           .max_context = 16, .kv_layers = 2, .kv_dim = TSR__KVD,
                           .output = "out.jsonl", .output_records = 3}};
    tsr_ckpt_req reqs[2];
    memset(reqs, 0, sizeof reqs);
    char stop[] = "\n\n", text[] = "once upon", id[] = "req-1";
    reqs[0] = (tsr_ckpt_req){.s = {.tag = 3, .tokens = toks, .n_tokens = 6, .n_prompt = 4,
                                   .n_computed = 5, .n_generated = 2, .max_new_tokens = 8,
                                   .sampling = {.temperature = 0.7f, .top_p = 0.9f, .seed = 5},
                                   .rng = 0x123456789abcdefull, .sampler_ready = 1, .slot = 0},
                             .custom_id = id, .line = 2, .kind = 1, .n_stops = 1,
                             .text = text, .len = strlen(text), .prev = 5, .n_prompt = 4,
                             .n_gen = 2, .has_kv = true,
                             .kv = {.len = 5, .tokens = toks, .n_layers = 2,
                                    .kv_dim = TSR__KVD, .has_scores = 1, .layers = layers}};
    reqs[0].stops[0] = stop;
    reqs[1] = (tsr_ckpt_req){.s = {.tag = 0, .tokens = toks, .n_tokens = 3, .n_prompt = 3,
                                   .max_new_tokens = 8, .sampling = {.top_p = 1.0f},
                                   .slot = -1},
                             .line = 3};
    c.reqs = reqs;
    c.n_reqs = 2;
    return tsr_ckpt_write(path, &c);
}

#endif
