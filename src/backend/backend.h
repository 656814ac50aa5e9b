/* backend.h - the compute backend: a table of function pointers over device buffers plus a context
 * pointer. Every tensor op the model, the KV cache and the presses need goes through this table, so
 * the CPU backend (the reference) and the CUDA backend are interchangeable. Buffers are fp32 unless
 * a name says otherwise; shapes are given in the comments and are row-major. Ops that cannot fail
 * return void; a device backend reports asynchronous failures from sync(). This header includes no
 * CUDA header and knows nothing of models, files or communication. */
#ifndef CKV_BACKEND_H
#define CKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct ckv_backend ckv_backend;

/* One layer's ragged KV cache as the attention op sees it. Head g owns pool rows
 * [off[g], off[g] + len[g]); inside a head rows are sorted by original position (ascending). */
typedef struct {
    const float *k;     /* [rows, head_dim] post-RoPE keys */
    const float *v;     /* [rows, head_dim] values */
    const int32_t *pos; /* [rows] original token position of each row */
    const int64_t *off; /* [n_kv_heads] first row of each head */
    const int32_t *len; /* [n_kv_heads] rows in use */
    int n_kv_heads;
    int head_dim;
} ckv_attn_cache;

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

    /* out[i, :] = table[ids[i], :]                      out [n, dim], table [vocab, dim] */
    void (*embedding)(ckv_backend *be, float *out, const float *table, const int32_t *ids, int n, int dim);
    /* out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w   x, out [n, dim] (out may be x), w [dim] */
    void (*rmsnorm)(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
    /* out = x @ w^T (+ bias)   x [n, k], w [m, k] (HF (out, in) layout), bias [m] or NULL, out [n, m] */
    void (*matmul)(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k, int m);
    /* In-place rotary embedding, HF "rotate_half" layout: for pair i < hd/2 of each head,
     * angle = (float)pos[t] * inv_freq[i]; (x[i], x[i + hd/2]) rotated by angle, both scaled by
     * attn_scale (1 unless YaRN).   x [n, n_heads, hd], pos [n], inv_freq [hd/2] */
    void (*rope)(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                 float attn_scale);
    /* Appends n tokens to every KV head of a layer's pool: head g row off[g] + len[g] + t gets
     * k[t, g, :], v[t, g, :] and pos[t]. The caller advances len afterwards.
     * kpool, vpool [rows, d], ppool [rows], k, v [n, n_kv, d], pos [n] */
    void (*kv_store)(ckv_backend *be, float *kpool, float *vpool, int32_t *ppool, const int64_t *off,
                     const int32_t *len, const float *k, const float *v, const int32_t *pos, int n, int n_kv, int d);
    /* Causal attention of n query tokens over a ragged cache: query head h reads KV head
     * h / (n_heads / n_kv_heads) and sees the rows whose pos <= qpos[t]; softmax(q.k * scale) v in fp32.
     * out, q [n, n_heads, head_dim], qpos [n] */
    void (*attention)(ckv_backend *be, float *out, const float *q, const int32_t *qpos, const ckv_attn_cache *cache,
                      int n, int n_heads, float scale);
    /* out[i] = silu(gate[i]) * up[i]   [n] (out may alias gate) */
    void (*swiglu)(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* x[i] += y[i]   [n] */
    void (*add)(ckv_backend *be, float *x, const float *y, size_t n);
} ckv_backend_ops;

struct ckv_backend {
    const ckv_backend_ops *ops;
    void *ctx;          /* the backend's own state */
    const char *name;   /* "cpu", "cuda" */
    ckv_device device;
    int n_threads;      /* host threads the backend uses */
};

/* Creates the backend called `name` ("cpu" or "cuda"). n_threads <= 0 means all available cores. */
ckv_status ckv_backend_init(ckv_backend **out, const char *name, int n_threads);
void ckv_backend_free(ckv_backend *be); /* NULL is fine */

/* Backend-specific constructors (backend.c dispatches to these). */
ckv_status ckv_backend_cpu_init(ckv_backend **out, int n_threads);
int ckv_backend_cuda_available(void); /* 1 when built with CUDA */
ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index);

#endif
