/* DSpark's greedy Markov walk on the GPU (backend.h markov_greedy): each
 * block position adds the bias of the token drawn at the position before
 * it, so the walk is sequential, but every step's inputs are already on the
 * device: the previous token's index is read by the next step's gather, and
 * only the gamma drawn tokens cross to the host, once, at the end.
 *
 * In this file: a step over every vocabulary row, or over only the
 * rows markov_bound.c's exact bias bound leaves in contention (a row's value
 * is the same in both); the whole pruned walk in one launch, blocks meeting
 * at a grid barrier a step, where the vocabulary spans many blocks;
 * markov_greedy_head, which reads head_bound.cu's bounds instead of a written
 * LM head and computes the rows in contention itself; the gated / RNN heads'
 * latent, one block a step on the device; the sampled walk (sample.cu's draw). */
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/head_bound.h"
#include "backend/cuda/matmul_mma_frag.cuh"
#include "backend/cuda/ring_trace.h"

/* emb[0..r) = table[*id] as fp32. */
__global__ void gather_row_kernel(float *emb, const void *table, int dtype, int64_t ts, int r, const int32_t *id) {
    ds_cu_grid_wait();
    const int64_t row = (int64_t)*id * ts;
    for (int i = threadIdx.x; i < r; i += blockDim.x) emb[i] = ds_cu_load(table, dtype, row + i);
}

/* A corrected logit from its base logit b: b + bias, or round(b + round(bias))
 * in bf16 mode (as the reference computes it). */
__device__ __forceinline__ float corrected_logit(float b, float bias, int bf16) {
    return bf16 ? ds_cu_rbf16(b + ds_cu_rbf16(bias)) : b + bias;
}
/* The same for column n of base. */
__device__ __forceinline__ float step_logit(const float *base, float bias, int64_t n, int bf16) {
    return corrected_logit(base[n], bias, bf16);
}

/* out = the corrected logits of base and a computed bias row. */
__global__ void markov_add_kernel(float *out, const float *base, const float *bias, int64_t V, int bf16) {
    ds_cu_grid_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= V) return;
    out[i] = step_logit(base, bias[i], i, bf16);
}

/* One whole step of the walk in one launch (the common case: w2 rows of 8k
 * elements, 16-byte aligned). Every block gathers e = w1[prev] itself
 * (prev = idx[0], written by the step before), warps compute whole rows of
 * bias = w2 e with fp32 products (lane l takes elements 8l..8l+7 of every
 * 256, in order, then a fixed butterfly), add the base logits and keep the
 * best (value, column); the last block to finish merges the blocks' bests
 * into idx[1]. Two kinds of step: every row (markov_step_kernel, which can
 * also write the corrected logits) or the rows a bound leaves in contention
 * (markov_pruned_step_kernel); a row's value is the same in both. */
#define STEP_WARPS 8
#define STEP_ROWS 16 /* rows per warp of the full step */
#define STEP_BATCH 8 /* rows per warp in flight */

__device__ __forceinline__ bool step_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

/* The block's best (value, column) into thread 0's *bv, *bi: a butterfly
 * in each warp, then the warps in order (sv, si: a slot per warp). */
__device__ __forceinline__ void block_best(float *bv, int *bi, float *sv, int *si) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *bv, off);
        const int oc = __shfl_xor_sync(0xffffffffu, *bi, off);
        if (step_better(ov, oc, *bv, *bi)) *bv = ov, *bi = oc;
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = *bv;
        si[threadIdx.x >> 5] = *bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (step_better(sv[w], si[w], *bv, *bi)) *bv = sv[w], *bi = si[w];
    __syncthreads(); /* sv, si free again */
}

/* bias[q] = w2[n[q]] . e for B rows at once (rows outside [0, V) give 0):
 * every lane's loads of the B rows are issued before any product, so a warp
 * has B 16-byte loads in flight. */
template <int DT, int B>
__device__ __forceinline__ void step_rows(const void *w2, int64_t w2s, int r, const float *e, int lane,
                                          const int64_t n[B], int64_t V, float bias[B]) {
#pragma unroll
    for (int q = 0; q < B; q++) bias[q] = 0.0f;
    for (int k = 8 * lane; k < r; k += 256) {
        float f[B][8];
#pragma unroll
        for (int q = 0; q < B; q++) {
            if (n[q] >= 0 && n[q] < V) {
                ds_cu_load8<DT>(w2, n[q] * w2s + k, f[q]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) f[q][i] = 0.0f;
            }
        }
#pragma unroll
        for (int q = 0; q < B; q++)
#pragma unroll
            for (int i = 0; i < 8; i++) bias[q] = fmaf(f[q][i], e[k + i], bias[q]);
    }
#pragma unroll
    for (int q = 0; q < B; q++)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) bias[q] += __shfl_xor_sync(0xffffffffu, bias[q], off);
}

/* Every block starts its step: e = w1[prev] into shared memory (block 0
 * also keeps it in emb, the confidence head's input) and *y0 = the
 * corrected logit of column 0, where the argmax scan starts. */
template <int DT, bool Q = false>
__device__ __forceinline__ void step_begin(const float *base, const void *w1, int w1dt, int64_t w1s, const void *w2,
                                           int64_t w2s, int r, int64_t V, int bf16, int64_t prev, float *emb,
                                           float *e, float *y0) {
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        e[i] = ds_cu_load(w1, w1dt, prev * w1s + i);
        if (blockIdx.x == 0) emb[i] = e[i];
    }
    __syncthreads();
    if (!Q && threadIdx.x < 32) { /* Q (the head's bounds): column 0 is block 0's first candidate instead */
        const int64_t n0[1] = {0};
        float b[1];
        step_rows<DT, 1>(w2, w2s, r, e, threadIdx.x, n0, V, b);
        if (threadIdx.x == 0) *y0 = step_logit(base, b[0], 0, bf16);
    }
}

/* The blocks' bests (pv, pi: one per block) from block b0 on merged, from (v0, i0) (column 0's value and 0, or
 * block 0's best), into thread 0's *bv, *bi. */
__device__ __forceinline__ void merge_bests(float v0, int i0, int b0, const float *pv, const int *pi, float *sv,
                                            int *si, float *bv, int *bi) {
    *bv = v0;
    *bi = i0;
    for (int b = b0 + threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        const float v = __ldcg(pv + b);
        const int c = __ldcg(pi + b);
        if (step_better(v, c, *bv, *bi)) *bv = v, *bi = c;
    }
    block_best(bv, bi, sv, si);
}

/* Ends a step: the block's best goes to (pv, pi)[block]; the last block to
 * finish merges them all into idx[1] (the next step's prev) and re-arms the
 * ticket. The argmax rule is the CPU scan's (ties to the lowest column,
 * starting from column 0, so a NaN never wins), which makes the order of
 * the blocks, and of the rows within them, irrelevant. */
__device__ __forceinline__ void step_end(float bv, int bi, float y0, float *pv, int *pi, unsigned *ticket,
                                         int32_t *idx, float *sv, int *si, bool *last) {
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
        __threadfence();
        *last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!*last) return;
    /* The last block: every other block's best is visible (fence, then ticket). */
    __threadfence();
    merge_bests(y0, 0, 0, pv, pi, sv, si, &bv, &bi);
    if (threadIdx.x == 0) {
        idx[1] = bi;
        *ticket = 0; /* ready for the next step's launch */
    }
}

/* The full step: each warp computes STEP_ROWS whole rows, STEP_BATCH in
 * flight, and writes the corrected logits when they are wanted. SAMPLED
 * (the sampled walk; its own instance, so the greedy step's registers are
 * untouched), also the first stage of the row's distribution
 * (sample.cu's spread distribution): the max of y / T over the row, as
 * max(y) / T (the same float: rounding y / T is monotone in y for T > 0,
 * and one division instead of one a row keeps the registers of the greedy
 * step), each block's max into pmx[block], merged by the last block into
 * *dmx (a max: the order is irrelevant; NaN never wins, as with fmaxf in
 * sample.cu's max). */
template <int DT, bool SAMPLED>
__global__ void __launch_bounds__(STEP_WARPS * 32)
    markov_step_kernel(const float *__restrict__ base, float *out, const void *w1, int w1dt, int64_t w1s,
                       const void *w2, int64_t w2s, int r, int64_t V, int bf16, int32_t *idx, float *emb,
                       float *pv, int *pi, unsigned *ticket, float T, float *pmx, float *dmx) {
    ds_cu_grid_wait();
    extern __shared__ float e[];
    __shared__ float sv[STEP_WARPS], smx[STEP_WARPS];
    __shared__ int si[STEP_WARPS];
    __shared__ float y0;
    __shared__ bool last;
    float mt = -INFINITY; /* max of y (SAMPLED) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    step_begin<DT>(base, w1, w1dt, w1s, w2, w2s, r, V, bf16, idx[0], emb, e, &y0);
    __syncthreads();
    float bv = y0;
    int bi = 0;
    const int64_t n0 = ((int64_t)blockIdx.x * STEP_WARPS + warp) * STEP_ROWS;
    for (int j = 0; j < STEP_ROWS; j += STEP_BATCH) {
        if (n0 + j >= V) break;
        int64_t n[STEP_BATCH];
#pragma unroll
        for (int q = 0; q < STEP_BATCH; q++) n[q] = n0 + j + q;
        float b[STEP_BATCH];
        step_rows<DT, STEP_BATCH>(w2, w2s, r, e, lane, n, V, b);
#pragma unroll
        for (int q = 0; q < STEP_BATCH; q++) {
            if (n[q] >= V) break;
            const float y = step_logit(base, b[q], n[q], bf16);
            if (lane == 0 && out) out[n[q]] = y;
            if (SAMPLED) mt = fmaxf(mt, y);
            if (step_better(y, (int)n[q], bv, bi)) bv = y, bi = (int)n[q];
        }
    }
    if (SAMPLED) { /* the block's max (every lane of a warp holds the same rows' values) */
        if (lane == 0) smx[warp] = mt;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < STEP_WARPS; w++) mt = fmaxf(mt, smx[w]);
            pmx[blockIdx.x] = mt; /* before step_end's fence and ticket */
        }
    }
    step_end(bv, bi, y0, pv, pi, ticket, idx, sv, si, &last);
    if (!SAMPLED || !last) return;
    /* The last block: every block's pmx is visible (step_end fenced after the ticket). */
    float m = -INFINITY;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) m = fmaxf(m, __ldcg(pmx + b));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    __syncthreads(); /* smx free */
    if (lane == 0) smx[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 0; w < STEP_WARPS; w++) m = fmaxf(m, smx[w]);
        *dmx = __fdiv_rn(m, T); /* = max of y / T: rounding y / T is monotone in y (T > 0) */
    }
}

