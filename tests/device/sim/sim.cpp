// The attention kernels of kernels/cuda (flash_attn.cu, attn_decode.cu) run on the host by
// the simulation of prelude.h and prims.h, against a float64 reference of the same math
// (tests/device/sim/run.sh builds and runs it). The kernels' own code runs, extracted by
// extract.py; the launch sequence of flash_attn.cu's launch<HD> and the decode plan of
// tsr__cuda_decode_plan_for are repeated here (their host code is not extracted).
// Tolerances: flash 2e-2 (BF16 Q, K, V, P), decode 5e-5 (FP32).
#include "prelude.h"
#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/flash_attn.h"
namespace fa {
#include "flash_attn_sim.inc"
}
namespace dec {
#include "attn_decode_sim.inc"
}
static uint64_t rs = 88172645463325252ull;
static float frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 40) & 0xffffff) / 8388608.0f - 1.0f; }
static float rbf(float x) { return bf2f(f2bf(x)); }

struct Case { int n_q, keys, H, KV, hd, n_spans, scattered, window, sinks, scores, bf16; };

static int run_fa(const Case &c) {
    const int hd = c.hd, kvd = c.KV * hd, group = c.H / c.KV;
    std::vector<float> q((size_t)c.n_q * c.H * hd), k((size_t)c.keys * kvd), v(k.size()), sink(c.H);
    std::vector<uint16_t> kh(k.size()), vh(k.size());
    for (auto &x : q) x = 2 * frand();
    for (size_t i = 0; i < k.size(); i++) { k[i] = 2 * frand(); v[i] = frand(); kh[i] = f2bf(k[i]); vh[i] = f2bf(v[i]); }
    for (auto &x : sink) x = 2 * frand();
    std::vector<int32_t> kpos(c.keys), qpos(c.n_q);
    for (int i = 0, p = 0; i < c.keys; i++, p += c.scattered ? 1 + (int)(rs % 2) : 1) { kpos[i] = p; frand(); }
    for (int i = 0; i < c.n_q; i++) qpos[i] = kpos[c.keys - c.n_q + i];
    std::vector<tsr__cuda_span> sp(c.n_spans);
    int per = c.keys / c.n_spans, off = 0;
    for (int s = 0; s < c.n_spans; s++) {
        int n = s == c.n_spans - 1 ? c.keys - off : per;
        sp[s].k = c.bf16 ? (const float *)(kh.data() + (size_t)off * kvd) : k.data() + (size_t)off * kvd;
        sp[s].v = c.bf16 ? (const float *)(vh.data() + (size_t)off * kvd) : v.data() + (size_t)off * kvd;
        sp[s].pos = c.scattered ? kpos.data() + off : nullptr;
        sp[s].stride = kvd; sp[s].key_off = off; sp[s].pos0 = off; sp[s].n = n; sp[s].dtype = c.bf16;
        off += n;
    }
    std::vector<float> out(q.size(), -7.0f), ks((size_t)c.H * c.keys, 0.0f);
    tsr__cuda_attn a = {};
    a.q = q.data(); a.q_pos = qpos.data(); a.n_q = c.n_q; a.spans = sp.data(); a.n_spans = c.n_spans;
    a.n_keys = c.keys; a.n_heads = c.H; a.n_kv_heads = c.KV; a.head_dim = hd; a.scale = 1.0f / sqrtf((float)hd);
    a.out = out.data(); a.key_scores = c.scores ? ks.data() : nullptr;
    using namespace fa;
    Layout l = layout_of(a);
    std::vector<unsigned char> work(l.total + 64);
    unsigned char *w = work.data();
    bf16 *kb = (bf16 *)(w + l.kb), *vb = (bf16 *)(w + l.vb);
    int32_t *kp = (int32_t *)(w + l.kpos), *kmin = (int32_t *)(w + l.kmin), *kmax = (int32_t *)(w + l.kmax);
    int64_t n_tiles = l.n_pad / kBc;
    launch_sim({(unsigned)l.n_pad, 1, 1}, 128, [&] { pack_kernel(a, kb, vb, kp, l.n_pad); });
    launch_sim({(unsigned)((n_tiles + 7) / 8), 1, 1}, 256, [&] { bounds_kernel(kp, n_tiles, kBc, kmin, kmax, INT_MAX); });
    Fwd f = {};
    f.q = a.q; f.q_pos = a.q_pos; f.n_q = a.n_q; f.n_heads = a.n_heads; f.group = group; f.qscale = a.scale * kLog2e;
    f.kb = kb; f.vb = vb; f.kpos = kp; f.kmin = kmin; f.kmax = kmax; f.n_pad = l.n_pad; f.n_tiles = (int)n_tiles;
    f.sinks = c.sinks ? sink.data() : nullptr; f.window = c.window; f.out = a.out;
    f.qb = c.scores ? (bf16 *)(w + l.qb) : nullptr; f.lse = c.scores ? (float *)(w + l.lse) : nullptr; f.q_pad = l.q_pad;
    int64_t rows = (int64_t)c.n_q * group;
    Idx grid = {(unsigned)((rows + kBr - 1) / kBr), (unsigned)c.KV, 1};
    if (hd == 64) launch_sim(grid, kThreads, [&] { fwd_kernel<64>(f); });
    else launch_sim(grid, kThreads, [&] { fwd_kernel<128>(f); });
    if (c.scores) {
        Scores s = {};
        s.qb = f.qb; s.kb = kb; s.lse = f.lse; s.q_pos = a.q_pos; s.kpos = kp; s.kmin = kmin; s.kmax = kmax;
        int32_t *qposp = (int32_t *)(w + l.qpos), *qmin = (int32_t *)(w + l.qmin), *qmax = (int32_t *)(w + l.qmax);
        s.qmin = qmin; s.qmax = qmax; s.n_q = a.n_q; s.n_heads = a.n_heads; s.group = group; s.window = c.window;
        s.n_keys = a.n_keys; s.n_pad = l.n_pad; s.q_pad = l.q_pad; s.key_scores = a.key_scores;
        launch_sim({(unsigned)((l.q_pad + 255) / 256), 1, 1}, 256, [&] { qpos_pad_kernel(a.q_pos, a.n_q, l.q_pad, qposp); });
        int64_t n_qt = l.q_pad / kBq;
        launch_sim({(unsigned)((n_qt + 7) / 8), 1, 1}, 256, [&] { bounds_kernel(qposp, n_qt, kBq, qmin, qmax, INT_MIN); });
        Idx sg = {(unsigned)(l.n_pad / kBk), (unsigned)c.H, 1};
        if (hd == 64) launch_sim(sg, kThreads, [&] { scores_kernel<64>(s); });
        else launch_sim(sg, kThreads, [&] { scores_kernel<128>(s); });
    }
    // reference in double over bf16-rounded q (scaled), k, v
    double worst = 0, worst_ks = 0;
    std::vector<double> rks(ks.size(), 0.0);
    const double sc = 1.0 / sqrt((double)hd);
    for (int i = 0; i < c.n_q; i++) for (int h = 0; h < c.H; h++) {
        int kvh = h / group;
        std::vector<double> s(c.keys); double m = c.sinks ? sink[h] : -INFINITY;
        for (int j = 0; j < c.keys; j++) {
            bool vis = kpos[j] <= qpos[i] && (c.window <= 0 || (int64_t)kpos[j] > (int64_t)qpos[i] - c.window);
            if (!vis) { s[j] = -INFINITY; continue; }
            double d = 0; for (int e = 0; e < hd; e++) d += (double)q[((size_t)i * c.H + h) * hd + e] * rbf(k[(size_t)j * kvd + kvh * hd + e]);
            s[j] = d * sc; m = std::max(m, s[j]);
        }
        double L = c.sinks ? exp(sink[h] - m) : 0;
        for (int j = 0; j < c.keys; j++) if (s[j] > -INFINITY) L += exp(s[j] - m);
        for (int e = 0; e < hd; e++) {
            double o = 0;
            for (int j = 0; j < c.keys; j++) if (s[j] > -INFINITY) o += exp(s[j] - m) * rbf(v[(size_t)j * kvd + kvh * hd + e]);
            o = L > 0 ? o / L : 0;
            worst = std::max(worst, fabs(o - out[((size_t)i * c.H + h) * hd + e]));
        }
        if (L > 0) for (int j = 0; j < c.keys; j++) if (s[j] > -INFINITY) rks[(size_t)h * c.keys + j] += exp(s[j] - m) / L;
    }
    if (c.scores) for (size_t i = 0; i < ks.size(); i++) worst_ks = std::max(worst_ks, fabs(rks[i] - ks[i]) / (1 + fabs(rks[i])));
    bool ok = worst < 2e-2 && worst_ks < 2e-2;
    printf("fa q%d k%d h%d/%d hd%d sp%d scat%d win%d sink%d sc%d bf16%d: out err %.3e ks err %.3e %s\n", c.n_q, c.keys, c.H, c.KV, hd,
           c.n_spans, c.scattered, c.window, c.sinks, c.scores, c.bf16, worst, worst_ks, ok ? "OK" : "FAIL");
    return ok ? 0 : 1;
}

