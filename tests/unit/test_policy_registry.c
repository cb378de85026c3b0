/* The registry's promise: a policy is one file. `fake` below is such a file's contents,
 * registered at run time; its --help lines, its bad-value errors, the warnings for options
 * it ignores, its checkpoint options string and its stats JSON all come from its
 * declaration, with nothing else told about it. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/status.h"
#include "jobs/kv_cli.h"
#include "memory/kv_paged.h"
#include "policies/policy.h"
#include "tests/kv_test_util.h"
#include "tests/test.h"

/* ---- the one file ------------------------------------------------------------------ */
typedef struct tsr__fake_opts {
    double keep;
    int mode, count, verbose;
} tsr__fake_opts;

typedef struct tsr__fake_counters {
    int64_t evictions;
    double mean;
    int64_t count;
} tsr__fake_counters;

static const char *const tsr__fake_modes[] = {"fast", "exact", NULL};

static const tsr_kv_policy_option tsr__fake_options[] = {
    {"fake-keep", TSR_KV_OPT_DOUBLE, offsetof(tsr__fake_opts, keep), "F", "share kept", "0.5",
     0, 1, NULL},
    {"fake-mode", TSR_KV_OPT_ENUM, offsetof(tsr__fake_opts, mode), "MODE", "how to score",
     "fast", 0, 0, tsr__fake_modes},
    {"fake-count", TSR_KV_OPT_INT, offsetof(tsr__fake_opts, count), "N", "rounds", "3", 1, 8,
     NULL},
    {"fake-verbose", TSR_KV_OPT_FLAG, offsetof(tsr__fake_opts, verbose), NULL, "say more",
     NULL, 0, 1, NULL},
};

static const tsr_kv_policy_stat_field tsr__fake_stat_fields[] = {
    {"evictions", TSR_KV_STAT_I64, offsetof(tsr__fake_counters, evictions)},
    {"fake_mean", TSR_KV_STAT_F64, offsetof(tsr__fake_counters, mean)},
    {"fake_count", TSR_KV_STAT_I64, offsetof(tsr__fake_counters, count)},
};

static tsr_status tsr__fake_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                   void **state) {
    (void)mech;
    *state = (void *)cfg->opts; /* owned by the cache: valid as long as it lives */
    return TSR_OK;
}

static void tsr__fake_stats(const void *state, void *out) {
    const tsr__fake_opts *o = state;
    tsr__fake_counters *c = out;
    c->evictions = 7;
    c->mean = 2 * o->keep;
    c->count = o->count + 10 * o->mode + 100 * o->verbose;
}

static const tsr_kv_policy_decl tsr__fake = {
    .name = "fake", .help = "a test policy", .uses_budget = 1, .checkpointable = 1,
    .options = tsr__fake_options, .n_options = TSR_KV_COUNT(tsr__fake_options),
    .options_size = sizeof(tsr__fake_opts),
    .stat_fields = tsr__fake_stat_fields, .n_stats = TSR_KV_COUNT(tsr__fake_stat_fields),
    .stats_size = sizeof(tsr__fake_counters),
    .create = tsr__fake_create, .stats = tsr__fake_stats,
};
/* ------------------------------------------------------------------------------------ */

static void tsr__register(void) {
    if (!tsr_kv_policy_find("fake")) ASSERT_OK(tsr_kv_policy_register(&tsr__fake));
}

