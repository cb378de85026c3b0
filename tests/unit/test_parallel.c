/* runtime/parallel: layout checks, rank mapping and per-rank shards. */
#include "runtime/exec/parallel.h"
#include "tests/test.h"

/* stories260K: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads. */
static tsr_model_config tsr__stories(void) {
    tsr_model_config c = {0};
    c.dim = 64;
    c.hidden_dim = 172;
    c.n_layers = 5;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 8;
    c.vocab_size = 512;
    c.max_seq_len = 512;
    return c;
}

static const char *M = "models/stories260K.bin";

TSR_TEST(test_layout_world_size) {
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 2, 4, &l));
    ASSERT_EQ_INT(l.world_size, 4);
    ASSERT_OK(tsr_parallel_layout_init(3, 1, 0, &l));
    ASSERT_EQ_INT(l.world_size, 3);
    ASSERT_EQ_INT(tsr_parallel_layout_init(3, 1, 4, &l), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--tp 3 x --pp 1 needs 3 ranks, but the job has 4");
    ASSERT_EQ_INT(tsr_parallel_layout_init(0, 1, 0, &l), TSR_ERR_INVALID);
    ASSERT_EQ_INT(tsr_parallel_layout_init(1, -2, 0, &l), TSR_ERR_INVALID);
}

TSR_TEST(test_rank_mapping) {
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 3, 6, &l));
    /* TP groups are consecutive ranks: world = pp_rank * tp + tp_rank. */
    for (int r = 0; r < 6; r++) {
        ASSERT_EQ_INT(tsr_parallel_tp_rank(&l, r), r % 2);
        ASSERT_EQ_INT(tsr_parallel_pp_rank(&l, r), r / 2);
        ASSERT_EQ_INT(tsr_parallel_world_rank(&l, r % 2, r / 2), r);
    }
}

TSR_TEST(test_tp_must_divide_heads) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(3, 1, 3, &l));
    ASSERT_EQ_INT(tsr_parallel_validate(&l, &c, M), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(),
                  "--tp 3 does not divide the 8 attention heads of models/stories260K.bin");
    tsr_parallel_shard s;
    ASSERT_EQ_INT(tsr_parallel_shard_of(&l, &c, 0, M, &s), TSR_ERR_INVALID);
}

TSR_TEST(test_kv_heads_split) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 1, 2, &l));
    tsr_parallel_shard s0, s1;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 0, M, &s0));
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 1, M, &s1));
    ASSERT_EQ_INT(s0.head_begin, 0);
    ASSERT_EQ_INT(s0.head_end, 4);
    ASSERT_EQ_INT(s1.head_begin, 4);
    ASSERT_EQ_INT(s1.head_end, 8);
    ASSERT_EQ_INT(s0.kv_head_begin, 0);
    ASSERT_EQ_INT(s0.kv_head_end, 2);
    ASSERT_EQ_INT(s1.kv_head_begin, 2);
    ASSERT_EQ_INT(s1.kv_head_end, 4);
    ASSERT_TRUE(!s0.kv_replicated && !s1.kv_replicated);
    /* tp 4: one KV head each, still a split. */
    ASSERT_OK(tsr_parallel_layout_init(4, 1, 4, &l));
    for (int r = 0; r < 4; r++) {
        ASSERT_OK(tsr_parallel_shard_of(&l, &c, r, M, &s0));
        ASSERT_EQ_INT(s0.kv_head_begin, r);
        ASSERT_EQ_INT(s0.kv_head_end, r + 1);
        ASSERT_TRUE(!s0.kv_replicated);
        ASSERT_EQ_INT(s0.kv_share_begin, r);
        ASSERT_EQ_INT(s0.kv_share_end, r + 1);
    }
}

