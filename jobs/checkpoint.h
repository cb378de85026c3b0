/* HDF5 checkpoints of `tessera run` (docs/jobs.md, "Checkpoints"): the requests the
 * scheduler holds at a stop (running and waiting), the job's bookkeeping of each, and the
 * KV rows of the running ones as logical contents (slot rows per layer, not block ids), so a
 * resumed job continues every request where it stopped with the same tokens. One file per
 * rank of a multi-rank job (its shard of the KV). Without HDF5 (TESSERA_HDF5=OFF) every
 * call fails with TSR_ERR_UNSUPPORTED. */
#ifndef TSR_JOBS_CHECKPOINT_H
#define TSR_JOBS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobs/batch_io.h"
#include "memory/kv_cache.h"
#include "runtime/scheduler.h"

#define TSR_CKPT_VERSION 1

/* What a checkpoint must agree with to be resumed (every field is checked). */
typedef struct tsr_ckpt_meta {
    int format_version;
    char model[1024];
    int dim, n_layers, n_heads, n_kv_heads, vocab_size;
    char dtype[16];
    char policy[32];
    int block_size, tp, pp, rank, world;
    int max_batch_seqs, max_context;
    int kv_layers, kv_dim; /* this rank's KV shard */
    char output[1024];
    int64_t output_records; /* records in the output when the checkpoint was written */
} tsr_ckpt_meta;

/* One request: the scheduler's state, the job's bookkeeping, and (running) its KV. */
typedef struct tsr_ckpt_req {
    tsr_sched_saved s;
    char *custom_id; /* NULL when the line had none */
    int64_t line;
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
/* Reads a whole checkpoint (owned by *out; tsr_ckpt_free). A truncated or corrupt file is
 * TSR_ERR_HDF5/TSR_ERR_FORMAT with one line naming it. */
tsr_status tsr_ckpt_read(const char *path, tsr_ckpt *out);
void tsr_ckpt_free(tsr_ckpt *c);
/* Compares a read checkpoint's attributes with the current job's: the first field that
 * differs is named in the error line (TSR_ERR_INVALID). */
tsr_status tsr_ckpt_check(const char *path, const tsr_ckpt_meta *saved,
                          const tsr_ckpt_meta *job);

/* The cache to checkpoint a job's sequences through: kv itself when it can export and
 * import them (tsr_kv_export_seq / tsr_kv_import_seq, through any wrappers), else NULL. */
tsr_kv_cache *tsr_ckpt_kv_mech(tsr_kv_cache *kv);

#endif
