/* Fidelity driver for bench/quality.sh: scores held-out text token by token (decode mode,
 * one token per forward call, so a policy evicts exactly as it does in generation) through
 * the full cache and the KV cache of a policy side by side (runtime/eval/fidelity.h), and prints
 * one line: policy, budget, tokens scored, mean NLL and perplexity of both, top-1 agreement,
 * KL(full || policy), seconds and the policy's KV stats JSON. Stories are separated by blank
 * lines; each is one sequence starting at BOS. --prompt P: the first P tokens of each story
 * go in as one prefill chunk (a prompt; snapkv compresses at its end), the rest as decode,
 * the chunk P also bounding a layer in decode (budget + P rows; without a prompt, 1).
 * Exit 0 on success, 2 when the run fails (the
 * error line goes to stderr). --list-policies prints the registry's policy names, one a line.
 *
 *   tsr_quality MODEL TOKENIZER TEXT POLICY [--budget B] [--recent R] [--pairs P]
 *               [--recall] [--materialize] [--threads T] [--prompt P]
 *   tsr_quality --list-policies */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "policies/policy.h"
#include "runtime/eval/fidelity.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

static tsr_status tsr__read_file(const char *path, char **out, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return tsr_error_set(TSR_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = tsr_realloc(buf, cap);
            if (!nb) {
                tsr_free(buf);
                fclose(fp);
                return TSR_ERR_NOMEM;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, fp);
        n += r;
        if (r < 4096) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        tsr_free(buf);
        return tsr_error_set(TSR_ERR_IO, "%s: read failed", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return TSR_OK;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--list-policies")) {
        for (const char *p = tsr_kv_policy_names(); *p; p++) putchar(*p == '|' ? '\n' : *p);
        putchar('\n');
        return 0;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TOKENIZER TEXT POLICY [--budget B] [--recent R] "
                        "[--pairs P] [--recall] [--materialize] [--threads T] [--prompt P]\n", argv[0]);
        return 1;
    }
    const char *model_path = argv[1], *tok_path = argv[2], *text_path = argv[3];
    const char *policy = argv[4];
    int threads = 1, materialize = 0, prompt = 0;
    double budget = 0;
    /* Policy options: any the policy declares (--h2o-recent F, --offload-recall, ...),
     * checked by the registry; --recent, --pairs, --recall and --materialize are the
     * short names bench/quality.sh uses. */
    const tsr_kv_policy_decl *pol = tsr_kv_policy_find(policy);
    if (!pol) {
        fprintf(stderr, "quality: unknown policy %s (use %s)\n", policy, tsr_kv_policy_names());
        return 1;
    }
    tsr_kv_policy_arg args[32];
    int n_args = 0;
    for (int i = 5; i < argc && n_args < 32; i++) {
        const tsr_kv_policy_option *po = tsr_kv_policy_option_find(pol, argv[i] + 2);
        if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recent") && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){"h2o-recent", argv[++i]};
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){"offload-pairs", argv[++i]};
        else if (!strcmp(argv[i], "--recall"))
            args[n_args++] = (tsr_kv_policy_arg){"offload-recall", "1"};
        else if (!strcmp(argv[i], "--materialize")) {
            args[n_args++] = (tsr_kv_policy_arg){"h2o-scores", "materialize"};
            materialize = 1;
        } else if (po && po->kind == TSR_KV_OPT_FLAG)
            args[n_args++] = (tsr_kv_policy_arg){po->name, "1"};
        else if (po && i + 1 < argc)
            args[n_args++] = (tsr_kv_policy_arg){po->name, argv[++i]};
        else {
            fprintf(stderr, "quality: unknown option %s\n", argv[i]);
            return 1;
        }
    }
    char *text = NULL;
    size_t text_len = 0;
    tsr_fidelity_result r;
    /* The engines load the model and its tokenizer (runtime/eval/fidelity.h). */
    tsr_engine_spec spec = {.model_path = model_path, .load_tokenizer = true,
                            .tokenizer_path = tok_path};
    tsr_status st = tsr__read_file(text_path, &text, &text_len);
    if (st == TSR_OK) {
        tsr_fidelity_options fo = {
            .backend = "cpu", .threads = threads, .chunk_tokens = prompt > 1 ? prompt : 1,
            .prompt_tokens = prompt,
            .kv = {.policy = pol, .memory_bytes = 16 << 20, .block_size = 16,
                   .budget = budget, .policy_args = args, .n_policy_args = n_args,
                   .max_seqs = 1, .chunk_tokens = prompt > 1 ? prompt : 1}};
        st = tsr_fidelity_run(&spec, NULL, text, text_len, &fo, &r);
    }
    int rc = 0;
    if (st == TSR_OK) {
        printf("policy=%s%s budget=%g stories=%d tokens=%lld nll=%.4f ppl=%.3f "
               "nll_full=%.4f ppl_full=%.3f agreement=%.4f kl=%.5f seconds=%.2f kv=%s\n",
               policy, materialize ? "(materialize)" : "", budget, r.windows,
               (long long)r.tokens, r.nll, r.ppl, r.nll_full, r.ppl_full, r.agreement, r.kl,
               r.wall_s, r.kv_json);
    } else {
        fprintf(stderr, "quality: %s: %s\n", tsr_strerror(st), tsr_last_error());
        printf("policy=%s budget=%g FAILED (%s)\n", policy, budget, tsr_strerror(st));
        rc = 2;
    }
    tsr_free(text);
    return rc;
}
