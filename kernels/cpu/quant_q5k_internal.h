/* Private to the Q5_K kernels of the CPU backend (quant_q5k.c: packing, the scalar reference
 * and dispatch; quant_q5k_avx2.c and quant_q5k_avx512.c: AVX2 and AVX-512 VNNI, each under
 * its own target pragma). The activations and the
 * kernel contract are the Q8_0 kernels' (quant_q8_internal.h): tsr__q8_gemv_fn over the
 * 32-column blocks of quant_q5k.h, xs the Q8_0 block sums. */
#ifndef TSR_KERNELS_CPU_QUANT_Q5K_INTERNAL_H
#define TSR_KERNELS_CPU_QUANT_Q5K_INTERNAL_H

#include "kernels/cpu/quant_q5k.h"
#include "kernels/cpu/quant_q8_internal.h"

#define TSR__Q5K_GBB TSR_Q5K_GROUP_BLOCK_BYTES
#define TSR__Q5K_DMIN 32 /* offsets in a group block: the dmin plane */
#define TSR__Q5K_SC 64   /* the scales */
#define TSR__Q5K_M 80    /* the mins */
#define TSR__Q5K_QL 96   /* the 4 low-bit steps */
#define TSR__Q5K_QH 352  /* the high bits */

typedef struct tsr__q5k_kernels {
    tsr__q8_variant variant;
    const char *name;
    tsr__q8_gemv_fn gemv;
} tsr__q5k_kernels;

/* The variant's kernels, or NULL when the CPU lacks it. AVX-512 VNNI has its own
 * (quant_q5k_avx512.c); AVX-VNNI CPUs run the AVX2 kernel (they have its instructions). */
const tsr__q5k_kernels *tsr__q5k_kernels_for(tsr__q8_variant v);
/* The kernel for the variant tsr__q8_kernels_get chooses (the same ISA cap). */
const tsr__q5k_kernels *tsr__q5k_kernels_get(void);

#if defined(__x86_64__) || defined(__i386__)
extern const tsr__q5k_kernels tsr__q5k_k_avx2;
extern const tsr__q5k_kernels tsr__q5k_k_avx512vnni;
#endif

_Static_assert(TSR_Q5K_GROUP == 16, "tsr__qgroup_store_* assume 16-row groups");
_Static_assert(TSR_Q5K_GROUP_BLOCK_BYTES == TSR_Q5K_GROUP * TSR_Q5K_ROW_BYTES, "layout");

#endif
