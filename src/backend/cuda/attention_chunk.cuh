/* The chunk kernels' common ground (attention.cu's attn_chunk_kernel and
 * attention_staged.cu's attn_staged_kernel): the launch geometry, a lane's
 * share of a head, one key's step of the online softmax and the merge of
 * the key groups. Both kernels take every query through these same
 * operations in the same order, so a row gets the same bits from either. */
#ifndef DS_CUDA_ATTENTION_CHUNK_CUH
#define DS_CUDA_ATTENTION_CHUNK_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/norm_rope_math.cuh"

#define ATT_THREADS 256 /* 16..64 keys in flight per block: decode is latency-bound */
#define ATT_CHUNK 256
/* Largest partial buffer one launch may use; rows per launch shrink to fit. */
#define ATT_PART_BYTES ((size_t)256 << 20)

typedef struct {
    int32_t v[DS_CU_ROWS];
} pos_arg;

/* A paged launch's table (ds_cu_pages, by value: each row's list start
 * needs no round trip); nothing for a contiguous one. */
template <bool PAGED> struct page_arg {};
template <> struct page_arg<true> {
    const int32_t *tab; /* device */
    int page_rows;
    int32_t base[DS_CU_ROWS];
};

#define ATT_FRESH_MAX 8           /* rows (fresh keys) of a fused launch */
#define ATT_FRESH_DIM NR_THREADS  /* largest head: the per-head norm's one element per thread */

/* The fused launch's step: raw q, k, v rows (QKV's outputs; row i at the
 * launch's row i position), the norm weights, the caches, RoPE's
 * frequencies. */
typedef struct {
    const float *q, *k, *v;
    int64_t qs, ks, vs;
    const void *qw, *kw;
    int qwdt, kwdt, n;
    float *kc, *vc;
    int64_t kcs, vcs;
    float eps;
    float inv_freq[ATT_FRESH_DIM / 2];
} fresh_arg;

typedef struct {
    const float *q, *k, *v;
    float *out, *part;
    int64_t qs, ks, vs, os;
    int H, group, D, Dv, n_keys, causal, window, ring;
    float scale;
    int c0, ny; /* chunks c0 .. c0+ny-1 are gridDim.y */
    const int32_t *dpos, *dnk; /* a step region's positions (of the launch's rows) and n_keys, or NULL */
    int vec;     /* q, k, v rows (and a fused launch's fresh v rows) 16-byte aligned: vector loads */
    int kvf16;   /* 16-bit caches (KB = 2) hold f16, not bf16 (model/kv_cache.h) */
    unsigned long long *trace; /* DS_CUDA_RING_TRACE: this launch's slot (ring_trace.h), or NULL */
} att_geo;

/* Row m's position and key range. */
__device__ __forceinline__ int row_pos(const att_geo &g, const pos_arg &pa, int m) {
    return g.dpos ? g.dpos[m] : pa.v[m];
}

/* The step's n_keys: a step region's from the device. */
__device__ __forceinline__ int step_keys(const att_geo &g) { return g.dnk ? *g.dnk : g.n_keys; }
/* Row m's key limit: the launch's. */
__device__ __forceinline__ int row_keys(const att_geo &g, const pos_arg &, int) { return step_keys(g); }
__device__ __forceinline__ void key_range_of(const att_geo &g, int pos, int n_keys, int *lo, int *hi) {
    int a = 0, b = n_keys;
    if (g.causal) {
        if (pos + 1 < b) b = pos + 1;
        if (g.window > 0 && pos - g.window + 1 > a) a = pos - g.window + 1;
    }
    *lo = a;
    *hi = b;
}
__device__ __forceinline__ void key_range(const att_geo &g, int pos, int *lo, int *hi) {
    key_range_of(g, pos, step_keys(g), lo, hi);
}

