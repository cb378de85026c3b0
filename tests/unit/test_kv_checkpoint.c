/* Checkpoint round trips: a paged sequence exported (after evictions, with scores) and
 * imported into another pool holds the same rows, positions and scores and goes on the same
 * way; a tsr_ckpt written to HDF5 reads back field for field; damaged files fail with one
 * line. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jobs/run/checkpoint.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

enum { LAYERS = 3, HEADS = 2, HD = 4, KVD = HEADS * HD, BS = 4 };

static tsr_kv_cache *tsr__cache(int64_t blocks) {
    tsr_kv_paged_config c = {.n_layers = LAYERS, .n_kv_heads = HEADS, .head_dim = HD,
                             .block_size = BS, .max_seqs = 4, .max_seq_len = 64,
                             .prefix_caching = 1, .keep_scores = 1, .be = kvt_be, .kv_dtype = kvt_dtype()};
    c.memory_bytes = blocks * tsr_kv_paged_block_bytes(&c);
    tsr_kv_cache *kv = NULL;
    return tsr_kv_paged_create(&c, &kv) == TSR_OK ? kv : NULL;
}

/* Appends n tokens (rows derived from position and layer) to seq. */
static tsr_status tsr__grow(tsr_kv_cache *kv, int seq, int n) {
    int32_t len = kv->ops->seq_len(kv, seq);
    TSR_TRY(kv->ops->reserve(kv, seq, n));
    float k[16 * KVD], v[16 * KVD];
    int32_t toks[16];
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < n; i++)
            for (int d = 0; d < KVD; d++) {
                k[i * KVD + d] = (float)(len + i) + 0.01f * (float)d + 100.0f * (float)l;
                v[i * KVD + d] = -k[i * KVD + d];
            }
        TSR_TRY(kvt_write(kv, l, seq, n, k, v));
    }
    for (int i = 0; i < n; i++) toks[i] = 7 + len + i;
    return kv->ops->commit(kv, seq, toks, n);
}

/* Same rows, positions and scores in every layer. */
static int tsr__same(tsr_kv_cache *a, int sa, tsr_kv_cache *b, int sb) {
    if (a->ops->seq_len(a, sa) != b->ops->seq_len(b, sb)) return 0;
    for (int l = 0; l < LAYERS; l++) {
        int32_t n = tsr_kv_paged_slots(a, l, sa);
        if (n != tsr_kv_paged_slots(b, l, sb)) return 0;
        int32_t pa[64], pb[64];
        float ca[64], cb[64];
        if (tsr_kv_paged_read_slots(a, l, sa, pa, ca) || tsr_kv_paged_read_slots(b, l, sb, pb, cb))
            return 0;
        float ka[64 * KVD], va[64 * KVD], kb[64 * KVD], vb[64 * KVD];
        if (tsr_kv_paged_gather(a, l, sa, NULL, n, ka, va) ||
            tsr_kv_paged_gather(b, l, sb, NULL, n, kb, vb))
            return 0;
        for (int32_t i = 0; i < n; i++)
            if (pa[i] != pb[i] || ca[i] != cb[i]) return 0;
        if (memcmp(ka, kb, (size_t)n * KVD * 4) || memcmp(va, vb, (size_t)n * KVD * 4)) return 0;
    }
    return 1;
}

