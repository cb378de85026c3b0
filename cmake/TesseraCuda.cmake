# CUDA backend (kernels/cuda), compiled and linked in CI even without a GPU.
#
# Layout, chosen so that no static-library cycle exists: the host code kernels/cuda/*.c
# (vtable, cuBLAS, error translation through base/) is compiled into tessera_core
# like every other C file, and the device code kernels/cuda/*.cu goes into tessera_cuda,
# which calls nothing of ours (its launchers return cudaError_t, see launch.h). So the
# graph is tessera_core -> tessera_cuda -> CUDA::cudart, one way.

# sm_80 (A100) and sm_90 (H100/H200). Set before enable_language, else CMake picks the
# compiler's default (sm_75 for CUDA 13, which dropped sm_5x..7x). -DCMAKE_CUDA_ARCHITECTURES
# or the CUDAARCHS environment variable override it ("native" on a GPU machine).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
endif()
# The shared cudart: the C host code links CUDA::cudart, and one process must not hold two
# runtimes (CMake would add cudart_static to CUDA-linked executables).
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
message(STATUS
  "tessera: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")

# nvcc: its own warnings as errors, and the host compiler's C++-valid warning flags.
set(TSR_CUDA_WARN "SHELL:-Werror all-warnings" -Xcompiler=-Wall,-Wextra,-Wshadow,-Wvla)
if(TESSERA_WERROR)
  list(APPEND TSR_CUDA_WARN -Xcompiler=-Werror)
endif()

file(GLOB TSR_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
add_library(tessera_cuda STATIC ${TSR_CU_SOURCES})
target_include_directories(tessera_cuda PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(tessera_cuda PRIVATE ${TSR_CUDA_WARN})
target_link_libraries(tessera_cuda PUBLIC CUDA::cudart)
# Elementwise ops round like the CPU backend (no fused multiply-add); they are memory-bound.
set_source_files_properties(${CMAKE_SOURCE_DIR}/kernels/cuda/ops.cu PROPERTIES
  COMPILE_OPTIONS --fmad=false)

# TSR_CUDA_SOURCES (kernels/cuda/*.c) is globbed by the top-level CMakeLists.txt.
target_sources(tessera_core PRIVATE ${TSR_CUDA_SOURCES})
# tessera_core was created before CUDA was enabled, so its CUDA_ARCHITECTURES is empty,
# which CMake rejects at generate time once the language is on.
set_target_properties(tessera_core PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_RUNTIME_LIBRARY Shared)
target_link_libraries(tessera_core PUBLIC tessera_cuda CUDA::cudart CUDA::cublas)
target_compile_definitions(tessera_core PUBLIC TSR_HAVE_CUDA=1)

# NCCL: the data plane of a multi-rank job on the CUDA backend (comm/comm_nccl.c; activations
# stay in GPU memory, which MPI cannot take). It needs MPI to bootstrap, so it defaults to ON
# exactly when MPI is on, and then it is required: a CUDA + MPI build without it would refuse
# every multi-rank CUDA run, which must not pass CI unnoticed. -DTESSERA_NCCL=OFF opts out
# (such a build runs the CUDA backend on one rank only); -DNCCL_ROOT=<prefix> finds a
# pip-installed copy (site-packages/nvidia/nccl).
include(CMakeDependentOption)
cmake_dependent_option(TESSERA_NCCL "Link NCCL for the multi-rank CUDA data plane" ON
  "TESSERA_MPI" OFF)
if(TESSERA_NCCL)
  find_package(NCCL)
  if(NOT NCCL_FOUND)
    message(FATAL_ERROR "tessera: NCCL not found, and TESSERA_CUDA with TESSERA_MPI needs it "
      "for multi-rank runs on the GPU. Install it (libnccl-dev, the CUDA toolkit's copy, or "
      "pip's nvidia-nccl-cu12 with -DNCCL_ROOT=<prefix>), or configure with "
      "-DTESSERA_NCCL=OFF to build a CUDA backend that runs on one rank only.")
  endif()
  target_link_libraries(tessera_core PUBLIC NCCL::NCCL)
  target_compile_definitions(tessera_core PUBLIC TSR_HAVE_NCCL=1)
  message(STATUS "tessera: NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
else()
  message(STATUS "tessera: NCCL off: the CUDA backend runs on one rank only")
endif()
