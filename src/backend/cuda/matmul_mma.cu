/* Narrow y = x W^T for bf16 weights on the tensor cores (decode, verify and
 * drafter blocks: M <= 32 rows), with the epilogues the model fuses into it.
 *
 * Why tensor cores: with fp32 FMAs every 16 bytes of weights meet 8*M FMAs,
 * so the CUDA-core kernel (matmul.cu) falls from HBM speed at M = 1 to half
 * of it at M = 8, which is what a verify pass needs. mma.sync m16n8k16 does
 * a warp's 16 weight rows x 8 rows of x in one instruction.
 *
 * Why x is split: the tensor cores take bf16 operands, and rounding the
 * fp32 activations to bf16 would cost ~3 significant digits. x = hi + lo
 * with hi = bf16(x) and lo = bf16(x - hi) keeps 16 bits of mantissa; each
 * step runs the hi product and then the lo product into the fp32
 * accumulator.
 *
 * Why rows stay invariant: output (n, m) is accumulated from weight row n
 * and x row m only, by one fixed sequence of mma instructions: warp w of a
 * block takes the w-th contiguous run of 32-wide k chunks in order, each chunk
 * as two k16 steps (hi, lo each), and the 16 warps' partial sums are added
 * in warp order. Nothing in that sequence depends on M or on where row m
 * sits in the tile; a row computed alone is bit-identical to the same row
 * verified with others (test_cuda_ops checks it).
 *
 * Lane layout (PTX ISA, mma.m16n8k16 bf16): lane = 4g + t holds A elements
 * (rows g, g+8; k 2t, 2t+1, 2t+8, 2t+9) and B elements (k 2t, 2t+1, 2t+8,
 * 2t+9; column g). A dot product does not care which physical k sits at
 * which logical k as long as A and B agree, so lane t loads the 8
 * consecutive elements 8t..8t+7 of its chunk with one 16-byte load from
 * each of its two weight rows, and the same 8 elements of its x row. */
#include <cuda_bf16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/matmul_mma.h"

#define MMA_ROWS 16 /* weight rows (outputs) per block */
/* 16 warps split K into contiguous runs, 2 chunks of weights in flight per
 * warp: the fastest of the shapes measured on the H200 at M = 1, 4 and 8
 * (bench/RESULTS.md). Fixed for every M and mode: the split is part of the
 * reduction order. */
#define MMA_WARPS 16
#define MMA_UNROLL 2
#define MMA_THREADS (MMA_WARPS * 32)

/* A weight stream read once per step: skip L1, keep L2 for activations. */
__device__ __forceinline__ uint4 ld_weights(const uint16_t *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* (a, b) -> bf16 pairs hi = bf16(a, b), lo = bf16(a - hi.a, b - hi.b); the
 * lower k sits in the low half, as in memory. */
__device__ __forceinline__ void split_pair(float a, float b, uint32_t *hi, uint32_t *lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    *hi = *(const uint32_t *)&h;
    *lo = *(const uint32_t *)&l;
}

/* x[row][k .. k+7] (zeros for rows past M) into f. */
__device__ __forceinline__ void load_x8_raw(const float *__restrict__ x, int64_t xs, int row, int M, int k, bool vec,
                                            float f[8]) {
    if (row >= M) {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = 0.0f;
    } else if (vec) {
        const float4 *p = (const float4 *)(x + (int64_t)row * xs + k);
        const float4 a = __ldg(p), b = __ldg(p + 1);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = x[(int64_t)row * xs + k + i];
    }
}

/* Those 8 values as 4 hi and 4 lo pairs. NORM: also adds their squares to
 * *ss and scales them by the RMSNorm weight nw[k ..] (the 1/rms factor is
 * applied to the sums at the end). */
template <bool NORM>
__device__ __forceinline__ void split_x8(float f[8], int row, int M, int k, const void *nw, int nwdt, float *ss,
                                         uint32_t hi[4], uint32_t lo[4]) {
    if (NORM && row < M) {
#pragma unroll
        for (int i = 0; i < 8; i++) *ss = fmaf(f[i], f[i], *ss);
        /* The norm weight's 8 values in one or two 16-byte loads (the
         * launcher checks the alignment). */
        float nf[8];
        if (nwdt == DS_BF16) {
            ds_cu_load8<DS_BF16>(nw, k, nf);
        } else if (nwdt == DS_F32) {
            ds_cu_load8<DS_F32>(nw, k, nf);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) nf[i] = ds_cu_load(nw, nwdt, k + i);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] *= nf[i];
    }
#pragma unroll
    for (int i = 0; i < 4; i++) split_pair(f[2 * i], f[2 * i + 1], &hi[i], &lo[i]);
}

template <bool NORM>
__device__ __forceinline__ void load_x8(const float *__restrict__ x, int64_t xs, int row, int M, int k, bool vec,
                                        const void *nw, int nwdt, float *ss, uint32_t hi[4], uint32_t lo[4]) {
    float f[8];
    load_x8_raw(x, xs, row, M, k, vec, f);
    split_x8<NORM>(f, row, M, k, nw, nwdt, ss, hi, lo);
}