TSR_TEST(test_declaration_parses_and_refuses) {
    tsr__register();
    ASSERT_TRUE(tsr_kv_policy_find("fake") == &tsr__fake);
    ASSERT_STR_CONTAINS(tsr_kv_policy_names(), "paged|h2o|offload");
    ASSERT_STR_CONTAINS(tsr_kv_policy_names(), "|fake");
    tsr__fake_opts o;
    ASSERT_OK(tsr_kv_policy_options_parse(&tsr__fake, NULL, 0, &o));
    ASSERT_NEAR(o.keep, 0.5, 0);
    ASSERT_TRUE(o.mode == 0 && o.count == 3 && o.verbose == 0);
    tsr_kv_policy_arg args[] = {{"fake-keep", "0.25"}, {"fake-mode", "exact"},
                                {"fake-verbose", NULL}, {"h2o-recent", "0.3"}};
    ASSERT_OK(tsr_kv_policy_options_parse(&tsr__fake, args, 4, &o));
    ASSERT_NEAR(o.keep, 0.25, 0);
    ASSERT_TRUE(o.mode == 1 && o.count == 3 && o.verbose == 1);
    char buf[256];
    tsr_kv_policy_options_string(&tsr__fake, 24, &o, buf, sizeof buf);
    ASSERT_STR_EQ(buf, "kv-budget=24 fake-keep=0.25 fake-mode=exact fake-count=3 fake-verbose=1");
    tsr_kv_policy_options_string(tsr_kv_policy_find("paged"), 0, NULL, buf, sizeof buf);
    ASSERT_STR_EQ(buf, "none");
    const tsr_kv_policy_option *keep = tsr_kv_policy_option_find(&tsr__fake, "fake-keep");
    const tsr_kv_policy_option *mode = tsr_kv_policy_option_find(&tsr__fake, "fake-mode");
    const tsr_kv_policy_option *count = tsr_kv_policy_option_find(&tsr__fake, "fake-count");
    ASSERT_TRUE(keep && mode && count && !tsr_kv_policy_option_find(&tsr__fake, "h2o-recent"));
    ASSERT_EQ_INT(tsr_kv_policy_option_parse(keep, "2", NULL), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--fake-keep 2: must be in [0, 1]");
    ASSERT_EQ_INT(tsr_kv_policy_option_parse(mode, "slow", NULL), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--fake-mode slow: use one of fast, exact");
    ASSERT_EQ_INT(tsr_kv_policy_option_parse(count, "2.5", NULL), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--fake-count 2.5: not an integer");
    ASSERT_EQ_INT(tsr_kv_policy_option_parse(count, "9", NULL), TSR_ERR_INVALID);
    tsr_kv_policy_option_help(keep, buf, sizeof buf);
    ASSERT_STR_EQ(buf, "share kept (0..1; default: 0.5)");
    tsr_kv_policy_option_help(mode, buf, sizeof buf);
    ASSERT_STR_EQ(buf, "how to score (fast|exact; default: fast)");
}

/* The command line of generate and run: --help lines, the bad-value error, the warning. */
TSR_TEST(test_cli_is_generated) {
    tsr__register();
    tsr_kv_cli k;
    tsr_kv_cli_init(&k);
    tsr_cli_opt opts[TSR_KV_CLI_N_OPTS];
    int n = tsr_kv_cli_opts(&k, opts);
    tsr_cli cli = {.cmd = "generate", .synopsis = "", .about = "", .opts = opts, .n_opts = n};
    const tsr_cli_opt *c = tsr_cli_find(&cli, "fake-keep");
    ASSERT_TRUE(c != NULL);
    ASSERT_STR_EQ(c->help, "fake: share kept (0..1; default: 0.5)");
    ASSERT_STR_CONTAINS(tsr_cli_find(&cli, "kv-policy")->help, "fake (a test policy)");
    /* every budget policy in registry order, the run-time registered fake last */
    ASSERT_STR_CONTAINS(tsr_cli_find(&cli, "kv-budget")->help, "h2o, offload, ");
    ASSERT_STR_CONTAINS(tsr_cli_find(&cli, "kv-budget")->help, " and fake (others");
    ASSERT_TRUE(tsr_cli_find(&cli, "fake-verbose")->kind == TSR_OPT_FLAG);
    /* fake's options come right after the shipped policies', before --stats */
    ASSERT_STR_EQ(opts[n - 1].name, "stats");
    ASSERT_STR_EQ(opts[n - 2].name, "fake-verbose");

    char *bad[] = {"generate", "--kv-policy", "fake", "--fake-keep", "2"};
    ASSERT_EQ_INT(tsr_cli_parse(&cli, 5, bad), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr_kv_cli_check(&cli, &k), TSR_CLI_USAGE);
    ASSERT_STR_EQ(tsr_last_error(), "--fake-keep 2: must be in [0, 1]");

    tsr_kv_cli_init(&k);
    n = tsr_kv_cli_opts(&k, opts);
    cli.n_opts = n;
    k.quiet = true; /* h2o-recent is ignored under fake: a warning, not an error */
    char *good[] = {"generate", "--kv-policy", "fake", "--fake-mode", "exact", "--fake-verbose",
                    "--kv-budget", "0.5", "--h2o-recent", "0.3"};
    ASSERT_EQ_INT(tsr_cli_parse(&cli, 10, good), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr_kv_cli_check(&cli, &k), TSR_CLI_OK);
    ASSERT_TRUE(k.kv.policy == &tsr__fake); /* resolved once, into the declaration */
    ASSERT_EQ_INT(k.kv.n_policy_args, 2);
    ASSERT_STR_EQ(k.kv.policy_args[0].name, "fake-mode");
    ASSERT_STR_EQ(k.kv.policy_args[0].value, "exact");
    ASSERT_STR_EQ(k.kv.policy_args[1].name, "fake-verbose");
    ASSERT_NEAR(k.kv.budget, 0.5, 0);

    /* tessera --help: each policy with its options under it */
    FILE *f = tmpfile();
    ASSERT_TRUE(f != NULL);
    tsr_kv_cli_print_policies(f);
    char text[4096] = {0};
    rewind(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    ASSERT_TRUE(got > 0);
    ASSERT_STR_CONTAINS(text, "  fake       a test policy (uses --kv-budget)\n"
                              "    --fake-keep F");
}

/* Through the cache: options parsed into cfg->opts, the stats JSON from the declaration. */
TSR_KV_TEST(test_cache_reports_declared_stats) {
    tsr__register();
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = 4,
                              .max_seqs = 1, .max_seq_len = 64, .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = 8 * tsr_kv_paged_block_bytes(&kc);
    tsr_kv_policy_arg args[] = {{"fake-keep", "0.25"}, {"fake-count", "5"}};
    tsr_kv_policy_config pc = {.budget = 0.5, .args = args, .n_args = 2, .n_heads = 1};
    tsr_kv_cache *kv = NULL;
    ASSERT_OK(tsr_kv_policy_cache_create(&tsr__fake, &pc, &kc, &kv));
    tsr_kv_policy_stats ps;
    tsr_kv_policy_get_stats(kv, &ps);
    ASSERT_EQ_INT(ps.n, 3);
    ASSERT_EQ_INT(ps.evictions, 7);
    ASSERT_NEAR(tsr_kv_policy_stat(&ps, "fake_mean"), 0.5, 0);
    ASSERT_NEAR(tsr_kv_policy_stat(&ps, "fake_count"), 5, 0);
    tsr_kv_detail d;
    tsr_kv_cache_detail(kv, &d);
    ASSERT_STR_EQ(d.policy_options, "kv-budget=0.5 fake-keep=0.25 fake-mode=fast fake-count=5 "
                                    "fake-verbose=0");
    char json[1024];
    int len = tsr_kv_detail_json(&d, json, sizeof json);
    ASSERT_TRUE(len > 0 && (size_t)len < sizeof json);
    ASSERT_STR_CONTAINS(json, "\"policy\":\"fake\"");
    ASSERT_STR_CONTAINS(json, "\"evictions\":7,"); /* the cache's, once */
    ASSERT_STR_CONTAINS(json, ",\"fake_mean\":0.5000,\"fake_count\":5}");
    ASSERT_TRUE(strstr(strstr(json, "\"evictions\"") + 1, "\"evictions\"") == NULL);
    /* a short buffer: cut, but the length says what it needs */
    char small[16];
    ASSERT_EQ_INT(tsr_kv_detail_json(&d, small, sizeof small), len);
    /* a bad value in the args is refused at creation, with the declaration's line */
    tsr_kv_policy_arg bad[] = {{"fake-count", "0"}};
    pc.args = bad;
    pc.n_args = 1;
    tsr_kv_cache *kv2 = NULL;
    ASSERT_EQ_INT(tsr_kv_policy_cache_create(&tsr__fake, &pc, &kc, &kv2), TSR_ERR_INVALID);
    ASSERT_STR_EQ(tsr_last_error(), "--fake-count 0: must be in [1, 8]");
    tsr_kv_cache_destroy(kv);
}

/* An unknown --kv-policy is a usage error at the command line, naming the registered
 * ones; no policy given is the default declaration (paged). */
TSR_TEST(test_cli_resolves_the_name) {
    tsr_kv_cli k;
    tsr_kv_cli_init(&k);
    tsr_cli_opt opts[TSR_KV_CLI_N_OPTS];
    int n = tsr_kv_cli_opts(&k, opts);
    tsr_cli cli = {.cmd = "generate", .synopsis = "", .about = "", .opts = opts, .n_opts = n};
    char *none[] = {"generate"};
    ASSERT_EQ_INT(tsr_cli_parse(&cli, 1, none), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr_kv_cli_check(&cli, &k), TSR_CLI_OK);
    ASSERT_TRUE(k.kv.policy == tsr_kv_policy_default());
    ASSERT_TRUE(tsr_kv_policy_default() == &tsr_kv_policy_paged);
    tsr_kv_cli_init(&k);
    n = tsr_kv_cli_opts(&k, opts);
    char *bogus[] = {"generate", "--kv-policy", "bogus"};
    ASSERT_EQ_INT(tsr_cli_parse(&cli, 3, bogus), TSR_CLI_OK);
    ASSERT_EQ_INT(tsr_kv_cli_check(&cli, &k), TSR_CLI_USAGE);
}

/* What each shipped policy declares it reads and allows, the facts the forward pass and
 * the command line act on (a change here changes what a GPU step downloads). */
TSR_TEST(test_shipped_declarations) {
    struct {
        const tsr_kv_policy_decl *d;
        int queries, attn_input, scores, budget, prefix, ckpt, tp_sums;
    } want[] = {
        {&tsr_kv_policy_paged, 0, 0, 0, 0, 1, 1, 0},
        {&tsr_kv_policy_h2o, 1, 0, 1, 1, 0, 1, 1},
        {&tsr_kv_policy_offload, 1, 1, 0, 1, 0, 0, 1},
        {&tsr_kv_policy_snapkv, 1, 0, 0, 1, 0, 1, 1},
        {&tsr_kv_policy_streaming, 0, 0, 0, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const tsr_kv_policy_decl *d = want[i].d;
        ASSERT_TRUE(tsr_kv_policy_find(d->name) == d);
        ASSERT_EQ_INT(d->reads_queries, want[i].queries);
        ASSERT_EQ_INT(d->reads_attn_input, want[i].attn_input);
        ASSERT_EQ_INT(d->reads_scores, want[i].scores);
        ASSERT_EQ_INT(d->uses_budget, want[i].budget);
        ASSERT_EQ_INT(d->allows_prefix_cache, want[i].prefix);
        ASSERT_EQ_INT(d->checkpointable, want[i].ckpt);
        ASSERT_EQ_INT(d->tp_host_sums, want[i].tp_sums);
    }
}

static tsr_status tsr__noop_queries(void *state, int layer, int seq, const float *q,
                                    const int32_t *q_pos, int n_q, int n_heads) {
    (void)state, (void)layer, (void)seq, (void)q, (void)q_pos, (void)n_q, (void)n_heads;
    return TSR_OK;
}

static int tsr__never(const void *opts) {
    (void)opts;
    return 0;
}

/* The cache wants what the declaration reads (and what its options make it read), and a
 * declaration whose reads_* disagree with its hooks is refused. */
TSR_KV_TEST(test_cache_wants_what_is_declared) {
    tsr_kv_paged_config kc = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = 4,
                              .max_seqs = 1, .max_seq_len = 64, .be = kvt_be, .kv_dtype = kvt_dtype()};
    kc.memory_bytes = 8 * tsr_kv_paged_block_bytes(&kc);
    tsr_kv_policy_config pc = {.budget = 0.5, .n_heads = 1};
    struct {
        const tsr_kv_policy_decl *d;
        const char *arg, *value;
        int queries, attn_input, scores;
    } cases[] = {
        {&tsr_kv_policy_paged, NULL, NULL, 0, 0, 0},
        {&tsr_kv_policy_streaming, NULL, NULL, 0, 0, 0},
        {&tsr_kv_policy_h2o, NULL, NULL, 0, 0, 1}, /* tiled: the kernel's scores only */
        {&tsr_kv_policy_h2o, "h2o-scores", "materialize", 1, 0, 1},
        {&tsr_kv_policy_snapkv, NULL, NULL, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_kv_policy_arg a = {cases[i].arg, cases[i].value};
        pc.args = cases[i].arg ? &a : NULL;
        pc.n_args = cases[i].arg ? 1 : 0;
        tsr_kv_cache *kv = NULL;
        ASSERT_OK(tsr_kv_policy_cache_create(cases[i].d, &pc, &kc, &kv));
        ASSERT_EQ_INT(kv->wants_queries, cases[i].queries);
        ASSERT_EQ_INT(kv->wants_attn_input, cases[i].attn_input);
        ASSERT_EQ_INT(kv->wants_scores, cases[i].scores);
        tsr_kv_cache_destroy(kv);
    }
    pc.args = NULL;
    pc.n_args = 0;
    tsr_kv_cache *kv = NULL;
    tsr_kv_policy_decl bad = tsr__fake;
    bad.name = "fake-bad";
    bad.reads_queries = 1; /* but no queries hook */
    ASSERT_EQ_INT(tsr_kv_policy_cache_create(&bad, &pc, &kc, &kv), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "reads_queries is 1 but its queries hook is NULL");
    ASSERT_EQ_INT(tsr_kv_policy_register(&bad), TSR_ERR_INVALID);
    bad.reads_queries = 0;
    bad.queries = tsr__noop_queries; /* a hook it does not declare */
    ASSERT_EQ_INT(tsr_kv_policy_cache_create(&bad, &pc, &kc, &kv), TSR_ERR_INVALID);
    ASSERT_STR_CONTAINS(tsr_last_error(), "reads_queries is 0 but its queries hook is set");
    bad.reads_queries = 1;
    bad.reads_queries_with = tsr__never; /* declared, but these options read none */
    ASSERT_OK(tsr_kv_policy_cache_create(&bad, &pc, &kc, &kv));
    ASSERT_EQ_INT(kv->wants_queries, 0);
    tsr_kv_cache_destroy(kv);
    ASSERT_TRUE(tsr_kv_policy_find("fake-bad") == NULL); /* refused at registration */
}

TSR_TEST_MAIN(test_declaration_parses_and_refuses, test_cli_is_generated,
              test_cache_reports_declared_stats, test_cli_resolves_the_name,
              test_shipped_declarations, test_cache_wants_what_is_declared)
