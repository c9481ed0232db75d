/* y = x W^T on the GPU.
 *
 * Narrow calls (decode, verify, drafter blocks: M <= DS_CU_NARROW_M rows)
 * with bf16 weights run on the tensor cores (matmul_mma.cu). The others
 * (fp32 / f16 weights, K not a multiple of 32) use the CUDA-core kernel
 * here, bound by reading the weights once from HBM (16-byte
 * loads of bf16/f16/fp32 rows, widened to fp32 in registers, fp32 FMAs).
 * Its reduction order is fixed by K alone: thread t of a block takes the
 * 8-element chunks t, t+128, ... of the row in order, the 32 lanes of a warp
 * are summed by a fixed butterfly and the 4 warps in order; the rows of x a
 * block handles (1, 2, 4 or 8 per block, by M) change nothing in that order,
 * so each output row is bit-identical however many rows share the call.
 *
 * Wide calls (prefill) go to cuBLAS: bf16 weights as two bf16 tensor-core
 * GEMMs of x's hi and lo halves (linear_wide_bf16), fp32 weights as sgemm
 * in plain fp32 (no TF32), f16 weights widened a tile of rows at a time
 * into scratch for sgemm, as the CPU backend widens them for OpenBLAS. */
#include <cuda_bf16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/matmul_invariant.h"
#include "backend/cuda/matmul_mma.h"

#define MV_THREADS 128
#define MV_NB 4                        /* weight rows (outputs) per block */
#define WIDE_TILE_BYTES ((size_t)64 << 20) /* fp32 weight tile for cuBLAS */

/* The one accumulation step every path shares: acc += x[j] * w[j], j = 0..7. */
__device__ __forceinline__ float fma8(const float x[8], const float w[8], float acc) {
#pragma unroll
    for (int j = 0; j < 8; j++) acc = __fmaf_rn(x[j], w[j], acc);
    return acc;
}

/* DS_X_BF16 (src/base/dtype.h): x rounded to bf16 where the weights are bf16, as every other path rounds it. */
template <int DT> __device__ __forceinline__ void x_bf16_8(float f[8]) {
    if (DS_X_BF16_ON && DT == DS_BF16)
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = __bfloat162float(__float2bfloat16_rn(f[j]));
}

/* Block (bx, by): outputs n0..n0+3 of rows m0..m0+MT-1. VEC: x and w rows
 * allow 16-byte loads; full chunks use them, everything else (and every
 * chunk when !VEC) loads element by element with zeros past K. Both give
 * the same operations in the same order. */
