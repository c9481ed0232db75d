/* Attention over a KV cache on the GPU (decode, verify, prefill chunks and
 * the drafter's non-causal block), fp32 scores and online softmax.
 *
 * Keys are cut into fixed chunks of absolute positions [c*CHUNK, (c+1)*CHUNK).
 * One block handles one (query row, head, chunk): its groups of lanes take
 * the chunk's keys in a fixed interleave, each keeping a running max, sum
 * and output, merged in group order at the end. A row whose keys fall in
 * one chunk is finished there; otherwise the chunk partials are merged in
 * chunk order by a second kernel. Every step depends only on the row's own
 * key range [lo, hi) and the head size, never on the other rows of the call
 * or on n_keys beyond that range, so a row's result is bit-identical
 * whether it is decoded alone or verified with others.
 *
 * In a step region (graphs.cu) the positions and n_keys are read from the
 * device and the grid spans chunks 0 .. att_ny-1, a bucket of n_keys fixed
 * by the recording: blocks of chunks outside a row's keys exit at once and
 * the partials are merged over the row's own chunks, so the values are the
 * same as with the grid the host would size from the live positions.
 *
 * Fused with the step's q/k norms, RoPE and K/V store (qk_norm_rope_attention,
 * decode and verification of up to ATT_FRESH_MAX rows): each block norms and
 * rotates its own q head and, where its chunk holds them, the step's fresh
 * keys of its kv head (one warp a head, norm_rope_math.cuh's arithmetic:
 * the bits the standalone kernel stores), reads them from shared memory and
 * the fresh values from QKV's output, and one block per (row, kv head)
 * stores its row's key and value into the caches. One launch and one
 * kernel boundary fewer per layer than the norm kernel followed by
 * attention; the values are the same.
 *
 * Paged caches (attention_paged.cu sends the rows here): the same kernel
 * instantiated with PAGED, which differs only in where key j's row is read
 * from. A block looks its chunk's rows up in the page table once (one row a
 * thread, into shared memory) before its first key; the scores, the order
 * of every sum and the merges are the contiguous kernel's, so a paged row
 * gets the bits it gets from a contiguous cache holding the same keys.
 *
 * K/V caches in bf16 / f16 (the model's dtype, model/kv_cache.h): the chunk
 * kernel instantiated with KB = 2 widens each element as it loads it (8-byte
 * loads where fp32 takes 16), then computes exactly as over an fp32 cache
 * holding those values. The fused launch stays fp32-only: a 16-bit cache
 * takes the two ops (the store kernel, then this one). */
#include <math.h>
#include <string.h>

#include "backend/cuda/attention_chunk.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/norm_rope_math.cuh"
#include "backend/cuda/ring_trace.h"

/* Key j's (zeros past j1) elements of kv head kvh in lane_dim order. FRESH:
 * keys from position f0 on are the step's, normed and rotated in fk, their
 * values in QKV's output. PAGED: key j's cache row is srow[j - j0]. KB: the
 * caches' element bytes (4: fp32; 2: bf16 / f16, widened as read). */
template <int L, int NPL, bool FRESH, bool PAGED = false, int KB = 4>
__device__ __forceinline__ void load_kv(const att_geo &g, int j, int j1, int kvh, int li, float kv[NPL],
                                        float vv[NPL], const fresh_arg &fa, int f0,
                                        const float (*fk)[ATT_FRESH_DIM], const int32_t *srow = nullptr,
                                        int j0 = 0) {
    const bool valid = j < j1;
    if (FRESH && valid && j >= f0) {
        load_lane_row<L, NPL>(fk[j - f0], true, g.D, li, g.vec, kv);
        load_lane_row<L, NPL>(fa.v + (int64_t)(j - f0) * fa.vs + (int64_t)kvh * g.Dv, true, g.Dv, li, g.vec, vv);
        return;
    }
    const int64_t row = PAGED ? (valid ? (int64_t)srow[j - j0] : 0) : g.ring > 0 ? j % g.ring : j;
    if constexpr (KB == 2) {
        const uint16_t *k16 = (const uint16_t *)(const void *)g.k, *v16 = (const uint16_t *)(const void *)g.v;
        load_lane_row16<L, NPL>(k16 + row * g.ks + (int64_t)kvh * g.D, valid, g.D, li, g.vec, g.kvf16, kv);
        load_lane_row16<L, NPL>(v16 + row * g.vs + (int64_t)kvh * g.Dv, valid, g.Dv, li, g.vec, g.kvf16, vv);
        return;
    }
    load_lane_row<L, NPL>(g.k + row * g.ks + (int64_t)kvh * g.D, valid, g.D, li, g.vec, kv);
    load_lane_row<L, NPL>(g.v + row * g.vs + (int64_t)kvh * g.Dv, valid, g.Dv, li, g.vec, vv);
}

/* DS_CUDA_RING_TRACE: thread 0's timestamp (the slot is re-read from the parameters each time: no register
 * held across the kernel for it). */
