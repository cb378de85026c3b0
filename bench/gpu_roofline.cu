// The GPU's two ceilings, measured on the machine and in the run that benchmarks tessera
// (tests/device/run.sh), rather than taken from a datasheet:
//   - HBM bandwidth: device-to-device copies of a buffer well past the L2, by cudaMemcpy and
//     by a copy kernel with 16-byte accesses and several loads in flight per thread; bytes
//     counted read + written; best of R timed copies (CUDA events) per method.
//   - BF16 GEMM rate through cuBLAS at the shapes given, with tessera's own call
//     (kernels/cuda/backend_cuda.c, matmul): y[M][rows] = x[M][cols] . w^T as cublasGemmEx
//     (OP_T, OP_N), BF16 inputs, FP32 output, CUBLAS_COMPUTE_32F; best of R per shape.
// Inputs are random (never zeros: a GEMM on zeros runs faster than on data).
//
//   tsr_gpu_roofline [--copy-mib MIB] [--repeat R] [--layer M,dim,q_dim,kv_dim,hidden]
//                    [--gemm MxROWSxCOLS]...
// --layer: the seven GEMMs of one Llama layer's prefill chunk of M tokens (q, k, v, o, gate,
// up, down), each printed, and their sum as gemm_layer: total flops / total best time.
// Output, one line each (key=value): device, copy (per method), hbm_gbs (the better
// method's best), gemm (per shape), gemm_layer. Exit 0, or 1 with one line on stderr.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "gpu_roofline: %s: %s (%s:%d)\n", #call,                    \
                         cudaGetErrorString(e_), __FILE__, __LINE__);                         \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)
#define CB(call)                                                                              \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            std::fprintf(stderr, "gpu_roofline: %s: cuBLAS status %d (%s:%d)\n", #call,      \
                         (int)s_, __FILE__, __LINE__);                                        \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

