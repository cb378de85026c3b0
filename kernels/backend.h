/* Compute backends behind one vtable (the ggml-backend idea, reduced to what the forward
 * pass needs), found through one registry (tsr_backend_find, below). The CPU backend and
 * the fenced CPU device ("cpu-fenced", the CPU kernels on memory the host may not touch)
 * are built in; the CUDA backend is a module loaded at run time (libtessera-cuda.so, built
 * when TESSERA_CUDA is on), so that the binary links no CUDA library and a CPU run maps
 * none. Row-major throughout.
 *
 * The memory contract (what makes a caller device-correct on every backend):
 * - Backend memory (TSR_MEM_DEVICE): from buffer_alloc. Activations, weights once placed
 *   (tsr_tensor.data of a model handed to the ops), K/V storage, key scores. Host code never
 *   dereferences it: it moves bytes in and out with upload/download/copy/memset and the KV
 *   row ops below. On the CPU backend it happens to be host memory; on cpu-fenced it is
 *   mprotect'ed outside the backend's own calls, so a host read faults in CI.
 * - Host memory (TSR_MEM_HOST, TSR_MEM_PINNED from host_alloc, or any malloc'ed memory):
 *   everything else. The op arguments that are metadata are host memory: the tsr_attn_args
 *   struct, its spans array, span positions (tsr_kv_span.pos), query positions, rope
 *   positions, embed ids, slot lists, the model config. A device backend stages them.
 *   Exception, the step's metadata: rope positions, embed ids and kv_write slots may also
 *   be backend memory (int32 arrays the forward pass uploads once per step from a pinned
 *   buffer, runtime/exec/forward.c), read in stream order with no staging copy; so are
 *   the arrays of attention_paged.
 * - Ordering: ops run in order on the backend's compute stream; the synchronous copies
 *   (stream NULL) return once the bytes are in place, after all work queued before them.
 *   Asynchronous copies run on a stream from stream_create and are ordered against others
 *   with events. */
#ifndef TSR_KERNELS_BACKEND_H
#define TSR_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/model_config.h"
#include "base/status.h"
#include "base/tensor.h"
#include "kernels/kv_dtype.h"

typedef struct tsr_backend tsr_backend;
/* Opaque, backend-owned: a queue of copies (CUDA: a cudaStream_t) and a point in one. */
typedef struct tsr_stream tsr_stream;
typedef struct tsr_event tsr_event;

/* Where a buffer lives. DEVICE: backend memory (buffer_alloc), only ops touch it. PINNED:
 * host memory the device can copy from asynchronously (CUDA: page-locked). HOST: plain
 * host memory. */
typedef enum tsr_mem_kind {
    TSR_MEM_DEVICE = 0,
    TSR_MEM_PINNED = 1,
    TSR_MEM_HOST = 2,
} tsr_mem_kind;

/* K/V storage in backend memory, addressed by slot: slot s's K row is at
 * k + (s / block) * block_stride + (s % block) * row elements, its V row at the same offset
 * from v. Elements are of `dtype` (kernels/kv_dtype.h; 0: f32); for every dtype the offsets
 * are whole rows, a row taking tsr_kv_row_bytes(dtype, row) bytes (tsr_kv_layout_row), so
 * k and v are typed float * but point at the dtype's bytes. The row ops take and give f32
 * rows and convert. The paged cache's blocks (block = its block size, K rows then V rows of a block
 * side by side: v = k + block * row, block_stride = 2 * block * row) and a dense
 * per-sequence cache (block = its capacity) are both this shape. Slot lists are host
 * memory, int32 (the slots of one pool). */
typedef struct tsr_kv_layout {
    float *k, *v;
    int64_t block_stride;
    int32_t block;
    int32_t row;
    int32_t dtype; /* tsr_kv_dtype */
} tsr_kv_layout;

/* The address of the row `elems` elements (a multiple of row) from base. */
static inline float *tsr_kv_rows_at(float *base, int dtype, int32_t row, int64_t elems) {
    if (dtype == TSR_KV_F32) return base + elems;
    return (float *)((char *)base + (size_t)(elems / row) * tsr_kv_row_bytes(dtype, row));
}

