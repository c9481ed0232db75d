/* Row-invariant wide products (cfg.invariant; the batched engine's batch
 * invariance): out = xh W^T for a prompt's or a batch's rows (M past the
 * narrow kernels' DS_CU_NARROW_M) with bf16 x (DS_X_BF16) and bf16
 * weights, computing every output with the narrow kernels' sums in their
 * order (matmul_mma_frag.cuh), so that a row gets the same bits in a call
 * of 1 row (ring / per-tile kernel) as in a call of 256 (here).
 *
 * The narrow order: warp w of MMA_WARPS sums the 32-wide k chunks w,
 * w + 16, ... (each two m16n8k16 products, the lane layout of
 * mma_chunk), and the 16 warps' partial sums are added in warp order. A
 * tiled GEMM can follow it without 16 accumulators an output: it walks the
 * chunks class by class (chunks 0, 16, 32, ..., then 1, 17, ...), keeps
 * one partial sum (the class's) and one running total, and adds the
 * partial to the total when a class ends, as mma_store_rows adds warp w's
 * (empty classes, K < 512, add +0 as the warps without chunks do). The
 * mma instruction's result depends only on its operands, so the same
 * operands in the same fragments give the same bits.
 *
 * Why not cuBLAS: its kernel (and split of K) changes with M, so a row's
 * bits depend on how many rows share the call; slabs of DS_CU_NARROW_M
 * rows through the narrow kernels read every weight again per slab.
 *
 * Tiles: a block covers BN weight rows x BM rows of x, staged SC chunks of
 * the walk at a time (64 bytes a row and chunk; one barrier a stage)
 * through a cp.async ring in shared memory; a warp
 * owns TN 16-row weight tiles x TM 8-row x tiles. The lane layout reads a
 * row's 16 bytes at 16 t, so 8 rows of 64 bytes are one conflict-free
 * 512-byte read. Smaller tiles where the big ones leave SMs idle; every
 * tile shape gives the same bits. */
#include "backend/cuda/matmul_invariant.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/matmul_mma_frag.cuh"

#define INV_STAGES 3

/* The chunk walk: class w takes chunks w, w + MMA_WARPS, ...; classes in order. */
struct chunk_walk {
    int w, c;
    __device__ __forceinline__ void start() { w = 0, c = 0; }
    /* Advances; true when the chunk just left was its class's last. */
    __device__ __forceinline__ bool next(int chunks) {
        c += MMA_WARPS;
        if (c < chunks) return false;
        w++, c = w;
        return true;
    }
};

