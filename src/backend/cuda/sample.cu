/* Sampling on the GPU (backend.h probs, sample, verify_sample; the Markov
 * walk's per-step draw for markov.cu): spec/sampler.c's and spec/verify.c's
 * rules, one block of SAMPLE_THREADS per row, so that a verification round
 * sends n + 1 uniforms down and brings two ints back instead of n + 1 rows
 * of V logits.
 *
 * Processed distribution (ds_probs_from_logits): max of x/T, e = exp(x/T -
 * max) with the CPU's own exp (ds_v8f_exp's operations, so e is usually the
 * same bits), their sum in double (a fixed tree: deterministic), p =
 * float(e / sum). Top-k and top-p rank by the key (bits of p, then the
 * lower id first), which orders exactly as the CPU's cand_desc (p >= 0, so
 * its bits order as the values): a radix select on the key, 8 bits a pass,
 * instead of a sort. Top-k selects a count; top-p selects by mass (the
 * histogram holds each p as a 62-bit fixed-point integer, summed by integer
 * atomics: deterministic, within 2^-62 per token of the exact sum; the CPU's
 * sequential double sum is within ~1e-16 of it: the kept set can differ
 * only where the rank-order cumulative mass lies within ~1e-13 of
 * top_p * kept mass). Once the tokens still in contention fit in shared
 * memory (SAMPLE_CAND) they are compacted there and the remaining passes
 * stay on chip. Renormalisation divides by the kept mass
 * (a double tree sum).
 *
 * Draw (ds_sample_probs_u): thread t sums its contiguous chunk of the row in
 * id order in double; a sequential prefix over the chunks (within a warp,
 * then over the warps: deterministic and monotone) gives each chunk's start;
 * the chunk whose start is the last one <= u * total (among chunks with
 * mass) is rescanned for the first id whose cumulative exceeds it, as the
 * CPU does. The CPU's sum is one sequential chain: the drawn token can
 * differ only where u * total lies within rounding (~1e-12 relative, a
 * conservative bound for V ~ 152k) of a CDF step. */
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_CAND 4096 /* keys of the tokens in contention held on chip (32 KiB) */
#define SAMPLE_MAX_ROWS 64 /* rows (uniforms, drafts) one launch takes as parameters */

typedef unsigned long long u64;

typedef struct {
    unsigned cnt[256]; /* radix histogram: tokens per digit */
    u64 mass[256];     /* and their fixed-point mass */
    double rd[SAMPLE_WARPS];
    float rf[SAMPLE_WARPS];
    int ri[SAMPLE_WARPS];
    u64 dig_above_m; /* the digit search's answer (see find_digit) */
    unsigned dig_above_c, dig_cnt;
    int digit;
    int ncand;
    int result;
    double total;
    union {
        u64 key[SAMPLE_CAND];          /* the tokens in contention (select) */
        double chunk[SAMPLE_THREADS]; /* each thread's chunk mass, then its start (draw) */
    };
} sample_shared;

/* e^x exactly as ds_v8f_exp (base/vmath.h) computes it in the CPU build
 * (-ffp-contract=fast with FMA: a * b + c is one fma), so that the CPU and
 * GPU distributions are the same bits wherever the compiler contracted
 * the same way; otherwise they differ by an ulp. */
