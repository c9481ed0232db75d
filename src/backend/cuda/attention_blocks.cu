/* Attention for a batched step's verify blocks (paged rows, several of one
 * sequence: a verify's gamma + 1 rows, a drafter's block), with the chunk
 * kernel's bits.
 *
 * The staged kernel (attention_staged.cu) takes one row a block: each of a
 * verify's 8 rows copies the same keys from L2 again (at 256 sequences x 8
 * rows of the Qwen3-8B shape, ~1.4 GB a layer). Here a block takes a group
 * of one sequence's rows (VB_GROUP at most), R query heads of one kv head
 * and one 256-key chunk: it copies the keys and values every row of the
 * group needs in that chunk into shared memory once (cp.async, the whole
 * chunk resident), and then two rows at a time (two halves of
 * ATT_THREADS threads, each with its own named barrier) take their queries
 * through the staged kernel's own operations: the same groups of lanes,
 * key order (group grp: keys grp, grp + G, ...; a round past a row's keys
 * changes nothing), att_update and merge, one head's merge at a time. So
 * every output is the chunk kernel's, bit for bit (test_cuda_attention
 * compares paged rows with contiguous ones).
 *
 * Every row of a group must start its keys at 0 (no window): then the
 * chunk's first key is the same for all of them, and so is the staged
 * layout. Launches take up to VB_ROWS rows (their positions and page-list
 * starts ride in the parameters), so that 8-row groups give a grid of a
 * few waves. */
#include "backend/cuda/attention_chunk.cuh"
#include "backend/cuda/cp_async.cuh"

#define VB_ROWS 256   /* rows a launch takes */
#define VB_GROUPS 64  /* groups a launch takes */
#define VB_GROUP 16   /* rows a group takes */
#define VB_HALVES 2   /* rows a block computes at once */
#define VB_THREADS (VB_HALVES * ATT_THREADS)

typedef struct {
    int32_t pos[VB_ROWS];  /* the launch's rows' positions */
    int32_t keys[VB_ROWS]; /* their key limits */
    int32_t base[VB_ROWS]; /* where each row's page list starts in tab */
    int16_t first[VB_GROUPS + 1]; /* group i: launch rows first[i] .. first[i + 1] - 1 */
    const int32_t *tab;
    int page_rows;
} vb_arg;

/* (attn_combine_kernel's positions and key limits) */
__device__ __forceinline__ int row_pos(const att_geo &, const vb_arg &a, int m) { return a.pos[m]; }
__device__ __forceinline__ int row_keys(const att_geo &, const vb_arg &a, int m) { return a.keys[m]; }

/* One half's barrier (ids 1 and 2; 0 is __syncthreads'). */
__device__ __forceinline__ void half_sync(int half) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + half), "r"(ATT_THREADS) : "memory");
}

