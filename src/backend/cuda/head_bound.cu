/* The LM head's int8 copy and the bounds of a drafted block's logits
 * (head_bound.h says why and what the bound is). */
#include <cuda_bf16.h>
#include <stdio.h>

#include "backend/cuda/head_bound.h"
#include "backend/cuda/ring_trace.h"

#define HB_WARPS 8
#define HB_THREADS (HB_WARPS * 32)
#define HB_ROWS 8   /* x rows a launch bounds (the mma's 8 columns) */
#define HB_CHUNK 64 /* k a lane-quad covers per step: 16 bytes a lane */
#define HB_UNROLL 8 /* chunks a warp has in flight */
#define HB_X_PER_THREAD (8192 / HB_THREADS) /* x values a thread converts a row (K <= 8192) */

bool ds_cu_head_fits(ds_tensor w) {
    return w.dtype == DS_BF16 && !w.q.bits && w.cols % 512 == 0 && w.cols <= 8192 && w.rows > 0 &&
           w.rows < INT32_MAX && (uintptr_t)w.data % 16 == 0 && (w.stride * 2) % 16 == 0;
}

/* Where q's byte (n, i) lives: the copy is laid out as the bounds kernel
 * reads it, 16-row tiles of 64-wide chunks in which lane (g, t) of a warp
 * finds its 16 bytes of row g, then of row g + 8, at 32 lane: a warp's
 * chunk is one 1 KB run. */
__device__ __forceinline__ int64_t head_q_offset(int64_t n, int i, int K) {
    const int64_t tile = n >> 4;
    const int r = (int)(n & 15), c = i / HB_CHUNK, k = i % HB_CHUNK;
    const int lane = 4 * (r & 7) + k / 16;
    return ((tile * (K / HB_CHUNK) + c) * 32 + lane) * 32 + 16 * (r >> 3) + k % 16;
}

/* One warp a row: s = max|w| / 127, q = round(w / s) in [-127, 127], stored
 * + 128; |e| and |w| in double, rounded up (their relative error is below
 * K 2^-53, covered by 2^-30). A row with a non-finite value gets err = inf:
 * its bounds are then infinite and the walk computes its block exactly. */
__global__ void head_quant_kernel(const uint16_t *__restrict__ w, int64_t ws, int64_t V, int K, uint8_t *q,
                                  float *scale, float *err, float *norm) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * HB_WARPS + (threadIdx.x >> 5);
    if (n >= V) return;
    const uint16_t *row = w + n * ws;
    float amax = 0.0f;
    int finite = 1;
    for (int i = lane; i < K; i += 32) {
        const float f = __uint_as_float((uint32_t)row[i] << 16);
        finite &= isfinite(f);
        amax = fmaxf(amax, fabsf(f));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        finite &= __shfl_xor_sync(0xffffffffu, finite, off);
    }
    const float s = finite && amax > 0.0f ? amax / 127.0f : 1.0f;
    double se = 0.0, sw = 0.0;
    for (int i = lane; i < K; i += 32) {
        const float f = __uint_as_float((uint32_t)row[i] << 16);
        const float qf = finite ? fminf(fmaxf(rintf(f / s), -127.0f), 127.0f) : 0.0f;
        q[head_q_offset(n, i, K)] = (uint8_t)((int)qf + 128);
        const double e = (double)f - (double)s * (double)qf; /* exact: s q has 31 bits */
        se = fma(e, e, se);
        sw = fma((double)f, (double)f, sw);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        se += __shfl_xor_sync(0xffffffffu, se, off);
        sw += __shfl_xor_sync(0xffffffffu, sw, off);
    }
    if (lane == 0) {
        scale[n] = s;
        err[n] = finite ? __double2float_ru(sqrt(se) * (1.0 + 0x1p-30)) : INFINITY;
        norm[n] = finite ? __double2float_ru(sqrt(sw) * (1.0 + 0x1p-30)) : INFINITY;
    }
}

/* x~: the value the exact product takes for x (matmul_mma_frag.cuh's split_pair: bf16(x), or hi + lo, exact in fp32). */
__device__ __forceinline__ float head_exact_x(float v) {
    const float h = __bfloat162float(__float2bfloat16_rn(v));
#if DS_X_BF16_ON
    return h;
#else
    return h + __bfloat162float(__float2bfloat16_rn(__fsub_rn(v, h)));
#endif
}

