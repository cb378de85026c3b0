/* The `tessera` binary: dispatches subcommands and maps their results to exit codes. */
#include <stdio.h>
#include <string.h>

#include "jobs/commands.h"
#include "jobs/kv_cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} tsr__cmds[] = {
    {"generate", tsr_cmd_generate, "generate a continuation of one prompt"},
    {"run", tsr_cmd_run, "bulk generation: OpenAI batch JSONL in, completions JSONL out"},
    {"convert", tsr_cmd_convert, "convert a model (e.g. llama2.c .bin) to a Hugging Face directory"},
    {"bench", tsr_cmd_bench, "measure prefill and decode speed"},
    {"fidelity", tsr_cmd_fidelity, "a KV policy against the full cache: perplexity, agreement, KL, recall"},
    {"needle", tsr_cmd_needle, "needle retrieval through the chat template: a policy against the full cache"},
    {"characterize", tsr_cmd_characterize, "run a KV-policy characterization study (cells.csv, report, plots)"},
    {"checkpoint", tsr_cmd_checkpoint, "inspect FILE: what a tessera run --checkpoint file holds"},
};

static void tsr__usage(FILE *f) {
    fprintf(f, "usage: tessera COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof tsr__cmds / sizeof tsr__cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", tsr__cmds[i].name, tsr__cmds[i].help);
    tsr_kv_cli_print_policies(f);
    fprintf(f, "\n'tessera COMMAND --help' describes each command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        tsr__usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        tsr__usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tessera 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof tsr__cmds / sizeof tsr__cmds[0]; i++)
        if (!strcmp(argv[1], tsr__cmds[i].name)) return tsr__cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s' (see tessera --help)\n", argv[1]);
    return 2;
}
