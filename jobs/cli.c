#include "jobs/cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/sys.h"

tsr_cli_result tsr_cli_usage_error(const tsr_cli *cli, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera %s: ", cli->cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see tessera %s --help)\n", cli->cmd);
    va_end(ap);
    return TSR_CLI_USAGE;
}

void tsr_cli_warn(const tsr_cli *cli, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera %s: warning: ", cli->cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

const tsr_cli_opt *tsr_cli_find(const tsr_cli *cli, const char *name) {
    for (int i = 0; i < cli->n_opts; i++)
        if (!strcmp(cli->opts[i].name, name)) return &cli->opts[i];
    return NULL;
}

static void tsr__print_default(const tsr_cli_opt *o) {
    switch (o->kind) {
    case TSR_OPT_FLAG: break;
    case TSR_OPT_STRING:
        if (*(const char **)o->dest) printf(" (default: %s)", *(const char **)o->dest);
        break;
    case TSR_OPT_INT: printf(" (default: %d)", *(int *)o->dest); break;
    case TSR_OPT_FLOAT: printf(" (default: %g)", (double)*(float *)o->dest); break;
    case TSR_OPT_DOUBLE: printf(" (default: %g)", *(double *)o->dest); break;
    case TSR_OPT_U64: printf(" (default: %" PRIu64 ")", *(uint64_t *)o->dest); break;
    }
}

void tsr_cli_print_help(const tsr_cli *cli) {
    printf("usage: tessera %s %s\n\n%s\n\noptions:\n", cli->cmd, cli->synopsis, cli->about);
    for (int i = 0; i < cli->n_opts; i++) {
        const tsr_cli_opt *o = &cli->opts[i];
        char left[64];
        if (o->kind == TSR_OPT_FLAG)
            snprintf(left, sizeof left, "--%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, o->metavar ? o->metavar : "X");
        printf("  %-26s %s", left, o->help);
        tsr__print_default(o);
        printf("\n");
    }
    printf("  %-26s %s\n", "--help", "print this help and exit");
}

static int tsr__set(tsr_cli *cli, tsr_cli_opt *o, const char *val) {
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case TSR_OPT_FLAG: *(bool *)o->dest = true; return 0;
    case TSR_OPT_STRING: *(const char **)o->dest = val; return 0;
    case TSR_OPT_INT: {
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < -2147483647L || v > 2147483647L) break;
        *(int *)o->dest = (int)v;
        return 0;
    }
    case TSR_OPT_FLOAT: {
        float v = strtof(val, &end);
        if (errno || end == val || *end || !isfinite(v)) break;
        *(float *)o->dest = v;
        return 0;
    }
    case TSR_OPT_DOUBLE: {
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v)) break;
        *(double *)o->dest = v;
        return 0;
    }
    case TSR_OPT_U64: {
        if (val[0] == '-') break;
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || end == val || *end) break;
        *(uint64_t *)o->dest = (uint64_t)v;
        return 0;
    }
    }
    tsr_cli_usage_error(cli, "invalid value '%s' for --%s", val, o->name);
    return -1;
}

tsr_cli_result tsr_cli_parse(tsr_cli *cli, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tsr_cli_print_help(cli);
            return TSR_CLI_HELP;
        }
        if (strncmp(a, "--", 2) != 0)
            return tsr_cli_usage_error(cli, "unexpected argument '%s'", a);
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) return tsr_cli_usage_error(cli, "unknown option '%s'", a);
        memcpy(name, a + 2, len);
        name[len] = '\0';
        tsr_cli_opt *o = (tsr_cli_opt *)tsr_cli_find(cli, name);
        if (!o) return tsr_cli_usage_error(cli, "unknown option '--%s'", name);
        const char *val = NULL;
        if (o->kind == TSR_OPT_FLAG) {
            if (eq) return tsr_cli_usage_error(cli, "option --%s takes no value", name);
        } else if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc) return tsr_cli_usage_error(cli, "option --%s needs a value", name);
            val = argv[++i];
        }
        if (tsr__set(cli, o, val) != 0) return TSR_CLI_USAGE;
        o->seen = true;
    }
    return TSR_CLI_OK;
}

tsr_cli_result tsr_cli_check_dtype(const tsr_cli *cli, const char *dtype) {
    if (dtype && tsr_dtype_parse(dtype) < 0)
        return tsr_cli_usage_error(cli, "--dtype '%s': expected f32, bf16, f16, q8_0, q4_0, "
                                   "q4_1 or fp8", dtype);
    return TSR_CLI_OK;
}

tsr_cli_result tsr_cli_check_threads(const tsr_cli *cli, int threads) {
    if (threads < 1) return tsr_cli_usage_error(cli, "--threads must be >= 1");
    int cpus = tsr_sys_cpus();
    if (threads > TSR_CLI_THREADS_PER_CPU * cpus)
        return tsr_cli_usage_error(cli,
                                   "--threads %d: more than %d per CPU this process may run "
                                   "on (%d CPU%s: at most %d)",
                                   threads, TSR_CLI_THREADS_PER_CPU, cpus, cpus == 1 ? "" : "s",
                                   TSR_CLI_THREADS_PER_CPU * cpus);
    return TSR_CLI_OK;
}

int tsr_cli_parse_bytes(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || !isfinite(v)) return -1;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
        end += 2;
    else if (mult > 1 && (end[0] == 'b' || end[0] == 'B'))
        end++;
    else if (mult == 1 && (end[0] == 'b' || end[0] == 'B'))
        end++;
    if (*end || v * mult > 9.0e18) return -1;
    *out = (int64_t)(v * mult);
    return 0;
}

tsr_status tsr_cli_write_json(struct cJSON *d, const char *path) {
    char *js = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    if (!js) return tsr_error_set(TSR_ERR_NOMEM, "cannot format the result");
    tsr_status st = TSR_OK;
    FILE *f = path ? fopen(path, "wb") : stdout;
    if (!f) {
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot create", path);
    } else {
        if (fprintf(f, "%s\n", js) < 0 || fflush(f) != 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error", path ? path : "stdout");
        if (path && fclose(f) != 0 && st == TSR_OK)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error", path);
    }
    cJSON_free(js);
    return st;
}