__device__ __forceinline__ float cpu_exp(float x) {
    const bool over = x > 88.7228f, under = x < -104.0f, nan = x != x;
    float xc = over ? 88.7228f : under ? -104.0f : x;
    if (nan) xc = 0.0f;
    float fn = fmaf(xc, 1.44269504088896341f, 12582912.0f);
    const int n = __float_as_int(fn) - __float_as_int(12582912.0f);
    fn = __fsub_rn(fn, 12582912.0f);
    float r = fmaf(-fn, 0.693359375f, xc);
    r = fmaf(-fn, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = __fadd_rn(fmaf(p, __fmul_rn(r, r), r), 1.0f);
    const int n1 = n >> 1, n2 = n - n1;
    float res = __fmul_rn(__fmul_rn(p, __int_as_float((n1 + 127) << 23)), __int_as_float((n2 + 127) << 23));
    if (under) res = 0.0f;
    if (over) res = INFINITY;
    return nan ? x : res;
}

/* Rank key: larger p first, then the lower id. */
__device__ __forceinline__ u64 rank_key(float p, int64_t i) {
    return ((u64)__float_as_uint(p) << 32) | (u64)(0xffffffffu - (unsigned)i);
}
__device__ __forceinline__ float key_p(u64 k) { return __uint_as_float((unsigned)(k >> 32)); }
/* p as a fixed-point integer in units of 2^-62 (p <= 1: the sum of a row fits 63 bits). */
__device__ __forceinline__ u64 fixed(float p) { return __double2ull_rz((double)p * 0x1p62); }

/* Block-wide reductions: every thread gets the result; fixed orders, so
 * the same inputs give the same bits. */
__device__ float block_max(float v, sample_shared &sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0) sh.rf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh.rf[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) v = fmaxf(v, sh.rf[w]);
    __syncthreads();
    return v;
}
__device__ double block_sum(double v, sample_shared &sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) sh.rd[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh.rd[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) v += sh.rd[w];
    __syncthreads();
    return v;
}
__device__ int block_max_int(int v, sample_shared &sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0) sh.ri[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh.ri[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) v = max(v, sh.ri[w]);
    __syncthreads();
    return v;
}

/* The radix step: with the histogram of the current digit built, warp 0
 * finds the digit d (scanning from the highest) at which the count (or
 * mass) above plus the digits >= d first reaches `need`. Writes d (-1: never
 * reached), the count and mass of the digits above d, and d's count. */
template <bool MASS>
__device__ void find_digit(sample_shared &sh, unsigned above_c, u64 above_m, u64 need) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    unsigned c[8];
    u64 m[8], sc = 0, sm = 0;
#pragma unroll
    for (int b = 0; b < 8; b++) { /* lane 0 holds digits 255..248, lane 31 digits 7..0 */
        const int d = 255 - 8 * lane - b;
        c[b] = sh.cnt[d];
        m[b] = sh.mass[d];
        sc += c[b];
        sm += m[b];
    }
    u64 ic = sc, im = sm; /* inclusive scans over the lanes */
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u64 oc = __shfl_up_sync(0xffffffffu, ic, off), om = __shfl_up_sync(0xffffffffu, im, off);
        if (lane >= off) ic += oc, im += om;
    }
    const bool reach = MASS ? above_m + im >= need : (u64)above_c + ic >= need;
    const unsigned ballot = __ballot_sync(0xffffffffu, reach);
    if (ballot == 0) {
        if (lane == 0) sh.digit = -1;
        return;
    }
    if (lane != __ffs(ballot) - 1) return;
    u64 cc = (u64)above_c + ic - sc, cm = above_m + im - sm; /* everything above this lane's digits */
    for (int b = 0; b < 8; b++) {
        if (MASS ? cm + m[b] >= need : cc + c[b] >= need) {
            sh.digit = 255 - 8 * lane - b;
            sh.dig_above_c = (unsigned)cc;
            sh.dig_above_m = cm;
            sh.dig_cnt = c[b];
            return;
        }
        cc += c[b];
        cm += m[b];
    }
}

/* The smallest threshold key T >= lo such that the tokens with key >= T
 * are the first `need` tokens (by count, or reaching `need` by fixed-point
 * mass with MASS) of those with key >= lo, in rank order. Where the need is
 * never reached (mass lost to rounding) every token >= lo is kept. */
