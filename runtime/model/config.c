#include "runtime/model/config.h"

void tsr_config_defaults(tsr_model_config *c) {
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->dim / c->n_heads;
    if (c->norm_eps == 0.0f) c->norm_eps = 1e-5f;
    if (c->rope_theta == 0.0f) c->rope_theta = 10000.0f;
}

tsr_status tsr_config_validate(const tsr_model_config *c, const char *what) {
#define TSR__CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond)) return tsr_error_set(TSR_ERR_FORMAT, __VA_ARGS__);                \
    } while (0)
    /* Upper bounds keep products below 2^62 and catch garbage headers early. */
    TSR__CHECK(c->dim > 0 && c->dim <= 65536, "%s: invalid hidden size %d", what, c->dim);
    TSR__CHECK(c->hidden_dim > 0 && c->hidden_dim <= 1 << 20,
               "%s: invalid intermediate size %d", what, c->hidden_dim);
    TSR__CHECK(c->n_layers > 0 && c->n_layers <= 1024, "%s: invalid layer count %d", what,
               c->n_layers);
    TSR__CHECK(c->n_heads > 0 && c->n_heads <= 1024, "%s: invalid head count %d", what,
               c->n_heads);
    TSR__CHECK(c->n_kv_heads > 0 && c->n_kv_heads <= c->n_heads,
               "%s: invalid kv head count %d (heads %d)", what, c->n_kv_heads, c->n_heads);
    TSR__CHECK(c->n_heads % c->n_kv_heads == 0,
               "%s: heads (%d) not a multiple of kv heads (%d)", what, c->n_heads,
               c->n_kv_heads);
    TSR__CHECK(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= 1024,
               "%s: invalid head dim %d (must be even)", what, c->head_dim);
    TSR__CHECK(c->vocab_size > 0 && c->vocab_size <= 1 << 24, "%s: invalid vocab size %d",
               what, c->vocab_size);
    TSR__CHECK(c->max_seq_len > 0 && c->max_seq_len <= 1 << 24,
               "%s: invalid max sequence length %d", what, c->max_seq_len);
    TSR__CHECK(c->norm_eps > 0.0f && c->norm_eps < 1.0f, "%s: invalid norm eps %g", what,
               (double)c->norm_eps);
    TSR__CHECK(c->rope_theta > 0.0f, "%s: invalid rope theta %g", what, (double)c->rope_theta);
    if (c->rope_scaling == TSR_ROPE_LLAMA3) {
        TSR__CHECK(c->rope_factor > 0.0f && c->rope_low_freq_factor > 0.0f &&
                       c->rope_high_freq_factor > c->rope_low_freq_factor &&
                       c->rope_original_max_pos > 0,
                   "%s: invalid llama3 rope_scaling parameters", what);
    }
    if (c->rope_scaling == TSR_ROPE_YARN) {
        TSR__CHECK(c->rope_factor > 0.0f && c->rope_beta_fast > 0.0f && c->rope_beta_slow > 0.0f &&
                       c->rope_original_max_pos > 0 && c->rope_attn_factor > 0.0f,
                   "%s: invalid yarn rope parameters", what);
    }
    if (c->n_experts > 0) {
        TSR__CHECK(c->n_experts_used > 0 && c->n_experts_used <= c->n_experts &&
                       c->n_experts_used <= 64,
                   "%s: invalid experts: %d, %d per token", what, c->n_experts,
                   c->n_experts_used);
        TSR__CHECK(c->arch == TSR_ARCH_GPT_OSS, "%s: experts are only supported for GPT-OSS",
                   what);
    }
#undef TSR__CHECK
    return TSR_OK;
}

int64_t tsr_config_param_count(const tsr_model_config *c) {
    int64_t d = c->dim, h = c->hidden_dim, hd = c->head_dim;
    /* a mixture of experts: every expert's three matrices and the router */
    int64_t mlp = c->n_experts > 0 ? 3 * d * h * c->n_experts + d * c->n_experts : 3 * d * h;
    int64_t per_layer = d * hd * c->n_heads * 2 + d * hd * c->n_kv_heads * 2 + mlp + 2 * d;
    int64_t emb = (int64_t)c->vocab_size * d;
    return emb * (c->tied_embeddings ? 1 : 2) + per_layer * c->n_layers + d;
}
