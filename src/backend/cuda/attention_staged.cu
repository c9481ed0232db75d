/* Attention for a batched step's paged rows (decode and verify rows of many
 * sequences, attention_paged.cu's chunk_rows), with the chunk kernel's bits.
 *
 * The chunk kernel (attention.cu) streams each key group's keys through
 * registers, one round trip to memory per key, and merges a packed block's
 * heads one after another: at 64 decode rows of the Qwen3-8B shape it ran
 * one 168-register block an SM, issue-bound, and attention was a third of
 * the step (ncu and DS_CUDA_PROFILE, bench/gpu_batch_profile.sh). Here a
 * block -- one row, R query heads of one kv head, one 256-key chunk, as
 * there -- copies its keys and values into shared memory in stages of 64
 * (cp.async, double-buffered: the whole stage's loads in flight at once),
 * and its threads then take every query through the chunk kernel's own
 * operations (attention_chunk.cuh: the same lanes, groups and key order,
 * att_update, the group merge); the R heads' merges run side by side, a
 * warp each. So every output is the chunk kernel's, bit for bit
 * (test_cuda_attention compares paged rows here with contiguous ones
 * there), and the chunk partials and their merge are shared. */
#include "backend/cuda/attention_chunk.cuh"
#include "backend/cuda/cp_async.cuh"

#define ST_KEYS 64 /* keys a stage holds */