/* The pruned step (only the tokens wanted, a bound given): with
 * c = coef[n] . (proj e) and rad = radius[n] |e| (markov_bound.h), the
 * computed bias of row n lies in [c - rad, c + rad], so its corrected logit
 * lies in [lo, hi] = [f(base[n], c - rad), f(base[n], c + rad)] (f is
 * monotone in the bias, bf16 rounding included; rad is inflated by 2^-10
 * for the rounding of |e| and by 2^-22 |c| for that of c +- rad). In a
 * block of PRUNE_ROWS rows, L = max(y0, max lo) is reached by a row whose
 * exact value is computed, so a row with hi < L can neither win the block
 * nor tie: the block computes only the others, PRUNE_BATCH per warp in
 * flight. A non-finite bound anywhere in the block (NaN or infinite logits
 * or weights) computes the whole block. Each step reads k + 2 floats per
 * row and the few surviving w2 rows instead of all of w2. */
#define PRUNE_THREADS (STEP_WARPS * 32)
#define PRUNE_PER_THREAD 4
#define PRUNE_ROWS (PRUNE_THREADS * PRUNE_PER_THREAD)
#define PRUNE_BATCH 4

/* What a pruned step keeps in shared memory besides e and y0. */
struct prune_shared {
    float pe[DS_MARKOV_BOUND_K + 1]; /* proj e, then |e|^2 */
    float sv[STEP_WARPS], wl[STEP_WARPS];
    int si[STEP_WARPS], wbad[STEP_WARPS];
    int ncand; /* zeroed by thread 0 before the step's first barrier */
    int cand[PRUNE_ROWS];
};

/* The parts of a block's rows' bounds that do not depend on the previous
 * token: per thread, rows nb + threadIdx.x + q PRUNE_THREADS (q <
 * PRUNE_PER_THREAD), their coef rows and radii (rows past V: zero). */
struct prune_rows {
    float cf[PRUNE_PER_THREAD][DS_MARKOV_BOUND_K], rd[PRUNE_PER_THREAD];
};
__device__ __forceinline__ void prune_rows_load(prune_rows &pr, const float *__restrict__ coef,
                                                const float *__restrict__ radius, int k, int64_t nb, int64_t V) {
#pragma unroll
    for (int q = 0; q < PRUNE_PER_THREAD; q++) {
        const int64_t n = nb + threadIdx.x + q * PRUNE_THREADS;
        pr.rd[q] = n < V ? radius[n] : 0.0f;
#pragma unroll
        for (int j = 0; j < DS_MARKOV_BOUND_K; j++) pr.cf[q][j] = n < V && j < k ? coef[n * k + j] : 0.0f;
    }
}
/* The thread's rows' base logits of one position. */
__device__ __forceinline__ void prune_base_load(float (&bs)[PRUNE_PER_THREAD], const float *base, int64_t nb,
                                                int64_t V) {
#pragma unroll
    for (int q = 0; q < PRUNE_PER_THREAD; q++) {
        const int64_t n = nb + threadIdx.x + q * PRUNE_THREADS;
        bs[q] = n < V ? base[n] : 0.0f;
    }
}

/* Q mode (markov_greedy_head): the base logits are not written; each row
 * has an interval of its raw logit (head_bound.h), and the rows in
 * contention are computed exactly here, with the full head's bits. */
struct head_walk {
    const float *lo, *hi; /* [G, V] raw bounds (head_bound.cu) */
    int64_t bstride;
    const float *pv;  /* the bounds blocks' best lower bound per position */
    const int *pi;
    int pblocks;
    const uint16_t *w; /* the bf16 head */
    int64_t ws;
    int K;
    const float *x; /* the drafted rows (fp32, stride xs) */
    int64_t xs;
    unsigned long long *trace; /* DS_CUDA_RING_TRACE: the launch's slot (ring_trace.h RT_KIND_HEAD_WALK), or NULL */
};
/* Thread 0's timestamp into field f of the block's trace record (tracing only). */
__device__ __forceinline__ void head_walk_stamp(const head_walk &hw, int f) {
    if (hw.trace && threadIdx.x == 0) ds_cu_trace_block(hw.trace)[f] = ds_cu_gtimer();
}
#define HEAD_GROUP 16 /* candidates a block computes at once (an mma's 16 weight rows) */
template <bool Q> struct head_shared {};
template <> struct head_shared<true> {
    float raw[PRUNE_ROWS]; /* the candidates' exact raw logits, then their corrected ones */
    float red[MMA_WARPS][HEAD_GROUP];
    /* per position: the row with the best lower bound (of the whole head), its base lower bound, coef and radius */
    float nlo[8], ncf[8][DS_MARKOV_BOUND_K], nrd[8];
    int nrow[8];
};

/* The raw logits' bits as the full head computes them: x (bf16 in DS_X_BF16)
 * against the base rows at bf16's rounding of the logits (bf16) or as they are. */
__device__ __forceinline__ float head_base(float raw, int bf16) { return bf16 ? ds_cu_rbf16(raw) : raw; }

/* head_exact_rows' products: each emulated warp's partial sum of rows ra
 * (weight row g) and rb (g + 8; -1: none) into hs.red[ew][g], [g + 8]. */
template <int R> /* R = 1: rows g only (n <= 8), both emulated warps' loads in flight at once; 2: rows g, g + 8 */
__device__ __forceinline__ void head_exact_pass(const head_walk &hw, const float *xsm, int64_t ra, int64_t rb,
                                                head_shared<true> &hs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    constexpr int H = MMA_WARPS / STEP_WARPS, HF = R == 1 ? H : 1; /* emulated warps a real one takes; in flight */
    const int nch = hw.K / 32;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int h0 = 0; h0 < H; h0 += HF)
        for (int c0 = 0; c0 < nch; c0 += MMA_WARPS * 8) {
            uint4 A[HF][8], B[HF][8];
#pragma unroll
            for (int h = 0; h < HF; h++)
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int c = c0 + warp + STEP_WARPS * (h0 + h) + MMA_WARPS * u;
                    A[h][u] = c < nch && ra >= 0 ? __ldg((const uint4 *)(hw.w + ra * hw.ws + 32 * c + 8 * t)) : zero;
                    B[h][u] = R == 2 && c < nch && rb >= 0
                                  ? __ldg((const uint4 *)(hw.w + rb * hw.ws + 32 * c + 8 * t)) : zero;
                }
#pragma unroll
            for (int h = 0; h < HF; h++) {
                const int ew = warp + STEP_WARPS * (h0 + h);
                float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
                if (c0 > 0) acc[0][0] = hs.red[ew][g], acc[0][2] = hs.red[ew][g + 8]; /* K > 4096: carry on */
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int c = c0 + ew + MMA_WARPS * u;
                    if (c >= nch) break;
                    float f[8], nf[8], ss = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) f[i] = g == 0 ? xsm[32 * c + 8 * t + i] : 0.0f;
                    uint32_t xh[1][4], xl[1][4];
                    split_x8<false>(f, 0, 1, nf, &ss, xh[0], xl[0]);
                    mma_chunk<1>(acc, A[h][u], B[h][u], xh, xl);
                }
                __syncwarp();
                if (t == 0) hs.red[ew][g] = acc[0][0], hs.red[ew][g + 8] = acc[0][2]; /* (row g / g + 8, column 0) */
                __syncwarp();
            }
        }
}

/* The exact raw logits of candidates cand[g0 .. g0 + n) (n <= 16, rows nb +
 * cand[i]) against x (K fp32 values in shared memory), in
 * matmul_mma_frag.cuh's order: emulated warp ew of MMA_WARPS takes the 32-wide
 * chunks ew, ew + 16, ... (real warp w takes ew = w and w + STEP_WARPS), each
 * an mma_chunk with the candidate in weight row g (or g + 8) and x in column
 * 0, and the 16 partials are added in ew order (mma_store_rows). Every thread
 * of the block calls it. */
__device__ __forceinline__ void head_exact_rows(const head_walk &hw, const float *xsm, const int *cand, int g0, int n,
                                                int64_t nb, head_shared<true> &hs) {
    const int g = (threadIdx.x & 31) >> 2;
    const int64_t ra = g < n ? nb + cand[g0 + g] : -1, rb = g + 8 < n ? nb + cand[g0 + g + 8] : -1;
    if (n <= 8)
        head_exact_pass<1>(hw, xsm, ra, rb, hs);
    else
        head_exact_pass<2>(hw, xsm, ra, rb, hs);
    __syncthreads();
    if (threadIdx.x < n) {
        float a = hs.red[0][threadIdx.x];
#pragma unroll
        for (int w = 1; w < MMA_WARPS; w++) a = __fadd_rn(a, hs.red[w][threadIdx.x]);
        hs.raw[g0 + threadIdx.x] = a;
    }
    __syncthreads();
}

/* A pruned step over the block's rows, once e = w1[prev] is in shared
 * memory and warp 0 is writing *y0 (step_begin): warps 1.. compute proj e
 * and |e|^2 (each row in a fixed order), the bounds leave the rows that
 * may win or tie, and those are computed exactly; the thread's best (value,
 * column), from column 0's, is returned for block_best.
 * Q: bs / bsh are the rows' base logits' lower / upper bounds, and the rows
 * left are computed exactly (head_exact_rows) before their bias; column 0
 * is block 0's first candidate (its value starts block 0's scan, as y0
 * does otherwise), and L also takes the step's row with the best lower
 * bound of the whole head (hs.nrow[s], a valid lower bound of the best), so
 * that a block's candidates are those near the global best, not its own. */
