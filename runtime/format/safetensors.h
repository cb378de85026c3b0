/* safetensors: a bounds-checked reader (mmap, read-only) and a streaming writer.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "BF16", "shape": [r, c], "data_offsets": [b, e]}, "__metadata__": {...}}
 * then the data region; offsets are relative to its start. The reader checks every offset and
 * size against the file before any tensor is handed out, so a view never reads past the map. */
#ifndef TSR_RUNTIME_SAFETENSORS_H
#define TSR_RUNTIME_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

#define TSR_ST_MAX_DIMS 8

typedef struct tsr_st_tensor {
    char *name;
    char st_dtype[12];   /* the file's spelling ("BF16", "I64", ...) */
    bool supported;      /* dtype is F32/F16/BF16; `dtype` is meaningful only then */
    tsr_dtype dtype;
    int n_dims;
    int64_t shape[TSR_ST_MAX_DIMS];
    int64_t numel;
    const void *data;    /* inside the map */
    size_t nbytes;
} tsr_st_tensor;

typedef struct tsr_st_file {
    char *path;
    void *map; /* the whole file, PROT_READ */
    size_t map_len;
    bool owns_map; /* false once tsr_st_file_take_map moved it elsewhere */
    int n_tensors;
    tsr_st_tensor *tensors;
} tsr_st_file;

/* Maps and validates `path`. Errors name the file (and the tensor, when one is at fault). */
tsr_status tsr_st_open(const char *path, tsr_st_file **out);
/* NULL when absent. */
const tsr_st_tensor *tsr_st_find(const tsr_st_file *f, const char *name);
/* Hands the mapping to the caller (who munmaps map_len bytes at *addr); views stay valid. */
void tsr_st_take_map(tsr_st_file *f, void **addr, size_t *len);
void tsr_st_close(tsr_st_file *f);

/* Safetensors dtype spelling of a tessera dtype ("F32", "F16", "BF16"). */
const char *tsr_st_dtype_name(tsr_dtype t);

/* Writer: the header is written up front from the entry list, then each tensor's bytes are
 * appended in order with tsr_st_writer_write (any number of calls per tensor). */
typedef struct tsr_st_entry {
    const char *name;
    tsr_dtype dtype;
    int n_dims; /* 1 or 2 (any up to TSR_ST_MAX_DIMS) */
    int64_t shape[TSR_ST_MAX_DIMS];
} tsr_st_entry;

typedef struct tsr_st_writer tsr_st_writer;

tsr_status tsr_st_writer_open(const char *path, const tsr_st_entry *entries, int n,
                              tsr_st_writer **out);
tsr_status tsr_st_writer_write(tsr_st_writer *w, const void *data, size_t bytes);
/* Checks that exactly the declared bytes were written, flushes and fsyncs. Frees `w`. */
tsr_status tsr_st_writer_close(tsr_st_writer *w);
/* Abandons the file (removes it). Frees `w`; NULL is fine. */
void tsr_st_writer_abort(tsr_st_writer *w);

/* One-shot: writes n tensors whose data (already in each entry's dtype) is datas[i]. */
tsr_status tsr_st_write_file(const char *path, const tsr_st_entry *entries,
                             const void *const *datas, int n);

#endif
