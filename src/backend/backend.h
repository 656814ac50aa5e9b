/* backend.h - the compute backend: a table of function pointers over device buffers plus a context
 * pointer. Every tensor op the model, the KV cache and the presses need goes through this table, so
 * the CPU backend (the reference) and the CUDA backend are interchangeable. Every pointer an op
 * takes lives on the backend's device (the CPU backend's device is the host) unless its comment
 * says "host". Activations are fp32; weights are typed (ckv_weight); the KV cache has a dtype.
 * Shapes are row-major. Ops that cannot fail return void; a device backend reports asynchronous
 * failures from sync(), naming the op. This header includes no CUDA header and knows nothing of
 * models, files or communication. */
#ifndef CKV_BACKEND_H
#define CKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct ckv_backend ckv_backend;

/* A weight matrix in HF (out, in) layout: `rows` output features of `cols` inputs, stored as dtype
 * (F32, F16, BF16, or a GGUF block type: each row is cols / block_elems blocks). Row r starts at
 * data + r * row_bytes. 1-D weights (norms, biases) are plain fp32 device arrays, not ckv_weight. */
typedef struct {
    void *data;        /* device */
    ckv_dtype dtype;
    int64_t rows, cols;
    size_t row_bytes;
} ckv_weight;

/* One (sequence, KV head) segment of the KV cache as the device sees it: the head's rows are
 * k/v/pos[0 .. len), sorted by original position; cap rows are reserved. Lives in device memory;
 * the KV cache keeps it in step with its host bookkeeping (kv/kv_cache.h). */
typedef struct {
    void *k;        /* [cap, head_dim] post-RoPE keys, in the batch's dtype */
    void *v;        /* [cap, head_dim] values */
    int32_t *pos;   /* [cap] original token position of each row */
    int32_t len;    /* rows in use */
    int32_t cap;    /* rows reserved */
} ckv_kv_seg;

/* A batch of token rows over the KV segments of one layer of n_seq sequences. Token t of the batch
 * belongs to sequence seq_of[t]; the tokens of sequence s are the contiguous rows
 * seq_start[s] .. seq_start[s + 1] - 1, in position order. Query head h of a token reads KV head
 * h / (n_heads / n_kv_heads) of its sequence. With one sequence (n_seq = 1) seq_of and seq_start
 * may be NULL: every token belongs to it. All arrays are device memory. */
typedef struct {
    ckv_dtype dtype;           /* of every segment's k and v: F32, F16 or BF16 */
    int head_dim;
    int n_kv_heads;            /* KV heads of each sequence held by this rank */
    int n_seq;
    ckv_kv_seg *const *segs;   /* [n_seq] device array; segs[s] -> [n_kv_heads] segments (device) */
    const int32_t *seq_of;     /* [n tokens] sequence of each token, or NULL (one sequence) */
    const int32_t *seq_start;  /* [n_seq + 1] first token row of each sequence, or NULL */
    int max_len;               /* host-known bound on every segment's len after the op (launch sizing) */
} ckv_kv_batch;