template <int DT, bool Q = false>
__device__ __forceinline__ void pruned_rows_best(const prune_rows &pr, const float (&bs)[PRUNE_PER_THREAD],
                                                 const float (&bsh)[PRUNE_PER_THREAD], const float *base,
                                                 const void *w2, int64_t w2s, int r, int64_t V, int bf16,
                                                 const float *e, const float *y0p, const float *__restrict__ proj,
                                                 int k, int64_t nb, unsigned *rows_done, prune_shared &sh,
                                                 const head_walk &hw, const float *xsm, int s, head_shared<Q> &hs,
                                                 float *bvo, int *bio) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = warp - 1; warp > 0 && j <= k; j += STEP_WARPS - 1) {
        const float *pj = j < k ? proj + (int64_t)j * r : e;
        float acc = 0.0f;
        for (int i = lane; i < r; i += 32) acc = fmaf(pj[i], e[i], acc);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) sh.pe[j] = acc;
    }
    __syncthreads();
    const float y0 = Q ? -INFINITY : *y0p;
    float p[DS_MARKOV_BOUND_K];
#pragma unroll
    for (int j = 0; j < DS_MARKOV_BOUND_K; j++) p[j] = j < k ? sh.pe[j] : 0.0f;
    const float ne = sqrtf(sh.pe[k]) * (1.0f + 1.0f / 1024.0f);
    float hi[PRUNE_PER_THREAD];
    float lmax = y0;
    int bad = (!Q && !isfinite(y0)) || !isfinite(ne);
    if constexpr (Q) {
        if (threadIdx.x == 0 && hs.nrow[s] >= 0) { /* the global row's lower bound */
            float c = 0.0f;
#pragma unroll
            for (int j = 0; j < DS_MARKOV_BOUND_K; j++)
                if (j < k) c = fmaf(hs.ncf[s][j], p[j], c);
            const float rad = fmaf(hs.nrd[s], ne, fabsf(c) * 0x1p-22f);
            const float l = corrected_logit(hs.nlo[s], c - rad, bf16);
            if (isfinite(l)) lmax = fmaxf(lmax, l);
        }
    }
#pragma unroll
    for (int q = 0; q < PRUNE_PER_THREAD; q++) {
        const int64_t n = nb + threadIdx.x + q * PRUNE_THREADS;
        hi[q] = -INFINITY;
        if (n >= V) continue;
        float c = 0.0f;
#pragma unroll
        for (int j = 0; j < DS_MARKOV_BOUND_K; j++)
            if (j < k) c = fmaf(pr.cf[q][j], p[j], c);
        const float rad = fmaf(pr.rd[q], ne, fabsf(c) * 0x1p-22f);
        const float lo = corrected_logit(bs[q], c - rad, bf16);
        hi[q] = corrected_logit(Q ? bsh[q] : bs[q], c + rad, bf16);
        bad |= !isfinite(lo) || !isfinite(hi[q]);
        lmax = fmaxf(lmax, lo);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        lmax = fmaxf(lmax, __shfl_xor_sync(0xffffffffu, lmax, off));
        bad |= __shfl_xor_sync(0xffffffffu, bad, off);
    }
    if (lane == 0) sh.wl[warp] = lmax, sh.wbad[warp] = bad;
    __syncthreads();
    for (int w = 0; w < STEP_WARPS; w++) lmax = fmaxf(lmax, sh.wl[w]), bad |= sh.wbad[w];
    /* Q: block 0's column 0 holds slot 0 (thread 0 put it there before the first barrier) */
#pragma unroll
    for (int q = 0; q < PRUNE_PER_THREAD; q++) {
        const int64_t n = nb + threadIdx.x + q * PRUNE_THREADS;
        if (n < V && (bad || hi[q] >= lmax) && !(Q && n == 0)) sh.cand[atomicAdd(&sh.ncand, 1)] = (int)(n - nb);
    }
    __syncthreads();
    if constexpr (Q) head_walk_stamp(hw, RT_WALK_STEP(s, 0));
    float bv = y0;
    int bi = Q ? 0x7fffffff : 0;
    const int cnt = sh.ncand;
    if (threadIdx.x == 0) atomicAdd(rows_done, (unsigned)cnt);
    if constexpr (Q)
        for (int g0 = 0; g0 < cnt; g0 += HEAD_GROUP)
            head_exact_rows(hw, xsm, sh.cand, g0, min(HEAD_GROUP, cnt - g0), nb, hs);
    for (int c0 = warp * PRUNE_BATCH; c0 < cnt; c0 += STEP_WARPS * PRUNE_BATCH) {
        int64_t n[PRUNE_BATCH];
#pragma unroll
        for (int q = 0; q < PRUNE_BATCH; q++) n[q] = c0 + q < cnt ? nb + sh.cand[c0 + q] : -1;
        float b[PRUNE_BATCH];
        step_rows<DT, PRUNE_BATCH>(w2, w2s, r, e, lane, n, V, b);
#pragma unroll
        for (int q = 0; q < PRUNE_BATCH; q++) {
            if (n[q] < 0) break;
            if constexpr (Q) {
                const float y = corrected_logit(head_base(hs.raw[c0 + q], bf16), b[q], bf16);
                __syncwarp();
                if (lane == 0) hs.raw[c0 + q] = y; /* each candidate's slot is its warp's alone */
            } else {
                const float y = step_logit(base, b[q], n[q], bf16);
                if (step_better(y, (int)n[q], bv, bi)) bv = y, bi = (int)n[q];
            }
        }
    }
    if constexpr (Q) { /* the scan, from column 0's value in block 0 (a NaN there wins, as the host scan's) */
        __syncthreads();
        if (blockIdx.x == 0 && nb == 0) bv = hs.raw[0], bi = 0;
        for (int i = threadIdx.x; i < cnt; i += PRUNE_THREADS) {
            const float y = hs.raw[i];
            const int c = (int)(nb + sh.cand[i]);
            if (step_better(y, c, bv, bi)) bv = y, bi = c;
        }
    }
    *bvo = bv;
    *bio = bi;
}

template <int DT>
__global__ void __launch_bounds__(PRUNE_THREADS)
    markov_pruned_step_kernel(const float *__restrict__ base, const void *w1, int w1dt, int64_t w1s, const void *w2,
                              int64_t w2s, int r, int64_t V, int bf16, int32_t *idx, float *emb, float *pv, int *pi,
                              unsigned *ticket, const float *__restrict__ proj, const float *__restrict__ coef,
                              const float *__restrict__ radius, int k, unsigned *rows_done) {
    extern __shared__ float e[];
    __shared__ prune_shared sh;
    __shared__ float y0;
    __shared__ bool last;
    const int64_t nb = (int64_t)blockIdx.x * PRUNE_ROWS;
    prune_rows pr; /* weights: before the wait */
    prune_rows_load(pr, coef, radius, k, nb, V);
    ds_cu_grid_wait();
    if (threadIdx.x == 0) sh.ncand = 0;
    float bs[PRUNE_PER_THREAD];
    prune_base_load(bs, base, nb, V);
    step_begin<DT>(base, w1, w1dt, w1s, w2, w2s, r, V, bf16, idx[0], emb, e, &y0);
    float bv;
    int bi;
    head_shared<false> hs0;
    pruned_rows_best<DT>(pr, bs, bs, base, w2, w2s, r, V, bf16, e, &y0, proj, k, nb, rows_done, sh, head_walk{},
                         NULL, 0, hs0, &bv, &bi);
    step_end(bv, bi, y0, pv, pi, ticket, idx, sh.sv, sh.si, &last);
}

/* The whole pruned walk in one launch (greedy, tokens only): the blocks
 * stay resident through the G steps and meet at a grid barrier after each
 * (the ticket counts arrivals: step s is over once it reaches
 * (s + 1) * blocks), where every block merges all blocks' bests itself, so
 * the next step's previous token needs no second round trip through a
 * last block; per step this saves a launch boundary and that round trip
 * (a separate launch a step took ~10 us at the 8B drafter). The parts of
 * the bounds that do not depend on the previous token (each thread's coef
 * and radius rows) are loaded before the grid wait, the next step's base
 * logits before the barrier. The ticket is zero at the launch (the walk's
 * upload, or the step region's, zeroes it) and left at G * blocks. A row's value and the merge order are the
 * step kernels', so the tokens are theirs bit for bit. Partials go to
 * per-step slots (pv, pi: [G][blocks]): no slot is rewritten while
 * another block may still read it. Launched only when every block fits on
 * the GPU at once (walk_fits), else the barrier could wait forever. */
