/* plan.h - the per-rank device memory plan of a run: what a rank allocates on its GPU for a model,
 * a tensor-parallel degree, a context, a press budget and a chunk, part by part, computed from the
 * configuration alone (nothing is loaded), printed by `ckv inspect --backend cuda` and checked
 * against the device's memory (or --gpu-mem-limit) before loading, so a run that cannot fit fails
 * at once naming the part that does not fit. It does not allocate anything itself. */
#ifndef CKV_MODEL_PLAN_H
#define CKV_MODEL_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "shard/shard.h"

/* The CUDA runtime's own use that the plan cannot see: the context, the libraries' kernels loaded
 * into device memory, allocator rounding. An estimate; see docs/gpu.md §8. (The backend's fixed
 * workspaces, cuBLAS's included, are the plan's CKV_PLAN_BACKEND line.) */
#define CKV_PLAN_RUNTIME_RESERVE ((size_t)1 << 30)
/* NCCL's internal buffers per peer (channels x protocols at the default NCCL_BUFFSIZE): an
 * estimate to be measured on the GPU machine. */
#define CKV_PLAN_NCCL_PER_PEER ((size_t)256 << 20)

typedef struct {
    int tp;                 /* tensor-parallel ranks */
    long context;           /* context tokens */
    long new_tokens;        /* question + answer tokens reserved after the context */
    int chunk;              /* prefill chunk */
    ckv_dtype weight_dtype; /* of the weight matrices (BF16 on the GPU) */
    ckv_dtype kv_dtype;     /* of the KV cache (BF16 on the GPU) */
    long kept;              /* context tokens kept per head after compression (mean); <= 0 or >= context: none */
    int window;             /* observation window of the scorer (SnapKV 64); 0: no windowed scorer */
    int nccl;               /* 1 when the collectives go through NCCL (its buffers are counted) */
    int sms;                /* the GPU's SMs (the split-K partials); <= 0: an H200's 132 */
    int cc_major;           /* its compute capability's major (cuBLAS's workspace); <= 0: 9 (Hopper) */
} ckv_plan_params;

/* The device the plan assumes when ckv_plan_params leaves it open: an H200. */
enum { CKV_PLAN_DEFAULT_SMS = 132, CKV_PLAN_DEFAULT_CC_MAJOR = 9 };

/* The parts, in the order a run allocates them. */
typedef enum {
    CKV_PLAN_WEIGHTS = 0,   /* this rank's weights (matrices in weight_dtype, norms/biases fp32) */
    CKV_PLAN_KV,            /* KV pools at their peak (see kv_full / kv_peak) */
    CKV_PLAN_HIDDEN,        /* layer-major prefill: hidden states of the whole context (+ scorer inputs) */
    CKV_PLAN_WORKSPACE,     /* activation buffers of one chunk + logits */
    CKV_PLAN_EVICT,         /* scorer scratch of one layer (scores, gathered scores, window logits) */
    CKV_PLAN_COMM,          /* collective workspace + NCCL buffers */
    CKV_PLAN_BACKEND,       /* the CUDA backend's fixed workspaces: cuBLAS's, the GEMM's bf16 activations
                             * of the widest chunk matmul, the split-K partials (backend/gpu_workspace.h) */
    CKV_PLAN_RUNTIME,       /* CUDA context, cuBLAS workspace, allocator slack (estimate) */
    CKV_PLAN_PARTS_
} ckv_plan_part;

typedef struct {
    int rank;
    ckv_shard_plan shard;
    size_t part[CKV_PLAN_PARTS_]; /* bytes */
    size_t kv_full;        /* every layer at context + new tokens (no compression) */
    size_t kv_kept;        /* every layer at kept + new tokens (after compression) */
    size_t kv_peak;        /* layer-major prefill peak: kv_kept + one full layer (compaction writes the
                            * kept rows to a new pool while the full one still exists) */
    size_t host_bytes;     /* host memory of the same run (logits, staging), not in total */
    size_t total;          /* sum of part[] */
    int compress;
} ckv_plan;

const char *ckv_plan_part_name(ckv_plan_part p);

/* The plan of `rank` for cfg under p. */
ckv_status ckv_plan_init(ckv_plan *plan, const ckv_model_config *cfg, const ckv_plan_params *p, int rank);

/* The bytes of the collective workspace a device communicator needs for the logits gather (the
 * ckv_comm_dev_workspace request of ckv_model_logits); 0 at tp 1. */
size_t ckv_plan_comm_workspace_bytes(const ckv_model_config *cfg, int tp);

/* Prints the plan of every rank (one column per rank, at most 8; ranks beyond are summarised by
 * the largest) with a header naming the inputs. */
ckv_status ckv_plan_print(FILE *f, const ckv_model_config *cfg, const ckv_plan_params *p);

/* Fails (CKV_STATUS_ERR_NOMEM) when plan->total exceeds limit_bytes, naming the rank, the first part
 * that does not fit on top of the ones before it, both sizes and the limit. */
ckv_status ckv_plan_check(const ckv_plan *plan, size_t limit_bytes);

#endif