template <int DT, int MT, bool VEC>
__global__ void __launch_bounds__(MV_THREADS)
    linear_narrow_kernel(float *__restrict__ out, int64_t os, const float *__restrict__ x, int64_t xs,
                         const void *__restrict__ w, int64_t ws, const void *bias, int bdt, int M, int N, int K) {
    ds_cu_grid_wait();
    __shared__ float red[MV_THREADS / 32][MT][MV_NB];
    const int n0 = blockIdx.x * MV_NB, m0 = blockIdx.y * MT;
    float acc[MT][MV_NB];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < MV_NB; b++) acc[a][b] = 0.0f;
    const int chunks = (K + 7) >> 3;
    int c = threadIdx.x;
    if (VEC) {
        /* Two full chunks per trip, all their weight loads issued first;
         * the FMAs still run chunk by chunk, in the same order as below. */
        const int full = K >> 3;
        for (; c + MV_THREADS < full; c += 2 * MV_THREADS) {
            const int k0 = c << 3, k1 = (c + MV_THREADS) << 3;
            float w0[MV_NB][8], w1[MV_NB][8], x0[8], x1[8];
#pragma unroll
            for (int b = 0; b < MV_NB; b++) {
                const int64_t r = (int64_t)(n0 + b < N ? n0 + b : N - 1) * ws; /* rows past N: any valid row, unused */
                ds_cu_load8<DT>(w, r + k0, w0[b]);
                ds_cu_load8<DT>(w, r + k1, w1[b]);
            }
#pragma unroll
            for (int a = 0; a < MT; a++) {
                if (m0 + a >= M) break;
                ds_cu_load8<DS_F32>(x, (int64_t)(m0 + a) * xs + k0, x0);
                ds_cu_load8<DS_F32>(x, (int64_t)(m0 + a) * xs + k1, x1);
                x_bf16_8<DT>(x0);
                x_bf16_8<DT>(x1);
#pragma unroll
                for (int b = 0; b < MV_NB; b++) acc[a][b] = fma8(x1, w1[b], fma8(x0, w0[b], acc[a][b]));
            }
        }
    }
    for (; c < chunks; c += MV_THREADS) {
        const int k = c << 3;
        float wf[MV_NB][8], xf[8];
        if (VEC && k + 8 <= K) {
#pragma unroll
            for (int b = 0; b < MV_NB; b++) {
                if (n0 + b < N) ds_cu_load8<DT>(w, (int64_t)(n0 + b) * ws + k, wf[b]);
                else
#pragma unroll
                    for (int j = 0; j < 8; j++) wf[b][j] = 0.0f;
            }
#pragma unroll
            for (int a = 0; a < MT; a++) {
                if (m0 + a >= M) break;
                ds_cu_load8<DS_F32>(x, (int64_t)(m0 + a) * xs + k, xf);
                x_bf16_8<DT>(xf);
#pragma unroll
                for (int b = 0; b < MV_NB; b++) acc[a][b] = fma8(xf, wf[b], acc[a][b]);
            }
        } else {
#pragma unroll
            for (int b = 0; b < MV_NB; b++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    wf[b][j] = n0 + b < N && k + j < K ? ds_cu_load(w, DT, (int64_t)(n0 + b) * ws + k + j) : 0.0f;
#pragma unroll
            for (int a = 0; a < MT; a++) {
                if (m0 + a >= M) break;
#pragma unroll
                for (int j = 0; j < 8; j++) xf[j] = k + j < K ? x[(int64_t)(m0 + a) * xs + k + j] : 0.0f;
                x_bf16_8<DT>(xf);
#pragma unroll
                for (int b = 0; b < MV_NB; b++) acc[a][b] = fma8(xf, wf[b], acc[a][b]);
            }
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < MV_NB; b++) {
            float v = acc[a][b];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
            if (lane == 0) red[warp][a][b] = v;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < MT * MV_NB; t += MV_THREADS) {
        const int a = t / MV_NB, b = t % MV_NB, m = m0 + a, n = n0 + b;
        if (m >= M || n >= N) continue;
        float v = red[0][a][b];
#pragma unroll
        for (int i = 1; i < MV_THREADS / 32; i++) v = __fadd_rn(v, red[i][a][b]);
        if (bias) v = __fadd_rn(v, ds_cu_load(bias, bdt, n));
        out[(int64_t)m * os + n] = v;
    }
}

template <int DT, int MT>
static void launch_narrow(cudaStream_t st, bool vec, dim3 grid, ds_tensor out, ds_tensor x, ds_tensor w,
                          ds_tensor bias, int M, int N, int K) {
    if (vec)
        ds_cu_launch(linear_narrow_kernel<DT, MT, true>, grid, MV_THREADS, st, (float *)out.data, out.stride,
                     (const float *)x.data, x.stride, w.data, w.stride, bias.data, bias.dtype, M, N, K);
    else
        ds_cu_launch(linear_narrow_kernel<DT, MT, false>, grid, MV_THREADS, st, (float *)out.data, out.stride,
                     (const float *)x.data, x.stride, w.data, w.stride, bias.data, bias.dtype, M, N, K);
}

template <int DT>
static void narrow_dt(cudaStream_t st, bool vec, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, int M,
                      int N, int K) {
    /* Rows per block by M: a whole decode row set in one block when it is small. */
    const int mt = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
    dim3 grid((unsigned)((N + MV_NB - 1) / MV_NB), (unsigned)((M + mt - 1) / mt));
    switch (mt) {
    case 1: launch_narrow<DT, 1>(st, vec, grid, out, x, w, bias, M, N, K); break;
    case 2: launch_narrow<DT, 2>(st, vec, grid, out, x, w, bias, M, N, K); break;
    case 4: launch_narrow<DT, 4>(st, vec, grid, out, x, w, bias, M, N, K); break;
    default: launch_narrow<DT, 8>(st, vec, grid, out, x, w, bias, M, N, K); break;
    }
}

/* dst[r][c] = w[n0 + r][c] widened to fp32, r < rows. */
__global__ void widen_kernel(float *__restrict__ dst, const void *__restrict__ w, int dt, int64_t ws, int64_t n0,
                             int64_t rows, int64_t K) {
    ds_cu_grid_wait();
    const int64_t total = rows * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K, c = i % K;
        dst[i] = ds_cu_load(w, dt, (n0 + r) * ws + c);
    }
}

__global__ void add_bias_kernel(float *out, int64_t os, const void *bias, int bdt, int64_t M, int64_t N) {
    ds_cu_grid_wait();
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float b = ds_cu_load(bias, bdt, n);
    for (int64_t m = blockIdx.y; m < M; m += gridDim.y) out[m * os + n] += b;
}

