/* The distributed start-up of a job (runtime/engine/dist.h). */
#include "runtime/engine/dist.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/sys.h"
#include "kernels/device_choice.h"
#include "memory/host_pool.h"
#include "policies/policy.h"
#include "runtime/exec/moe.h"

void tsr_dist_options_init(tsr_dist_options *d) {
    memset(d, 0, sizeof *d);
    d->comm_timeout = (float)TSR_COMM_DEFAULT_TIMEOUT;
}

static char tsr__term_msg[160];
static size_t tsr__term_len;
static struct sigaction tsr__old_term;
static bool tsr__term_set;

static void tsr__on_term(int sig) {
    (void)sig;
    ssize_t w = write(STDERR_FILENO, tsr__term_msg, tsr__term_len); /* async-signal-safe */
    (void)w;
    _exit(1);
}

tsr_status tsr_dist_start(tsr_dist *j) {
    memset(j, 0, sizeof *j);
    j->world = 1;
    /* Fault injection for the tests of a rank that dies during start-up. */
    const char *die = getenv("TSR_FAULT_DIE_RANK");
    tsr_comm_options o = {.backend = TSR_COMM_AUTO};
    tsr_topology_preinit(); /* before MPI_Init creates the process's first hwloc topology */
    TSR_TRY(tsr_comm_init(&o, &j->comm));
    tsr_comm_set_timeout(j->comm, 0); /* until tsr_dist_ready: see there */
    j->rank = tsr_comm_world_rank(j->comm);
    j->world = tsr_comm_world_size(j->comm);
    /* MPI's node-local rank; a process alone takes the launcher's (srun -n 4 of separate
     * processes: each its own GPU) */
    j->local_rank = tsr_local_rank_pick(tsr_comm_local_rank(j->comm), j->world,
                                        tsr_local_rank_env(getenv));
    j->local_size = tsr_comm_local_size(j->comm);
    if (die && *die && atoi(die) == j->rank && j->world > 1) _Exit(3);
    if (j->world > 1 && !tsr__term_set) {
        int n = snprintf(tsr__term_msg, sizeof tsr__term_msg,
                         "tessera: rank %d: the launcher ended the job during start-up "
                         "(another rank failed or died; see its message above)\n", j->rank);
        tsr__term_len = n > 0 && (size_t)n < sizeof tsr__term_msg ? (size_t)n : 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = tsr__on_term;
        sigemptyset(&sa.sa_mask);
        tsr__term_set = sigaction(SIGTERM, &sa, &tsr__old_term) == 0;
    }
    return TSR_OK;
}

void tsr_dist_ready(tsr_dist *j) {
    if (j->comm) tsr_comm_set_timeout(j->comm, j->comm_timeout);
    if (tsr__term_set) sigaction(SIGTERM, &tsr__old_term, NULL);
    tsr__term_set = false;
}

tsr_status tsr_dist_agree(tsr_dist *j, tsr_status st) {
    return j->comm ? tsr_comm_agree(j->comm, st) : st;
}

tsr_status tsr_dist_must(tsr_dist *j, tsr_status st) {
    if (st != TSR_OK && j->world > 1) tsr_comm_abort(j->comm, 1, tsr_last_error());
    return st;
}

/* --ep N: the experts spread over the TP group (runtime/exec/moe.h), the same on every rank
 * (the errors too). */
static tsr_status tsr__ep_layout(int ep, int tp, const tsr_model_config *c, const char *what,
                                 tsr_parallel_shard *s) {
    if (c->n_experts <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "--ep %d: %s has no experts (a dense model)", ep,
                             what);
    if (ep != tp)
        return tsr_error_set(TSR_ERR_INVALID, "--ep %d must equal the tensor-parallel ranks "
                             "(--tp %d): the experts are spread over the TP group", ep, tp);
    if (c->n_experts % ep)
        return tsr_error_set(TSR_ERR_INVALID, "--ep %d does not divide the %d experts of %s",
                             ep, c->n_experts, what);
    if (s) tsr_parallel_split(c->n_experts, ep, s->tp_rank, &s->expert_begin, &s->expert_end);
    return TSR_OK;
}