template <int L, int NPL, int R, int KB>
__global__ void __launch_bounds__(VB_THREADS, 1) attn_blocks_kernel(att_geo g, vb_arg a, int krb, int vrb) {
    constexpr int G = ATT_THREADS / L; /* key groups of a half */
    extern __shared__ __align__(16) unsigned char vb[]; /* keys [ATT_CHUNK][krb], values [ATT_CHUNK][vrb], then
                                                           each half's merge [G][Dv] */
    __shared__ __align__(16) float s_q[VB_HALVES][R][ATT_FRESH_DIM];
    __shared__ int32_t s_row[ATT_CHUNK];
    __shared__ float s_m[VB_HALVES][G], s_l[VB_HALVES][G], s_f[VB_HALVES][G], s_ml[VB_HALVES][2];
    ds_cu_grid_wait_only(); /* o_proj let in once the keys are read, as in attn_chunk_kernel */
    const int hpr = g.H / R;
    const int gi = blockIdx.x / hpr, h0 = (blockIdx.x % hpr) * R, c = g.c0 + (int)blockIdx.y;
    const int r0 = a.first[gi], nr = a.first[gi + 1] - r0;
    const int half = threadIdx.x / ATT_THREADS, tid = threadIdx.x % ATT_THREADS;
    const int kvh = h0 / g.group, grp = tid / L, li = tid % L, hwarp = tid >> 5;
    /* The chunk's keys any row of the group reads: [j0, j0 + nku) (every row's keys start at 0). */
    int hiu = 0;
    for (int i = 0; i < nr; i++) {
        int lo, hi;
        key_range_of(g, a.pos[r0 + i], a.keys[r0 + i], &lo, &hi);
        hiu = max(hiu, hi);
    }
    const int j0 = c * ATT_CHUNK, nku = max(0, min(hiu, j0 + ATT_CHUNK) - j0);
    const int32_t base = a.base[r0];
    for (int t = threadIdx.x; t < nku; t += VB_THREADS)
        s_row[t] = a.tab[base + (j0 + t) / a.page_rows] * a.page_rows + (j0 + t) % a.page_rows;
    __syncthreads();
    unsigned char *sk = vb, *sv = vb + ATT_CHUNK * krb;
    float *s_o = (float *)(void *)(vb + ATT_CHUNK * (krb + vrb)) + half * G * g.Dv;
    {
        const unsigned char *kb0 = (const unsigned char *)g.k + (int64_t)kvh * g.D * KB;
        const unsigned char *vb0 = (const unsigned char *)g.v + (int64_t)kvh * g.Dv * KB;
        const int kc = g.D * KB / 16, per = kc + g.Dv * KB / 16;
        for (int e = threadIdx.x; e < nku * per; e += VB_THREADS) {
            const int i = e / per, p = e % per;
            const int64_t row = s_row[i];
            if (p < kc) ds_cu_cp16(sk + i * krb + 16 * p, kb0 + row * g.ks * KB + 16 * p);
            else ds_cu_cp16(sv + i * vrb + 16 * (p - kc), vb0 + row * g.vs * KB + 16 * (p - kc));
        }
        ds_cu_cp_commit();
        ds_cu_cp_wait<0>();
    }
    __syncthreads();
    ds_cu_grid_trigger();
    for (int it = 0; it < nr; it += VB_HALVES) {
        const int i = it + half, m = r0 + i; /* this half's row (of the group; of the launch) */
        if (i >= nr) break;
        int lo, hi;
        key_range_of(g, a.pos[m], a.keys[m], &lo, &hi);
        if (hi <= lo) { /* no keys: zeros, as the CPU (written once, by the first chunk's block) */
            if (blockIdx.y == 0)
                for (int e = tid; e < R * g.Dv; e += ATT_THREADS)
                    g.out[m * g.os + (int64_t)(h0 + e / g.Dv) * g.Dv + e % g.Dv] = 0;
            continue;
        }
        const int cfirst = lo / ATT_CHUNK, clast = (hi - 1) / ATT_CHUNK;
        if (c < cfirst || c > clast) continue;
        const int nk = min(hi, j0 + ATT_CHUNK) - j0; /* this row's keys of the chunk (<= nku) */
        for (int e = tid; e < R * g.D; e += ATT_THREADS)
            s_q[half][e / g.D][e % g.D] = g.q[m * g.qs + (int64_t)h0 * g.D + e];
        half_sync(half);
        float o[R][NPL], mx[R], l[R];
        att_state_init<R, NPL>(o, mx, l);
#pragma unroll 1
        for (int k0 = 0; k0 < nk; k0 += G) {
            const int ik = k0 + grp;
            const bool valid = ik < nk;
            float kv[NPL], vv[NPL];
            if constexpr (KB == 2) {
                load_lane_row16<L, NPL>((const uint16_t *)(const void *)(sk + ik * krb), valid, g.D, li, true,
                                        g.kvf16, kv);
                load_lane_row16<L, NPL>((const uint16_t *)(const void *)(sv + ik * vrb), valid, g.Dv, li, true,
                                        g.kvf16, vv);
            } else {
                load_lane_row<L, NPL>((const float *)(const void *)(sk + ik * krb), valid, g.D, li, true, kv);
                load_lane_row<L, NPL>((const float *)(const void *)(sv + ik * vrb), valid, g.Dv, li, true, vv);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float sc = 0.0f;
                if (valid) {
#pragma unroll
                    for (int c4 = 0; c4 < NPL / 4; c4++) {
                        const int d0 = lane_dim<L>(li, 4 * c4);
                        const float4 t = *(const float4 *)&s_q[half][r][d0];
                        const float q4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            if (d0 + u < g.D) sc = __fmaf_rn(q4[u], kv[4 * c4 + u], sc);
                    }
                }
                att_update<L, NPL>(g.scale, g.Dv, valid, sc, vv, li, &mx[r], &l[r], o[r]);
            }
        }
        /* The merge, one head at a time (the staged kernel's, head by head). */
        const bool single = cfirst == clast;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (li == 0) s_m[half][grp] = mx[r], s_l[half][grp] = l[r];
#pragma unroll
            for (int d = 0; d < NPL; d++)
                if (lane_dim<L>(li, d) < g.Dv) s_o[grp * g.Dv + lane_dim<L>(li, d)] = o[r][d];
            half_sync(half);
            if (hwarp == 0) att_merge_warp<G>(s_m[half], s_l[half], s_f[half], s_ml[half]);
            half_sync(half);
            const int h = h0 + r;
            for (int d = tid; d < g.Dv; d += ATT_THREADS) {
                const float acc = att_merge_dim<G>(s_o + d, g.Dv, s_f[half], s_l[half]);
                if (single) g.out[m * g.os + (int64_t)h * g.Dv + d] = acc / s_ml[half][1];
                else g.part[(((int64_t)m * g.H + h) * g.ny + blockIdx.y) * (g.Dv + 2) + 2 + d] = acc;
            }
            if (!single && tid == 0) {
                float *pp = g.part + (((int64_t)m * g.H + h) * g.ny + blockIdx.y) * (g.Dv + 2);
                pp[0] = s_ml[half][0];
                pp[1] = s_ml[half][1];
            }
            half_sync(half); /* the merge's arrays and s_q are read: the next head's, the next row's */
        }
    }
}

