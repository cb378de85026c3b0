/* The `paged` policy: keeps every token (vLLM semantics), the exact baseline. All hooks are
 * the mechanism's own; prefix sharing is on. */
#include "policies/policy.h"

static tsr_status tsr__paged_pol_create(const tsr_kv_policy_config *cfg, tsr_kv_cache *mech,
                                        void **state) {
    (void)cfg;
    (void)mech;
    *state = NULL;
    return TSR_OK;
}

const tsr_kv_policy_ops tsr_kv_policy_paged = {
    .name = "paged",
    .help = "keep all",
    .wants_scores = 0,
    .allows_prefix_cache = 1,
    .create = tsr__paged_pol_create,
};