template <int L, int NPL, int R, int KB>
__global__ void __launch_bounds__(ATT_THREADS, 2)
    attn_staged_kernel(att_geo g, pos_arg pa, page_arg<true> pg, int krb, int vrb) {
    constexpr int G = ATT_THREADS / L, KPG = ST_KEYS / G; /* key groups; a group's keys a stage */
    static_assert(ST_KEYS % G == 0, "a stage holds whole rounds of the groups");
    extern __shared__ __align__(16) unsigned char st[]; /* two stages [keys][krb], [keys][vrb]; then the merge's */
    __shared__ __align__(16) float s_q[R][ATT_FRESH_DIM];
    __shared__ int32_t s_row[ATT_CHUNK];
    __shared__ float s_m[R][G], s_l[R][G], s_f[R][G], s_ml[R][2];
    ds_cu_grid_wait_only(); /* o_proj let in once the keys are read, as in attn_chunk_kernel */
    const int hpr = g.H / R;
    const int m = blockIdx.x / hpr, h0 = (blockIdx.x % hpr) * R, c = g.c0 + (int)blockIdx.y;
    int lo, hi;
    key_range_of(g, row_pos(g, pa, m), step_keys(g), &lo, &hi);
    if (hi <= lo) { /* no keys: zeros, as the CPU */
        if (blockIdx.y == 0)
            for (int e = threadIdx.x; e < R * g.Dv; e += ATT_THREADS)
                g.out[m * g.os + (int64_t)(h0 + e / g.Dv) * g.Dv + e % g.Dv] = 0;
        return;
    }
    const int cfirst = lo / ATT_CHUNK, clast = (hi - 1) / ATT_CHUNK;
    if (c < cfirst || c > clast) return;
    const int j0 = max(lo, c * ATT_CHUNK), nk = min(hi, (c + 1) * ATT_CHUNK) - j0;
    const int kvh = h0 / g.group, grp = threadIdx.x / L, li = threadIdx.x % L;
    for (int t = threadIdx.x; t < nk; t += ATT_THREADS)
        s_row[t] = pg.tab[pg.base[m] + (j0 + t) / pg.page_rows] * pg.page_rows + (j0 + t) % pg.page_rows;
    for (int e = threadIdx.x; e < R * g.D; e += ATT_THREADS)
        s_q[e / g.D][e % g.D] = g.q[m * g.qs + (int64_t)h0 * g.D + e];
    __syncthreads();
    /* Stage s (keys j0 + 64 s ..) into buffer b: 16-byte copies, keys then values. */
    const unsigned char *kb0 = (const unsigned char *)g.k + (int64_t)kvh * g.D * KB;
    const unsigned char *vb0 = (const unsigned char *)g.v + (int64_t)kvh * g.Dv * KB;
    const int kc = g.D * KB / 16, per = kc + g.Dv * KB / 16, sbytes = ST_KEYS * (krb + vrb);
    const auto stage = [&](int s, int b) {
        const int n = min(ST_KEYS, nk - s * ST_KEYS);
        unsigned char *dk = st + b * sbytes, *dv = dk + ST_KEYS * krb;
        for (int e = threadIdx.x; e < n * per; e += ATT_THREADS) {
            const int i = e / per, p = e % per;
            const int64_t row = s_row[s * ST_KEYS + i];
            if (p < kc) ds_cu_cp16(dk + i * krb + 16 * p, kb0 + row * g.ks * KB + 16 * p);
            else ds_cu_cp16(dv + i * vrb + 16 * (p - kc), vb0 + row * g.vs * KB + 16 * (p - kc));
        }
        ds_cu_cp_commit();
    };
    const int ns = (nk + ST_KEYS - 1) / ST_KEYS;
    stage(0, 0);
    if (ns > 1) stage(1, 1);
    else ds_cu_cp_commit();
    float o[R][NPL], mx[R], l[R];
    att_state_init<R, NPL>(o, mx, l);
    for (int s = 0; s < ns; s++) {
        ds_cu_cp_wait<1>();
        __syncthreads();
        const unsigned char *bk = st + (s & 1) * sbytes, *bv = bk + ST_KEYS * krb;
        /* Group grp's keys j0 + grp, j0 + grp + G, ... in order, as the chunk kernel takes them (a round past
         * the keys changes nothing: att_update skips an invalid key). */
#pragma unroll 1
        for (int kk = 0; kk < KPG; kk++) {
            const int i = kk * G + grp;
            const bool valid = s * ST_KEYS + i < nk;
            float kv[NPL], vv[NPL];
            /* (the chunk kernel's loads from the cache, here from the stage) */
            if constexpr (KB == 2) {
                load_lane_row16<L, NPL>((const uint16_t *)(const void *)(bk + i * krb), valid, g.D, li, true,
                                        g.kvf16, kv);
                load_lane_row16<L, NPL>((const uint16_t *)(const void *)(bv + i * vrb), valid, g.Dv, li, true,
                                        g.kvf16, vv);
            } else {
                load_lane_row<L, NPL>((const float *)(const void *)(bk + i * krb), valid, g.D, li, true, kv);
                load_lane_row<L, NPL>((const float *)(const void *)(bv + i * vrb), valid, g.Dv, li, true, vv);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float sc = 0.0f;
                if (valid) {
#pragma unroll
                    for (int c4 = 0; c4 < NPL / 4; c4++) {
                        const int d0 = lane_dim<L>(li, 4 * c4);
                        const float4 t = *(const float4 *)&s_q[r][d0];
                        const float q4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            if (d0 + u < g.D) sc = __fmaf_rn(q4[u], kv[4 * c4 + u], sc);
                    }
                }
                att_update<L, NPL>(g.scale, g.Dv, valid, sc, vv, li, &mx[r], &l[r], o[r]);
            }
        }
        __syncthreads(); /* the stage is read: refill it */
        if (s + 2 < ns) stage(s + 2, s & 1);
        else ds_cu_cp_commit();
    }
    ds_cu_grid_trigger();
    /* The merge, every head at once: the groups' outputs over the stages [R][G][Dv]. */
    float *s_o = (float *)(void *)st;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (li == 0) s_m[r][grp] = mx[r], s_l[r][grp] = l[r];
#pragma unroll
        for (int i = 0; i < NPL; i++)
            if (lane_dim<L>(li, i) < g.Dv) s_o[(r * G + grp) * g.Dv + lane_dim<L>(li, i)] = o[r][i];
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    if (warp < R) att_merge_warp<G>(s_m[warp], s_l[warp], s_f[warp], s_ml[warp]);
    __syncthreads();
    const bool single = cfirst == clast;
    for (int e = threadIdx.x; e < R * g.Dv; e += ATT_THREADS) {
        const int r = e / g.Dv, d = e % g.Dv, h = h0 + r;
        const float acc = att_merge_dim<G>(s_o + r * G * g.Dv + d, g.Dv, s_f[r], s_l[r]);
        if (single) g.out[m * g.os + (int64_t)h * g.Dv + d] = acc / s_ml[r][1];
        else g.part[(((int64_t)m * g.H + h) * g.ny + blockIdx.y) * (g.Dv + 2) + 2 + d] = acc;
    }
    if (!single && threadIdx.x < R) {
        float *pp = g.part + (((int64_t)m * g.H + h0 + threadIdx.x) * g.ny + blockIdx.y) * (g.Dv + 2);
        pp[0] = s_ml[threadIdx.x][0];
        pp[1] = s_ml[threadIdx.x][1];
    }
}

