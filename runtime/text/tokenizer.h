/* Tokenizers behind one interface: llama2.c/SentencePiece-style tokenizer.bin, Hugging Face
 * tokenizer.json (BPE: byte-level or byte-fallback; see tokenizer_bpe.c) and GGUF metadata. */
#ifndef TSR_RUNTIME_TOKENIZER_H
#define TSR_RUNTIME_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tsr_tokenizer tsr_tokenizer;

typedef struct tsr_tokenizer_ops {
    const char *name;
    /* Encodes `len` bytes (any bytes, not only valid UTF-8). The caller owns *ids
     * (tsr_free). bos/eos: prepend/append the model's BOS/EOS when it has them. */
    tsr_status (*encode)(const tsr_tokenizer *t, const char *text, size_t len, bool bos,
                         bool eos, int32_t **ids, size_t *n_ids);
    /* Appends the bytes of token `id` to buf (prev: the previous token, for SentencePiece's
     * leading-space rule; -1 at the start). Returns the number of bytes written, or -1
     * when `cap` is too small. Special tokens decode to their text. */
    int (*decode)(const tsr_tokenizer *t, int32_t prev, int32_t id, char *buf, size_t cap);
    void (*destroy)(tsr_tokenizer *t);
} tsr_tokenizer_ops;

struct tsr_tokenizer {
    const tsr_tokenizer_ops *ops;
    int vocab_size;
    int bos_id; /* -1 when none */
    int eos_id; /* -1 when none */
    int n_eos_ids;
    int eos_ids[8]; /* every id that ends generation (<|eot_id|>, <|end_of_text|>, ...) */
};

/* Loads by extension/content: "*.json" -> BPE, a GGUF file -> its metadata's tokenizer,
 * anything else -> tokenizer.bin. */
tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer **out);
tsr_status tsr_tokenizer_load_spm(const char *path, tsr_tokenizer **out);
tsr_status tsr_tokenizer_load_bpe(const char *path, tsr_tokenizer **out);
/* The tokenizer inside a GGUF file's metadata (gpt2 byte-level BPE, llama SentencePiece). */
tsr_status tsr_tokenizer_load_gguf(const char *path, tsr_tokenizer **out);
/* The `llama` (SentencePiece) tokenizer of an open GGUF file (tokenizer_spm.c). */
struct tsr_gguf;
tsr_status tsr_tokenizer_load_gguf_spm(const struct tsr_gguf *g, tsr_tokenizer **out);

/* Finds a tokenizer next to a model: a GGUF file is its own tokenizer; for a directory
 * DIR/tokenizer.json, then
 * DIR/tokenizer.bin; for a file, tokenizer.bin or tok<vocab>.bin in its folder.
 * Writes the path into buf; TSR_ERR_IO with a clear message when none is found. */
tsr_status tsr_tokenizer_find(const char *model_path, int vocab_size, char *buf, size_t cap);

/* The tokenizer of a model: `path` when given, else the one tsr_tokenizer_find finds next
 * to `model_path`; checks that its ids fit the model's vocabulary. */
tsr_status tsr_tokenizer_for_model(const char *model_path, const char *path, int vocab_size,
                                   tsr_tokenizer **out);

static inline tsr_status tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text,
                                              size_t len, bool bos, bool eos, int32_t **ids,
                                              size_t *n_ids) {
    return t->ops->encode(t, text, len, bos, eos, ids, n_ids);
}
static inline int tsr_tokenizer_decode(const tsr_tokenizer *t, int32_t prev, int32_t id,
                                       char *buf, size_t cap) {
    return t->ops->decode(t, prev, id, buf, cap);
}
bool tsr_tokenizer_is_eos(const tsr_tokenizer *t, int32_t id);
void tsr_tokenizer_destroy(tsr_tokenizer *t);

#endif