/* Slot s's K (v = 0) or V (v = 1) row. */
static inline float *tsr_kv_layout_row(const tsr_kv_layout *lay, int v, int32_t s) {
    return tsr_kv_rows_at(v ? lay->v : lay->k, lay->dtype, lay->row,
                          (int64_t)(s / lay->block) * lay->block_stride +
                              (int64_t)(s % lay->block) * lay->row);
}

/* A run of cached keys/values for one layer: row i of k/v (kv_dim floats, `stride`
 * floats apart) holds the token at position pos ? pos[i] : pos0 + i. k and v are backend
 * memory; pos is host memory. */
typedef struct tsr_kv_span {
    const float *k;
    const float *v;
    const int32_t *pos; /* NULL: contiguous from pos0 */
    int32_t pos0;
    int32_t n;
    int64_t stride;
    /* Element type of k and v (kernels/kv_dtype.h; 0: f32). Other than f32 the rows are
     * whole stored rows of stride = n_kv_heads * head_dim elements, back to back
     * (tsr_kv_row_bytes each), and attention converts them to f32 as it reads. */
    int32_t dtype;
} tsr_kv_span;

/* Attention geometry for one call: n_q query rows of n_heads*head_dim, GQA groups. */
typedef struct tsr_attn_args {
    const float *q;        /* [n_q][n_heads*head_dim], already rotated (backend memory) */
    const int32_t *q_pos;  /* [n_q] position of each query (causal mask: key pos <= q pos;
                            * host memory) */
    int n_q;
    const tsr_kv_span *spans;
    int n_spans;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    float *out;            /* [n_q][n_heads*head_dim] (backend memory) */
    /* Optional: per query head, per key (span order, concatenated) sum over the queries of
     * the softmax probability: [n_heads][total keys]. Added to, never materializing the
     * n_q x n_k matrix. NULL: not wanted. Per query head, not per kv head, so that a
     * consumer can add heads in one global order whatever the tensor-parallel split (a
     * replicated kv head's query group is spread over ranks). Backend memory: the caller
     * zeroes it (memset) and brings it back (download) for the policy. */
    float *key_scores;
    /* Optional (GPT-OSS). sinks: per query head a logit that joins each query's softmax
     * denominator once (exp(sink - m), no value), [n_heads] f32 in backend memory; NULL:
     * none. window > 0: a query at position p sees only keys at positions > p - window,
     * whatever the spans hold (a sliding layer); 0: every key up to p. */
    const float *sinks;
    int window;
} tsr_attn_args;

/* A mixture-of-experts FFN (GPT-OSS) for n rows, routed on the host: route r (of
 * offsets[n_experts]) sends token row rows[r] to expert e for offsets[e] <= r <
 * offsets[e + 1], with weight weights[r]. Each expert reads its weights once for all of
 * its rows. Expert e: gu = W1_e x + b1_e; gate = min(gu[2j], limit), up =
 * clamp(gu[2j + 1], -limit, limit); a_j = (up + 1) * gate * sigmoid(alpha * gate);
 * y = W2_e a + b2_e. out[t] = sum over t's routes in expert order of weight * y (out is
 * overwritten; a row without routes gets 0). x, out and the tensors' data are backend
 * memory; offsets, rows and weights are host memory. */
typedef struct tsr_moe_args {
    const float *x;        /* [n][gate_up->cols] */
    int64_t n;
    const tsr_experts *gate_up; /* n experts of [2 * inter, dim], gate/up rows interleaved */
    const tsr_experts *down;    /* n experts of [dim, inter] */
    const int32_t *offsets;     /* [gate_up->n + 1] */
    const int32_t *rows;
    const float *weights;
    float limit, alpha;
    float *out;            /* [n][down->rows] */
} tsr_moe_args;
/* Attention of a whole batch over one paged KV layout (the op attention_paged), every
 * array of the step's metadata in backend memory, so that a step needs no staging copy
 * and one call serves every sequence (vLLM's paged_attention over a block table). Row r
 * of q belongs to sequence q_seq[r], whose keys are the positions 0 .. n_keys[s] - 1 in
 * table order: key j lies in block tables[s * max_blocks + j / lay.block], row
 * j % lay.block, of lay; causal: key j <= q_pos[r]. No key scores (a policy that reads
 * them takes the per-sequence op). */
