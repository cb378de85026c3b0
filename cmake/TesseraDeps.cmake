# Dependencies, all from Debian packages, found the CMake way.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
pkg_check_modules(TSR_OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(TSR_CJSON REQUIRED IMPORTED_TARGET libcjson)
pkg_check_modules(TSR_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(TSR_HWLOC REQUIRED IMPORTED_TARGET hwloc)

add_library(tsr_deps INTERFACE)
target_link_libraries(tsr_deps INTERFACE
  PkgConfig::TSR_OPENBLAS PkgConfig::TSR_CJSON PkgConfig::TSR_PCRE2 PkgConfig::TSR_HWLOC
  OpenMP::OpenMP_C Threads::Threads m)

if(TESSERA_MPI)
  find_package(MPI REQUIRED COMPONENTS C)
  target_link_libraries(tsr_deps INTERFACE MPI::MPI_C)
  target_compile_definitions(tsr_deps INTERFACE TSR_HAVE_MPI=1)
endif()
