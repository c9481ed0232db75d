/* Quantized weights on the GPU (ds_quant, MLX's affine int4 / int8; issue
 * 42): the weight_quant op and y = x W^T for such weights, at any row count.
 *
 * The tensor-core kernel (Hopper, DS_X_BF16, bf16 scales: every MLX
 * checkpoint of a bf16 model). A weight is code * s + b per group, so
 *   y = sum over groups of  s * dot + b * xsum,
 * dot = sum code * x and xsum = sum x over the group's k. Codes (0..15,
 * 0..255) are exact in bf16 and x is bf16 already (DS_X_BF16), so dot and
 * xsum are exact-operand m16n8k16 products (A = 16 weight rows of codes or
 * all ones, B = 8 rows of x): the int4 / int8 bytes stream from HBM and are
 * widened in registers, never as dequantized bf16 (which would not be exact).
 *
 * Row invariance is the contract below, which every launch follows
 * whatever its rows, tiles or source of x (test_cuda_quant checks rows at
 * 1, 3, 8, 16, 17, 64 and 100 rows a call bit for bit):
 * - K is cut into 128-wide chunks (groups of 32 / 64 / 128 never straddle
 *   one); chunk c belongs to class c mod QK_CLASSES.
 * - Within a chunk, lane t of a quad holds a quarter of every group's codes
 *   in a fixed layout (qk_xk, qk_words); a group's dot is its mma steps in
 *   order from zero, and its xsum the same steps with A = ones.
 * - A class's partial p starts at 0 and takes, chunk by chunk in order and
 *   group by group, p = fma(s, dot, p), then p = fma(b, xsum, p).
 * - The 16 classes are four slices of four: out = ((q0 + q1) + q2) + q3
 *   with q = ((p0 + p1) + p2) + p3 over a slice's classes; then + bias.
 * Who computes which chunk is free as long as these sums are kept; the
 * launches below split the work three ways.
 *
 * Up to 16 rows (decode, verify), where x's rows fit in shared memory
 * beside the rings (int4, groups of 64: up to 11 rows at K = 4096, 4 at
 * K = 12288), the streaming kernel (quant_stream_kernel): one
 * persistent block an SM of 16 warps, a warp a class. Block b takes the
 * 16-row tiles b, b + grid, ...; warp w streams its items (tile, chunk
 * w + 16 r) in order, tile after tile, through a private ring of one-chunk
 * slots, so its next tile's loads are in flight while a tile's 16 partials
 * are folded in shared memory (the contract's order). Why: the cluster
 * kernel below gives a warp K / 2048 chunks (2 at K = 4096), in blocks of
 * 4 warps that are mostly prologue, cluster barriers and epilogue, in
 * several short waves (two blocks an SM by shared memory): a burst of
 * requests a block, then none (Qwen3-8B's QKV of one row ran at ~0.3 TB/s
 * there). x is
 * rounded to bf16 once a block into shared memory, because a load issued
 * after an SM's weight requests comes back after them.
 *
 * Elsewhere up to 16 rows (x too large for that), the cluster kernel
 * (quant_mma_kernel, narrow): a cluster of QK_SLICES blocks of 4 warps (a
 * warp a class) over T 16-row tiles; K is split over four SMs, so that
 * each reads a quarter of x (as many bytes as its weights at 8 rows of
 * int4; without the split x is 4x the weights' bytes and from L2), and
 * the four slices' partials meet through distributed shared memory. Past
 * 16 rows the same kernel, wide: a small kernel first makes x's bf16
 * fragments and xsums once for all blocks (quant_xprep_kernel: the same
 * ones-mma, the same bits) and a block takes 32 rows.
 *
 * Loads: a warp streams its tiles' chunk (16 bytes a lane and row,
 * cp.async, no L1) and their (scale, bias) pairs through a ring of stages
 * in shared memory, the first requested before the kernel waits for the
 * one before it (weights do not depend on it). Layout changes across a
 * quad (which lane holds which group's codes) are the shared-memory
 * addresses the lanes read, padded so that no read conflicts. The cluster
 * kernel's narrow launch loads x per chunk from global memory (L1) and
 * rounds it to bf16 in the fragment layout. Every kernel computes a chunk
 * through qk_chunk: the same products in the same order.
 *
 * Relative to the CPU backend (an fp32 weight holding fma(code, s, b)) the
 * sums differ in order and in where s and b are applied: not bit-identical,
 * within a few fp32 roundings of the sums (test_cuda_quant's bound).
 *
 * Elsewhere (no Hopper, fp32 / f16 scales, the fp32-x build) the CUDA-core
 * kernel below: matmul.cu's narrow kernel with a dequantizing load
 * (quant_load.cuh), the bits of matmul.cu's fp32-weight kernel over the
 * dequantized weights, at any row count; slow (each 8 rows of x read the
 * weights again). The fused ops never take a quantized weight (ds_cu_mma_eligible,
 * wide_bf16 refuse them): they fall back to their unfused sequences through
 * ds_cu_linear, which routes here. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/matmul_mma_frag.cuh"
#include "backend/cuda/quant_load.cuh"

namespace cg = cooperative_groups;

/* ---- the CUDA-core kernel (any device, any scale dtype) ------------------ */

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

/* ---- the tensor-core kernel (Hopper, bf16 scales, DS_X_BF16) -------------- */

#define QK_CHUNK 128                        /* k a chunk */
#define QK_CLASSES 16                       /* chunk classes (the contract) */
#define QK_SLICES 4                         /* blocks a cluster, a slice of QK_CLASSES / QK_SLICES classes each */
#define QK_WARPS (QK_CLASSES / QK_SLICES)   /* warps a block: one a class */
#define QK_THREADS (QK_WARPS * 32)
#define QK_STAGES 3                         /* a warp's ring: two stages land while one is computed */
#define QK_NARROW_M 16                      /* rows the narrow launch takes (two 8-row tiles of x) */
#define QK_WIDE_MT 4                        /* 8-row x tiles a wide block takes (32 rows) */
#define QK_WIDE_T 1                         /* 16-row weight tiles a wide warp takes (2 spills registers) */
/* Weight tiles a warp takes (narrow): more share each chunk's x (at 8 rows
 * of x, int4 x4 reads as many bytes of x as of weights); fewer where the
 * grid would leave SMs without a block. int8 tiles are twice the bytes. */
