/* placeholder until the bulk-generation job lands */
#include <stdio.h>

#include "jobs/commands.h"

int tsr_cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tessera run: not implemented yet\n");
    return 2;
}
