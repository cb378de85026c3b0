/* Checkpoints bound to their job and checksummed (jobs/run/checkpoint.h): every single-bit flip
 * of a checkpoint file is refused with one line naming the file or provably harmless (the
 * file reads back equal to the original, so a resume from it is the same); every
 * truncation is refused; the model identity changes with the configuration, the tensors'
 * shapes and the weights (sampled for large tensors) and not with the path; the check
 * names what differs in words. No backend is involved (the KV rows are plain arrays). */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "jobs/run/checkpoint.h"
#include "base/alloc.h"
#include "tests/test.h"

enum { LAYERS = 2, KVD = 8 };

/* LeakSanitizer (the Sanitize build) reads this when it starts, as it reads tests/lsan.supp
 * through LSAN_OPTIONS under .ci/run: HDF5 loses a few hundred bytes inside the library on
 * some failed opens of a corrupt object, which this test provokes by the thousand. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libhdf5\n"; }
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "print_suppressions=0"; }

static tsr_ckpt_meta tsr__meta(void) {
    return (tsr_ckpt_meta){.format_version = TSR_CKPT_VERSION, .model = "m.bin", .dim = 64,
                           .n_layers = LAYERS, .n_heads = 4, .n_kv_heads = 2,
                           .vocab_size = 512, .dtype = "f32", .model_config = 11,
                           .model_tensors = 12, .model_weights = 13,
                           .tokenizer = "tok.bin", .tokenizer_id = 14, .policy = "h2o",
                           .policy_options = "budget=24 recent=0.5 scores=tiled",
                           .block_size = 4, .tp = 1, .pp = 1, .rank = 0, .world = 1,
                           .max_batch_seqs = 4, .max_context = 64, .no_bos = 0, .seed = 42,
                           .kv_layers = LAYERS, .kv_dim = KVD, .output = "out.jsonl",
                           .output_records = 17};
}

/* A running request's KV: len tokens, layer l keeps len - l slots, with scores. */
static void tsr__kv(tsr_kv_seq_state *kv, int len, float base) {
    *kv = (tsr_kv_seq_state){.len = len, .n_layers = LAYERS, .kv_dim = KVD, .has_scores = 1};
    ASSERT_OK(tsr_kv_seq_state_alloc_layers(kv));
    for (int i = 0; i < len; i++) kv->tokens[i] = 3 + i;
    for (int l = 0; l < LAYERS; l++) {
        kv->layers[l].slots = len - l;
        kv->layers[l].dense = l == 0;
    }
    ASSERT_OK(tsr_kv_seq_state_alloc_rows(kv));
    for (int l = 0; l < LAYERS; l++) {
        tsr_kv_seq_layer *L = &kv->layers[l];
        for (int s = 0; s < L->slots; s++) {
            L->pos[s] = s + l;
            L->score[s] = 0.25f * (float)s;
            for (int d = 0; d < KVD; d++) {
                L->k[s * KVD + d] = base + (float)(s * KVD + d) * 0.5f + (float)l;
                L->v[s * KVD + d] = -L->k[s * KVD + d];
            }
        }
    }
}

static bool tsr__same_kv(const tsr_kv_seq_state *a, const tsr_kv_seq_state *b) {
    if (a->len != b->len || a->n_layers != b->n_layers || a->kv_dim != b->kv_dim ||
        a->has_scores != b->has_scores || memcmp(a->tokens, b->tokens, (size_t)a->len * 4))
        return false;
    for (int l = 0; l < a->n_layers; l++) {
        const tsr_kv_seq_layer *x = &a->layers[l], *y = &b->layers[l];
        size_t n = (size_t)x->slots;
        if (x->slots != y->slots || x->dense != y->dense ||
            memcmp(x->k, y->k, n * KVD * 4) || memcmp(x->v, y->v, n * KVD * 4) ||
            memcmp(x->pos, y->pos, n * 4) ||
            (a->has_scores && memcmp(x->score, y->score, n * 4)))
            return false;
    }
    return true;
}