// 16-byte copy, grid-stride, UNROLL independent loads in flight before the stores.
template <int UNROLL>
__global__ void copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        int4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) dst[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

__device__ unsigned hash32(size_t i, unsigned seed) {
    unsigned x = (unsigned)i * 0x9e3779b1u ^ (unsigned)(i >> 32) ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__global__ void fill_bytes(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(i, seed);
}

// Uniform in [-1, 1) / sqrt(cols), like the synthetic models' matrices.
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, unsigned seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(scale * ((float)(hash32(i, seed) >> 8) * (2.0f / 16777216.0f) -
                                         1.0f));
}

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Gemm {
    long m, rows, cols;
};

static bool parse_gemm(const char *s, Gemm *g) {
    return std::sscanf(s, "%ldx%ldx%ld", &g->m, &g->rows, &g->cols) == 3 && g->m > 0 &&
           g->rows > 0 && g->cols > 0;
}

int main(int argc, char **argv) {
    long copy_mib = 4096;
    int repeat = 20;
    std::vector<Gemm> gemms;
    int layer_first = -1; // index of the --layer GEMMs in gemms
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!v) {
            std::fprintf(stderr, "gpu_roofline: %s needs a value\n", a);
            return 1;
        }
        i++;
        if (!std::strcmp(a, "--copy-mib")) {
            copy_mib = std::atol(v);
        } else if (!std::strcmp(a, "--repeat")) {
            repeat = std::atoi(v);
        } else if (!std::strcmp(a, "--gemm")) {
            Gemm g;
            if (!parse_gemm(v, &g)) {
                std::fprintf(stderr, "gpu_roofline: --gemm %s: expected MxROWSxCOLS\n", v);
                return 1;
            }
            gemms.push_back(g);
        } else if (!std::strcmp(a, "--layer")) {
            long m, d, q, kv, h;
            if (std::sscanf(v, "%ld,%ld,%ld,%ld,%ld", &m, &d, &q, &kv, &h) != 5 || m <= 0 ||
                d <= 0 || q <= 0 || kv <= 0 || h <= 0) {
                std::fprintf(stderr, "gpu_roofline: --layer %s: expected M,dim,q_dim,kv_dim,"
                                     "hidden\n", v);
                return 1;
            }
            layer_first = (int)gemms.size();
            Gemm l[7] = {{m, q, d}, {m, kv, d}, {m, kv, d}, {m, d, q},
                         {m, h, d}, {m, h, d},  {m, d, h}};
            gemms.insert(gemms.end(), l, l + 7);
        } else {
            std::fprintf(stderr, "gpu_roofline: unknown option %s\n", a);
            return 1;
        }
    }
    if (copy_mib <= 0 || repeat <= 0) {
        std::fprintf(stderr, "gpu_roofline: --copy-mib and --repeat must be positive\n");
        return 1;
    }

    int dev = 0, drv = 0, rt = 0;
    CK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    std::printf("device name=\"%s\" cc=%d.%d sms=%d l2_mb=%.0f mem_gib=%.1f driver_api=%d "
                "runtime=%d\n", p.name, p.major, p.minor, p.multiProcessorCount,
                p.l2CacheSize / 1048576.0, p.totalGlobalMem / 1073741824.0, drv, rt);
    std::fflush(stdout);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    Timer t;

    // ---- bandwidth ----
    size_t bytes = (size_t)copy_mib << 20;
    void *src = nullptr, *dst = nullptr;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    fill_bytes<<<4 * p.multiProcessorCount, 256, 0, st>>>((unsigned *)src, bytes / 4, 1u);
    CK(cudaGetLastError());
    CK(cudaMemsetAsync(dst, 0x5a, bytes, st)); // poison: every byte is then written
    double best_gbs = 0;
    for (int method = 0; method < 2; method++) {
        std::vector<double> gbs;
        for (int r = -2; r < repeat; r++) { // two untimed warm-ups
            CK(cudaEventRecord(t.a, st));
            if (method == 0) {
                CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
            } else {
                copy_kernel<4><<<8 * p.multiProcessorCount, 512, 0, st>>>(
                    (const int4 *)src, (int4 *)dst, bytes / 16);
                CK(cudaGetLastError());
            }
            CK(cudaEventRecord(t.b, st));
            CK(cudaEventSynchronize(t.b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, t.a, t.b));
            if (r >= 0) gbs.push_back(2.0 * (double)bytes / (ms * 1e-3) / 1e9);
        }
        // the copy must be right, or its speed means nothing
        int ok = 0;
        CK(cudaMemcpyAsync(&ok, (char *)dst + bytes - 4, 4, cudaMemcpyDeviceToHost, st));
        unsigned want = 0;
        CK(cudaMemcpyAsync(&want, (char *)src + bytes - 4, 4, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if ((unsigned)ok != want) {
            std::fprintf(stderr, "gpu_roofline: the %s copy is wrong\n",
                         method ? "kernel" : "memcpy");
            return 1;
        }
        double best = *std::max_element(gbs.begin(), gbs.end());
        std::printf("copy method=%s bytes=%zu repeat=%d best_gbs=%.1f median_gbs=%.1f\n",
                    method ? "kernel" : "memcpy", bytes, repeat, best, median(gbs));
        best_gbs = std::max(best_gbs, best);
        CK(cudaMemsetAsync(dst, 0x5a, bytes, st));
    }
    std::printf("hbm_gbs=%.1f\n", best_gbs);
    std::fflush(stdout);
    CK(cudaFree(src));
    CK(cudaFree(dst));

    // ---- GEMM ----
    if (gemms.empty()) return 0;
    cublasHandle_t h;
    CB(cublasCreate(&h));
    CB(cublasSetStream(h, st));
    double layer_flops = 0, layer_s = 0;
    for (size_t gi = 0; gi < gemms.size(); gi++) {
        const Gemm &g = gemms[gi];
        size_t nw = (size_t)g.rows * g.cols, nx = (size_t)g.m * g.cols, ny = (size_t)g.m * g.rows;
        __nv_bfloat16 *w = nullptr, *x = nullptr;
        float *y = nullptr;
        CK(cudaMalloc(&w, nw * 2));
        CK(cudaMalloc(&x, nx * 2));
        CK(cudaMalloc(&y, ny * 4));
        fill_bf16<<<4 * p.multiProcessorCount, 256, 0, st>>>(w, nw, 7u + (unsigned)gi,
                                                             1.0f / std::sqrt((float)g.cols));
        fill_bf16<<<4 * p.multiProcessorCount, 256, 0, st>>>(x, nx, 99u + (unsigned)gi, 1.0f);
        CK(cudaGetLastError());
        const float one = 1.0f, zero = 0.0f;
        std::vector<double> secs;
        for (int r = -3; r < repeat; r++) {
            CK(cudaEventRecord(t.a, st));
            CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)g.rows, (int)g.m, (int)g.cols,
                            &one, w, CUDA_R_16BF, (int)g.cols, x, CUDA_R_16BF, (int)g.cols,
                            &zero, y, CUDA_R_32F, (int)g.rows, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
            CK(cudaEventRecord(t.b, st));
            CK(cudaEventSynchronize(t.b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, t.a, t.b));
            if (r >= 0) secs.push_back(ms * 1e-3);
        }
        float y0 = 0;
        CK(cudaMemcpy(&y0, y, 4, cudaMemcpyDeviceToHost));
        if (!(y0 == y0) || y0 == 0.0f) {
            std::fprintf(stderr, "gpu_roofline: GEMM %ldx%ldx%ld gave %g at [0][0]\n", g.m,
                         g.rows, g.cols, (double)y0);
            return 1;
        }
        double flops = 2.0 * g.m * g.rows * g.cols;
        double best = *std::min_element(secs.begin(), secs.end());
        std::printf("gemm m=%ld rows=%ld cols=%ld best_tflops=%.1f median_tflops=%.1f\n", g.m,
                    g.rows, g.cols, flops / best / 1e12, flops / median(secs) / 1e12);
        if (layer_first >= 0 && (int)gi >= layer_first && (int)gi < layer_first + 7) {
            layer_flops += flops;
            layer_s += best;
        }
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    if (layer_s > 0)
        std::printf("gemm_layer tokens=%ld flops=%.6g best_s=%.6g tflops=%.1f\n",
                    gemms[layer_first].m, layer_flops, layer_s, layer_flops / layer_s / 1e12);
    CB(cublasDestroy(h));
    CK(cudaStreamDestroy(st));
    return 0;
}