template <int L, int NPL, int R, int KB>
static bool vb_launch(ds_cuda_backend *cb, dim3 grid, const att_geo &g, const vb_arg &a) {
    constexpr int G = ATT_THREADS / L;
    const int krb = att_stage_row_bytes(g.D, KB, L), vrb = att_stage_row_bytes(g.Dv, KB, L);
    const size_t smem = (size_t)ATT_CHUNK * (krb + vrb) + (size_t)VB_HALVES * G * g.Dv * sizeof(float);
    auto kernel = attn_blocks_kernel<L, NPL, R, KB>;
    static ds_cu_smem_allowed allowed;
    if (!ds_cu_allow_smem(cb, "attention", kernel, &allowed, smem)) return false; /* the failure is recorded */
    ds_cu_launch_smem(kernel, grid, VB_THREADS, smem, cb->stream, g, a, krb, vrb);
    return ds_cu_launched(cb, "attention");
}

template <int L, int NPL, int KB>
static bool vb_for_r(ds_cuda_backend *cb, dim3 grid, int R, const att_geo &g, const vb_arg &a) {
    if (R == 4) return vb_launch<L, NPL, 4, KB>(cb, grid, g, a);
    if (R == 2) return vb_launch<L, NPL, 2, KB>(cb, grid, g, a);
    return vb_launch<L, NPL, 1, KB>(cb, grid, g, a);
}

/* The chunk kernel's lanes for the head size (launch_for_heads). */
static bool vb_for_heads(ds_cuda_backend *cb, int dmax, dim3 grid, int R, const att_geo &g, const vb_arg &a) {
    if (dmax <= 32) return vb_for_r<4, 8, 2>(cb, grid, R, g, a);
    if (dmax <= 64) return vb_for_r<4, 16, 2>(cb, grid, R, g, a);
    return vb_for_r<8, 16, 2>(cb, grid, R, g, a);
}

