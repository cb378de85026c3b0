/* llama2.c checkpoints (legacy "version 0" export): a 7 x int32 header
 * {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len} followed by f32
 * weights; a negative vocab_size means the classifier is stored separately. The file is
 * mmapped and every tensor is a view into it. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/model/loader.h"

typedef struct tsr__cursor {
    const char *base;
    uint64_t off;
} tsr__cursor;

static tsr_tensor tsr__take(tsr__cursor *c, int64_t rows, int64_t cols) {
    tsr_tensor t = {.dtype = TSR_F32, .rows = rows, .cols = cols, .data = c->base + c->off};
    c->off += (uint64_t)rows * (uint64_t)cols * 4u;
    return t;
}

tsr_status tsr_loader_llama2c(const char *path, tsr_model **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return tsr_error_set(TSR_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    int32_t h[7];
    if (fsize < sizeof h || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: truncated llama2.c checkpoint (%llu bytes, header needs 28)",
                             path, (unsigned long long)fsize);
    }
    tsr_model_config c = {0};
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    c.tied_embeddings = h[5] > 0;
    c.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
    c.max_seq_len = h[6];
    c.rope_interleaved = true;
    c.dtype = TSR_F32;
    c.bos_id = 1;
    c.eos_id = 2;
    c.n_eos_ids = 1;
    c.eos_ids[0] = 2;
    if (c.n_kv_heads <= 0 || c.n_heads <= 0 || c.dim <= 0 || c.dim % c.n_heads != 0) {
        close(fd);
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: invalid llama2.c header (dim %d, heads %d, kv heads %d)", path,
                             c.dim, c.n_heads, c.n_kv_heads);
    }
    tsr_config_defaults(&c);
    tsr_status st = tsr_config_validate(&c, path);
    if (st != TSR_OK) {
        close(fd);
        return st;
    }

    /* Expected size in 64-bit arithmetic; the validated bounds keep it from overflowing. */
    uint64_t d = (uint64_t)c.dim, hd = (uint64_t)c.head_dim, L = (uint64_t)c.n_layers;
    uint64_t qd = (uint64_t)c.n_heads * hd, kvd = (uint64_t)c.n_kv_heads * hd;
    uint64_t hid = (uint64_t)c.hidden_dim, V = (uint64_t)c.vocab_size;
    uint64_t floats = V * d + L * (d + d * qd + 2 * d * kvd + qd * d + d + 3 * d * hid) + d +
                      (uint64_t)c.max_seq_len * hd; /* legacy freq_cis real + imag */
    if (!c.tied_embeddings) floats += V * d;
    uint64_t expect = 28 + 4 * floats;
    if (fsize != expect) {
        close(fd);
        return tsr_error_set(TSR_ERR_FORMAT,
                             "%s: header sizes disagree with the file size: the header "
                             "(dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, "
                             "seq_len %d) needs %llu bytes, the file has %llu",
                             path, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                             c.vocab_size, c.max_seq_len, (unsigned long long)expect,
                             (unsigned long long)fsize);
    }
    void *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return tsr_error_set(TSR_ERR_IO, "%s: mmap failed: %s", path,
                                                strerror(errno));
    tsr_model *m = NULL;
    st = tsr_model_create(path, &c, &m);
    if (st == TSR_OK) st = tsr_model_own_mmap(m, map, fsize);
    if (st != TSR_OK) {
        if (m) tsr_model_destroy(m);
        munmap(map, fsize);
        return st;
    }
    tsr__cursor cur = {.base = map, .off = 28};
    int64_t Li = c.n_layers;
    m->tok_emb = tsr__take(&cur, c.vocab_size, c.dim);
    /* Per-class arrays, each indexed by layer. */
    for (int64_t l = 0; l < Li; l++) m->layers[l].attn_norm = tsr__take(&cur, 1, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].wq = tsr__take(&cur, (int64_t)qd, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].wk = tsr__take(&cur, (int64_t)kvd, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].wv = tsr__take(&cur, (int64_t)kvd, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].wo = tsr__take(&cur, c.dim, (int64_t)qd);
    for (int64_t l = 0; l < Li; l++) m->layers[l].ffn_norm = tsr__take(&cur, 1, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].w_gate = tsr__take(&cur, c.hidden_dim, c.dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].w_down = tsr__take(&cur, c.dim, c.hidden_dim);
    for (int64_t l = 0; l < Li; l++) m->layers[l].w_up = tsr__take(&cur, c.hidden_dim, c.dim);
    m->out_norm = tsr__take(&cur, 1, c.dim);
    (void)tsr__take(&cur, c.max_seq_len, c.head_dim); /* legacy freq_cis, recomputed */
    m->classifier = c.tied_embeddings ? m->tok_emb : tsr__take(&cur, c.vocab_size, c.dim);
    TSR_ASSERT(cur.off == fsize);
    *out = m;
    return TSR_OK;
}