tsr_status tsr_dist_layout(tsr_dist *j, const tsr_dist_options *d, tsr_model *m,
                           const char *what) {
    int pp = d->pp > 0 ? d->pp : 1;
    /* Without --tp the ranks are split over --pp; name only what the user gave. */
    if (d->tp <= 0 && j->world % pp != 0)
        return tsr_error_set(TSR_ERR_INVALID,
                             "--pp %d needs a multiple of %d ranks (tp x pp), but the job has %d",
                             pp, pp, j->world);
    int tp = d->tp > 0 ? d->tp : j->world / pp;
    TSR_TRY(tsr_comm_set_layout(j->comm, tp, pp));
    tsr_parallel_layout l;
    TSR_TRY(tsr_parallel_layout_init(tp, pp, j->world, &l));
    /* --ep's errors before the shard's: "E not divisible" rather than a head count */
    if (d->ep > 1) TSR_TRY(tsr__ep_layout(d->ep, tp, &m->cfg, what, NULL));
    TSR_TRY(tsr_parallel_shard_of(&l, &m->cfg, j->rank, what, &j->shard));
    if (d->ep > 1) TSR_TRY(tsr__ep_layout(d->ep, tp, &m->cfg, what, &j->shard));
    j->micro_batches = d->micro_batches;
    j->ep = d->ep > 1 ? d->ep : 1;
    j->comm_timeout = d->comm_timeout;
    /* Cutting the model is local; agree so that no rank goes on alone. */
    tsr_status st = tsr_parallel_shard_model(m, &j->shard);
    for (int l2 = j->shard.layer_begin; l2 < j->shard.layer_end && st == TSR_OK && d->ep > 1;
         l2++) {
        st = tsr_moe_shard_experts(&m->layers[l2].gate_up, j->shard.expert_begin,
                                   j->shard.expert_end);
        if (st == TSR_OK)
            st = tsr_moe_shard_experts(&m->layers[l2].down, j->shard.expert_begin,
                                       j->shard.expert_end);
    }
    return tsr_dist_agree(j, st);
}

tsr_status tsr_dist_place(tsr_dist *j, bool bind, const char *backend) {
    int n = j->local_size > 0 ? j->local_size : 1;
    const tsr_backend_info *bi = backend ? tsr_backend_find(backend) : NULL;
    bool host_only = bi && !(bi->caps & TSR_BACKEND_CAP_GPU);
    int gpus = host_only ? 0 : tsr_backend_gpu_count();
    const char *spec = getenv("TSR_TOPOLOGY");
    if (!spec || !*spec) spec = gpus > 0 ? "system" : "system-cpu";
    TSR_TRY(tsr_topology_load(spec, &j->topo));
    tsr_placement *all = tsr_calloc((size_t)n, sizeof *all);
    char(*ids)[24] = tsr_calloc((size_t)n, sizeof *ids);
    const char **busids = tsr_calloc((size_t)n, sizeof *busids);
    tsr_status st = all && ids && busids ? TSR_OK : TSR_ERR_NOMEM;
    /* every rank derives all the node's bus ids itself: GPU = local rank % GPUs */
    for (int r = 0; r < n && st == TSR_OK && gpus > 0; r++)
        if (tsr_backend_gpu_busid(r % gpus, ids[r], sizeof ids[r]) == 0) busids[r] = ids[r];
    if (st == TSR_OK)
        st = tsr_topology_place(j->topo, n, gpus > 0 ? busids : NULL, all);
    if (st == TSR_OK) j->place = all[j->local_rank < n ? j->local_rank : 0];
    if (st == TSR_OK && bind) {
        st = tsr_topology_bind(j->topo, &j->place);
        j->bound = st == TSR_OK;
    }
    tsr_free(all);
    tsr_free(ids);
    tsr_free(busids);
    return st;
}

const char *tsr_dist_plane_name(tsr_dist_plane p) {
    return p == TSR_DIST_PLANE_NCCL ? "nccl" : p == TSR_DIST_PLANE_MPI ? "mpi" : "local";
}

tsr_status tsr_dist_plane_choose(const tsr_dist_plane_query *q, tsr_dist_plane *out) {
    *out = TSR_DIST_PLANE_LOCAL;
    if (q->world <= 1) return TSR_OK;
    const char *be = q->backend ? q->backend : "?";
    if (q->device_ranks <= 0) {
        *out = TSR_DIST_PLANE_MPI;
        return TSR_OK;
    }
    /* Half NCCL, half MPI would never meet: one backend kind for the whole job. */
    if (q->device_ranks < q->world)
        return tsr_error_set(TSR_ERR_INVALID,
                             "%d of the job's %d ranks got a GPU backend and the others the "
                             "CPU; give every rank a GPU, or use --backend cpu",
                             q->device_ranks, q->world);
    if (!q->nccl_built)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "the %s backend on %d ranks needs NCCL (activations stay in GPU "
                             "memory, which MPI cannot send), but this tessera was built "
                             "without it (configure with -DTESSERA_NCCL=ON), or use "
                             "--backend cpu", be, q->world);
    /* A policy that sums over the TP group does it in host memory, over MPI: device
     * activations cannot take that road. */
    const tsr_kv_policy_decl *pol = q->kv_policy ? q->kv_policy : tsr_kv_policy_default();
    if (q->tp > 1 && pol->tp_host_sums)
        return tsr_error_set(TSR_ERR_UNSUPPORTED,
                             "--kv-policy %s with tensor parallelism (tp %d) on the %s "
                             "backend is not supported: its score sums over the TP ranks take "
                             "host memory; use --kv-policy paged, or --backend cpu",
                             pol->name, q->tp, be);
    *out = TSR_DIST_PLANE_NCCL;
    return TSR_OK;
}