typedef struct {
    /* lifetime */
    void (*free)(ckv_backend *be);
    /* memory: device buffers and host<->device copies (the CPU backend's device is the host) */
    ckv_status (*alloc)(ckv_backend *be, void **ptr, size_t bytes, const char *what);
    void (*release)(ckv_backend *be, void *ptr); /* NULL is fine */
    ckv_status (*upload)(ckv_backend *be, void *dst_dev, const void *src_host, size_t bytes);
    ckv_status (*download)(ckv_backend *be, void *dst_host, const void *src_dev, size_t bytes);
    ckv_status (*copy)(ckv_backend *be, void *dst_dev, const void *src_dev, size_t bytes);
    ckv_status (*sync)(ckv_backend *be);
    /* 1 when matmul and embedding compute weights stored as `t` directly. */
    int (*weight_dtype_ok)(const ckv_backend *be, ckv_dtype t);
    /* 1 when the KV cache may be stored as `t` (F32, F16, BF16). */
    int (*kv_dtype_ok)(const ckv_backend *be, ckv_dtype t);

    /* out[i, :] = table[ids[i], :] in fp32      out [n, table->cols], ids [n] */
    void (*embedding)(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n);
    /* out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w   x, out [n, dim] (out may be x), w [dim] */
    void (*rmsnorm)(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
    /* out = x @ w^T (+ bias), fp32 accumulation   x [n, w->cols], bias [w->rows] or NULL,
     * out [n, w->rows] */
    void (*matmul)(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n);
    /* In-place rotary embedding, HF "rotate_half" layout: for pair i < hd/2 of each head,
     * angle = (float)pos[t] * inv_freq[i]; (x[i], x[i + hd/2]) rotated by angle, both scaled by
     * attn_scale (1 unless YaRN).   x [n, n_heads, hd], pos [n], inv_freq [hd/2] */
    void (*rope)(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                 float attn_scale);
    /* Appends the batch's n tokens: token t (sequence s = seq_of[t], i = t - seq_start[s]) goes to
     * row segs[s][g].len + i of every KV head g (k[t, g, :], v[t, g, :] converted to the batch's
     * dtype, pos[t]); then every segment's len grows by its sequence's token count. The caller has
     * checked the capacities.   k, v [n, n_kv_heads, head_dim] fp32, pos [n] */
    void (*kv_store)(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos,
                     int n);
    /* Causal attention of the batch's n query tokens: query head h of token t reads KV head
     * h / (n_heads / n_kv_heads) of its sequence and sees the rows whose pos <= qpos[t];
     * softmax(q.k * scale) v computed in fp32; a row that sees nothing is 0.
     * out, q [n, n_heads, head_dim], qpos [n] */
    void (*attention)(ckv_backend *be, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                      int n_heads, float scale);
    /* out[i] = silu(gate[i]) * up[i]   [n] (out may alias gate) */
    void (*swiglu)(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* x[i] += y[i]   [n] */
    void (*add)(ckv_backend *be, float *x, const float *y, size_t n);
    /* *n_bad (host) = number of non-finite values in x [n]; synchronises. */
    ckv_status (*count_nonfinite)(ckv_backend *be, const float *x, size_t n, size_t *n_bad);
    /* Compacts every segment of one sequence in one call: segment g of `dst` receives rows
     * keep[g * stride + i], i < n_keep[g] (ascending row indices into segment g of `src`), of k, v
     * and pos; dst[g].len = n_keep[g]. Source and destination segments do not overlap.
     * src, dst [n_kv] segments (device), keep [n_kv, stride], n_keep [n_kv] (device) */
    void (*kv_gather)(ckv_backend *be, ckv_dtype dtype, int head_dim, int n_kv, ckv_kv_seg *dst,
                      const ckv_kv_seg *src, const int32_t *keep, int stride, const int32_t *n_keep);

    /* ---- eviction ops (evict/ drives them; see evict/ for their callers) ---- */

    /* ---- sampling on the device (CPU reference: cpu/cpu_sample.c) ----
     * out[r] = the next token of logits row r, chosen as engine/sampler.c chooses it:
     * temperature 0: argmax (lowest index on ties); else p = softmax(logits / temperature) (fp32
     * exp, sum in double), candidates in the order descending p, then ascending index; the first
     * top_k of them (0 = all); then the shortest prefix whose mass reaches top_p of theirs (1 = off);
     * then the first candidate at which the running mass of that prefix exceeds u[r] * its mass
     * (the last one if rounding never gets there).
     * out [n] (device), logits [n, vocab], u [n] uniform draws in [0, 1) (device; from the caller's
     * seeded generator, so every backend and rank picks the same tokens) */
    void (*sample)(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
                   float top_p, const double *u);
} ckv_backend_ops;

struct ckv_backend {
    const ckv_backend_ops *ops;
    void *ctx;          /* the backend's own state */
    const char *name;   /* "cpu", "cuda" */
    ckv_device device;
    int n_threads;      /* host threads the backend uses */
    ckv_dtype weight_dtype; /* the float type weights are converted to when not computed as stored */
    ckv_dtype kv_dtype;     /* the KV cache's default dtype on this backend */
};

/* What a backend is created with. */
typedef struct {
    const char *name;   /* "cpu" (default when NULL) or "cuda" */
    int n_threads;      /* <= 0: all available cores */
    int device;         /* GPU index; < 0: device 0 (callers under MPI pass their node-local rank) */
} ckv_backend_params;

/* Creates the backend called `name` ("cpu" or "cuda"). n_threads <= 0 means all available cores. */
ckv_status ckv_backend_init(ckv_backend **out, const char *name, int n_threads);
ckv_status ckv_backend_init_params(ckv_backend **out, const ckv_backend_params *p);
void ckv_backend_free(ckv_backend *be); /* NULL is fine */

/* out [n, m] = x [n, k] @ w^T (+ bias) for an fp32 matrix w [m, k] held in a plain device buffer
 * (keys, statistics, staged blocks): the matmul op over an F32 view of it. */
static inline void ckv_backend_matmul_f32(ckv_backend *be, float *out, const float *x, const float *w,
                                          const float *bias, int n, int k, int m) {
    ckv_weight wt = {(void *)w, CKV_DTYPE_F32, m, k, (size_t)k * sizeof(float)};
    be->ops->matmul(be, out, x, &wt, bias, n);
}

/* Backend-specific constructors (backend.c dispatches to these). */
ckv_status ckv_backend_cpu_init(ckv_backend **out, int n_threads);
int ckv_backend_cuda_available(void); /* 1 when built with CUDA */
ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index);

#endif