template <int DT, bool Q>
__global__ void __launch_bounds__(PRUNE_THREADS)
    markov_walk_kernel(const float *__restrict__ base, int64_t bstride, int G, const void *w1, int w1dt, int64_t w1s,
                       const void *w2, int64_t w2s, int r, int64_t V, int bf16, int32_t *idx, float *emb,
                       int64_t estride, float *pv, int *pi, unsigned *ticket, const float *__restrict__ proj,
                       const float *__restrict__ coef, const float *__restrict__ radius, int k, unsigned *rows_done,
                       int32_t *dtok, head_walk hw) {
    extern __shared__ float e[]; /* r floats; Q: then two x rows (K floats each: this step's, the next's) */
    __shared__ prune_shared sh;
    __shared__ head_shared<Q> hs;
    __shared__ float y0;
    __shared__ int prev_s;
    float *xsm = e + ((r + 3) & ~3);
    const int64_t nb = (int64_t)blockIdx.x * PRUNE_ROWS;
    if constexpr (Q) head_walk_stamp(hw, RT_ENTRY);
    prune_rows pr; /* the previous token's independent part of each row's bound, before the wait */
    prune_rows_load(pr, coef, radius, k, nb, V);
    ds_cu_grid_wait();
    if constexpr (Q) head_walk_stamp(hw, RT_WAIT);
    float bs[PRUNE_PER_THREAD], bsh[PRUNE_PER_THREAD]; /* this step's base logits of the thread's rows (Q: bounds) */
    const auto base_load = [&](int s) {
        if constexpr (Q) {
#pragma unroll
            for (int q = 0; q < PRUNE_PER_THREAD; q++) {
                const int64_t n = nb + threadIdx.x + q * PRUNE_THREADS;
                bs[q] = n < V ? head_base(hw.lo[s * hw.bstride + n], bf16) : 0.0f;
                bsh[q] = n < V ? head_base(hw.hi[s * hw.bstride + n], bf16) : 0.0f;
            }
        } else {
            prune_base_load(bs, base + (int64_t)s * bstride, nb, V);
        }
    };
    base_load(0);
    const auto x_load = [&](int s) { /* the drafted row of step s into buffer s % 2 */
        if constexpr (Q)
            for (int i = threadIdx.x; i < hw.K; i += PRUNE_THREADS) xsm[(s & 1) * hw.K + i] = hw.x[s * hw.xs + i];
    };
    x_load(0);
    if constexpr (Q) { /* each position's row with the best lower bound, and its bound's parts */
        float bv[8];
        int bi[8];
#pragma unroll
        for (int s = 0; s < 8; s++) bv[s] = -INFINITY, bi[s] = -1;
        for (int b = threadIdx.x; b < hw.pblocks; b += PRUNE_THREADS) {
            float v[8];
            int c[8];
#pragma unroll
            for (int s = 0; s < 8; s++) v[s] = hw.pv[b * 8 + s], c[s] = hw.pi[b * 8 + s];
#pragma unroll
            for (int s = 0; s < 8; s++)
                if (v[s] > bv[s]) bv[s] = v[s], bi[s] = c[s];
        }
#pragma unroll
        for (int s = 0; s < 8; s++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv[s], off);
                const int oi = __shfl_xor_sync(0xffffffffu, bi[s], off);
                if (ov > bv[s]) bv[s] = ov, bi[s] = oi;
            }
            if ((threadIdx.x & 31) == 0) hs.red[threadIdx.x >> 5][s] = bv[s];
            if ((threadIdx.x & 31) == 0) ((int *)hs.red[STEP_WARPS + (threadIdx.x >> 5)])[s] = bi[s];
        }
        __syncthreads();
        if (threadIdx.x < G) {
            const int s = threadIdx.x;
            float v = -INFINITY;
            int bi = -1;
            for (int w = 0; w < STEP_WARPS; w++)
                if (hs.red[w][s] > v) v = hs.red[w][s], bi = ((const int *)hs.red[STEP_WARPS + w])[s];
            hs.nrow[s] = bi;
            if (bi >= 0) {
                hs.nlo[s] = head_base(hw.lo[s * hw.bstride + bi], bf16);
                hs.nrd[s] = radius[bi];
                for (int j = 0; j < DS_MARKOV_BOUND_K; j++) hs.ncf[s][j] = j < k ? coef[(int64_t)bi * k + j] : 0.0f;
            }
        }
    }
    int prev = idx[0];
    if constexpr (Q) head_walk_stamp(hw, RT_FIRST);
    for (int s = 0; s < G; s++) {
        const float *bsrow = base + (int64_t)s * bstride;
        if (threadIdx.x == 0) {
            sh.ncand = Q && blockIdx.x == 0 ? 1 : 0;
            sh.cand[0] = 0;
        }
        step_begin<DT, Q>(bsrow, w1, w1dt, w1s, w2, w2s, r, V, bf16, prev, emb + (int64_t)s * estride, e, &y0);
        float bv;
        int bi;
        pruned_rows_best<DT, Q>(pr, bs, bsh, bsrow, w2, w2s, r, V, bf16, e, &y0, proj, k, nb, rows_done, sh, hw,
                                xsm + (s & 1) * hw.K, s, hs, &bv, &bi);
        block_best(&bv, &bi, sh.sv, sh.si);
        float *pvs = pv + (size_t)s * gridDim.x;
        int *pis = pi + (size_t)s * gridDim.x;
        if (threadIdx.x == 0) {
            pvs[blockIdx.x] = bv;
            pis[blockIdx.x] = bi;
            /* the arrival releases the partial (no separate fence round trip) */
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ticket) : "memory");
            if constexpr (Q) head_walk_stamp(hw, RT_WALK_STEP(s, 1));
            /* the next step's e is w1 of some block's best: have this one's in L2 by then */
            if (s + 1 < G && bi >= 0 && bi < V) {
                const int esz = w1dt == DS_F32 ? 4 : 2;
                const char *row = (const char *)w1 + (int64_t)bi * w1s * esz;
                for (int off = 0; off < r * esz; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
            }
        }
        if (s + 1 < G) base_load(s + 1), x_load(s + 1); /* while the other blocks finish this step */
        if (threadIdx.x == 0) {
            const unsigned want = (unsigned)(s + 1) * gridDim.x;
            unsigned got;
            do
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(got) : "l"(ticket) : "memory");
            while (got < want);
        }
        __syncthreads();
        /* Every block merges the bests as the step kernels' last block does (Q: from block 0's best, which
         * starts at column 0's value). */
        if (Q)
            merge_bests(__ldcg(pvs), __ldcg(pis), 1, pvs, pis, sh.sv, sh.si, &bv, &bi);
        else
            merge_bests(y0, 0, 0, pvs, pis, sh.sv, sh.si, &bv, &bi);
        if (threadIdx.x == 0) {
            prev_s = bi;
            if (blockIdx.x == 0) {
                idx[s + 1] = bi;
                if (dtok) dtok[s] = bi;
            }
        }
        __syncthreads();
        prev = prev_s;
        if constexpr (Q) head_walk_stamp(hw, RT_WALK_STEP(s, 2));
    }
    if constexpr (Q) head_walk_stamp(hw, RT_END);
}

/* Whether the one-launch step applies: w2's rows 16-byte aligned in runs of 8. */
static bool step_fits(ds_tensor w2, ds_tensor emb) {
    const int esz = w2.dtype == DS_F32 ? 4 : 2;
    return (w2.dtype == DS_BF16 || w2.dtype == DS_F32 || w2.dtype == DS_F16) && w2.cols % 8 == 0 &&
           (w2.stride * esz) % 16 == 0 && (uintptr_t)w2.data % 16 == 0 && w2.cols <= 8192 && emb.dtype == DS_F32;
}

/* Whether the bound fits this walk (shapes as markov_bound.h builds them). */
static bool bound_fits(const ds_markov_bound *b, int64_t V, int64_t r) {
    const int64_t k = b->proj.rows;
    return k >= 1 && k <= DS_MARKOV_BOUND_K && b->proj.cols == r && b->proj.stride == r && b->coef.rows == V &&
           b->coef.cols == k && b->coef.stride == k && b->radius.rows == 1 && b->radius.cols == V &&
           b->proj.dtype == DS_F32 && b->coef.dtype == DS_F32 && b->radius.dtype == DS_F32;
}

/* The one-launch walk pays where the vocabulary spreads over many blocks
 * (the Qwen3-8B shape's 149: a draft round ~1.5 % faster); at a few blocks
 * a step's launch costs about what the grid barrier and every block's merge
 * do, so small vocabularies keep a launch a step. cfg.markov_fused
 * (DS_CUDA_MARKOV_FUSED=0 / 1) forces either, read at each call so that a
 * test can run both. */
#define WALK_FUSED_MIN_BLOCKS 64
static bool walk_fused(const ds_cuda_backend *cb, unsigned blocks) {
    return cb->cfg.markov_fused >= 0 ? cb->cfg.markov_fused != 0 : blocks >= WALK_FUSED_MIN_BLOCKS;
}

/* Whether all `blocks` blocks of the walk kernel can be resident at once
 * (its grid barrier waits for every block). */
template <typename K>
static bool walk_fits(const ds_cuda_backend *cb, K kernel, unsigned blocks, size_t smem) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, PRUNE_THREADS, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return (int64_t)per_sm * cb->sms >= (int64_t)blocks;
}

/* idx[0] = anchor, idx[1..G] = the drawn tokens, idx[G+1] the step
 * kernel's ticket (zero between launches), idx[G+2] the rows the pruned
 * steps computed: one upload sets them all, one download reads them.
 * In a step region they are the step's walk (graphs.cu: the region's
 * upload sets the anchor, step->ids[0], and zeros), and the tokens are
 * copied to the step's outputs (*dtok), which come back at the region's end. */
static bool walk_indices(ds_cuda_backend *cb, const char *op, int G, int32_t anchor, int32_t *tokens, int32_t **idx,
                         int32_t **dtok) {
    *dtok = NULL;
    if (cb->reg.active) {
        if (!(*dtok = (int32_t *)ds_cu_step_ptr(cb, op, tokens, G))) return false;
        if (cb->reg.step->n_ids < 1 || anchor != cb->reg.step->ids[0]) {
            ds_cu_fail(cb, op, "in a step region the anchor must be the step's ids[0]");
            return false;
        }
        *idx = cb->d_step + 1;
        return true;
    }
    if (!(*idx = ds_cu_indices(cb, op, G + 3))) return false;
    int32_t init[DS_CU_ROWS + 3] = {anchor};
    return ds_cu_ok(cb, op, cudaMemcpyAsync(*idx, init, (size_t)(G + 3) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                            cb->stream));
}

/* The walk's tokens: to the step region's outputs (dtok, unless a kernel wrote them there), or to the host. */
static void walk_results(ds_cuda_backend *cb, const char *op, int G, const int32_t *idx, int32_t *dtok, bool prune,
                         int64_t V, int32_t *tokens) {
    if (cb->reg.active) {
        if (dtok)
            ds_cu_ok(cb, op, cudaMemcpyAsync(dtok, idx + 1, (size_t)G * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                             cb->stream));
        return;
    }
    int32_t got[DS_CU_ROWS + 2];
    cb->stats.d2h++;
    if (!ds_cu_ok(cb, op, cudaMemcpyAsync(got, idx + 1, (size_t)(G + 2) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                          cb->stream)) ||
        !ds_cu_ok(cb, op, cudaStreamSynchronize(cb->stream)))
        return;
    memcpy(tokens, got, (size_t)G * sizeof(int32_t));
    if (prune) {
        cb->markov_rows += (uint32_t)got[G + 1];
        cb->markov_steps += (uint64_t)G;
        cb->markov_vocab = V;
    }
}

/* The gated and RNN heads (backend.h ds_markov_latent): before each step,
 * one block turns the previous token into the step's latent z on the device
 * (it reads prev where the step before wrote it: no host round trip), and
 * the step kernels then take z where the vanilla walk gathers w1[prev] (z
 * as a one-row table of stride 0, so the bias is w2 @ z, the bound applying
 * to z as to any vector). emb[k] = w1[prev_k] stays the confidence head's
 * input; the step kernels' own copy of their vector goes to a spare row. */