__device__ __forceinline__ void mma_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 16 stored bytes (q + 128) -> 8 fp16 pairs of q, exactly: 0x64uu is 1024 + uu in fp16. */
__device__ __forceinline__ void q16_to_half2(uint4 u, uint32_t h[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)); /* 1152 = 1024 + 128 */
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t lo = __byte_perm(w[j], 0x64646464u, 0x4140), hi = __byte_perm(w[j], 0x64646464u, 0x4342);
        __half2 a = __hsub2(*(__half2 *)&lo, bias), b = __hsub2(*(__half2 *)&hi, bias);
        h[2 * j] = *(uint32_t *)&a;
        h[2 * j + 1] = *(uint32_t *)&b;
    }
}

/* Lane (g, t)'s 16 bytes of rows 16 tile + g and + g + 8 at chunk c (head_q_offset; rows past V are q = 0). */
__device__ __forceinline__ void head_load(const uint8_t *q, int K, int64_t tile, int c, int lane, uint4 *a,
                                          uint4 *b) {
    const uint4 *p = (const uint4 *)(q + ((tile * (K / HB_CHUNK) + c) * 32 + lane) * 32);
    *a = __ldcs(p);
    *b = __ldcs(p + 1);
}

struct hb_shared {
    float fac[HB_ROWS], X[HB_ROWS], D[HB_ROWS]; /* 2^shift, >= |x~|, >= |x~ - fac x16| */
    float bv[HB_WARPS][HB_ROWS];
    int bi[HB_WARPS][HB_ROWS];
};

/* One block a row m of x (rows M..7: zeros): x~ in fp16, scaled by a power
 * of two fac so that its largest |x~| is in [2^14, 2^15), into xg[m]
 * (global: every bounds block copies it), and xinfo = fac[8], X[8] >= |x~|,
 * D[8] >= |x~ - fac x16| (double sums, rounded up). */
__global__ void __launch_bounds__(HB_THREADS)
    head_x_kernel(const float *__restrict__ x, int64_t xs, int M, int K, __half *xg, float *xinfo) {
    __shared__ float amax[HB_WARPS];
    __shared__ double sx[HB_WARPS], sd[HB_WARPS];
    const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ds_cu_grid_wait();
    float v[HB_X_PER_THREAD], mx = 0.0f;
#pragma unroll
    for (int j = 0; j < HB_X_PER_THREAD; j++) {
        const int i = threadIdx.x + j * HB_THREADS;
        v[j] = m < M && i < K ? head_exact_x(x[m * xs + i]) : 0.0f;
        mx = fmaxf(mx, fabsf(v[j])); /* NaN: fmaxf drops it (X is then NaN: infinite bounds) */
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) amax[warp] = mx;
    __syncthreads();
    for (int w = 0; w < HB_WARPS; w++) mx = fmaxf(mx, amax[w]);
    const float f = mx > 0.0f && isfinite(mx) ? ldexpf(1.0f, ilogbf(mx) - 14) : 1.0f;
    double s2 = 0.0, d2 = 0.0;
#pragma unroll
    for (int j = 0; j < HB_X_PER_THREAD; j++) {
        const int i = threadIdx.x + j * HB_THREADS;
        if (i >= K) break;
        const __half h = __float2half_rn(v[j] / f); /* f a power of two: exact unless it underflows */
        xg[(int64_t)m * K + i] = h;
        const double d = (double)v[j] - (double)__half2float(h) * (double)f;
        s2 = fma((double)v[j], (double)v[j], s2);
        d2 = fma(d, d, d2);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        s2 += __shfl_xor_sync(0xffffffffu, s2, off);
        d2 += __shfl_xor_sync(0xffffffffu, d2, off);
    }
    if (lane == 0) sx[warp] = s2, sd[warp] = d2;
    __syncthreads();
    if (threadIdx.x == 0) {
        s2 = d2 = 0.0;
        for (int w = 0; w < HB_WARPS; w++) s2 += sx[w], d2 += sd[w];
        xinfo[m] = f;
        xinfo[HB_ROWS + m] = isfinite(s2) ? __double2float_ru(sqrt(s2) * (1.0 + 0x1p-30)) : INFINITY;
        xinfo[2 * HB_ROWS + m] = isfinite(d2) ? __double2float_ru(sqrt(d2) * (1.0 + 0x1p-30)) : INFINITY;
    }
}