typedef struct tsr_attn_paged_args {
    const float *q; /* [n_q][n_heads*head_dim], rotated (backend memory) */
    float *out;     /* [n_q][n_heads*head_dim] (backend memory) */
    int n_q;
    int n_heads, n_kv_heads, head_dim;
    tsr_kv_layout lay;
    const int32_t *q_pos;  /* [n_q] (backend memory) */
    const int32_t *q_seq;  /* [n_q] in [0, n_seqs) (backend memory) */
    const int32_t *n_keys; /* [n_seqs] (backend memory) */
    const int32_t *tables; /* [n_seqs][max_blocks] (backend memory) */
    int n_seqs, max_blocks;
    /* As in tsr_attn_args (GPT-OSS): sinks NULL or [n_heads] (backend memory), window > 0
     * a sliding window by position. A backend whose op predates them refuses non-zero. */
    const float *sinks;
    int window;
} tsr_attn_paged_args;

/* The q/k/v steps between a fused projection and attention in one call (the op qkv_rope):
 * row i of qkv is q | k | v of one token (the product with the layer's wqkv,
 * runtime/model/fuse.h). In order, with the bits of the ops it replaces: the bias added
 * (bias_add), each head's rmsnorm (q_norm / k_norm, Qwen3), q and k rotated at pos[i]
 * (rope), then q to q and k, v to the cache slots (kv_write) or to k and v. qkv is not
 * modified. pos and slots are the step's metadata (host memory, or backend memory as
 * rope's and kv_write's); everything else but cfg and the struct is backend memory. */
typedef struct tsr_qkv_rope_args {
    const float *qkv; /* [n][(n_heads + 2 * n_kv_heads) * head_dim] */
    int64_t n;
    int n_heads, n_kv_heads;
    const tsr_model_config *cfg; /* head_dim, norm_eps, the rope parameters */
    const int32_t *pos;          /* [n] */
    const tsr_tensor *bias;      /* optional: f32 [1, row width] */
    const tsr_tensor *q_norm, *k_norm; /* optional (both or neither): [1, head_dim] */
    float *q;                    /* [n][n_heads * head_dim], rotated */
    /* lay non-NULL: k (rotated) and v go to slot slots[i] of lay; else to k and v,
     * [n][n_kv_heads * head_dim] each */
    const tsr_kv_layout *lay;
    const int32_t *slots;
    float *k, *v;
} tsr_qkv_rope_args;

/* One row's sampling parameters for the op `sample`. r is the uniform in [0, 1) that the
 * request's seeded sampler drew on the host (runtime/exec/sampler.c), so that every backend picks
 * with the same number. */
typedef struct tsr_sample_params {
    float temperature; /* 0: greedy (argmax; r unused) */
    float top_p;       /* 1: off */
    int32_t top_k;     /* 0: off */
    float r;
} tsr_sample_params;

/* What crossed between host and backend memory, and how often the host waited, since the
 * last reset (the op `counters`). The fenced CPU device keeps them, so that a CPU run
 * counts what a step would cost a GPU (tests/unit/test_policy_transfers.c, tsr_stepcount). */
typedef struct tsr_backend_counters {
    int64_t uploads, upload_bytes;     /* upload, kv_scatter */
    int64_t downloads, download_bytes; /* download, kv_gather */
    /* Host waits: synchronize, event_sync, a copy with stream NULL (a device waits for the
     * work queued before it), and sample (its ids come back). */
    int64_t syncs;
    /* Host arrays an op reads besides its data (positions, ids, slot lists, spans, segment
     * bounds, sampling parameters): a device backend stages each with a copy. */
    int64_t host_args, host_arg_bytes;
    int64_t ops; /* compute, KV-row, copy and memset calls */
    /* Of the transfers and host arrays above, those whose host side is pageable memory
     * (not from host_alloc(pinned) or host_register): a GPU stages each through a bounce
     * buffer, synchronously, and a CUDA Graph cannot capture it. */
    int64_t pageable;
    /* Of the transfers above, those queued on a copy stream (stream_create): no host wait,
     * and free to overlap the compute stream's work. */
    int64_t stream_copies;
} tsr_backend_counters;