template <bool MASS>
__device__ u64 select_top(const float *p, int64_t V, u64 lo, u64 need, sample_shared &sh) {
    /* Digits: the 32 bits of p, then the id bits that vary (ids < 2^idb;
     * the complement's higher bits are ones in every key). */
    int idb = 1;
    while (idb < 32 && ((int64_t)1 << idb) < V) idb++;
    int shifts[8], ns = 0;
    for (int s = 56; s >= 32; s -= 8) shifts[ns++] = s;
    for (int s = (idb + 7) / 8 * 8 - 8; s >= 0; s -= 8) shifts[ns++] = s;
    const u64 ones = idb >= 32 ? 0 : (u64)(0xffffffffu << idb);
    u64 prefix = 0, mask = 0, above_m = 0;
    unsigned above_c = 0;
    bool on_chip = false, id_bits = false;
    for (int si = 0; si < ns; si++) {
        const int s = shifts[si];
        if (s < 32 && !id_bits) { /* into the id bits: the constant ones are part of every prefix */
            prefix |= ones;
            mask |= ones;
            id_bits = true;
        }
        for (int d = threadIdx.x; d < 256; d += blockDim.x) sh.cnt[d] = 0, sh.mass[d] = 0;
        __syncthreads();
        const int n = on_chip ? sh.ncand : 0;
        if (on_chip) {
            for (int j = threadIdx.x; j < n; j += blockDim.x) {
                const u64 k = sh.key[j];
                if ((k & mask) != prefix) continue;
                const int d = (int)(k >> s) & 255;
                atomicAdd(&sh.cnt[d], 1u);
                if (MASS) atomicAdd(&sh.mass[d], fixed(key_p(k)));
            }
        } else {
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
                const u64 k = rank_key(p[i], i);
                if (k < lo || (k & mask) != prefix) continue;
                const int d = (int)(k >> s) & 255;
                atomicAdd(&sh.cnt[d], 1u);
                if (MASS) atomicAdd(&sh.mass[d], fixed(p[i]));
            }
        }
        __syncthreads();
        find_digit<MASS>(sh, above_c, above_m, need);
        __syncthreads();
        const int d = sh.digit;
        if (d < 0) return lo;
        above_m = sh.dig_above_m;
        above_c = sh.dig_above_c;
        const unsigned cd = sh.dig_cnt;
        prefix |= (u64)d << s;
        mask |= (u64)255 << s;
        /* The threshold is the prefix (lower bits zero) once digit d's tokens are all in. */
        if (cd == 1 || (!MASS && (u64)above_c + cd == need)) break;
        if (!on_chip && cd <= SAMPLE_CAND) {
            /* Compact the contenders. Their order is arbitrary (slot atomics)
             * but only integer histograms read them: the result does not depend on it. */
            if (threadIdx.x == 0) sh.ncand = 0;
            __syncthreads();
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
                const u64 k = rank_key(p[i], i);
                if (k >= lo && (k & mask) == prefix) sh.key[atomicAdd(&sh.ncand, 1)] = k;
            }
            __syncthreads();
            on_chip = true;
        }
    }
    return prefix > lo ? prefix : lo;
}

/* Sum over the tokens with key >= lo of p, in double. */
__device__ double kept_mass(const float *p, int64_t V, u64 lo, sample_shared &sh) {
    double m = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        if (rank_key(p[i], i) >= lo) m += p[i];
    return block_sum(m, sh);
}

/* out[V] = ds_probs_from_logits(x[V]) for T > 0 (out may not alias x). */
__device__ void row_probs(const float *x, float *out, int64_t V, float T, int top_k, float top_p, sample_shared &sh) {
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, __fdiv_rn(x[i], T));
    mx = block_max(mx, sh);
    double sum = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        const float e = cpu_exp(__fsub_rn(__fdiv_rn(x[i], T), mx));
        out[i] = e;
        sum += e;
    }
    sum = block_sum(sum, sh);
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) out[i] = __double2float_rn(__ddiv_rn((double)out[i], sum));
    const bool use_k = top_k > 0 && top_k < V, use_p = top_p > 0 && top_p < 1.0f;
    __syncthreads(); /* every p written (and visible to the block) */
    if (!use_k && !use_p) return;
    u64 lo = 0;
    if (use_k) lo = select_top<false>(out, V, 0, (u64)top_k, sh);
    double mass = kept_mass(out, V, lo, sh);
    if (use_p) {
        const double target = (double)top_p * mass;
        u64 need = __double2ull_ru(target * 0x1p62);
        if (need == 0) need = 1; /* at least one token */
        lo = select_top<true>(out, V, lo, need, sh);
        mass = kept_mass(out, V, lo, sh);
    }
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        const float p = out[i];
        out[i] = rank_key(p, i) >= lo ? __double2float_rn(__ddiv_rn((double)p, mass)) : 0.0f;
    }
    __syncthreads();
}

