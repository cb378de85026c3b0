/* Shared by the libFuzzer targets in tests/fuzz: the readers under test take paths, so each
 * input is written to a file in a directory private to the fuzzing process (made once,
 * removed at exit), and two-part inputs are split by a 2-byte length prefix. */
#ifndef TSR_TESTS_FUZZ_UTIL_H
#define TSR_TESTS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char tsr__fuzz_dir_buf[512];

static void tsr__fuzz_rmdir(void) {
    /* Only the fixed names the targets write: no recursive removal of anything else. */
    static const char *names[] = {"input", "config.json", "model.safetensors", "model.bin",
                                  "tokenizer.json", "tokenizer.bin", "ckpt.h5",
                                  "ckpt.h5.tmp"};
    char p[600];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", tsr__fuzz_dir_buf, names[i]);
        unlink(p);
    }
    rmdir(tsr__fuzz_dir_buf);
}

/* The process's scratch directory ($TMPDIR or /tmp). Aborts when it cannot be made: a
 * fuzzer that cannot write its input tests nothing. */
static inline const char *tsr_fuzz_dir(void) {
    if (!tsr__fuzz_dir_buf[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(tsr__fuzz_dir_buf, sizeof tsr__fuzz_dir_buf, "%s/tsr_fuzz.XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(tsr__fuzz_dir_buf)) {
            perror("tsr_fuzz: mkdtemp");
            abort();
        }
        atexit(tsr__fuzz_rmdir);
    }
    return tsr__fuzz_dir_buf;
}

/* Writes data to DIR/name and returns the path (a static buffer, one per name slot). */
static inline const char *tsr_fuzz_write(const char *name, const uint8_t *data, size_t size) {
    static char paths[4][600];
    static int next;
    char *p = paths[next++ & 3];
    snprintf(p, sizeof paths[0], "%s/%s", tsr_fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
        perror(p);
        abort();
    }
    return p;
}

/* Splits an input into two parts: a little-endian uint16 length of the first, the first,
 * then the rest. A length past the end takes everything that is there. */
static inline void tsr_fuzz_split(const uint8_t *data, size_t size, const uint8_t **a,
                                  size_t *alen, const uint8_t **b, size_t *blen) {
    size_t n = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
    size_t off = size >= 2 ? 2 : size;
    if (n > size - off) n = size - off;
    *a = data + off;
    *alen = n;
    *b = data + off + n;
    *blen = size - off - n;
}

/* A heap copy of exactly `size` bytes (no terminator), so that ASan sees any read past the
 * length a parser was given. */
static inline char *tsr_fuzz_copy(const uint8_t *data, size_t size) {
    char *p = malloc(size ? size : 1);
    if (!p) abort();
    if (size) memcpy(p, data, size);
    return p;
}

#endif
