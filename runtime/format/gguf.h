/* GGUF files (llama.cpp's single-file model format, versions 2 and 3): header, metadata
 * key/values of every type, tensor infos, and dequantization of the tensor types tessera
 * reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q3_K, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, IQ4_NL) to
 * f32/f16/bf16.
 *
 * The whole file is mmapped read-only and every field is checked against the file size
 * before it is used: counts bound allocations only once they are shown to fit in the
 * remaining bytes, tensor data must lie inside the file at the file's alignment. A bad
 * file gives one error line naming the file and the problem. */
#ifndef TSR_RUNTIME_GGUF_H
#define TSR_RUNTIME_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

/* Metadata value types, as numbered in the file. */
typedef enum tsr_gguf_vtype {
    TSR_GGUF_U8 = 0,
    TSR_GGUF_I8 = 1,
    TSR_GGUF_U16 = 2,
    TSR_GGUF_I16 = 3,
    TSR_GGUF_U32 = 4,
    TSR_GGUF_I32 = 5,
    TSR_GGUF_F32 = 6,
    TSR_GGUF_BOOL = 7,
    TSR_GGUF_STRING = 8,
    TSR_GGUF_ARRAY = 9,
    TSR_GGUF_U64 = 10,
    TSR_GGUF_I64 = 11,
    TSR_GGUF_F64 = 12,
} tsr_gguf_vtype;

/* ggml tensor types tessera knows the layout of (dequantizes the ones listed above). */
enum {
    TSR_GGML_F32 = 0,
    TSR_GGML_F16 = 1,
    TSR_GGML_Q4_0 = 2,
    TSR_GGML_Q4_1 = 3,
    TSR_GGML_Q5_0 = 6,
    TSR_GGML_Q5_1 = 7,
    TSR_GGML_Q8_0 = 8,
    TSR_GGML_Q8_1 = 9,
    TSR_GGML_Q2_K = 10,
    TSR_GGML_Q3_K = 11,
    TSR_GGML_Q4_K = 12,
    TSR_GGML_Q5_K = 13,
    TSR_GGML_Q6_K = 14,
    TSR_GGML_Q8_K = 15,
    TSR_GGML_IQ4_NL = 20,
    TSR_GGML_IQ4_XS = 23,
    TSR_GGML_I8 = 24,
    TSR_GGML_I16 = 25,
    TSR_GGML_I32 = 26,
    TSR_GGML_I64 = 27,
    TSR_GGML_F64 = 28,
    TSR_GGML_BF16 = 30,
};

typedef struct tsr_gguf_kv {
    char *key;             /* NUL-terminated copy */
    tsr_gguf_vtype type;
    tsr_gguf_vtype elem;   /* arrays: element type (never ARRAY: nested arrays are walked
                            * for validation but not exposed) */
    uint64_t n;            /* arrays: element count; scalars: 1 */
    const uint8_t *data;   /* value bytes in the mapping (arrays: first element) */
    uint64_t *str_off;     /* string arrays: offset of element i's length field from data */
    char *str;             /* STRING scalars: NUL-terminated copy */
    uint64_t str_len;
} tsr_gguf_kv;

typedef struct tsr_gguf_tensor {
    char *name;
    int n_dims;
    int64_t ne[4];   /* ne[0] is the contiguous dimension (columns of a matrix) */
    uint32_t type;   /* TSR_GGML_* */
    uint64_t offset; /* from the data section's start */
    uint64_t nbytes;
    int64_t numel;
    const uint8_t *data;
} tsr_gguf_tensor;

typedef struct tsr_gguf {
    char *path;
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv;
    tsr_gguf_kv *kv;
    uint64_t n_tensors;
    tsr_gguf_tensor *tensors;
    const uint8_t *base; /* the mapping, or the caller's memory for tsr_gguf_open_mem */
    size_t size;
    bool mapped;
} tsr_gguf;

/* True when the file starts with the GGUF magic. */
bool tsr_gguf_is_gguf(const char *path);

tsr_status tsr_gguf_open(const char *path, tsr_gguf **out);
/* Parses `size` bytes at `data` (which must outlive the handle); `name` is for messages. */
tsr_status tsr_gguf_open_mem(const void *data, size_t size, const char *name, tsr_gguf **out);
void tsr_gguf_close(tsr_gguf *g);

const tsr_gguf_kv *tsr_gguf_find(const tsr_gguf *g, const char *key);
const tsr_gguf_tensor *tsr_gguf_tensor_find(const tsr_gguf *g, const char *name);

/* Scalar accessors: absent -> *present false (and *out untouched); a value of the wrong
 * kind -> TSR_ERR_FORMAT naming the key. present may be NULL when the key is required. */
tsr_status tsr_gguf_get_int(const tsr_gguf *g, const char *key, int64_t *out, bool *present);
tsr_status tsr_gguf_get_float(const tsr_gguf *g, const char *key, double *out, bool *present);
tsr_status tsr_gguf_get_bool(const tsr_gguf *g, const char *key, bool *out, bool *present);
tsr_status tsr_gguf_get_str(const tsr_gguf *g, const char *key, const char **out,
                            bool *present);

/* Element i of a string array (not NUL-terminated) / of an integer array. */
void tsr_gguf_arr_str(const tsr_gguf_kv *kv, uint64_t i, const char **s, uint64_t *len);
int64_t tsr_gguf_arr_int(const tsr_gguf_kv *kv, uint64_t i);

/* The chat template of a GGUF file (tokenizer.chat_template) and the text of its BOS/EOS
 * tokens (tokenizer.ggml.tokens at bos/eos_token_id), for tsr_chat_template_from_source.
 * Each out-string is tsr_malloc'd (tsr_free), NULL when the file has none. */
tsr_status tsr_gguf_chat_template(const char *path, char **tpl, char **bos, char **eos);

/* Name of a ggml type ("Q4_1"), or "unknown". */
const char *tsr_gguf_type_name(uint32_t type);
/* IQ4_NL's 16 code values (ggml's kvalues_iq4nl): value = d * tsr_iq4nl_values[code]. */
extern const int8_t tsr_iq4nl_values[16];

/* llama.cpp's name of a general.file_type value (its llama_ftype: "Q4_K_M", "Q8_0", ...;
 * the "guessed" bit 1024 ignored), or NULL for one it does not know. */
const char *tsr_gguf_file_type_name(int64_t ftype);

/* Whether tsr_gguf_dequant converts this type. */
bool tsr_gguf_type_supported(uint32_t type);

/* Converts the whole tensor to `dt` (numel elements at dst). */
tsr_status tsr_gguf_dequant(const tsr_gguf *g, const tsr_gguf_tensor *t, tsr_dtype dt,
                            void *dst);

#endif
