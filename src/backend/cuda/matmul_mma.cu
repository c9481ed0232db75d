/* Narrow y = x W^T for bf16 weights on the tensor cores (decode, verify and
 * drafter blocks: M <= 32 rows), with the epilogues the model fuses into it:
 * one block per 16 weight rows, weights loaded into registers. Up to 8 rows
 * of x with aligned operands go to the persistent ring kernel instead
 * (matmul_ring.cu), which computes the same sums in the same order
 * (matmul_mma_frag.cuh).
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
 * accumulator. */
#include "backend/cuda/matmul_mma.h"
#include "backend/cuda/matmul_mma_frag.cuh"

/* 2 chunks of weights in flight per warp. */
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

/* x[row][k .. k+7] (zeros for rows past M) into f. */
__device__ __forceinline__ void load_x8_raw(const float *__restrict__ x, int64_t xs, int row, int M, int k, bool vec,
                                            float f[8]) {
    if (row >= M) {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = 0.0f;
    } else if (vec) {
        ds_cu_load8<DS_F32>(x, (int64_t)row * xs + k, f);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = x[(int64_t)row * xs + k + i];
    }
}

/* Whether x is loaded early (every chunk of a step in flight with the
 * weights, its L2 latency hidden behind theirs) or chunk by chunk after the
 * previous chunk's products. Early needs 8 more registers per chunk: with
 * one x tile, one weight and no norm it stays within 64 registers. Measured
 * with 16 warps per block, before the ring kernel took M <= 8 (verify of 8
 * rows 5.52 -> 5.39 ms at the Qwen3-8B shape); with the norm or SwiGLU's two
 * weights it cost more than it saved (bench/RESULTS.md). */
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
    /* NORM: the warps' sums of squares (DS_X_BF16: the tile order's slots), then (DS_X_BF16) each row's 1 / rms */
    __shared__ float ss_part[NORM ? (DS_X_BF16_ON ? SS_SLOTS : MMA_WARPS) : 1][NORM ? 8 * MT : 1];
    __shared__ float rs_row[NORM && DS_X_BF16_ON ? 8 * MT : 1];
    float ss[MT]; /* NORM: a lane's sums of squares (DS_X_BF16: its slot 2 warp + t / 2 of the tile order) */
#pragma unroll
    for (int j = 0; j < MT; j++) ss[j] = 0.0f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int n0;
    const ds_mma_seg &S = mma_tile_seg(s, (int)blockIdx.x, &n0);
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
    /* Warp w takes chunks w, w + MMA_WARPS, ... in order (matmul_mma_frag.cuh). */
    constexpr int cstep = MMA_WARPS;
    for (int c = warp; c < chunks; c += cstep * UNR) {
        uint4 wa[NW][UNR], wb[NW][UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int cc = c + u * cstep;
            if (cc < chunks) {
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
                if (cc < chunks)
#pragma unroll
                    for (int j = 0; j < MT; j++) load_x8_raw(x, xs, g + 8 * j, M, cc * 32 + 8 * t, xvec, xf[u][j]);
            }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int cc = c + u * cstep;
            if (cc >= chunks) break;
            const int k = cc * 32 + 8 * t;
            float nf[8];
            load_norm8<NORM>(s.norm_w, s.norm_dtype, k, nf);
            uint32_t xh[MT][4], xl[MT][4];
#pragma unroll
            for (int j = 0; j < MT; j++) {
                if (EARLY) {
                    split_x8<NORM>(xf[u][j], g + 8 * j, M, nf, &ss[j], xh[j], xl[j]);
                } else {
                    float f[8];
                    load_x8_raw(x, xs, g + 8 * j, M, k, xvec, f);
                    if (NORM && DS_X_BF16_ON) ss_tile_add(f, &ss[j]); /* (before the norm weight scales f) */
                    split_x8<NORM>(f, g + 8 * j, M, nf, &ss[j], xh[j], xl[j]);
                }
            }
#pragma unroll
            for (int v = 0; v < NW; v++) mma_chunk<MT>(acc[v], wa[v][u], wb[v][u], xh, xl);
        }
    }
    if (NORM && !DS_X_BF16_ON) /* each row's sum of squares: lanes t in a fixed butterfly, then warps in order */
#pragma unroll
        for (int j = 0; j < MT; j++) mma_store_ss(ss[j], ss_part[warp], g + 8 * j);
    if (NORM && DS_X_BF16_ON) { /* the slots, then each row's 1 / rms (the epilogue's first sync orders it) */
        if (!(t & 1))
#pragma unroll
            for (int j = 0; j < MT; j++) ss_part[2 * warp + (t >> 1)][g + 8 * j] = ss[j];
        __syncthreads();
        for (int m = warp; m < M && m < 8 * MT; m += MMA_WARPS) { /* warp w: rows w, w + 16 */
            const float rs = slots_rs(&ss_part[0][0], 8 * MT, m, K, s.eps);
            if (lane == 0) rs_row[m] = rs;
        }
    }
    /* One 8-row tile of x at a time through shared memory. */
#pragma unroll
    for (int j = 0; j < MT; j++) {
        if (j > 0) __syncthreads(); /* the previous tile's sums have been read */
#pragma unroll
        for (int v = 0; v < NW; v++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][v][i][lane] = acc[v][j][i];
        __syncthreads();
        mma_store_rows<NW, MODE, NORM>(S, &red[0][0][0][0], DS_X_BF16_ON ? rs_row : &ss_part[0][0],
                                       NORM ? 8 * MT : 1, n0, j, M, K, s.eps,
                                       threadIdx.x, MMA_THREADS);
    }
}

bool ds_cu_mma_eligible(const ds_cuda_backend *cb, ds_tensor w, int64_t M) {
    return w.dtype == DS_BF16 && !w.q.bits && M >= 1 && M <= ds_cu_narrow_rows(cb) && w.cols % 32 == 0 &&
           w.stride % 8 == 0 && (uintptr_t)w.data % 16 == 0;
}

void ds_cu_mma_launch(ds_cuda_backend *cb, const char *op, int mode, ds_mma_args *a, ds_tensor x) {
    const int M = (int)x.rows, K = (int)x.cols;
    int blocks = 0;
    for (int i = 0; i < a->nseg; i++) {
        blocks += (a->seg[i].n + MMA_ROWS - 1) / MMA_ROWS;
        a->seg[i].block_end = blocks;
    }
    if (blocks == 0 || M <= 0) return;
    const int mt = (M + 7) / 8;
    if (mt == 1 && ds_cu_ring_launch(cb, op, mode, a, x, blocks)) return;
    const int xvec = (uintptr_t)x.data % 16 == 0 && x.stride % 4 == 0;
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
