/* The offload policy's copies off the compute stream (issue 24's "offload overlapped"): one
 * copy stream per direction, created through the backend, and per sequence and layer the
 * staging buffers and events that let
 * - the prefetch of a layer's selection, made while the previous layer runs, go up on the
 *   host-to-device stream, the compute stream waiting for it only where the layer's
 *   attention needs the rows (an event, no host wait), and
 * - the step's new K/V rows go down into the host pool (registered, so the copy is
 *   asynchronous) on the device-to-host stream, no host wait either.
 * Nothing a copy reads or writes is reused while it may be in flight: staging is per
 * sequence and layer, used once per step, and the drain at the next step's start (one host
 * wait covering the compute stream and both copy streams) frees it all and reports the
 * write-backs that arrived, so the policy derives what it keeps from them (partial keys)
 * only then. Where the backend's memory is the host's (the plain CPU backend) nothing here
 * runs: the policy copies synchronously, as it would gain nothing.
 *
 * With a backend that times events (event_elapsed: CUDA), each prefetch also measures its
 * copy (upload start to end on the copy stream) and the compute stream's stall at the wait
 * (an event before and after it), read at the drain: hidden fraction = 1 - stall / copy. */
#ifndef TSR_POLICIES_OFFLOAD_COPY_H
#define TSR_POLICIES_OFFLOAD_COPY_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "base/status.h"

typedef struct tsr_offload_copy tsr_offload_copy;

/* Called at the drain for each write-back that arrived: rows [at, at + n) of (seq, layer)
 * are in the host copy now. */
typedef void (*tsr_offload_copy_arrived_fn)(void *ctx, int seq, int layer, int32_t at,
                                            int32_t n);

typedef struct tsr_offload_copy_stats {
    int64_t prefetches;       /* selections queued on the host-to-device stream */
    int64_t prefetch_used;    /* of them, taken by the layer's select (the same rows) */
    int64_t prefetch_dropped; /* of them, the select fetched other rows (synchronously) */
    int64_t writebacks;       /* write-backs queued on the device-to-host stream */
    int64_t drains;           /* host waits at step starts with copies in flight */
    int64_t timed;            /* prefetches with a time measurement */
    double copy_ms;           /* their copies' time on the copy stream */
    double stall_ms;          /* the compute stream's waits for them */
} tsr_offload_copy_stats;

/* *out NULL (and TSR_OK) where the backend's memory is host memory: nothing to overlap.
 * kv_dim: floats per K (and V) row; arrived(ctx, ...) at each drain. */
tsr_status tsr_offload_copy_create(tsr_backend *be, int n_layers, int kv_dim,
                                   tsr_offload_copy_arrived_fn arrived, void *ctx,
                                   tsr_offload_copy **out);
/* Waits for what is in flight (arrived not called), then frees everything. */
void tsr_offload_copy_destroy(tsr_offload_copy *c);

/* The step boundary: when copies are in flight, one host wait for the compute stream and
 * both copy streams, then `arrived` for every write-back; every staging buffer is free
 * after it. */
tsr_status tsr_offload_copy_drain(tsr_offload_copy *c);

/* Queues the write-back of n new rows k, v ([n][kv_dim], backend memory: the layer's
 * activations, copied first to the pair's staging on the compute stream, so that the next
 * layer may overwrite them) into host rows hk, hv ([n][kv_dim], registered host memory) on
 * the device-to-host stream. *queued false (TSR_OK): no staging memory or the pair's last
 * write-back not yet drained; the caller downloads synchronously. */
tsr_status tsr_offload_copy_writeback(tsr_offload_copy *c, int seq, int layer, const float *k,
                                      const float *v, int32_t n, float *hk, float *hv,
                                      int32_t at, bool *queued);

/* Packs rows pos[0 .. n) of the host copy hk, hv ([rows][kv_dim]) into the pair's pinned
 * staging and queues their upload to its device staging on the host-to-device stream.
 * *queued false (TSR_OK): no staging memory, or the pair's staging still in flight. */
tsr_status tsr_offload_copy_prefetch(tsr_offload_copy *c, int seq, int layer, const float *hk,
                                     const float *hv, const int32_t *pos, int32_t n,
                                     bool *queued);

/* At the layer's select: when the pair's prefetch holds exactly pos[0 .. n), the compute
 * stream waits for its upload (no host wait) and *k, *v get the device rows ([n][kv_dim],
 * in pos order); otherwise *k = *v = NULL and the prefetch is dropped. */
tsr_status tsr_offload_copy_take(tsr_offload_copy *c, int seq, int layer, const int32_t *pos,
                                 int32_t n, const float **k, const float **v);

/* The sequence goes: a drain first when any of its copies is in flight, then its staging
 * is freed. */
tsr_status tsr_offload_copy_release(tsr_offload_copy *c, int seq);

void tsr_offload_copy_get_stats(const tsr_offload_copy *c, tsr_offload_copy_stats *out);

#endif
