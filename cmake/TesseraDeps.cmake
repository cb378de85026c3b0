# Dependencies, all from Debian packages, found the CMake way.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
# OpenBLAS: Debian's OpenMP build (libopenblas-openmp-dev) where it is installed. tessera
# calls single-threaded sgemm from its own OpenMP threads; the default pthread build keeps
# a worker thread spinning in sched_yield beside them even after
# openblas_set_num_threads(1) (18 % of a stories260K prefill run's CPU samples, on the
# core the second kernel thread needs). The OpenMP build runs on libgomp's pool instead.
# Elsewhere: whatever `openblas` pkg-config names.
set(_tsr_blas_omp "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/pkgconfig")
if(EXISTS "${_tsr_blas_omp}/openblas.pc")
  set(ENV{PKG_CONFIG_PATH} "${_tsr_blas_omp}:$ENV{PKG_CONFIG_PATH}")
endif()
pkg_check_modules(TSR_OPENBLAS REQUIRED IMPORTED_TARGET openblas)
message(STATUS "OpenBLAS: ${TSR_OPENBLAS_LINK_LIBRARIES}")
pkg_check_modules(TSR_CJSON REQUIRED IMPORTED_TARGET libcjson)
pkg_check_modules(TSR_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(TSR_HWLOC REQUIRED IMPORTED_TARGET hwloc)

add_library(tsr_deps INTERFACE)
target_link_libraries(tsr_deps INTERFACE
  PkgConfig::TSR_OPENBLAS PkgConfig::TSR_CJSON PkgConfig::TSR_PCRE2 PkgConfig::TSR_HWLOC
  OpenMP::OpenMP_C Threads::Threads m ${CMAKE_DL_LIBS})

if(TESSERA_MPI)
  find_package(MPI REQUIRED COMPONENTS C)
  target_link_libraries(tsr_deps INTERFACE MPI::MPI_C)
  target_compile_definitions(tsr_deps INTERFACE TSR_HAVE_MPI=1)
endif()

# HDF5 (checkpoints of `tessera run`, jobs/run/checkpoint.c): ON when found. Debian ships the
# Open MPI flavour (pkg-config hdf5-openmpi), which also serves a build without MPI (its
# headers carry their mpi.h include path); a serial hdf5 is taken when there is one.
# One pkg-config prefix per candidate: pkg_check_modules caches <prefix>_FOUND, so reusing
# one prefix for alternatives made a second configure skip the lookup that creates the
# imported target (TESSERA_MPI=OFF: "target PkgConfig::TSR_HDF5 was not found").
set(_tsr_hdf5_target "")
if(NOT DEFINED TESSERA_HDF5 OR TESSERA_HDF5)
  set(_tsr_hdf5_mods hdf5-serial hdf5)
  if(TESSERA_MPI)
    list(PREPEND _tsr_hdf5_mods hdf5-openmpi)
  endif()
  foreach(_m IN LISTS _tsr_hdf5_mods)
    string(MAKE_C_IDENTIFIER "TSR_PC_${_m}" _p)
    pkg_check_modules(${_p} QUIET IMPORTED_TARGET ${_m})
    if(${_p}_FOUND)
      set(_tsr_hdf5_target PkgConfig::${_p})
      break()
    endif()
  endforeach()
  if(NOT _tsr_hdf5_target)
    find_package(HDF5 QUIET COMPONENTS C)
  endif()
endif()
if(_tsr_hdf5_target OR HDF5_FOUND)
  set(_tsr_hdf5_default ON)
else()
  set(_tsr_hdf5_default OFF)
endif()
option(TESSERA_HDF5 "HDF5 checkpoints of tessera run (--checkpoint)" ${_tsr_hdf5_default})
# HDF5 is linked into the checkpoint module libtessera-hdf5.so only (CMakeLists.txt), never
# into the binary: tsr_hdf5 carries it to the targets that use its API.
add_library(tsr_hdf5 INTERFACE)
if(TESSERA_HDF5)
  if(_tsr_hdf5_target)
    target_link_libraries(tsr_hdf5 INTERFACE ${_tsr_hdf5_target})
  elseif(HDF5_FOUND)
    target_include_directories(tsr_hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
    target_link_libraries(tsr_hdf5 INTERFACE ${HDF5_C_LIBRARIES} ${HDF5_LIBRARIES})
  else()
    message(FATAL_ERROR "TESSERA_HDF5=ON but no HDF5 was found (apt install libhdf5-dev)")
  endif()
  target_compile_definitions(tsr_deps INTERFACE TSR_HAVE_HDF5=1)
endif()