tsr_status tsr_dist_data_plane(tsr_dist *j, tsr_backend *be,
                               const tsr_kv_policy_decl *kv_policy) {
    j->plane = TSR_DIST_PLANE_LOCAL;
    int64_t dev = be->device >= 0;
    if (j->world > 1) /* `auto` may give GPUs to some nodes' ranks only: count them */
        TSR_TRY(tsr_comm_allreduce_i64(j->comm, TSR_COMM_WORLD, &dev, 1, TSR_COMM_SUM));
    tsr_dist_plane_query q = {.world = j->world, .tp = tsr_comm_tp(j->comm),
                              .device_ranks = (int)dev, .nccl_built = tsr_comm_nccl_built(),
                              .backend = be->ops->name, .kv_policy = kv_policy};
    tsr_dist_plane plane;
    TSR_TRY(tsr_dist_plane_choose(&q, &plane));
    if (plane == TSR_DIST_PLANE_NCCL) {
        void *stream = be->ops->stream_handle ? be->ops->stream_handle(be) : NULL;
        TSR_TRY(tsr_comm_enable_nccl(j->comm, be->device, stream));
    }
    j->plane = plane;
    if (j->rank == 0 && plane != TSR_DIST_PLANE_LOCAL)
        TSR_LOG_INFO("data plane: %s (%s backend); agreements: mpi", tsr_dist_plane_name(plane),
                     be->ops->name);
    return TSR_OK;
}

void tsr_dist_kv_options(const tsr_dist *j, tsr_kv_options *kvo) {
    kvo->shard = &j->shard;
    kvo->comm = j->comm;
    kvo->topo = j->topo;
    kvo->place = j->topo ? &j->place : NULL;
}

tsr_forward_parallel tsr_dist_forward(const tsr_dist *j) {
    return (tsr_forward_parallel){.comm = j->comm, .shard = j->shard,
                                  .micro_batches = j->micro_batches};
}

int tsr_dist_default_threads(const tsr_dist *j) {
    int n = tsr_sys_cpus() / (j->local_size > 0 ? j->local_size : 1);
    return n > 0 ? n : 1;
}

void tsr_dist_log_layout(tsr_dist *j) {
    for (int r = 0; r < j->world; r++) {
        if (r == j->rank) {
            char line[256];
            tsr_parallel_shard_format(&j->shard, line, sizeof line);
            TSR_LOG_INFO("%s", line);
            if (j->topo) {
                char pl[256];
                tsr_topology_format_placement(&j->place, 1, pl, sizeof pl);
                size_t k = strlen(pl);
                while (k > 0 && pl[k - 1] == '\n') pl[--k] = 0;
                TSR_LOG_INFO("rank %d: %s%s", j->rank, pl, j->bound ? ", bound" : "");
            }
            fflush(stderr);
        }
        if (j->world > 1) (void)tsr_comm_barrier(j->comm, TSR_COMM_WORLD);
    }
}

void tsr_dist_end(tsr_dist *j) {
    tsr_dist_ready(j);
    tsr_topology_destroy(j->topo);
    j->topo = NULL;
    tsr_comm_destroy(j->comm);
    j->comm = NULL;
}

int tsr_dist_comm_json(tsr_dist *j, const tsr_comm_stats *prefill, int64_t prefill_tokens,
                       const tsr_comm_stats *decode, int64_t decode_tokens, char *buf,
                       size_t cap) {
    int64_t sum[6] = {prefill->bytes_sent, prefill->bytes_recv, prefill->messages,
                      decode->bytes_sent,  decode->bytes_recv,  decode->messages};
    int64_t mx[2] = {prefill->bytes_sent, decode->bytes_sent};
    if (j->world > 1) {
        (void)tsr_comm_allreduce_i64(j->comm, TSR_COMM_WORLD, sum, 6, TSR_COMM_SUM);
        (void)tsr_comm_allreduce_i64(j->comm, TSR_COMM_WORLD, mx, 2, TSR_COMM_MAX);
    }
    double pt = prefill_tokens > 0 ? (double)prefill_tokens : 1.0;
    double dt = decode_tokens > 0 ? (double)decode_tokens : 1.0;
    return snprintf(buf, cap,
                    "{\"comm\":{\"backend\":\"%s\",\"world\":%d,\"tp\":%d,\"pp\":%d,"
                    "\"ep\":%d,"
                    "\"prefill\":{\"tokens\":%lld,\"bytes_sent\":%lld,\"bytes_recv\":%lld,"
                    "\"messages\":%lld,\"max_rank_bytes_sent\":%lld,\"bytes_per_token\":%.1f},"
                    "\"decode\":{\"tokens\":%lld,\"bytes_sent\":%lld,\"bytes_recv\":%lld,"
                    "\"messages\":%lld,\"max_rank_bytes_sent\":%lld,\"bytes_per_token\":%.1f}}}",
                    tsr_comm_backend_name(j->comm), j->world, tsr_comm_tp(j->comm),
                    tsr_comm_pp(j->comm), j->ep > 1 ? j->ep : 1, (long long)prefill_tokens,
                    (long long)sum[0], (long long)sum[1], (long long)sum[2], (long long)mx[0],
                    (double)sum[0] / pt,
                    (long long)decode_tokens, (long long)sum[3], (long long)sum[4],
                    (long long)sum[5], (long long)mx[1], (double)sum[3] / dt);
}
