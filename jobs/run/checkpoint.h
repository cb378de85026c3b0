/* HDF5 checkpoints of `tessera run` (docs/jobs.md, "Checkpoints"): the requests the
 * scheduler holds at a stop (running and waiting), the job's bookkeeping of each, and the
 * KV rows of the running ones as logical contents (slot rows per layer, not block ids), so a
 * resumed job continues every request where it stopped with the same tokens. One file per
 * rank of a multi-rank job (its shard of the KV). Without HDF5 (TESSERA_HDF5=OFF) every
 * call fails with TSR_ERR_UNSUPPORTED.
 *
 * A checkpoint is bound to its job: it records the model's identity (configuration, tensor
 * names/shapes/dtypes, a sampled content fingerprint), the tokenizer's, the KV policy and
 * its options, the layout and the hash of every request's body, and a resume that does not
 * match is refused with one line. It is checksummed: every dataset carries HDF5's
 * Fletcher-32 filter, the file's metadata HDF5's own checksums (format 1.10), and a sum of
 * hashes of every attribute and dataset read back must equal the one stored, so a damaged
 * file is refused, never used. */
#ifndef TSR_JOBS_CHECKPOINT_H
#define TSR_JOBS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobs/run/batch_io.h"
#include "memory/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/exec/scheduler.h"

/* 2: the job's identity (model, tokenizer, policy options, request bodies) and checksums */
#define TSR_CKPT_VERSION 2

/* What a checkpoint must agree with to be resumed (every field but the two paths, which
 * only name things in messages, is checked). */
typedef struct tsr_ckpt_meta {
    int format_version;
    char model[1024];        /* the --model path then (messages only: a moved model resumes) */
    int dim, n_layers, n_heads, n_kv_heads, vocab_size;
    char dtype[16];
    uint64_t model_config;   /* every configuration field (tsr_ckpt_model_identity) */
    uint64_t model_tensors;  /* names, shapes and dtypes of this rank's tensors */
    uint64_t model_weights;  /* sampled content fingerprint of this rank's tensors */
    char tokenizer[1024];    /* its path then (messages only) */
    uint64_t tokenizer_id;   /* tokenizer file contents and chat template */
    char policy[32];
    char policy_options[128]; /* the options that change what the policy keeps */
    int block_size, tp, pp, rank, world;
    int max_batch_seqs, max_context;
    int no_bos;              /* --no-bos */
    uint64_t seed;           /* --seed (requests without one) */
    int kv_layers, kv_dim;   /* this rank's KV shard */
    char output[1024];
    int64_t output_records;  /* records in the output when the checkpoint was written */
} tsr_ckpt_meta;

/* One request: the scheduler's state, the job's bookkeeping, and (running) its KV. */
typedef struct tsr_ckpt_req {
    tsr_sched_saved s;
    char *custom_id; /* NULL when the line had none */
    int64_t line;
    uint64_t body_hash; /* the parsed input line (jobs/run/run_job.h, tsr_run_req_body_hash) */
    int kind;        /* tsr_batch_kind */
    char *stops[TSR_BATCH_MAX_STOPS];
    int n_stops;
    char *text;      /* generated text so far [len] */
    size_t len;
    int32_t prev;
    int n_prompt, n_gen;
    bool has_kv;     /* s.slot >= 0 */
    tsr_kv_seq_state kv;
} tsr_ckpt_req;

typedef struct tsr_ckpt {
    tsr_ckpt_meta meta;
    tsr_ckpt_req *reqs;
    int n_reqs;
} tsr_ckpt;

/* false when the build has no HDF5. */
bool tsr_ckpt_available(void);
/* FILE.h5 itself for one rank; FILE.rank<R>.h5 when world > 1. */
void tsr_ckpt_rank_path(const char *path, int rank, int world, char *buf, size_t cap);
/* Writes path.tmp, then renames it over path. */
tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c);
/* Reads a whole checkpoint (owned by *out; tsr_ckpt_free). A truncated or corrupt file
 * (any checksum that does not match) is TSR_ERR_HDF5/TSR_ERR_FORMAT with one line naming
 * it. */
tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out);
void tsr_ckpt_free(tsr_ckpt *c);
/* Compares a read checkpoint's identity with the current job's (everything but
 * output_records): the first field that differs is named in the error line
 * (TSR_ERR_INVALID). */
tsr_status tsr_ckpt_check(const char *path, const tsr_ckpt_meta *saved,
                          const tsr_ckpt_meta *job);
/* output_records against the output's records now (TSR_ERR_INVALID). */
tsr_status tsr_ckpt_check_records(const char *path, const tsr_ckpt_meta *saved,
                                  const tsr_ckpt_meta *job);

/* A 64-bit hash of n bytes, continuing from h (0 to start). Each 8-byte word goes through
 * a bijection of the state, so two inputs of the same length that differ in one word never
 * collide; otherwise collisions are as rare as for any 64-bit hash. Not cryptographic. */
uint64_t tsr_ckpt_hash(uint64_t h, const void *data, size_t n);
/* Hashes a whole file (the tokenizer) into *out. */
tsr_status tsr_ckpt_file_hash(const char *path, uint64_t *out);
/* The identity of a host model (or of a rank's shard of it): its configuration, its
 * tensors' names, shapes and dtypes, and a content fingerprint: tensors up to 256 KiB
 * whole, larger ones as 32 evenly spaced 4 KiB blocks (first and last included) plus
 * their sizes, so 100 GB of weights cost a few MB of reads. The tensors are read on the
 * host: pass tsr_engine.model (host memory or file views), never backend memory. */
void tsr_ckpt_model_identity(const tsr_model *m, uint64_t *config, uint64_t *tensors,
                             uint64_t *weights);

/* The cache to checkpoint a job's sequences through: kv itself when it can export and
 * import them (tsr_kv_export_seq / tsr_kv_import_seq, through any wrappers), else NULL. */
tsr_kv_cache *tsr_ckpt_kv_mech(tsr_kv_cache *kv);

#endif