#define QK_T4 4
#define QK_T8 2

/* Per bits and groups a chunk (P = 128 / group): shared-memory bytes of a
 * row's chunk (padded so that the lanes' reads of qk_words hit 32 banks),
 * bytes of its (scale, bias) pairs, and mma steps (16 k) a group. */
template <int BITS, int P> struct qk_geo {
    static constexpr int RS = BITS == 4 ? (P == 1 ? 64 : P == 2 ? 96 : 80) : (P == 4 ? 160 : 192);
    static constexpr int SBB = 4 * P;
    static constexpr int SPG = 8 / P;
    __host__ __device__ static constexpr int stage(int T) { return T * 16 * (RS + SBB); }
};

struct qk_args {
    float *out;
    int64_t os;
    const float *x; /* narrow: x itself */
    int64_t xs;
    int xvec;              /* x's rows are 16-byte aligned */
    const uint4 *xb;       /* wide: x as bf16 fragments [chunk][x tile][unit][lane] (quant_xprep_kernel) */
    const float *xsum;     /* wide: [x tile][group][8] */
    int xt;                /* wide: x tiles in xb */
    const uint32_t *w;     /* packed words, ws a row */
    int64_t ws;
    const uint32_t *sb;    /* (scale, bias) bf16 pairs, gp a row */
    int64_t gp;
    const void *bias;
    int bdt;
    int M, N, K, chunks, groups, group;
};

template <int B> __device__ __forceinline__ void qk_cp_small(void *dst, const void *src) {
    if (B == 16) ds_cu_cp16(dst, src);
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                     "l"(src), "n"(B)
                     : "memory");
}

#define QK_ONES 0x3f803f80u /* bf16 (1, 1) */

/* int4 codes (v & 0xf, v >> 16 & 0xf) as a bf16 pair: 128 + code by
 * placing the code in the mantissa of 128, then 1 * that - 128 (exact). */
__device__ __forceinline__ uint32_t qk_dq4(uint32_t v) {
    const uint32_t r = (v & 0x000f000fu) | 0x43004300u;
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(r), "r"(0x3f803f80u), "r"(0xc300c300u));
    return d;
}
/* int8 codes j, j + 1 of v as a bf16 pair: 2^23 + code in fp32 (the byte
 * as its mantissa) minus 2^23 is the code, whose fp32 upper half is its
 * bf16 (at most 8 significant bits). */
__device__ __forceinline__ uint32_t qk_dq8(uint32_t v, int j) {
    const float a = __fsub_rn(__uint_as_float(__byte_perm(v, 0x4b000000u, 0x7650 + j)), 8388608.0f);
    const float b = __fsub_rn(__uint_as_float(__byte_perm(v, 0x4b000000u, 0x7651 + j)), 8388608.0f);
    return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}

__device__ __forceinline__ uint32_t qk_bf2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* The fragment layout. A chunk is 8 mma steps of 16 k; unit u (0..3) is
 * steps 2u and 2u + 1, which for lane t of a quad hold 8 consecutive k of
 * x from qk_xk(u, t) on (chunk-relative), and the codes of the same k of
 * the lane's two weight rows. Lane t reads its 16 bytes of a row's chunk
 * (16 t on; int8: and 64 + 16 t) as cp.async left them, so these are where
 * those bytes sit after the exchange qk_words reads: int4 word p of lane t
 * (8 codes, steps 2p, 2p + 1) is word w of lane src's 16 bytes; int8 step s
 * (4 codes) is half s / 4's word w of lane src. Groups a chunk P: P = 1
 * keeps lane t's own bytes; P = 2 and 4 give every lane group/4 codes of
 * each group (an mma step then lies in one group). */
template <int BITS, int P> __device__ __forceinline__ int qk_xk(int u, int t) {
    if (BITS == 4) {
        if (P == 1) return 32 * t + 8 * u;
        if (P == 2) return 32 * (u < 2 ? (t & 1) : (t | 2)) + 8 * ((u & 1) + 2 * (t >> 1));
        return 32 * u + 8 * t;
    }
    if (P == 4) return 64 * (u >> 1) + 16 * ((u & 1) ? (t | 2) : (t & 1)) + 8 * (t >> 1);
    return 64 * (u >> 1) + 16 * t + 8 * (u & 1);
}

/* Group gi's words of one row's chunk R (shared memory) for lane t, in step order. */
template <int BITS, int P>
__device__ __forceinline__ void qk_words(const unsigned char *R, int gi, int t, uint32_t *wv) {
    if (BITS == 4 && P == 1) {
        const uint4 v = *(const uint4 *)(R + 16 * t);
        wv[0] = v.x, wv[1] = v.y, wv[2] = v.z, wv[3] = v.w;
    } else if (BITS == 4 && P == 2) {
        const uint2 v = *(const uint2 *)(R + 16 * (gi ? (t | 2) : (t & 1)) + 8 * (t >> 1));
        wv[0] = v.x, wv[1] = v.y;
    } else if (BITS == 4) {
        wv[0] = *(const uint32_t *)(R + 16 * gi + 4 * t);
    } else if (P == 1) {
        const uint4 a = *(const uint4 *)(R + 16 * t), b = *(const uint4 *)(R + 64 + 16 * t);
        wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w, wv[4] = b.x, wv[5] = b.y, wv[6] = b.z, wv[7] = b.w;
    } else if (P == 2) {
        const uint4 a = *(const uint4 *)(R + 64 * gi + 16 * t);
        wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w;
    } else {
        const uint2 v = *(const uint2 *)(R + 64 * (gi >> 1) + 16 * ((gi & 1) ? (t | 2) : (t & 1)) + 8 * (t >> 1));
        wv[0] = v.x, wv[1] = v.y;
    }
}

