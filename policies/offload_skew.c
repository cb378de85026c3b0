/* Numerics of offload's InfiniGen mode (policies/offload_skew.h). */
#include "policies/offload_skew.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/cpu/quant_blocks.h"

void tsr_offload_eig_sym(double *a, int n, double *w, double *v) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) v[(size_t)i * n + j] = i == j;
    double scale = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) scale += a[(size_t)i * n + j] * a[(size_t)i * n + j];
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) off += a[(size_t)i * n + j] * a[(size_t)i * n + j];
        if (off <= 1e-30 * scale || off == 0.0) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                double apq = a[(size_t)p * n + q];
                if (apq == 0.0) continue;
                /* the rotation J (c, s in rows/columns p, q) that zeroes a[p][q] in J^T a J */
                double th = (a[(size_t)q * n + q] - a[(size_t)p * n + p]) / (2.0 * apq);
                double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
                double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (int k = 0; k < n; k++) {
                    double kp = a[(size_t)k * n + p], kq = a[(size_t)k * n + q];
                    a[(size_t)k * n + p] = c * kp - s * kq;
                    a[(size_t)k * n + q] = s * kp + c * kq;
                }
                for (int k = 0; k < n; k++) {
                    double pk = a[(size_t)p * n + k], qk = a[(size_t)q * n + k];
                    a[(size_t)p * n + k] = c * pk - s * qk;
                    a[(size_t)q * n + k] = s * pk + c * qk;
                }
                for (int k = 0; k < n; k++) {
                    double kp = v[(size_t)k * n + p], kq = v[(size_t)k * n + q];
                    v[(size_t)k * n + p] = c * kp - s * kq;
                    v[(size_t)k * n + q] = s * kp + c * kq;
                }
            }
    }
    for (int i = 0; i < n; i++) w[i] = a[(size_t)i * n + i];
}

/* mean over t in [0, n) of exp(i phi t) = exp(i phi (n-1)/2) sin(n phi/2) / (n sin(phi/2)) */
static void tsr__mean_phase(double phi, int64_t n, double *re, double *im) {
    double sh = sin(phi / 2.0);
    if (n <= 1 || fabs(sh) < 1e-12) {
        *re = 1.0;
        *im = 0.0;
        return;
    }
    double r = sin((double)n * phi / 2.0) / ((double)n * sh), ph = phi * (double)(n - 1) / 2.0;
    *re = r * cos(ph);
    *im = r * sin(ph);
}

static void tsr__pair(int p, int hd, int inter, int *a, int *b) {
    *a = inter ? 2 * p : p;
    *b = inter ? 2 * p + 1 : p + hd / 2;
}

void tsr_offload_rope_average(double *c, int hd, const float *inv_freq, int interleaved,
                              int64_t n_pos) {
    int half = hd / 2;
    for (int p = 0; p < half; p++)
        for (int p2 = 0; p2 < half; p2++) {
            int a0, b0, a1, b1;
            tsr__pair(p, hd, interleaved, &a0, &b0);
            tsr__pair(p2, hd, interleaved, &a1, &b1);
            double m00 = c[(size_t)a0 * hd + a1], m01 = c[(size_t)a0 * hd + b1];
            double m10 = c[(size_t)b0 * hd + a1], m11 = c[(size_t)b0 * hd + b1];
            /* m = m+ + m-: m+ = [[x, -y], [y, x]] commutes with rotations, m- = [[u, w],
             * [w, -u]] reverses them, so R(al) m R(be)^T = m+ R(al - be) + m- R(-(al + be)) */
            double x = (m00 + m11) / 2, y = (m10 - m01) / 2;
            double u = (m00 - m11) / 2, w = (m01 + m10) / 2;
            double t0 = inv_freq[p], t1 = inv_freq[p2], cr, ci, dr, di;
            tsr__mean_phase(t0 - t1, n_pos, &cr, &ci);
            tsr__mean_phase(-(t0 + t1), n_pos, &dr, &di);
            /* [[x, -y], [y, x]] [[cr, -ci], [ci, cr]] + [[u, w], [w, -u]] [[dr, -di], [di, dr]] */
            c[(size_t)a0 * hd + a1] = x * cr - y * ci + u * dr + w * di;
            c[(size_t)a0 * hd + b1] = -x * ci - y * cr - u * di + w * dr;
            c[(size_t)b0 * hd + a1] = y * cr + x * ci + w * dr - u * di;
            c[(size_t)b0 * hd + b1] = -y * ci + x * cr - w * di - u * dr;
        }
}

double tsr_offload_dot(const float *a, const float *b, size_t n) {
    float acc[8] = {0};
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    for (; k < n; k++) s += (double)a[k] * b[k];
    return s;
}

/* c ([hd][hd]) += sum over `heads` heads of W D W^T, W the head's rows of w from row0, D
 * the squared norm weights g (dim). */
static tsr_status tsr__cov(const tsr_tensor *w, int64_t row0, int heads, int hd,
                           const float *g, double *c) {
    size_t dim = (size_t)w->cols, rows = (size_t)heads * hd;
    if (row0 < 0 || row0 + (int64_t)rows > w->rows)
        return tsr_error_set(TSR_ERR_INVALID, "offload: weight rows %lld..%lld of %lld",
                             (long long)row0, (long long)(row0 + (int64_t)rows),
                             (long long)w->rows);
    float *ws = tsr_malloc(rows * dim * sizeof *ws);
    if (!ws) return TSR_ERR_NOMEM;
    for (size_t r = 0; r < rows; r++) {
        float *d = ws + r * dim;
        tsr_qblocks_row_f32(w, row0 + (int64_t)r, d); /* Q8_0 and 4-bit rows dequantized */
        for (size_t k = 0; k < dim; k++) d[k] *= g[k];
    }
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd; i++)
            for (int j = i; j < hd; j++) {
                const float *x = ws + ((size_t)h * hd + i) * dim, *y = ws + ((size_t)h * hd + j) * dim;
                double s = tsr_offload_dot(x, y, dim);
                c[(size_t)i * hd + j] += s;
                if (j != i) c[(size_t)j * hd + i] += s;
            }
    tsr_free(ws);
    return TSR_OK;
}

