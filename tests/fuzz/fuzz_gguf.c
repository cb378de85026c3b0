/* libFuzzer target: GGUF files (runtime/format/gguf.c, gguf_loader.c, the GGUF tokenizer in
 * tokenizer_bpe.c). The parser reads the input in place (an exact-size buffer, so any read
 * past a checked bound faults under ASan); every accepted tensor is read whole and the
 * supported ones are dequantized; then the same bytes as a file go through tsr_model_load and
 * tsr_tokenizer_load, and a loaded tokenizer encodes a fixed text. */
#include "tests/fuzz/fuzz_util.h"

#include "base/alloc.h"
#include "runtime/format/gguf.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_gguf *g = NULL;
    unsigned sum = 0;
    if (tsr_gguf_open_mem(data, size, "input", &g) == TSR_OK) {
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const tsr_gguf_tensor *t = &g->tensors[i];
            for (uint64_t k = 0; k < t->nbytes; k++) sum += t->data[k];
            if (tsr_gguf_type_supported(t->type) && t->numel <= (1 << 20)) {
                float *buf = tsr_malloc((size_t)t->numel * sizeof *buf);
                if (buf && tsr_gguf_dequant(g, t, TSR_F32, buf) != TSR_OK) abort();
                tsr_free(buf);
            }
        }
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const tsr_gguf_kv *kv = &g->kv[i];
            if (kv->type != TSR_GGUF_ARRAY) continue;
            for (uint64_t k = 0; k < kv->n; k++) {
                if (kv->elem == TSR_GGUF_STRING) {
                    const char *s;
                    uint64_t len;
                    tsr_gguf_arr_str(kv, k, &s, &len);
                    for (uint64_t j = 0; j < len; j++) sum += (unsigned char)s[j];
                } else {
                    sum += (unsigned)tsr_gguf_arr_int(kv, k);
                }
            }
        }
        tsr_gguf_close(g);
    }
    if (size < 4 || memcmp(data, "GGUF", 4) != 0) return (int)(sum & 0);
    const char *path = tsr_fuzz_write("input", data, size);
    tsr_model *m = NULL;
    if (tsr_model_load(path, &m) == TSR_OK) tsr_model_destroy(m);
    tsr_tokenizer *tok = NULL;
    if (tsr_tokenizer_load(path, &tok) == TSR_OK) {
        static const char text[] = " the 12 <|im_end|> caf\xc3\xa9 \xff x";
        int32_t *ids = NULL;
        size_t n = 0;
        if (tsr_tokenizer_encode(tok, text, sizeof text - 1, true, true, &ids, &n) == TSR_OK) {
            char buf[1024];
            for (size_t i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= tok->vocab_size) abort();
                (void)tsr_tokenizer_decode(tok, -1, ids[i], buf, sizeof buf);
            }
        }
        tsr_free(ids);
        tsr_tokenizer_destroy(tok);
    }
    return (int)(sum & 0);
}
