/* The per-head RMSNorm + RoPE arithmetic (Qwen3's q/k path), written once
 * for the standalone kernel (norm_rope.cu: one 128-thread block a head) and
 * for the attention kernel that norms and rotates its own q and the step's
 * fresh keys (attention.cu: one warp a head): the same operations in the
 * same order, so a key stored by either is the same bits. Products and
 * sums are rounded explicitly: the compiler may not fuse them into FMAs in
 * one kernel and not in the other. */
#ifndef DS_CUDA_NORM_ROPE_MATH_CUH
#define DS_CUDA_NORM_ROPE_MATH_CUH

#include "backend/cuda/cuda_internal.h"

#define NR_THREADS 128 /* the order's thread count: thread i takes elements i, i + 128, ... */

/* 1 / rms(v[0..dim)) over a block of T threads, in an order fixed by T and
 * dim: each thread's squares of elements i, i + T, ... in order, a warp
 * butterfly, the warps' sums (their lane 0's) in order. The per-head norm
 * uses T = NR_THREADS. */
template <int T> __device__ __forceinline__ float nr_block_inv_rms(const float *v, int dim, float eps, float *part) {
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += T) ss = fmaf(v[i], v[i], ss);
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = part[0];
    for (int i = 1; i < T / 32; i++) total += part[i];
    return 1.0f / sqrtf(total / (float)dim + eps);
}

/* The same value by one warp for dim <= NR_THREADS (one element per thread
 * of the block order): lane l holds the squares of elements l + 32 w for
 * the four groups w, each butterflied as the block's warp w does, and lane
 * 0's four sums are added in order. v: the head in shared memory. */
__device__ __forceinline__ float nr_warp_inv_rms(const float *v, int dim, float eps) {
    const int lane = threadIdx.x & 31;
    float part[NR_THREADS / 32];
#pragma unroll
    for (int w = 0; w < NR_THREADS / 32; w++) {
        const int i = lane + 32 * w;
        float ss = 0;
        if (i < dim) ss = fmaf(v[i], v[i], ss);
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        part[w] = __shfl_sync(0xffffffffu, ss, 0);
    }
    float total = part[0];
#pragma unroll
    for (int w = 1; w < NR_THREADS / 32; w++) total += part[w];
    return 1.0f / sqrtf(total / (float)dim + eps);
}

/* Pair (i, i + half) of a head: normed by rs and the weight's values wi,
 * wh (has_w false: none), rotated by pos * inv_freq. The weights come as
 * values so a caller can load them before its norm's reduction. */
__device__ __forceinline__ void nr_rotate_wv(float vi, float vh, float rs, bool has_w, float wi, float wh, int pos,
                                             float inv_freq, float *oi, float *oh) {
    float p = __fmul_rn(vi, rs), q = __fmul_rn(vh, rs);
    if (has_w) {
        p = __fmul_rn(p, wi);
        q = __fmul_rn(q, wh);
    }
    const float ang = __fmul_rn((float)pos, inv_freq);
    float s, c;
    sincosf(ang, &s, &c); /* one range reduction and one copy of its slow path's code, not two */
    *oi = __fsub_rn(__fmul_rn(p, c), __fmul_rn(q, s));
    *oh = __fadd_rn(__fmul_rn(q, c), __fmul_rn(p, s));
}

/* The same with the weight w (NULL: none) read here. */
__device__ __forceinline__ void nr_rotate(float vi, float vh, float rs, const void *w, int wdtype, int i, int half,
                                          int pos, float inv_freq, float *oi, float *oh) {
    const float wi = w ? ds_cu_load(w, wdtype, i) : 1.0f, wh = w ? ds_cu_load(w, wdtype, i + half) : 1.0f;
    nr_rotate_wv(vi, vh, rs, w != NULL, wi, wh, pos, inv_freq, oi, oh);
}

#endif
