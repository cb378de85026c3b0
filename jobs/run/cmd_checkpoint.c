/* `tessera checkpoint inspect FILE`: what a `tessera run --checkpoint` file holds (the job
 * it is bound to, its requests, the KV bytes per layer), after verifying it the way a
 * resume does, so a user can see what a preempted job will resume. */
#include <stdio.h>
#include <string.h>

#include "jobs/commands.h"
#include "jobs/run/checkpoint.h"

static const char tsr__ckpt_usage[] =
    "usage: tessera checkpoint inspect FILE.h5\n\n"
    "Prints what a checkpoint of `tessera run --checkpoint` holds: the model, tokenizer and KV\n"
    "policy it is bound to, the layout that wrote it (any layout resumes it), the output's\n"
    "records then, every request (running with its KV, or waiting) and the KV rows and bytes\n"
    "of each layer. The whole file is verified first, as a resume verifies it: a damaged,\n"
    "truncated or foreign file is one error line. The datasets are documented in docs/jobs.md\n"
    "(h5dump reads them too).\n"
    "Exit status: 0 success, 1 runtime failure, 2 usage error.\n";

int tsr_cmd_checkpoint(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(tsr__ckpt_usage, stdout);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "inspect") || argv[2][0] == '-') {
        fprintf(stderr, "tessera checkpoint: usage: tessera checkpoint inspect FILE.h5\n");
        return 2;
    }
    if (tsr_ckpt_inspect(argv[2], stdout) != TSR_OK) return tsr_cmd_fail("checkpoint");
    return 0;
}
