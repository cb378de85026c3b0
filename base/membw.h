/* Streaming-read bandwidth: the ceiling of a memory-bound decode step, measured the same
 * way by bench/membw.c (tsr_membw) and `tessera bench --membw-mib` (paired with the decode,
 * so both see the same moment of a shared machine). */
#ifndef TSR_BASE_MEMBW_H
#define TSR_BASE_MEMBW_H

#include <stddef.h>
#include <stdint.h>

/* Fills buf (bytes, a multiple of 8, 32-byte aligned) with a fixed pattern, each thread
 * first-touching the slice it will later read. */
void tsr_membw_fill(void *buf, size_t bytes, int threads);
/* One pass: `threads` OpenMP threads each xor-sum one contiguous slice of buf (AVX2 loads
 * with four independent accumulators where the CPU has AVX2). Returns the seconds taken;
 * the sum goes to *sink so that the reads cannot be dropped. */
double tsr_membw_pass(const void *buf, size_t bytes, int threads, volatile uint64_t *sink);
/* Whether a read buffer of `bytes` fits: at most half of the memory available (a bigger
 * one ends in the OOM killer while being filled). True when that is unknown; *avail gets
 * MemAvailable in bytes (-1: unknown). */
int tsr_membw_fits(size_t bytes, int64_t *avail);
/* Whether tsr_membw_pass uses AVX2 on this CPU. */
int tsr_membw_simd(void);

#endif