static bool tsr__same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Everything a resume uses, field by field. */
static bool tsr__same(const tsr_ckpt *a, const tsr_ckpt *b) {
    /* field by field (a struct's padding is not its contents) */
    if (tsr_ckpt_check("x", &a->meta, &b->meta) != TSR_OK ||
        tsr_ckpt_check_records("x", &a->meta, &b->meta) != TSR_OK ||
        strcmp(a->meta.model, b->meta.model) || strcmp(a->meta.tokenizer, b->meta.tokenizer) ||
        a->n_reqs != b->n_reqs)
        return false;
    for (int i = 0; i < a->n_reqs; i++) {
        const tsr_ckpt_req *x = &a->reqs[i], *y = &b->reqs[i];
        const tsr_sched_saved *s = &x->s, *t = &y->s;
        if (s->tag != t->tag || s->n_tokens != t->n_tokens ||
            memcmp(s->tokens, t->tokens, (size_t)s->n_tokens * 4) ||
            s->n_prompt != t->n_prompt || s->n_computed != t->n_computed ||
            s->n_generated != t->n_generated || s->max_new_tokens != t->max_new_tokens ||
            memcmp(&s->sampling, &t->sampling, sizeof s->sampling) || s->rng != t->rng ||
            s->sampler_ready != t->sampler_ready || s->slot != t->slot ||
            !tsr__same_str(x->custom_id, y->custom_id) || x->line != y->line ||
            x->body_hash != y->body_hash || x->kind != y->kind || x->n_stops != y->n_stops ||
            x->len != y->len || (x->len && memcmp(x->text, y->text, x->len)) || x->prev != y->prev ||
            x->n_prompt != y->n_prompt || x->n_gen != y->n_gen || x->has_kv != y->has_kv)
            return false;
        for (int j = 0; j < x->n_stops; j++)
            if (!tsr__same_str(x->stops[j], y->stops[j])) return false;
        if (x->has_kv && !tsr__same_kv(&x->kv, &y->kv)) return false;
    }
    return true;
}

/* Three requests: two running (with KV), one waiting; stops, custom ids, text. */
static void tsr__make(tsr_ckpt *w, tsr_ckpt_req *reqs, int32_t *toks) {
    static char stop[] = "\n\n", text[] = "once upon a time", id0[] = "req-1", id2[] = "r-3";
    for (int i = 0; i < 12; i++) toks[i] = 1 + i * 3;
    memset(reqs, 0, 3 * sizeof *reqs);
    reqs[0] = (tsr_ckpt_req){.s = {.tag = 3, .tokens = toks, .n_tokens = 7, .n_prompt = 4,
                                   .n_computed = 6, .n_generated = 3, .max_new_tokens = 20,
                                   .sampling = {.temperature = 0.7f, .top_p = 0.9f, .seed = 5},
                                   .rng = 0x123456789abcdefull, .sampler_ready = 1, .slot = 2},
                             .custom_id = id0, .line = 12, .body_hash = 0xfeedbeefull,
                             .kind = 1, .n_stops = 1, .text = text, .len = strlen(text),
                             .prev = 5, .n_prompt = 4, .n_gen = 3, .has_kv = true};
    reqs[0].stops[0] = stop;
    tsr__kv(&reqs[0].kv, 6, 1.0f);
    reqs[1] = (tsr_ckpt_req){.s = {.tag = 0, .tokens = toks, .n_tokens = 3, .n_prompt = 3,
                                   .max_new_tokens = 8, .sampling = {.top_p = 1.0f},
                                   .slot = -1},
                             .line = 13, .body_hash = 77, .text = NULL, .len = 0};
    reqs[2] = (tsr_ckpt_req){.s = {.tag = 5, .tokens = toks + 2, .n_tokens = 9, .n_prompt = 5,
                                   .n_computed = 8, .n_generated = 4, .max_new_tokens = 30,
                                   .sampling = {.temperature = 1.0f, .top_p = 1.0f, .seed = 9},
                                   .rng = 42, .sampler_ready = 1, .slot = 0},
                             .custom_id = id2, .line = 2, .body_hash = 1234, .kind = 0,
                             .text = text, .len = 4, .prev = 9, .n_prompt = 5, .n_gen = 4,
                             .has_kv = true};
    tsr__kv(&reqs[2].kv, 8, -3.0f);
    *w = (tsr_ckpt){.meta = tsr__meta(), .reqs = reqs, .n_reqs = 3};
}

