/* Unicode NFC (canonical decomposition, canonical ordering, canonical composition), the
 * normalizer Qwen2-family tokenizer.json files declare. */
#ifndef TSR_RUNTIME_TOKENIZER_NFC_H
#define TSR_RUNTIME_TOKENIZER_NFC_H

#include <stddef.h>

#include "base/status.h"

/* NFC of text[0..n) into *out (tsr_malloc'd, the caller frees it), length *out_len.
 * Bytes that are not valid UTF-8 pass through unchanged and block composition across them
 * (Hugging Face tokenizers only ever sees valid UTF-8). */
tsr_status tsr_nfc(const char *text, size_t n, char **out, size_t *out_len);

#endif
