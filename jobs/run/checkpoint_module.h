/* The ABI between jobs/run/checkpoint.c and libtessera-hdf5.so (jobs/run/checkpoint_h5.c):
 * the module's one exported symbol returns this table, which the loader checks against its
 * own build before use (a module of another build is refused by name, never called). */
#ifndef TSR_JOBS_CHECKPOINT_MODULE_H
#define TSR_JOBS_CHECKPOINT_MODULE_H

#include <stdint.h>
#include <stdio.h>

#include "base/module.h"
#include "jobs/run/checkpoint.h"

/* Bump on any change to the table or to the structs it passes. */
#define TSR_CKPT_MODULE_ABI 1u
#define TSR_CKPT_MODULE_FILE TSR_MODULE_HDF5_FILE
#define TSR_CKPT_MODULE_ENTRY "tsr_ckpt_module_entry"

typedef struct tsr_ckpt_module {
    uint32_t abi;
    uint32_t ckpt_size, part_size; /* sizeof(tsr_ckpt), sizeof(tsr_ckpt_part) in the module */
    /* tsr_ckpt_write_part, tsr_ckpt_read_part, tsr_ckpt_inspect (checkpoint.h) */
    tsr_status (*write_part)(const char *path, const tsr_ckpt *c, const tsr_ckpt_part *part);
    tsr_status (*read_part)(const char *path, const tsr_ckpt_part *part, tsr_ckpt *out);
    tsr_status (*inspect)(const char *path, FILE *f);
} tsr_ckpt_module;

typedef const tsr_ckpt_module *(*tsr_ckpt_module_entry_fn)(void);
/* Defined by the module only. */
const tsr_ckpt_module *tsr_ckpt_module_entry(void);

#endif
