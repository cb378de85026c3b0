/* Private to the Q6_K kernels of the CPU backend (quant_q6k.c: packing, the scalar reference
 * and dispatch; quant_q6k_avx2.c and quant_q6k_avx512.c: AVX2 and AVX-512 VNNI, each under
 * its own target pragma). The activations are the
 * Q8_0 kernels' (quant_q8_internal.h), and so is the kernel contract, tsr__q8_gemv_fn over
 * the 32-column blocks of quant_q6k.h, except for xs: per block not the sum of its 32 codes
 * but tsr__q6k_act_sums's pair of 16-column sums. */
#ifndef TSR_KERNELS_CPU_QUANT_Q6K_INTERNAL_H
#define TSR_KERNELS_CPU_QUANT_Q6K_INTERNAL_H

#include "kernels/cpu/quant_q6k.h"
#include "kernels/cpu/quant_q8_internal.h"

#define TSR__Q6K_GBB TSR_Q6K_GROUP_BLOCK_BYTES
#define TSR__Q6K_SC 32   /* offsets in a group block: the scale pairs */
#define TSR__Q6K_QL 64   /* the 4 low-bit steps */
#define TSR__Q6K_QHA 320 /* the high bits of columns 0-15 */
#define TSR__Q6K_QHB 384 /* ... and 16-31 */

/* Per 32-column block b of the Q8_0 codes xq[cols] (cols % 32 == 0): the sums of its first
 * and last 16 codes as two int16 in xs[b] (the first in the low half; |sum| <= 2032), the
 * offset of the codes q + 32 that the SIMD kernels multiply. */
void tsr__q6k_act_sums(const int8_t *xq, int64_t cols, int32_t *xs);

typedef struct tsr__q6k_kernels {
    tsr__q8_variant variant;
    const char *name;
    tsr__q8_gemv_fn gemv;
} tsr__q6k_kernels;

/* The variant's kernels, or NULL when the CPU lacks it. AVX-512 VNNI has its own
 * (quant_q6k_avx512.c); AVX-VNNI CPUs run the AVX2 kernel (they have its instructions). */
const tsr__q6k_kernels *tsr__q6k_kernels_for(tsr__q8_variant v);
/* The kernel for the variant tsr__q8_kernels_get chooses (the same ISA cap). */
const tsr__q6k_kernels *tsr__q6k_kernels_get(void);

#if defined(__x86_64__) || defined(__i386__)
extern const tsr__q6k_kernels tsr__q6k_k_avx2;
extern const tsr__q6k_kernels tsr__q6k_k_avx512vnni;
#endif

_Static_assert(TSR_Q6K_GROUP == 16, "tsr__qgroup_store_* assume 16-row groups");
_Static_assert(TSR_Q6K_GROUP_BLOCK_BYTES == TSR_Q6K_GROUP * TSR_Q6K_ROW_BYTES, "layout");

#endif
