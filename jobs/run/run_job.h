/* The state of one `tessera run` job, shared by jobs/run/cmd_run.c (the job) and
 * jobs/run/run_checkpoint.c (--checkpoint: save at a stop, resume at the start). */
#ifndef TSR_JOBS_RUN_JOB_H
#define TSR_JOBS_RUN_JOB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "jobs/run/batch_io.h"
#include "jobs/dist_cli.h"
#include "jobs/kv_cli.h"
#include "jobs/run/metrics.h"
#include "jobs/run/progress.h"
#include "runtime/text/chat_template.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/scheduler.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr_run_opts {
    const char *model, *tokenizer, *input, *output, *errors, *metrics, *backend;
    const char *dtype; /* --dtype: the weights' dtype after loading, or NULL (as stored) */
    const char *checkpoint; /* --checkpoint FILE.h5, or NULL */
    bool checkpoint_discard; /* --checkpoint-discard: drop one that does not fit the job */
    int max_batch_seqs, max_batch_tokens, max_context, threads;
    float progress_interval;
    float arrival_rate; /* --arrival-rate: requests/s of a Poisson process; 0: offline */
    uint64_t seed;
    bool no_bos, quiet, verbose, threads_given;
    bool harmony_raw; /* --harmony-raw: chat records keep every harmony channel */
    const char *preempt; /* --preempt swap|recompute */
    tsr_kv_cli kv;
    tsr_dist_cli dist;
} tsr_run_opts;

/* A request between submit and its record. */
typedef struct tsr_run_req {
    bool used;
    char *custom_id;
    int64_t line;
    uint64_t body_hash; /* tsr_run_req_body_hash of its input line */
    uint64_t line_hash; /* tsr_batch_line_hash of its input line (written in its record) */
    tsr_batch_kind kind;
    char *stops[TSR_BATCH_MAX_STOPS];
    int n_stops;
    char *text;
    size_t len, cap;
    int32_t prev;
    int n_prompt, n_gen;
    double t_submit, t_first;
    double t_last; /* the last output token (inter-token latency) */
    bool called;   /* harmony: ended by <|call|> (a tool call; the token is not in text) */
    /* harmony chat with stop strings: text ends inside a final-channel message whose text
     * starts at final_from (known once parsed; again after a piece that may hold a mark) */
    bool final_known, final_open;
    size_t final_from;
} tsr_run_req;

typedef struct tsr_run_job {
    const tsr_run_opts *o;
    char model_name[256];
    char err_path[4096];
    tsr_engine *eng;
    /* The engine's, borrowed. */
    tsr_model *model;
    tsr_backend *be;
    tsr_kv_cache *kv;
    tsr_forward *fwd;
    tsr_tokenizer *tok;
    tsr_sched *sched;
    tsr_chat_template chat;
    bool harmony; /* chat answers are harmony (GPT-OSS): a record gets the final channel */
    int32_t harmony_call; /* with harmony: <|call|>'s id */
    bool harmony_fmt; /* the tokenizer has harmony's tokens (also with --harmony-raw) */
    int ctx;
    FILE *in;
    tsr_batch_writer out, err;
    /* rank 0: the locks on the output and the errors file; every rank: the input's keys */
    tsr_batch_lock out_lock, err_lock;
    tsr_batch_input_index ix;
    /* a record could not be written (rank 0; agreed at the next step): the job stops */
    bool write_failed;
    char write_error[1024];
    tsr_batch_resume resume;
    tsr_strset *seen;
    tsr_run_req *reqs;
    int n_reqs;
    tsr_metrics m;
    /* --arrival-rate: the next request's arrival (seconds after t_start), the generator of
     * the gaps, and a parsed request read before its arrival, held until the clock reaches
     * it */
    double next_arrival;
    uint64_t arrival_rng;
    bool has_pending;
    tsr_batch_request pending;
    double pending_arrival;
    uint64_t pending_hash;
    tsr_progress prog;
    int64_t records_this_run, kill_after, processed;
    double t_start;
    int stop_signo; /* the signal that stopped the job early, 0 if it ran to the end */
    /* Every rank runs the same job (same input, same scheduler decisions); rank 0 alone
     * writes the output, errors, metrics and progress. */
    tsr_dist *dist; /* the engine's (after tsr_engine_create) */
    int rank;       /* this rank's, known even when the start failed (rank_out) */
    bool root;
    /* --checkpoint: the job's file and the input lines of the requests it resumed */
    char ck_path[4200];
    int64_t *ck_lines;
    int n_ck_lines;
    /* the job's identity in a checkpoint (model, tokenizer), computed once */
    bool ck_id_done, ck_model_done;
    uint64_t ck_model_config, ck_model_tensors, ck_model_weights, ck_tokenizer_id;
    char ck_tokenizer[4096];
} tsr_run_job;

void tsr_run_req_clear(tsr_run_req *r);

/* --checkpoint (jobs/run/run_checkpoint.c). At the start: resumes from the job's checkpoint,
 * written on any layout (collective); *n_resumed gets the requests put back. */
tsr_status tsr_run_ckpt_start(tsr_run_job *g, int *n_resumed);
/* The engine's model_loaded hook (ctx: the job), set with --checkpoint: the identity of the
 * whole model, before the shard cut. */
void tsr_run_ckpt_model_loaded(void *ctx, const tsr_model *m);
/* Collective (every rank calls it at the same point): saves every request the scheduler
 * holds, with the KV of the running ones, into one file. */
tsr_status tsr_run_ckpt_save(tsr_run_job *g, int *n_saved);
/* Whether input line `line` was resumed from the checkpoint (already in the scheduler). */
bool tsr_run_ckpt_resumed(const tsr_run_job *g, int64_t line);
/* The hash of a parsed request (custom_id and every field that changes its result), which
 * binds a checkpointed request to its input line. */
uint64_t tsr_run_req_body_hash(const tsr_batch_request *r);

#endif
