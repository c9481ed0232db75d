/* Attention for prefill chunks (more rows than a verify has), tiled the
 * flash-attention way: a block takes QT consecutive query rows of one head,
 * brings the keys and values they need into shared memory KT at a time and
 * keeps each row's running max, sum and output across the tiles, so a key
 * is read once per tile of rows instead of once per row (the decode kernel,
 * attention.cu, reads it once per row, head and chunk: a 512-token prompt
 * moved ~4 GB a layer through L2 that way).
 *
 * A block's 256 threads are row groups of RPT rows (group r: rows RPT r ..
 * RPT r + RPT - 1) by LANES lanes; lane c takes keys c, c + LANES, ... of a
 * tile for the scores and output dimensions c, c + LANES, ... for P.V, so
 * every value read from shared memory feeds RPT products (a row group's
 * lanes are one warp or half of one: the row max and sum are butterflies
 * over them). Heads up to 128: 64 rows a block, groups of 4 rows by 16
 * lanes, 64-key tiles (4 x 4 scores and 4 x 8 outputs a thread); up to 256
 * (Gemma 4's sliding layers): 32 rows, 4 rows by 32 lanes, 64-key tiles;
 * up to 512 (its global layers): 16 rows, 2 rows by 32 lanes, 32-key tiles
 * (2 x 16 outputs a thread). All fp32, exp as the CPU.
 *
 * Rows of these calls are not bit-identical to the same rows decoded alone
 * (as prefill's cuBLAS projections are not): the engine needs that only
 * between a verify (up to DS_CU_NARROW_M rows) and decode, which both run
 * attention.cu (DS_CU_PREFILL_ROWS).
 *
 * bf16 / f16 caches (the model's dtype, model/kv_cache.h): KB = 2 widens
 * each key and value as a tile is brought into shared memory; the rest is
 * the fp32 kernel's arithmetic.
 *
 * Paged caches (runs of one sequence's rows, attention_paged.cu): PAGED
 * looks each tile's key rows up in the page table (thread i < KT: key
 * k0 + i, into shared memory, the next tile's requested while this one
 * is computed); the arithmetic is the contiguous kernel's, so the bits are
 * those of a contiguous cache holding the same keys. A batched step's
 * prefill chunks of many sequences are one launch (pa_runs: grid y walks
 * the runs' row tiles): one launch a run left most SMs idle (a 128-row
 * prompt is 64 blocks) and cost ~1.7 ms a layer at 18 prompts a step. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define PA_THREADS 256 /* row groups x lanes */
#define PA_DMAX 512    /* head sizes up to this (larger: the decode kernel) */

typedef struct {
    const float *q, *k, *v;
    float *out;
    int64_t qs, ks, vs, os;
    int M, H, group, D, Dv, n_keys, causal, window, ring, pos0;
    float scale;
    const int32_t *tab; /* paged: the device page table, the rows' list start in it, rows a page */
    int tbase, page_rows;
    int kvf16; /* KB = 2: the caches hold f16, not bf16 */
} pa_geo;

/* The runs of one launch (one, contiguous: the whole call): run r is rows [row0, row0 + rows) of q and out at
 * positions pos0 .., keys below n_keys, its page list at tbase; its row tiles are grid y [tile0[r], tile0[r + 1]). */
#define PA_RUNS 64
typedef struct {
    int n;
    int tile0[PA_RUNS + 1];
    int row0[PA_RUNS], rows[PA_RUNS], pos0[PA_RUNS], n_keys[PA_RUNS], tbase[PA_RUNS];
} pa_runs;

/* Element i of a cache row as fp32: KB 4, an fp32 cache's; KB 2, a bf16 / f16 one's widened (exact). */
template <int KB>
__device__ __forceinline__ float pa_kv(const float *base, int64_t i, bool f16) {
    if constexpr (KB == 4) return base[i];
    else return ds_cu_from16(((const uint16_t *)(const void *)base)[i], f16);
}