/* One 32-wide chunk: weights wa (row g) / wb (row g+8) against the MT x tiles. */
template <int MT>
__device__ __forceinline__ void mma_chunk(float acc[MT][4], uint4 wa, uint4 wb, const uint32_t xh[MT][4],
                                          const uint32_t xl[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, xh[j][0], xh[j][1]);
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, xl[j][0], xl[j][1]);
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, xh[j][2], xh[j][3]);
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, xl[j][2], xl[j][3]);
    }
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Whether x is loaded early (every chunk of a step in flight with the
 * weights, its L2 latency hidden behind theirs) or chunk by chunk after the
 * previous chunk's products. Early needs 8 more registers per chunk: with
 * one x tile, one weight and no norm that still leaves two blocks per SM
 * (60 registers, held to 64 by the launch bounds), and it pays most at M = 8 (x is 8 rows there): on the
 * H200, verify of 8 rows 5.52 -> 5.39 ms at the Qwen3-8B shape, a 268 MB
 * matrix at M = 8 3.49 -> 3.85 TB/s. With the norm (70 registers: one block
 * per SM, or spills when held to 64) or SwiGLU's two weights it cost more
 * than it saved (bench/RESULTS.md). */
__host__ __device__ constexpr bool early_x(int MT, int MODE, bool NORM) {
    return MT == 1 && MODE != DS_MMA_SWIGLU && !NORM;
}

/* NW = weights per block: 1 (plain / residual) or 2 (gate and up, SwiGLU).
 * MT = 8-row tiles of x (M <= 8 MT). Block b covers weight rows
 * [16 b', 16 b' + 16) of the segment its index falls in. */
template <int MT, int MODE, bool NORM>
__global__ void __launch_bounds__(MMA_THREADS, early_x(MT, MODE, NORM) ? 2 : 0)
    linear_mma_kernel(ds_mma_args s, const float *__restrict__ x, int64_t xs, int M, int K, int xvec) {
    ds_cu_grid_wait();
    constexpr int NW = MODE == DS_MMA_SWIGLU ? 2 : 1;
    constexpr int UNR = MMA_UNROLL;
    constexpr bool EARLY = early_x(MT, MODE, NORM);
    __shared__ float red[MMA_WARPS][NW][4][32];
    __shared__ float ss_part[NORM ? MMA_WARPS : 1][NORM ? 8 * MT : 1];
    float ss[MT];
#pragma unroll
    for (int j = 0; j < MT; j++) ss[j] = 0.0f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int seg = 0;
    while (seg + 1 < s.nseg && (int)blockIdx.x >= s.seg[seg].block_end) seg++;
    const ds_mma_seg &S = s.seg[seg];
    const int n0 = ((int)blockIdx.x - (seg ? s.seg[seg - 1].block_end : 0)) * MMA_ROWS;
    /* Rows past N read a valid row; their sums are never written. */
    const int ra = min(n0 + g, S.n - 1), rb = min(n0 + g + 8, S.n - 1);
    const uint16_t *wpa[NW], *wpb[NW];
    wpa[0] = S.w + (int64_t)ra * S.ws + 8 * t;
    wpb[0] = S.w + (int64_t)rb * S.ws + 8 * t;
    if (NW == 2) {
        wpa[NW - 1] = S.w2 + (int64_t)ra * S.ws + 8 * t;
        wpb[NW - 1] = S.w2 + (int64_t)rb * S.ws + 8 * t;
    }
    float acc[NW][MT][4];
#pragma unroll
    for (int v = 0; v < NW; v++)
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[v][j][i] = 0.0f;

    const int chunks = K >> 5;
    /* Warp w takes the w-th contiguous run of chunks, in order. */
    const int per = (chunks + MMA_WARPS - 1) / MMA_WARPS;
    const int c_begin = warp * per, c_end = min(chunks, (warp + 1) * per);
    const int cstep = 1;
    for (int c = c_begin; c < c_end; c += cstep * UNR) {
        uint4 wa[NW][UNR], wb[NW][UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int cc = c + u * cstep;
            if (cc < c_end) {
#pragma unroll
                for (int v = 0; v < NW; v++) {
                    wa[v][u] = ld_weights(wpa[v] + cc * 32);
                    wb[v][u] = ld_weights(wpb[v] + cc * 32);
                }
            }
        }
        float xf[EARLY ? UNR : 1][MT][8];
        if (EARLY)
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int cc = c + u * cstep;
                if (cc < c_end)
#pragma unroll
                    for (int j = 0; j < MT; j++) load_x8_raw(x, xs, g + 8 * j, M, cc * 32 + 8 * t, xvec, xf[u][j]);
            }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int cc = c + u * cstep;
            if (cc >= c_end) break;
            uint32_t xh[MT][4], xl[MT][4];
#pragma unroll
            for (int j = 0; j < MT; j++) {
                if (EARLY)
                    split_x8<NORM>(xf[u][j], g + 8 * j, M, cc * 32 + 8 * t, s.norm_w, s.norm_dtype, &ss[j], xh[j],
                                   xl[j]);
                else
                    load_x8<NORM>(x, xs, g + 8 * j, M, cc * 32 + 8 * t, xvec, s.norm_w, s.norm_dtype, &ss[j], xh[j],
                                  xl[j]);
            }
#pragma unroll
            for (int v = 0; v < NW; v++) mma_chunk<MT>(acc[v], wa[v][u], wb[v][u], xh, xl);
        }
    }
    if (NORM) { /* each row's sum of squares: lanes t in a fixed butterfly, then warps in order below */
#pragma unroll
        for (int j = 0; j < MT; j++) {
            float v = ss[j];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) ss_part[warp][g + 8 * j] = v;
        }
    }
    /* Output (n0 + r, m): r = 8h + g', m = 8j + 2t' + e sits in lane 4g' + t', register 2h + e.
     * One 8-row tile of x at a time through shared memory. */
    const int rows_here = min(MMA_ROWS, S.n - n0);
