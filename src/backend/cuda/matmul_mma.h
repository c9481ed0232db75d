/* The tensor-core narrow matmul (matmul_mma.cu): one launch computes up to
 * DS_LINEAR_MULTI_MAX projections of the same x (segments), with a plain, residual-add or
 * gated (SwiGLU or GeGLU-tanh) epilogue. Used by linear, linear_multi, linear_residual and
 * linear_swiglu when the weights qualify (ds_cu_mma_eligible). */
#ifndef DS_CUDA_MATMUL_MMA_H
#define DS_CUDA_MATMUL_MMA_H

#include "backend/cuda/cuda_internal.h"

enum { DS_MMA_PLAIN, DS_MMA_RESIDUAL, DS_MMA_SWIGLU };
/* The gated mode's activation (DS_MMA_SWIGLU: act(x @ w^T) * (x @ w2^T)). */
enum { DS_GLU_SILU, DS_GLU_GELU_TANH };

#define DS_MMA_MAX_SEG DS_LINEAR_MULTI_MAX

typedef struct {
    const uint16_t *w, *w2; /* [n, K] bf16 rows of stride ws; w2 = up weights (SwiGLU) */
    int64_t ws;
    float *out;             /* [M, n], row stride os */
    int64_t os;
    const float *res;       /* residual [M, n] (may be out), row stride rs */
    int64_t rs;
    const void *bias;       /* [n] or NULL */
    int bias_dtype;
    int n;
    int act;                /* DS_MMA_SWIGLU's activation: DS_GLU_SILU (0) or DS_GLU_GELU_TANH */
    int block_end;          /* set by the launcher: 16-row tiles of segments 0..this one */
} ds_mma_seg;

typedef struct {
    ds_mma_seg seg[DS_MMA_MAX_SEG];
    int nseg;
    /* RMSNorm of x fused in front (NULL: none): every segment then sees
     * x / rms(x) * norm_w, computed from x's K columns in the kernel. */
    const void *norm_w;
    int norm_dtype;
    float eps;
} ds_mma_args;

/* bf16 weights, 1 <= M <= DS_CU_NARROW_M, K a multiple of 32, 16-byte rows.
 * Depends on w and on M <= DS_CU_NARROW_M only, never on M otherwise, so a
 * row gets tensor-core sums decoded alone or verified with others; which of
 * the two kernels computes them (ring for M <= 8, per-tile otherwise) does
 * not change a bit (matmul_mma_frag.cuh). */
bool ds_cu_mma_eligible(ds_tensor w, int64_t M);
/* Launches mode's kernel over a's segments (every segment: K = x.cols): the
 * ring kernel when it applies, else one block per 16-row tile. */
void ds_cu_mma_launch(ds_cuda_backend *cb, const char *op, int mode, ds_mma_args *a, ds_tensor x);
/* The persistent ring kernel (matmul_ring.cu) for M <= 8: launches it over
 * a's `tiles` 16-row tiles (block_end set) and returns true, or returns
 * false when x, the norm weight or the shape do not suit it. */
bool ds_cu_ring_launch(ds_cuda_backend *cb, const char *op, int mode, const ds_mma_args *a, ds_tensor x, int tiles);

#endif
