/* The study file of `tessera characterize` (docs/characterize.md): a JSON object naming
 * the models, KV policies, prompt lengths, batch sizes, request rates, KV budgets and
 * layouts to cross, with per-cell limits and the fidelity settings; parsed and checked
 * here (a malformed study is one error line naming the file and the key), then expanded
 * into cells with stable ids, so a rerun and a Slurm step find the same cell by name. */
#ifndef TSR_JOBS_STUDY_H
#define TSR_JOBS_STUDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define TSR_STUDY_MAX_ARGS 16

typedef struct tsr_study_model {
    char *label;     /* column value and part of the cell id */
    char *spec;      /* --model: a path or synthetic:NAME */
    char *tokenizer; /* --tokenizer (NULL: found next to the model) */
    int context;     /* tokens; 0 = read from the model when the study is expanded */
    int heads;       /* query heads, for the n x n arithmetic; 0 = read from the model */
    int vocab;       /* from the model when loaded (finds tok<vocab>.bin), else 0 */
} tsr_study_model;

typedef struct tsr_study_policy {
    char *label;  /* "paged", "h2o", "h2o-materialize", ... */
    char *policy; /* --kv-policy */
    char *args[TSR_STUDY_MAX_ARGS]; /* extra options of `tessera run` and `fidelity` */
    int n_args;
    bool whole_prefill; /* the prompt in one forward call (the original H2O's n x n) */
    bool budgeted;      /* crossed with kv_budgets (false: one cell, budget 0 = all) */
    double *budgets;    /* its own budgets ("budgets": [...]); NULL: the study's */
    int n_budgets;
    bool materialize;   /* --h2o-scores materialize among the args (report arithmetic) */
} tsr_study_policy;

typedef struct tsr_study_layout {
    char label[32]; /* "tp1", "tp2", "pp2", "tp2pp2" */
    int tp, pp;
} tsr_study_layout;

typedef struct tsr_study {
    char *path, *name;
    char *comment; /* "comment": shown under the report's title (NULL: none) */
    tsr_study_model *models;
    int n_models;
    tsr_study_policy *policies;
    int n_policies;
    int *prompt_lengths, n_prompt_lengths;
    int *batch_sizes, n_batch_sizes;
    double *rates; /* requests per second; 0 = offline (all at once) */
    int n_rates;
    /* "rate_sweep": {"prompt_length", "batch"}: the numeric rates run at this point only
     * (with an offline cell there for reference); 0 = crossed with everything */
    int sweep_len, sweep_batch;
    double *budgets; /* fraction of the sequence (<= 1) or tokens (> 1) */
    int n_budgets;
    /* "perf_budgets": the budgets of the perf cells (memory/throughput); NULL: the same as
     * the accuracy cells' (a policy's own, else kv_budgets) */
    double *perf_budgets;
    int n_perf_budgets;
    tsr_study_layout *layouts;
    int n_layouts;
    int gen_tokens;
    int threads;        /* --threads per rank; 0 = tessera's default */
    int64_t mem_limit;  /* bytes of address space per cell (RLIMIT_AS); 0 = none */
    double time_limit;  /* seconds per cell; 0 = none */
    char *kv_memory;    /* --kv-memory for every cell (NULL: tessera's default) */
    char *launcher;     /* multi-rank cells: "mpirun -np {ranks}" (default) */
    /* fidelity (a cell per model x policy x budget, when text is set) */
    char *fid_text;
    int fid_probe_length;
    int fid_max_tokens; /* --max-tokens: positions of the text scored (0: all) */
    bool fid_document;  /* --document: the text is one document */
    int fid_doc_tokens; /* --doc-tokens */
    int fid_tail;       /* --tail: the last N positions scored (0: all) */
    int fid_modes;      /* with a tail: bit 0 prompt-mode cells, bit 1 decode-only cells */
    /* needle (a cell per model x policy x budget x length x needle count, when set) */
    char *needle_haystack;
    int *needle_lengths, n_needle_lengths;
    int *needle_counts, n_needle_counts; /* 1 and/or 3 */
    char *needle_depths; /* "0,25,50,75,100" */
    /* lengths at which the policies run (NULL: all); at the others only the full cache
     * (a policy that reads no budget) runs, the other cells are skipped, saying so */
    int *needle_policy_lengths, n_needle_policy_lengths;
    /* lengths of the three-needle variant (NULL: all) */
    int *needle_multi_lengths, n_needle_multi_lengths;
    bool needle_skip_failed; /* tessera needle --skip-where-full-fails */
} tsr_study;

typedef enum tsr_cell_kind {
    TSR_CELL_PERF = 0,
    TSR_CELL_FIDELITY = 1,
    TSR_CELL_NEEDLE = 2,
} tsr_cell_kind;

typedef struct tsr_cell {
    char id[192]; /* file-name safe, stable across reruns of the same study */
    tsr_cell_kind kind;
    int model, policy, layout; /* indices into the study */
    int prompt_len, batch;     /* perf cells; prompt_len is a needle cell's length too */
    int needles;               /* needle cells: 1 or 3 */
    bool decode_prefix;        /* fidelity cells with a tail: decode-only scoring */
    double rate;               /* 0 = offline */
    double budget;             /* 0 = keep all */
    const char *skip;          /* non-NULL: not run, and why (static text) */
    char skip_buf[160];
} tsr_cell;

/* Loads and checks the study. TSR_ERR_INVALID with "PATH: key 'K': expected ..." (or
 * "PATH: not JSON ...") for a malformed file, TSR_ERR_IO when it cannot be read. */
tsr_status tsr_study_load(const char *path, tsr_study *out);
/* Fills model contexts and heads the study left out (loads those models). */
tsr_status tsr_study_resolve_models(tsr_study *s);
void tsr_study_free(tsr_study *s);

/* The cells in a fixed order (model, layout, policy, budget, prompt length, batch, rate;
 * then the fidelity cells). Cells that cannot run (a prompt longer than the model's
 * context) carry a skip reason. *cells is freed with tsr_free. */
tsr_status tsr_study_cells(const tsr_study *s, tsr_cell **cells, size_t *n);

/* "offline" or "%g" */
void tsr_study_rate_str(double rate, char *buf, size_t cap);

#endif