/* A operand of local step ls of a group from its words: (a0 / a2) for one row. */
template <int BITS>
__device__ __forceinline__ void qk_a(const uint32_t *wv, int ls, uint32_t *lo, uint32_t *hi) {
    if (BITS == 4) { /* codes (n_2h, n_2h+4) and (n_2h+1, n_2h+5) of word ls / 2, h = ls & 1 */
        const uint32_t v = wv[ls >> 1] >> (8 * (ls & 1));
        *lo = qk_dq4(v), *hi = qk_dq4(v >> 4);
    } else { /* codes (c0, c1) and (c2, c3) of word ls */
        *lo = qk_dq8(wv[ls], 0), *hi = qk_dq8(wv[ls], 2);
    }
}

/* x row `row` (zeros past M) of chunk c as B fragments: B[2 s], B[2 s + 1] are
 * step s's b0, b1 (the same k as qk_a's lo / hi), rounded to bf16; units of
 * groups past K (a last, partial chunk) are zeros. */
template <int BITS, int P>
__device__ __forceinline__ void qk_x_frag(const qk_args &a, int row, int c, int nvalid, int t, uint32_t B[16]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        float f[8];
        if (row < a.M && u * P / 4 < nvalid) {
            const float *p = a.x + (int64_t)row * a.xs + (int64_t)c * QK_CHUNK + qk_xk<BITS, P>(u, t);
            if (a.xvec) {
                ds_cu_unpack_f32x8(__ldg((const float4 *)p), __ldg((const float4 *)p + 1), f);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] = __ldg(p + i);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = 0.0f;
        }
        if (BITS == 4) { /* pairs (k, k + 4): the int4 word's codes (n_j, n_j+4) */
            B[4 * u] = qk_bf2(f[0], f[4]), B[4 * u + 1] = qk_bf2(f[1], f[5]);
            B[4 * u + 2] = qk_bf2(f[2], f[6]), B[4 * u + 3] = qk_bf2(f[3], f[7]);
        } else {
            B[4 * u] = qk_bf2(f[0], f[1]), B[4 * u + 1] = qk_bf2(f[2], f[3]);
            B[4 * u + 2] = qk_bf2(f[4], f[5]), B[4 * u + 3] = qk_bf2(f[6], f[7]);
        }
    }
}

/* Group gi's xsum: its steps with A = ones, in order from zero. */
template <int P> __device__ __forceinline__ void qk_xsum(const uint32_t B[16], int gi, float cx[4]) {
    constexpr int SPG = 8 / P;
    cx[0] = cx[1] = cx[2] = cx[3] = 0.0f;
#pragma unroll
    for (int ls = 0; ls < SPG; ls++) {
        const int s = gi * SPG + ls;
        mma_bf16(cx, QK_ONES, QK_ONES, QK_ONES, QK_ONES, B[2 * s], B[2 * s + 1]);
    }
}

/* Issues the copies of chunk c of a warp's T tiles (rows n_base ..) into stage S. */
template <int BITS, int P, int T>
__device__ __forceinline__ void qk_issue(const qk_args &a, unsigned char *S, int n_base, int c, int lane) {
    using Q = qk_geo<BITS, P>;
    const int g = lane >> 2, t = lane & 3;
    const unsigned char *wb = (const unsigned char *)a.w;
    const int64_t rowb = a.ws * 4;
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = 16 * i + 8 * hr + g, n = n_base + r;
            if (n >= a.N) continue; /* rows past N: stale data, outputs never stored */
            const unsigned char *src = wb + (int64_t)n * rowb + (int64_t)c * (QK_CHUNK * BITS / 8);
            unsigned char *dst = S + r * Q::RS;
            if (BITS == 4) {
                if (c * QK_CHUNK + 32 * t < a.K) ds_cu_cp16(dst + 16 * t, src + 16 * t);
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if (c * QK_CHUNK + 64 * h + 16 * t < a.K) ds_cu_cp16(dst + 64 * h + 16 * t, src + 64 * h + 16 * t);
            }
        }
    unsigned char *sbd = S + T * 16 * Q::RS;
    for (int r = lane; r < 16 * T; r += 32) {
        const int n = n_base + r;
        if (n < a.N) qk_cp_small<Q::SBB>(sbd + r * Q::SBB, a.sb + (int64_t)n * a.gp + (int64_t)c * P);
    }
}

/* Chunk c's products into acc (the contract's step): group by group in order, its dot (mma steps from zero) and
 * xsum, then acc = fma(s, dot, acc), acc = fma(b, xsum, acc). S: the chunk's stage (T tiles' rows, then their
 * pairs). Narrow: B, the chunk's x fragments, one set an x tile. Wide: fragments and xsums of x tiles xt0 ..
 * from quant_xprep_kernel's buffers, a unit at a time. Both kernels call this: the same sums. */
