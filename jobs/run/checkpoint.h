/* HDF5 checkpoints of `tessera run` (docs/jobs.md, "Checkpoints"): the requests the
 * scheduler holds at a stop (running and waiting), the job's bookkeeping of each, and the
 * KV rows of the running ones as logical contents (slot rows per layer, not block ids), so a
 * resumed job continues every request where it stopped with the same tokens.
 *
 * One file per job, laid out by the model, not by the ranks: K and V of layer L are one
 * pool [rows x kv_heads x head_dim] holding every running request's rows (an index says
 * which rows are whose), with each row's position and score, so a job on any tp x pp (one
 * rank included) reads the slice it holds. A multi-rank job writes it with parallel HDF5
 * over MPI-IO, each rank its hyperslab (its layers, its KV heads) in one collective write
 * per dataset. The HDF5 code is a run-time module (jobs/run/checkpoint_h5.c), so that runs
 * without checkpoints map none of HDF5's libraries; without HDF5 (TESSERA_HDF5=OFF) or
 * without the module, every call fails with TSR_ERR_UNSUPPORTED and one line saying so.
 *
 * A checkpoint is bound to its job: it records the model's identity (configuration, tensor
 * names/shapes/dtypes, a sampled content fingerprint, all of the whole model), the
 * tokenizer's, the KV policy and its options and the hash of every request's body, and a
 * resume that does not match is refused with one line; the layout that wrote it is
 * recorded, not checked. It is checksummed: the file's metadata by HDF5's own checksums
 * (format 1.10), everything else by a sum of hashes of every attribute, dataset and KV row
 * (per KV head) that must equal the one stored, so a damaged file is refused, never used. */
#ifndef TSR_JOBS_CHECKPOINT_H
#define TSR_JOBS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <stdio.h>

#include "comm/comm.h"
#include "jobs/run/batch_io.h"
#include "memory/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/exec/scheduler.h"

/* 3: one file per job, KV pools laid out by the model (2: one file per rank) */
#define TSR_CKPT_VERSION 3

/* What a checkpoint must agree with to be resumed (every field but the two paths, which
 * only name things in messages, and the layout that wrote it, is checked). */
typedef struct tsr_ckpt_meta {
    int format_version;
    char model[1024];        /* the --model path then (messages only: a moved model resumes) */
    int dim, n_layers, n_heads, n_kv_heads, vocab_size;
    char dtype[16];
    uint64_t model_config;   /* every configuration field (tsr_ckpt_model_identity) */
    uint64_t model_tensors;  /* names, shapes and dtypes of the whole model's tensors */
    uint64_t model_weights;  /* sampled content fingerprint of the whole model */
    char tokenizer[1024];    /* its path then (messages only) */
    uint64_t tokenizer_id;   /* tokenizer file contents and chat template */
    char policy[32];
    char policy_options[128]; /* the options that change what the policy keeps */
    int block_size;
    int tp, pp, rank, world;  /* the layout that wrote it (recorded, not checked; rank 0) */
    int max_batch_seqs, max_context;
    int no_bos;              /* --no-bos */
    uint64_t seed;           /* --seed (requests without one) */
    int kv_layers, kv_dim;   /* the model's KV: layers, n_kv_heads x head_dim */
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
    tsr_kv_seq_state kv; /* the part of its KV this rank holds (tsr_ckpt_part) */
} tsr_ckpt_req;

typedef struct tsr_ckpt {
    tsr_ckpt_meta meta;
    tsr_ckpt_req *reqs;
    int n_reqs;
} tsr_ckpt;

/* The part of the model's KV one rank holds, and the job's ranks. */
typedef struct tsr_ckpt_part {
    tsr_comm *comm;                 /* the job's (world group); NULL: one process */
    int layer_begin, layer_end;     /* global layers */
    int kv_head_begin, kv_head_end; /* global KV heads */
    /* The first rank of the TP ranks that hold these KV heads (replicated when tp exceeds
     * the KV heads): it writes them and counts them in the checksum. */
    bool head_owner;
} tsr_ckpt_part;

/* Whether checkpoints can be read and written: the build has HDF5 and its module
 * (libtessera-hdf5.so, loaded here on first use) loads; when not, the error line says why
 * (tsr_last_error). Every call below loads it the same way and fails with that line. */
bool tsr_ckpt_available(void);
/* The per-rank file a tessera of format 2 wrote for rank 0 (FILE.rank0.h5), which this
 * one refuses by name. */
void tsr_ckpt_rank_path(const char *path, int rank, int world, char *buf, size_t cap);
/* The whole model's KV of m (one process). */
tsr_ckpt_part tsr_ckpt_part_whole(const tsr_ckpt_meta *m);
/* Writes path.tmp, then renames it over path (after an fsync, by rank 0 after a barrier).
 * Collective over part->comm: every rank passes the same meta and requests, each with the
 * KV it holds; every rank returns the same status. */
tsr_status tsr_ckpt_write_part(const char *path, const tsr_ckpt *c, const tsr_ckpt_part *part);
/* Reads a checkpoint, each request's KV cut to `part` (owned by *out; tsr_ckpt_free).
 * Collective over part->comm, the same status on every rank. A truncated or corrupt file
 * (any checksum that does not match), or one of format 2, is TSR_ERR_HDF5/TSR_ERR_FORMAT
 * with one line naming it. */
tsr_status tsr_ckpt_read_part(const char *path, const tsr_ckpt_part *part, tsr_ckpt *out);
/* One process, the whole KV (c->meta's kv_layers x kv_dim). */
tsr_status tsr_ckpt_write(const char *path, const tsr_ckpt *c);
tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out);
/* What `tessera checkpoint inspect` prints: the binding, the requests and the bytes per
 * layer, as text lines on f (one process, reads the file's index and pools' shapes only,
 * then verifies the whole file as a resume would). */
tsr_status tsr_ckpt_inspect(const char *path, FILE *f);
void tsr_ckpt_free(tsr_ckpt *c);
/* Compares a read checkpoint's identity with the current job's (everything but
 * output_records and the layout): the first field that differs is named in the error line
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
/* The identity of a host model (the whole model: engine spec model_loaded): its configuration, its
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
