# CUDA backend: compiled and linked in CI even without a GPU.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
  set(CMAKE_CUDA_ARCHITECTURES "80;90")
endif()
file(GLOB TSR_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
add_library(tessera_cuda STATIC ${TSR_CUDA_SOURCES} ${TSR_CU_SOURCES})
target_include_directories(tessera_cuda PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_definitions(tessera_cuda PUBLIC _POSIX_C_SOURCE=200809L)
target_compile_options(tessera_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:C>:${TSR_WARN}>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
target_link_libraries(tessera_cuda PUBLIC CUDA::cudart CUDA::cublas)
target_link_libraries(tessera_core PUBLIC tessera_cuda)
target_compile_definitions(tessera_core PUBLIC TSR_HAVE_CUDA=1)