/* Row value for a draw: a[i], or the residual max(0, a[i] - b[i]) (a float
 * difference, as ds_verify's). */
__device__ __forceinline__ float draw_value(const float *a, const float *b, int64_t i) {
    if (!b) return a[i];
    const float r = __fsub_rn(a[i], b[i]);
    return r > 0 ? r : 0.0f;
}

/* ds_sample_probs_u over the row a (or the residual of a and b), for every
 * thread; -2 without drawing when the row's total is <= min_total. */
__device__ int row_draw(const float *a, const float *b, int64_t V, double u, double min_total, sample_shared &sh) {
    const int64_t chunk = (V + blockDim.x - 1) / blockDim.x, c0 = threadIdx.x * chunk;
    const int64_t c1 = c0 + chunk < V ? c0 + chunk : V;
    double s = 0;
    for (int64_t i = c0; i < c1; i++) {
        const float v = draw_value(a, b, i);
        if (v > 0) s += v;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    sh.chunk[threadIdx.x] = s;
    __syncthreads();
    if (lane == 0) { /* chunk starts within the warp, in order */
        double q = 0;
        for (int l = 0; l < 32; l++) {
            const double t = sh.chunk[threadIdx.x + l];
            sh.chunk[threadIdx.x + l] = q;
            q += t;
        }
        sh.rd[warp] = q;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* warp starts, in order; the total */
        double q = 0;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            const double t = sh.rd[w];
            sh.rd[w] = q;
            q += t;
        }
        sh.result = 0;
        sh.total = q;
    }
    __syncthreads();
    const double total = sh.total;
    const double start = sh.rd[warp] + sh.chunk[threadIdx.x];
    __syncthreads();
    if (!(total > min_total)) return -2;
    const double target = u * total;
    /* The chunk holding the step: the last one with mass starting at or below the target. */
    const int t = block_max_int(s > 0 && start <= target ? (int)threadIdx.x : -1, sh);
    if ((int)threadIdx.x == t) {
        const double r = target - start;
        double cum = 0;
        int64_t last = -1, got = -1;
        for (int64_t i = c0; i < c1 && got < 0; i++) {
            const float v = draw_value(a, b, i);
            if (v <= 0) continue;
            cum += v;
            last = i;
            if (r < cum) got = i;
        }
        sh.result = (int)(got >= 0 ? got : last); /* rounding left the target past this chunk's end */
    }
    __syncthreads();
    const int res = sh.result;
    __syncthreads();
    return res;
}

/* Kernel parameters: uniforms and draft tokens travel by value. */
typedef struct {
    double u[SAMPLE_MAX_ROWS + 1];
    int32_t draft[SAMPLE_MAX_ROWS];
} sample_args;

