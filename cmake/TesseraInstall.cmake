# `cmake --install build --prefix DIR` gives a relocatable tree:
#   DIR/bin/tessera
#   DIR/lib/tessera/libtessera-hdf5.so   (HDF5 builds: checkpoints; found from bin/ at run time)
#   DIR/lib/tessera/libtessera-cuda.so   (CUDA-enabled builds; found from bin/ at run time)
#   DIR/share/tessera/{README.md, docs/, slurm/, studies/, examples/, models/}
# Nothing in it names the prefix: the binary finds its module through /proc/self/exe
# (base/module.c), so the tree can be copied or moved as a whole (docs/build.md).
# lib/tessera, not CMAKE_INSTALL_LIBDIR: the loader looks exactly there, whatever the
# distribution's multiarch directory.
include(GNUInstallDirs)
install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET tessera_hdf5_module)
  install(TARGETS tessera_hdf5_module LIBRARY DESTINATION lib/tessera)
endif()
if(TARGET tessera_cuda_module)
  install(TARGETS tessera_cuda_module LIBRARY DESTINATION lib/tessera)
endif()
set(_tsr_share ${CMAKE_INSTALL_DATADIR}/tessera)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${_tsr_share})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs ${CMAKE_SOURCE_DIR}/studies
  ${CMAKE_SOURCE_DIR}/examples ${CMAKE_SOURCE_DIR}/models DESTINATION ${_tsr_share})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/slurm DESTINATION ${_tsr_share}
  USE_SOURCE_PERMISSIONS)