#pragma unroll
    for (int j = 0; j < MT; j++) {
        if (j > 0) __syncthreads(); /* the previous tile's sums have been read */
#pragma unroll
        for (int v = 0; v < NW; v++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][v][i][lane] = acc[v][j][i];
        __syncthreads();
        for (int o = threadIdx.x; o < MMA_ROWS * 8; o += MMA_THREADS) {
            const int r = o % MMA_ROWS, mm = o / MMA_ROWS, m = 8 * j + mm;
            if (r >= rows_here || m >= M) continue;
            const int l = (r & 7) * 4 + (mm >> 1), reg = (r >> 3) * 2 + (mm & 1);
            float sum[NW];
#pragma unroll
            for (int v = 0; v < NW; v++) {
                float a = red[0][v][reg][l];
#pragma unroll
                for (int w = 1; w < MMA_WARPS; w++) a = __fadd_rn(a, red[w][v][reg][l]);
                sum[v] = a;
            }
            if (NORM) {
                float tot = ss_part[0][m];
#pragma unroll
                for (int w = 1; w < MMA_WARPS; w++) tot += ss_part[w][m];
                const float rs = 1.0f / sqrtf(tot / (float)K + s.eps);
#pragma unroll
                for (int v = 0; v < NW; v++) sum[v] *= rs;
            }
            const int n = n0 + r;
            float y = sum[0];
            if (MODE != DS_MMA_SWIGLU && S.bias) y = __fadd_rn(y, ds_cu_load(S.bias, S.bias_dtype, n));
            if (MODE == DS_MMA_RESIDUAL) y = __fadd_rn(S.res[(int64_t)m * S.rs + n], y);
            if (MODE == DS_MMA_SWIGLU) y = silu_mul(sum[0], sum[NW - 1]);
            S.out[(int64_t)m * S.os + n] = y;
        }
    }
}

bool ds_cu_mma_eligible(ds_tensor w, int64_t M) {
    return w.dtype == DS_BF16 && M >= 1 && M <= DS_CU_NARROW_M && w.cols % 32 == 0 && w.stride % 8 == 0 &&
           (uintptr_t)w.data % 16 == 0;
}

void ds_cu_mma_launch(ds_cuda_backend *cb, const char *op, int mode, ds_mma_args *a, ds_tensor x) {
    const int M = (int)x.rows, K = (int)x.cols;
    int blocks = 0;
    for (int i = 0; i < a->nseg; i++) {
        blocks += (a->seg[i].n + MMA_ROWS - 1) / MMA_ROWS;
        a->seg[i].block_end = blocks;
    }
    if (blocks == 0 || M <= 0) return;
    const int xvec = (uintptr_t)x.data % 16 == 0 && x.stride % 4 == 0;
    const int mt = (M + 7) / 8;
    const float *xp = (const float *)x.data;
#define LAUNCH(MT_, MODE_)                                                                                        \
    do {                                                                                                          \
        if (a->norm_w)                                                                                            \
            ds_cu_launch(linear_mma_kernel<MT_, MODE_, true>, (unsigned)blocks, MMA_THREADS, cb->stream, *a, xp,   \
                         x.stride, M, K, xvec);                                                                   \
        else                                                                                                      \
            ds_cu_launch(linear_mma_kernel<MT_, MODE_, false>, (unsigned)blocks, MMA_THREADS, cb->stream, *a, xp,  \
                         x.stride, M, K, xvec);                                                                   \
    } while (0)
#define BY_MT(MODE_)                  \
    switch (mt) {                     \
    case 1: LAUNCH(1, MODE_); break;  \
    case 2: LAUNCH(2, MODE_); break;  \
    case 3: LAUNCH(3, MODE_); break;  \
    default: LAUNCH(4, MODE_); break; \
    }
    switch (mode) {
    case DS_MMA_PLAIN: BY_MT(DS_MMA_PLAIN); break;
    case DS_MMA_RESIDUAL: BY_MT(DS_MMA_RESIDUAL); break;
    default: BY_MT(DS_MMA_SWIGLU); break;
    }
#undef BY_MT
#undef LAUNCH
    ds_cu_launched(cb, op);
}
