/* DSpark's greedy Markov walk on the GPU (backend.h markov_greedy): each
 * block position adds the bias of the token drawn at the position before
 * it, so the walk is sequential, but every step's inputs are already on the
 * device: the previous token's index is read by the next step's gather, and
 * only the gamma drawn tokens cross to the host, once, at the end. */
#include "backend/cuda/cuda_internal.h"

/* emb[0..r) = table[*id] as fp32. */
__global__ void gather_row_kernel(float *emb, const void *table, int dtype, int64_t ts, int r, const int32_t *id) {
    ds_cu_grid_wait();
    const int64_t row = (int64_t)*id * ts;
    for (int i = threadIdx.x; i < r; i += blockDim.x) emb[i] = ds_cu_load(table, dtype, row + i);
}

/* The corrected logit of column n: base + bias, or round(base + round(bias))
 * in bf16 mode (as the reference computes it). */
__device__ __forceinline__ float step_logit(const float *base, float bias, int64_t n, int bf16) {
    return bf16 ? ds_cu_rbf16(base[n] + ds_cu_rbf16(bias)) : base[n] + bias;
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
 * (prev = idx[0], written by the step before), each warp computes whole
 * rows of bias = w2 e with fp32 products (lane l takes elements 8l..8l+7
 * of every 256, in order, then a fixed butterfly; 8 rows in flight), adds
 * the base logits, writes the corrected row and keeps the best (value,
 * column); the last block to finish merges the blocks' bests into idx[1].
 * The argmax rule is the CPU scan's (ties to the lowest column, starting
 * from column 0, so a NaN never wins), which makes the merge order
 * irrelevant. */
#define STEP_WARPS 8
#define STEP_ROWS 16 /* rows per warp (at most 32: the pruned path gives a lane each) */
#define STEP_BATCH 8 /* rows per warp in flight */
#define STEP_SPARSE 4 /* at most this many candidate rows per warp: one at a time */

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

/* bias[q] = w2[n0 + q] . e for B rows at once (rows past V give 0): every
 * lane's loads of the B rows are issued before any product, so a warp has
 * B 16-byte loads in flight. */
