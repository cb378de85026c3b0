/* The `tessera` binary: dispatches subcommands and maps their results to exit codes. */
#include <stdio.h>
#include <string.h>

#include "base/module.h"
#include "comm/comm.h"
#include "jobs/commands.h"
#include "jobs/kv_cli.h"
#include "kernels/backend.h"

#ifndef TSR_VERSION
#define TSR_VERSION "unknown" /* CMake sets it from project(VERSION) */
#endif

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
    fprintf(f, "\n'tessera COMMAND --help' describes each command's options; 'tessera --version'\n"
               "prints the version and what this build runs with here (kernels, BLAS, MPI,\n"
               "modules).\n");
}

/* One line per run-time module: where this binary finds it, or where it looked. Found is
 * not loaded: --version opens nothing (a module maps its libraries only when a run needs
 * it, docs/build.md). */
static void tsr__module_line(const char *what, const char *file, const char *used_by,
                             const char *missing) {
    char path[1024], looked[1024];
    if (tsr_module_find(file, path, sizeof path, looked, sizeof looked))
        printf("%-13s %s (%s)\n", what, path, used_by);
    else
        printf("%-13s %s not found (looked in %s): %s\n", what, file, looked, missing);
}

/* The version, then what this build runs with on this machine, for a job's log and bug
 * reports. */
static void tsr__version(void) {
    printf("tessera %s\n", TSR_VERSION);
    tsr_backend_cpu_facts cpu;
    tsr_backend_cpu_facts_get(&cpu);
    printf("%-13s %s; quantized products %s (TSR_CPU_ISA=scalar|avx2|avx512 caps them)\n",
           "cpu kernels", cpu.isa, cpu.quant);
    printf("%-13s %s\n", "blas", cpu.blas ? cpu.blas : "?");
    char mpi[256];
    if (tsr_comm_mpi_library(mpi, sizeof mpi))
        printf("%-13s %s (used when a launcher starts tessera)\n", "mpi", mpi);
    else
        printf("%-13s not in this build (TESSERA_MPI=OFF): one process only\n", "mpi");
    const tsr_backend_info *cuda = tsr_backend_find("cuda");
    if (cuda && cuda->module)
        tsr__module_line("cuda module", cuda->module,
                         "loaded by --backend cuda, or auto on a node with an NVIDIA driver",
                         "--backend cuda cannot run");
    tsr__module_line("hdf5 module", TSR_MODULE_HDF5_FILE, "loaded by run --checkpoint",
                     "run --checkpoint cannot run");
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
        tsr__version();
        return 0;
    }
    for (size_t i = 0; i < sizeof tsr__cmds / sizeof tsr__cmds[0]; i++)
        if (!strcmp(argv[1], tsr__cmds[i].name)) return tsr__cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tessera: unknown command '%s' (see tessera --help)\n", argv[1]);
    return 2;
}
