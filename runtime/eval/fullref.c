/* The full cache's side of a measurement, kept in a file (runtime/eval/fullref.h).
 *
 * File layout: "tessera-fullref 1\n", the key text, "\n", then the payload's length as a
 * decimal line, the payload, and a trailer line "sum=HASH\n" (FNV-1a of key and payload). */
#include "runtime/eval/fullref.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

static const char tsr__magic[] = "tessera-fullref 1\n";

uint64_t tsr_fullref_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void tsr_fullref_key_init(tsr_fullref_key *k, const char *kind) {
    memset(k, 0, sizeof *k);
    snprintf(k->kind, sizeof k->kind, "%s", kind);
}

void tsr_fullref_key_add(tsr_fullref_key *k, const char *name, const char *fmt, ...) {
    if (k->overflow) return;
    int w = snprintf(k->text + k->len, sizeof k->text - k->len, "%s=", name);
    if (w < 0 || (size_t)w >= sizeof k->text - k->len) {
        k->overflow = true;
        return;
    }
    size_t at = k->len + (size_t)w;
    va_list ap;
    va_start(ap, fmt);
    w = vsnprintf(k->text + at, sizeof k->text - at, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w + 1 >= sizeof k->text - at) {
        k->overflow = true;
        return;
    }
    at += (size_t)w;
    /* one line per entry: a value's own newlines would make two keys read alike */
    for (size_t i = k->len; i < at; i++)
        if (k->text[i] == '\n') k->text[i] = ' ';
    k->text[at++] = '\n';
    k->text[at] = '\0';
    k->len = at;
}

tsr_status tsr_fullref_key_file(tsr_fullref_key *k, const char *name, const char *path) {
    if (path && !strncmp(path, "synthetic:", 10)) { /* made from its name alone */
        tsr_fullref_key_add(k, name, "%s", path);
        return TSR_OK;
    }
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot stat: %s", path ? path : "(null)",
                             strerror(errno));
    tsr_fullref_key_add(k, name, "%s size=%lld mtime=%lld.%09ld", path, (long long)sb.st_size,
                        (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
    return TSR_OK;
}

void tsr_fullref_key_bytes(tsr_fullref_key *k, const char *name, const void *data, size_t n) {
    tsr_fullref_key_add(k, name, "%zu:%016" PRIx64, n,
                        tsr_fullref_hash(TSR_FULLREF_HASH0, data, n));
}

const char *tsr_fullref_key_unusable(const tsr_fullref_key *k) {
    return k->overflow ? "the reference's key (with the paths of the model, tokenizer and "
                         "executable) is longer than a key holds"
                       : NULL;
}

void tsr_fullref_key_exe(tsr_fullref_key *k) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        tsr_fullref_key_add(k, "exe", "unknown");
        return;
    }
    exe[n] = '\0';
    if (tsr_fullref_key_file(k, "exe", exe) != TSR_OK) {
        tsr_error_clear();
        tsr_fullref_key_add(k, "exe", "%s", exe);
    }
}

void tsr_fullref_path(const char *dir, const tsr_fullref_key *k, char *buf, size_t cap) {
    uint64_t h = tsr_fullref_hash(TSR_FULLREF_HASH0, k->text, k->len);
    snprintf(buf, cap, "%s/%s-%016" PRIx64 ".ref", dir, k->kind, h);
}

static uint64_t tsr__sum(const tsr_fullref_key *k, const void *data, size_t len) {
    return tsr_fullref_hash(tsr_fullref_hash(TSR_FULLREF_HASH0, k->text, k->len), data, len);
}

tsr_status tsr_fullref_load(const char *dir, const tsr_fullref_key *k, void **data,
                            size_t *len) {
    *data = NULL;
    *len = 0;
    if (k->overflow) return TSR_OK;
    char path[4300];
    tsr_fullref_path(dir, k, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return TSR_OK; /* absent: computed by the caller */
    tsr_status st = TSR_OK;
    const char *why = NULL;
    size_t hl = strlen(tsr__magic) + k->len + 1;
    char *head = tsr_malloc(hl + 1);
    unsigned char *buf = NULL;
    unsigned long long n = 0;
    char line[64];
    if (!head) {
        st = TSR_ERR_NOMEM;
        goto out;
    }
    /* the magic, then exactly this key, then the blank line */
    if (fread(head, 1, hl, f) != hl || memcmp(head, tsr__magic, strlen(tsr__magic)) != 0 ||
        memcmp(head + strlen(tsr__magic), k->text, k->len) != 0 || head[hl - 1] != '\n') {
        why = "it holds another key (or is not a reference)";
        goto out;
    }
    if (!fgets(line, sizeof line, f) || sscanf(line, "%llu", &n) != 1 || n > ((size_t)1 << 40)) {
        why = "its length line is damaged";
        goto out;
    }
    buf = tsr_malloc(n ? (size_t)n : 1);
    if (!buf) {
        st = TSR_ERR_NOMEM;
        goto out;
    }
    uint64_t sum = 0;
    if (fread(buf, 1, (size_t)n, f) != (size_t)n || !fgets(line, sizeof line, f) ||
        sscanf(line, "sum=%" SCNx64, &sum) != 1) {
        why = "it is truncated";
        goto out;
    }
    if (sum != tsr__sum(k, buf, (size_t)n)) {
        why = "its checksum does not hold";
        goto out;
    }
    *data = buf;
    *len = (size_t)n;
    buf = NULL;
out:
    if (why) fprintf(stderr, "tessera: %s: not reused (%s); computing it anew\n", path, why);
    fclose(f);
    tsr_free(head);
    tsr_free(buf);
    return st;
}

tsr_status tsr_fullref_save(const char *dir, const tsr_fullref_key *k, const void *data,
                            size_t len) {
    if (k->overflow) return TSR_OK; /* a key that did not fit names nothing: not kept */
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot create the directory: %s", dir,
                             strerror(errno));
    char path[4300], tmp[4400];
    tsr_fullref_path(dir, k, path, sizeof path);
    /* a name of this process's own: cells that race each write whole files */
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = fputs(tsr__magic, f) >= 0 && fwrite(k->text, 1, k->len, f) == k->len &&
              fputc('\n', f) != EOF && fprintf(f, "%zu\n", len) > 0 &&
              fwrite(data, 1, len, f) == len &&
              fprintf(f, "sum=%016" PRIx64 "\n", tsr__sum(k, data, len)) > 0 && fflush(f) == 0 &&
              fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return tsr_error_set(TSR_ERR_IO, "%s: write error: %s", path, strerror(e));
    }
    return TSR_OK;
}