TSR_KV_TEST(kv_export_import_round_trip) {
    tsr_kv_cache *a = tsr__cache(64), *b = tsr__cache(40);
    ASSERT_TRUE(a && b);
    ASSERT_EQ_INT(a->ops->seq_add(a, 1), TSR_OK);
    ASSERT_EQ_INT(tsr__grow(a, 1, 11), TSR_OK);
    /* scores and an eviction in layer 1 only: layers differ, layer 1 is no longer dense */
    float sc[16];
    for (int i = 0; i < 11; i++) sc[i] = (float)(i * 3 % 5);
    ASSERT_EQ_INT(tsr_kv_paged_add_slot_scores(a, 1, 1, sc), TSR_OK);
    int32_t gone[2] = {2, 5};
    ASSERT_EQ_INT(tsr_kv_paged_evict(a, 1, 1, gone, 2), TSR_OK);

    tsr_kv_seq_state st;
    ASSERT_EQ_INT(tsr_kv_export_seq(a, 1, &st), TSR_OK);
    ASSERT_EQ_INT(st.len, 11);
    ASSERT_EQ_INT(st.layers[0].slots, 11);
    ASSERT_EQ_INT(st.layers[1].slots, 9);
    ASSERT_EQ_INT(st.layers[1].dense, 0);
    ASSERT_EQ_INT(st.has_scores, 1);

    /* Another pool, other block ids (a sequence occupies the first blocks), another seq id. */
    ASSERT_EQ_INT(b->ops->seq_add(b, 0), TSR_OK);
    ASSERT_EQ_INT(tsr__grow(b, 0, 9), TSR_OK);
    ASSERT_EQ_INT(b->ops->seq_add(b, 3), TSR_OK);
    ASSERT_EQ_INT(tsr_kv_import_seq(b, 3, &st), TSR_OK);
    ASSERT_TRUE(tsr__same(a, 1, b, 3));
    /* A second import into a non-empty sequence is refused. */
    ASSERT_EQ_INT(tsr_kv_import_seq(b, 3, &st), TSR_ERR_INVALID);
    /* Both go on alike. */
    ASSERT_EQ_INT(tsr__grow(a, 1, 6), TSR_OK);
    ASSERT_EQ_INT(tsr__grow(b, 3, 6), TSR_OK);
    ASSERT_TRUE(tsr__same(a, 1, b, 3));
    /* A pool too small for the rows: TSR_ERR_NO_BLOCKS, nothing taken. */
    tsr_kv_cache *c = tsr__cache(3);
    ASSERT_TRUE(c != NULL);
    ASSERT_EQ_INT(c->ops->seq_add(c, 0), TSR_OK);
    ASSERT_EQ_INT(tsr_kv_import_seq(c, 0, &st), TSR_ERR_NO_BLOCKS);
    ASSERT_EQ_INT(tsr_kv_paged_free_blocks(c), 3);
    /* Bad geometry is refused. */
    st.kv_dim++;
    ASSERT_EQ_INT(tsr_kv_import_seq(c, 0, &st), TSR_ERR_INVALID);
    st.kv_dim--;
    tsr_kv_seq_state_free(&st);
    tsr_kv_cache_destroy(a);
    tsr_kv_cache_destroy(b);
    tsr_kv_cache_destroy(c);
}