/* A lane's element i of a head: the lane's i / 4-th group of four
 * consecutive elements, the L lanes of a key side by side (d = 4L * (i / 4)
 * + 4 li + i % 4), so that each group is one 16-byte load where the rows
 * allow it (g.vec) and the L lanes read consecutive 16-byte words (no bank
 * conflict in shared memory). A head's dot product and output take the
 * elements in i order either way: the same bits with or without vectors. */
template <int L>
__device__ __forceinline__ int lane_dim(int li, int i) {
    return (i >> 2) * (4 * L) + 4 * li + (i & 3);
}

/* n (a multiple of 4) elements of row r in lane_dim order into e, zeros
 * past lim or where !ok; vec: 16-byte loads. */
template <int L, int NPL>
__device__ __forceinline__ void load_lane_row(const float *r, bool ok, int lim, int li, bool vec, float e[NPL]) {
#pragma unroll
    for (int c = 0; c < NPL / 4; c++) {
        const int d0 = lane_dim<L>(li, 4 * c);
        if (vec) {
            const float4 x = ok && d0 < lim ? *(const float4 *)(r + d0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            e[4 * c] = x.x, e[4 * c + 1] = x.y, e[4 * c + 2] = x.z, e[4 * c + 3] = x.w;
        } else {
#pragma unroll
            for (int u = 0; u < 4; u++) e[4 * c + u] = ok && d0 + u < lim ? r[d0 + u] : 0.0f;
        }
    }
}

/* load_lane_row from a bf16 / f16 cache row (f16: f16), each element
 * widened to fp32 (exact): the values an fp32 cache holding them gives.
 * vec: 8-byte loads (the rows that allow fp32's 16-byte loads allow them). */
template <int L, int NPL>
__device__ __forceinline__ void load_lane_row16(const uint16_t *r, bool ok, int lim, int li, bool vec, bool f16,
                                                float e[NPL]) {
#pragma unroll
    for (int c = 0; c < NPL / 4; c++) {
        const int d0 = lane_dim<L>(li, 4 * c);
        uint32_t u[4];
        if (vec) {
            const uint2 x = ok && d0 < lim ? *(const uint2 *)(r + d0) : make_uint2(0u, 0u);
            u[0] = x.x & 0xffffu, u[1] = x.x >> 16, u[2] = x.y & 0xffffu, u[3] = x.y >> 16;
        } else {
#pragma unroll
            for (int v = 0; v < 4; v++) u[v] = ok && d0 + v < lim ? r[d0 + v] : 0u;
        }
#pragma unroll
        for (int v = 0; v < 4; v++) e[4 * c + v] = ds_cu_from16(u[v], f16);
    }
}


/* One key's score's contribution to the running softmax of one query:
 * the operations written out (no contraction left to the compiler), so a
 * query's result is the same bits whichever R its block packs. */
template <int L, int NPL>
__device__ __forceinline__ void att_update(float scale, int Dv, bool valid, float s, const float vv[NPL], int li,
                                           float *mx, float *l, float o[NPL]) {
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
    if (!valid) return;
    s = __fmul_rn(s, scale);
    const float mn = fmaxf(*mx, s);
    const float corr = expf(*mx - mn), p = expf(s - mn);
    *l = __fmaf_rn(*l, corr, p);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        if (lane_dim<L>(li, i) < Dv) o[i] = __fmaf_rn(o[i], corr, __fmul_rn(p, vv[i]));
    }
    *mx = mn;
}

/* R queries' running softmax states before their first key. */
template <int R, int NPL>
__device__ __forceinline__ void att_state_init(float o[R][NPL], float mx[R], float l[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        mx[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; i++) o[r][i] = 0.0f;
    }
}

/* The merge of a block's G key groups for one query, part one (a whole warp;
 * a group that saw no key has l = 0): the largest max (exact in any order),
 * each group's factor exp(m_k - M) into sf, and lane 0 the sum of l_k times
 * its factor in group order; ml = {M, lsum}. */