__device__ __forceinline__ void att_stamp(const att_geo &g, int field) {
    if (g.trace && threadIdx.x == 0) ds_cu_trace_block(g.trace)[field] = ds_cu_gtimer();
}

/* FRESH, in three parts so that one round trip to memory follows the grid
 * wait instead of five (each trip ~0.8 us of a prologue on the critical path).
 * fresh_consts: a lane's pairs of q's and k's norm weights and RoPE's
 * frequencies. They are never written by a kernel, but loading them before
 * the wait held it up: a block enters only as QKV's leave (its registers do
 * not fit beside them), so it reached the wait a trip to HBM later (traced,
 * verify of 8 rows: the last wait returned 2.7 us after QKV's end; the q/k
 * norm kernel's, resident early, 0.7). So they are only requested into L2
 * before the wait (fresh_consts_prefetch) and loaded with the rows after
 * it, in the same round trip (without the prefetch, verify of 8 rows ~1.5 %
 * slower). */
#define ATT_FRESH_E (ATT_FRESH_DIM / 32) /* a lane's elements of a head */
#define ATT_FRESH_P (ATT_FRESH_DIM / 64) /* a lane's pairs (i, i + half) */
typedef struct { /* the norm weights' raw bits: widened where used, so their loads are not waited for early */
    uint32_t qi[ATT_FRESH_P], qh[ATT_FRESH_P], ki[ATT_FRESH_P], kh[ATT_FRESH_P];
    float f[ATT_FRESH_P];
} fresh_consts;

__device__ __forceinline__ void fresh_consts_prefetch(const att_geo &g, const fresh_arg &fa) {
    /* Threads 0..n: q's weight, a line each (the last one its last byte's: the weight need not start a
     * line); threads 32..32+n: k's. */
    const int t = threadIdx.x & 31, wk = threadIdx.x >> 5;
    const void *w = wk == 0 ? fa.qw : wk == 1 ? fa.kw : NULL;
    const int bytes = g.D * ((wk == 0 ? fa.qwdt : fa.kwdt) == DS_F32 ? 4 : 2);
    if (w && 128 * t < bytes + 127)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)w + min(128 * t, bytes - 1)));
}

__device__ __forceinline__ void fresh_consts_load(const att_geo &g, const fresh_arg &fa, fresh_consts *c) {
    const int lane = threadIdx.x & 31, half = g.D / 2;
#pragma unroll
    for (int k = 0; k < ATT_FRESH_P; k++) {
        const int i = lane + 32 * k;
        const bool in = i < half;
        c->qi[k] = fa.qw && in ? ds_cu_load_bits(fa.qw, fa.qwdt, i) : 0u;
        c->qh[k] = fa.qw && in ? ds_cu_load_bits(fa.qw, fa.qwdt, i + half) : 0u;
        c->ki[k] = fa.kw && in ? ds_cu_load_bits(fa.kw, fa.kwdt, i) : 0u;
        c->kh[k] = fa.kw && in ? ds_cu_load_bits(fa.kw, fa.kwdt, i + half) : 0u;
        c->f[k] = in ? fa.inv_freq[i] : 0.0f;
    }
}

/* The heads a warp norms (t = warp, warp + warps, ...: t < R the q head
 * h0 + t, R + i the step's key i) and their elements, requested right after
 * the wait, before the positions are known (all the step's keys: a block
 * that needs none of them leaves its copies unread). */
template <int R> struct fresh_rows {
    static constexpr int T = (R + ATT_FRESH_MAX + ATT_THREADS / 32 - 1) / (ATT_THREADS / 32);
    float e[T][ATT_FRESH_E];
};

/* The step's keys row m's attention sees (a causal row: those up to its own). */
__device__ __forceinline__ int fresh_seen(const att_geo &g, const fresh_arg &fa, int m) {
    return g.causal && m + 1 < fa.n ? m + 1 : fa.n;
}

template <int R>
__device__ __forceinline__ void fresh_rows_load(const att_geo &g, const fresh_arg &fa, int m, int h0, int kvh,
                                                fresh_rows<R> *rw) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < fresh_rows<R>::T; u++) {
        const int t = warp + u * (ATT_THREADS / 32);
        const bool key = t >= R;
        const float *src = key ? fa.k + (int64_t)(t - R) * fa.ks + (int64_t)kvh * g.D
                               : fa.q + (int64_t)m * fa.qs + (int64_t)(h0 + t) * g.D;
#pragma unroll
        for (int k = 0; k < ATT_FRESH_E; k++)
            rw->e[u][k] = t < R + fresh_seen(g, fa, m) && lane + 32 * k < g.D ? src[lane + 32 * k] : 0.0f;
    }
}

/* The block's R q heads and (where its chunk holds them, or it stores one)
 * the step's keys its row sees of its kv head, normed and rotated into
 * shared memory, one warp a head; the first block of each (row m, kv head)
 * in the grid's first chunk stores the step's key m and its value in the
 * caches. (Row 0's blocks stored all the step's keys: they norm all of them
 * and took ~1.5 us longer than the rest, which waited on them.) */