/* A persistent block: x's rows to fp16 in shared memory (each scaled by a
 * power of two so that its largest |x~| is in [2^14, 2^15)), then warps take
 * 16-row tiles: lane (g, t) streams 16 bytes of rows g and g + 8 a 64-wide
 * chunk (4 mma k16 steps; its x row g elements at the same offsets), and the
 * tile's a = s acc fac becomes [lo, hi] (head_bound.h). */
__global__ void __launch_bounds__(HB_THREADS)
    head_bounds_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, const float *__restrict__ err,
                       const float *__restrict__ norm, const __half *__restrict__ xg, const float *__restrict__ xinfo,
                       int M, int K, int64_t V, float *lo, float *hi, int64_t os, float *pv, int *pi,
                       unsigned long long *trace) {
    unsigned long long *tr = threadIdx.x == 0 ? ds_cu_trace_block(trace) : NULL; /* DS_CUDA_RING_TRACE */
    if (tr) tr[RT_ENTRY] = ds_cu_gtimer();
    extern __shared__ __align__(16) unsigned char hb_smem[];
    __half *x16 = (__half *)hb_smem; /* [HB_ROWS][K + 8] */
    __shared__ hb_shared sh;
    const int xst = K + 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int nchunks = K / HB_CHUNK;
    const int64_t ntiles = (V + 15) / 16;
    int64_t tile = (int64_t)blockIdx.x * HB_WARPS + warp;
    uint4 wa[HB_UNROLL], wb[HB_UNROLL];
    int c = 0;
    /* the first weights do not depend on the kernel before */
    if (tile < ntiles)
#pragma unroll
        for (int u = 0; u < HB_UNROLL; u++) head_load(q, K, tile, c + u, lane, &wa[u], &wb[u]);
    ds_cu_grid_wait();
    if (tr) tr[RT_WAIT] = ds_cu_gtimer();
    /* x's rows, ready in fp16 (head_x_kernel), into shared memory */
    for (int i = threadIdx.x; i < HB_ROWS * (K / 8); i += HB_THREADS) {
        const int m = i / (K / 8), j = i % (K / 8);
        *(uint4 *)(x16 + m * xst + 8 * j) = __ldcg((const uint4 *)(xg + (int64_t)m * K + 8 * j));
    }
    if (threadIdx.x < HB_ROWS) {
        sh.fac[threadIdx.x] = xinfo[threadIdx.x];
        sh.X[threadIdx.x] = xinfo[HB_ROWS + threadIdx.x];
        sh.D[threadIdx.x] = xinfo[2 * HB_ROWS + threadIdx.x];
    }
    __syncthreads();
    const float gam = (float)(K + 64) * 0x1p-22f;
    /* this lane's x rows (2t, 2t + 1) */
    float Xm[2], Dm[2], Fm[2], Gm[2], best[2] = {-INFINITY, -INFINITY};
    int besti[2] = {-1, -1};
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int m = 2 * t + e;
        Xm[e] = sh.X[m], Dm[e] = sh.D[m], Fm[e] = sh.fac[m];
        Gm[e] = __fadd_ru(Dm[e], __fmul_ru(gam, __fadd_ru(Xm[e], Dm[e]))); /* |x~ - x16| + g (|x~| + |x~ - x16|) */
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    while (tile < ntiles) {
#pragma unroll
        for (int u = 0; u < HB_UNROLL; u++) {
            uint32_t ha[8], hb[8];
            q16_to_half2(wa[u], ha);
            q16_to_half2(wb[u], hb);
            const uint4 *xp = (const uint4 *)(x16 + g * xst + (c + u) * HB_CHUNK + 16 * t);
            const uint4 x0 = xp[0], x1 = xp[1];
            const uint32_t xb[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int j = 0; j < 4; j++) mma_f16(acc, ha[2 * j], hb[2 * j], ha[2 * j + 1], hb[2 * j + 1], xb[2 * j], xb[2 * j + 1]);
        }
        c += HB_UNROLL;
        const int64_t n0 = tile * 16;
        if (c == nchunks) { /* the tile's bounds */
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int64_t n = n0 + g + 8 * (v >> 1);
                const int e = v & 1, m = 2 * t + e;
                if (n >= V || m >= M) continue;
                const float s = scale[n], er = err[n], nw = norm[n];
                const float a = __fmul_rn(__fmul_rn(acc[v], s), Fm[e]);
                float rad = __fmul_ru(er, Xm[e]);
                rad = __fadd_ru(rad, __fmul_ru(__fadd_ru(nw, er), Gm[e]));
                rad = __fadd_ru(rad, __fmul_ru(gam, __fmul_ru(nw, Xm[e])));
                rad = __fadd_ru(rad, fabsf(a) * 0x1p-22f);
                const float l = __fsub_rd(a, rad), h = __fadd_ru(a, rad);
                lo[m * os + n] = l;
                hi[m * os + n] = h;
                if (l > best[e]) best[e] = l, besti[e] = (int)n; /* NaN never */
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
            c = 0;
            tile += (int64_t)gridDim.x * HB_WARPS;
        }
        if (tile < ntiles)
#pragma unroll
            for (int u = 0; u < HB_UNROLL; u++) head_load(q, K, tile, c + u, lane, &wa[u], &wb[u]);
    }
    /* each x row's best lower bound: over the lanes of one t, then the warps */
#pragma unroll
    for (int e = 0; e < 2; e++)
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best[e], off);
            const int oi = __shfl_xor_sync(0xffffffffu, besti[e], off);
            if (ov > best[e]) best[e] = ov, besti[e] = oi;
        }
    if (g == 0)
