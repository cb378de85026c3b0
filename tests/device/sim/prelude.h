// The CUDA features the attention kernels use, simulated on the host: a block at a time,
// each of its threads an OS thread, __syncthreads and every warp-wide operation a barrier
// (tests/device/sim/run.sh says what this checks and what it cannot).
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>
#include <cuda_runtime_api.h>
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n)
#define __launch_bounds__(...)
struct Idx { unsigned x, y, z; };
thread_local Idx threadIdx, blockIdx;
Idx blockDim, gridDim;
std::barrier<> *g_block_bar;
std::barrier<> *g_warp_bar[32];
float g_xf[32][32]; int g_xi[32][32];
unsigned char g_smem[256 * 1024];
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
static inline void __trap() { abort(); }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline int wid() { return threadIdx.x / 32; }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    int w = wid(), l = threadIdx.x % 32; g_xf[w][l] = v; g_warp_bar[w]->arrive_and_wait();
    float r = g_xf[w][l ^ o]; g_warp_bar[w]->arrive_and_wait(); return r; }
static inline int __shfl_xor_sync(unsigned, int v, int o) {
    int w = wid(), l = threadIdx.x % 32; g_xi[w][l] = v; g_warp_bar[w]->arrive_and_wait();
    int r = g_xi[w][l ^ o]; g_warp_bar[w]->arrive_and_wait(); return r; }
static inline int atomicMin(int *p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (v < o && !a.compare_exchange_weak(o, v)) {} return o; }
static inline int atomicMax(int *p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (v > o && !a.compare_exchange_weak(o, v)) {} return o; }
struct bf16 { uint16_t x; };
static inline uint16_t f2bf(float f) { uint32_t u = __float_as_uint(f); if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40; u += 0x7fffu + ((u >> 16) & 1u); return u >> 16; }
static inline float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static inline bf16 __float2bfloat16(float f) { return bf16{f2bf(f)}; }
template <class F> void launch_sim(Idx grid, unsigned threads, F fn) {
    blockDim = {threads, 1, 1}; gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++) for (unsigned y = 0; y < grid.y; y++) for (unsigned x = 0; x < grid.x; x++) {
        std::barrier<> bb(threads); g_block_bar = &bb;
        std::vector<std::unique_ptr<std::barrier<>>> wb;
        for (unsigned w = 0; w < (threads + 31) / 32; w++) { wb.emplace_back(new std::barrier<>(32)); g_warp_bar[w] = wb.back().get(); }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++) ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; fn(); });
        for (auto &t : ts) t.join();
    }
}
