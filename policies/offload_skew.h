/* The numerics of offload's InfiniGen mode (policies/offload.c): the skewing transform of a
 * KV head from the weights, the host rotation of speculative queries, and the alpha rule
 * that sizes a fetch. Kept apart so that tests can check them on hand-built inputs.
 *
 * RoPE: the transform A (orthogonal, hd x hd) is applied after the rotation, to the rotated
 * query and the rotated (cached) key alike, so (R q) A . (R k) A = (R q) . (R k) exactly for
 * every position: attention is untouched whatever A is. A is chosen from the weights as the
 * eigenvectors of the expected covariance of the rotated query, E_t[R(t) C R(t)^T] with
 * C = Wq diag(g^2) Wq^T (g: the attention norm, the input taken as whitened), averaged over
 * the positions t of the context in closed form: between two rotary pairs of different
 * frequency the cross terms average out, within a pair only the rotation-commuting part
 * survives, the slowest pairs keep most of C. A transform that commutes with RoPE itself
 * would have to be a rotation within each pair, which moves no energy between pairs. */
#ifndef TSR_POLICIES_OFFLOAD_SKEW_H
#define TSR_POLICIES_OFFLOAD_SKEW_H

#include <stddef.h>
#include <stdint.h>

#include "base/model_config.h"
#include "base/status.h"
#include "base/tensor.h"

/* Eigen-decomposition of the symmetric n x n matrix a (destroyed): w[n] eigenvalues, v
 * [n][n] with eigenvector c in column c (v[i * n + c]). Cyclic Jacobi. */
void tsr_offload_eig_sym(double *a, int n, double *w, double *v);

/* c ([hd][hd], symmetric) := the mean over positions t in [0, n_pos) of R(t) c R(t)^T, R(t)
 * the rotary rotation at t (pairs (2p, 2p+1) when interleaved, else (p, p + hd/2)). */
void tsr_offload_rope_average(double *c, int hd, const float *inv_freq, int interleaved,
                              int64_t n_pos);

/* The skew of one KV head: the `cols` best columns of A as rows of a ([cols][hd], best
 * first), from the query rows [q_row0, q_row0 + group * hd) of wq (the head's query group)
 * and the attention norm (cfg: head_dim, rope, context). Columns rank by their eigenvalue:
 * the expected energy of the rotated query along them. */
tsr_status tsr_offload_skew_head(const tsr_model_config *cfg, const float *inv_freq,
                                 const tsr_tensor *wq, int64_t q_row0, int group,
                                 const tsr_tensor *norm, int cols, float *a);

/* A query head's calibrated transform (InfiniGen's skew and partial-weight choice): the
 * eigenvectors of m ([hd][hd], the second moment of the head's rotated queries, upper
 * triangle read), of which the union of the `cols` with the largest eigenvalue (the query's
 * energy along them, sum_t (q_t v)^2) and the `cols` with the largest sum_t |k_t v| over the
 * keys k ([nk] rows of stride kst: the head's KV head; none when k is NULL or width <= cols)
 * go to the rows of a ([width][hd], the rest zero). Returns their
 * count (<= width). scratch: 2 hd^2 + 2 hd doubles. */
int tsr_offload_skew_cols(const double *m, int hd, const float *k, int32_t nk, size_t kst,
                          int cols, int width, double *scratch, float *a);

/* a . b over n floats in 8 independent lanes (vectorizable without reassociation), the
 * lanes added in double. */
double tsr_offload_dot(const float *a, const float *b, size_t n);

/* Rotates `heads` heads of hd channels of x by RoPE at position pos, as the backends do. */
void tsr_offload_rope(float *x, int heads, int hd, const float *inv_freq, int interleaved,
                      int32_t pos);

/* The number of keys whose logit is within alpha of its head's maximum, summed over the
 * heads of logits ([heads][n]). */
double tsr_offload_alpha_count(const float *logits, int heads, int32_t n, float alpha);

/* Tokens to fetch: the mean count per (query row, head) of tsr_offload_alpha_count,
 * rounded, at least 1 and at most cap. */
int32_t tsr_offload_alpha_fetch(double count, double rows_heads, int32_t cap);

#endif