bool ds_cu_attention_blocks(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                            const ds_attn_params *p, const ds_cu_pages *pages, const int32_t *keys) {
    const int64_t M = q.rows;
    /* Rows that come in groups (one row a sequence, as decode's: the staged kernel's blocks fit two an SM and
     * need no resident chunk). */
    int64_t groups = 0;
    for (int64_t i = 0; i < M; i++) groups += i == 0 || pages->base[i] != pages->base[i - 1];
    if (M <= 0 || groups * 2 > M || cb->reg.active || !p->q_pos) return false;
    const int kb = k.dtype == DS_F32 ? 4 : 2;
    const int dmax = p->head_dim > p->v_head_dim ? p->head_dim : p->v_head_dim;
    const auto al16 = [](const void *ptr) { return ((uintptr_t)ptr & 15) == 0; };
    /* bf16 / f16 caches (an fp32 chunk does not fit in shared memory), heads up to 128, whole 16-byte rows, no
     * window or ring. */
    if (kb != 2 || dmax > ATT_FRESH_DIM || p->window > 0 || p->ring_size > 0 || p->n_heads <= 0) return false;
    att_geo g0;
    int kb_, dmax_;
    if (!ds_cu_att_geo(cb, out, q, k, v, p, false, &g0, &kb_, &dmax_)) return true; /* the failure is recorded */
    if (!g0.vec || (g0.D * kb) % 16 || (g0.Dv * kb) % 16 || (g0.ks * kb) % 16 || (g0.vs * kb) % 16 || !al16(g0.k) ||
        !al16(g0.v))
        return false;
    const int R = g0.group % 4 == 0 ? 4 : g0.group % 2 == 0 ? 2 : 1;
    for (int64_t r0 = 0; r0 < M;) {
        vb_arg a;
        int n = 0, ng = 0;
        a.tab = pages->tab, a.page_rows = pages->page_rows;
        /* Groups of one page list, VB_GROUP rows at most, until the launch is full. */
        while (r0 + n < M && n < VB_ROWS) {
            const int64_t i = r0 + n;
            const bool starts = n == 0 || pages->base[i] != pages->base[i - 1] || n - a.first[ng - 1] >= VB_GROUP;
            if (starts && ng == VB_GROUPS) break;
            if (starts) a.first[ng++] = (int16_t)n;
            a.pos[n] = p->q_pos[i], a.keys[n] = keys[i], a.base[n] = pages->base[i];
            n++;
        }
        a.first[ng] = (int16_t)n;
        /* The chunks the rows need (every row's keys start at 0). */
        int cmax = 0;
        bool multi = false;
        for (int i = 0; i < n; i++) {
            int hi = a.keys[i];
            if (p->causal && a.pos[i] + 1 < hi) hi = a.pos[i] + 1;
            const int cl = hi > 0 ? (hi - 1) / ATT_CHUNK : 0;
            cmax = cl > cmax ? cl : cmax;
            multi |= cl > 0;
        }
        att_geo g = g0;
        g.c0 = 0;
        g.ny = cmax + 1;
        g.out = g0.out + r0 * g0.os;
        g.q = g0.q + r0 * g0.qs;
        g.part = NULL;
        if (multi && !(g.part = (float *)ds_cu_scratch(cb, "attention", (size_t)n * g.H * (size_t)g.ny *
                                                                              (size_t)(g.Dv + 2) * sizeof(float))))
            return true; /* the failure is recorded */
        if (!vb_for_heads(cb, dmax, dim3((unsigned)(ng * (g.H / R)), (unsigned)g.ny), R, g, a)) return true;
        if (multi) {
            ds_cu_launch(attn_combine_kernel<vb_arg>, (unsigned)(n * g.H), ATT_THREADS, cb->stream, g, a);
            if (!ds_cu_launched(cb, "attention")) return true;
        }
        r0 += n;
    }
    return true;
}
