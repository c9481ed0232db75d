/* What the two tensor-core narrow matmuls share (matmul_mma.cu: one block
 * per 16 weight rows, loads into registers; matmul_ring.cu: persistent
 * blocks, weights through a shared-memory ring): the mma fragments, the
 * hi/lo split of x, and the reduction order.
 *
 * The reduction order is the contract that keeps rows invariant: output
 * (n, m) is accumulated from weight row n and x row m only; warp w of
 * MMA_WARPS takes the 32-wide k chunks c = w, w + MMA_WARPS, w + 2 MMA_WARPS,
 * ... in increasing order, each chunk as two k16 steps (hi, then lo), and
 * the warps' partial sums are added in warp order (mma_store_rows). Both
 * kernels follow it exactly, so a row is bit-identical whichever kernel
 * computes it and however many rows share the call (test_cuda_matmul). The
 * arithmetic around the products is written with explicitly rounded
 * operations (__fmul_rn, __fsub_rn, ...): the compiler may not fuse a
 * multiply and an add into one FMA in one kernel and not in the other.
 * A fused RMSNorm (DS_X_BF16) multiplies bf16(x * w) and scales each row's
 * sums by its 1 / rms, whose sum of squares every path takes in the tile
 * order (ss_tile_add, slots_rs): the same bits in every kernel, the wide
 * path (linear_fused.cu) and the CPU (cpu_norm.c).
 *
 * Lane layout (PTX ISA, mma.m16n8k16 bf16): lane = 4g + t holds A elements
 * (rows g, g+8; k 2t, 2t+1, 2t+8, 2t+9) and B elements (k 2t, 2t+1, 2t+8,
 * 2t+9; column g). A dot product does not care which physical k sits at
 * which logical k as long as A and B agree, so lane t takes the 8
 * consecutive elements 8t..8t+7 of its chunk from each of its two weight
 * rows, and the same 8 elements of its x row. */
#ifndef DS_CUDA_MATMUL_MMA_FRAG_CUH
#define DS_CUDA_MATMUL_MMA_FRAG_CUH

#include <cuda_bf16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/matmul_mma_args.h"

#define MMA_ROWS 16 /* weight rows (outputs) per tile */
/* Warps splitting K (chunk c goes to warp c mod MMA_WARPS). Fixed for every
 * M, mode and kernel: it is part of the reduction order. */
#define MMA_WARPS 16

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* (a, b) -> bf16 pairs hi = bf16(a, b), lo = bf16(a - hi.a, b - hi.b); the
 * lower k sits in the low half, as in memory. DS_X_BF16: lo = 0. */
__device__ __forceinline__ void split_pair(float a, float b, uint32_t *hi, uint32_t *lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    *hi = *(const uint32_t *)&h;
#if DS_X_BF16_ON
    *lo = 0u;
#else
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(__fsub_rn(a, hf.x), __fsub_rn(b, hf.y));
    *lo = *(const uint32_t *)&l;
#endif
}

/* The squares of 8 values of x added to *ss in order (the fp32-x build's order of a fused norm's sums of squares). */
__device__ __forceinline__ void x_sum_squares(const float f[8], float *ss) {
#pragma unroll
    for (int i = 0; i < 8; i++) *ss = fmaf(f[i], f[i], *ss);
}

/* DS_X_BF16: a fused norm's sum of squares in the tile order, which a row's
 * 16-value tiles could leave behind where they are written (a residual
 * epilogue): tile j (x[16j .. 16j + 16)) sums the squares of its halves as
 * two trees, ((x0^2 + x1^2) + (x2^2 + x3^2)) + (...), each pair one fma, and
 * adds the halves; slot l of SS_SLOTS adds tiles l, l + 32, l + 64, ... in
 * order; the slots are added in a butterfly (16, 8, 4, 2, 1: slot l + off
 * into slot l), which slot 0 ends with. A narrow kernel's warp w of 16 owns
 * slots 2w and 2w + 1 (its chunks w, w + 16, ... hold tiles 2w, 2w + 1 mod
 * 32), its lanes t and t ^ 1 a tile's halves. The CPU: cpu_norm.c. */