template <int BITS, int P, int MT, int T, bool WIDE>
__device__ __forceinline__ void qk_chunk(const qk_args &a, const unsigned char *S, int c, int nvalid,
                                         const uint32_t (&B)[WIDE ? 1 : MT][16], int xt0, int lane,
                                         float (&acc)[T][MT][4]) {
    using Q = qk_geo<BITS, P>;
    constexpr int SPG = Q::SPG, WPG = (BITS == 4 ? 4 : 8) / P;
    const int g = lane >> 2, t = lane & 3;
    const unsigned char *SB = S + T * 16 * Q::RS;
#pragma unroll
    for (int gi = 0; gi < P; gi++) {
        if (gi >= nvalid) break;
        float cx[MT][4];
#pragma unroll
        for (int j = 0; j < MT; j++) {
            if (WIDE) {
                const float2 v = __ldg((const float2 *)(a.xsum +
                                                        (((int64_t)xt0 + j) * a.groups +
                                                         (int64_t)c * P + gi) * 8 + 2 * t));
                cx[j][0] = v.x, cx[j][1] = v.y;
            } else {
                qk_xsum<P>(B[WIDE ? 0 : j], gi, cx[j]);
            }
        }
#pragma unroll
        for (int i = 0; i < T; i++) {
            uint32_t wa[WPG], wb[WPG];
            qk_words<BITS, P>(S + (16 * i + g) * Q::RS, gi, t, wa);
            qk_words<BITS, P>(S + (16 * i + g + 8) * Q::RS, gi, t, wb);
            const uint32_t pa = *(const uint32_t *)(SB + (16 * i + g) * Q::SBB + 4 * gi);
            const uint32_t pb = *(const uint32_t *)(SB + (16 * i + g + 8) * Q::SBB + 4 * gi);
            float cc[MT][4];
#pragma unroll
            for (int j = 0; j < MT; j++) cc[j][0] = cc[j][1] = cc[j][2] = cc[j][3] = 0.0f;
            uint4 bu[WIDE ? MT : 1];
#pragma unroll
            for (int ls = 0; ls < SPG; ls++) {
                const int s = gi * SPG + ls;
                if (WIDE && !(ls & 1)) /* unit s / 2 (a group is whole units) */
#pragma unroll
                    for (int j = 0; j < MT; j++)
                        bu[WIDE ? j : 0] = __ldg(
                            a.xb + (((int64_t)c * a.xt + xt0 + j) * 4 + (s >> 1)) * 32 + lane);
                uint32_t a0, a1, a2, a3;
                qk_a<BITS>(wa, ls, &a0, &a2);
                qk_a<BITS>(wb, ls, &a1, &a3);
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    const uint4 &u = bu[WIDE ? j : 0];
                    const uint32_t b0 = WIDE ? ((s & 1) ? u.z : u.x) : B[WIDE ? 0 : j][2 * s];
                    const uint32_t b1 = WIDE ? ((s & 1) ? u.w : u.y) : B[WIDE ? 0 : j][2 * s + 1];
                    mma_bf16(cc[j], a0, a1, a2, a3, b0, b1);
                }
            }
            const float sa = __uint_as_float(pa << 16), ba = __uint_as_float(pa & 0xffff0000u);
            const float sb = __uint_as_float(pb << 16), bb = __uint_as_float(pb & 0xffff0000u);
#pragma unroll
            for (int j = 0; j < MT; j++) { /* rows g (e 0, 1) and g + 8 (e 2, 3); x rows 2t, 2t + 1 */
                acc[i][j][0] = __fmaf_rn(ba, cx[j][0], __fmaf_rn(sa, cc[j][0], acc[i][j][0]));
                acc[i][j][1] = __fmaf_rn(ba, cx[j][1], __fmaf_rn(sa, cc[j][1], acc[i][j][1]));
                acc[i][j][2] = __fmaf_rn(bb, cx[j][0], __fmaf_rn(sb, cc[j][2], acc[i][j][2]));
                acc[i][j][3] = __fmaf_rn(bb, cx[j][1], __fmaf_rn(sb, cc[j][3], acc[i][j][3]));
            }
        }
    }
}

/* out (+ bias) for MT x tiles of 8 rows (from blockIdx.y * 8 MT) and QK_SLICES blocks of T 16-row weight tiles
 * each (the cluster, from (blockIdx.x / QK_SLICES) * 16 T); block rank s takes classes 4 s .. 4 s + 3. */
template <int BITS, int P, int MT, int T, bool WIDE>
__global__ void __launch_bounds__(QK_THREADS, 4) quant_mma_kernel(qk_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Q = qk_geo<BITS, P>;
    constexpr int STAGE = Q::stage(T);
    extern __shared__ __align__(16) unsigned char qk_smem[];
    cg::cluster_group cl = cg::this_cluster();
    const int slice = (int)cl.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int cls = slice * QK_WARPS + warp;
    const int n_base = (int)(blockIdx.x / QK_SLICES) * T * 16, m0 = blockIdx.y * MT * 8;
    const int items = cls < a.chunks ? (a.chunks - cls + QK_CLASSES - 1) / QK_CLASSES : 0;
    unsigned char *ring = qk_smem + warp * QK_STAGES * STAGE;

    /* The weights first (they do not depend on the kernel before), then the wait. */
#pragma unroll
    for (int s = 0; s < QK_STAGES; s++) {
        if (s < items) qk_issue<BITS, P, T>(a, ring + s * STAGE, n_base, cls + s * QK_CLASSES, lane);
        ds_cu_cp_commit(); /* (empty groups keep the wait counts uniform) */
    }
    ds_cu_grid_wait();

    float acc[T][MT][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    for (int it = 0; it < items; it++) {
        const int c = cls + it * QK_CLASSES;
        const int nvalid = min(P, (a.K - c * QK_CHUNK) / a.group);
        /* Narrow: the chunk's B fragments, converted here (their loads in flight with the stage's). Wide: a unit's
         * at a time from xb (below). */
        uint32_t B[WIDE ? 1 : MT][16];
        if (!WIDE)
#pragma unroll
            for (int j = 0; j < MT; j++) qk_x_frag<BITS, P>(a, m0 + 8 * j + g, c, nvalid, t, B[j]);
        ds_cu_cp_wait<QK_STAGES - 1>();
        __syncwarp(); /* every lane's copies of this stage landed */
        qk_chunk<BITS, P, MT, T, WIDE>(a, ring + (it % QK_STAGES) * STAGE, c, nvalid, B, blockIdx.y * MT, lane, acc);
        __syncwarp(); /* every lane is done with the stage before it is refilled */
        if (it + QK_STAGES < items)
            qk_issue<BITS, P, T>(a, ring + (it % QK_STAGES) * STAGE, n_base, c + QK_STAGES * QK_CLASSES, lane);
        ds_cu_cp_commit();
    }
    ds_cu_cp_wait<0>();
    __syncthreads(); /* every warp is done with its ring: the partials take its memory */

    /* The slice: the block's four classes in order, then the four slices in order over the cluster. */
    constexpr int E = T * MT * 128; /* a warp's partials: [T][MT][4][lane] */
    float *red = (float *)qk_smem;
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp * E + ((i * MT + j) * 4 + e) * 32 + lane] = acc[i][j][e];
    __syncthreads();
    for (int idx = threadIdx.x; idx < E; idx += QK_THREADS) {
        float v = red[idx];
#pragma unroll
        for (int w = 1; w < QK_WARPS; w++) v = __fadd_rn(v, red[w * E + idx]);
        red[idx] = v;
    }
    cl.sync();
    constexpr int QE = E / QK_SLICES; /* block rank s finishes outputs [s QE, (s + 1) QE) */
    for (int idx = slice * QE + threadIdx.x; idx < (slice + 1) * QE; idx += QK_THREADS) {
        float v = *cl.map_shared_rank(red + idx, 0);
#pragma unroll
        for (int s = 1; s < QK_SLICES; s++) v = __fadd_rn(v, *cl.map_shared_rank(red + idx, s));
        const int l = idx & 31, e = (idx >> 5) & 3, ij = idx >> 7, i = ij / MT, j = ij % MT;
        const int n = n_base + 16 * i + (l >> 2) + 8 * (e >> 1), m = m0 + 8 * j + 2 * (l & 3) + (e & 1);
        if (n < a.N && m < a.M) {
            if (a.bias) v = __fadd_rn(v, ds_cu_load(a.bias, a.bdt, n));
            a.out[(int64_t)m * a.os + n] = v;
        }
    }
    cl.sync(); /* no block leaves while the others read its partials */
#else
    __trap(); /* (never launched: qk_ok wants code built for sm_90) */
#endif
}

