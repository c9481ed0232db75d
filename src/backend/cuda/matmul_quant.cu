/* Quantized weights on the GPU (ds_quant; issue 42), first form: correct
 * and row-invariant, not yet fast, and not yet run on a GPU (the session
 * that wrote it had none): off unless DS_CUDA_QUANT=1 (cuda_config.h).
 *
 * weight_quant copies the packed words, scales and biases to the device in
 * one allocation. A quantized matmul runs the CUDA-core kernel of
 * matmul.cu's narrow path with a dequantizing load (quant_load.cuh): the
 * same chunk order (thread t takes the 8-weight chunks t, t+128, ... in
 * order), the same butterfly and warp order, the same bias add, so it gives
 * the bits of matmul.cu's fp32-weight kernel over the dequantized weights,
 * for any row count (no cuBLAS for wide calls yet: a prompt's rows go 8 a
 * block, each block reading its weights again). x is rounded to bf16 where
 * the scales are bf16 (DS_X_BF16), as the CPU backend does for these
 * weights. The fused ops never take a quantized weight on the tensor cores
 * (ds_cu_mma_eligible, wide_bf16 refuse them): they fall back to their
 * unfused sequences through ds_cu_linear, which routes here. */
#include <cuda_bf16.h>

#include "backend/cuda/quant_load.cuh"

#define QV_THREADS 128 /* as matmul.cu's MV_THREADS: the reduction order depends on it */
#define QV_NB 4        /* outputs per block, as MV_NB */

__device__ __forceinline__ float qfma8(const float x[8], const float w[8], float acc) {
#pragma unroll
    for (int j = 0; j < 8; j++) acc = __fmaf_rn(x[j], w[j], acc);
    return acc;
}

template <int BITS, int MT, bool XB>
__global__ void __launch_bounds__(QV_THREADS)
    linear_quant_kernel(float *__restrict__ out, int64_t os, const float *__restrict__ x, int64_t xs, ds_cu_qw q,
                        const void *bias, int bdt, int M, int N, int K) {
    ds_cu_grid_wait();
    __shared__ float red[QV_THREADS / 32][MT][QV_NB];
    const int n0 = blockIdx.x * QV_NB, m0 = blockIdx.y * MT;
    float acc[MT][QV_NB];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < QV_NB; b++) acc[a][b] = 0.0f;
    const int chunks = K >> 3; /* K % group == 0 and group % 32 == 0: whole chunks */
    for (int c = threadIdx.x; c < chunks; c += QV_THREADS) {
        const int64_t k = (int64_t)c << 3;
        float wf[QV_NB][8], xf[8];
#pragma unroll
        for (int b = 0; b < QV_NB; b++) {
            if (n0 + b < N) ds_cu_load8_q<BITS>(q, n0 + b, k, wf[b]);
            else
#pragma unroll
                for (int j = 0; j < 8; j++) wf[b][j] = 0.0f;
        }
#pragma unroll
        for (int a = 0; a < MT; a++) {
            if (m0 + a >= M) break;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float v = x[(int64_t)(m0 + a) * xs + k + j];
                xf[j] = XB ? __bfloat162float(__float2bfloat16_rn(v)) : v;
            }
#pragma unroll
            for (int b = 0; b < QV_NB; b++) acc[a][b] = qfma8(xf, wf[b], acc[a][b]);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < QV_NB; b++) {
            float v = acc[a][b];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
            if (lane == 0) red[warp][a][b] = v;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < MT * QV_NB; t += QV_THREADS) {
        const int a = t / QV_NB, b = t % QV_NB, m = m0 + a, n = n0 + b;
        if (m >= M || n >= N) continue;
        float v = red[0][a][b];
#pragma unroll
        for (int i = 1; i < QV_THREADS / 32; i++) v = __fadd_rn(v, red[i][a][b]);
        if (bias) v = __fadd_rn(v, ds_cu_load(bias, bdt, n));
        out[(int64_t)m * os + n] = v;
    }
}

