/* The tensor-core narrow matmul (matmul_mma.cu): one launch computes up to
 * DS_LINEAR_MULTI_MAX projections of the same x (segments), with a plain, residual-add or
 * gated (SwiGLU or GeGLU-tanh) epilogue. Used by linear, linear_multi, linear_residual and
 * linear_swiglu when the weights qualify (ds_cu_mma_eligible). */
#ifndef DS_CUDA_MATMUL_MMA_H
#define DS_CUDA_MATMUL_MMA_H

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/matmul_mma_args.h"

/* bf16 weights, 1 <= M <= ds_cu_narrow_rows, K a multiple of 32, 16-byte rows.
 * Depends on w and on M <= ds_cu_narrow_rows only, never on M otherwise, so a
 * row gets tensor-core sums decoded alone or verified with others; which of
 * the two kernels computes them (ring for M <= 8, per-tile otherwise) does
 * not change a bit (matmul_mma_frag.cuh). */
bool ds_cu_mma_eligible(const ds_cuda_backend *cb, ds_tensor w, int64_t M);
/* Launches mode's kernel over a's segments (every segment: K = x.cols): the
 * ring kernel when it applies, else one block per 16-row tile. */
void ds_cu_mma_launch(ds_cuda_backend *cb, const char *op, int mode, ds_mma_args *a, ds_tensor x);
/* The persistent ring kernel (matmul_ring.cu) for M <= 8: launches it over
 * a's `tiles` 16-row tiles (block_end set) and returns true, or returns
 * false when x, the norm weight or the shape do not suit it. */
bool ds_cu_ring_launch(ds_cuda_backend *cb, const char *op, int mode, const ds_mma_args *a, ds_tensor x, int tiles);

#endif