/* ---- the streaming narrow kernel (up to QK_NARROW_M rows, x staged in shared memory) ----
 *
 * One block an SM (persistent), one warp a class: warp w computes class w's partial of the block's tiles (tiles
 * b, b + grid, b + 2 grid, ... of 16 weight rows), and the 16 partials of a tile meet in shared memory, where the
 * contract's fold gives the output. Each warp streams its own items, (tile, chunk w + 16 r) for r = 0 .. in
 * order and tile after tile, through a private ring of QS_SLOTS(BITS) one-chunk slots, so that its next tile's
 * loads are in flight while a tile is folded: the ring never drains between tiles. x is rounded to bf16 once a
 * block into shared memory (the bits qk_x_frag makes), so that no x load waits behind the SM's weight stream
 * (a load issued after the ring's requests returns after them). */
#define QS_THREADS (QK_CLASSES * 32)          /* a warp a class */
#define QS_SLOTS(BITS) ((BITS) == 4 ? 4 : 3)  /* a warp's ring: 3 KB (int4) / 4 KB (int8) of weights in flight */
#define QS_XPAD 8                             /* bf16 past a staged x row (16 bytes: rows start in other banks) */
#define QS_SMEM_1ROW (200 * 1024)             /* at one row, as matmul_ring: room for a small kernel beside */

/* Shared memory of the streaming kernel: the rings, the fold's two buffers (tile parity), x's rows. */
template <int BITS, int P, int MT> static constexpr int qs_fixed_smem() {
    return QK_CLASSES * QS_SLOTS(BITS) * qk_geo<BITS, P>::stage(1) + 2 * QK_CLASSES * MT * 128 * (int)sizeof(float);
}
static inline size_t qs_x_smem(int64_t M, int64_t K) { return (size_t)(M * (K + QS_XPAD)) * 2; }

/* qk_x_frag's fragments from x staged as bf16 (row m at xs + m * xp): each value is rounded once either way, so
 * the same bits; int4 pairs (k, k + 4) are the halves of two staged pairs. */
template <int BITS, int P>
__device__ __forceinline__ void qs_x_frag(const __nv_bfloat16 *xs, int xp, int M, int row, int c, int nvalid, int t,
                                          uint32_t B[16]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        if (row < M && u * P / 4 < nvalid) {
            const uint4 v = *(const uint4 *)(xs + (int64_t)row * xp + c * QK_CHUNK + qk_xk<BITS, P>(u, t));
            if (BITS == 4) { /* v = (k0, k1), (k2, k3), (k4, k5), (k6, k7) */
                B[4 * u] = __byte_perm(v.x, v.z, 0x5410), B[4 * u + 1] = __byte_perm(v.x, v.z, 0x7632);
                B[4 * u + 2] = __byte_perm(v.y, v.w, 0x5410), B[4 * u + 3] = __byte_perm(v.y, v.w, 0x7632);
            } else {
                B[4 * u] = v.x, B[4 * u + 1] = v.y, B[4 * u + 2] = v.z, B[4 * u + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) B[4 * u + i] = 0u;
        }
    }
}

/* x's M rows as bf16 pairs into xs: every thread's loads issued before its first store (one round trip). */
__device__ __forceinline__ void qs_stage_x(const qk_args &a, __nv_bfloat16 *xs, int xp) {
    constexpr int XB = 8; /* float4 loads a thread has in flight */
    const int q = a.K / 4, nq = a.M * q;
    for (int base = threadIdx.x; base < nq; base += QS_THREADS * XB) {
        float4 f[XB];
#pragma unroll
        for (int u = 0; u < XB; u++) {
            const int i = base + u * QS_THREADS;
            if (i >= nq) break;
            const float *p = a.x + (int64_t)(i / q) * a.xs + (int64_t)(i % q) * 4;
            f[u] = a.xvec ? __ldg((const float4 *)p) : make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
        }
#pragma unroll
        for (int u = 0; u < XB; u++) {
            const int i = base + u * QS_THREADS;
            if (i >= nq) break;
            *(uint2 *)(xs + (int64_t)(i / q) * xp + (i % q) * 4) =
                make_uint2(qk_bf2(f[u].x, f[u].y), qk_bf2(f[u].z, f[u].w));
        }
    }
}