// Rows of `row` elements in the KV dtype's byte format (kv_codec.cuh), from floats.
static std::vector<unsigned char> encode_rows(const std::vector<float> &f, int row, int dtype) {
    const size_t rows = f.size() / row, rb = (size_t)tsr_kv::row_bytes(dtype, row);
    std::vector<unsigned char> out(rows * rb);
    for (size_t r = 0; r < rows; r++) {
        unsigned char *o = out.data() + r * rb;
        const float *x = f.data() + r * row;
        if (dtype == tsr_kv::F32) memcpy(o, x, (size_t)row * 4);
        else if (dtype == tsr_kv::BF16) for (int i = 0; i < row; i++) { uint16_t h = f2bf(x[i]); memcpy(o + 2 * i, &h, 2); }
        else if (dtype == tsr_kv::Q8) {
            for (int b = 0; b < row / 32; b++) {
                float amax = 0; for (int i = 0; i < 32; i++) amax = std::max(amax, fabsf(x[32 * b + i]));
                float d = amax / 127; memcpy(o + 36 * b, &d, 4);
                for (int i = 0; i < 32; i++) o[36 * b + 4 + i] = (unsigned char)(int8_t)lrintf(d > 0 ? x[32 * b + i] / d : 0);
            }
        } else {
            float amax = 0; for (int i = 0; i < row; i++) amax = std::max(amax, fabsf(x[i]));
            float d = amax / 448; memcpy(o, &d, 4);
            for (int i = 0; i < row; i++) o[4 + i] = tsr_kv::f32_to_e4m3(d > 0 ? x[i] / d : 0);
        }
    }
    return out;
}

