/* Quantized weights on the device (ds_quant, MLX's affine layout: 32 / bits
 * codes a uint32, the first in the lowest bits) and their dequantizing
 * loads, shared by the quantized matmuls (matmul_quant.cu) and the
 * embedding gather (elementwise.cu). A weight is fma(code, scale, bias) in
 * fp32, the value the CPU backend and ds_dequant_row give.
 *
 * Device layout (ds_cu_weight_quant): the packed words as in the
 * checkpoint, then the scales and biases interleaved, (scale, bias) of
 * group gi of row n at pair n * gp + gi, gp = groups rounded up to 4. Why:
 * the tensor-core kernel copies a row's pairs for one 128-wide chunk (1, 2
 * or 4 groups) with one aligned copy instead of two unaligned ones. The
 * tensor's q.scales is the first pair, q.biases the first bias (stride 2). */
#ifndef DS_CU_QUANT_LOAD_CUH
#define DS_CU_QUANT_LOAD_CUH

#include "backend/cuda/cuda_internal.h"

/* Pairs a row of the device layout: groups rounded up to 4. */
static inline int64_t ds_cu_q_pairs(int64_t cols, int group) { return (cols / group + 3) / 4 * 4; }

/* A quantized weight's device pointers, by value into kernels. */
struct ds_cu_qw {
    const uint32_t *w; /* packed words, ws a row */
    int64_t ws;
    const void *sb; /* (scale, bias) pairs of dtype sdt, gp a row */
    int64_t gp;
    int sdt, bits, group;
};

static inline ds_cu_qw ds_cu_qw_of(ds_tensor t) {
    ds_cu_qw q;
    q.w = (const uint32_t *)t.data;
    q.ws = t.stride;
    q.sb = t.q.scales;
    q.gp = ds_cu_q_pairs(t.cols, t.q.group);
    q.sdt = (int)t.dtype;
    q.bits = t.q.bits;
    q.group = t.q.group;
    return q;
}

/* w[n][k .. k+7] (k % 8 == 0: one group, one 4-bit word or two 8-bit words). */
template <int BITS>
__device__ __forceinline__ void ds_cu_load8_q(const ds_cu_qw &q, int64_t n, int64_t k, float f[8]) {
    const int64_t p = 2 * (n * q.gp + k / q.group);
    const float s = ds_cu_load(q.sb, q.sdt, p), b = ds_cu_load(q.sb, q.sdt, p + 1);
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
    const int64_t p = 2 * (n * q.gp + k / q.group);
    const int per = 32 / q.bits;
    const uint32_t code = (__ldg(q.w + n * q.ws + k / per) >> ((k % per) * q.bits)) & ((1u << q.bits) - 1u);
    return __fmaf_rn((float)code, ds_cu_load(q.sb, q.sdt, p), ds_cu_load(q.sb, q.sdt, p + 1));
}

#endif