template <int R>
__device__ __forceinline__ void fresh_prologue(const att_geo &g, int f0, int pos_m, const fresh_arg &fa, int m,
                                               int h0, int kvh, const fresh_consts &cs, const fresh_rows<R> &rw,
                                               float (*sq)[ATT_FRESH_DIM], float (*fk)[ATT_FRESH_DIM]) {
    const int c = g.c0 + (int)blockIdx.y, half = g.D / 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nk = fresh_seen(g, fa, m); /* m < nk: a storing block norms its key m */
    const bool store = blockIdx.y == 0 && h0 % g.group == 0;
    const bool keys = store || (c * ATT_CHUNK < f0 + nk && (c + 1) * ATT_CHUNK > f0);
    /* One copy of the norm and rotation code, not one per item: the fused
     * kernel's prologue is code run once per launch, fetched from memory. */
#pragma unroll 1
    for (int u = 0; u < fresh_rows<R>::T; u++) {
        const int t = warp + u * (ATT_THREADS / 32);
        if (t >= R + (keys ? nk : 0)) break;
        const bool key = t >= R;
        float *dst = key ? fk[t - R] : sq[t];
#pragma unroll
        for (int k = 0; k < ATT_FRESH_E; k++) {
            float e = rw.e[0][k]; /* rw.e[u][k] without indexing a register array by u */
#pragma unroll
            for (int uu = 1; uu < fresh_rows<R>::T; uu++)
                if (u == uu) e = rw.e[uu][k];
            if (lane + 32 * k < g.D) dst[lane + 32 * k] = e;
        }
        __syncwarp();
        if (u == 0) att_stamp(g, RT_NW); /* the rows are in */
        const float rs = nr_warp_inv_rms(dst, g.D, fa.eps);
        const int pos = key ? f0 + (t - R) : pos_m; /* the fused step's positions are consecutive */
        const bool has_w = key ? fa.kw != NULL : fa.qw != NULL;
#pragma unroll
        for (int k = 0; k < ATT_FRESH_P; k++) { /* a lane rewrites only its own pairs, read by it alone */
            const int i = lane + 32 * k;
            if (i >= half) break;
            float oi, oh;
            /* the weights' bits widened here (used only where has_w) */
            const float wi = ds_cu_widen(key ? cs.ki[k] : cs.qi[k], key ? fa.kwdt : fa.qwdt);
            const float wh = ds_cu_widen(key ? cs.kh[k] : cs.qh[k], key ? fa.kwdt : fa.qwdt);
            nr_rotate_wv(dst[i], dst[i + half], rs, has_w, wi, wh, pos, cs.f[k], &oi, &oh);
            dst[i] = oi;
            dst[i + half] = oh;
        }
        __syncwarp();
    }
    att_stamp(g, RT_XDONE); /* warp 0's heads normed and rotated */
    __syncthreads();
    att_stamp(g, RT_SYNCED);
    if (!store) return;
    float *kc = fa.kc + (int64_t)(f0 + m) * fa.kcs + (int64_t)kvh * g.D;
    float *vc = fa.vc + (int64_t)(f0 + m) * fa.vcs + (int64_t)kvh * g.Dv;
    const float *vr = fa.v + (int64_t)m * fa.vs + (int64_t)kvh * g.Dv;
    for (int d = threadIdx.x; d < g.D; d += ATT_THREADS) kc[d] = fk[m][d];
    for (int d = threadIdx.x; d < g.Dv; d += ATT_THREADS) vc[d] = vr[d];
}


/* L lanes per key, NPL head dimensions per lane (d = lane + L*i); a block
 * takes R query heads of one kv head (R divides the GQA group): each key
 * and value is loaded once for the R heads, which a block per head would
 * each load again (verify of 8 rows at GQA 4 read every key 32 times).
 * Every head's arithmetic is the same, in the same order, as with R = 1. */