// The flash prefill over a paged layout (one sequence: pack_paged_kernel), f32 or bf16 KV.
static int run_fa_paged(int n_q, int nk, int H, int KV, int hd, int window, int sinks, int dtype) {
    const int BS = 16, row = KV * hd, group = H / KV, mb = (nk + BS - 1) / BS + 2;
    std::vector<int32_t> tab(mb), qpos(n_q), nkv{nk}, qseq(n_q, 0);
    for (int i = 0; i < mb; i++) tab[i] = (i * 5 + 1) % mb;
    for (int i = 0; i < n_q; i++) qpos[i] = nk - n_q + i;
    std::vector<float> kvf((size_t)mb * 2 * BS * row), q((size_t)n_q * H * hd), out(q.size(), -7.0f), sink(H);
    for (auto &x : kvf) x = frand();
    for (auto &x : q) x = 2 * frand();
    for (auto &x : sink) x = 2 * frand();
    std::vector<unsigned char> kvb = encode_rows(kvf, row, dtype);
    const size_t rbytes = (size_t)tsr_kv::row_bytes(dtype, row);
    for (size_t r = 0; r < kvf.size() / row; r++)
        for (int i = 0; i < row; i++) kvf[r * row + i] = rbf(tsr_kv::load(kvb.data() + r * rbytes, dtype, i));
    tsr__cuda_attn_paged p = {};
    p.q = q.data(); p.out = out.data(); p.n_q = n_q; p.n_heads = H; p.n_kv_heads = KV; p.head_dim = hd; p.scale = 1.0f / sqrtf((float)hd);
    p.lay.k = (float *)kvb.data(); p.lay.v = (float *)(kvb.data() + BS * rbytes); p.lay.block_stride = 2 * BS * row; p.lay.block = BS; p.lay.row = row; p.lay.dtype = dtype;
    p.q_pos = qpos.data(); p.q_seq = qseq.data(); p.n_keys = nkv.data(); p.tables = tab.data(); p.n_seqs = 1; p.max_blocks = mb;
    using namespace fa;
    tsr__cuda_attn a = {};
    a.q = p.q; a.q_pos = p.q_pos; a.n_q = n_q; a.n_keys = (int64_t)mb * BS; a.n_heads = H; a.n_kv_heads = KV; a.head_dim = hd; a.scale = p.scale; a.out = p.out;
    Layout l = layout_of(a);
    std::vector<unsigned char> work(l.total + 64);
    unsigned char *w = work.data();
    bf16 *kb = (bf16 *)(w + l.kb), *vb = (bf16 *)(w + l.vb);
    int32_t *kp = (int32_t *)(w + l.kpos), *kmin = (int32_t *)(w + l.kmin), *kmax = (int32_t *)(w + l.kmax);
    int64_t n_tiles = l.n_pad / kBc;
    launch_sim({(unsigned)l.n_pad, 1, 1}, 128, [&] { pack_paged_kernel(p, kb, vb, kp, l.n_pad); });
    launch_sim({(unsigned)((n_tiles + 7) / 8), 1, 1}, 256, [&] { bounds_kernel(kp, n_tiles, kBc, kmin, kmax, INT_MAX); });
    Fwd f = {};
    f.q = a.q; f.q_pos = a.q_pos; f.n_q = n_q; f.n_heads = H; f.group = group; f.qscale = a.scale * kLog2e;
    f.kb = kb; f.vb = vb; f.kpos = kp; f.kmin = kmin; f.kmax = kmax; f.n_pad = l.n_pad; f.n_tiles = (int)n_tiles;
    f.sinks = sinks ? sink.data() : nullptr; f.window = window; f.out = a.out; f.q_pad = l.q_pad;
    Idx grid = {(unsigned)(((int64_t)n_q * group + kBr - 1) / kBr), (unsigned)KV, 1};
    if (hd == 64) launch_sim(grid, kThreads, [&] { fwd_kernel<64>(f); });
    else launch_sim(grid, kThreads, [&] { fwd_kernel<128>(f); });
    double worst = 0;
    for (int i = 0; i < n_q; i++) for (int h = 0; h < H; h++) {
        int kvh = h / group; double m = sinks ? sink[h] : -INFINITY; std::vector<double> sc(nk, -INFINITY);
        auto rowp = [&](int v, int j) { return &kvf[((size_t)tab[j / BS] * 2 * BS + (v ? BS : 0) + j % BS) * row + kvh * hd]; };
        for (int j = 0; j < nk; j++) {
            if (!(j <= qpos[i] && (window <= 0 || j > qpos[i] - window))) continue;
            double d = 0; for (int e = 0; e < hd; e++) d += (double)q[((size_t)i * H + h) * hd + e] * rowp(0, j)[e];
            sc[j] = d / sqrt((double)hd); m = std::max(m, sc[j]);
        }
        double L = sinks ? exp(sink[h] - m) : 0;
        for (int j = 0; j < nk; j++) if (sc[j] > -INFINITY) L += exp(sc[j] - m);
        for (int e = 0; e < hd; e++) { double o = 0; for (int j = 0; j < nk; j++) if (sc[j] > -INFINITY) o += exp(sc[j] - m) * rowp(1, j)[e]; o = L > 0 ? o / L : 0; worst = std::max(worst, fabs(o - out[((size_t)i * H + h) * hd + e])); }
    }
    bool ok = worst < 2e-2;
    printf("fa paged q%d k%d h%d/%d hd%d win%d sink%d dtype%d: out err %.3e %s\n", n_q, nk, H, KV, hd, window, sinks, dtype, worst, ok ? "OK" : "FAIL");
    return ok ? 0 : 1;
}