TSR_KV_TEST(ckpt_file_round_trip) {
    if (!tsr_ckpt_available()) {
        tsr_ckpt ck;
        ASSERT_EQ_INT(tsr_ckpt_read("x.h5", &ck), TSR_ERR_UNSUPPORTED);
        ASSERT_TRUE(strstr(tsr_last_error(), "-DTESSERA_HDF5=ON") != NULL);
        printf("  (no HDF5 in this build: only the stub is checked)\n");
        return;
    }
    char path[512];
    /* per process: the bf16 variant (test_kv_checkpoint_bf16, the same binary) may run
     * beside this one under ctest -j */
    snprintf(path, sizeof path, "%s/test_kv_checkpoint.%d.h5", TSR_BINARY_DIR, (int)getpid());
    tsr_kv_cache *a = tsr__cache(64);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ_INT(a->ops->seq_add(a, 2), TSR_OK);
    ASSERT_EQ_INT(tsr__grow(a, 2, 5), TSR_OK);
    int32_t toks[6] = {1, 2, 3, 4, 5, 9};
    tsr_ckpt w = {.meta = {.format_version = TSR_CKPT_VERSION, .model = "m.bin", .dim = 64,
                           .n_layers = LAYERS, .n_heads = 4, .n_kv_heads = HEADS,
                           .vocab_size = 512, .dtype = "f32", .policy = "h2o",
                           .block_size = BS, .tp = 1, .pp = 1, .rank = 0, .world = 1,
                           .max_batch_seqs = 4, .max_context = 64, .kv_layers = LAYERS,
                           .kv_dim = KVD, .output = "out.jsonl", .output_records = 17}};
    tsr_ckpt_req reqs[2] = {0};
    char stop[] = "\n\n", text[] = "once upon", id[] = "req-1";
    reqs[0] = (tsr_ckpt_req){.s = {.tag = 3, .tokens = toks, .n_tokens = 6, .n_prompt = 4,
                                   .n_computed = 5, .n_generated = 2, .max_new_tokens = 20,
                                   .sampling = {.temperature = 0.7f, .top_p = 0.9f, .seed = 5},
                                   .rng = 0x123456789abcdefull, .sampler_ready = 1, .slot = 2},
                             .custom_id = id, .line = 12, .kind = 1, .n_stops = 1,
                             .text = text, .len = strlen(text), .prev = 5, .n_prompt = 4,
                             .n_gen = 2, .has_kv = true};
    reqs[0].stops[0] = stop;
    ASSERT_EQ_INT(tsr_kv_export_seq(a, 2, &reqs[0].kv), TSR_OK);
    reqs[1] = (tsr_ckpt_req){.s = {.tag = 0, .tokens = toks, .n_tokens = 3, .n_prompt = 3,
                                   .max_new_tokens = 8, .sampling = {.top_p = 1.0f},
                                   .slot = -1},
                             .line = 13, .text = NULL, .len = 0};
    w.reqs = reqs;
    w.n_reqs = 2;
    ASSERT_EQ_INT(tsr_ckpt_write(path, &w), TSR_OK);
    tsr_ckpt r;
    ASSERT_EQ_INT(tsr_ckpt_read(path, &r), TSR_OK);
    ASSERT_EQ_INT(tsr_ckpt_check(path, &r.meta, &w.meta), TSR_OK);
    ASSERT_EQ_INT(r.n_reqs, 2);
    tsr_ckpt_req *q = &r.reqs[0];
    ASSERT_TRUE(q->custom_id && !strcmp(q->custom_id, "req-1"));
    ASSERT_EQ_INT(q->line, 12);
    ASSERT_EQ_INT(q->s.tag, 3);
    ASSERT_EQ_INT(q->s.n_tokens, 6);
    ASSERT_EQ_INT(q->s.tokens[5], 9);
    ASSERT_EQ_INT(q->s.n_computed, 5);
    ASSERT_TRUE(q->s.rng == 0x123456789abcdefull);
    ASSERT_TRUE(q->s.sampling.temperature == 0.7f && q->s.sampling.top_p == 0.9f);
    ASSERT_EQ_INT(q->n_stops, 1);
    ASSERT_TRUE(!strcmp(q->stops[0], "\n\n"));
    ASSERT_TRUE(q->len == strlen(text) && !strcmp(q->text, text));
    ASSERT_TRUE(q->has_kv);
    tsr_kv_cache *b = tsr__cache(16);
    ASSERT_EQ_INT(b->ops->seq_add(b, 0), TSR_OK);
    ASSERT_EQ_INT(tsr_kv_import_seq(b, 0, &q->kv), TSR_OK);
    ASSERT_TRUE(tsr__same(a, 2, b, 0));
    ASSERT_TRUE(r.reqs[1].custom_id == NULL && !r.reqs[1].has_kv && r.reqs[1].len == 0);
    /* A field that differs is named. */
    tsr_ckpt_meta other = w.meta;
    other.n_kv_heads = 8;
    ASSERT_EQ_INT(tsr_ckpt_check(path, &r.meta, &other), TSR_ERR_INVALID);
    ASSERT_TRUE(strstr(tsr_last_error(), "n_kv_heads") != NULL);
    tsr_ckpt_free(&r);
    /* A write that fails (its temporary name taken by a directory) leaves the previous
     * checkpoint as it was. */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ASSERT_EQ_INT(mkdir(tmp, 0755), 0);
    ASSERT_TRUE(tsr_ckpt_write(path, &w) != TSR_OK);
    ASSERT_EQ_INT(rmdir(tmp), 0);
    ASSERT_EQ_INT(tsr_ckpt_read(path, &r), TSR_OK);
    ASSERT_EQ_INT(r.n_reqs, 2);
    tsr_ckpt_free(&r);
    /* A write killed (SIGKILL) at any moment leaves a whole checkpoint under the name: a
     * child rewrites it in a loop, so nearly every kill lands inside a write (its temporary
     * file half written, or the rename pending); after each, the file reads back whole. */
    int torn = 0; /* kills that left a temporary file: inside a write */
    for (int i = 0; i < 12; i++) {
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            for (;;)
                if (tsr_ckpt_write(path, &w) != TSR_OK) _exit(1);
        }
        struct timespec ts = {0, (3000 + 1700 * (long)i) * 1000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int wst = 0;
        waitpid(pid, &wst, 0);
        ASSERT_TRUE(WIFSIGNALED(wst)); /* it was still writing, not failed */
        torn += access(tmp, F_OK) == 0;
        ASSERT_EQ_INT(tsr_ckpt_read(path, &r), TSR_OK);
        ASSERT_EQ_INT(r.n_reqs, 2);
        tsr_ckpt_free(&r);
    }
    ASSERT_TRUE(torn > 0);
    unlink(tmp);
    /* One process reading one KV head's part: the rows of that head, but the checksum
     * counts only what this process read, so alone it is refused (a part read is for the
     * ranks of a job together). */
    tsr_ckpt_part part = {.layer_begin = 0, .layer_end = LAYERS, .kv_head_begin = 1,
                          .kv_head_end = 2, .head_owner = true};
    ASSERT_EQ_INT(tsr_ckpt_read_part(path, &part, &r), TSR_ERR_FORMAT);
    ASSERT_TRUE(strstr(tsr_last_error(), "checksum mismatch") != NULL);
    /* Truncated: one line naming the file. */
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    for (long cut = size / 2; cut > 0; cut /= 4) {
        ASSERT_EQ_INT(truncate(path, cut), 0);
        tsr_status st = tsr_ckpt_read(path, &r);
        ASSERT_TRUE(st == TSR_ERR_HDF5 || st == TSR_ERR_FORMAT);
        ASSERT_TRUE(strstr(tsr_last_error(), path) != NULL);
        ASSERT_TRUE(strchr(tsr_last_error(), '\n') == NULL);
    }
    unlink(path);
    tsr_kv_seq_state_free(&reqs[0].kv);
    tsr_kv_cache_destroy(a);
    tsr_kv_cache_destroy(b);
}

