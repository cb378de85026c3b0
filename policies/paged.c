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

/* Reads nothing from the forward pass: a decode step downloads no queries, scores or
 * attention input for it (tests/unit/test_policy_transfers.c counts). */
const tsr_kv_policy_decl tsr_kv_policy_paged = {
    .name = "paged",
    .help = "keep all",
    .allows_prefix_cache = 1,
    .checkpointable = 1,
    .create = tsr__paged_pol_create,
};