struct DCase { int S, H, KV, hd, max_keys, window, sinks, dtype; };

static int run_dec(const DCase &c) {
    const int BS = 16, hd = c.hd, row = c.KV * hd, group = c.H / c.KV;
    int mb = (c.max_keys + BS - 1) / BS, nb = c.S * mb;
    std::vector<int32_t> nk(c.S), tab((size_t)c.S * mb), qpos(c.S), qseq(c.S);
    for (int s = 0; s < c.S; s++) { nk[s] = 1 + (int)(rs % c.max_keys); frand(); qpos[s] = nk[s] - 1; qseq[s] = s; }
    for (int i = 0; i < nb; i++) tab[i] = (i * 7 + 3) % nb; // a permutation when gcd(7, nb) == 1
    std::vector<float> kvf((size_t)nb * 2 * BS * row);
    for (auto &x : kvf) x = frand();
    std::vector<unsigned char> kvb = encode_rows(kvf, row, c.dtype);
    const size_t rbytes = (size_t)tsr_kv::row_bytes(c.dtype, row);
    for (size_t r = 0; r < kvf.size() / row; r++) // the reference reads what is stored
        for (int i = 0; i < row; i++) kvf[r * row + i] = tsr_kv::load(kvb.data() + r * rbytes, c.dtype, i);
    std::vector<float> q((size_t)c.S * c.H * hd), out(q.size(), -7.0f), sink(c.H);
    for (auto &x : q) x = 2 * frand();
    for (auto &x : sink) x = 2 * frand();
    tsr__cuda_attn_paged a = {};
    a.q = q.data(); a.out = out.data(); a.n_q = c.S; a.n_heads = c.H; a.n_kv_heads = c.KV; a.head_dim = hd; a.scale = 1.0f / sqrtf((float)hd);
    unsigned char *base = kvb.data();
    a.lay.k = (float *)base; a.lay.v = (float *)(base + (size_t)BS * rbytes); a.lay.block_stride = 2 * BS * row; a.lay.block = BS; a.lay.row = row; a.lay.dtype = c.dtype;
    a.q_pos = qpos.data(); a.q_seq = qseq.data(); a.n_keys = nk.data(); a.tables = tab.data(); a.n_seqs = c.S; a.max_blocks = mb;
    using namespace dec;
    // the plan as tsr__cuda_decode_plan_for computes it, sm_count 4
    int G = heads_per_block(group);
    int64_t max_keys = (int64_t)mb * BS, bse = (int64_t)c.S * (c.H / G), target = 16;
    int64_t want = bse >= target ? 1 : (target + bse - 1) / bse;
    int64_t part = (max_keys + want - 1) / want; part = (part + 63) / 64 * 64; if (part < kMinPart) part = kMinPart;
    int parts = (int)((max_keys + part - 1) / part);
    std::vector<float> work((size_t)c.S * c.H * parts * (2 + hd));
    Dec d; d.a = a; d.sinks = c.sinks ? sink.data() : nullptr; d.window = c.window; d.part = (int)part; d.parts = parts; d.G = G; d.lpk = lanes_per_key(hd);
    size_t n = (size_t)c.S * c.H * parts; d.pm = work.data(); d.pl = d.pm + n; d.po = d.pl + n;
    Idx grid = {(unsigned)c.S, (unsigned)(c.H / G), (unsigned)parts};
    auto go = [&](auto kern) { launch_sim(grid, kThreads, [&] { kern(d); }); };
    auto by_dt = [&](auto k0, auto k1, auto k2, auto k3) { if (c.dtype == 1) go(k1); else if (c.dtype == 2) go(k2); else if (c.dtype == 3) go(k3); else go(k0); };
    if (G == 8) by_dt(split_kernel<8, 0>, split_kernel<8, 1>, split_kernel<8, 2>, split_kernel<8, 3>);
    else if (G == 4) by_dt(split_kernel<4, 0>, split_kernel<4, 1>, split_kernel<4, 2>, split_kernel<4, 3>);
    else if (G == 2) by_dt(split_kernel<2, 0>, split_kernel<2, 1>, split_kernel<2, 2>, split_kernel<2, 3>);
    else by_dt(split_kernel<1, 0>, split_kernel<1, 1>, split_kernel<1, 2>, split_kernel<1, 3>);
    launch_sim({(unsigned)c.S, (unsigned)c.H, 1}, kThreads, [&] { merge_kernel(d); });
    double worst = 0;
    for (int r = 0; r < c.S; r++) for (int h = 0; h < c.H; h++) {
        int s = qseq[r], kvh = h / group; int lo = c.window > 0 ? std::max(0, qpos[r] - c.window + 1) : 0;
        std::vector<double> sc(nk[s], -INFINITY); double m = c.sinks ? sink[h] : -INFINITY;
        auto rowp = [&](int v, int j) { int64_t at = (int64_t)tab[(size_t)s * mb + j / BS] * a.lay.block_stride + (int64_t)(j % BS) * row + (v ? (int64_t)BS * row : 0); return &kvf[at + kvh * hd]; };
        for (int j = lo; j < nk[s]; j++) { double dd = 0; for (int e = 0; e < hd; e++) dd += (double)q[((size_t)r * c.H + h) * hd + e] * rowp(0, j)[e]; sc[j] = dd / sqrt((double)hd); m = std::max(m, sc[j]); }
        double L = c.sinks ? exp(sink[h] - m) : 0;
        for (int j = lo; j < nk[s]; j++) L += exp(sc[j] - m);
        for (int e = 0; e < hd; e++) { double o = 0; for (int j = lo; j < nk[s]; j++) o += exp(sc[j] - m) * rowp(1, j)[e]; o /= L; worst = std::max(worst, fabs(o - out[((size_t)r * c.H + h) * hd + e])); }
    }
    bool ok = worst < 5e-5;
    printf("dec S%d h%d/%d hd%d keys<=%d win%d sink%d dtype%d parts%d part%d: err %.3e %s\n", c.S, c.H, c.KV, hd, c.max_keys, c.window, c.sinks, c.dtype, parts, (int)part, worst, ok ? "OK" : "FAIL");
    return ok ? 0 : 1;
}