template <int L, int NPL, int R, int KB>
static bool st_launch(ds_cuda_backend *cb, dim3 grid, const att_geo &g, const pos_arg &pa, const page_arg<true> &pg) {
    constexpr int G = ATT_THREADS / L;
    const int krb = att_stage_row_bytes(g.D, KB, L), vrb = att_stage_row_bytes(g.Dv, KB, L);
    const size_t stages = (size_t)2 * ST_KEYS * (krb + vrb), merge = (size_t)R * G * g.Dv * sizeof(float);
    const size_t smem = stages > merge ? stages : merge;
    auto kernel = attn_staged_kernel<L, NPL, R, KB>;
    static ds_cu_smem_allowed allowed;
    if (!ds_cu_allow_smem(cb, "attention", kernel, &allowed, smem)) return true; /* the failure is recorded */
    ds_cu_launch_smem(kernel, grid, ATT_THREADS, smem, cb->stream, g, pa, pg, krb, vrb);
    return true;
}

template <int L, int NPL, int KB>
static bool st_for_r(ds_cuda_backend *cb, dim3 grid, int R, const att_geo &g, const pos_arg &pa,
                     const page_arg<true> &pg) {
    if (R == 4) return st_launch<L, NPL, 4, KB>(cb, grid, g, pa, pg);
    if (R == 2) return st_launch<L, NPL, 2, KB>(cb, grid, g, pa, pg);
    return st_launch<L, NPL, 1, KB>(cb, grid, g, pa, pg);
}

template <int KB>
static bool st_for_heads(ds_cuda_backend *cb, int dmax, dim3 grid, int R, const att_geo &g, const pos_arg &pa,
                         const page_arg<true> &pg) {
    /* The chunk kernel's lanes for the head size (launch_for_heads). */
    if (dmax <= 32) return st_for_r<4, 8, KB>(cb, grid, R, g, pa, pg);
    if (dmax <= 64) return st_for_r<4, 16, KB>(cb, grid, R, g, pa, pg);
    return st_for_r<8, 16, KB>(cb, grid, R, g, pa, pg);
}

bool ds_cu_attention_staged(ds_cuda_backend *cb, dim3 grid, int R, const att_geo &g, const pos_arg &pa,
                            const page_arg<true> &pg, int kb, int dmax) {
    const auto al16 = [](const void *ptr) { return ((uintptr_t)ptr & 15) == 0; };
    /* 16-byte copies of whole rows; the queries' rows as the chunk kernel's vector path reads them. */
    if (dmax > ATT_FRESH_DIM || !g.vec || g.dpos || g.ring > 0 || (g.D * kb) % 16 || (g.Dv * kb) % 16 ||
        (g.ks * kb) % 16 || (g.vs * kb) % 16 || !al16(g.k) || !al16(g.v) || (R != 1 && R != 2 && R != 4))
        return false;
    return kb == 2 ? st_for_heads<2>(cb, dmax, grid, R, g, pa, pg) : st_for_heads<4>(cb, dmax, grid, R, g, pa, pg);
}