/* SC: chunks of the walk a stage holds (one barrier a stage), chunk-major: chunk j's ROWS rows of 64 bytes. */
template <int WN, int WM, int TN, int TM, int SC>
__global__ void __launch_bounds__(WN *WM * 32)
    gemm_invariant_kernel(float *__restrict__ out, int64_t os, const uint16_t *__restrict__ xh, int64_t xs,
                          const uint16_t *__restrict__ w, int64_t ws, int M, int N, int K) {
    constexpr int BN = WN * TN * 16, BM = WM * TM * 8, ROWS = BN + BM, THREADS = WN * WM * 32;
    constexpr int UNITS = ROWS * 4; /* 16-byte units of one chunk */
    extern __shared__ uint4 stage_mem[]; /* INV_STAGES x SC chunks x ROWS rows x 4 units */
    ds_cu_grid_wait();
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wn = warp % WN, wm = warp / WN;
    const int chunks = K >> 5;

    /* A stage: SC chunks of the walk; a chunk's weight rows n0 .. n0 + BN, then x rows m0 .. m0 + BM (clamped:
     * rows past N or M are never stored). */
    chunk_walk lw;
    lw.start();
    int loaded = 0;
    auto issue = [&](int stage) {
        uint4 *S = stage_mem + stage * SC * UNITS;
#pragma unroll
        for (int j = 0; j < SC; j++) {
            if (loaded < chunks) {
                const int64_t k = (int64_t)lw.c * 32;
                for (int u = threadIdx.x; u < UNITS; u += THREADS) {
                    const int r = u >> 2, q = u & 3;
                    const uint16_t *src = r < BN ? w + (int64_t)min(n0 + r, N - 1) * ws + k + 8 * q
                                                 : xh + (int64_t)min(m0 + r - BN, M - 1) * xs + k + 8 * q;
                    ds_cu_cp16(S + j * UNITS + u, src);
                }
                lw.next(chunks);
                loaded++;
            }
        }
        ds_cu_cp_commit(); /* (empty groups keep the wait counts uniform) */
    };
#pragma unroll
    for (int s = 0; s < INV_STAGES - 1; s++) issue(s);

    float acc[TN][TM][4], tot[TN][TM][4];
#pragma unroll
    for (int i = 0; i < TN; i++)
#pragma unroll
        for (int j = 0; j < TM; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f, tot[i][j][r] = 0.0f;

    /* Class cls's partial joins the total (mma_store_rows: warp 0's sum, then + each warp's in order); the
     * partial starts again from zero. */
    auto fold = [&](int cls) {
#pragma unroll
        for (int i = 0; i < TN; i++)
#pragma unroll
            for (int j = 0; j < TM; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    tot[i][j][r] = cls == 0 ? acc[i][j][r] : __fadd_rn(tot[i][j][r], acc[i][j][r]);
                    acc[i][j][r] = 0.0f;
                }
    };
    chunk_walk cw;
    cw.start();
    const int arow = wn * TN * 16 + g, brow = BN + wm * TM * 8 + g;
    const int stages = (chunks + SC - 1) / SC;
    for (int s = 0; s < stages; s++) {
        ds_cu_cp_wait<INV_STAGES - 2>();
        __syncthreads(); /* stage s landed for every thread; stage s - 1 is free */
        issue((s + INV_STAGES - 1) % INV_STAGES);
        const uint4 *S0 = stage_mem + (s % INV_STAGES) * SC * UNITS;
#pragma unroll
        for (int jc = 0; jc < SC; jc++) {
            if (s * SC + jc >= chunks) break;
            const uint4 *S = S0 + jc * UNITS;
            uint32_t xh[TM][4], xl[TM][4] = {}; /* x's bf16 pairs; xh is bf16 x (DS_X_BF16: no lo half) */
#pragma unroll
            for (int j = 0; j < TM; j++) {
                const uint4 v = S[(brow + 8 * j) * 4 + t];
                xh[j][0] = v.x, xh[j][1] = v.y, xh[j][2] = v.z, xh[j][3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TN; i++)
                mma_chunk<TM>(acc[i], S[(arow + 16 * i) * 4 + t], S[(arow + 16 * i + 8) * 4 + t], xh, xl);
            const int cls = cw.w;
            if (cw.next(chunks)) fold(cls); /* class cls ends: its sum joins the total, as warp cls's */
        }
    }
    ds_cu_cp_wait<0>();
    for (int cls = chunks; cls < MMA_WARPS; cls++) fold(cls); /* the classes without chunks (K < 512): zeros */

    /* Register 2h + e of lane 4g + t: weight row 8h + g, x row 2t + e of the 16 x 8 tile. */
#pragma unroll
    for (int i = 0; i < TN; i++)
#pragma unroll
        for (int j = 0; j < TM; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int n = n0 + wn * TN * 16 + 16 * i + 8 * (r >> 1) + g;
                const int m = m0 + wm * TM * 8 + 8 * j + 2 * t + (r & 1);
                if (n < N && m < M) out[(int64_t)m * os + n] = tot[i][j][r];
            }
}

template <int WN, int WM, int TN, int TM, int SC>
static bool launch_tiles(ds_cuda_backend *cb, const char *op, float *out, int64_t os, const uint16_t *xh, int64_t xs,
                         const uint16_t *w, int64_t ws, int M, int N, int K) {
    constexpr int BN = WN * TN * 16, BM = WM * TM * 8;
    const size_t smem = (size_t)INV_STAGES * SC * (BN + BM) * 64;
    auto kernel = gemm_invariant_kernel<WN, WM, TN, TM, SC>;
    static ds_cu_smem_allowed allowed;
    if (!ds_cu_allow_smem(cb, op, kernel, &allowed, smem)) return false;
    const dim3 grid((unsigned)((M + BM - 1) / BM), (unsigned)((N + BN - 1) / BN));
    ds_cu_launch_smem(kernel, grid, WN * WM * 32, smem, cb->stream, out, os, xh, xs, w, ws, M, N, K);
    return ds_cu_launched(cb, op);
}

bool ds_cu_wide_invariant_ok(const ds_cuda_backend *cb, ds_tensor w) {
    return cb->cfg.invariant && DS_X_BF16_ON && w.dtype == DS_BF16 && !w.q.bits && w.cols % 32 == 0 &&
           w.stride % 8 == 0 && (uintptr_t)w.data % 16 == 0 && w.rows <= INT32_MAX && w.cols <= INT32_MAX;
}

bool ds_cu_gemm_invariant(ds_cuda_backend *cb, const char *op, ds_tensor out, const uint16_t *xh, int64_t M,
                          ds_tensor w) {
    const int64_t N = w.rows, K = w.cols;
    if (M <= 0 || N <= 0) return true;
    if (M > INT32_MAX || (uintptr_t)xh % 16) {
        ds_cu_fail(cb, op, "invariant product: %lld rows of x at %p not supported", (long long)M, (const void *)xh);
        return false;
    }
    /* Grid fill: the largest tile whose grid still gives most SMs a block (N tiles on grid y: at most 65535). */
    const int64_t big = ((M + 63) / 64) * ((N + 127) / 128), mid = ((M + 31) / 32) * ((N + 63) / 64);
    float *o = (float *)out.data;
    const uint16_t *wp = (const uint16_t *)w.data;
    if (big >= cb->sms * 3 / 4 && (N + 127) / 128 <= 65535)
        return launch_tiles<4, 2, 2, 4, 4>(cb, op, o, out.stride, xh, K, wp, w.stride, (int)M, (int)N, (int)K);
    if (mid >= cb->sms * 3 / 4 && (N + 63) / 64 <= 65535)
        return launch_tiles<2, 1, 2, 4, 2>(cb, op, o, out.stride, xh, K, wp, w.stride, (int)M, (int)N, (int)K);
    if ((N + 15) / 16 > 65535) {
        ds_cu_fail(cb, op, "invariant product: %lld weight rows not supported", (long long)N);
        return false;
    }
    return launch_tiles<1, 1, 1, 4, 2>(cb, op, o, out.stride, xh, K, wp, w.stride, (int)M, (int)N, (int)K);
}
