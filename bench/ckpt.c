/* tsr_ckpt: how fast a `tessera run --checkpoint` file is written and read back by 1..N
 * ranks, next to the file system's own write bandwidth measured in the same run.
 *
 * Under mpirun every rank holds the KV heads of a tp = N split (all layers), as `--tp N`
 * does; the checkpoint is the real writer's (jobs/run/checkpoint.c: parallel HDF5 over
 * MPI-IO, one collective write per pool, the per-row checksum hashes, fsync and rename by
 * rank 0), of --seqs running requests of --tokens tokens each in --layers layers of
 * --kv-heads heads of --head-dim (f32, with positions and scores, as h2o keeps them).
 * Then every rank reads its part back (a resume on the same layout, checksum verified).
 * The file system's bandwidth: every rank writes bytes/N of plain data to a file of its
 * own with write() and fsync(), all at once. Best of --repeat runs each. Files go to
 * $TMPDIR (else /tmp) and are removed. Prints one JSON line from rank 0. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/sys.h"
#include "bench/bench_args.h"
#include "comm/comm.h"
#include "jobs/run/checkpoint.h"

static void tsr__usage(FILE *f) {
    fprintf(f,
            "usage: [mpirun -n N] tsr_ckpt [--layers L] [--kv-heads H] [--head-dim D]\n"
            "       [--seqs S] [--tokens T] [--repeat R]\n"
            "Writes and reads a tessera run checkpoint of S running requests of T tokens\n"
            "(defaults: 8 layers, 8 KV heads of 128, 8 requests of 512 tokens: 268 MB) with\n"
            "N ranks splitting the KV heads, best of R (default 3), next to the file system's\n"
            "write bandwidth with N writers (write + fsync). Files in $TMPDIR or /tmp.\n"
            "Output: one JSON line {\"bench\":\"ckpt\",\"ranks\":N,\"bytes\":..,\"write_s\":..,\n"
            "\"write_gb_s\":..,\"read_s\":..,\"read_gb_s\":..,\"fs_write_gb_s\":..}.\n");
}

static double tsr__max(tsr_comm *c, double v) {
    int64_t us = (int64_t)(v * 1e6);
    if (tsr_comm_world_size(c) > 1)
        (void)tsr_comm_allreduce_i64(c, TSR_COMM_WORLD, &us, 1, TSR_COMM_MAX);
    return (double)us / 1e6;
}

/* Every rank writes n bytes to its own file, fsyncs it; the slowest rank's seconds. */
static double tsr__fs_write(tsr_comm *c, const char *dir, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/tsr_ckpt_fs.%d.%d", dir, (int)getpid(),
             tsr_comm_world_rank(c));
    size_t chunk = 8u << 20;
    char *buf = tsr_malloc(chunk);
    if (!buf) return -1;
    memset(buf, 0x5a, chunk);
    if (tsr_comm_world_size(c) > 1) (void)tsr_comm_barrier(c, TSR_COMM_WORLD);
    double t0 = tsr_sys_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; fd >= 0 && done < n;) {
        size_t k = n - done < chunk ? n - done : chunk;
        ssize_t w = write(fd, buf, k);
        if (w <= 0) break;
        done += (size_t)w;
    }
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    double s = tsr__max(c, tsr_sys_now() - t0);
    remove(path);
    tsr_free(buf);
    return s;
}