__device__ __forceinline__ float latent_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Step k's latent: x = [h; e] (gated) or [s; e; h] (RNN) in shared memory,
 * p = w x + b (a warp a row, lanes over x in order, then a butterfly), then
 * z (and the RNN's new state) from p. first: s = 0 (position 0). */
__global__ void markov_latent_kernel(int kind, int first, const int32_t *prev, const void *w1, int w1dt, int64_t w1s,
                                     int r, const float *h, int H, const void *w, int wdt, int64_t ws, const void *b,
                                     int bdt, float *emb, float *state, float *z) {
    ds_cu_grid_wait();
    extern __shared__ float xs[];
    const bool rnn = kind == DS_LATENT_RNN;
    const int K = rnn ? 2 * r + H : H + r, m = rnn ? 3 * r : r;
    const int eo = rnn ? r : H, ho = rnn ? 2 * r : 0; /* where e and h sit in x */
    float *p = xs + K;
    const int64_t row = (int64_t)*prev * w1s;
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        const float e = ds_cu_load(w1, w1dt, row + i);
        emb[i] = e;
        xs[eo + i] = e;
        if (rnn) xs[i] = first ? 0.0f : state[i];
    }
    for (int i = threadIdx.x; i < H; i += blockDim.x) xs[ho + i] = h[i];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int j = threadIdx.x >> 5; j < m; j += blockDim.x >> 5) {
        float acc = 0.0f;
        for (int i = lane; i < K; i += 32) acc += ds_cu_load(w, wdt, (int64_t)j * ws + i) * xs[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) p[j] = acc + ds_cu_load(b, bdt, j);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        if (rnn) {
            const float g = latent_sigmoid(p[i]);
            state[i] = g * xs[i] + (1.0f - g) * tanhf(p[r + i]);
            z[i] = tanhf(p[2 * r + i]);
        } else {
            z[i] = latent_sigmoid(p[i]) * xs[eo + i];
        }
    }
}

/* The latent's operands fit (w1 [V, r], hidden >= G rows): else a recorded failure. */
static bool latent_fits(ds_cuda_backend *cb, const char *op, const ds_markov_latent *lat, int G, int64_t r) {
    const bool rnn = lat->kind == DS_LATENT_RNN;
    const int64_t H = lat->hidden.cols, rows = rnn ? 3 * r : r, cols = rnn ? 2 * r + H : H + r;
    if ((lat->kind != DS_LATENT_GATED && !rnn) || lat->hidden.rows < G || lat->hidden.dtype != DS_F32 ||
        lat->w.rows != rows || lat->w.cols != cols || lat->b.rows * lat->b.cols != rows) {
        ds_cu_fail(cb, op, "%s head: hidden %lldx%lld, w %lldx%lld, b %lldx%lld do not fit rank %lld (w: %lldx%lld)",
                   rnn ? "rnn" : "gated", (long long)lat->hidden.rows, (long long)H, (long long)lat->w.rows,
                   (long long)lat->w.cols, (long long)lat->b.rows, (long long)lat->b.cols, (long long)r,
                   (long long)rows, (long long)cols);
        return false;
    }
    if (((size_t)cols + (size_t)rows) * sizeof(float) > 48 * 1024) {
        ds_cu_fail(cb, op, "head latent of %lld + %lld floats exceeds a block's 48 KB of shared memory",
                   (long long)cols, (long long)rows);
        return false;
    }
    return ds_cu_float_dtype(cb, op, lat->w.dtype) && ds_cu_float_dtype(cb, op, lat->b.dtype);
}

/* Floats of device memory a latent walk keeps: z, the RNN state, and the
 * spare row the step kernels copy their vector into. */
static size_t latent_floats(int r) { return 3 * (((size_t)r + 3) & ~(size_t)3); }

/* Queues step k's latent (prev = *prev on the device) into lbuf's z. */
static bool latent_step(ds_cuda_backend *cb, const char *op, const ds_markov_latent *lat, int k, const int32_t *prev,
                        ds_tensor w1, ds_tensor emb, float *lbuf) {
    const int r = (int)w1.cols, H = (int)lat->hidden.cols;
    const size_t q = latent_floats(r) / 3;
    const bool rnn = lat->kind == DS_LATENT_RNN;
    const size_t smem = ((size_t)(rnn ? 2 * r + H : H + r) + (size_t)(rnn ? 3 * r : r)) * sizeof(float);
    ds_cu_launch_smem(markov_latent_kernel, 1, 256, smem, cb->stream, (int)lat->kind, (int)(k == 0), prev, w1.data,
                      (int)w1.dtype, w1.stride, r, (const float *)ds_rows(lat->hidden, k, 1).data, H, lat->w.data,
                      (int)lat->w.dtype, lat->w.stride, lat->b.data, (int)lat->b.dtype,
                      (float *)ds_rows(emb, k, 1).data, lbuf + q, lbuf);
    return ds_cu_launched(cb, op);
}

/* markov_greedy, and with lat its gated / RNN walk (markov_greedy_latent).
 * given: the walk's index slot (G + 3 entries, the anchor and zeros already
 * there), its tokens left there for the caller to fetch (markov_greedy_seqs);
 * NULL: walk_indices' slot, the tokens fetched here. */
static void greedy_walk(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out, ds_tensor w1,
                        ds_tensor w2, const ds_markov_bound *bound, bool bf16, int32_t anchor, ds_tensor emb,
                        int32_t *tokens, int32_t *given = nullptr) {
    ds_cuda_backend *cb = ds_cu(be);
    const int G = (int)base.rows;
    const int64_t V = base.cols;
    if (G <= 0 || V <= 0) return;
    const bool markov = w1.data != NULL, keep = out.data != NULL;
    if ((keep && (out.rows != G || out.cols != V)) ||
        (markov && (w2.rows != V || w2.cols != w1.cols || emb.rows < G || emb.cols != w1.cols))) {
        ds_cu_fail(cb, "markov_greedy", "shapes do not match: base %lldx%lld, out %lldx%lld, w1 %lldx%lld, "
                   "w2 %lldx%lld, emb %lldx%lld", (long long)base.rows, (long long)V, (long long)out.rows,
                   (long long)out.cols, (long long)w1.rows, (long long)w1.cols, (long long)w2.rows,
                   (long long)w2.cols, (long long)emb.rows, (long long)emb.cols);
        return;
    }
    if (markov && bound && !bound_fits(bound, V, w1.cols)) {
        ds_cu_fail(cb, "markov_greedy", "bias bound: proj %lldx%lld, coef %lldx%lld, radius %lldx%lld do not fit "
                   "a %lld x %lld w2 (k <= %d directions)", (long long)bound->proj.rows,
                   (long long)bound->proj.cols, (long long)bound->coef.rows, (long long)bound->coef.cols,
                   (long long)bound->radius.rows, (long long)bound->radius.cols, (long long)V,
                   (long long)w1.cols, DS_MARKOV_BOUND_K);
        return;
    }
    if (markov && !ds_cu_float_dtype(cb, "markov_greedy", w1.dtype)) return;
    if (G > DS_CU_ROWS) {
        ds_cu_fail(cb, "markov_greedy", "block of %d positions (at most %d)", G, DS_CU_ROWS);
        return;
    }
    if (lat && !markov) {
        ds_cu_fail(cb, "markov_greedy", "a gated / RNN head's walk without its w1 and w2");
        return;
    }
    if (lat && !latent_fits(cb, "markov_greedy", lat, G, w1.cols)) return;
    int32_t *dtok = NULL, *idx = given;
    if (!given && !walk_indices(cb, "markov_greedy", G, anchor, tokens, &idx, &dtok)) return;
    unsigned *ticket = (unsigned *)(idx + G + 1), *rows_done = (unsigned *)(idx + G + 2);
    const int r = (int)w1.cols;
    const bool one_launch = markov && step_fits(w2, emb), prune = one_launch && !keep && bound;
    const unsigned walk_blocks = (unsigned)((V + PRUNE_ROWS - 1) / PRUNE_ROWS);
    bool fused = false; /* the whole walk in one launch (markov_walk_kernel) */
    if (prune && !lat && walk_fused(cb, walk_blocks)) { /* (the fused walk has no latent step) */
        const unsigned blocks = walk_blocks;
        const size_t smem = (size_t)r * sizeof(float);
#define WALK(DT_)                                                                                                   \
    do {                                                                                                            \
        if (walk_fits(cb, markov_walk_kernel<DT_, false>, blocks, smem)) {                                          \
            char *part = (char *)ds_cu_scratch(cb, "markov_greedy", (size_t)G * blocks * (sizeof(float) + sizeof(int))); \
            if (!part) return;                                                                                      \
            ds_cu_launch_smem(markov_walk_kernel<DT_, false>, blocks, PRUNE_THREADS, smem, cb->stream,              \
                              (const float *)base.data, base.stride, G, w1.data, (int)w1.dtype, w1.stride, w2.data,  \
                              w2.stride, r, V, (int)bf16, idx, (float *)emb.data, emb.stride, (float *)part,        \
                              (int *)(part + (size_t)G * blocks * sizeof(float)), ticket,                          \
                              (const float *)bound->proj.data, (const float *)bound->coef.data,                    \
                              (const float *)bound->radius.data, (int)bound->proj.rows, rows_done, dtok,           \
                              head_walk{});                                                                        \
            fused = true;                                                                                           \
        }                                                                                                           \
    } while (0)
        if (w2.dtype == DS_BF16) WALK(DS_BF16);
        else if (w2.dtype == DS_F16) WALK(DS_F16);
        else WALK(DS_F32);
#undef WALK
    }
    if (fused) {
        if (!ds_cu_launched(cb, "markov_greedy")) return;
        dtok = NULL; /* the kernel wrote the step's outputs */
    } else if (one_launch) {
        const int64_t rows_per_block = prune ? PRUNE_ROWS : STEP_WARPS * STEP_ROWS;
        const unsigned blocks = (unsigned)((V + rows_per_block - 1) / rows_per_block);
        const size_t pbytes = ((size_t)blocks * (sizeof(float) + sizeof(int)) + 15) & ~(size_t)15;
        char *part = (char *)ds_cu_scratch(cb, "markov_greedy", pbytes + (lat ? latent_floats(r) * sizeof(float) : 0));
        if (!part) return;
        float *pv = (float *)part;
        int *pi = (int *)(part + (size_t)blocks * sizeof(float));
        float *lbuf = (float *)(part + pbytes); /* lat: z, state, the spare row */
        /* The step's vector: w1[prev], or z as a one-row table (stride 0). */
        const void *tw = lat ? (const void *)lbuf : w1.data;
        const int tdt = lat ? (int)DS_F32 : (int)w1.dtype;
        const int64_t ts = lat ? 0 : w1.stride;
        const size_t smem = (size_t)r * sizeof(float);
        for (int k = 0; k < G; k++) {
            float *ek = (float *)ds_rows(emb, k, 1).data, *ok = keep ? (float *)ds_rows(out, k, 1).data : NULL;
            const float *bk = (const float *)ds_rows(base, k, 1).data;
            if (lat) {
                if (!latent_step(cb, "markov_greedy", lat, k, idx + k, w1, emb, lbuf)) return;
                ek = lbuf + 2 * (latent_floats(r) / 3); /* emb[k] is the latent kernel's */
            }
#define STEP(DT_)                                                                                                 \
    do {                                                                                                          \
        if (prune)                                                                                                \
            ds_cu_launch_smem(markov_pruned_step_kernel<DT_>, blocks, PRUNE_THREADS, smem, cb->stream, bk, tw,    \
                              tdt, ts, w2.data, w2.stride, r, V, (int)bf16, idx + k, ek,                            \
                              pv, pi, ticket, (const float *)bound->proj.data, (const float *)bound->coef.data,    \
                              (const float *)bound->radius.data, (int)bound->proj.rows, rows_done);               \
        else                                                                                                      \
            ds_cu_launch_smem(markov_step_kernel<DT_, false>, blocks, STEP_WARPS * 32, smem, cb->stream, bk, ok, tw, \
                              tdt, ts, w2.data, w2.stride, r, V, (int)bf16, idx + k, ek, pv, pi,                   \
                              ticket, 0.0f, (float *)NULL, (float *)NULL);                                        \
    } while (0)
            if (w2.dtype == DS_BF16) STEP(DS_BF16);
            else if (w2.dtype == DS_F16) STEP(DS_F16);
            else STEP(DS_F32);
#undef STEP
            if (!ds_cu_launched(cb, "markov_greedy")) return;
        }
    } else {
        const size_t lf = lat ? latent_floats(r) : 0;
        float *bias = markov ? (float *)ds_cu_tmp(cb, "markov_greedy", ((size_t)V + lf) * sizeof(float)) : NULL;
        float *row = keep ? NULL : (float *)ds_cu_tmp2(cb, "markov_greedy", (size_t)V * sizeof(float));
        if ((markov && !bias) || (!keep && !row)) return;
        float *lbuf = bias ? bias + V : NULL; /* lat: z, state, the spare row */
        for (int k = 0; k < G; k++) {
            const ds_tensor rt = {DS_F32, row, 1, V, V, false, {0, 0, NULL, NULL}};
            const ds_tensor ok = keep ? ds_rows(out, k, 1) : rt;
            if (markov) {
                ds_tensor ek = ds_rows(emb, k, 1);
                if (lat) {
                    if (!latent_step(cb, "markov_greedy", lat, k, idx + k, w1, emb, lbuf)) return;
                    const ds_tensor zt = {DS_F32, lbuf, 1, r, r, false, {0, 0, NULL, NULL}};
                    ek = zt; /* the bias is w2 z */
                } else {
                    ds_cu_launch(gather_row_kernel, 1, 256, cb->stream, (float *)ek.data, w1.data, w1.dtype,
                                 w1.stride, r, idx + k);
                    if (!ds_cu_launched(cb, "markov_greedy")) return;
                }
                ds_tensor bt = {DS_F32, bias, 1, V, V, false, {0, 0, NULL, NULL}};
                ds_cu_linear(be, bt, ek, w2, ds_no_tensor());
                ds_cu_launch(markov_add_kernel, (unsigned)((V + 255) / 256), 256, cb->stream, (float *)ok.data,
                             (const float *)ds_rows(base, k, 1).data, bias, V, bf16);
                if (!ds_cu_launched(cb, "markov_greedy")) return;
            } else {
                be->ops->copy(be, ok, ds_rows(base, k, 1));
            }
            if (!ds_cu_argmax_dev(cb, ok, idx + k + 1)) return;
        }
    }
    if (!given) walk_results(cb, "markov_greedy", G, idx, dtok, prune, V, tokens);
}

