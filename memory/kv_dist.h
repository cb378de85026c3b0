/* The distributed block manager: one logical KV cache over all ranks of a tp x pp job.
 *
 * Every rank runs the same scheduler on the same requests, so every rank asks its own
 * cache (its layers, its KV heads) for the same things in the same order. This wrapper
 * makes the answers collective: seq_add and reserve are agreed over the world (a sequence
 * is admitted, or grows, only when every rank has room; the worst outcome wins:
 * TSR_ERR_BUDGET over TSR_ERR_NO_BLOCKS over TSR_OK, and any other failure is agreed
 * with tsr_comm_agree so all ranks take the same exit), prefix hits are agreed (MIN), and
 * everything else passes through. tsr_kv_setup sizes every rank's pool to the same number
 * of blocks per layer (MIN over the world), so in practice the local answers coincide and
 * block tables are identical across a TP group (tsr_kv_dist_tables_digest checks it);
 * the agreement keeps ranks in step even when they do not. */
#ifndef TSR_MEMORY_KV_DIST_H
#define TSR_MEMORY_KV_DIST_H

#include <stdint.h>

#include "comm/comm.h"
#include "memory/kv_cache.h"

typedef struct tsr_kv_dist_stats {
    int64_t agreements;    /* collective decisions taken */
    int64_t disagreements; /* of them, where this rank's own answer was not the agreed one */
} tsr_kv_dist_stats;

/* Wraps `inner` (taken over: destroyed with the wrapper). comm must have its layout. */
tsr_status tsr_kv_dist_create(tsr_kv_cache *inner, tsr_comm *comm, tsr_kv_cache **out);
int tsr_kv_is_dist(const tsr_kv_cache *kv);
/* The wrapped cache (kv itself when it is not a dist wrapper). */
tsr_kv_cache *tsr_kv_dist_inner(const tsr_kv_cache *kv);
void tsr_kv_dist_get_stats(const tsr_kv_cache *kv, tsr_kv_dist_stats *out);

/* A digest of the block tables of sequences [0, n_seqs) in every layer of the paged cache
 * under kv (0 when there is none): equal digests on the ranks of a TP group mean equal
 * tables. Local, not collective. */
uint64_t tsr_kv_dist_tables_digest(const tsr_kv_cache *kv, int n_seqs);

#endif