/* Row m's keys [lo, hi) (its position pos0 + m). */
__device__ __forceinline__ void pa_range(const pa_geo &g, int m, int *lo, int *hi) {
    int a = 0, b = g.n_keys;
    if (g.causal) {
        const int pos = g.pos0 + m;
        if (pos + 1 < b) b = pos + 1;
        if (g.window > 0 && pos - g.window + 1 > a) a = pos - g.window + 1;
    }
    *lo = a;
    *hi = b;
}

/* Paged: the cache row of key j (j < hi; else 0, never read). */
__device__ __forceinline__ int pa_page_row(const pa_geo &g, int j, int hi) {
    return j < hi ? g.tab[g.tbase + j / g.page_rows] * g.page_rows + j % g.page_rows : 0;
}

/* Shared memory of a block: queries [QT][D + 1], keys [KT][D + 1] (padded rows: a warp's keys sit in different
 * banks), values [KT][Dv], probabilities [QT][KT + 1]. */
template <int QT, int KT>
static size_t pa_smem_bytes(int D, int Dv) {
    return (size_t)(QT * (D + 1) + KT * (D + 1) + KT * Dv + QT * (KT + 1)) * sizeof(float);
}

template <int QT, int RPT, int LANES, int KT, int DMAX, bool PAGED, int KB = 4>
__global__ void __launch_bounds__(PA_THREADS) attn_prefill_kernel(pa_geo g0, pa_runs rs) {
    static_assert((QT / RPT) * LANES == PA_THREADS && LANES <= 32 && KT % LANES == 0 && DMAX % LANES == 0, "tiling");
    ds_cu_grid_wait();
    int run = 0; /* this block's run: the rows of one sequence, as a launch of their own would take them */
    while (run + 1 < rs.n && (int)blockIdx.y >= rs.tile0[run + 1]) run++;
    pa_geo g = g0;
    g.M = rs.rows[run], g.pos0 = rs.pos0[run], g.n_keys = rs.n_keys[run], g.tbase = rs.tbase[run];
    g.q += (int64_t)rs.row0[run] * g.qs, g.out += (int64_t)rs.row0[run] * g.os;
    extern __shared__ float pa_smem[];
    const int qstr = g.D + 1, kstr = g.D + 1;
    float *sq = pa_smem, *sk = sq + QT * qstr, *sv = sk + KT * kstr, *sp = sv + KT * g.Dv;
    __shared__ int s_lo, s_hi;
    const int h = blockIdx.x, kvh = h / g.group, m0 = ((int)blockIdx.y - rs.tile0[run]) * QT;
    const int rg = threadIdx.x / LANES, c = threadIdx.x % LANES; /* rows RPT rg ..; lane c of the group */
    int lo[RPT], hi[RPT];
#pragma unroll
    for (int a = 0; a < RPT; a++) {
        lo[a] = hi[a] = 0;
        if (m0 + RPT * rg + a < g.M) pa_range(g, m0 + RPT * rg + a, &lo[a], &hi[a]);
    }
    /* The block's key span: the union of its rows' ranges. */
    if (threadIdx.x == 0) {
        int a = INT_MAX, b = 0;
        for (int i = m0; i < g.M && i < m0 + QT; i++) {
            int l, u;
            pa_range(g, i, &l, &u);
            if (u > l) a = min(a, l), b = max(b, u);
        }
        s_lo = a == INT_MAX ? 0 : a;
        s_hi = a == INT_MAX ? 0 : b;
    }
    for (int e = threadIdx.x; e < QT * g.D; e += PA_THREADS) {
        const int i = e / g.D, d = e % g.D;
        sq[i * qstr + d] = m0 + i < g.M ? g.q[(int64_t)(m0 + i) * g.qs + (int64_t)h * g.D + d] : 0.0f;
    }
    __syncthreads();
    const int span_lo = s_lo, span_hi = s_hi;
    constexpr int KPL = KT / LANES, OPL = DMAX / LANES; /* keys and output dimensions a lane */
    float o[RPT][OPL], mx[RPT], l[RPT];
#pragma unroll
    for (int a = 0; a < RPT; a++) {
        mx[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int j = 0; j < OPL; j++) o[a][j] = 0.0f;
    }
    const float *q0 = sq + RPT * rg * qstr;
    int32_t *s_rows = nullptr; /* PAGED: the tile's key rows */
    int next_row = 0;          /* PAGED, thread i < KT: key k0 + i's row, for the tile that begins at k0 */
    if constexpr (PAGED) {
        __shared__ int32_t rows_[KT];
        s_rows = rows_;
        if (threadIdx.x < KT) next_row = pa_page_row(g, span_lo + threadIdx.x, span_hi);
    }
    for (int k0 = span_lo; k0 < span_hi; k0 += KT) {
        /* (No thread reads s_rows past the previous tile's loads, which ended at its second barrier.) */
        if constexpr (PAGED)
            if (threadIdx.x < KT) s_rows[threadIdx.x] = next_row;
        __syncthreads(); /* the previous tile's keys, values and probabilities are read */
        if constexpr (PAGED)
            if (threadIdx.x < KT) next_row = pa_page_row(g, k0 + KT + threadIdx.x, span_hi);
        for (int e = threadIdx.x; e < KT * g.D; e += PA_THREADS) {
            const int i = e / g.D, d = e % g.D, j = k0 + i;
            const int64_t row = PAGED ? s_rows[i] : g.ring > 0 ? j % g.ring : j;
            sk[i * kstr + d] = j < span_hi ? pa_kv<KB>(g.k, row * g.ks + (int64_t)kvh * g.D + d, g.kvf16) : 0.0f;
        }
        for (int e = threadIdx.x; e < KT * g.Dv; e += PA_THREADS) {
            const int i = e / g.Dv, d = e % g.Dv, j = k0 + i;
            const int64_t row = PAGED ? s_rows[i] : g.ring > 0 ? j % g.ring : j;
            sv[i * g.Dv + d] = j < span_hi ? pa_kv<KB>(g.v, row * g.vs + (int64_t)kvh * g.Dv + d, g.kvf16) : 0.0f;
        }
        __syncthreads();
        /* Scores: rows RPT rg + a, keys c + LANES b. */
        float s[RPT][KPL];
#pragma unroll
        for (int a = 0; a < RPT; a++)
#pragma unroll
            for (int b = 0; b < KPL; b++) s[a][b] = 0.0f;
#pragma unroll 4 /* several dimensions' loads in flight: 8 warps a block, one block an SM */
        for (int d = 0; d < g.D; d++) {
            float qa[RPT], kb[KPL];
#pragma unroll
            for (int a = 0; a < RPT; a++) qa[a] = q0[a * qstr + d];
#pragma unroll
            for (int b = 0; b < KPL; b++) kb[b] = sk[(c + LANES * b) * kstr + d];
#pragma unroll
            for (int a = 0; a < RPT; a++)
#pragma unroll
                for (int b = 0; b < KPL; b++) s[a][b] = fmaf(qa[a], kb[b], s[a][b]);
        }
        float corr[RPT];
#pragma unroll
        for (int a = 0; a < RPT; a++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int b = 0; b < KPL; b++) {
                const int j = k0 + c + LANES * b;
                s[a][b] = j >= lo[a] && j < hi[a] ? s[a][b] * g.scale : -INFINITY;
                tmax = fmaxf(tmax, s[a][b]);
            }
#pragma unroll
            for (int off = 1; off < LANES; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float mn = fmaxf(mx[a], tmax);
            /* mn = -inf: none of the row's keys so far (its probabilities are 0). */
            corr[a] = mn == -INFINITY ? 1.0f : expf(mx[a] - mn);
            float psum = 0.0f;
            float *prow = sp + (RPT * rg + a) * (KT + 1);
#pragma unroll
            for (int b = 0; b < KPL; b++) {
                const float p = s[a][b] == -INFINITY ? 0.0f : expf(s[a][b] - mn);
                psum += p;
                prow[c + LANES * b] = p;
            }
#pragma unroll
            for (int off = 1; off < LANES; off <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
            l[a] = l[a] * corr[a] + psum;
            mx[a] = mn;
        }
        __syncwarp(); /* a row group's lanes are (part of) one warp: its probabilities are written */
        /* P.V: rows RPT rg + a, dimensions c + LANES j. */
#pragma unroll
        for (int a = 0; a < RPT; a++)
#pragma unroll
            for (int j = 0; j < OPL; j++) o[a][j] *= corr[a];
        const float *p0 = sp + RPT * rg * (KT + 1);
#pragma unroll 4
        for (int kk = 0; kk < KT; kk++) {
            float pa[RPT], vb[OPL];
#pragma unroll
            for (int a = 0; a < RPT; a++) pa[a] = p0[a * (KT + 1) + kk];
#pragma unroll
            for (int j = 0; j < OPL; j++) vb[j] = c + LANES * j < g.Dv ? sv[kk * g.Dv + c + LANES * j] : 0.0f;
#pragma unroll
            for (int a = 0; a < RPT; a++)
#pragma unroll
                for (int j = 0; j < OPL; j++) o[a][j] = fmaf(pa[a], vb[j], o[a][j]);
        }
    }
#pragma unroll
    for (int a = 0; a < RPT; a++) {
        const int m = m0 + RPT * rg + a;
        if (m >= g.M) break;
        float *orow = g.out + (int64_t)m * g.os + (int64_t)h * g.Dv;
#pragma unroll
        for (int j = 0; j < OPL; j++) {
            const int d = c + LANES * j;
            if (d < g.Dv) orow[d] = l[a] > 0 ? o[a][j] / l[a] : 0.0f; /* no keys: zeros, as the CPU */
        }
    }
}

/* One tiling's launch (its shared memory allowed once per instantiation). */
template <int QT, int RPT, int LANES, int KT, int DMAX, bool PAGED, int KB = 4>
static void pa_launch(ds_cuda_backend *cb, const pa_geo &g, pa_runs rs) {
    auto kernel = attn_prefill_kernel<QT, RPT, LANES, KT, DMAX, PAGED, KB>;
    const size_t smem = pa_smem_bytes<QT, KT>(g.D, g.Dv);
    static ds_cu_smem_allowed allowed;
    if (!ds_cu_allow_smem(cb, "attention", kernel, &allowed, smem)) return; /* the failure is recorded */
    for (int r = 0; r < rs.n; r++) rs.tile0[r + 1] = rs.tile0[r] + (rs.rows[r] + QT - 1) / QT;
    dim3 grid((unsigned)g.H, (unsigned)rs.tile0[rs.n]);
    ds_cu_launch_smem(kernel, grid, PA_THREADS, smem, cb->stream, g, rs);
}

/* Whether the tiled kernel takes these rows at all (what every run of a call shares). */
static bool pa_fits(const ds_cuda_backend *cb, int64_t M, ds_tensor k, ds_tensor v, const ds_attn_params *p) {
    /* cfg.invariant: a prompt's rows take the decode kernel, as they would one at a time (the tiled kernel's
     * sums are not a decode row's), whether the prompt is prefilled whole or in chunks, paged or not. */
    return M >= DS_CU_PREFILL_ROWS && !cb->cfg.invariant && !cb->reg.active && p->q_pos && p->head_dim <= PA_DMAX &&
           p->v_head_dim <= PA_DMAX && p->n_heads > 0 && p->n_kv_heads > 0 && p->n_heads % p->n_kv_heads == 0 &&
           M <= INT32_MAX / 2 && ds_cu_kv_dtype_ok(k.dtype) && v.dtype == k.dtype;
    /* (other cache dtypes: the chunk kernel names them) */
}

static pa_geo pa_geo_of(ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *p) {
    pa_geo g = {};
    g.q = (const float *)q.data, g.k = (const float *)k.data, g.v = (const float *)v.data;
    g.out = (float *)out.data;
    g.qs = q.stride, g.ks = k.stride, g.vs = v.stride, g.os = out.stride;
    g.H = p->n_heads, g.group = p->n_heads / p->n_kv_heads;
    g.D = p->head_dim, g.Dv = p->v_head_dim, g.causal = p->causal;
    g.window = p->window, g.ring = p->ring_size, g.scale = p->scale;
    g.kvf16 = k.dtype == DS_F16;
    return g;
}

/* The tiling for the head size and cache dtype. */
static void pa_dispatch(ds_cuda_backend *cb, const pa_geo &g, const pa_runs &rs, bool paged, bool f32) {
    const int dmax = g.D > g.Dv ? g.D : g.Dv;
    if (!f32) { /* bf16 / f16 caches (model/kv_cache.h), widened into shared memory */
        if (paged && dmax <= 128) pa_launch<64, 4, 16, 64, 128, true, 2>(cb, g, rs);
        else if (paged && dmax <= 256) pa_launch<32, 4, 32, 64, 256, true, 2>(cb, g, rs);
        else if (paged) pa_launch<16, 2, 32, 32, 512, true, 2>(cb, g, rs);
        else if (dmax <= 128) pa_launch<64, 4, 16, 64, 128, false, 2>(cb, g, rs);
        else if (dmax <= 256) pa_launch<32, 4, 32, 64, 256, false, 2>(cb, g, rs);
        else pa_launch<16, 2, 32, 32, 512, false, 2>(cb, g, rs);
    } else if (paged) {
        if (dmax <= 128) pa_launch<64, 4, 16, 64, 128, true>(cb, g, rs);
        else if (dmax <= 256) pa_launch<32, 4, 32, 64, 256, true>(cb, g, rs);
        else pa_launch<16, 2, 32, 32, 512, true>(cb, g, rs);
    } else if (dmax <= 128) pa_launch<64, 4, 16, 64, 128, false>(cb, g, rs);
    else if (dmax <= 256) pa_launch<32, 4, 32, 64, 256, false>(cb, g, rs);
    else pa_launch<16, 2, 32, 32, 512, false>(cb, g, rs);
    ds_cu_launched(cb, "attention");
}

bool ds_cu_attention_prefill(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                             const ds_attn_params *p) {
    const int64_t M = q.rows;
    if (!pa_fits(cb, M, k, v, p) || !ds_cu_consecutive(p->q_pos, M)) return false; /* row m at pos0 + m */
    const pa_geo g = pa_geo_of(out, q, k, v, p);
    pa_runs rs = {};
    rs.n = 1, rs.rows[0] = (int)M, rs.pos0[0] = p->q_pos[0], rs.n_keys[0] = p->n_keys;
    pa_dispatch(cb, g, rs, false, k.dtype == DS_F32);
    return true;
}

bool ds_cu_attention_prefill_runs(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                                  const ds_attn_params *p, const ds_cu_prefill_run *runs, int n, const int32_t *tab,
                                  int page_rows) {
    if (!pa_fits(cb, q.rows, k, v, p)) return false;
    pa_geo g = pa_geo_of(out, q, k, v, p);
    g.tab = tab, g.page_rows = page_rows, g.ring = 0;
    for (int r0 = 0; r0 < n && !cb->err; r0 += PA_RUNS) {
        pa_runs rs = {};
        rs.n = n - r0 < PA_RUNS ? n - r0 : PA_RUNS;
        for (int r = 0; r < rs.n; r++) {
            const ds_cu_prefill_run &u = runs[r0 + r];
            rs.row0[r] = (int)u.row0, rs.rows[r] = u.rows, rs.pos0[r] = u.pos0, rs.n_keys[r] = u.n_keys;
            rs.tbase[r] = u.base;
        }
        pa_dispatch(cb, g, rs, true, k.dtype == DS_F32);
    }
    return true;
}