__global__ void __launch_bounds__(SAMPLE_THREADS)
    probs_kernel(const float *x, int64_t xs, float *out, int64_t os, int64_t V, float T, int top_k, float top_p) {
    ds_cu_grid_wait();
    __shared__ sample_shared sh;
    row_probs(x + (int64_t)blockIdx.x * xs, out + (int64_t)blockIdx.x * os, V, T, top_k, top_p, sh);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    draw_kernel(const float *p, int64_t ps, int64_t V, sample_args args, int32_t *out) {
    ds_cu_grid_wait();
    __shared__ sample_shared sh;
    const int t = row_draw(p + (int64_t)blockIdx.x * ps, NULL, V, args.u[blockIdx.x], -1.0, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = t;
}

/* One Markov step's distribution and draw: probs = processed(x), *token = draw(probs, u). */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    probs_draw_kernel(const float *x, float *probs, int64_t V, float T, int top_k, float top_p, double u,
                      int32_t *token) {
    ds_cu_grid_wait();
    __shared__ sample_shared sh;
    row_probs(x, probs, V, T, top_k, top_p, sh);
    const int t = row_draw(probs, NULL, V, u, -1.0, sh);
    if (threadIdx.x == 0) *token = t;
}

/* ds_verify_uniforms on the target distributions pt[n+1][V] (already
 * processed) and the draft distributions pd: out[0] = accepted, out[1] = next. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    accept_kernel(const float *pt, int64_t V, const float *pd, int64_t pds, int n, sample_args args, int32_t *out) {
    ds_cu_grid_wait();
    __shared__ sample_shared sh;
    if (threadIdx.x == 0) {
        int a = 0;
        for (; a < n; a++) {
            const int32_t x = args.draft[a];
            const double q = pd[(int64_t)a * pds + x];
            const double ratio = (double)pt[(int64_t)a * V + x] / (q > 1e-8 ? q : 1e-8);
            if (!(args.u[a] < ratio)) break;
        }
        sh.result = a;
    }
    __syncthreads();
    const int a = sh.result;
    __syncthreads();
    const float *row = pt + (int64_t)a * V;
    int next = -2;
    if (a < n) next = row_draw(row, pd + (int64_t)a * pds, V, args.u[n], 1e-8, sh); /* the residual */
    if (next == -2) next = row_draw(row, NULL, V, args.u[n], -1.0, sh);          /* p_t: the bonus, or no residual mass */
    if (threadIdx.x == 0) {
        out[0] = a;
        out[1] = next;
    }
}

static bool sampling_ok(ds_cuda_backend *cb, const char *op, const ds_sampling *s, int64_t V) {
    if (ds_sampling_greedy(s)) {
        ds_cu_fail(cb, op, "temperature %g is greedy (argmax / markov_greedy decide those)", (double)s->temperature);
        return false;
    }
    if (V < 1 || V > INT32_MAX) {
        ds_cu_fail(cb, op, "rows of %lld tokens", (long long)V);
        return false;
    }
    return true;
}

bool ds_cu_probs_draw_dev(ds_cuda_backend *cb, const char *op, const float *x, float *probs, int64_t V,
                          const ds_sampling *s, double u, int32_t *d_token) {
    if (!sampling_ok(cb, op, s, V)) return false;
    ds_cu_launch(probs_draw_kernel, 1, SAMPLE_THREADS, cb->stream, x, probs, V, s->temperature, s->top_k, s->top_p, u,
                 d_token);
    return ds_cu_launched(cb, op);
}

void ds_cu_probs(ds_backend *be, ds_tensor out, ds_tensor logits, const ds_sampling *s) {
    ds_cuda_backend *cb = ds_cu(be);
    if (out.rows != logits.rows || out.cols != logits.cols) {
        ds_cu_fail(cb, "probs", "out %lldx%lld for logits %lldx%lld", (long long)out.rows, (long long)out.cols,
                   (long long)logits.rows, (long long)logits.cols);
        return;
    }
    if (!sampling_ok(cb, "probs", s, logits.cols) || logits.rows <= 0) return;
    for (int64_t r0 = 0; r0 < logits.rows; r0 += 65535) {
        const int64_t m = logits.rows - r0 < 65535 ? logits.rows - r0 : 65535;
        ds_cu_launch(probs_kernel, (unsigned)m, SAMPLE_THREADS, cb->stream, (const float *)ds_rows(logits, r0, 1).data,
                     logits.stride, (float *)ds_rows(out, r0, 1).data, out.stride, logits.cols, s->temperature,
                     s->top_k, s->top_p);
        if (!ds_cu_launched(cb, "probs")) return;
    }
}

void ds_cu_sample(ds_backend *be, ds_tensor probs, const double *u, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (probs.rows <= 0) return;
    if (probs.cols < 1 || probs.cols > INT32_MAX) {
        ds_cu_fail(cb, "sample", "rows of %lld tokens", (long long)probs.cols);
        return;
    }
    int32_t *d = ds_cu_indices(cb, "sample", (int)probs.rows);
    if (!d) return;
    for (int64_t r0 = 0; r0 < probs.rows; r0 += SAMPLE_MAX_ROWS) {
        const int64_t m = probs.rows - r0 < SAMPLE_MAX_ROWS ? probs.rows - r0 : SAMPLE_MAX_ROWS;
        sample_args args;
        memset(&args, 0, sizeof args);
        for (int64_t r = 0; r < m; r++) args.u[r] = u[r0 + r];
        ds_cu_launch(draw_kernel, (unsigned)m, SAMPLE_THREADS, cb->stream, (const float *)ds_rows(probs, r0, 1).data,
                     probs.stride, probs.cols, args, d + r0);
        if (!ds_cu_launched(cb, "sample")) return;
    }
    if (ds_cu_ok(cb, "sample",
                 cudaMemcpyAsync(out, d, (size_t)probs.rows * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "sample", cudaStreamSynchronize(cb->stream));
}

void ds_cu_verify_sample(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                         const ds_sampling *s, const double *u, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    out[0] = 0;
    out[1] = 0;
    const int64_t V = logits.cols;
    if (!sampling_ok(cb, "verify_sample", s, V)) return;
    if (n < 0 || n > SAMPLE_MAX_ROWS || logits.rows < n + 1 ||
        (n > 0 && (draft_probs.rows < n || draft_probs.cols != V || draft_probs.dtype != DS_F32))) {
        ds_cu_fail(cb, "verify_sample", "%d drafts (at most %d) for logits %lldx%lld and draft probs %lldx%lld", n,
                   SAMPLE_MAX_ROWS, (long long)logits.rows, (long long)V, (long long)draft_probs.rows,
                   (long long)draft_probs.cols);
        return;
    }
    for (int i = 0; i < n; i++)
        if (draft[i] < 0 || draft[i] >= V) {
            ds_cu_fail(cb, "verify_sample", "draft token %d at %d is outside the vocabulary", draft[i], i);
            return;
        }
    /* The n + 1 target distributions, one block each, then the decision. */
    float *pt = (float *)ds_cu_scratch(cb, "verify_sample", (size_t)(n + 1) * (size_t)V * sizeof(float));
    int32_t *d = ds_cu_indices(cb, "verify_sample", 2);
    if (!pt || !d) return;
    ds_cu_launch(probs_kernel, (unsigned)(n + 1), SAMPLE_THREADS, cb->stream, (const float *)logits.data,
                 logits.stride, pt, V, V, s->temperature, s->top_k, s->top_p);
    if (!ds_cu_launched(cb, "verify_sample")) return;
    sample_args args;
    memset(&args, 0, sizeof args);
    for (int i = 0; i <= n; i++) args.u[i] = u[i];
    for (int i = 0; i < n; i++) args.draft[i] = draft[i];
    ds_cu_launch(accept_kernel, 1, SAMPLE_THREADS, cb->stream, (const float *)pt, V,
                 n > 0 ? (const float *)draft_probs.data : (const float *)NULL, n > 0 ? draft_probs.stride : 0, n,
                 args, d);
    if (!ds_cu_launched(cb, "verify_sample")) return;
    int32_t got[2];
    if (ds_cu_ok(cb, "verify_sample", cudaMemcpyAsync(got, d, sizeof got, cudaMemcpyDeviceToHost, cb->stream)) &&
        ds_cu_ok(cb, "verify_sample", cudaStreamSynchronize(cb->stream))) {
        out[0] = got[0];
        out[1] = got[1];
    }
}
