/* Option tables for subcommands: one table gives parsing, validation and --help, so the
 * help cannot drift from what is parsed. */
#ifndef TSR_JOBS_CLI_H
#define TSR_JOBS_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef enum tsr_opt_kind {
    TSR_OPT_FLAG,   /* bool, no argument */
    TSR_OPT_STRING, /* const char * */
    TSR_OPT_INT,    /* int */
    TSR_OPT_FLOAT,  /* float */
    TSR_OPT_DOUBLE, /* double (where a float would round: 0.1 of a length) */
    TSR_OPT_U64,    /* uint64_t */
} tsr_opt_kind;

typedef struct tsr_cli_opt {
    const char *name; /* "max-tokens" for --max-tokens */
    tsr_opt_kind kind;
    void *dest;       /* holds the default before parsing */
    const char *metavar;
    const char *help;
    bool seen;        /* set by the parser */
} tsr_cli_opt;

typedef struct tsr_cli {
    const char *cmd;      /* "generate" */
    const char *synopsis; /* one line after "usage: tessera generate " */
    const char *about;    /* a paragraph */
    tsr_cli_opt *opts;
    int n_opts;
} tsr_cli;

typedef enum tsr_cli_result {
    TSR_CLI_OK = 0,
    TSR_CLI_HELP = 1,  /* --help printed to stdout: exit 0 */
    TSR_CLI_USAGE = 2, /* one-line error printed to stderr: exit 2 */
} tsr_cli_result;

/* Parses argv[1..] (argv[0] is the subcommand name). Positional arguments are rejected. */
tsr_cli_result tsr_cli_parse(tsr_cli *cli, int argc, char **argv);
void tsr_cli_print_help(const tsr_cli *cli);
/* Prints "tessera CMD: message" to stderr and returns TSR_CLI_USAGE (for post-parse checks). */
tsr_cli_result tsr_cli_usage_error(const tsr_cli *cli, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prints "tessera CMD: warning: message" to stderr. */
void tsr_cli_warn(const tsr_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const tsr_cli_opt *tsr_cli_find(const tsr_cli *cli, const char *name);

/* --threads above this many threads per CPU the process may run on (sched_getaffinity) is
 * refused: past a few per CPU the kernels' threads only wait on each other (10000 threads
 * ran 250x slower), yet MPI ranks bound to one core keep room to oversubscribe a little. */
#define TSR_CLI_THREADS_PER_CPU 4
/* Usage error unless 1 <= threads <= TSR_CLI_THREADS_PER_CPU x tsr_sys_cpus() (--threads). */
tsr_cli_result tsr_cli_check_threads(const tsr_cli *cli, int threads);

/* --dtype of the commands that load a model for a job (generate, run): the weights' dtype
 * after loading (the engine's weights_dtype; quantized ones quantize at load). */
#define TSR_CLI_DTYPE_VALUES "f32|bf16|f16|q8_0|q4_0|q4_1|fp8"
#define TSR_CLI_DTYPE_HELP                                                                  \
    "weight dtype (default: as stored); q8_0, q4_0, q4_1 and fp8 quantize at load (fp8: "   \
    "cuda; Q8_0 elsewhere); on the CPU a quantized dtype also runs GPT-OSS's MXFP4 experts " \
    "with 8-bit activations (TSR_MXFP4_F32=1: their f32 kernel)"
/* Usage error unless dtype is NULL (not given) or one of TSR_CLI_DTYPE_VALUES. */
tsr_cli_result tsr_cli_check_dtype(const tsr_cli *cli, const char *dtype);

/* Parses a byte count: "1048576", "512M", "4G", "1.5GiB" (K/M/G/T are powers of 1024).
 * Returns 0 on success, -1 when malformed. */
int tsr_cli_parse_bytes(const char *s, int64_t *out);

struct cJSON;
/* Writes d as one line of JSON to path (created or truncated), or to stdout when path is
 * NULL, and frees d: a command's result (fidelity, needle). A failure is one line naming
 * the file. */
tsr_status tsr_cli_write_json(struct cJSON *d, const char *path);

#endif
