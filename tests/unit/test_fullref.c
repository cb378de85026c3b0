/* runtime/eval/fullref.h: a reference comes back only under its own key and intact (another
 * key, a truncated file or a flipped byte read as absent); and a fidelity run on the bundled
 * model that replays the full cache's logits from a reference gives the same bits as the
 * run that computed them, without the full cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/file.h"
#include "policies/policy.h"
#include "runtime/eval/fidelity.h"
#include "runtime/eval/fullref.h"
#include "tests/test.h"

static void tr_dir(char *buf, size_t cap, const char *what) {
    snprintf(buf, cap, "/tmp/tsr_test_fullref_%s_%ld", what, (long)getpid());
}

static void tr_rm(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

TSR_TEST(test_reference_only_under_its_key_and_intact) {
    char dir[256], path[4400];
    tr_dir(dir, sizeof dir, "keys");
    tsr_fullref_key k, other;
    tsr_fullref_key_init(&k, "fidelity");
    tsr_fullref_key_add(&k, "text", "%d", 1);
    tsr_fullref_key_init(&other, "fidelity");
    tsr_fullref_key_add(&other, "text", "%d", 2);
    const char payload[] = "the full cache's logits";
    ASSERT_OK(tsr_fullref_save(dir, &k, payload, sizeof payload));
    void *data = NULL;
    size_t len = 0;
    ASSERT_OK(tsr_fullref_load(dir, &k, &data, &len));
    ASSERT_TRUE(data && len == sizeof payload && !memcmp(data, payload, len));
    tsr_free(data);
    ASSERT_OK(tsr_fullref_load(dir, &other, &data, &len));
    ASSERT_TRUE(data == NULL); /* another key's name: absent */
    /* another key under this key's name (a hash collision): not taken */
    tsr_fullref_path(dir, &k, path, sizeof path);
    char opath[4400];
    tsr_fullref_path(dir, &other, opath, sizeof opath);
    ASSERT_OK(tsr_fullref_save(dir, &other, payload, sizeof payload));
    ASSERT_TRUE(rename(opath, path) == 0);
    ASSERT_OK(tsr_fullref_load(dir, &k, &data, &len));
    ASSERT_TRUE(data == NULL);
    /* a flipped payload byte, then a cut file */
    ASSERT_OK(tsr_fullref_save(dir, &k, payload, sizeof payload));
    char *text = NULL;
    size_t tl = 0;
    ASSERT_OK(tsr_file_read(path, "ref", 0, &text, &tl));
    char *at = strstr(text, "logits"); /* the file is text here: no NUL before it */
    ASSERT_TRUE(at != NULL);
    at[0] = 'L';
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f && fwrite(text, 1, tl, f) == tl);
    fclose(f);
    ASSERT_OK(tsr_fullref_load(dir, &k, &data, &len));
    ASSERT_TRUE(data == NULL);
    ASSERT_TRUE(truncate(path, (off_t)(tl - 10)) == 0);
    ASSERT_OK(tsr_fullref_load(dir, &k, &data, &len));
    ASSERT_TRUE(data == NULL);
    tsr_free(text);
    tr_rm(dir);
}

TSR_TEST(test_fidelity_replay_is_the_same_bits) {
    char dir[256];
    tr_dir(dir, sizeof dir, "fid");
    char *text = NULL;
    size_t len = 0;
    ASSERT_OK(tsr_file_read(TSR_SOURCE_DIR "/bench/data/heldout.txt", "text", 0, &text, &len));
    tsr_engine_spec spec = {.model_path = TSR_SOURCE_DIR "/models/stories260K.bin",
                            .tokenizer_path = TSR_SOURCE_DIR "/models/tok512.bin",
                            .load_tokenizer = true};
    tsr_fidelity_options o = {.backend = "cpu", .threads = 1, .chunk_tokens = 64,
                              .document = true, .doc_tokens = 300, .tail_tokens = 40,
                              .ref_dir = dir,
                              .kv = {.policy = tsr_kv_policy_find("h2o"), .budget = 0.2,
                                     .memory_bytes = 4 << 20, .block_size = 16}};
    tsr_fidelity_result a, b, c;
    ASSERT_OK(tsr_fidelity_run(&spec, NULL, text, len, &o, &a));
    ASSERT_STR_EQ(a.reference, "computed");
    ASSERT_OK(tsr_fidelity_run(&spec, NULL, text, len, &o, &b));
    ASSERT_STR_EQ(b.reference, "reused");
    o.ref_dir = NULL;
    ASSERT_OK(tsr_fidelity_run(&spec, NULL, text, len, &o, &c));
    ASSERT_STR_EQ(c.reference, "none");
    ASSERT_EQ_INT(a.tokens, 40);
    ASSERT_TRUE(a.kl > 0); /* h2o at 20 % differs from the full cache */
    const tsr_fidelity_result *rs[2] = {&b, &c};
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_INT(rs[i]->tokens, a.tokens);
        ASSERT_TRUE(rs[i]->nll_full == a.nll_full && rs[i]->nll == a.nll);
        ASSERT_TRUE(rs[i]->kl == a.kl && rs[i]->agreement == a.agreement);
    }
    /* decode-only scoring is another reference: computed, then reused, the same bits */
    o.ref_dir = dir;
    o.decode_prefix = true;
    ASSERT_OK(tsr_fidelity_run(&spec, NULL, text, len, &o, &a));
    ASSERT_STR_EQ(a.reference, "computed");
    ASSERT_OK(tsr_fidelity_run(&spec, NULL, text, len, &o, &b));
    ASSERT_STR_EQ(b.reference, "reused");
    ASSERT_TRUE(b.nll_full == a.nll_full && b.kl == a.kl && b.agreement == a.agreement);
    tsr_free(text);
    tr_rm(dir);
}

TSR_TEST_MAIN(test_reference_only_under_its_key_and_intact, test_fidelity_replay_is_the_same_bits)
