/* The distributed block manager: one logical KV cache over all ranks of a tp x pp job.
 *
 * Every rank runs the same scheduler on the same requests, so every rank asks its own
 * cache (its layers, its KV heads) for the same things in the same order. This wrapper
 * makes the answers collective: seq_add and reserve are agreed over the world (a sequence
 * is admitted, or grows, only when every rank has room; the worst outcome wins:
 * TSR_ERR_BUDGET over TSR_ERR_NO_BLOCKS over TSR_OK, and any other failure is agreed
 * with tsr_comm_agree so all ranks take the same exit), prefix hits are agreed (MIN), and
 * everything else passes through. A reserve is checked on every rank without changing
 * anything (ops->reserve_check), agreed, and committed only when every rank can:
 * a shortage on one rank fails it on all with every cache unchanged. A seq_add that
 * succeeded on some ranks only is undone there (an empty sequence holds no blocks).
 * tsr_kv_setup sizes every rank's pool to the same number of blocks per layer (MIN over
 * the world), so in practice the local answers coincide; either way block tables stay
 * identical across a TP group (tsr_kv_dist_tables_digest checks it). */
#ifndef TSR_MEMORY_KV_DIST_H
#define TSR_MEMORY_KV_DIST_H

#include <stdint.h>

#include "comm/comm.h"
#include "memory/kv_cache.h"

typedef struct tsr_kv_dist_stats {
    int64_t agreements;    /* collective decisions taken */
    int64_t disagreements; /* of them, where this rank's own answer was not the agreed one */
    int64_t injected;      /* shortages injected on this rank (tsr_kv_dist_test_fail_rank) */
} tsr_kv_dist_stats;

/* Wraps `inner` (taken over: destroyed with the wrapper), a cache with reserve_check and
 * seq_blocks: a paged cache or a policy cache over one (else TSR_ERR_INVALID). The wrapper
 * forwards detail, export_seq, import_seq, reserve_check and seq_blocks, so callers never
 * unwrap it. comm must have its layout. */
tsr_status tsr_kv_dist_create(tsr_kv_cache *inner, tsr_comm *comm, tsr_kv_cache **out);
int tsr_kv_is_dist(const tsr_kv_cache *kv);
/* The wrapped cache (kv itself when it is not a dist wrapper). */
tsr_kv_cache *tsr_kv_dist_inner(const tsr_kv_cache *kv);
void tsr_kv_dist_get_stats(const tsr_kv_cache *kv, tsr_kv_dist_stats *out);

/* Fault injection for tests: the next n local answers of seq_add or reserve on world rank
 * `rank` are TSR_ERR_NO_BLOCKS, as if its pool were short, without asking its cache (nothing
 * changes there). Other ranks keep the setting but never use it, so every rank can make the
 * same call; n <= 0 clears it. Not collective. No-op when kv is not a dist wrapper. */
void tsr_kv_dist_test_fail_rank(tsr_kv_cache *kv, int rank, int n);

/* A digest of the block tables of sequences [0, n_seqs) in every layer of the paged cache
 * under kv (0 when there is none): equal digests on the ranks of a TP group mean equal
 * tables. Local, not collective. */
uint64_t tsr_kv_dist_tables_digest(const tsr_kv_cache *kv, int n_seqs);

#endif