int main(int argc, char **argv) {
    int layers = 8, heads = 8, hd = 128, seqs = 8, tokens = 512, repeat = 3;
    const tsr_bench_opt opts[] = {{"--layers", &layers, 1, 1024}, {"--kv-heads", &heads, 1, 1024},
                                   {"--head-dim", &hd, 1, 4096}, {"--seqs", &seqs, 1, 4096},
                                   {"--tokens", &tokens, 1, 1 << 20},
                                   {"--repeat", &repeat, 1, 100}};
    int prc = tsr_bench_parse("tsr_ckpt", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                              tsr__usage);
    if (prc) return prc == 1 ? 0 : 2;
    tsr_comm *comm = NULL;
    if (tsr_comm_init(NULL, &comm) != TSR_OK) {
        fprintf(stderr, "tsr_ckpt: %s\n", tsr_last_error());
        return 1;
    }
    int rank = tsr_comm_world_rank(comm), world = tsr_comm_world_size(comm);
    if (heads % world) {
        if (rank == 0) fprintf(stderr, "tsr_ckpt: %d ranks do not divide %d KV heads\n", world, heads);
        tsr_comm_destroy(comm);
        return 2;
    }
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    int nh = heads / world, kvd = nh * hd;
    tsr_ckpt_part part = {.comm = world > 1 ? comm : NULL, .layer_begin = 0, .layer_end = layers,
                          .kv_head_begin = rank * nh, .kv_head_end = (rank + 1) * nh,
                          .head_owner = true};
    tsr_ckpt c = {.meta = {.format_version = TSR_CKPT_VERSION, .model = "bench", .dim = heads * hd,
                           .n_layers = layers, .n_heads = heads, .n_kv_heads = heads,
                           .vocab_size = 32000, .dtype = "f32", .policy = "h2o",
                           .policy_options = "bench", .block_size = 16, .tp = world, .pp = 1,
                           .world = world, .max_batch_seqs = seqs, .max_context = tokens + 1,
                           .kv_layers = layers, .kv_dim = heads * hd, .output = "bench.jsonl"}};
    c.reqs = tsr_calloc((size_t)seqs, sizeof *c.reqs);
    uint32_t rng = 1234u + (uint32_t)rank;
    for (int i = 0; i < seqs && c.reqs; i++) {
        tsr_ckpt_req *r = &c.reqs[i];
        int32_t *tok = tsr_malloc(sizeof *tok * (size_t)tokens);
        for (int t = 0; tok && t < tokens; t++) tok[t] = t % 32000;
        r->s = (tsr_sched_saved){.tag = (uint64_t)i, .tokens = tok, .n_tokens = tokens,
                                 .n_prompt = 1, .n_computed = tokens, .max_new_tokens = 1,
                                 .sampling = {.top_p = 1.0f}, .slot = i};
        r->line = i + 1;
        r->text = "";
        r->has_kv = true;
        r->kv = (tsr_kv_seq_state){.len = tokens, .n_layers = layers, .kv_dim = kvd,
                                   .has_scores = 1};
        if (tsr_kv_seq_state_alloc_layers(&r->kv) != TSR_OK) return 1;
        memcpy(r->kv.tokens, tok, sizeof *tok * (size_t)tokens);
        for (int l = 0; l < layers; l++) r->kv.layers[l] = (tsr_kv_seq_layer){.slots = tokens, .dense = 1};
        if (tsr_kv_seq_state_alloc_rows(&r->kv) != TSR_OK) return 1;
        for (int l = 0; l < layers; l++) {
            tsr_kv_seq_layer *L = &r->kv.layers[l];
            for (size_t j = 0; j < (size_t)tokens * (size_t)kvd; j++) {
                L->k[j] = tsr_bench_rand(&rng);
                L->v[j] = tsr_bench_rand(&rng);
            }
            for (int t = 0; t < tokens; t++) {
                L->pos[t] = t;
                L->score[t] = (float)t;
            }
        }
        c.n_reqs = i + 1;
    }
    int64_t bytes = (int64_t)layers * seqs * tokens * ((int64_t)heads * hd * 8 + 8);
    char path[512];
    snprintf(path, sizeof path, "%s/tsr_ckpt_bench.%d.h5", dir, (int)getpid());
    if (world > 1) (void)tsr_comm_bcast(comm, TSR_COMM_WORLD, path, sizeof path, 0);
    double wbest = 1e30, rbest = 1e30, fbest = 1e30;
    int64_t file_bytes = 0;
    tsr_status st = TSR_OK;
    for (int it = 0; it < repeat && st == TSR_OK; it++) {
        if (world > 1) (void)tsr_comm_barrier(comm, TSR_COMM_WORLD);
        double t0 = tsr_sys_now();
        st = tsr_ckpt_write_part(path, &c, &part);
        double w = tsr__max(comm, tsr_sys_now() - t0);
        if (st != TSR_OK) break;
        if (rank == 0) {
            FILE *f = fopen(path, "rb");
            if (f && fseek(f, 0, SEEK_END) == 0) file_bytes = ftell(f);
            if (f) fclose(f);
        }
        tsr_ckpt back;
        t0 = tsr_sys_now();
        st = tsr_ckpt_read_part(path, &part, &back);
        double r = tsr__max(comm, tsr_sys_now() - t0);
        if (st == TSR_OK) tsr_ckpt_free(&back);
        double fs = tsr__fs_write(comm, dir, (size_t)(bytes / world));
        if (w < wbest) wbest = w;
        if (r < rbest) rbest = r;
        if (fs > 0 && fs < fbest) fbest = fs;
    }
    if (rank == 0) {
        remove(path);
        if (st != TSR_OK)
            fprintf(stderr, "tsr_ckpt: %s\n", tsr_last_error());
        else
            printf("{\"bench\":\"ckpt\",\"ranks\":%d,\"bytes\":%lld,\"file_bytes\":%lld,"
                   "\"write_s\":%.3f,\"write_gb_s\":%.2f,\"read_s\":%.3f,\"read_gb_s\":%.2f,"
                   "\"fs_write_s\":%.3f,\"fs_write_gb_s\":%.2f}\n", world, (long long)bytes,
                   (long long)file_bytes, wbest, (double)bytes / wbest / 1e9, rbest,
                   (double)bytes / rbest / 1e9, fbest, (double)bytes / fbest / 1e9);
    }
    for (int i = 0; i < c.n_reqs; i++) {
        tsr_free((void *)c.reqs[i].s.tokens);
        tsr_kv_seq_state_free(&c.reqs[i].kv);
    }
    tsr_free(c.reqs);
    tsr_comm_destroy(comm);
    return st == TSR_OK ? 0 : 1;
}