/* hi[r][c] = bf16(x[r][c]), lo[r][c] = bf16(x[r][c] - hi[r][c]) (contiguous [M, K]; DS_X_BF16: hi only). */
__global__ void split_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, int64_t xs, int64_t M,
                                  int64_t K) {
    ds_cu_grid_wait();
    const int64_t total = M * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[(i / K) * xs + i % K];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        if (!DS_X_BF16_ON) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

/* Prefill with bf16 weights on the tensor cores: x = hi + lo as in the
 * narrow kernel (~16 mantissa bits kept), out = W hi + W lo with fp32
 * accumulation, two cuBLAS bf16 GEMMs instead of widening every weight to
 * fp32 for sgemm (which read the weights three times and ran on the CUDA
 * cores). With cfg.invariant (DS_X_BF16: hi alone) the row-invariant GEMM
 * instead (matmul_invariant.cu). */
static bool gemm_bf16(ds_cuda_backend *cb, const char *op, ds_tensor out, const void *hi, const void *lo, int64_t M,
                      int64_t K, ds_tensor w, bool accumulate) {
    if (!lo && !accumulate && ds_cu_wide_invariant_ok(cb, w))
        return ds_cu_gemm_invariant(cb, op, out, (const uint16_t *)hi, M, w);
    const int64_t N = w.rows;
    const float one = 1.0f, zero = 0.0f;
    for (int part = 0; part < (lo ? 2 : 1); part++) {
        cublasStatus_t st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, w.data,
                                         CUDA_R_16BF, (int)w.stride, part ? lo : hi, CUDA_R_16BF, (int)K,
                                         part || accumulate ? &one : &zero, out.data, CUDA_R_32F, (int)out.stride,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            ds_cu_fail(cb, op, "cublasGemmEx bf16 %lldx%lldx%lld failed (status %d)", (long long)M, (long long)N,
                       (long long)K, (int)st);
            return false;
        }
    }
    return true;
}

/* accumulate: out += x w^T (cuBLAS's beta = 1), never on the invariant product. */
static bool linear_wide_bf16(ds_cuda_backend *cb, ds_tensor out, ds_tensor x, ds_tensor w, bool accumulate) {
    const int64_t M = x.rows, K = x.cols;
    const int64_t halves = DS_X_BF16_ON ? 1 : 2; /* DS_X_BF16: x's hi half only */
    __nv_bfloat16 *hi = (__nv_bfloat16 *)ds_cu_scratch(cb, "linear", (size_t)(halves * M * K) * sizeof(__nv_bfloat16));
    if (!hi) return false;
    __nv_bfloat16 *lo = DS_X_BF16_ON ? NULL : hi + M * K;
    const int64_t blocks = (M * K + 255) / 256;
    ds_cu_launch(split_bf16_kernel, (unsigned)(blocks < 65536 ? blocks : 65536), 256, cb->stream, hi, lo,
                 (const float *)x.data, x.stride, M, K);
    if (!ds_cu_launched(cb, "linear")) return false;
    return gemm_bf16(cb, "linear", out, hi, lo, M, K, w, accumulate);
}

static void add_bias(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor bias) {
    if (!bias.data) return;
    dim3 grid((unsigned)((out.cols + 255) / 256), ds_cu_rows_grid(out.rows));
    ds_cu_launch(add_bias_kernel, grid, 256, cb->stream, (float *)out.data, out.stride, bias.data, bias.dtype,
                 out.rows, out.cols);
    ds_cu_launched(cb, op);
}

bool ds_cu_linear_wide_bf16x(ds_cuda_backend *cb, const char *op, ds_tensor out, const uint16_t *xh, int64_t M,
                             ds_tensor w, ds_tensor bias) {
    if (!gemm_bf16(cb, op, out, xh, NULL, M, w.cols, w, false)) return false;
    add_bias(cb, op, out, bias);
    return true;
}

/* fp32 weights straight into sgemm (plain fp32, no TF32); f16 weights
 * widened a tile of rows at a time into scratch first. */
