#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

tsr_status tsr_file_read(const char *path, const char *what, size_t max, char **out,
                         size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return tsr_error_set(TSR_ERR_IO, "%s: cannot open %s: %s", path, what,
                                 strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = tsr_malloc(cap);
    tsr_status st = buf ? TSR_OK : TSR_ERR_NOMEM;
    while (st == TSR_OK) {
        if (n + 1 >= cap) {
            if (max && cap > max) {
                st = tsr_error_set(TSR_ERR_FORMAT, "%s: file larger than %zu bytes", path, max);
                break;
            }
            char *nb = tsr_realloc(buf, cap * 2);
            if (!nb) {
                st = TSR_ERR_NOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", path,
                                              strerror(errno));
            break;
        }
    }
    if (!is_stdin) fclose(f);
    if (st == TSR_OK && max && n > max)
        st = tsr_error_set(TSR_ERR_FORMAT, "%s: file larger than %zu bytes", path, max);
    if (st != TSR_OK) {
        tsr_free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return TSR_OK;
}