// argv[1]: "fa" or "dec" runs only that half.
int main(int argc, char **argv) {
    int fails = 0;
    const char *only = argc > 1 ? argv[1] : "";
    if (strcmp(only, "dec")) {
        Case cs[] = {
            {70, 70, 4, 1, 64, 1, 0, 0, 0, 1, 0},
            {40, 150, 8, 2, 128, 3, 0, 0, 1, 1, 0},
            {33, 33, 8, 1, 64, 1, 0, 9, 1, 1, 1},
            {50, 201, 4, 1, 128, 2, 1, 40, 0, 1, 1},
            {130, 130, 1, 1, 64, 1, 0, 0, 0, 0, 0},
        };
        for (auto &c : cs) fails += run_fa(c);
        fails += run_fa_paged(90, 150, 8, 2, 128, 0, 1, 1);
        fails += run_fa_paged(40, 77, 4, 1, 64, 30, 0, 3);
    }
    if (strcmp(only, "fa")) {
        DCase ds[] = {
            {1, 8, 1, 128, 700, 0, 0, 1},
            {3, 4, 4, 64, 300, 0, 1, 0},
            {2, 12, 4, 96, 200, 50, 1, 0},
            {2, 8, 2, 128, 500, 0, 0, 2},
            {2, 4, 1, 64, 300, 20, 1, 3},
        };
        for (auto &c : ds) fails += run_dec(c);
    }
    printf("%d failed\n", fails);
    return fails != 0;
}