bool ds_cu_markov_greedy_seqs(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2,
                              const ds_markov_bound *bound, bool bf16, const int32_t *anchors, ds_tensor emb,
                              int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const char *op = "markov_greedy_seqs";
    if (n < 1 || n > DS_MARKOV_SEQS_MAX || base.rows % n || cb->reg.active || !w1.data || !w2.data) return false;
    const int G = (int)(base.rows / n), S = G + 3;
    const int64_t V = base.cols;
    if (G < 1 || G > DS_CU_ROWS || emb.rows < base.rows) return false;
    /* Every walk's slot: [anchor, tokens[G], ticket, rows], one upload. */
    int32_t init[DS_MARKOV_SEQS_MAX * (DS_CU_ROWS + 3)];
    memset(init, 0, (size_t)n * S * sizeof *init);
    for (int j = 0; j < n; j++) init[j * S] = anchors[j];
    int32_t *idx = ds_cu_indices(cb, op, n * S);
    if (!idx || !ds_cu_ok(cb, op, cudaMemcpyAsync(idx, init, (size_t)n * S * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                  cb->stream)))
        return true; /* a recorded failure */
    for (int j = 0; j < n && !cb->err; j++)
        greedy_walk(be, NULL, ds_rows(base, (int64_t)j * G, G), ds_no_tensor(), w1, w2, bound, bf16, anchors[j],
                    ds_rows(emb, (int64_t)j * G, G), tokens + (size_t)j * G, idx + (size_t)j * S);
    if (cb->err) return true;
    const bool prune = bound && step_fits(w2, emb);
    cb->stats.d2h++;
    if (!ds_cu_ok(cb, op, cudaMemcpyAsync(init, idx, (size_t)n * S * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                          cb->stream)) ||
        !ds_cu_ok(cb, op, cudaStreamSynchronize(cb->stream)))
        return true;
    for (int j = 0; j < n; j++) {
        memcpy(tokens + (size_t)j * G, init + j * S + 1, (size_t)G * sizeof *tokens);
        if (prune) {
            cb->markov_rows += (uint32_t)init[j * S + G + 2];
            cb->markov_steps += (uint64_t)G;
            cb->markov_vocab = V;
        }
    }
    return true;
}

void ds_cu_markov_greedy(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor w1, ds_tensor w2,
                         const ds_markov_bound *bound, bool bf16, int32_t anchor, ds_tensor emb, int32_t *tokens) {
    greedy_walk(be, NULL, base, out, w1, w2, bound, bf16, anchor, emb, tokens);
}

void ds_cu_markov_greedy_latent(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                ds_tensor w1, ds_tensor w2, const ds_markov_bound *bound, bool bf16, int32_t anchor,
                                ds_tensor emb, int32_t *tokens) {
    greedy_walk(be, lat, base, out, w1, w2, bound, bf16, anchor, emb, tokens);
}

/* backend.h markov_greedy_head: the walk reads the head's bounds
 * (head_bound.cu) instead of its written logits, and computes the rows in
 * contention itself (markov_walk_kernel's Q mode). Where that does not
 * apply (no quantized copy, a head or walk of another shape, or
 * DS_CUDA_HEAD_BOUND=0), the full head into base, then markov_greedy. */
void ds_cu_markov_greedy_head(ds_backend *be, ds_tensor x, ds_tensor head, ds_tensor base, bool bf16, ds_tensor w1,
                              ds_tensor w2, const ds_markov_bound *bound, int32_t anchor, ds_tensor emb,
                              int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const int G = (int)x.rows;
    const int64_t V = head.rows;
    if (G <= 0 || V <= 0) return;
    if (base.rows != G || base.cols != V || x.cols != head.cols) {
        ds_cu_fail(cb, "markov_greedy_head", "shapes do not match: x %lldx%lld, head %lldx%lld, base %lldx%lld",
                   (long long)x.rows, (long long)x.cols, (long long)V, (long long)head.cols, (long long)base.rows,
                   (long long)base.cols);
        return;
    }
    const bool markov = w1.data != NULL;
    const int r = markov ? (int)w1.cols : 0;
    const unsigned blocks = (unsigned)((V + PRUNE_ROWS - 1) / PRUNE_ROWS);
    const size_t smem = ((size_t)((r + 3) & ~3) + 2 * (size_t)head.cols) * sizeof(float);
    bool q = cb->cfg.head_bound && !head.q.bits && markov && bound && w2.rows == V && w2.cols == r &&
             emb.rows >= G && emb.cols == r && bound_fits(bound, V, r) && step_fits(w2, emb) && G <= 8 &&
             x.dtype == DS_F32 && walk_fused(cb, blocks) && ds_cu_float_dtype(cb, "markov_greedy_head", w1.dtype);
    if (q)
        q = w2.dtype == DS_BF16   ? walk_fits(cb, markov_walk_kernel<DS_BF16, true>, blocks, smem)
            : w2.dtype == DS_F16 ? walk_fits(cb, markov_walk_kernel<DS_F16, true>, blocks, smem)
                                 : walk_fits(cb, markov_walk_kernel<DS_F32, true>, blocks, smem);
    const struct ds_cu_head *h = q ? ds_cu_head_of(cb, head) : NULL;
    if (!h) {
        ds_cu_linear(be, base, x, head, ds_no_tensor());
        if (bf16) ds_cu_round_bf16(be, base);
        ds_cu_markov_greedy(be, base, ds_no_tensor(), w1, w2, bound, bf16, anchor, emb, tokens);
        return;
    }
    int32_t *dtok, *idx;
    if (!walk_indices(cb, "markov_greedy_head", G, anchor, tokens, &idx, &dtok)) return;
    unsigned *ticket = (unsigned *)(idx + G + 1), *rows_done = (unsigned *)(idx + G + 2);
    const size_t hb = (ds_cu_head_bounds_bytes(cb, V, head.cols) + 255) & ~(size_t)255;
    char *ws = (char *)ds_cu_scratch(cb, "markov_greedy_head", hb + (size_t)G * blocks * (sizeof(float) + sizeof(int)));
    if (!ws) return;
    ds_cu_head_bounds hbnd;
    if (!ds_cu_head_bounds_run(cb, h, x, ws, &hbnd)) return;
    const head_walk hw = {hbnd.lo, hbnd.hi, hbnd.stride, hbnd.pv, hbnd.pi, hbnd.blocks, (const uint16_t *)head.data,
                          head.stride, (int)head.cols, (const float *)x.data, x.stride,
                          ds_cu_ring_trace_slot(cb, G, RT_KIND_HEAD_WALK, 0, (int)blocks)};
    float *pv = (float *)(ws + hb);
    int *pi = (int *)(ws + hb + (size_t)G * blocks * sizeof(float));
#define HWALK(DT_)                                                                                                  \
    ds_cu_launch_smem(markov_walk_kernel<DT_, true>, blocks, PRUNE_THREADS, smem, cb->stream, (const float *)NULL,   \
                      (int64_t)0, G, w1.data, (int)w1.dtype, w1.stride, w2.data, w2.stride, r, V, (int)bf16, idx,     \
                      (float *)emb.data, emb.stride, pv, pi, ticket, (const float *)bound->proj.data,                \
                      (const float *)bound->coef.data, (const float *)bound->radius.data, (int)bound->proj.rows,     \
                      rows_done, dtok, hw)
    if (w2.dtype == DS_BF16) HWALK(DS_BF16);
    else if (w2.dtype == DS_F16) HWALK(DS_F16);
    else HWALK(DS_F32);
#undef HWALK
    if (!ds_cu_launched(cb, "markov_greedy_head")) return;
    walk_results(cb, "markov_greedy_head", G, idx, NULL, true, V, tokens);
}

