/* The full cache's side of a fidelity or needle measurement, kept in a file and reused.
 *
 * `tessera fidelity` and `tessera needle` compare a policy with the full cache on the same
 * inputs; the full cache's logits (fidelity) and answers (needle) do not depend on the
 * policy, so a study that crosses many policies and budgets with one document or haystack
 * computes them once: the first cell writes DIR/KIND-HASH.ref, the others read it and never
 * start the full cache's engine.
 *
 * A reference is named by a key: text lines "name=value" of everything that determines
 * it (the model file, the text's bytes, the lengths, the chunk, the backend and threads,
 * the KV layout, this executable). The file holds the whole key, the payload and a
 * checksum; a load accepts it only when the key is the same text and the checksum holds,
 * so a stale, foreign or damaged file is recomputed, never used. Writes are atomic
 * (a temporary name, fsync, rename): concurrent cells that race write the same bytes. */
#ifndef TSR_RUNTIME_FULLREF_H
#define TSR_RUNTIME_FULLREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tsr_fullref_key {
    char kind[32];   /* "fidelity", "needle": the file name's prefix */
    char text[4096]; /* "name=value\n" lines */
    size_t len;
    bool overflow;   /* a line did not fit: the key is unusable (no reuse) */
} tsr_fullref_key;

void tsr_fullref_key_init(tsr_fullref_key *k, const char *kind);
void tsr_fullref_key_add(tsr_fullref_key *k, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* name=PATH size=N mtime=NS of a file (a model, a tokenizer), or name=synthetic:NAME (such
 * a model is made from its name); fails when a file cannot be stat'ed. */
tsr_status tsr_fullref_key_file(tsr_fullref_key *k, const char *name, const char *path);
/* name=LEN:HASH of bytes (a text, a haystack). */
void tsr_fullref_key_bytes(tsr_fullref_key *k, const char *name, const void *data, size_t n);
/* The executable (/proc/self/exe): a rebuilt tessera computes its references anew. */
void tsr_fullref_key_exe(tsr_fullref_key *k);

/* Why k names no reference (static text for a "nothing kept" line), or NULL when it does. */
const char *tsr_fullref_key_unusable(const tsr_fullref_key *k);

/* FNV-1a, 64 bits, continued from h (start: TSR_FULLREF_HASH0). */
#define TSR_FULLREF_HASH0 0xcbf29ce484222325ull
uint64_t tsr_fullref_hash(uint64_t h, const void *data, size_t n);

/* The reference file's path for key k in dir. */
void tsr_fullref_path(const char *dir, const tsr_fullref_key *k, char *buf, size_t cap);

/* The payload of dir's reference for k: *data (tsr_free) and *len, or *data NULL when there
 * is none, or the file holds another key, is truncated or fails its checksum (a note on
 * stderr says which; the caller recomputes). Fails only on memory. */
tsr_status tsr_fullref_load(const char *dir, const tsr_fullref_key *k, void **data,
                            size_t *len);
/* Writes the payload under k (creating dir); fails with one line on I/O errors. */
tsr_status tsr_fullref_save(const char *dir, const tsr_fullref_key *k, const void *data,
                            size_t len);

#endif