static bool linear_wide_sgemm(ds_cuda_backend *cb, ds_tensor out, ds_tensor x, ds_tensor w) {
    const int64_t M = x.rows, K = x.cols, N = w.rows;
    const float one = 1.0f, zero = 0.0f;
    const float *wt = (const float *)w.data;
    int64_t tile = N, ldw = w.stride;
    float *buf = NULL;
    if (w.dtype != DS_F32) {
        tile = (int64_t)(WIDE_TILE_BYTES / ((size_t)K * sizeof(float)));
        if (tile < 1) tile = 1;
        if (tile > N) tile = N;
        buf = (float *)ds_cu_scratch(cb, "linear", (size_t)(tile * K) * sizeof(float));
        if (!buf) return false;
        ldw = K;
    }
    for (int64_t n0 = 0; n0 < N; n0 += tile) {
        const int64_t tn = N - n0 < tile ? N - n0 : tile;
        if (buf) {
            int64_t blocks = (tn * K + 255) / 256;
            ds_cu_launch(widen_kernel, (unsigned)(blocks < 65536 ? blocks : 65536), 256, cb->stream, buf, w.data,
                         w.dtype, w.stride, n0, tn, K);
            if (!ds_cu_launched(cb, "linear")) return false;
            wt = buf;
        } else {
            wt = (const float *)w.data + n0 * w.stride;
        }
        /* Column-major view: out^T[tn, M] = W_tile[tn, K] (row-major = col-major K x tn, transposed) x^T[K, M]. */
        cublasStatus_t s = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)tn, (int)M, (int)K, &one, wt, (int)ldw,
                                       (const float *)x.data, (int)x.stride, &zero, (float *)out.data + n0,
                                       (int)out.stride);
        if (s != CUBLAS_STATUS_SUCCESS) {
            ds_cu_fail(cb, "linear", "cublasSgemm %lldx%lldx%lld failed (status %d)", (long long)M, (long long)tn,
                       (long long)K, (int)s);
            return false;
        }
    }
    return true;
}

bool ds_cu_linear_accumulate(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w) {
    if (w.dtype != DS_BF16 || w.q.bits || x.rows <= ds_cu_narrow_rows(cb) || ds_cu_wide_invariant_ok(cb, w) ||
        !ds_cu_linear_ok(cb, op, out, x, w, ds_no_tensor()))
        return false;
    linear_wide_bf16(cb, out, x, w, true);
    return true;
}

static void linear_wide(ds_cuda_backend *cb, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    if (!(w.dtype == DS_BF16 ? linear_wide_bf16(cb, out, x, w, false) : linear_wide_sgemm(cb, out, x, w))) return;
    add_bias(cb, "linear", out, bias);
}

bool ds_cu_linear_ok(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    const int64_t M = x.rows, K = x.cols, N = w.rows;
    if (w.cols != K || out.rows != M || out.cols != N) {
        ds_cu_fail(cb, op, "shapes do not match: out %lldx%lld = x %lldx%lld @ w %lldx%lld^T", (long long)out.rows,
                   (long long)out.cols, (long long)M, (long long)K, (long long)N, (long long)w.cols);
        return false;
    }
    if (K > INT32_MAX || N > INT32_MAX || !ds_cu_float_dtype(cb, op, w.dtype)) return false;
    if (bias.data && !ds_cu_float_dtype(cb, op, bias.dtype)) return false;
    return true;
}

void ds_cu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    ds_cuda_backend *cb = ds_cu(be);
    const int64_t M = x.rows, K = x.cols, N = w.rows;
    if (M <= 0 || N <= 0) return;
    DS_CU_SLABS(cb, M, ds_cu_wide_invariant_ok(cb, w), r0, n,
                ds_cu_linear(be, ds_rows(out, r0, n), ds_rows(x, r0, n), w, bias));
    if (!ds_cu_linear_ok(cb, "linear", out, x, w, bias)) return;
    if (w.q.bits) { /* quantized (matmul_quant.cu): before any test of the dtype, which is its scales' */
        ds_cu_linear_quant(cb, "linear", out, x, w, bias);
        return;
    }
    if (ds_cu_mma_eligible(cb, w, M)) {
        ds_mma_args a = {};
        a.nseg = 1;
        a.seg[0] = ds_mma_seg{(const uint16_t *)w.data, NULL, w.stride, (float *)out.data, out.stride, NULL, 0,
                              bias.data, (int)bias.dtype, (int)N, DS_GLU_SILU, 0};
        ds_cu_mma_launch(cb, "linear", DS_MMA_PLAIN, &a, x);
        return;
    }
    if (M > DS_CU_NARROW_M || (w.dtype == DS_BF16 && M > ds_cu_narrow_rows(cb))) {
        linear_wide(cb, out, x, w, bias);
        return;
    }
    const size_t es = ds_dtype_size(w.dtype);
    const bool vec = (uintptr_t)x.data % 16 == 0 && x.stride % 4 == 0 && (uintptr_t)w.data % 16 == 0 &&
                     ((size_t)w.stride * es) % 16 == 0;
    switch (w.dtype) {
    case DS_BF16: narrow_dt<DS_BF16>(cb->stream, vec, out, x, w, bias, (int)M, (int)N, (int)K); break;
    case DS_F16: narrow_dt<DS_F16>(cb->stream, vec, out, x, w, bias, (int)M, (int)N, (int)K); break;
    default: narrow_dt<DS_F32>(cb->stream, vec, out, x, w, bias, (int)M, (int)N, (int)K); break;
    }
    ds_cu_launched(cb, "linear");
}
