/* The CPU backends' sample op (kernels/backend.h): each row through tsr_sample_row, the
 * arithmetic runtime/exec/sampler.c uses, so the tokens are the host sampler's bit for bit. */
#include "base/alloc.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/sample.h"

tsr_status tsr__cpu_sample(tsr_backend *be, float *logits, int64_t n, int vocab,
                           const tsr_sample_params *params, int32_t *ids) {
    (void)be;
    if (n <= 0) return TSR_OK;
    if (vocab <= 0)
        return tsr_error_set(TSR_ERR_INVALID, "sample: vocabulary of %d tokens", vocab);
    tsr_sample_cand *cand = tsr_malloc((size_t)vocab * sizeof *cand);
    if (!cand) return tsr_error_set(TSR_ERR_NOMEM, "sample: no memory for %d candidates", vocab);
    for (int64_t i = 0; i < n; i++)
        ids[i] = tsr_sample_row(logits + (size_t)i * (size_t)vocab, vocab, &params[i], cand);
    tsr_free(cand);
    return TSR_OK;
}
