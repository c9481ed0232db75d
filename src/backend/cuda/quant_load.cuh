/* Dequantizing loads of quantized weights (ds_quant, MLX's affine layout:
 * 32 / bits codes a uint32, the first in the lowest bits), shared by the
 * quantized matmul (matmul_quant.cu) and the embedding gather
 * (elementwise.cu). A weight is fma(code, scale, bias) in fp32, the value
 * the CPU backend and ds_dequant_row give, so a quantized weight multiplies
 * as an fp32 weight holding its dequantized values. */
#ifndef DS_CU_QUANT_LOAD_CUH
#define DS_CU_QUANT_LOAD_CUH

#include "backend/cuda/cuda_internal.h"

/* A quantized weight's device pointers, by value into kernels. */
struct ds_cu_qw {
    const uint32_t *w; /* packed words, ws a row */
    int64_t ws;
    const void *s, *b; /* [rows, groups] of dtype sdt */
    int sdt, bits, group, groups;
};

static inline ds_cu_qw ds_cu_qw_of(ds_tensor t) {
    ds_cu_qw q;
    q.w = (const uint32_t *)t.data;
    q.ws = t.stride;
    q.s = t.q.scales;
    q.b = t.q.biases;
    q.sdt = (int)t.dtype;
    q.bits = t.q.bits;
    q.group = t.q.group;
    q.groups = (int)(t.cols / t.q.group);
    return q;
}

/* w[n][k .. k+7] (k % 8 == 0: one group, one 4-bit word or two 8-bit words). */
template <int BITS>
__device__ __forceinline__ void ds_cu_load8_q(const ds_cu_qw &q, int64_t n, int64_t k, float f[8]) {
    const int64_t g = n * q.groups + k / q.group;
    const float s = ds_cu_load(q.s, q.sdt, g), b = ds_cu_load(q.b, q.sdt, g);
    const uint32_t *row = q.w + n * q.ws;
    if (BITS == 4) {
        const uint32_t u = __ldg(row + k / 8);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = __fmaf_rn((float)((u >> (4 * j)) & 15u), s, b);
    } else {
        const uint32_t u0 = __ldg(row + k / 4), u1 = __ldg(row + k / 4 + 1);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f[j] = __fmaf_rn((float)((u0 >> (8 * j)) & 255u), s, b);
            f[4 + j] = __fmaf_rn((float)((u1 >> (8 * j)) & 255u), s, b);
        }
    }
}

/* w[n][k], any k. */
__device__ __forceinline__ float ds_cu_load1_q(const ds_cu_qw &q, int64_t n, int64_t k) {
    const int64_t g = n * q.groups + k / q.group;
    const int per = 32 / q.bits;
    const uint32_t code = (__ldg(q.w + n * q.ws + k / per) >> ((k % per) * q.bits)) & ((1u << q.bits) - 1u);
    return __fmaf_rn((float)code, ds_cu_load(q.s, q.sdt, g), ds_cu_load(q.b, q.sdt, g));
}

#endif