template <int DT, int B>
__device__ __forceinline__ void step_rows(const void *w2, int64_t w2s, int r, const float *e, int lane, int64_t n0,
                                          int64_t V, float bias[B]) {
#pragma unroll
    for (int q = 0; q < B; q++) bias[q] = 0.0f;
    for (int k = 8 * lane; k < r; k += 256) {
        float f[B][8];
#pragma unroll
        for (int q = 0; q < B; q++) {
            if (n0 + q < V) {
                ds_cu_load8<DT>(w2, (n0 + q) * w2s + k, f[q]);
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

/* Pruning (when the logits themselves are not wanted): with bound[n] >=
 * |w1[m] . w2[n]| for every m (|w2[n]| max_m |w1[m]|, from the drafter),
 * inflated by 2^-10 to cover fp32 rounding in the products and the norms,
 * out[k][n] lies in [lo, hi] = [f(base[k][n], -B_n), f(base[k][n], B_n)]
 * whatever token came before (f is monotone in both arguments, bf16
 * rounding included). L_k = max_n lo is reached by some row, so a row with
 * hi < L_k can neither win nor tie: step k computes only the others. The
 * result is the full walk's, bit for bit. The bounds do not depend on the
 * walk, so one launch finds L_k for every position up front; a NaN or
 * infinity in a row's bounds turns pruning off for that step. How much it
 * saves depends on the weights: with random ones a handful of rows per
 * step survive, with the trained pico drafter ~70 % do (its bias is large
 * next to the logits' spread), so a warp with many survivors computes all
 * its rows in batches, as the unpruned walk does. */
#define BOUND_THREADS 256
#define BOUND_MARGIN (1.0f + 1.0f / 1024.0f)

/* lim[k] = L_k (NaN: do not prune) for row k = blockIdx.y of base. */
__global__ void __launch_bounds__(BOUND_THREADS)
    markov_bound_kernel(const float *__restrict__ base, int64_t bs, const float *__restrict__ bound, int64_t V,
                        int bf16, float *part, unsigned *tickets, float *lim) {
    ds_cu_grid_wait();
    __shared__ float wl[BOUND_THREADS / 32];
    __shared__ int wbad[BOUND_THREADS / 32];
    __shared__ bool last;
    const int k = blockIdx.y;
    const float *row = base + (int64_t)k * bs;
    const int64_t n = (int64_t)blockIdx.x * BOUND_THREADS + threadIdx.x;
    float lo = -INFINITY;
    int bad = 0;
    if (n < V) {
        const float b = bound[n] * BOUND_MARGIN;
        lo = step_logit(row, -b, n, bf16);
        bad = !isfinite(lo) || !isfinite(step_logit(row, b, n, bf16));
    }
    float *kpart = part + (int64_t)k * gridDim.x;
    /* Block max (and any bad row), then the last block of row k merges the blocks'. */
    for (int round = 0; round < 2; round++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            lo = fmaxf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
            bad |= __shfl_xor_sync(0xffffffffu, bad, off);
        }
        if ((threadIdx.x & 31) == 0) {
            wl[threadIdx.x >> 5] = lo;
            wbad[threadIdx.x >> 5] = bad;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < BOUND_THREADS / 32; w++) {
                lo = fmaxf(lo, wl[w]);
                bad |= wbad[w];
            }
            if (round == 0) {
                kpart[blockIdx.x] = bad ? NAN : lo;
                __threadfence();
                last = atomicAdd(tickets + k, 1u) == gridDim.x - 1;
            } else {
                lim[k] = bad ? NAN : lo;
                tickets[k] = 0; /* ready for the next walk */
            }
        }
        __syncthreads();
        if (round == 1 || !last) return;
        __threadfence();
        lo = -INFINITY;
        bad = 0;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += BOUND_THREADS) {
            const float v = __ldcg(kpart + b);
            bad |= v != v;
            lo = fmaxf(lo, v);
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(STEP_WARPS * 32)
    markov_step_kernel(const float *__restrict__ base, float *out, const void *w1, int w1dt, int64_t w1s,
                       const void *w2, int64_t w2s, int r, int64_t V, int bf16, int32_t *idx, float *emb,
                       float *pv, int *pi, unsigned *ticket, const float *bound, const float *lim) {
    ds_cu_grid_wait();
    extern __shared__ float e[];
    __shared__ float sv[STEP_WARPS];
    __shared__ int si[STEP_WARPS];
    __shared__ float y0;
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t prev = idx[0];
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        e[i] = ds_cu_load(w1, w1dt, prev * w1s + i);
        if (blockIdx.x == 0) emb[i] = e[i];
    }
    __syncthreads();
    if (warp == 0) {
        float b[1];
        step_rows<DT, 1>(w2, w2s, r, e, lane, 0, V, b);
        if (lane == 0) y0 = step_logit(base, b[0], 0, bf16);
    }
    __syncthreads();
    float bv = y0;
    int bi = 0;
    const int64_t n0 = ((int64_t)blockIdx.x * STEP_WARPS + warp) * STEP_ROWS;
    const float L = lim ? lim[0] : NAN; /* the same for the whole grid */
    unsigned mask = 0;
    if (L == L) {
        const int64_t n = n0 + (lane & (STEP_ROWS - 1));
        const bool cand = lane < STEP_ROWS && n < V && step_logit(base, bound[n] * BOUND_MARGIN, n, bf16) >= L;
        mask = __ballot_sync(0xffffffffu, cand);
    }
    /* Pruned: the warp's rows that can still win, one at a time; when many
     * can (a loose bound, as with trained drafters), all of them in batches:
     * computing a row that cannot win changes nothing. */
    if (L == L && __popc(mask) <= STEP_SPARSE) {
        while (mask) {
            const int q = __ffs(mask) - 1;
            mask &= mask - 1;
            float b[1];
            step_rows<DT, 1>(w2, w2s, r, e, lane, n0 + q, V, b);
            const float y = step_logit(base, b[0], n0 + q, bf16);
            if (step_better(y, (int)(n0 + q), bv, bi)) bv = y, bi = (int)(n0 + q);
        }
    } else {
        for (int j = 0; j < STEP_ROWS; j += STEP_BATCH) {
            if (n0 + j >= V) break;
            float b[STEP_BATCH];
            step_rows<DT, STEP_BATCH>(w2, w2s, r, e, lane, n0 + j, V, b);
#pragma unroll
            for (int q = 0; q < STEP_BATCH; q++) {
                const int64_t n = n0 + j + q;
                if (n >= V) break;
                const float y = step_logit(base, b[q], n, bf16);
                if (lane == 0 && out) out[n] = y;
                if (step_better(y, (int)n, bv, bi)) bv = y, bi = (int)n;
            }
        }
    }
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    /* The last block: every other block's best is visible (fence, then ticket). */
    __threadfence();
    bv = y0;
    bi = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        const float v = __ldcg(pv + b);
        const int c = __ldcg(pi + b);
        if (step_better(v, c, bv, bi)) bv = v, bi = c;
    }
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        idx[1] = bi;
        *ticket = 0; /* ready for the next step's launch */
    }
}

/* Whether the one-launch step applies: w2's rows 16-byte aligned in runs of 8. */
static bool step_fits(ds_tensor w2, ds_tensor emb) {
    const int esz = w2.dtype == DS_F32 ? 4 : 2;
    return (w2.dtype == DS_BF16 || w2.dtype == DS_F32 || w2.dtype == DS_F16) && w2.cols % 8 == 0 &&
           (w2.stride * esz) % 16 == 0 && (uintptr_t)w2.data % 16 == 0 && w2.cols <= 8192 && emb.dtype == DS_F32;
}

void ds_cu_markov_greedy(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor w1, ds_tensor w2, ds_tensor bound,
                         bool bf16, int32_t anchor, ds_tensor emb, int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const int G = (int)base.rows;
    const int64_t V = base.cols;
    if (G <= 0 || V <= 0) return;
    const bool markov = w1.data != NULL, keep = out.data != NULL;
    if ((keep && (out.rows != G || out.cols != V)) ||
        (markov && (w2.rows != V || w2.cols != w1.cols || emb.rows < G || emb.cols != w1.cols)) ||
        (bound.data && (bound.dtype != DS_F32 || bound.rows != 1 || bound.cols != V))) {
        ds_cu_fail(cb, "markov_greedy", "shapes do not match: base %lldx%lld, out %lldx%lld, w1 %lldx%lld, "
                   "w2 %lldx%lld, bias bound %lldx%lld, emb %lldx%lld", (long long)base.rows, (long long)V,
                   (long long)out.rows, (long long)out.cols, (long long)w1.rows, (long long)w1.cols,
                   (long long)w2.rows, (long long)w2.cols, (long long)bound.rows, (long long)bound.cols,
                   (long long)emb.rows, (long long)emb.cols);
        return;
    }
    if (markov && !ds_cu_float_dtype(cb, "markov_greedy", w1.dtype)) return;
    if (G > DS_CU_ROWS) {
        ds_cu_fail(cb, "markov_greedy", "block of %d positions (at most %d)", G, DS_CU_ROWS);
        return;
    }
    /* idx[0] = anchor, idx[1..G] = the drawn tokens, idx[G+1] the step
     * kernel's ticket, then G tickets of the bound kernel (all zero between
     * launches) and the G limits L_k: one upload sets them all. */
    int32_t *idx = ds_cu_indices(cb, "markov_greedy", 3 * G + 2);
    if (!idx) return;
    int32_t init[3 * DS_CU_ROWS + 2] = {anchor};
    if (!ds_cu_ok(cb, "markov_greedy", cudaMemcpyAsync(idx, init, (size_t)(3 * G + 2) * sizeof(int32_t),
                                                       cudaMemcpyHostToDevice, cb->stream)))
        return;
    unsigned *ticket = (unsigned *)(idx + G + 1), *btickets = (unsigned *)(idx + G + 2);
    float *lim = (float *)(idx + 2 * G + 2);
    const int r = (int)w1.cols;
    if (markov && step_fits(w2, emb)) {
        const unsigned blocks = (unsigned)((V + STEP_WARPS * STEP_ROWS - 1) / (STEP_WARPS * STEP_ROWS));
        const unsigned bblocks = (unsigned)((V + BOUND_THREADS - 1) / BOUND_THREADS);
        const bool prune = !keep && bound.data;
        char *part = (char *)ds_cu_scratch(cb, "markov_greedy", (size_t)blocks * (sizeof(float) + sizeof(int)) +
                                                                    (size_t)G * bblocks * sizeof(float));
        if (!part) return;
        float *pv = (float *)part;
        int *pi = (int *)(part + (size_t)blocks * sizeof(float));
        float *bpart = (float *)(part + (size_t)blocks * (sizeof(float) + sizeof(int)));
        const float *bnd = (const float *)bound.data;
        if (prune) {
            ds_cu_launch(markov_bound_kernel, dim3(bblocks, (unsigned)G), BOUND_THREADS, cb->stream,
                         (const float *)base.data, base.stride, bnd, V, (int)bf16, bpart, btickets, lim);
            if (!ds_cu_launched(cb, "markov_greedy")) return;
        }
        for (int k = 0; k < G; k++) {
            float *ek = (float *)ds_rows(emb, k, 1).data, *ok = keep ? (float *)ds_rows(out, k, 1).data : NULL;
            const float *bk = (const float *)ds_rows(base, k, 1).data;
#define STEP(DT_)                                                                                                 \
    ds_cu_launch_smem(markov_step_kernel<DT_>, blocks, STEP_WARPS * 32, (size_t)r * sizeof(float), cb->stream, bk, \
                      ok, w1.data, (int)w1.dtype, w1.stride, w2.data, w2.stride, r, V, (int)bf16, idx + k, ek, pv, \
                      pi, ticket, bnd, prune ? lim + k : (const float *)NULL)
            if (w2.dtype == DS_BF16) STEP(DS_BF16);
            else if (w2.dtype == DS_F16) STEP(DS_F16);
            else STEP(DS_F32);
#undef STEP
            if (!ds_cu_launched(cb, "markov_greedy")) return;
        }
    } else {
        float *bias = markov ? (float *)ds_cu_tmp(cb, "markov_greedy", (size_t)V * sizeof(float)) : NULL;
        float *row = keep ? NULL : (float *)ds_cu_tmp2(cb, "markov_greedy", (size_t)V * sizeof(float));
        if ((markov && !bias) || (!keep && !row)) return;
        for (int k = 0; k < G; k++) {
            const ds_tensor rt = {DS_F32, row, 1, V, V, false};
            const ds_tensor ok = keep ? ds_rows(out, k, 1) : rt;
            if (markov) {
                ds_tensor ek = ds_rows(emb, k, 1);
                ds_cu_launch(gather_row_kernel, 1, 256, cb->stream, (float *)ek.data, w1.data, w1.dtype, w1.stride,
                             r, idx + k);
                if (!ds_cu_launched(cb, "markov_greedy")) return;
                ds_tensor bt = {DS_F32, bias, 1, V, V, false};
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
    if (ds_cu_ok(cb, "markov_greedy",
                 cudaMemcpyAsync(tokens, idx + 1, (size_t)G * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "markov_greedy", cudaStreamSynchronize(cb->stream));
}