template <int BITS, int MT>
static void launch_mt(ds_cuda_backend *cb, bool xb, dim3 grid, ds_tensor out, ds_tensor x, const ds_cu_qw &q,
                      ds_tensor bias, int M, int N, int K) {
    if (xb)
        ds_cu_launch(linear_quant_kernel<BITS, MT, true>, grid, QV_THREADS, cb->stream, (float *)out.data, out.stride,
                     (const float *)x.data, x.stride, q, bias.data, (int)bias.dtype, M, N, K);
    else
        ds_cu_launch(linear_quant_kernel<BITS, MT, false>, grid, QV_THREADS, cb->stream, (float *)out.data, out.stride,
                     (const float *)x.data, x.stride, q, bias.data, (int)bias.dtype, M, N, K);
}

template <int BITS>
static void launch_bits(ds_cuda_backend *cb, bool xb, ds_tensor out, ds_tensor x, const ds_cu_qw &q, ds_tensor bias,
                        int M, int N, int K) {
    const int mt = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8; /* as matmul.cu's narrow_dt */
    const dim3 grid((unsigned)((N + QV_NB - 1) / QV_NB), (unsigned)((M + mt - 1) / mt));
    switch (mt) {
    case 1: launch_mt<BITS, 1>(cb, xb, grid, out, x, q, bias, M, N, K); break;
    case 2: launch_mt<BITS, 2>(cb, xb, grid, out, x, q, bias, M, N, K); break;
    case 4: launch_mt<BITS, 4>(cb, xb, grid, out, x, q, bias, M, N, K); break;
    default: launch_mt<BITS, 8>(cb, xb, grid, out, x, q, bias, M, N, K); break;
    }
}

void ds_cu_linear_quant(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    const int64_t M = x.rows, N = w.rows, K = x.cols;
    if (M <= 0 || N <= 0) return;
    if (K % w.q.group || w.q.group % 32 || (w.q.bits != 4 && w.q.bits != 8) || M > 65535L * 8) {
        ds_cu_fail(cb, op, "quantized weight %lldx%lld: bits %d, group %d, %lld rows not supported", (long long)N,
                   (long long)K, w.q.bits, w.q.group, (long long)M);
        return;
    }
    const ds_cu_qw q = ds_cu_qw_of(w);
    const bool xb = DS_X_BF16_ON && w.dtype == DS_BF16;
    if (w.q.bits == 4) launch_bits<4>(cb, xb, out, x, q, bias, (int)M, (int)N, (int)K);
    else launch_bits<8>(cb, xb, out, x, q, bias, (int)M, (int)N, (int)K);
    ds_cu_launched(cb, op);
}

ds_error *ds_cu_weight_quant(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (!cb->cfg.quant)
        return ds_errorf("tensor %s is quantized: the CUDA backend's quantized matmul has not been run on a GPU yet "
                         "(DS_CUDA_QUANT=1 uses it)",
                         src->w->name);
    const int64_t words = cols * src->bits / 32, groups = cols / src->group;
    const size_t es = ds_dtype_size(src->scales->dtype), wb = (size_t)(rows * words) * 4,
                 sb = (size_t)(rows * groups) * es;
    if (src->w->nbytes != wb || src->scales->nbytes != sb || src->biases->nbytes != sb)
        return ds_errorf("tensor %s: %zu / %zu / %zu bytes of words / scales / biases, expected %zu / %zu / %zu",
                         src->w->name, src->w->nbytes, src->scales->nbytes, src->biases->nbytes, wb, sb, sb);
    const size_t s_off = (wb + 255) & ~(size_t)255, b_off = s_off + ((sb + 255) & ~(size_t)255);
    char *p = NULL;
    cudaError_t e = cudaMalloc((void **)&p, b_off + sb);
    if (e != cudaSuccess)
        return ds_errorf("tensor %s: cannot allocate %zu bytes of device memory: %s", src->w->name, b_off + sb,
                         cudaGetErrorString(e));
    /* On the stream, so that every later op sees the whole copy. */
    e = cudaMemcpyAsync(p, src->w->data, wb, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(p + s_off, src->scales->data, sb, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(p + b_off, src->biases->data, sb, cudaMemcpyHostToDevice, cb->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return ds_errorf("tensor %s: cannot copy it to the device: %s", src->w->name, cudaGetErrorString(e));
    }
    *out = ds_tensor{src->scales->dtype, p, rows, cols, words, true, {src->bits, src->group, p + s_off, p + b_off}};
    return NULL;
}