#pragma unroll
        for (int e = 0; e < 2; e++) sh.bv[warp][2 * t + e] = best[e], sh.bi[warp][2 * t + e] = besti[e];
    __syncthreads();
    if (threadIdx.x < HB_ROWS) {
        float bv = -INFINITY;
        int bi = -1;
        for (int w = 0; w < HB_WARPS; w++)
            if (sh.bv[w][threadIdx.x] > bv) bv = sh.bv[w][threadIdx.x], bi = sh.bi[w][threadIdx.x];
        pv[blockIdx.x * HB_ROWS + threadIdx.x] = bv;
        pi[blockIdx.x * HB_ROWS + threadIdx.x] = bi;
    }
    if (tr) tr[RT_END] = ds_cu_gtimer();
}

static unsigned head_blocks(const ds_cuda_backend *cb, int64_t V) {
    const int64_t tiles = (V + 15) / 16, want = (tiles + HB_WARPS - 1) / HB_WARPS;
    const int64_t cap = (int64_t)cb->sms * 2; /* 2 blocks an SM (110 registers a thread, 66 KB of x at K = 4096) */
    return (unsigned)(want < cap ? want : cap);
}

/* The workspace: lo, hi [8][V]; the blocks' bests; x in fp16 [8][K] and its xinfo. */
static size_t hb_align(size_t b) { return (b + 255) & ~(size_t)255; }
size_t ds_cu_head_bounds_bytes(const ds_cuda_backend *cb, int64_t V, int64_t K) {
    return hb_align((size_t)HB_ROWS * (size_t)V * sizeof(float) * 2) +
           hb_align((size_t)head_blocks(cb, V) * HB_ROWS * (sizeof(float) + sizeof(int))) +
           hb_align((size_t)HB_ROWS * (size_t)K * sizeof(__half)) + 3 * HB_ROWS * sizeof(float);
}

