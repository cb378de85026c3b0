/* Where tessera's run-time modules are found: the shared objects a binary loads only when
 * a run needs them (libtessera-cuda.so for `--backend cuda`, libtessera-hdf5.so for
 * checkpoints), so that a run without them maps none of their libraries. */
#ifndef TSR_BASE_MODULE_H
#define TSR_BASE_MODULE_H

#include <stdbool.h>
#include <stddef.h>

/* The checkpoint module's file (jobs/run/checkpoint.c loads it; tessera --version says
 * where it is). */
#define TSR_MODULE_HDF5_FILE "libtessera-hdf5.so"

/* Looks for the module `file`, in order: $TSR_MODULE_DIR (a site's override), next to the
 * binary (the build tree: build/tessera), ../lib/tessera from it (an installed tree:
 * bin/tessera), and one level up (the build tree's tests/, bench/ and tools/ executables).
 * The first existing file wins: true with its path in path[cap]; false with the
 * directories tried, comma-separated, in looked[lcap] for the error line. */
bool tsr_module_find(const char *file, char *path, size_t cap, char *looked, size_t lcap);

#endif