template <int L, int NPL, int R, bool FRESH, int A = 1, bool PAGED = false, int KB = 4>
__global__ void __launch_bounds__(ATT_THREADS) attn_chunk_kernel(att_geo g, pos_arg pa, fresh_arg fa,
                                                                 page_arg<PAGED> pg) {
    static_assert(!(FRESH && PAGED), "the fused step stores into a contiguous cache");
    static_assert(!(FRESH && KB != 4), "the fused step stores into an fp32 cache (16-bit ones take the two ops)");
    /* The next kernel (o_proj) is let in only once this block has its keys:
     * scheduled at the wait, its blocks' weight streams took HBM from these
     * latency-bound key loads (the AR step ~2 % slower at the Qwen3-8B shape). */
    att_stamp(g, RT_ENTRY);
    fresh_consts cs;
    if constexpr (FRESH) fresh_consts_prefetch(g, fa);
    ds_cu_grid_wait_only();
    att_stamp(g, RT_WAIT);
    constexpr int G = ATT_THREADS / L; /* key groups per block */
    constexpr bool QS = FRESH || R > 1; /* the queries in shared memory (normed there when FRESH) */
    __shared__ float s_m[G], s_l[G], s_f[G], s_ml[2];
    __shared__ float s_o[G][L * NPL];
    __shared__ __align__(16) float s_fk[FRESH ? ATT_FRESH_MAX : 1][ATT_FRESH_DIM];
    __shared__ __align__(16) float s_q[QS ? R : 1][QS ? ATT_FRESH_DIM : 1];
    const int hpr = g.H / R; /* blocks per row */
    const int m = blockIdx.x / hpr, h0 = (blockIdx.x % hpr) * R, c = g.c0 + (int)blockIdx.y;
    /* Every load the prologue needs is requested before any is used: the positions and n_keys, then (FRESH)
     * the rows and the norm weights' bits, one round trip in all (the keys' loop begins ~1 us sooner after
     * the wait than with the positions loaded after the rows). */
    const int pos_m = row_pos(g, pa, m), f0 = FRESH ? row_pos(g, pa, 0) : 0, n_keys = step_keys(g);
    fresh_rows<R> rw;
    if constexpr (FRESH) fresh_rows_load<R>(g, fa, m, h0, h0 / g.group, &rw);
    if constexpr (FRESH) fresh_consts_load(g, fa, &cs);
    const int grp = threadIdx.x / L, li = threadIdx.x % L, kvh = h0 / g.group;
    float qv[NPL]; /* !QS: the query, requested with the positions (the row's there whatever its keys) */
    if (!QS) load_lane_row<L, NPL>(g.q + m * g.qs + (int64_t)h0 * g.D, true, g.D, li, g.vec, qv);
    int lo, hi;
    key_range_of(g, pos_m, n_keys, &lo, &hi);
    const int cfirst = lo / ATT_CHUNK, clast = hi > lo ? (hi - 1) / ATT_CHUNK : -1;
    const int j0 = max(lo, c * ATT_CHUNK), j1 = min(hi, (c + 1) * ATT_CHUNK);
    /* The key's and the value's elements are loaded together, one group of
     * keys ahead: the next group's round trip to memory overlaps this
     * group's scores (decode is a chain of such round trips). FRESH: the
     * first group's keys from before the step (in the caches since an
     * earlier launch) are requested before the prologue, so their round
     * trip overlaps its own. */
    float kv[NPL], vv[NPL];
    const bool early = FRESH && c >= cfirst && c <= clast && j0 + grp < min(j1, f0);
    if (early) load_kv<L, NPL, false>(g, j0 + grp, j1, kvh, li, kv, vv, fa, f0, s_fk);
    if constexpr (FRESH) att_stamp(g, RT_TILE0); /* the positions are in (the early keys are requested) */
    if constexpr (FRESH) fresh_prologue<R>(g, f0, pos_m, fa, m, h0, kvh, cs, rw, s_q, s_fk);
    if (hi <= lo) { /* no keys: zeros, as the CPU */
        if (blockIdx.y == 0)
            for (int e = threadIdx.x; e < R * g.Dv; e += ATT_THREADS)
                g.out[m * g.os + (int64_t)(h0 + e / g.Dv) * g.Dv + e % g.Dv] = 0;
        return;
    }
    if (c < cfirst || c > clast) return;
    const int32_t *srow = nullptr; /* PAGED: the cache rows of keys j0 .. j1-1 */
    if constexpr (PAGED) {
        __shared__ int32_t s_row[ATT_CHUNK];
        const int pr = pg.page_rows, b = pg.base[m];
        for (int t = threadIdx.x; t < j1 - j0; t += ATT_THREADS)
            s_row[t] = pg.tab[b + (j0 + t) / pr] * pr + (j0 + t) % pr;
        srow = s_row;
    }
    if (!FRESH && R > 1) /* the R heads' queries, side by side in the row */
        for (int e = threadIdx.x; e < R * g.D; e += ATT_THREADS)
            s_q[e / g.D][e % g.D] = g.q[m * g.qs + (int64_t)h0 * g.D + e];
    if (PAGED || (!FRESH && R > 1)) __syncthreads();
    float o[R][NPL], mx[R], l[R];
    att_state_init<R, NPL>(o, mx, l);
    if (!early) load_kv<L, NPL, FRESH, PAGED, KB>(g, j0 + grp, j1, kvh, li, kv, vv, fa, f0, s_fk, srow, j0);
    /* A = 2: two groups ahead (a grid of one block an SM or fewer has the
     * registers; decode at prompt 64 is three groups of keys, each a round
     * trip to memory when one ahead). */
    float k2[A > 1 ? NPL : 1], v2[A > 1 ? NPL : 1];
    if constexpr (A > 1)
        load_kv<L, NPL, FRESH, PAGED, KB>(g, j0 + grp + G, j1, kvh, li, k2, v2, fa, f0, s_fk, srow, j0);
    att_stamp(g, RT_FIRST);
    /* Every lane runs the same trip count (the shuffles need the whole warp). */
    for (int jb = j0; jb < j1; jb += G) {
        const int j = jb + grp;
        const bool valid = j < j1;
        float kn[NPL], vn[NPL];
        load_kv<L, NPL, FRESH, PAGED, KB>(g, j + A * G, j1, kvh, li, kn, vn, fa, f0, s_fk, srow, j0);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = 0.0f;
            if (valid) {
#pragma unroll
                for (int c = 0; c < NPL / 4; c++) {
                    const int d0 = lane_dim<L>(li, 4 * c);
                    float q4[4];
                    if (QS && g.vec) {
                        const float4 t = *(const float4 *)&s_q[r][d0];
                        q4[0] = t.x, q4[1] = t.y, q4[2] = t.z, q4[3] = t.w;
                    } else {
#pragma unroll
                        for (int u = 0; u < 4; u++) q4[u] = QS ? s_q[r][d0 + u] : qv[4 * c + u];
                    }
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        if (d0 + u < g.D) s = __fmaf_rn(q4[u], kv[4 * c + u], s);
                }
            }
            att_update<L, NPL>(g.scale, g.Dv, valid, s, vv, li, &mx[r], &l[r], o[r]);
        }
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            if constexpr (A > 1) kv[i] = k2[i], vv[i] = v2[i], k2[i] = kn[i], v2[i] = vn[i];
            else kv[i] = kn[i], vv[i] = vn[i];
        }
    }
    ds_cu_grid_trigger();
    att_stamp(g, RT_PRODUCED);
    const bool single = cfirst == clast;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r) __syncthreads(); /* the previous head's merge has read s_m, s_l, s_o, s_f, s_ml */
        if (li == 0) {
            s_m[grp] = mx[r];
            s_l[grp] = l[r];
        }