/* The checkpoint calls go through the interface: a policy cache (and the checkpoint
 * module's check) export and import its mechanism's rows without unwrapping. */
TSR_KV_TEST(kv_export_through_policy) {
    tsr_kv_paged_config c = {.n_layers = LAYERS, .n_kv_heads = HEADS, .head_dim = HD,
                             .block_size = BS, .max_seqs = 4, .max_seq_len = 64,
                             .prefix_caching = 1, .be = kvt_be, .kv_dtype = kvt_dtype()};
    c.memory_bytes = 32 * tsr_kv_paged_block_bytes(&c);
    tsr_kv_policy_config pc = {.n_heads = HEADS};
    tsr_kv_cache *a = NULL, *b = NULL;
    ASSERT_OK(tsr_kv_policy_cache_create(&tsr_kv_policy_paged, &pc, &c, &a));
    ASSERT_OK(tsr_kv_policy_cache_create(&tsr_kv_policy_paged, &pc, &c, &b));
    ASSERT_TRUE(tsr_ckpt_kv_mech(a) == a);
    ASSERT_EQ_INT(tsr_kv_block_size(a), BS);
    ASSERT_OK(a->ops->seq_add(a, 0));
    ASSERT_OK(tsr__grow(a, 0, 9));
    tsr_kv_seq_state st;
    ASSERT_OK(tsr_kv_export_seq(a, 0, &st));
    ASSERT_EQ_INT(st.len, 9);
    ASSERT_OK(b->ops->seq_add(b, 2));
    ASSERT_OK(tsr_kv_import_seq(b, 2, &st));
    tsr_kv_seq_state st2;
    ASSERT_OK(tsr_kv_export_seq(b, 2, &st2));
    for (int l = 0; l < LAYERS; l++) {
        ASSERT_EQ_INT(st2.layers[l].slots, 9);
        ASSERT_TRUE(!memcmp(st.layers[l].k, st2.layers[l].k, 9 * KVD * 4));
        ASSERT_TRUE(!memcmp(st.layers[l].v, st2.layers[l].v, 9 * KVD * 4));
    }
    tsr_kv_detail d;
    tsr_kv_cache_detail(b, &d);
    ASSERT_STR_EQ(d.policy, "paged");
    ASSERT_EQ_INT(d.blocks.block_size, BS);
    ASSERT_EQ_INT(d.kv.tokens_resident, 9);
    tsr_kv_seq_state_free(&st);
    tsr_kv_seq_state_free(&st2);
    tsr_kv_cache_destroy(a);
    tsr_kv_cache_destroy(b);
    /* A cache without the calls says so. */
    tsr_kv_cache *dense = NULL;
    ASSERT_OK(tsr_kv_dense_create_dtype(kvt_be, 1, 1, 4, 8, 1, kvt_dtype(), &dense));
    ASSERT_TRUE(tsr_ckpt_kv_mech(dense) == NULL);
    ASSERT_EQ_INT(tsr_kv_export_seq(dense, 0, &st), TSR_ERR_UNSUPPORTED);
    ASSERT_EQ_INT(tsr_kv_block_size(dense), 0);
    tsr_kv_cache_destroy(dense);
}

/* The per-rank names format 2 used, which a resume looks for to refuse them by name. */
TSR_TEST(ckpt_rank_paths) {
    char buf[128];
    tsr_ckpt_rank_path("run/ck.h5", 0, 1, buf, sizeof buf);
    ASSERT_TRUE(!strcmp(buf, "run/ck.rank0.h5"));
    tsr_ckpt_rank_path("run/ck.h5", 3, 4, buf, sizeof buf);
    ASSERT_TRUE(!strcmp(buf, "run/ck.rank3.h5"));
    tsr_ckpt_rank_path("ck", 1, 2, buf, sizeof buf);
    ASSERT_TRUE(!strcmp(buf, "ck.rank1.h5"));
}

TSR_TEST_MAIN(kv_export_import_round_trip, ckpt_file_round_trip, kv_export_through_policy,
              ckpt_rank_paths)