TSR_TEST(test_kv_heads_replicated) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    /* tp 8 > 4 KV heads: each KV head on the 2 ranks whose query heads use it. */
    ASSERT_OK(tsr_parallel_layout_init(8, 1, 8, &l));
    for (int r = 0; r < 8; r++) {
        tsr_parallel_shard s;
        ASSERT_OK(tsr_parallel_shard_of(&l, &c, r, M, &s));
        ASSERT_EQ_INT(s.head_begin, r);
        ASSERT_EQ_INT(s.head_end, r + 1);
        ASSERT_EQ_INT(s.kv_head_begin, r / 2);
        ASSERT_EQ_INT(s.kv_head_end, r / 2 + 1);
        ASSERT_TRUE(s.kv_replicated);
        ASSERT_EQ_INT(s.kv_share_begin, r / 2 * 2); /* the pair of ranks that hold it */
        ASSERT_EQ_INT(s.kv_share_end, r / 2 * 2 + 2);
        /* The query head's GQA group is the KV head held. */
        ASSERT_EQ_INT(s.head_begin / (c.n_heads / c.n_kv_heads), s.kv_head_begin);
    }
    /* 12 heads, 4 KV heads, tp 6: divides the heads, neither divides nor is a multiple of
     * the KV heads. */
    c.n_heads = 12;
    c.dim = 96;
    ASSERT_OK(tsr_parallel_layout_init(6, 1, 6, &l));
    ASSERT_EQ_INT(tsr_parallel_validate(&l, &c, M), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--tp 6 neither divides the 4 KV heads");
    /* 12 heads, 4 KV heads, tp 12: multiple of 4, 3 ranks per KV head. */
    ASSERT_OK(tsr_parallel_layout_init(12, 1, 12, &l));
    tsr_parallel_shard s;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 5, M, &s));
    ASSERT_EQ_INT(s.kv_head_begin, 1);
    ASSERT_TRUE(s.kv_replicated);
    ASSERT_EQ_INT(s.kv_share_begin, 3); /* ranks 3, 4, 5 hold KV head 1 */
    ASSERT_EQ_INT(s.kv_share_end, 6);
}

TSR_TEST(test_hidden_columns) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 1, 2, &l));
    tsr_parallel_shard s;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 1, M, &s));
    /* Whole chunks of the 8 canonical parts: 22+22+22+22 | 21+21+21+21. */
    ASSERT_EQ_INT(s.hidden_begin, 88);
    ASSERT_EQ_INT(s.hidden_end, 172);
    ASSERT_EQ_INT(s.n_parts, 8);
    ASSERT_EQ_INT(s.part_begin, 4);
    ASSERT_EQ_INT(s.part_end, 8);
    /* Uneven: 172 over 8 ranks -> four of 22 then four of 21, covering every column once. */
    ASSERT_OK(tsr_parallel_layout_init(8, 1, 8, &l));
    int next = 0;
    for (int r = 0; r < 8; r++) {
        ASSERT_OK(tsr_parallel_shard_of(&l, &c, r, M, &s));
        ASSERT_EQ_INT(s.hidden_begin, next);
        ASSERT_EQ_INT(s.hidden_end - s.hidden_begin, r < 4 ? 22 : 21);
        next = s.hidden_end;
    }
    ASSERT_EQ_INT(next, 172);
    /* Part boundaries line up for every tp: the tp=4 ranges are unions of tp=8 ranges. */
    ASSERT_OK(tsr_parallel_layout_init(4, 1, 4, &l));
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 2, M, &s));
    ASSERT_EQ_INT(s.hidden_begin, 88);
    ASSERT_EQ_INT(s.hidden_end, 130);
    c.hidden_dim = 4;
    ASSERT_EQ_INT(tsr_parallel_validate(&l, &c, M), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "4 MLP columns cannot form a chunk for each of the 8");
}

TSR_TEST(test_pipeline_layers) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(1, 2, 2, &l));
    tsr_parallel_shard s0, s1;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 0, M, &s0));
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 1, M, &s1));
    ASSERT_EQ_INT(s0.layer_begin, 0);
    ASSERT_EQ_INT(s0.layer_end, 3);
    ASSERT_EQ_INT(s1.layer_begin, 3);
    ASSERT_EQ_INT(s1.layer_end, 5);
    ASSERT_TRUE(s0.first_stage && !s0.last_stage);
    ASSERT_TRUE(!s1.first_stage && s1.last_stage);
    /* Full heads on every rank when tp = 1. */
    ASSERT_EQ_INT(s1.head_end - s1.head_begin, 8);
    ASSERT_EQ_INT(s1.kv_head_end - s1.kv_head_begin, 4);
    /* pp 5 = one layer each; pp 6 is too many. */
    ASSERT_OK(tsr_parallel_layout_init(1, 5, 5, &l));
    for (int r = 0; r < 5; r++) {
        ASSERT_OK(tsr_parallel_shard_of(&l, &c, r, M, &s0));
        ASSERT_EQ_INT(s0.layer_begin, r);
        ASSERT_EQ_INT(s0.layer_end, r + 1);
    }
    ASSERT_OK(tsr_parallel_layout_init(1, 6, 6, &l));
    ASSERT_EQ_INT(tsr_parallel_validate(&l, &c, M), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "--pp 6 exceeds the 5 layers of models/stories260K.bin");
}