#pragma unroll
        for (int i = 0; i < NPL; i++) s_o[grp][lane_dim<L>(li, i)] = o[r][i];
        __syncthreads();
        /* Warp 0 takes the max and each group's factor once (every thread computed all G exponentials before:
         * ~1 us of the block's ~3 us merge at G = 32). */
        if (threadIdx.x < 32) att_merge_warp<G>(s_m, s_l, s_f, s_ml);
        __syncthreads();
        const float M = s_ml[0], lsum = s_ml[1];
        const int h = h0 + r;
        float *orow = g.out + m * g.os + (int64_t)h * g.Dv;
        float *pp = g.part + (((int64_t)m * g.H + h) * g.ny + blockIdx.y) * (g.Dv + 2);
        for (int d = threadIdx.x; d < g.Dv; d += ATT_THREADS) {
            const float acc = att_merge_dim<G>(&s_o[0][d], L * NPL, s_f, s_l);
            if (single) orow[d] = acc / lsum;
            else pp[2 + d] = acc;
        }
        if (!single && threadIdx.x == 0) {
            pp[0] = M;
            pp[1] = lsum;
        }
    }
    att_stamp(g, RT_END);
}

static void key_range_host(const ds_attn_params *p, int pos, int *lo, int *hi) {
    int a = 0, b = p->n_keys;
    if (p->causal) {
        if (pos + 1 < b) b = pos + 1;
        if (p->window > 0 && pos - p->window + 1 > a) a = pos - p->window + 1;
    }
    *lo = a;
    *hi = b;
}

/* The chunk kernel for heads up to 128 with R heads a block (1, 2 or 4),
 * fused or not (never both fused and paged); ahead2 (R = 1): keys two
 * groups ahead. KB: the caches' element bytes (2: bf16 / f16 caches, never
 * fused). */