#define SS_SLOTS 32 /* = a warp's lanes (slots_rs) */
__device__ __forceinline__ float sq_tree8(const float f[8]) {
    const float a = fmaf(f[1], f[1], __fmul_rn(f[0], f[0])), b = fmaf(f[3], f[3], __fmul_rn(f[2], f[2]));
    const float c = fmaf(f[5], f[5], __fmul_rn(f[4], f[4])), d = fmaf(f[7], f[7], __fmul_rn(f[6], f[6]));
    return __fadd_rn(__fadd_rn(a, b), __fadd_rn(c, d));
}
/* Lane t's 8 values and lane t ^ 1's (a tile's halves; every lane of the warp calls it): the tile's sum into *slot. */
__device__ __forceinline__ void ss_tile_add(const float f[8], float *slot) {
    const float v = sq_tree8(f);
    *slot = __fadd_rn(*slot, __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1)));
}
/* Row m's 1 / rms from its SS_SLOTS slots (slots[l * stride + m]), lane l taking slot l: every lane of a warp
 * calls it and gets the same value (lane l adds lane l ^ off's sum: slot l + off into slot l for l < off). */
__device__ __forceinline__ float slots_rs(const float *slots, int stride, int m, int K, float eps) {
    float v = slots[(threadIdx.x & 31) * stride + m];
#pragma unroll
    for (int lg = 4; lg >= 0; lg--) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1 << lg));
    return 1.0f / sqrtf(v / (float)K + eps);
}

/* 8 values of x row `row` as 4 hi and 4 lo pairs. NORM (rows < M only):
 * scaled by the RMSNorm weight's 8 values nf; the row's 1 / rms is applied
 * to the sums after the products (mma_store_rows). The fp32-x build also
 * adds their squares to *ss (x_sum_squares); DS_X_BF16 rounds x * nf to
 * bf16, and the kernels sum the squares in the tile order (ss_tile_add). */
template <bool NORM>
__device__ __forceinline__ void split_x8(float f[8], int row, int M, const float nf[8], float *ss, uint32_t hi[4],
                                         uint32_t lo[4]) {
#if DS_X_BF16_ON
    (void)ss;
    if (NORM && row < M) {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = __fmul_rn(f[i], nf[i]);
    }
#else
    if (NORM && row < M) {
        x_sum_squares(f, ss);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = __fmul_rn(f[i], nf[i]);
    }
#endif
#pragma unroll
    for (int i = 0; i < 4; i++) split_pair(f[2 * i], f[2 * i + 1], &hi[i], &lo[i]);
}

/* The RMSNorm weight's 8 values at k (NORM only; the launchers check the
 * alignment of bf16 / fp32 weights). */
template <bool NORM> __device__ __forceinline__ void load_norm8(const void *nw, int nwdt, int k, float nf[8]) {
    if (!NORM) return;
    if (nwdt == DS_BF16) {
        ds_cu_load8<DS_BF16>(nw, k, nf);
    } else if (nwdt == DS_F32) {
        ds_cu_load8<DS_F32>(nw, k, nf);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) nf[i] = ds_cu_load(nw, nwdt, k + i);
    }
}

/* One 32-wide chunk: weights wa (row g) / wb (row g+8) against the MT x tiles. */
template <int MT>
__device__ __forceinline__ void mma_chunk(float acc[MT][4], uint4 wa, uint4 wb, const uint32_t xh[MT][4],
                                          const uint32_t xl[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, xh[j][0], xh[j][1]);
        if (!DS_X_BF16_ON) mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, xl[j][0], xl[j][1]); /* DS_X_BF16: lo = 0 */
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, xh[j][2], xh[j][3]);
        if (!DS_X_BF16_ON) mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, xl[j][2], xl[j][3]);
    }
}

/* A lane's sum of squares of x row g + 8j, summed over the 4 lanes t in a
 * fixed butterfly; lane t = 0 stores it for its warp. */
