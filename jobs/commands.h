/* Subcommands of the `tessera` binary. Each parses its own options (jobs/cli.h), prints
 * truthful --help, and returns a process exit code: 0 success, 1 runtime failure,
 * 2 usage error. Errors go to stderr as one line "tessera <cmd>: <message>". */
#ifndef TSR_JOBS_COMMANDS_H
#define TSR_JOBS_COMMANDS_H

int tsr_cmd_generate(int argc, char **argv); /* jobs/cmd_generate.c */
int tsr_cmd_convert(int argc, char **argv);  /* jobs/cmd_convert.c */
int tsr_cmd_bench(int argc, char **argv);    /* jobs/cmd_bench.c */
int tsr_cmd_run(int argc, char **argv);      /* jobs/run/cmd_run.c: bulk JSONL generation */
int tsr_cmd_fidelity(int argc, char **argv); /* jobs/cmd_fidelity.c: a policy vs the full cache */
int tsr_cmd_needle(int argc, char **argv);   /* jobs/cmd_needle.c: needle retrieval, policy vs full cache */
int tsr_cmd_characterize(int argc, char **argv); /* jobs/study/cmd_characterize.c: KV-policy study */
int tsr_cmd_checkpoint(int argc, char **argv); /* jobs/run/cmd_checkpoint.c: inspect a checkpoint */

/* Prints "tessera <cmd>: <last error line>" to stderr and returns 1. */
int tsr_cmd_fail(const char *cmd);

#endif