bool ds_cu_head_bounds_run(ds_cuda_backend *cb, const struct ds_cu_head *h, ds_tensor x, void *ws,
                           ds_cu_head_bounds *out) {
    const int M = (int)x.rows;
    if (M < 1 || M > HB_ROWS || x.cols != h->K || x.dtype != DS_F32) {
        ds_cu_fail(cb, "head bounds", "x %lldx%lld (%s) does not fit a %lld x %lld head (1..%d fp32 rows)",
                   (long long)x.rows, (long long)x.cols, ds_dtype_name(x.dtype), (long long)h->V, (long long)h->K,
                   HB_ROWS);
        return false;
    }
    const unsigned blocks = head_blocks(cb, h->V);
    float *lo = (float *)ws, *hi = lo + (size_t)HB_ROWS * h->V;
    char *part = (char *)ws + hb_align((size_t)HB_ROWS * h->V * sizeof(float) * 2);
    float *pv = (float *)part;
    int *pi = (int *)(part + (size_t)blocks * HB_ROWS * sizeof(float));
    __half *xg = (__half *)(part + hb_align((size_t)blocks * HB_ROWS * (sizeof(float) + sizeof(int))));
    float *xinfo = (float *)(xg + hb_align((size_t)HB_ROWS * h->K * sizeof(__half)) / sizeof(__half));
    ds_cu_launch(head_x_kernel, HB_ROWS, HB_THREADS, cb->stream, (const float *)x.data, x.stride, M, (int)h->K, xg,
                 xinfo);
    if (!ds_cu_launched(cb, "head bounds")) return false;
    const size_t smem = (size_t)HB_ROWS * (h->K + 8) * sizeof(__half);
    static ds_cu_smem_allowed allowed;
    if (!ds_cu_allow_smem(cb, "head bounds", head_bounds_kernel, &allowed, smem)) return false;
    ds_cu_launch_smem(head_bounds_kernel, blocks, HB_THREADS, smem, cb->stream, (const uint8_t *)h->q,
                      (const float *)h->scale, (const float *)h->err, (const float *)h->norm, (const __half *)xg,
                      (const float *)xinfo, M, (int)h->K, h->V, lo, hi, h->V, pv, pi,
                      ds_cu_ring_trace_slot(cb, M, RT_KIND_HEAD_BOUNDS, 0, (int)blocks));
    if (!ds_cu_launched(cb, "head bounds")) return false;
    *out = ds_cu_head_bounds{lo, hi, h->V, pv, pi, (int)blocks};
    return true;
}

void ds_cu_head_free(ds_cuda_backend *cb) {
    struct ds_cu_head *h = cb->head;
    if (!h) return;
    if (h->q) cudaFree(h->q);
    if (h->scale) cudaFree(h->scale);
    free(h);
    cb->head = NULL;
}

void ds_cu_head_drop(ds_cuda_backend *cb, const void *w) {
    if (cb->head && cb->head->w == w) ds_cu_head_free(cb);
}

const struct ds_cu_head *ds_cu_head_of(ds_cuda_backend *cb, ds_tensor w) {
    struct ds_cu_head *h = cb->head;
    if (h && h->w == w.data && h->V == w.rows && h->K == w.cols && h->ws == w.stride) return h->declined ? NULL : h;
    if (cb->reg.capturing || !ds_cu_head_fits(w)) return NULL;
    ds_cu_head_free(cb);
    h = (struct ds_cu_head *)calloc(1, sizeof *h);
    if (!h) return NULL;
    cb->head = h;
    h->w = w.data, h->V = w.rows, h->K = w.cols, h->ws = w.stride;
    /* Only while a quarter of the device's memory stays free after it (as the ring's box copies). */
    size_t free_b = 0, total_b = 0;
    const size_t qb = (size_t)((w.rows + 15) / 16) * 16 * (size_t)w.cols, fb = (size_t)w.rows * 3 * sizeof(float);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < qb + fb + total_b / 4 ||
        cudaMalloc((void **)&h->q, qb) != cudaSuccess || cudaMalloc((void **)&h->scale, fb) != cudaSuccess) {
        (void)cudaGetLastError();
        h->declined = true;
        return NULL;
    }
    cb->gen++; /* new device memory: recordings are made again */
    if (!ds_cu_ok(cb, "head bound", cudaMemsetAsync(h->q, 0x80, qb, cb->stream))) { /* the last tile's padding: q = 0 */
        h->declined = true;
        return NULL;
    }
    h->err = h->scale + w.rows;
    h->norm = h->err + w.rows;
    ds_cu_launch(head_quant_kernel, (unsigned)((w.rows + HB_WARPS - 1) / HB_WARPS), HB_THREADS, cb->stream,
                 (const uint16_t *)w.data, w.stride, w.rows, (int)w.cols, h->q, h->scale, h->err, h->norm);
    if (!ds_cu_launched(cb, "head bound")) {
        h->declined = true;
        return NULL;
    }
    return h;
}