__device__ __forceinline__ void mma_store_ss(float v, float *ss_part_warp, int row) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if ((threadIdx.x & 3) == 0) ss_part_warp[row] = v;
}

/* Row m's 1 / rms from the warps' stored sums of squares, added in warp order. */
__device__ __forceinline__ float rows_rs(const float *ss_part, int ss_stride, int m, int K, float eps) {
    float tot = ss_part[m];
#pragma unroll
    for (int w = 1; w < MMA_WARPS; w++) tot += ss_part[w * ss_stride + m];
    return 1.0f / sqrtf(tot / (float)K + eps);
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* Outputs (n0 + r, 8j + mm) of one 16-row tile and one 8-row x tile, from
 * the warps' partial sums red[w][v][reg][lane] (register 2h + e of lane
 * 4g' + t' is output r = 8h + g', mm = 2t' + e; NWS values v per warp, of
 * which this tile's are the first NW) and, with NORM, the warps' sums of
 * squares ss_part[w * ss_stride + m] (DS_X_BF16: row m's 1 / rms, ss_part[m]). Threads tid = 0 .. nthreads-1 of the
 * block share the 128 outputs. by_lane: thread o takes lane o % 32's value of register o / 32, so that a warp
 * reads 32 banks (r = o % 16, mm = o / 16 read 8 banks, 4 ways each at 8 rows); the same sums either way. */
template <int NW, int MODE, bool NORM, int NWS = NW>
__device__ __forceinline__ void mma_store_rows(const ds_mma_seg &S, const float *red, const float *ss_part,
                                               int ss_stride, int n0, int j, int M, int K, float eps, int tid,
                                               int nthreads, bool by_lane = false) {
    const int rows_here = min(MMA_ROWS, S.n - n0);
    for (int o = tid; o < MMA_ROWS * 8; o += nthreads) {
        const int r = by_lane ? ((o & 31) >> 2) + 8 * (o >> 6) : o % MMA_ROWS;
        const int mm = by_lane ? 2 * (o & 3) + ((o >> 5) & 1) : o / MMA_ROWS, m = 8 * j + mm;
        if (r >= rows_here || m >= M) continue;
        const int l = (r & 7) * 4 + (mm >> 1), reg = (r >> 3) * 2 + (mm & 1);
        float sum[NW];
#pragma unroll
        for (int v = 0; v < NW; v++) {
            float a = red[(v * 4 + reg) * 32 + l];
#pragma unroll
            for (int w = 1; w < MMA_WARPS; w++) a = __fadd_rn(a, red[((w * NWS + v) * 4 + reg) * 32 + l]);
            sum[v] = a;
        }
        if (NORM) {
            const float rs = DS_X_BF16_ON ? ss_part[m] : rows_rs(ss_part, ss_stride, m, K, eps);
#pragma unroll
            for (int v = 0; v < NW; v++) sum[v] *= rs;
        }
        const int n = n0 + r;
        float y = sum[0];
        if (MODE != DS_MMA_SWIGLU && S.bias) y = __fadd_rn(y, ds_cu_load(S.bias, S.bias_dtype, n));
        if (MODE == DS_MMA_RESIDUAL) y = __fadd_rn(S.res[(int64_t)m * S.rs + n], y);
        if (MODE == DS_MMA_SWIGLU)
            y = S.act == DS_GLU_GELU_TANH ? ds_cu_gelu_tanh_mul(sum[0], sum[NW - 1]) : silu_mul(sum[0], sum[NW - 1]);
        S.out[(int64_t)m * S.os + n] = y;
    }
}

/* The segment tile `tile` falls in, and its first weight row. */
__device__ __forceinline__ const ds_mma_seg &mma_tile_seg(const ds_mma_args &s, int tile, int *n0) {
    int seg = 0;
    while (seg + 1 < s.nseg && tile >= s.seg[seg].block_end) seg++;
    *n0 = (tile - (seg ? s.seg[seg - 1].block_end : 0)) * MMA_ROWS;
    return s.seg[seg];
}

#endif
