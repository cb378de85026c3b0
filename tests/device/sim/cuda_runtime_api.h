/* Stand-in for the CUDA runtime header when the kernels are compiled as host C++ by
 * tests/device/sim (no CUDA toolkit needed): the types kernels/cuda/launch.h and the kernels
 * name, nothing else. */
#ifndef TSR_TESTS_DEVICE_SIM_CUDA_RUNTIME_API_H
#define TSR_TESTS_DEVICE_SIM_CUDA_RUNTIME_API_H

typedef enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1 } cudaError_t;
typedef struct CUstream_st *cudaStream_t;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

#endif