/* out (+ bias) for x rows 0 .. M - 1 (MT tiles of 8): see the section's comment. */
template <int BITS, int P, int MT>
__global__ void __launch_bounds__(QS_THREADS, 1) quant_stream_kernel(qk_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int NS = QS_SLOTS(BITS), SLOT = qk_geo<BITS, P>::stage(1), E = MT * 128; /* E: a tile's partials */
    extern __shared__ __align__(16) unsigned char qk_smem[];
    const int lane = threadIdx.x & 31, cls = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    unsigned char *ring = qk_smem + cls * NS * SLOT;
    float *red = (float *)(qk_smem + QK_CLASSES * NS * SLOT); /* [tile parity][class][E] */
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(red + 2 * QK_CLASSES * E);
    const int xp = a.K + QS_XPAD;
    const int tiles = (a.N + 15) / 16, grid = (int)gridDim.x, tb = (int)blockIdx.x;
    const int my_tiles = (tiles - tb + grid - 1) / grid;
    const int nr = cls < a.chunks ? (a.chunks - cls + QK_CLASSES - 1) / QK_CLASSES : 0; /* items a tile */
    const int items = my_tiles * nr;
    /* Item i: the block's tile i / nr, chunk cls + 16 (i % nr). */
    auto issue = [&](int i, unsigned char *S) {
        qk_issue<BITS, P, 1>(a, S, (tb + i / nr * grid) * 16, cls + i % nr * QK_CLASSES, lane);
    };

    /* The weights first (they do not depend on the kernel before), then the wait, then x. */
#pragma unroll
    for (int s = 0; s < NS; s++) {
        if (s < items) issue(s, ring + s * SLOT);
        ds_cu_cp_commit(); /* (empty groups keep the wait counts uniform) */
    }
    ds_cu_grid_wait();
    qs_stage_x(a, xs, xp);
    __syncthreads();

    int it = 0;
    for (int ti = 0; ti < my_tiles; ti++) {
        float acc[1][MT][4];
#pragma unroll
        for (int j = 0; j < MT; j++) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
        for (int r = 0; r < nr; r++, it++) {
            const int c = cls + r * QK_CLASSES;
            const int nvalid = min(P, (a.K - c * QK_CHUNK) / a.group);
            uint32_t B[MT][16];
#pragma unroll
            for (int j = 0; j < MT; j++) qs_x_frag<BITS, P>(xs, xp, a.M, 8 * j + g, c, nvalid, t, B[j]);
            ds_cu_cp_wait<NS - 1>();
            __syncwarp(); /* every lane's copies of this slot landed */
            qk_chunk<BITS, P, MT, 1, false>(a, ring + (it % NS) * SLOT, c, nvalid, B, 0, lane, acc);
            __syncwarp(); /* every lane is done with the slot before it is refilled */
            if (it + NS < items) issue(it + NS, ring + (it % NS) * SLOT);
            ds_cu_cp_commit();
        }
        /* The fold: ((p0 + p1) + p2) + p3 a slice, the slices likewise, then the bias. Two buffers by tile
         * parity: a warp writing tile ti + 2's partials has passed tile ti + 1's barrier, after every fold of ti. */
        float *rb = red + (ti & 1) * QK_CLASSES * E;
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) rb[cls * E + (j * 4 + e) * 32 + lane] = acc[0][j][e];
        __syncthreads();
        const int n_base = (tb + ti * grid) * 16;
        for (int idx = threadIdx.x; idx < E; idx += QS_THREADS) {
            float v = 0.0f;
#pragma unroll
            for (int s = 0; s < QK_SLICES; s++) {
                const float *p = rb + 4 * s * E + idx;
                const float q = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[E]), p[2 * E]), p[3 * E]);
                v = s ? __fadd_rn(v, q) : q;
            }
            const int l = idx & 31, e = (idx >> 5) & 3, j = idx >> 7;
            const int n = n_base + (l >> 2) + 8 * (e >> 1), m = 8 * j + 2 * (l & 3) + (e & 1);
            if (n < a.N && m < a.M) {
                if (a.bias) v = __fadd_rn(v, ds_cu_load(a.bias, a.bdt, n));
                a.out[(int64_t)m * a.os + n] = v;
            }
        }
    }
    ds_cu_cp_wait<0>();
#else
    __trap(); /* (never launched: qk_ok wants code built for sm_90) */
#endif
}

/* Wide calls: x as B fragments and the groups' xsums, once for every block
 * (qk_x_frag and qk_xsum: the bits the narrow kernel makes itself). Block
 * (c, b): chunk c, x tiles 4 b .. 4 b + 3 (a warp each). */
template <int BITS, int P>
__global__ void __launch_bounds__(128) quant_xprep_kernel(qk_args a, uint4 *xb, float *xsum) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    ds_cu_grid_wait();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int c = blockIdx.x, jt = blockIdx.y * 4 + (threadIdx.x >> 5);
    const int nvalid = min(P, (a.K - c * QK_CHUNK) / a.group);
    uint32_t B[16];
    qk_x_frag<BITS, P>(a, 8 * jt + g, c, nvalid, t, B);
#pragma unroll
    for (int u = 0; u < 4; u++)
        xb[(((int64_t)c * a.xt + jt) * 4 + u) * 32 + lane] =
            make_uint4(B[4 * u], B[4 * u + 1], B[4 * u + 2], B[4 * u + 3]);
#pragma unroll
    for (int gi = 0; gi < P; gi++) {
        if (gi >= nvalid) break;
        float cx[4];
        qk_xsum<P>(B, gi, cx);
        if (g == 0) {
            float *d = xsum + ((int64_t)jt * a.groups + (int64_t)c * P + gi) * 8 + 2 * t;
            d[0] = cx[0], d[1] = cx[1];
        }
    }