/* The sampled walk (backend.h markov_sample): every step writes the whole
 * corrected logits row (the full step kernel, whose argmax into idx[k+1]
 * is then overwritten, or the unfused gather / linear / add), then the row
 * becomes its processed distribution (probs[k]) and idx[k+1] is drawn from
 * it with u[k] (sample.cu: spread over many blocks a row, the step kernel
 * doing the first stage, the row's max, as it writes the row; or one block
 * a row where the spread kernels do not apply). The next step's gather
 * reads that token on the device; the G tokens come back once. */
/* markov_sample, and with lat its gated / RNN walk (markov_sample_latent). */
static void sample_walk(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out, ds_tensor probs,
                        ds_tensor w1, ds_tensor w2, bool bf16, int32_t anchor, const ds_sampling *s, const double *u,
                        ds_tensor emb, int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const int G = (int)base.rows;
    const int64_t V = base.cols;
    if (G <= 0 || V <= 0) return;
    const bool markov = w1.data != NULL, keep = out.data != NULL;
    char why[256];
    if (!ds_markov_sample_fits(base, out, probs, w1, w2, emb, why, sizeof why)) {
        ds_cu_fail(cb, "markov_sample", "%s", why);
        return;
    }
    if (markov && !ds_cu_float_dtype(cb, "markov_sample", w1.dtype)) return;
    if (G > DS_CU_ROWS) {
        ds_cu_fail(cb, "markov_sample", "block of %d positions (at most %d)", G, DS_CU_ROWS);
        return;
    }
    if (lat && !markov) {
        ds_cu_fail(cb, "markov_sample", "a gated / RNN head's walk without its w1 and w2");
        return;
    }
    if (lat && !latent_fits(cb, "markov_sample", lat, G, w1.cols)) return;
    /* idx as markov_greedy lays it out: [anchor, tokens[G], ticket, rows]. */
    int32_t *idx = ds_cu_indices(cb, "markov_sample", G + 3);
    if (!idx) return;
    int32_t init[DS_CU_ROWS + 3] = {anchor};
    if (!ds_cu_ok(cb, "markov_sample", cudaMemcpyAsync(idx, init, (size_t)(G + 3) * sizeof(int32_t),
                                                       cudaMemcpyHostToDevice, cb->stream)))
        return;
    unsigned *ticket = (unsigned *)(idx + G + 1);
    const int r = markov ? (int)w1.cols : 0;
    const bool one_launch = markov && step_fits(w2, emb);
    /* Where the corrected row goes when out does not keep it. */
    float *row = markov && !keep ? (float *)ds_cu_tmp2(cb, "markov_sample", (size_t)V * sizeof(float)) : NULL;
    /* lat: z, state and the spare row, in tmp (the unfused step's linear may use the scratch) */
    const size_t lf = lat ? latent_floats(r) : 0;
    float *bias = (markov && !one_launch) || lat
                      ? (float *)ds_cu_tmp(cb, "markov_sample", ((size_t)(one_launch ? 0 : V) + lf) * sizeof(float))
                      : NULL;
    if (markov && ((!keep && !row) || ((!one_launch || lat) && !bias))) return;
    float *lbuf = lat ? bias + (one_launch ? 0 : V) : NULL;
    /* The step's vector: w1[prev], or z as a one-row table (stride 0). */
    const void *tw = lat ? (const void *)lbuf : w1.data;
    const int tdt = lat ? (int)DS_F32 : (int)w1.dtype;
    const int64_t ts = lat ? 0 : w1.stride;
    const unsigned blocks = (unsigned)((V + STEP_WARPS * STEP_ROWS - 1) / (STEP_WARPS * STEP_ROWS));
    /* The distributions spread over many blocks (sample.cu) where they
     * apply, their workspace (a row state per step) beside the step
     * kernel's partials; not with the unfused step, whose linear may use
     * the scratch buffer itself. */
    const bool spread = ds_cu_dist_fast(V, s) && (one_launch || !markov);
    float *pv = NULL, *pmx = NULL;
    int *pi = NULL;
    void *ws = NULL;
    if (one_launch || spread) {
        const size_t pbytes = ((size_t)blocks * (2 * sizeof(float) + sizeof(int)) + 255) & ~(size_t)255;
        char *part = (char *)ds_cu_scratch(cb, "markov_sample", pbytes + (spread ? ds_cu_dist_bytes(G, V) : 0));
        if (!part) return;
        pv = (float *)part;
        pi = (int *)(part + (size_t)blocks * sizeof(float));
        pmx = (float *)(part + (size_t)blocks * (sizeof(float) + sizeof(int)));
        if (spread) {
            ws = part + pbytes;
            if (!ds_cu_dist_reset(cb, "markov_sample", ws, G)) return;
        }
    }
    for (int k = 0; k < G; k++) {
        const float *bk = (const float *)ds_rows(base, k, 1).data;
        float *lk = keep ? (float *)ds_rows(out, k, 1).data : row;
        if (markov) {
            float *ek = (float *)ds_rows(emb, k, 1).data;
            if (lat) {
                if (!latent_step(cb, "markov_sample", lat, k, idx + k, w1, emb, lbuf)) return;
                ek = lbuf + 2 * (lf / 3); /* emb[k] is the latent kernel's */
            }
            if (one_launch) {
                const size_t smem = (size_t)r * sizeof(float);
#define SSTEP(DT_)                                                                                                \
    do {                                                                                                          \
        if (spread)                                                                                               \
            ds_cu_launch_smem(markov_step_kernel<DT_, true>, blocks, STEP_WARPS * 32, smem, cb->stream, bk, lk,   \
                              tw, tdt, ts, w2.data, w2.stride, r, V, (int)bf16, idx + k, ek,                       \
                              pv, pi, ticket, s->temperature, pmx, ds_cu_dist_max_slot(ws, G, V, k));             \
        else                                                                                                      \
            ds_cu_launch_smem(markov_step_kernel<DT_, false>, blocks, STEP_WARPS * 32, smem, cb->stream, bk, lk,  \
                              tw, tdt, ts, w2.data, w2.stride, r, V, (int)bf16, idx + k, ek,                       \
                              pv, pi, ticket, 0.0f, (float *)NULL, (float *)NULL);                                \
    } while (0)
                if (w2.dtype == DS_BF16) SSTEP(DS_BF16);
                else if (w2.dtype == DS_F16) SSTEP(DS_F16);
                else SSTEP(DS_F32);
#undef SSTEP
            } else {
                ds_tensor et = ds_rows(emb, k, 1);
                if (lat) {
                    const ds_tensor zt = {DS_F32, lbuf, 1, r, r, false, {0, 0, NULL, NULL}};
                    et = zt; /* the bias is w2 z */
                } else {
                    ds_cu_launch(gather_row_kernel, 1, 256, cb->stream, ek, w1.data, (int)w1.dtype, w1.stride, r,
                                 idx + k);
                    if (!ds_cu_launched(cb, "markov_sample")) return;
                }
                ds_tensor bt = {DS_F32, bias, 1, V, V, false, {0, 0, NULL, NULL}};
                ds_cu_linear(be, bt, et, w2, ds_no_tensor());
                ds_cu_launch(markov_add_kernel, (unsigned)((V + 255) / 256), 256, cb->stream, lk, bk,
                             (const float *)bias, V, (int)bf16);
            }
            if (!ds_cu_launched(cb, "markov_sample")) return;
        } else if (keep) {
            be->ops->copy(be, ds_rows(out, k, 1), ds_rows(base, k, 1));
        } else {
            lk = (float *)bk; /* no head: the base logits are the corrected ones (read only) */
        }
        float *pk = (float *)ds_rows(probs, k, 1).data;
        if (spread) { /* the step kernel left the max of the row / T in row k's state when it wrote the row */
            if (!ds_cu_dist_run(cb, "markov_sample", ws, G, k, lk, V, pk, V, 1, V, s, u + k, idx + k + 1,
                                markov && one_launch))
                return;
        } else if (!ds_cu_probs_draw_dev(cb, "markov_sample", lk, pk, V, s, u[k], idx + k + 1)) {
            return;
        }
    }
    int32_t got[DS_CU_ROWS];
    if (ds_cu_ok(cb, "markov_sample",
                 cudaMemcpyAsync(got, idx + 1, (size_t)G * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)) &&
        ds_cu_ok(cb, "markov_sample", cudaStreamSynchronize(cb->stream)))
        memcpy(tokens, got, (size_t)G * sizeof(int32_t));
}

