/* The distributed side of the engine's start-up (runtime/engine/engine.h): bootstrap (MPI when a
 * launcher started us, else one process), the tp x pp layout and this rank's shard, the
 * placement of the node's ranks (hwloc) and the activations' data plane once the backend
 * exists. Every fallible step is agreed over the ranks, so that a failure on any rank ends
 * every rank with the same one-line message (printed by rank 0) and never a hang. The
 * engine runs these steps; commands only read the job (rank, world, comm) and agree on
 * their own steps (tsr_dist_agree, tsr_dist_must). */
#ifndef TSR_RUNTIME_DIST_H
#define TSR_RUNTIME_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"
#include "memory/topology.h"
#include "runtime/exec/forward.h"
#include "runtime/exec/kv_setup.h"
#include "runtime/model/model.h"
#include "runtime/exec/parallel.h"

/* What the user asks of a distributed job (--tp, --pp, ...: jobs/dist_cli.h). */
typedef struct tsr_dist_options {
    int tp, pp;         /* 0: pp 1, tp = world / pp */
    int ep;             /* expert parallelism over the TP group: 0 or 1 off, else = tp */
    int micro_batches;  /* 0: pp */
    bool bind;          /* bind each rank to its cores */
    float comm_timeout; /* seconds (tsr_comm_set_timeout); 0: off */
} tsr_dist_options;

/* The defaults: nothing given, the comm's default timeout. */
void tsr_dist_options_init(tsr_dist_options *d);

/* Where the activations cross ranks (the data plane; control-plane agreements always use
 * MPI with host buffers). */
typedef enum tsr_dist_plane {
    TSR_DIST_PLANE_LOCAL = 0, /* one rank: nothing crosses */
    TSR_DIST_PLANE_MPI = 1,   /* host backend: host activations over MPI */
    TSR_DIST_PLANE_NCCL = 2,  /* device backend: device activations over NCCL */
} tsr_dist_plane;

/* What the data-plane choice depends on, the same on every rank. */
typedef struct tsr_dist_plane_query {
    int world, tp;
    int device_ranks;      /* ranks whose backend keeps activations on a GPU */
    bool nccl_built;       /* tsr_comm_nccl_built() */
    const char *backend;   /* this rank's backend name, for messages */
    const tsr_kv_policy_decl *kv_policy; /* --kv-policy's declaration; NULL: the default */
} tsr_dist_plane_query;

typedef struct tsr_dist {
    tsr_comm *comm;
    tsr_dist_plane plane;     /* after tsr_dist_data_plane */
    tsr_parallel_shard shard; /* valid after tsr_dist_layout */
    int rank, world, local_rank, local_size;
    int micro_batches;
    int ep;                   /* expert parallelism over the TP group (1: off) */
    tsr_topology *topo;       /* after tsr_dist_place */
    tsr_placement place;      /* this rank's */
    bool bound;               /* bound to place's cores */
    double comm_timeout;      /* the watchdog's, from tsr_dist_layout on at tsr_dist_ready */
} tsr_dist;

/* Bootstraps the job: MPI when a launcher started us, else one process. Until
 * tsr_dist_ready, a SIGTERM (the launcher ending the job because another rank died) prints
 * "tessera: rank R: ..." and exits 1, so that a rank stuck in a start-up collective still
 * says why it ends. */
tsr_status tsr_dist_start(tsr_dist *j);
/* The start-up is over: the previous SIGTERM disposition comes back, and the watchdog
 * (--comm-timeout, see tsr_comm_set_timeout) starts. It is off during the start-up, whose
 * agreements wait for the slowest rank's model load, which may take long on a big model. */
void tsr_dist_ready(tsr_dist *j);
/* Every rank passes its own status; all get the same answer (tsr_comm_agree). */
tsr_status tsr_dist_agree(tsr_dist *j, tsr_status st);
/* After the start-up, a failure on one rank cannot be agreed on (the others are inside a
 * collective): in a multi-rank job it ends the whole job with the rank's message. */
tsr_status tsr_dist_must(tsr_dist *j, tsr_status st);
/* Sets the tp x pp layout (defaults from the world size), checks it against the model
 * (`what` names it) and cuts the model to this rank's shard. Collective. */
tsr_status tsr_dist_layout(tsr_dist *j, const tsr_dist_options *d, tsr_model *m,
                           const char *what);
/* Places the node's ranks (memory/topology.h): GPU ranks near their device, CPU ranks
 * spread over the NUMA nodes; binds this rank to its cores when asked. The topology is
 * this machine, or the hwloc description in $TSR_TOPOLOGY (tests: a synthetic machine;
 * it cannot be bound to). Local; the caller agrees. */
/* `backend` (NULL: auto) decides whether GPUs are counted: a host backend never loads the
 * GPU module, not even on a GPU node. */
tsr_status tsr_dist_place(tsr_dist *j, bool bind, const char *backend);
/* The data plane for a job (pure; tests): LOCAL for one rank, MPI when no rank has a
 * device backend, NCCL when all have. Errors (one line): some ranks on a GPU and others
 * not; a device backend across ranks in a build without NCCL (device memory cannot go
 * through MPI); a KV policy that sums over the TP group in host memory (its declaration's
 * tp_host_sums) with tp > 1 on a device backend. */
tsr_status tsr_dist_plane_choose(const tsr_dist_plane_query *q, tsr_dist_plane *out);
const char *tsr_dist_plane_name(tsr_dist_plane p);
/* Once the backend exists (after tsr_dist_layout): the ranks agree on whether it is a
 * device backend, choose the data plane (j->plane) and, for NCCL, move the comm's data
 * plane to the backend's device and stream (tsr_comm_enable_nccl). Collective; every
 * error is the same on every rank, except a failure inside NCCL's own initialization,
 * which ends the job. */
tsr_status tsr_dist_data_plane(tsr_dist *j, tsr_backend *be,
                               const tsr_kv_policy_decl *kv_policy);

/* Fills the distributed fields of KV options: shard, comm and the placed host pool. */
void tsr_dist_kv_options(const tsr_dist *j, tsr_kv_options *kvo);
/* What tsr_forward_create_parallel needs. */
tsr_forward_parallel tsr_dist_forward(const tsr_dist *j);
/* Rank 0 prints and writes outputs. */
static inline bool tsr_dist_is_root(const tsr_dist *j) { return j->rank == 0; }
/* CPU threads of this rank when none were asked for: the node's CPUs over its ranks. */
int tsr_dist_default_threads(const tsr_dist *j);
/* For --verbose, every rank in order: its shard ("rank 1 (tp 1, pp 0): heads 4-7, ...")
 * and its placement ("local rank 1: NUMA node 1 ..., host pool bound"). Collective. */
void tsr_dist_log_layout(tsr_dist *j);
/* Topology and comm (the comm last: MPI finalizes). */
void tsr_dist_end(tsr_dist *j);

/* One JSON object (no newline) of the job's communication: layout, and for the prefill
 * and decode phases the data-plane bytes sent by all ranks together, the most one rank
 * sent, messages, and bytes per token. Collective (sums over the world). */
int tsr_dist_comm_json(tsr_dist *j, const tsr_comm_stats *prefill, int64_t prefill_tokens,
                       const tsr_comm_stats *decode, int64_t decode_tokens, char *buf,
                       size_t cap);

#endif