#else
    __trap();
#endif
}

/* A launch with programmatic dependent launch (as ds_cu_launch) and clusters of QK_SLICES blocks. */
template <typename... Pm, typename... A>
static void qk_launch(void (*kernel)(Pm...), dim3 grid, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(QK_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = QK_SLICES;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...); /* errors surface in ds_cu_launched() */
}

template <int BITS, int P, int MT, int T, bool WIDE>
static void qk_start(ds_cuda_backend *cb, const char *op, const qk_args &a, unsigned gy) {
    using Q = qk_geo<BITS, P>;
    static ds_cu_smem_allowed allowed;
    const int ring = QK_WARPS * QK_STAGES * Q::stage(T), red = QK_WARPS * T * MT * 128 * (int)sizeof(float);
    const int smem = ring > red ? ring : red;
    auto kernel = quant_mma_kernel<BITS, P, MT, T, WIDE>;
    if (!ds_cu_allow_smem(cb, op, kernel, &allowed, (size_t)smem)) return;
    const int64_t tgroups = ((a.N + 15) / 16 + T - 1) / T;
    qk_launch(kernel, dim3((unsigned)(tgroups * QK_SLICES), gy), (size_t)smem, cb->stream, a);
    ds_cu_launched(cb, op);
}

template <int BITS, int P, int MT>
static void qs_start(ds_cuda_backend *cb, const char *op, const qk_args &a, int smem) {
    static ds_cu_smem_allowed allowed;
    auto kernel = quant_stream_kernel<BITS, P, MT>;
    if (!ds_cu_allow_smem(cb, op, kernel, &allowed, (size_t)smem)) return;
    const int tiles = (a.N + 15) / 16, grid = tiles < cb->sms ? tiles : cb->sms;
    ds_cu_launch_smem(kernel, dim3((unsigned)grid), dim3(QS_THREADS), (size_t)smem, cb->stream, a);
    ds_cu_launched(cb, op);
}

/* The most dynamic shared memory a streaming block may have on this device (asked once: every Hopper says 227 KB). */
static int64_t qs_smem_max(const ds_cuda_backend *cb, int64_t M) {
    static int optin = -1;
    if (optin < 0 && cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cb->device) != cudaSuccess)
        optin = 0;
    return M == 1 && optin > QS_SMEM_1ROW ? QS_SMEM_1ROW : optin;
}

template <int BITS, int P>
static void qk_run(ds_cuda_backend *cb, const char *op, qk_args &a) {
    const int64_t M = a.M, tiles = (a.N + 15) / 16;
    if (M <= QK_NARROW_M) {
        /* The streaming kernel where x's rows fit beside the rings; else the cluster kernel below (x from
         * global memory, split over the cluster). The same bits either way. */
        const bool mt1 = M <= 8;
        const int64_t smem =
            (mt1 ? qs_fixed_smem<BITS, P, 1>() : qs_fixed_smem<BITS, P, 2>()) + (int64_t)qs_x_smem(M, a.K);
        if (smem <= qs_smem_max(cb, M)) {
            if (mt1) qs_start<BITS, P, 1>(cb, op, a, (int)smem);
            else qs_start<BITS, P, 2>(cb, op, a, (int)smem);
            return;
        }
        /* The largest T that still gives 1.5 blocks an SM (bits do not depend on T). */
        constexpr int TM = BITS == 4 ? QK_T4 : QK_T8;
        const int64_t want = (int64_t)cb->sms * 3 / 2;
        const int tw = (tiles + TM - 1) / TM * QK_SLICES >= want ? TM
                       : TM > 2 && (tiles + 1) / 2 * QK_SLICES >= want ? 2
                                                                        : 1;
        if (M <= 8) {
            if (tw == TM) qk_start<BITS, P, 1, TM, false>(cb, op, a, 1);
            else if (tw == 2) qk_start<BITS, P, 1, 2, false>(cb, op, a, 1);
            else qk_start<BITS, P, 1, 1, false>(cb, op, a, 1);
        } else { /* (two x tiles and four weight tiles a warp spill registers) */
            if (tw >= 2) qk_start<BITS, P, 2, 2, false>(cb, op, a, 1);
            else qk_start<BITS, P, 2, 1, false>(cb, op, a, 1);
        }
        return;
    }
    /* Wide: x's fragments and xsums for 32-row slabs, then one launch over them. */
    const int64_t slabs = (M + 8 * QK_WIDE_MT - 1) / (8 * QK_WIDE_MT), xt = slabs * QK_WIDE_MT;
    if (slabs > 65535) {
        ds_cu_fail(cb, op, "quantized linear of %lld rows: more than %d row slabs", (long long)M, 65535);
        return;
    }
    const size_t xb_bytes = (size_t)(a.chunks * xt) * 4 * 32 * sizeof(uint4),
                 xs_bytes = (size_t)(xt * a.groups) * 8 * sizeof(float);
    char *buf = (char *)ds_cu_scratch(cb, op, xb_bytes + xs_bytes);
    if (!buf) return;
    a.xb = (const uint4 *)buf;
    a.xsum = (const float *)(buf + xb_bytes);
    a.xt = (int)xt;
    ds_cu_launch(quant_xprep_kernel<BITS, P>, dim3((unsigned)a.chunks, (unsigned)(xt / 4)), 128, cb->stream, a,
                 (uint4 *)buf, (float *)(buf + xb_bytes));
    if (!ds_cu_launched(cb, op)) return;
    qk_start<BITS, P, QK_WIDE_MT, QK_WIDE_T, true>(cb, op, a, (unsigned)slabs);
}

