# The CUDA backend as a run-time module: kernels/cuda/* (host code, device code) and the NCCL
# communicator (comm/comm_nccl.c) build into ONE shared module, libtessera-cuda.so, next to
# the tessera binary (installed: lib/tessera/). The binary and tessera_objs link no CUDA,
# cuBLAS or NCCL library; kernels/backend.c dlopens the module only when `--backend cuda` is
# asked for or `auto` finds an NVIDIA driver, and checks its ABI version.
#
# The module's references to the runtime (tsr_error_set, tsr_calloc, tsr_comm_agree, ...)
# stay undefined in it and resolve against the executable that loads it (every executable
# links tessera_core whole and exports its symbols, see CMakeLists.txt), so the process has
# one copy of the runtime's state. The device code (kernels/cuda/*.cu) calls nothing of ours
# (its launchers return cudaError_t, see launch.h).

# sm_80 (A100) and sm_90 (H100/H200). Set before enable_language, else CMake picks the
# compiler's default (sm_75 for CUDA 13, which dropped sm_5x..7x). -DCMAKE_CUDA_ARCHITECTURES
# or the CUDAARCHS environment variable override it ("native" on a GPU machine).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
endif()
# The shared cudart: one process must not hold two runtimes (CMake would add cudart_static
# to CUDA-linked targets), and the module's NCCL and cuBLAS use the shared one too.
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
set_target_properties(tessera_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
# Elementwise ops round like the CPU backend (no fused multiply-add); they are memory-bound.
set_source_files_properties(${CMAKE_SOURCE_DIR}/kernels/cuda/ops.cu PROPERTIES
  COMPILE_OPTIONS --fmad=false)

# The module: the host code of the backend, its entry point (kernels/cuda/module.c) and the
# NCCL communicator. Headers and definitions of the runtime, none of its libraries.
file(GLOB TSR_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.c)
add_library(tessera_cuda_module MODULE ${TSR_CUDA_SOURCES} ${CMAKE_SOURCE_DIR}/comm/comm_nccl.c)
set_target_properties(tessera_cuda_module PROPERTIES
  OUTPUT_NAME tessera-cuda PREFIX lib
  # Next to build/tessera, where kernels/backend.c looks first (and tests/, bench/ one up).
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
  # Installed: the CUDA libraries as the build found them stay on its search path; a
  # site whose CUDA lives elsewhere sets LD_LIBRARY_PATH (docs/build.md).
  INSTALL_RPATH_USE_LINK_PATH ON)
target_include_directories(tessera_cuda_module PRIVATE
  $<TARGET_PROPERTY:tessera_objs,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_definitions(tessera_cuda_module PRIVATE
  $<TARGET_PROPERTY:tessera_objs,INTERFACE_COMPILE_DEFINITIONS> TSR_HAVE_CUDA=1)
target_compile_options(tessera_cuda_module PRIVATE ${TSR_WARN})
# cuBLASLt: the FP8 GEMMs (kernels/cuda/quant_gemm.c); in the module only, like cuBLAS.
target_link_libraries(tessera_cuda_module PRIVATE tessera_cuda CUDA::cudart CUDA::cublas
  CUDA::cublasLt)
if(TESSERA_MPI)
  target_link_libraries(tessera_cuda_module PRIVATE MPI::MPI_C)
endif()
# The executables load it at run time; building any of them builds it (tessera_core is an
# interface library: its dependencies are followed by every target that links it).
add_dependencies(tessera_core tessera_cuda_module)

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
  target_link_libraries(tessera_cuda_module PRIVATE NCCL::NCCL)
  target_compile_definitions(tessera_cuda_module PRIVATE TSR_HAVE_NCCL=1)
  message(STATUS "tessera: NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
else()
  message(STATUS "tessera: NCCL off: the CUDA backend runs on one rank only")
endif()