/* A single-bit flip of a word always changes the hash; so does the length. */
TSR_TEST(hash_sees_every_bit) {
    unsigned char b[67];
    for (int i = 0; i < 67; i++) b[i] = (unsigned char)(i * 37 + 11);
    uint64_t h0 = tsr_ckpt_hash(0, b, sizeof b);
    for (int i = 0; i < 67 * 8; i++) {
        b[i / 8] ^= (unsigned char)(1u << (i % 8));
        ASSERT_TRUE(tsr_ckpt_hash(0, b, sizeof b) != h0);
        b[i / 8] ^= (unsigned char)(1u << (i % 8));
    }
    ASSERT_TRUE(tsr_ckpt_hash(0, b, 66) != h0);
    ASSERT_TRUE(tsr_ckpt_hash(1, b, sizeof b) != h0);
    ASSERT_TRUE(tsr_ckpt_hash(0, b, sizeof b) == h0);
}

/* Every byte of the file gets one bit flipped (a different bit per byte): the read either
 * fails with one line naming the file or returns exactly what was written. Then every
 * truncation fails. */
TSR_TEST(every_flip_refused_or_harmless) {
    if (!tsr_ckpt_available()) {
        printf("  (no HDF5 in this build: skipped)\n");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/test_checkpoint_bind.h5", TSR_BINARY_DIR);
    tsr_ckpt w;
    tsr_ckpt_req reqs[3];
    int32_t toks[12];
    tsr__make(&w, reqs, toks);
    ASSERT_OK(tsr_ckpt_write(path, &w));
    tsr_ckpt ref;
    ASSERT_OK(tsr_ckpt_read(path, &ref));
    ASSERT_TRUE(tsr__same(&ref, &w));
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    off_t size = lseek(fd, 0, SEEK_END);
    ASSERT_TRUE(size > 0);
    int refused = 0, harmless = 0, wrong = 0;
    for (off_t off = 0; off < size; off++) {
        unsigned char c, f;
        ASSERT_TRUE(pread(fd, &c, 1, off) == 1);
        f = (unsigned char)(c ^ (1u << (off * 5 % 8)));
        ASSERT_TRUE(pwrite(fd, &f, 1, off) == 1);
        tsr_ckpt r;
        tsr_status st = tsr_ckpt_read(path, &r);
        if (st == TSR_OK) {
            if (tsr__same(&r, &ref)) harmless++;
            else {
                wrong++;
                fprintf(stderr, "  flip at byte %lld was accepted with other contents\n",
                        (long long)off);
            }
            tsr_ckpt_free(&r);
        } else {
            refused++;
            if (!strstr(tsr_last_error(), path) || strchr(tsr_last_error(), '\n')) {
                wrong++;
                fprintf(stderr, "  flip at byte %lld: bad message: %s\n", (long long)off,
                        tsr_last_error());
            }
        }
        ASSERT_TRUE(pwrite(fd, &c, 1, off) == 1);
    }
    printf("  %lld bytes, one bit flipped in each: %d refused, %d harmless (read back equal)\n",
           (long long)size, refused, harmless);
    ASSERT_EQ_INT(wrong, 0);
    ASSERT_TRUE(refused > harmless);
    for (off_t cut = 0; cut < size; cut += size / 97 + 1) {
        ASSERT_EQ_INT(ftruncate(fd, cut), 0);
        tsr_ckpt r;
        ASSERT_TRUE(tsr_ckpt_read(path, &r) != TSR_OK);
        ASSERT_TRUE(strstr(tsr_last_error(), path) != NULL);
    }
    close(fd);
    unlink(path);
    tsr_ckpt_free(&ref);
    tsr_kv_seq_state_free(&reqs[0].kv);
    tsr_kv_seq_state_free(&reqs[2].kv);
}

/* The check says what differs, identity first; the record count separately. */
TSR_TEST(check_names_what_differs) {
    tsr_ckpt_meta a = tsr__meta(), b = a;
    ASSERT_OK(tsr_ckpt_check("ck.h5", &a, &b));
    snprintf(b.model, sizeof b.model, "moved/m.bin"); /* paths only name things */
    snprintf(b.tokenizer, sizeof b.tokenizer, "moved/tok.bin");
    ASSERT_OK(tsr_ckpt_check("ck.h5", &a, &b));
#define TSR__CASE(stmt, text)                                                           \
    do {                                                                                \
        tsr_ckpt_meta m = b;                                                            \
        stmt;                                                                           \
        ASSERT_EQ_INT(tsr_ckpt_check("ck.h5", &a, &m), TSR_ERR_INVALID);                \
        ASSERT_STR_CONTAINS(tsr_last_error(), text);                                    \
        ASSERT_TRUE(strncmp(tsr_last_error(), "ck.h5: ", 7) == 0);                      \
    } while (0)
    TSR__CASE(m.model_config++, "checkpoint model m.bin has another configuration than "
                                "this job's model moved/m.bin");
    TSR__CASE(m.model_tensors++, "checkpoint model m.bin has other tensors (names, shapes "
                                 "or dtypes)");
    TSR__CASE(m.model_weights++, "checkpoint model m.bin has other weights than this job's "
                                 "model moved/m.bin");
    TSR__CASE(m.tokenizer_id++, "checkpoint tokenizer tok.bin differs from this job's "
                                "tokenizer moved/tok.bin");
    TSR__CASE(snprintf(m.policy_options, sizeof m.policy_options, "budget=32"),
              "checkpoint policy_options is \"budget=24 recent=0.5 scores=tiled\", this job "
              "has \"budget=32\"");
    TSR__CASE(m.no_bos = 1, "checkpoint no_bos is 0, this job has 1");
    TSR__CASE(m.seed = 7, "checkpoint seed is 42, this job has 7");
    TSR__CASE(m.n_kv_heads = 8, "checkpoint n_kv_heads is 2, this job has 8");
    TSR__CASE(snprintf(m.output, sizeof m.output, "o2.jsonl"), "checkpoint output is");
    /* the configuration's named fields come before its hash */
    TSR__CASE((m.dim = 32, m.model_config++), "checkpoint dim is 64, this job has 32");
#undef TSR__CASE
    tsr_ckpt_meta m = b;
    m.tp = 2; /* the layout is recorded, not checked: any layout resumes */
    m.pp = 2;
    m.world = 4;
    m.rank = 3;
    ASSERT_OK(tsr_ckpt_check("ck.h5", &a, &m));
    m = b;
    m.output_records = 16;
    ASSERT_OK(tsr_ckpt_check("ck.h5", &a, &m));
    ASSERT_EQ_INT(tsr_ckpt_check_records("ck.h5", &a, &m), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "held 17 records, it holds 16 now");
}

/* The identity follows content and shape, not the source path; a large tensor is sampled. */
TSR_TEST(model_identity) {
    tsr_model *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    ASSERT_OK(tsr_model_load("synthetic:tiny", &a));
    ASSERT_OK(tsr_model_load("synthetic:tiny,seed=1234", &b)); /* the default seed */
    ASSERT_OK(tsr_model_load("synthetic:tiny,seed=5", &c));
    ASSERT_OK(tsr_model_load("synthetic:tiny,layers=4", &d));
    uint64_t ia[3], ib[3], ic[3], id[3];
    tsr_ckpt_model_identity(a, &ia[0], &ia[1], &ia[2]);
    tsr_ckpt_model_identity(b, &ib[0], &ib[1], &ib[2]);
    tsr_ckpt_model_identity(c, &ic[0], &ic[1], &ic[2]);
    tsr_ckpt_model_identity(d, &id[0], &id[1], &id[2]);
    ASSERT_TRUE(ia[0] == ib[0] && ia[1] == ib[1] && ia[2] == ib[2]);
    ASSERT_TRUE(ia[0] == ic[0] && ia[1] == ic[1] && ia[2] != ic[2]);
    ASSERT_TRUE(ia[0] != id[0] && ia[1] != id[1]);
    /* one bit of a small tensor (hashed whole) */
    unsigned char *w = (unsigned char *)a->layers[1].wk.data;
    w[17] ^= 0x40;
    uint64_t x[3];
    tsr_ckpt_model_identity(a, &x[0], &x[1], &x[2]);
    ASSERT_TRUE(x[0] == ia[0] && x[1] == ia[1] && x[2] != ia[2]);
    w[17] ^= 0x40;
    tsr_ckpt_model_identity(a, &x[0], &x[1], &x[2]);
    ASSERT_TRUE(x[2] == ia[2]);
    /* a tensor's shape */
    a->layers[0].w_up.rows--;
    tsr_ckpt_model_identity(a, &x[0], &x[1], &x[2]);
    ASSERT_TRUE(x[0] == ia[0] && x[1] != ia[1]);
    a->layers[0].w_up.rows++;
    tsr_model_destroy(a);
    tsr_model_destroy(b);
    tsr_model_destroy(c);
    tsr_model_destroy(d);

    /* stories15M's embedding (36 MiB) is sampled: its first and last 4 KiB are read, a
     * byte between two sampled blocks is not (the fingerprint is a sample, by design). */
    tsr_model *s = NULL;
    ASSERT_OK(tsr_model_load("synthetic:stories15M,layers=1", &s));
    tsr_ckpt_model_identity(s, &ia[0], &ia[1], &ia[2]);
    unsigned char *e = (unsigned char *)s->tok_emb.data;
    size_t bytes = tsr_tensor_bytes(&s->tok_emb), gap = (bytes - 4096) / 31 + 5000;
    ASSERT_TRUE(bytes > (256u << 10));
    size_t offs[] = {100, bytes - 3};
    for (int i = 0; i < 2; i++) {
        e[offs[i]] ^= 0x10;
        tsr_ckpt_model_identity(s, &x[0], &x[1], &x[2]);
        ASSERT_TRUE(x[2] != ia[2]);
        e[offs[i]] ^= 0x10;
    }
    e[gap] ^= 0x10;
    tsr_ckpt_model_identity(s, &x[0], &x[1], &x[2]);
    ASSERT_TRUE(x[2] == ia[2]);
    e[gap] ^= 0x10;
    tsr_model_destroy(s);
}

TSR_TEST(file_hash) {
    char path[512];
    snprintf(path, sizeof path, "%s/test_checkpoint_bind.tok", TSR_BINARY_DIR);
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    for (int i = 0; i < 3000000; i++) fputc(i * 7 % 251, f);
    fclose(f);
    uint64_t h0 = 0, h1 = 0;
    ASSERT_OK(tsr_ckpt_file_hash(path, &h0));
    f = fopen(path, "r+b");
    fseek(f, 2500000, SEEK_SET);
    fputc(1, f);
    fclose(f);
    ASSERT_OK(tsr_ckpt_file_hash(path, &h1));
    ASSERT_TRUE(h0 != h1);
    unlink(path);
    ASSERT_EQ_INT(tsr_ckpt_file_hash(path, &h1), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), path);
}

TSR_TEST_MAIN(hash_sees_every_bit, every_flip_refused_or_harmless, check_names_what_differs,
              model_identity, file_hash)