tsr_status tsr_offload_skew_head(const tsr_model_config *cfg, const float *inv_freq,
                                 const tsr_tensor *wq, int64_t q_row0, int group,
                                 const tsr_tensor *norm, int cols, float *a) {
    int hd = cfg->head_dim;
    size_t dim = (size_t)wq->cols, hh = (size_t)hd * hd;
    if (hd <= 0 || (hd & 1) || cols < 1 || cols > hd ||
        (size_t)norm->cols * (size_t)norm->rows != dim)
        return tsr_error_set(TSR_ERR_INVALID, "offload: skew of head_dim %d, %d columns", hd,
                             cols);
    float *g = tsr_malloc(dim * sizeof *g);
    double *cq = tsr_calloc(2 * hh + (size_t)hd, sizeof *cq);
    if (!g || !cq) {
        tsr_free(g);
        tsr_free(cq);
        return TSR_ERR_NOMEM;
    }
    double *v = cq + hh, *w = v + hh;
    tsr_dtype_to_f32(norm->dtype, norm->data, g, dim);
    tsr_status st = tsr__cov(wq, q_row0, group, hd, g, cq);
    if (st == TSR_OK) {
        tsr_offload_rope_average(cq, hd, inv_freq, cfg->rope_interleaved, cfg->max_seq_len);
        tsr_offload_eig_sym(cq, hd, w, v);
        /* the columns by their share of the query's energy, largest first (InfiniGen orders
         * them by the query's singular values) */
        for (int r = 0; r < cols; r++) {
            int best = 0;
            for (int c = 1; c < hd; c++)
                if (w[c] > w[best]) best = c;
            for (int i = 0; i < hd; i++) a[(size_t)r * hd + i] = (float)v[(size_t)i * hd + best];
            w[best] = -INFINITY;
        }
    }
    tsr_free(g);
    tsr_free(cq);
    return st;
}

int tsr_offload_skew_cols(const double *m, int hd, const float *k, int32_t nk, size_t kst,
                          int cols, int width, double *scratch, float *a) {
    size_t hh = (size_t)hd * hd;
    double *v = scratch, *c = v + hh, *w = c + hh, *sk = w + hd;
    for (int i = 0; i < hd; i++) /* the eigen-decomposition destroys its input */
        for (int j = 0; j < hd; j++)
            c[(size_t)i * hd + j] = j >= i ? m[(size_t)i * hd + j] : m[(size_t)j * hd + i];
    tsr_offload_eig_sym(c, hd, w, v);
    int sides = width > cols && k && nk > 0 ? 2 : 1;
    for (int e = 0; e < hd; e++) sk[e] = 0.0;
    for (int32_t t = 0; sides == 2 && t < nk; t++) {
        const float *kt = k + (size_t)t * kst;
        for (int e = 0; e < hd; e++) {
            double d = 0.0;
            for (int i = 0; i < hd; i++) d += (double)kt[i] * v[(size_t)i * hd + e];
            sk[e] += fabs(d);
        }
    }
    /* the union, marked in c (free again after the decomposition) */
    for (int e = 0; e < hd; e++) c[e] = 0.0;
    for (int side = 0; side < sides; side++) {
        double *r = side ? sk : w;
        for (int n = 0; n < cols && n < hd; n++) {
            int best = 0;
            for (int e = 1; e < hd; e++)
                if (r[e] > r[best]) best = e;
            c[best] = 1.0;
            r[best] = -INFINITY;
        }
    }
    int n = 0;
    memset(a, 0, (size_t)width * hd * sizeof *a);
    for (int e = 0; e < hd && n < width; e++)
        if (c[e] != 0.0) {
            for (int i = 0; i < hd; i++) a[(size_t)n * hd + i] = (float)v[(size_t)i * hd + e];
            n++;
        }
    return n;
}

void tsr_offload_rope(float *x, int heads, int hd, const float *inv_freq, int interleaved,
                      int32_t pos) {
    int half = hd / 2;
    for (int j = 0; j < half; j++) {
        double ang = (double)pos * (double)inv_freq[j];
        float cs = (float)cos(ang), sn = (float)sin(ang);
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)h * hd;
            int a, b;
            tsr__pair(j, hd, interleaved, &a, &b);
            float va = v[a], vb = v[b];
            v[a] = va * cs - vb * sn;
            v[b] = va * sn + vb * cs;
        }
    }
}

double tsr_offload_alpha_count(const float *logits, int heads, int32_t n, float alpha) {
    double count = 0.0;
    for (int h = 0; h < heads; h++) {
        const float *l = logits + (size_t)h * (size_t)n;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n; j++) mx = l[j] > mx ? l[j] : mx;
        for (int32_t j = 0; j < n; j++) count += l[j] >= mx - alpha;
    }
    return count;
}

int32_t tsr_offload_alpha_fetch(double count, double rows_heads, int32_t cap) {
    double m = rows_heads > 0 ? count / rows_heads : 0.0;
    int32_t f = m >= (double)cap ? cap : (int32_t)lround(m);
    if (f < 1) f = 1;
    return f > cap ? cap : f;
}
