/* What a tensor-core narrow matmul launch is given (matmul_mma.h): the
 * segments and their epilogue. Its own header because the kernels' shared
 * device code (matmul_mma_frag.cuh) reads it too, and that code sits below
 * the launchers that include it. */
#ifndef DS_CUDA_MATMUL_MMA_ARGS_H
#define DS_CUDA_MATMUL_MMA_ARGS_H

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

#endif
