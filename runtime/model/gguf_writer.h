/* A GGUF v3 writer (llama.cpp's single-file format, the one runtime/format/gguf.h reads).
 *
 * Use: tsr_gguf_writer_create, then the metadata (tsr_gguf_writer_add_*) and the tensor
 * infos (tsr_gguf_writer_add_tensor) in the order they are to appear, then the tensors'
 * bytes with tsr_gguf_writer_write in the same order (any number of calls per tensor; the
 * writer pads each to the alignment), then tsr_gguf_writer_close. The header is written on
 * the first tsr_gguf_writer_write, so every key and tensor info must be added before it.
 *
 * The file is written as PATH.tmp and renamed to PATH by a successful close (after fsync):
 * PATH is either the complete new file or whatever was there before. Any failure, and
 * tsr_gguf_writer_abort, removes PATH.tmp. Alignment: 32 bytes (GGUF's default; no
 * general.alignment key is written). */
#ifndef TSR_RUNTIME_GGUF_WRITER_H
#define TSR_RUNTIME_GGUF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/format/gguf.h"

typedef struct tsr_gguf_writer tsr_gguf_writer;

tsr_status tsr_gguf_writer_create(const char *path, tsr_gguf_writer **out);

tsr_status tsr_gguf_writer_add_str(tsr_gguf_writer *w, const char *key, const char *value);
tsr_status tsr_gguf_writer_add_u32(tsr_gguf_writer *w, const char *key, uint32_t value);
tsr_status tsr_gguf_writer_add_i32(tsr_gguf_writer *w, const char *key, int32_t value);
tsr_status tsr_gguf_writer_add_f32(tsr_gguf_writer *w, const char *key, float value);
tsr_status tsr_gguf_writer_add_bool(tsr_gguf_writer *w, const char *key, bool value);
/* An array of n fixed-size elements of type elem (not STRING or ARRAY), little-endian
 * values as the machine stores them (tessera builds for little-endian hosts only). */
tsr_status tsr_gguf_writer_add_arr(tsr_gguf_writer *w, const char *key, tsr_gguf_vtype elem,
                                   const void *values, uint64_t n);
/* An array of n strings: strs[i] of lens[i] bytes (need not be NUL-terminated). */
tsr_status tsr_gguf_writer_add_arr_str(tsr_gguf_writer *w, const char *key,
                                       const char *const *strs, const uint64_t *lens,
                                       uint64_t n);
/* A copy of another file's key/value (any type, arrays of strings included). */
tsr_status tsr_gguf_writer_add_kv(tsr_gguf_writer *w, const tsr_gguf_kv *kv);

/* A tensor of ggml type `type` (TSR_GGML_F32, F16, BF16 or Q8_0), ne[0] the contiguous
 * dimension (a [rows, cols] matrix is n_dims 2, ne {cols, rows}). Its byte count follows
 * from the type; Q8_0 needs ne[0] % 32 == 0. */
tsr_status tsr_gguf_writer_add_tensor(tsr_gguf_writer *w, const char *name, uint32_t type,
                                      int n_dims, const int64_t *ne);

/* Appends tensor bytes (see above). */
tsr_status tsr_gguf_writer_write(tsr_gguf_writer *w, const void *data, size_t bytes);

/* Checks that every tensor was written in full, syncs, renames PATH.tmp to PATH and frees
 * the writer (also on failure). */
tsr_status tsr_gguf_writer_close(tsr_gguf_writer *w);
void tsr_gguf_writer_abort(tsr_gguf_writer *w);

#endif