template <int G>
__device__ __forceinline__ void att_merge_warp(const float *sm, const float *sl, float *sf, float *ml) {
    const int lane = threadIdx.x & 31;
    float M = -INFINITY;
    for (int k = lane; k < G; k += 32)
        if (sl[k] > 0) M = fmaxf(M, sm[k]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    for (int k = lane; k < G; k += 32) sf[k] = sl[k] > 0 ? expf(sm[k] - M) : 0.0f;
    __syncwarp();
    if (lane == 0) {
        float lsum = 0.0f;
        for (int k = 0; k < G; k++)
            if (sl[k] > 0) lsum = __fmaf_rn(sl[k], sf[k], lsum);
        ml[0] = M;
        ml[1] = lsum;
    }
}

/* Part two, one output element: the groups' outputs so[k * os] times their
 * factors, summed in group order. */
template <int G>
__device__ __forceinline__ float att_merge_dim(const float *so, int os, const float *sf, const float *sl) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++)
        if (sl[k] > 0) acc = __fmaf_rn(so[k * os], sf[k], acc);
    return acc;
}

/* Merges the chunk partials of rows whose keys span several chunks, in
 * chunk order. One block per (row, head); PA: the launch's positions
 * (row_pos(g, pa, m)). */
template <typename PA>
__global__ void attn_combine_kernel(att_geo g, PA pa) {
    ds_cu_grid_wait_only(); /* o_proj let in once the partials' sums are read, as in attn_chunk_kernel */
    const int m = blockIdx.x / g.H, h = blockIdx.x % g.H;
    int lo, hi;
    key_range_of(g, row_pos(g, pa, m), row_keys(g, pa, m), &lo, &hi);
    if (hi <= lo) return;
    const int cfirst = lo / ATT_CHUNK, clast = (hi - 1) / ATT_CHUNK;
    if (cfirst == clast) return;
    const int64_t w = g.Dv + 2;
    const float *pp = g.part + ((int64_t)m * g.H + h) * g.ny * w;
    float M = -INFINITY, lsum = 0.0f;
    for (int c = cfirst; c <= clast; c++) M = fmaxf(M, pp[(c - g.c0) * w]);
    for (int c = cfirst; c <= clast; c++) lsum += pp[(c - g.c0) * w + 1] * expf(pp[(c - g.c0) * w] - M);
    ds_cu_grid_trigger();
    float *orow = g.out + m * g.os + (int64_t)h * g.Dv;
    for (int d = threadIdx.x; d < g.Dv; d += blockDim.x) {
        float acc = 0.0f;
        for (int c = cfirst; c <= clast; c++) acc += pp[(c - g.c0) * w + 2 + d] * expf(pp[(c - g.c0) * w] - M);
        orow[d] = acc / lsum;
    }
}

/* A key (value) row staged in shared memory: D elements of kb bytes, padded
 * so that the groups of lanes one shared-memory access serves (128 bytes a
 * phase, 4 L kb bytes a group) fall in different banks. */
static inline int att_stage_row_bytes(int D, int kb, int L) {
    const int want = 4 * L * kb % 128, raw = D * kb;
    return raw + ((want - raw) % 128 + 128) % 128;
}

/* The staged kernel for a paged launch (attention_staged.cu): false where
 * its conditions do not hold (head sizes past 128, rows not 16-byte
 * aligned), nothing launched. */
bool ds_cu_attention_staged(ds_cuda_backend *cb, dim3 grid, int R, const att_geo &g, const pos_arg &pa,
                            const page_arg<true> &pg, int kb, int dmax);

/* The geometry of a call of out / q / k / v under p (g.out, g.q at row 0;
 * the launch fields c0, ny, part, dpos, dnk, trace zero), its caches'
 * element bytes and its larger head size; false (recorded) for heads, head
 * sizes or cache dtypes the kernels do not take (fused: fp32 caches). */
bool ds_cu_att_geo(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *p,
                   bool fused, att_geo *g, int *kb, int *dmax);


#endif
