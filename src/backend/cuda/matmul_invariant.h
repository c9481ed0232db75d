/* Row-invariant wide products (matmul_invariant.cu): with cfg.invariant,
 * the wide bf16 path's GEMM computes each output with the narrow kernels'
 * sums in their order, so a row's bits do not depend on the call's row
 * count (the batched engine's batch invariance). */
#ifndef DS_CUDA_MATMUL_INVARIANT_H
#define DS_CUDA_MATMUL_INVARIANT_H

#include "backend/cuda/cuda_internal.h"

/* Whether wide products with weight w are row-invariant on this backend
 * (cfg.invariant, DS_X_BF16, w takes the narrow tensor-core kernels): the
 * ops then skip DS_CU_SLABS and run wide. */
bool ds_cu_wide_invariant_ok(const ds_cuda_backend *cb, ds_tensor w);
/* out[M, w.rows] (fp32, row stride out.stride) = xh w^T, xh bf16 [M, w.cols]
 * contiguous and 16-byte aligned; no bias. False (recorded) on failure. */
bool ds_cu_gemm_invariant(ds_cuda_backend *cb, const char *op, ds_tensor out, const uint16_t *xh, int64_t M,
                          ds_tensor w);

#endif