template <int L, int NPL, bool P, int KB>
static void launch_chunks(ds_cuda_backend *cb, dim3 grid, int R, bool fresh, bool ahead2, const att_geo &g,
                          const pos_arg &pa, const fresh_arg &f, const page_arg<P> &pg) {
    const cudaStream_t s = cb->stream;
    if constexpr (KB == 2) {
        if (ahead2) ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false, 2, P, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 4) ds_cu_launch(attn_chunk_kernel<L, NPL, 4, false, 1, P, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 2) ds_cu_launch(attn_chunk_kernel<L, NPL, 2, false, 1, P, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
        else ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false, 1, P, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
    } else if constexpr (!P) {
        if (ahead2 && fresh) ds_cu_launch(attn_chunk_kernel<L, NPL, 1, true, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (ahead2) ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false, 2>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (fresh && R == 4) ds_cu_launch(attn_chunk_kernel<L, NPL, 4, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (fresh && R == 2) ds_cu_launch(attn_chunk_kernel<L, NPL, 2, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (fresh) ds_cu_launch(attn_chunk_kernel<L, NPL, 1, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 4) ds_cu_launch(attn_chunk_kernel<L, NPL, 4, false>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 2) ds_cu_launch(attn_chunk_kernel<L, NPL, 2, false>, grid, ATT_THREADS, s, g, pa, f, pg);
        else ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false>, grid, ATT_THREADS, s, g, pa, f, pg);
    } else {
        if (ahead2) ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false, 2, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 4) ds_cu_launch(attn_chunk_kernel<L, NPL, 4, false, 1, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else if (R == 2) ds_cu_launch(attn_chunk_kernel<L, NPL, 2, false, 1, true>, grid, ATT_THREADS, s, g, pa, f, pg);
        else ds_cu_launch(attn_chunk_kernel<L, NPL, 1, false, 1, true>, grid, ATT_THREADS, s, g, pa, f, pg);
    }
}

/* The chunk kernel for the head size (the lanes a key and the elements a
 * lane depend on it alone: rows stay invariant). */
template <bool P, int KB>
static void launch_for_heads(ds_cuda_backend *cb, int dmax, dim3 grid, int R, bool fresh, bool ahead2,
                             const att_geo &g, const pos_arg &pa, const fresh_arg &f, const page_arg<P> &pg) {
    const cudaStream_t s = cb->stream;
    if (dmax <= 32) launch_chunks<4, 8, P, KB>(cb, grid, R, fresh, ahead2, g, pa, f, pg);
    else if (dmax <= 64) launch_chunks<4, 16, P, KB>(cb, grid, R, fresh, ahead2, g, pa, f, pg);
    else if (dmax <= 128) launch_chunks<8, 16, P, KB>(cb, grid, R, fresh, ahead2, g, pa, f, pg);
    else if (dmax <= 256)
        ds_cu_launch(attn_chunk_kernel<16, 16, 1, false, 1, P, KB>, grid, ATT_THREADS, s, g, pa, f, pg);
    else ds_cu_launch(attn_chunk_kernel<32, 16, 1, false, 1, P, KB>, grid, ATT_THREADS, s, g, pa, f, pg);
}

bool ds_cu_att_geo(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *p,
                   bool fused, att_geo *gp, int *kbp, int *dmaxp) {
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads) {
        ds_cu_fail(cb, "attention", "%d heads are not a multiple of %d KV heads", p->n_heads, p->n_kv_heads);
        return false;
    }
    const int dmax = p->head_dim > p->v_head_dim ? p->head_dim : p->v_head_dim;
    if (p->head_dim <= 0 || p->v_head_dim <= 0 || dmax > 512) {
        ds_cu_fail(cb, "attention", "head sizes %d / %d (1..512 supported)", p->head_dim, p->v_head_dim);
        return false;
    }
    /* The caches' dtype (model/kv_cache.h): fp32, or bf16 / f16 widened as read (KB 2; never fused). */
    if (!ds_cu_kv_dtype_ok(k.dtype) || v.dtype != k.dtype || (fused && k.dtype != DS_F32)) {
        ds_cu_fail(cb, "attention", "K/V caches of %s / %s (one of fp32, bf16, f16; fp32 when fused)",
                   ds_dtype_name(k.dtype), ds_dtype_name(v.dtype));
        return false;
    }
    att_geo g = {};
    g.kvf16 = k.dtype == DS_F16;
    g.q = (const float *)q.data;
    g.k = (const float *)k.data;
    g.v = (const float *)v.data;
    g.qs = q.stride;
    g.ks = k.stride;
    g.vs = v.stride;
    g.out = (float *)out.data;
    g.os = out.stride;
    g.H = p->n_heads;
    g.group = p->n_heads / p->n_kv_heads;
    g.D = p->head_dim;
    g.Dv = p->v_head_dim;
    g.n_keys = p->n_keys;
    g.causal = p->causal;
    g.window = p->window;
    g.ring = p->ring_size;
    g.scale = p->scale;
    /* 16-byte rows: every row start a multiple of 4 floats from 16-byte aligned bases. */
    const auto al16 = [](const void *ptr) { return ((uintptr_t)ptr & 15) == 0; };
    g.vec = al16(q.data) && al16(k.data) && al16(v.data) && q.stride % 4 == 0 && k.stride % 4 == 0 &&
            v.stride % 4 == 0 && g.D % 4 == 0 && g.Dv % 4 == 0;
    *gp = g;
    *kbp = k.dtype == DS_F32 ? 4 : 2;
    *dmaxp = dmax;
    return true;
}

/* fa: the fused launch's step (qk_norm_rope_attention; its conditions were
 * checked), or NULL. pages: the keys through a page table (never with fa,
 * never in a region), or NULL. */
static void attention_launch(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                             const ds_attn_params *p, const fresh_arg *fa, const ds_cu_pages *pages) {
    const int64_t M = q.rows;
    if (M <= 0 || p->n_heads <= 0) return;
    att_geo g;
    int kb, dmax;
    if (!ds_cu_att_geo(cb, out, q, k, v, p, fa != NULL, &g, &kb, &dmax)) return;
    const auto al16 = [](const void *ptr) { return ((uintptr_t)ptr & 15) == 0; };
    g.vec = g.vec && (!fa || (al16(fa->v) && fa->vs % 4 == 0));
    /* Packing loads a key once for R heads but leaves R times fewer blocks, each with a longer chain of dependent
     * steps: packing every call slowed the AR step ~10 % at the 8B shape (8 blocks a layer instead of 32) and sped
     * verify of 8 rows at prompt 512 up (128 blocks) ~2 %. So a launch packs when its packed grid still has
     * cfg.att_pack_min_blocks blocks (DS_CU_ATT_PACK_MIN_BLOCKS, about one an SM; tests: 1). Each head's result is the
     * same bits either way. */
    const int pack_min = cb->cfg.att_pack_min_blocks > 0 ? cb->cfg.att_pack_min_blocks : INT32_MAX;
    const int32_t *dpos = NULL;
    if (cb->reg.active) {
        if (!(dpos = ds_cu_step_ptr(cb, "attention", p->q_pos, M))) return;
        if (p->n_keys != cb->reg.step->n_keys) {
            ds_cu_fail(cb, "attention", "n_keys %d in a step region whose n_keys is %d", p->n_keys,
                       cb->reg.step->n_keys);
            return;
        }
        g.dnk = ds_cu_step_nkeys(cb);
    }
    for (int64_t r0 = 0; r0 < M;) {
        /* Chunks this launch's rows need; rows per launch bounded by the partial buffer. */
        int n = (int)(M - r0 < DS_CU_ROWS ? M - r0 : DS_CU_ROWS);
        int cmin = 0, cmax = 0;
        bool multi = false;
        /* A region: the bucket's chunks from 0, merged whenever there can be two. */
        for (; dpos;) {
            cmin = 0;
            cmax = cb->reg.att_ny - 1;
            multi = cmax > 0;
            size_t need = (size_t)n * g.H * (size_t)(cmax + 1) * (size_t)(g.Dv + 2) * sizeof(float);
            if (!multi || need <= ATT_PART_BYTES || n == 1) break;
            n = n / 2;
        }
        for (; !dpos;) {
            cmin = 1 << 30;
            cmax = 0;
            multi = false;
            for (int i = 0; i < n; i++) {
                int lo, hi;
                key_range_host(p, p->q_pos[r0 + i], &lo, &hi);
                if (hi <= lo) lo = hi = 0; /* its zeros are written by chunk cmin's block */
                const int cf = lo / ATT_CHUNK, cl = hi > lo ? (hi - 1) / ATT_CHUNK : cf;
                if (cf < cmin) cmin = cf;
                if (cl > cmax) cmax = cl;
                multi |= cl > cf;
            }
            size_t need = (size_t)n * g.H * (size_t)(cmax - cmin + 1) * (size_t)(g.Dv + 2) * sizeof(float);
            if (!multi || need <= ATT_PART_BYTES || n == 1) break;
            n = n / 2;
        }
        g.c0 = cmin;
        g.ny = cmax - cmin + 1;
        g.out = (float *)out.data + r0 * out.stride;
        g.q = (const float *)q.data + r0 * q.stride;
        g.part = NULL;
        if (multi) {
            size_t need = (size_t)n * g.H * (size_t)g.ny * (size_t)(g.Dv + 2) * sizeof(float);
            g.part = (float *)ds_cu_scratch(cb, "attention", need);
            if (!g.part) return;
        }
        pos_arg pa;
        for (int i = 0; i < n; i++) pa.v[i] = dpos ? 0 : p->q_pos[r0 + i];
        g.dpos = dpos ? dpos + r0 : NULL;
        /* Few lanes per key, many keys per block in flight: decode is bound
         * by the latency of fetching keys, not by arithmetic. The choice
         * depends on the head size alone (rows stay invariant). */
        static const fresh_arg none = {};
        const fresh_arg &f = fa ? *fa : none;
        /* The heads a block packs (R, dividing the group): up to 4, for heads up to 128 (the queries in shared
         * memory, R heads' outputs in registers). */
        int R = dmax > ATT_FRESH_DIM ? 1 : g.group % 4 == 0 ? 4 : g.group % 2 == 0 ? 2 : 1;
        page_arg<true> pg = {};
        if (pages) {
            pg.tab = pages->tab;
            pg.page_rows = pages->page_rows;
            for (int i = 0; i < n; i++) pg.base[i] = pages->base[r0 + i];
        }
        /* A batched step's rows: the staged kernel, packed (attention_staged.cu), where it fits. */
        g.trace = NULL;
        const bool staged =
            pages && ds_cu_attention_staged(cb, dim3((unsigned)(n * g.H / R), (unsigned)g.ny), R, g, pa, pg, kb, dmax);
        if (!staged) {
            const int64_t packed = (int64_t)n * g.H / R * g.ny;
            /* Beyond a wave, packing trades blocks that fit beside each other for ones that do not (R = 4 holds
             * 168 registers a thread: one block an SM; a batched step's 64 decode rows at the 8B shape ran 512
             * such blocks in 3.9 waves, 154 us, issue-bound at 11.4 cycles an instruction: ncu, session 37). */
            if (packed < pack_min || packed > cb->sms) R = 1;
            dim3 grid((unsigned)(n * g.H / R), (unsigned)g.ny);
            g.trace = ds_cu_ring_trace_slot(cb, n, RT_KIND_ATTENTION, g.ny, (int)(grid.x * grid.y));
            /* Keys two groups ahead take 32 more registers a thread: one block an SM, so only where the grid has
             * no more blocks than SMs. */
            const bool ahead2 = R == 1 && (int64_t)grid.x * grid.y <= cb->sms;
            if (pages && kb == 2) launch_for_heads<true, 2>(cb, dmax, grid, R, false, ahead2, g, pa, f, pg);
            else if (pages) launch_for_heads<true, 4>(cb, dmax, grid, R, false, ahead2, g, pa, f, pg);
            else if (kb == 2) launch_for_heads<false, 2>(cb, dmax, grid, R, false, ahead2, g, pa, f, page_arg<false>{});
            else launch_for_heads<false, 4>(cb, dmax, grid, R, fa != NULL, ahead2, g, pa, f, page_arg<false>{});
        }
        if (!ds_cu_launched(cb, "attention")) return;
        if (multi) {
            ds_cu_launch(attn_combine_kernel<pos_arg>, (unsigned)(n * g.H), ATT_THREADS, cb->stream, g, pa);
            if (!ds_cu_launched(cb, "attention")) return;
        }
        r0 += n;
    }
}

void ds_cu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *p) {
    if (p->pages) {
        ds_cu_attention_paged(ds_cu(be), out, q, k, v, p);
        return;
    }
    if (ds_cu_attention_prefill(ds_cu(be), out, q, k, v, p)) return;
    attention_launch(ds_cu(be), out, q, k, v, p, NULL, NULL);
}