void ds_cu_markov_sample(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                         bool bf16, int32_t anchor, const ds_sampling *s, const double *u, ds_tensor emb,
                         int32_t *tokens) {
    sample_walk(be, NULL, base, out, probs, w1, w2, bf16, anchor, s, u, emb, tokens);
}

void ds_cu_markov_sample_latent(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                ds_tensor probs, ds_tensor w1, ds_tensor w2, bool bf16, int32_t anchor,
                                const ds_sampling *s, const double *u, ds_tensor emb, int32_t *tokens) {
    sample_walk(be, lat, base, out, probs, w1, w2, bf16, anchor, s, u, emb, tokens);
}

/* ---- sampled walks of many sequences at once (markov_sample_seqs) ------- */

/* The butterfly of markov_step_kernel (v += shfl_xor(v, off), off = 16 ..
 * 1) for 32 values at once, by recursive halving, with the values laid out
 * so that no lane selects: lane l's register p[i] holds value i ^ l. At the
 * level of width W a lane keeps p[i] (i < W: values whose bit W is the
 * lane's) and adds its partner's p[i + W], which holds the same value
 * (((i + W) ^ (l ^ W)) == i ^ l). Each value is added with the same
 * partner's partial at every level as in the butterfly (a + b == b + a
 * exactly), so the sums are the butterfly's bits; 31 shuffles instead of
 * 160. Lane t returns value t's sum (p[0] holds 0 ^ t). */
template <int W> __device__ __forceinline__ void halving_level(float p[32]) {
#pragma unroll
    for (int i = 0; i < W; i++) p[i] += __shfl_xor_sync(0xffffffffu, p[i + W], W);
}
__device__ __forceinline__ float halving_sum32(float p[32]) {
    halving_level<16>(p);
    halving_level<8>(p);
    halving_level<4>(p);
    halving_level<2>(p);
    halving_level<1>(p);
    return p[0];
}

/* One position of n sequences' walks: rows[j][m] = sequence j's corrected
 * logit of token m. A warp loads its rows of w2 once and takes them through
 * every sequence's e_j = w1[prev_j] (shared memory), so the weights are read
 * once a position instead of once a sequence. Each (row, sequence) value is
 * markov_step_kernel's: lane l's elements 8l..8l+7 (one 256-wide chunk: r <=
 * 256), fmaf from zero in order, the butterfly's sums (halving_sum32, 32
 * values a warp: 8 rows x 4 sequences), the same step_logit. Block 0 writes
 * every e_j to emb (the confidence head's input). */
template <int DT>
__global__ void __launch_bounds__(STEP_WARPS * 32)
    markov_seqs_step_kernel(const float *__restrict__ base, int64_t bss, float *__restrict__ rows, const void *w1,
                            int w1dt, int64_t w1s, const void *w2, int64_t w2s, int r, int64_t V, int bf16,
                            const int32_t *prev, float *emb, int64_t ess, int n) {
    static_assert(STEP_BATCH == 8, "a warp's 32 sums are 8 rows x 4 sequences");
    ds_cu_grid_wait();
    extern __shared__ float e[]; /* [n][r] */
    __shared__ int64_t w1row[DS_MARKOV_SEQS_MAX];
    if (threadIdx.x < n) w1row[threadIdx.x] = (int64_t)prev[threadIdx.x] * w1s;
    __syncthreads();
    /* The n rows of w1, eight loads a thread in flight before any is stored. */
    for (int i0 = threadIdx.x; i0 < n * r; i0 += 8 * blockDim.x) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < n * r ? ds_cu_load(w1, w1dt, w1row[i / r] + i % r) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = i0 + u * blockDim.x;
            if (i >= n * r) break;
            e[i] = v[u];
            if (blockIdx.x == 0) emb[(i / r) * ess + i % r] = v[u];
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = 8 * lane;
    const int64_t n0 = ((int64_t)blockIdx.x * STEP_WARPS + warp) * STEP_ROWS;
    /* Register p[4q + s] holds value (4q + s) ^ lane (halving_sum32): row q ^ qx, sequence j0 + (s ^ sx). */
    const int qx = lane >> 2, sx = lane & 3;
    for (int jr = 0; jr < STEP_ROWS; jr += STEP_BATCH) {
        if (n0 + jr >= V) break;
        float f[STEP_BATCH][8];
#pragma unroll
        for (int q = 0; q < STEP_BATCH; q++) {
            const int64_t m = n0 + jr + (q ^ qx);
            if (k < r && m < V) {
                ds_cu_load8<DT>(w2, m * w2s + k, f[q]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) f[q][i] = 0.0f;
            }
        }
        for (int j0 = 0; j0 < n; j0 += 4) {
            float p[32]; /* p[4q + s]: row q ^ qx, sequence j0 + (s ^ sx) (past n: a copy of the last, not stored) */
#pragma unroll
            for (int s4 = 0; s4 < 4; s4++) {
                const int js = j0 + (s4 ^ sx);
                const float *es = e + (js < n ? js : n - 1) * r;
                float ev[8];
#pragma unroll
                for (int i = 0; i < 8; i++) ev[i] = k < r ? es[k + i] : 0.0f;
#pragma unroll
                for (int q = 0; q < STEP_BATCH; q++) {
                    float acc = 0.0f;
                    if (k < r)
#pragma unroll
                        for (int i = 0; i < 8; i++) acc = fmaf(f[q][i], ev[i], acc);
                    p[4 * q + s4] = acc;
                }
            }
            const float v = halving_sum32(p);
            const int j = j0 + (lane & 3);
            const int64_t m = n0 + jr + (lane >> 2);
            if (j < n && m < V) rows[j * V + m] = step_logit(base + j * bss, v, m, bf16);
        }
    }
}

/* Whether sampling rules a and b are the same (one spread launch takes both rows). */
static bool same_sampling(const ds_sampling *a, const ds_sampling *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

bool ds_cu_markov_sample_seqs(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2, bool bf16,
                              const int32_t *anchors, const ds_sampling *const *s, const double *u, ds_tensor emb,
                              int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const char *op = "markov_sample_seqs";
    if (n < 1 || n > DS_MARKOV_SEQS_MAX || base.rows % n || cb->reg.active || !w1.data || !w2.data) return false;
    const int G = (int)(base.rows / n), r = (int)w1.cols;
    const int64_t V = base.cols;
    if (G < 1 || G > DS_CU_ROWS || V < 1 || V > INT32_MAX || base.dtype != DS_F32 || base.stride != V ||
        w1.rows != V || w2.rows != V || w2.cols != r || r > 256 || !step_fits(w2, emb) || emb.rows < base.rows ||
        emb.cols != r || (w1.dtype != DS_F32 && w1.dtype != DS_BF16 && w1.dtype != DS_F16))
        return false;
    for (int j = 0; j < n; j++)
        if (!ds_cu_dist_fast(V, s[j]) || !(s[j]->temperature > 0)) return false;
    /* idx[k * n + j]: sequence j's token at block position k (0: the anchor). */
    int32_t *idx = ds_cu_indices(cb, op, (G + 1) * n);
    float *rows = (float *)ds_cu_tmp2(cb, op, (size_t)n * V * sizeof(float));
    void *ws = ds_cu_scratch(cb, op, ds_cu_dist_bytes(n, V));
    if (!idx || !rows || !ws) return true; /* a recorded failure */
    if (!ds_cu_ok(cb, op, cudaMemcpyAsync(idx, anchors, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                          cb->stream)))
        return true;
    const unsigned blocks = (unsigned)((V + STEP_WARPS * STEP_ROWS - 1) / (STEP_WARPS * STEP_ROWS));
    const size_t smem = (size_t)n * r * sizeof(float);
    for (int k = 0; k < G; k++) {
        const float *bk = (const float *)ds_rows(base, k, 1).data;
        float *ek = (float *)ds_rows(emb, k, 1).data;
#define SEQ_STEP(DT_)                                                                                                  \
    ds_cu_launch_smem(markov_seqs_step_kernel<DT_>, blocks, STEP_WARPS * 32, smem, cb->stream, bk,                     \
                      (int64_t)G * base.stride, rows, w1.data, (int)w1.dtype, w1.stride, w2.data, w2.stride, r, V,     \
                      (int)bf16, (const int32_t *)idx + (size_t)k * n, ek, (int64_t)G * emb.stride, n)
        if (w2.dtype == DS_BF16) SEQ_STEP(DS_BF16);
        else if (w2.dtype == DS_F16) SEQ_STEP(DS_F16);
        else SEQ_STEP(DS_F32);
#undef SEQ_STEP
        if (!ds_cu_launched(cb, op) || !ds_cu_dist_reset(cb, op, ws, n)) return true;
        /* Runs of sequences with one sampling rule: one spread launch each; each distribution into its base row k. */
        for (int j0 = 0; j0 < n;) {
            int j1 = j0 + 1;
            while (j1 < n && same_sampling(s[j0], s[j1])) j1++;
            double uk[DS_MARKOV_SEQS_MAX];
            for (int j = j0; j < j1; j++) uk[j - j0] = u[(size_t)j * G + k];
            if (!ds_cu_dist_run(cb, op, ws, n, j0, rows + (size_t)j0 * V, V,
                                (float *)ds_rows(base, (int64_t)j0 * G + k, 1).data, (int64_t)G * base.stride, j1 - j0,
                                V, s[j0], uk, idx + (size_t)(k + 1) * n + j0, false))
                return true;
            j0 = j1;
        }
    }
    int32_t got[(DS_CU_ROWS + 1) * DS_MARKOV_SEQS_MAX];
    if (ds_cu_ok(cb, op, cudaMemcpyAsync(got, idx + n, (size_t)G * n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                         cb->stream)) &&
        ds_cu_ok(cb, op, cudaStreamSynchronize(cb->stream)))
        for (int j = 0; j < n; j++)
            for (int k = 0; k < G; k++) tokens[(size_t)j * G + k] = got[(size_t)k * n + j];
    return true;
}
