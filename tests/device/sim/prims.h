// The tensor-core primitives of kernels/cuda/flash_attn.cu emulated by the PTX ISA's fragment
// layouts (mma.m16n8k16 .row.col BF16: lane = 4 g + t; ldmatrix .trans), so that the
// kernel's own fragment arithmetic is what the comparison checks. cp.async is a copy.
uint32_t g_fa[32][32][4], g_fb[32][32][2]; const void *g_addr[32][32];
__device__ __forceinline__ void cp16(void *smem, const void *gmem) { memcpy(smem, gmem, 16); }
__device__ __forceinline__ void cp_commit() {}
template <int N> __device__ __forceinline__ void cp_wait() {}
static inline float lo_bf(uint32_t u) { return bf2f(u & 0xffff); }
static inline float hi_bf(uint32_t u) { return bf2f(u >> 16); }
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    int w = wid(), l = threadIdx.x % 32;
    for (int i = 0; i < 4; i++) g_fa[w][l][i] = a[i];
    g_fb[w][l][0] = b0; g_fb[w][l][1] = b1;
    g_warp_bar[w]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        int g = ln / 4, t = ln % 4;
        uint32_t *fa = g_fa[w][ln];
        A[g][2*t] = lo_bf(fa[0]); A[g][2*t+1] = hi_bf(fa[0]);
        A[g+8][2*t] = lo_bf(fa[1]); A[g+8][2*t+1] = hi_bf(fa[1]);
        A[g][2*t+8] = lo_bf(fa[2]); A[g][2*t+9] = hi_bf(fa[2]);
        A[g+8][2*t+8] = lo_bf(fa[3]); A[g+8][2*t+9] = hi_bf(fa[3]);
        B[2*t][g] = lo_bf(g_fb[w][ln][0]); B[2*t+1][g] = hi_bf(g_fb[w][ln][0]);
        B[2*t+8][g] = lo_bf(g_fb[w][ln][1]); B[2*t+9][g] = hi_bf(g_fb[w][ln][1]);
    }
    int g = l / 4, t = l % 4;
    int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2*t, 2*t+1, 2*t, 2*t+1};
    for (int i = 0; i < 4; i++) { float s = 0; for (int k = 0; k < 16; k++) s += A[rows[i]][k] * B[k][cols[i]]; c[i] += s; }
    g_warp_bar[w]->arrive_and_wait();
}
__device__ __forceinline__ void ldsm_x4(const void *smem, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    int w = wid(), l = threadIdx.x % 32;
    g_addr[w][l] = smem;
    g_warp_bar[w]->arrive_and_wait();
    int g = l / 4, t = l % 4; uint32_t r[4];
    for (int i = 0; i < 4; i++) {
        const uint16_t *row = (const uint16_t *)g_addr[w][8 * i + g];
        r[i] = (uint32_t)row[2 * t] | ((uint32_t)row[2 * t + 1] << 16);
    }
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
    g_warp_bar[w]->arrive_and_wait();
}
__device__ __forceinline__ void ldsm_x4_trans(const void *smem, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    int w = wid(), l = threadIdx.x % 32;
    g_addr[w][l] = smem;
    g_warp_bar[w]->arrive_and_wait();
    int g = l / 4, t = l % 4; uint32_t r[4];
    for (int i = 0; i < 4; i++) {
        const uint16_t *row0 = (const uint16_t *)g_addr[w][8*i + 2*t], *row1 = (const uint16_t *)g_addr[w][8*i + 2*t + 1];
        r[i] = (uint32_t)row0[g] | ((uint32_t)row1[g] << 16);
    }
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
    g_warp_bar[w]->arrive_and_wait();
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
__device__ __forceinline__ uint32_t lds32(const bf16 *p) { uint32_t u; memcpy(&u, p, 4); return u; }
__device__ __forceinline__ float quad_max(float v) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2)); }
__device__ __forceinline__ float quad_sum(float v) { v += __shfl_xor_sync(0xffffffffu, v, 1); return v + __shfl_xor_sync(0xffffffffu, v, 2); }