void ds_cu_attention_rows(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                          const ds_attn_params *p, const ds_cu_pages *pg) {
    attention_launch(cb, out, q, k, v, p, NULL, pg);
}

/* The fused path where its conditions hold (cfg.fused_attn_min_rows, by
 * default DS_CU_ATT_FUSED_MIN_ROWS, to ATT_FRESH_MAX rows at consecutive
 * positions ending at n_keys, heads up to ATT_FRESH_DIM, no window or ring,
 * fp32 tensors), else the two ops. One row (decode) keeps the two ops: the
 * norm kernel's small blocks are resident beside QKV's and ready when it
 * ends, the fused launch's are not (one row fused was no faster; 8 rows
 * fused are ~1 % faster). */
void ds_cu_qk_norm_rope_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw,
                                  ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int head_dim, float eps,
                                  const float *inv_freq, const ds_attn_params *p) {
    ds_cuda_backend *cb = ds_cu(be);
    if (p->pages) {
        ds_cu_qk_norm_rope_attention_paged(be, out, q, qw, k, kw, v, k_cache, v_cache, head_dim, eps, inv_freq, p);
        return;
    }
    const int min_rows = cb->cfg.fused_attn_min_rows > 0 ? cb->cfg.fused_attn_min_rows : ATT_FRESH_MAX + 1;
    const int n = (int)q.rows;
    bool fused = n >= min_rows && n <= ATT_FRESH_MAX && k.rows == n && v.rows == n && head_dim == p->head_dim &&
                 head_dim == p->v_head_dim && head_dim <= ATT_FRESH_DIM && head_dim % 2 == 0 && p->window == 0 &&
                 p->ring_size == 0 && p->n_heads > 0 && p->n_kv_heads > 0 && p->n_heads % p->n_kv_heads == 0 &&
                 q.cols == (int64_t)p->n_heads * head_dim && k.cols == (int64_t)p->n_kv_heads * head_dim &&
                 v.cols == k.cols && k_cache.cols == k.cols && v_cache.cols == v.cols && k_cache.rows == v_cache.rows &&
                 q.dtype == DS_F32 && k.dtype == DS_F32 && v.dtype == DS_F32 && k_cache.dtype == DS_F32 &&
                 v_cache.dtype == DS_F32 && (!qw.data || qw.dtype == DS_BF16 || qw.dtype == DS_F16 || qw.dtype == DS_F32) &&
                 (!kw.data || kw.dtype == DS_BF16 || kw.dtype == DS_F16 || kw.dtype == DS_F32) && p->q_pos &&
                 p->n_keys == p->q_pos[0] + n && p->q_pos[0] >= 0 && p->q_pos[n - 1] < k_cache.rows;
    fused = fused && ds_cu_consecutive(p->q_pos, n);
    if (!fused) {
        ds_qk_norm_rope_then_attention(be, out, q, qw, k, kw, v, k_cache, v_cache, head_dim, eps, inv_freq, p);
        return;
    }
    fresh_arg fa = {};
    fa.q = (const float *)q.data, fa.k = (const float *)k.data, fa.v = (const float *)v.data;
    fa.qs = q.stride, fa.ks = k.stride, fa.vs = v.stride;
    fa.qw = qw.data, fa.kw = kw.data, fa.qwdt = qw.dtype, fa.kwdt = kw.dtype, fa.n = n;
    fa.kc = (float *)k_cache.data, fa.vc = (float *)v_cache.data, fa.kcs = k_cache.stride, fa.vcs = v_cache.stride;
    fa.eps = eps;
    for (int i = 0; i < head_dim / 2; i++) fa.inv_freq[i] = inv_freq[i];
    attention_launch(cb, out, q, k_cache, v_cache, p, &fa, NULL);
}