typedef struct tsr_backend_ops {
    const char *name;
    void (*destroy)(tsr_backend *be);

    /* --- memory (every backend implements every call here) --------------------------- */
    /* Backend memory (TSR_MEM_DEVICE), at least 64-byte aligned, contents undefined. */
    tsr_status (*buffer_alloc)(tsr_backend *be, size_t bytes, void **out);
    void (*buffer_free)(tsr_backend *be, void *ptr);
    /* Host memory for staging: pinned (device copies from it can be asynchronous) or
     * plain. */
    tsr_status (*host_alloc)(tsr_backend *be, size_t bytes, bool pinned, void **out);
    void (*host_free)(tsr_backend *be, void *ptr);
    /* The backend memory free and in all: the device's for a GPU, the fenced arena's for
     * cpu-fenced, the host's available and total memory for the CPU. */
    tsr_status (*memory)(tsr_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Waits for everything queued on the compute stream. */
    tsr_status (*synchronize)(tsr_backend *be);
    /* Host -> backend, backend -> host, and within backend memory. stream NULL: on the
     * compute stream, returning when the bytes are in place; otherwise queued on `stream`
     * (the host buffer must stay valid and, for a fast copy, be pinned). */
    tsr_status (*upload)(tsr_backend *be, void *dst, const void *src, size_t bytes,
                         tsr_stream *stream);
    tsr_status (*download)(tsr_backend *be, void *dst, const void *src, size_t bytes,
                           tsr_stream *stream);
    tsr_status (*copy)(tsr_backend *be, void *dst, const void *src, size_t bytes);
    /* dst[0 .. bytes) = byte, in backend memory. */
    tsr_status (*memset)(tsr_backend *be, void *dst, int byte, size_t bytes);
    /* Copy streams and events. stream_wait: `stream` (NULL: the compute stream) waits for
     * `ev` before its later work; event_sync: the host waits. */
    tsr_status (*stream_create)(tsr_backend *be, tsr_stream **out);
    void (*stream_destroy)(tsr_backend *be, tsr_stream *stream);
    tsr_status (*event_create)(tsr_backend *be, tsr_event **out);
    void (*event_destroy)(tsr_backend *be, tsr_event *ev);
    tsr_status (*event_record)(tsr_backend *be, tsr_event *ev, tsr_stream *stream);
    tsr_status (*stream_wait)(tsr_backend *be, tsr_stream *stream, tsr_event *ev);
    tsr_status (*event_sync)(tsr_backend *be, tsr_event *ev);
    /* Optional (both NULL: the backend times nothing): an event that also takes a time stamp
     * when reached (CUDA: a timing event; waits on it cost a little more, so only
     * measurements use it; destroyed by event_destroy), and the milliseconds from `start`
     * to `end`, both recorded and complete (after an event_sync, or a wait that covers
     * them). */
    tsr_status (*event_create_timed)(tsr_backend *be, tsr_event **out);
    tsr_status (*event_elapsed)(tsr_backend *be, tsr_event *start, tsr_event *end, float *ms);
    /* Optional (NULL: nothing to do): pins / unpins a host buffer made elsewhere (the
     * hwloc-placed host pool) so that copies from it can be asynchronous. */
    tsr_status (*host_register)(tsr_backend *be, void *ptr, size_t bytes);
    void (*host_unregister)(tsr_backend *be, void *ptr);
    /* Optional (NULL: none): the native handle of the compute stream (CUDA: the
     * cudaStream_t), so that NCCL queues its transfers in order with the kernels. */
    void *(*stream_handle)(tsr_backend *be);
    /* Optional (NULL: the backend's name): the device's name for logs and benchmarks
     * ("NVIDIA H200"). */
    const char *(*device_name)(tsr_backend *be);

    /* --- KV rows by slot (vLLM's reshape_and_cache, llama.cpp's cpy_k) ---------------- */
    /* Row i of k and v ([n][row], backend memory: the layer's activations) goes to slot
     * slots[i]. */
    tsr_status (*kv_write)(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                           int64_t n, const float *k, const float *v);
    /* Slot dst[i] gets slot src[i]'s K and V rows, within one store, in order i = 0.. (so a
     * compaction that moves tail rows into holes is one call). */
    tsr_status (*kv_copy)(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *dst,
                          const int32_t *src, int64_t n);
    /* Gather slots to host rows k[i], v[i] ([n][row]; either may be NULL), and scatter
     * host rows into slots; stream as for download/upload. */
    tsr_status (*kv_gather)(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                            int64_t n, float *k, float *v, tsr_stream *stream);
    tsr_status (*kv_scatter)(tsr_backend *be, const tsr_kv_layout *lay, const int32_t *slots,
                             int64_t n, const float *k, const float *v, tsr_stream *stream);

    /* --- compute (pointers are backend memory unless the contract above says host) ---- */
    /* y[n][w.rows] = x[n][w.cols] . w^T */
    tsr_status (*matmul)(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                         float *y);
    /* out[i] = x[i] / rms(x[i]) * w, for n rows of `dim` (out may equal x) */
    tsr_status (*rmsnorm)(tsr_backend *be, const float *x, const tsr_tensor *w, int64_t n,
                          int dim, float eps, float *out);
    /* In-place rotary embedding of n rows of n_heads x head_dim at positions pos[]. */
    tsr_status (*rope)(tsr_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads,
                       const tsr_model_config *cfg);
    /* gate[i] = silu(gate[i]) * up[i] for n elements */
    tsr_status (*swiglu)(tsr_backend *be, float *gate, const float *up, int64_t n);
    /* x[i] += y[i] */
    tsr_status (*add)(tsr_backend *be, float *x, const float *y, int64_t n);
    /* out[i] = emb[ids[i]] (converted to f32) */
    tsr_status (*embed)(tsr_backend *be, const tsr_tensor *emb, const int32_t *ids, int64_t n,
                        float *out);
    tsr_status (*attention)(tsr_backend *be, const tsr_attn_args *a);
    /* Row-parallel products over column segments (tensor parallelism, runtime/exec/parallel.h).
     * Segment p is columns [seg[p], seg[p+1]) of w and of x (x is [n][w.cols]; seg has
     * n_parts + 1 increasing entries within [0, w.cols]); P_p[n][w.rows] = x[:, seg_p] .
     * w[:, seg_p]^T. With `sum`, y[n][w.rows] = ((P_0 + P_1) + P_2) + ... in part order;
     * otherwise y holds the parts, [n_parts][n][w.rows]. Each P_p depends only on the
     * values and the length of its segment and on n, never on where the segment lies in w
     * or on w.rows, so a slice of w gives the same bits for its parts, and summing the
     * parts in order gives the bits of `sum`. Optional: NULL when the backend lacks it. */
    tsr_status (*matmul_parts)(tsr_backend *be, const float *x, int64_t n, const tsr_tensor *w,
                               const int32_t *seg, int n_parts, bool sum, float *y);
    /* Optional (NULL: the caller downloads the logits and samples on the host): ids[i] =
     * the token drawn from row i of logits ([n][vocab], backend memory, overwritten: the
     * op's scratch) with params[i], as runtime/exec/sampler.c draws it (kernels/sample.h: argmax
     * when greedy, else softmax at the temperature, top-k, top-p, then params[i].r picks in
     * the kept mass). params and ids are host memory; only the ids come back, in place
     * when the call returns. The CPU backends give the host sampler's tokens bit for bit; a
     * GPU's parallel sums may round a draw that falls within a few ulps of a boundary the
     * other way. */
    tsr_status (*sample)(tsr_backend *be, float *logits, int64_t n, int vocab,
                         const tsr_sample_params *params, int32_t *ids);
    /* Optional (NULL: the backend counts nothing): *out = the counters since the last
     * reset; reset: start again from zero. */
    void (*counters)(tsr_backend *be, tsr_backend_counters *out, bool reset);
    /* x[i][j] += b[j] for n rows of b.cols (b: an f32 [1, width] vector in backend memory):
     * the q/k/v projection biases of Qwen2. Optional (NULL: the forward pass refuses a
     * model with biases on this backend). */
    tsr_status (*bias_add)(tsr_backend *be, float *x, const tsr_tensor *b, int64_t n);
    /* The experts of a mixture-of-experts layer (tsr_moe_args). Optional (NULL: the forward
     * pass refuses a mixture-of-experts model on this backend). */
    tsr_status (*moe)(tsr_backend *be, const tsr_moe_args *a);
    /* Optional (NULL: matmul_parts with sum, then add): y[n][w.rows] += the ordered sum
     * of matmul_parts, added last (y + (((P_0 + P_1) + P_2) + ...)), the bits of those two
     * calls: the residual add in the product's epilogue, one call instead of two. */
    tsr_status (*matmul_parts_acc)(tsr_backend *be, const float *x, int64_t n,
                                   const tsr_tensor *w, const int32_t *seg, int n_parts,
                                   float *y);
    /* Optional (both NULL: no graphs): a step's device work recorded once and replayed
     * (CUDA Graphs). graph_begin(key): when the work for `key` was recorded, launches it
     * and sets *replayed (the caller then skips those ops and calls no graph_end);
     * otherwise *replayed is false and the ops up to graph_end run as usual, recorded or
     * not (a backend may run a key's first occurrence plainly, so that its scratch sizes
     * settle). The key must change whenever a recorded op would: shapes, buffers, the
     * backend memory its pointers name (the step's metadata keeps the rest in backend
     * memory). Between the two, ops must not wait or copy pageable host memory: a
     * recording backend would fail, and cpu-fenced, which records nothing, fails
     * graph_end when they did (its counters), so CPU runs check the sequence. */
    tsr_status (*graph_begin)(tsr_backend *be, uint64_t key, bool *replayed);
    tsr_status (*graph_end)(tsr_backend *be);
    /* Optional (NULL: the forward pass runs attention per sequence): tsr_attn_paged_args. */
    tsr_status (*attention_paged)(tsr_backend *be, const tsr_attn_paged_args *a);
    /* Optional (NULL: the host bytes are uploaded as they are): tsr_backend_place_tensor for
     * a backend whose kernels want their own layout of some dtype (CUDA: Q8_0 as GGUF
     * blocks, kernels/cuda/quant_gemm.h). Not called on a host-memory backend. */
    tsr_status (*place_tensor)(tsr_backend *be, const tsr_tensor *host, tsr_tensor *dev,
                               bool *copied);
    /* Optional (NULL: the forward pass keeps wq/wk/wv and w_gate/w_up apart, and
     * runtime/model/fuse.h's weights unused): tsr_qkv_rope_args. */
    tsr_status (*qkv_rope)(tsr_backend *be, const tsr_qkv_rope_args *a);
    /* Optional with qkv_rope (both or neither): out[r][j] = silu(gu[r][j]) * gu[r][hidden
     * + j] for n rows of a fused gate/up product ([n][2 * hidden], gate then up); out is
     * [n][hidden] and may not overlap gu. The bits of swiglu on the two halves. */
    tsr_status (*swiglu_fused)(tsr_backend *be, const float *gu, int64_t n, int hidden,
                               float *out);
    /* Optional (NULL: rmsnorm, then matmul): xb = rmsnorm(x) as rmsnorm gives it ([n][dim]),
     * then y = xb . w^T as matmul gives it; one call, so that a backend whose GEMM reads
     * BF16 (CUDA, for BF16 weights) writes the normed rows in BF16 for it too and runs no
     * conversion in between. The CPU backends keep F32 (their BF16 kernels multiply F32
     * inputs). */
    tsr_status (*rmsnorm_matmul)(tsr_backend *be, const float *x, const tsr_tensor *norm,
                                 int64_t n, int dim, float eps, float *xb, const tsr_tensor *w,
                                 float *y);
    /* Optional (NULL: swiglu_fused, then matmul_parts_acc): y += the ordered sum of
     * matmul_parts of swiglu_fused(gu) with w (the bits of those two calls); hb ([n][hidden])
     * is the call's scratch, its contents undefined afterwards. A BF16 GEMM's backend writes
     * the SwiGLU rows in BF16 for it (CUDA). */
    tsr_status (*swiglu_matmul_acc)(tsr_backend *be, const float *gu, int64_t n, int hidden,
                                    float *hb, const tsr_tensor *w, const int32_t *seg,
                                    int n_parts, float *y);
} tsr_backend_ops;

/* Short forms of the memory calls, synchronous (stream NULL). */
tsr_status tsr_backend_copy(tsr_backend *be, void *dst, const void *src, size_t bytes);
tsr_status tsr_backend_upload(tsr_backend *be, void *dst, const void *src, size_t bytes);
tsr_status tsr_backend_download(tsr_backend *be, void *dst, const void *src, size_t bytes);
/* Places a host tensor in backend memory: dev gets host's shape with data in a new buffer
 * (free it with buffer_free). On a backend whose memory is the host's (be->host_memory),
 * dev is host itself and nothing is copied or allocated (*copied false). */
tsr_status tsr_backend_place_tensor(tsr_backend *be, const tsr_tensor *host, tsr_tensor *dev,
                                    bool *copied);

struct tsr_backend {
    const tsr_backend_ops *ops;
    void *ctx;
    int device;   /* GPU index, -1 for the CPU backends */
    int threads;  /* CPU threads used by kernels */
    /* Backend memory is ordinary host memory that the host may use in place (the plain CPU
     * backend). Only for skipping copies that would move bytes to where they already are
     * (weights mapped from the file); never a reason to dereference a backend pointer. */
    bool host_memory;
    /* matmul and matmul_parts take TSR_F8_E4M3 weights (the CUDA backend); elsewhere the
     * engine converts FP8 matrices at load (runtime/model/fp8.h). */
    bool fp8_weights;
    /* moe takes repacked MXFP4 experts (TSR_MXFP4, the CPU's integer kernels); the engine
     * repacks them for a quantized --dtype (runtime/model/quantize.h). */
    bool mxfp4_packed;
    /* matmul, matmul_parts and embed take the repacked GGUF blocks TSR_Q4_0, TSR_Q4_1,
     * TSR_Q4_K, TSR_Q5_K and TSR_Q6_K (the CPU's integer kernels); elsewhere the engine
     * requantizes such matrices to Q8_0 at load (tsr_model_blocks_to_q8). */
    bool gguf_blocks;
};

/* --- the registry -----------------------------------------------------------------------
 * Every backend a --backend option can name, built in or loaded from a module, with what
 * callers ask of it; help texts, messages and the choice of `auto` read this table instead
 * of lists of names. */
enum {
    TSR_BACKEND_CAP_HOST_MEMORY = 1u << 0, /* backend memory is host memory (be->host_memory) */
    TSR_BACKEND_CAP_FENCED = 1u << 1,      /* host code may not touch its memory (faults) */
    TSR_BACKEND_CAP_GPU = 1u << 2,         /* one GPU per rank; activations in device memory,
                                            * so several ranks need NCCL */
    TSR_BACKEND_CAP_MODULE = 1u << 3,      /* lives in a module loaded at run time */
};

typedef struct tsr_backend_info {
    const char *name;    /* the --backend value */
    const char *summary; /* one line for help texts */
    unsigned caps;       /* TSR_BACKEND_CAP_* */
    const char *module;  /* file name of its module (found from the binary's path), or NULL */
} tsr_backend_info;

/* The registered backends, in table order; NULL past the end. */
const tsr_backend_info *tsr_backend_info_at(int i);
/* The entry named `name`; NULL when none ("auto" is no entry: it is a choice among them). */
const tsr_backend_info *tsr_backend_find(const char *name);
/* "auto, cpu, cpu-fenced or cuda": the values of --backend, for help texts and messages. */
const char *tsr_backend_names(void);

/* One device a backend can run on: for a GPU backend one per visible GPU, for the CPU ones
 * the host. */
typedef struct tsr_device_info {
    const char *backend;  /* registry name */
    int index;            /* GPU index; -1 for the host */
    char name[128];       /* "NVIDIA H200", "host" */
    size_t memory_bytes;  /* total memory of the device (the host's for CPU backends) */
} tsr_device_info;
/* The devices of backend `name` into out[0 .. cap), their count in *n. A module backend is
 * loaded to answer; when it cannot run here (module, driver or GPU missing) the error says
 * which with one line, as tsr_backend_create would. */
tsr_status tsr_backend_devices(const char *name, tsr_device_info *out, int cap, int *n);

/* Creates a backend by name: a registry entry or "auto" (a GPU backend when an NVIDIA driver
 * is on the node, its module loads and a GPU answers; else the CPU, saying why at info
 * level, i.e. under --verbose). cpu-fenced's arena is TSR_FENCED_MEMORY bytes (suffixes K,
 * M, G) or, unset, a default documented in kernels/cpu/backend_fenced.c. A GPU backend that
 * cannot run is one line saying why and what to do: its module is not installed, cannot
 * load (CUDA libraries out of reach), is from another build (ABI version), or the node has
 * no NVIDIA driver or no GPU. */
tsr_status tsr_backend_create(const char *name, int threads, tsr_backend **out);
/* The same for one rank of a node: a GPU backend takes GPU local_rank % (visible GPUs), so
 * the ranks of a node spread over its GPUs; a local rank at or past the GPU count is an
 * error unless TSR_GPU_SHARE=1 (kernels/device_choice.h). */
tsr_status tsr_backend_create_local(const char *name, int threads, int local_rank,
                                    tsr_backend **out);
/* GPUs this process sees, and the PCI bus id ("0000:65:00.0") of one, for NUMA placement
 * (returns -1 when unknown). Loads the GPU module only when an NVIDIA driver is on the node;
 * 0 GPUs when it is absent or cannot load. */
int tsr_backend_gpu_count(void);
int tsr_backend_gpu_busid(int device, char *buf, size_t cap);
void tsr_backend_destroy(tsr_backend *be);

tsr_status tsr_backend_cpu_create(int threads, tsr_backend **out);
/* What the CPU backend runs on this CPU (tessera --version): its kernels' ISA after
 * TSR_CPU_ISA's cap ("avx512", "avx2" or "scalar"), the quantized products' variant
 * ("avx512vnni", "avxvnni", "avx2" or "scalar") and the BLAS under prefill's sgemm
 * (OpenBLAS's openblas_get_config(): version, the core it picked). */
typedef struct tsr_backend_cpu_facts {
    const char *isa, *quant, *blas;
} tsr_backend_cpu_facts;
void tsr_backend_cpu_facts_get(tsr_backend_cpu_facts *out);
/* The fenced CPU device with an arena of arena_bytes (0: the default). */
tsr_status tsr_backend_fenced_create(int threads, size_t arena_bytes, tsr_backend **out);

/* --- the module ABI ----------------------------------------------------------------------
 * A backend module exports one function, TSR_BACKEND_MODULE_ENTRY, returning this table. The
 * module is built from the same tree as the binary and shares its structs (tsr_backend_ops,
 * tsr_backend, the comm's internals), so any change to those bumps
 * TSR_BACKEND_MODULE_ABI; the loader refuses a module whose version or struct sizes differ
 * from its own with one line. The module calls back into the runtime (tsr_error_set, ...):
 * the executables export its symbols (CMakeLists.txt). */
#define TSR_BACKEND_MODULE_ABI 4
#define TSR_BACKEND_MODULE_ENTRY "tsr_backend_module_entry"

/* What a GPU probe found. */
typedef enum tsr_gpu_probe {
    TSR_GPU_PRESENT = 0,   /* *count GPUs answer */
    TSR_GPU_NO_DRIVER = 1, /* no usable NVIDIA driver (absent, or older than the runtime) */
    TSR_GPU_NO_DEVICE = 2, /* the driver is there and sees no GPU */
    TSR_GPU_FAILED = 3,    /* the runtime failed otherwise (detail says how) */
} tsr_gpu_probe;

struct tsr_comm_nccl_ops;

typedef struct tsr_backend_module {
    uint32_t abi;        /* TSR_BACKEND_MODULE_ABI of the build that made it */
    uint32_t ops_size;   /* sizeof(tsr_backend_ops), sizeof(tsr_backend) there */
    uint32_t backend_size;
    const char *name;    /* the registry entry it implements ("cuda") */
    /* Counts the GPUs; on anything but TSR_GPU_PRESENT, detail gets the runtime's words. */
    tsr_gpu_probe (*probe)(int *count, char *detail, size_t cap);
    int (*busid)(int device, char *buf, size_t cap);
    tsr_status (*device_info)(int device, char *name, size_t cap, size_t *memory_bytes);
    tsr_status (*create)(int device, tsr_backend **out);
    /* The NCCL data plane (comm/comm_nccl.c), NULL when the module was built without NCCL;
     * the loader hands it to the comm layer (tsr_comm_provide_nccl). */
    const struct tsr_comm_nccl_ops *nccl;
} tsr_backend_module;

typedef const tsr_backend_module *(*tsr_backend_module_entry_fn)(void);

#endif