TSR_TEST(test_tp_x_pp) {
    tsr_model_config c = tsr__stories();
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 2, 4, &l));
    tsr_parallel_shard s;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 3, M, &s));
    ASSERT_EQ_INT(s.tp_rank, 1);
    ASSERT_EQ_INT(s.pp_rank, 1);
    ASSERT_EQ_INT(s.head_begin, 4);
    ASSERT_EQ_INT(s.kv_head_begin, 2);
    ASSERT_EQ_INT(s.layer_begin, 3);
    char line[256];
    tsr_parallel_shard_format(&s, line, sizeof line);
    ASSERT_STR_EQ(line, "rank 3 (tp 1, pp 1): heads 4-7, kv heads 2-3, hidden cols 88-171, "
                        "layers 3-4, classifier");
    ASSERT_EQ_INT(tsr_parallel_shard_of(&l, &c, 4, M, &s), TSR_ERR_INVALID);
}

TSR_TEST(test_split) {
    int b, e;
    tsr_parallel_split(10, 3, 0, &b, &e);
    ASSERT_EQ_INT(b, 0);
    ASSERT_EQ_INT(e, 4);
    tsr_parallel_split(10, 3, 2, &b, &e);
    ASSERT_EQ_INT(b, 7);
    ASSERT_EQ_INT(e, 10);
}

/* Hidden chunks in whole 32-column units when every part gets one (stories110M: 2048 over
 * 12 parts), the remainder in the last chunk, and an even split when there are fewer units
 * than parts (stories260K: 172 over 8). */
TSR_TEST(test_hidden_chunk_units) {
    int b, e, next = 0;
    for (int i = 0; i < 12; i++) {
        tsr_parallel_hidden_chunk(2048, 12, i, &b, &e);
        ASSERT_EQ_INT(b, next);
        ASSERT_EQ_INT(b % TSR_PARALLEL_HIDDEN_UNIT, 0);
        ASSERT_EQ_INT(e - b, i < 4 ? 192 : 160);
        next = e;
    }
    ASSERT_EQ_INT(next, 2048);
    tsr_parallel_hidden_chunk(2050, 12, 11, &b, &e);
    ASSERT_EQ_INT(b, 1888);
    ASSERT_EQ_INT(e, 2050);
    tsr_parallel_hidden_chunk(172, 8, 7, &b, &e);
    ASSERT_EQ_INT(b, 151);
    ASSERT_EQ_INT(e, 172);
    /* A tp=2 shard of stories110M-shaped MLP: whole chunks, segments relative to its start. */
    tsr_model_config c = tsr__stories();
    c.dim = 768;
    c.hidden_dim = 2048;
    c.n_heads = 12;
    c.n_kv_heads = 12;
    c.head_dim = 64;
    tsr_parallel_layout l;
    ASSERT_OK(tsr_parallel_layout_init(2, 1, 2, &l));
    tsr_parallel_shard s;
    ASSERT_OK(tsr_parallel_shard_of(&l, &c, 1, M, &s));
    ASSERT_EQ_INT(s.hidden_begin, 1088);
    ASSERT_EQ_INT(s.hidden_end, 2048);
    int32_t down[7];
    tsr_parallel_shard_segments(&s, &c, NULL, down);
    ASSERT_EQ_INT(down[0], 0);
    ASSERT_EQ_INT(down[1], 160);
    ASSERT_EQ_INT(down[6], 960);
}

TSR_TEST_MAIN(test_layout_world_size, test_rank_mapping, test_tp_must_divide_heads,
              test_kv_heads_split, test_kv_heads_replicated, test_hidden_columns,
              test_pipeline_layers, test_tp_x_pp, test_split, test_hidden_chunk_units)