/* Whether this binary holds the tensor-core kernel for sm_90 (a build for older GPUs run on Hopper does not). */
static bool qk_built(void) {
    static int built = -1;
    if (built < 0) {
        cudaFuncAttributes fa;
        built = cudaFuncGetAttributes(&fa, quant_mma_kernel<4, 2, 1, 1, false>) == cudaSuccess && fa.ptxVersion >= 90;
    }
    return built == 1;
}

/* The tensor-core kernel takes w (and this device): bf16 scales under DS_X_BF16, Hopper, groups of 32 / 64 / 128. */
static bool qk_ok(const ds_cuda_backend *cb, ds_tensor w) {
    return DS_X_BF16_ON && cb->cc_major >= 9 && qk_built() && w.dtype == DS_BF16 && (w.q.bits == 4 || w.q.bits == 8) &&
           (w.q.group == 32 || w.q.group == 64 || w.q.group == 128) && w.cols % w.q.group == 0 &&
           (uintptr_t)w.data % 16 == 0 && (w.stride * 4) % 16 == 0 && (uintptr_t)w.q.scales % 16 == 0;
}

void ds_cu_linear_quant(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    const int64_t M = x.rows, N = w.rows, K = x.cols;
    if (M <= 0 || N <= 0) return;
    if (K % w.q.group || w.q.group % 32 || (w.q.bits != 4 && w.q.bits != 8) || M > 65535L * 8) {
        ds_cu_fail(cb, op, "quantized weight %lldx%lld: bits %d, group %d, %lld rows not supported", (long long)N,
                   (long long)K, w.q.bits, w.q.group, (long long)M);
        return;
    }
    if (qk_ok(cb, w)) {
        qk_args a = {};
        a.out = (float *)out.data;
        a.os = out.stride;
        a.x = (const float *)x.data;
        a.xs = x.stride;
        a.xvec = (uintptr_t)x.data % 16 == 0 && x.stride % 4 == 0;
        a.w = (const uint32_t *)w.data;
        a.ws = w.stride;
        a.sb = (const uint32_t *)w.q.scales;
        a.gp = ds_cu_q_pairs(K, w.q.group);
        a.bias = bias.data;
        a.bdt = (int)bias.dtype;
        a.M = (int)M, a.N = (int)N, a.K = (int)K;
        a.chunks = (int)((K + QK_CHUNK - 1) / QK_CHUNK);
        a.groups = (int)(K / w.q.group);
        a.group = w.q.group;
        const int P = QK_CHUNK / w.q.group;
        if (w.q.bits == 4) {
            if (P == 1) qk_run<4, 1>(cb, op, a);
            else if (P == 2) qk_run<4, 2>(cb, op, a);
            else qk_run<4, 4>(cb, op, a);
        } else {
            if (P == 1) qk_run<8, 1>(cb, op, a);
            else if (P == 2) qk_run<8, 2>(cb, op, a);
            else qk_run<8, 4>(cb, op, a);
        }
        return;
    }
    const ds_cu_qw q = ds_cu_qw_of(w);
    const bool xb = DS_X_BF16_ON && w.dtype == DS_BF16;
    if (w.q.bits == 4) launch_bits<4>(cb, xb, out, x, q, bias, (int)M, (int)N, (int)K);
    else launch_bits<8>(cb, xb, out, x, q, bias, (int)M, (int)N, (int)K);
    ds_cu_launched(cb, op);
}

/* The device layout (quant_load.cuh): the words, then (scale, bias) pairs, gp a row, interleaved here. */
ds_error *ds_cu_weight_quant(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (!cb->cfg.quant)
        return ds_errorf("tensor %s is quantized: quantized weights are off on the CUDA backend (DS_CUDA_QUANT=0)",
                         src->w->name);
    const int64_t words = cols * src->bits / 32, groups = cols / src->group, gp = ds_cu_q_pairs(cols, src->group);
    const size_t es = ds_dtype_size(src->scales->dtype), wb = (size_t)(rows * words) * 4,
                 sb = (size_t)(rows * groups) * es, pb = (size_t)(rows * gp) * 2 * es;
    if (src->w->nbytes != wb || src->scales->nbytes != sb || src->biases->nbytes != sb)
        return ds_errorf("tensor %s: %zu / %zu / %zu bytes of words / scales / biases, expected %zu / %zu / %zu",
                         src->w->name, src->w->nbytes, src->scales->nbytes, src->biases->nbytes, wb, sb, sb);
    char *pairs = (char *)calloc(1, pb);
    if (!pairs) return ds_errorf("tensor %s: cannot allocate %zu bytes", src->w->name, pb);
    for (int64_t n = 0; n < rows; n++)
        for (int64_t gi = 0; gi < groups; gi++) {
            char *d = pairs + (size_t)(n * gp + gi) * 2 * es;
            memcpy(d, (const char *)src->scales->data + (size_t)(n * groups + gi) * es, es);
            memcpy(d + es, (const char *)src->biases->data + (size_t)(n * groups + gi) * es, es);
        }
    const size_t p_off = (wb + 255) & ~(size_t)255;
    char *p = NULL;
    cudaError_t e = cudaMalloc((void **)&p, p_off + pb);
    if (e != cudaSuccess) {
        free(pairs);
        return ds_errorf("tensor %s: cannot allocate %zu bytes of device memory: %s", src->w->name, p_off + pb,
                         cudaGetErrorString(e));
    }
    /* On the stream, so that every later op sees the whole copy (a pageable source is staged before the call
     * returns, so pairs may be freed then). */
    e = cudaMemcpyAsync(p, src->w->data, wb, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(p + p_off, pairs, pb, cudaMemcpyHostToDevice, cb->stream);
    free(pairs);
    if (e != cudaSuccess) {
        cudaFree(p);
        return ds_errorf("tensor %s: cannot copy it to the device: %s", src->w->name, cudaGetErrorString(e));
    }
    *out = ds_tensor{src->scales->dtype, p, rows, cols, words, true,
                     {src->bits, src->group, p + p_off, p + p_off + es}};
    return NULL;
}
