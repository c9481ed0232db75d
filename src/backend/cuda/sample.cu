/* Sampling on the GPU (backend.h probs, sample, verify_sample; the Markov
 * walk's per-step draw for markov.cu): src/sample/'s (probs, top_kp, draw, verify)
 * rules, so that a verification round sends n + 1 uniforms down and brings
 * two ints back instead of n + 1 rows of V logits.
 *
 * Two implementations. Rows of up to DIST_MAX_V tokens with top_k <=
 * SAMPLE_CAND (or none) are spread over many blocks each ("One
 * distribution spread over many blocks" below: ds_cu_dist_fast). The rest
 * use one block of SAMPLE_THREADS per row, as follows.
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
 * the same inputs give the same bits. op(a, b): the running value first. */
template <int WARPS, typename T, typename Op> __device__ T warps_reduce(T v, T *r, Op op) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = v;
    __syncthreads();
    v = r[0];
    for (int w = 1; w < WARPS; w++) v = op(v, r[w]);
    __syncthreads();
    return v;
}
struct max_f32 {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct sum_f64 {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct max_i32 {
    __device__ int operator()(int a, int b) const { return max(a, b); }
};
template <int WARPS> __device__ float warps_max(float v, float *rf) { return warps_reduce<WARPS>(v, rf, max_f32{}); }
template <int WARPS> __device__ double warps_sum(double v, double *rd) { return warps_reduce<WARPS>(v, rd, sum_f64{}); }
template <int WARPS> __device__ int warps_max_int(int v, int *ri) { return warps_reduce<WARPS>(v, ri, max_i32{}); }
__device__ float block_max(float v, sample_shared &sh) { return warps_max<SAMPLE_WARPS>(v, sh.rf); }
__device__ double block_sum(double v, sample_shared &sh) { return warps_sum<SAMPLE_WARPS>(v, sh.rd); }
__device__ int block_max_int(int v, sample_shared &sh) { return warps_max_int<SAMPLE_WARPS>(v, sh.ri); }

/* The radix step: with the histogram of the current digit built, warp 0
 * finds the digit d (scanning from the highest) at which the count (or
 * mass) above plus the digits >= d first reaches `need`. Writes d (-1: never
 * reached), the count and mass of the digits above d, and d's count. */
template <bool MASS, class SH>
__device__ void find_digit(SH &sh, unsigned above_c, u64 above_m, u64 need) {
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

/* ---- One distribution spread over many blocks ------------------------------
 *
 * The block-per-row kernels above make ~10 passes over a 600 KB row with
 * one SM each (~10 us a pass). Here every row is cut into slices of
 * DIST_CHUNK tokens, one block of DIST_THREADS each (149 blocks a row at
 * V = 151936), grid (slices, rows), and each stage is one launch whose
 * last block (per row: a ticket, as markov.cu's step_end) merges the
 * blocks' partials in slice order and leaves the row's state for the next
 * launch. No block ever waits for another (no co-residency assumption, no
 * cooperative launch); the launches chain by programmatic dependent launch.
 *
 *   max   (or markov.cu's step kernel, which writes the row): mx = max x/T
 *   sum   sum of e = exp(x/T - mx): per block a fixed tree (4 elements a
 *         thread in order, warp butterfly, warps in order), blocks in
 *         order: deterministic. The old kernel's order differed from the
 *         host's sequential sum too; both are within ~1e-16 relative of it,
 *         so p = float(e / sum) is the host's p except where e / sum lies
 *         within that of a float rounding boundary (an ulp: the tests'
 *         SAMPLE_PROB_TOL).
 *   norm  p = float(e / sum) written; without top-k, the draw (below) in
 *         the same launch; with top-k, the first radix pass.
 *   hist  (top-k) radix passes on the rank key (bits of p, then the lower
 *         id first: cand_desc's order), 8 bits each: per-block histograms
 *         (warp-aggregated shared atomics) added into the row's histogram
 *         by integer atomics (order-free: deterministic); the last block
 *         picks the digit. Passes stop (the launches that remain exit at
 *         once) when the tokens ranked at or above the contenders fit on
 *         chip (at most max(1024, top_k)).
 *   finish (top-k) those tokens are compacted (slot atomics: arbitrary
 *         order) and the last block sorts them by key (bitonic, shared
 *         memory): from here the rule is the host's own, in the host's
 *         order: the first top_k in rank order, their mass, top-p by the
 *         cumulative mass in rank order (cum >= top_p * kept, as
 *         sample/top_kp.c: no fixed-point approximation), and the draw, over
 *         the kept tokens sorted by id, one sequential sum (the zeros the
 *         host also adds change nothing): the host's ds_sample_probs_u on
 *         the same values. Only the kept mass of top-k is summed in rank
 *         order where the host sums it in its quickselect order (rounding).
 *   apply (top-k) out = key >= the last kept key ? float(p / mass) : 0.
 *
 * Top-p alone (DIST_TOPP) keeps the block-per-row kernels' rule (see the
 * top of the file: p as 62-bit fixed point, integer sums): norm also sums
 * the row's mass (slices in order) and sets need = top_p * mass in fixed
 * point; the radix passes histogram count and fixed-point mass (integer
 * atomics: deterministic) and stop once the digit's contenders fit
 * (DIST_FIT) or the threshold is decided; finish_p walks the sorted
 * contenders from the mass above them to need; kept_mass sums the kept p
 * (slices in order) and apply divides and draws (as above).
 *
 * The draw without truncation (and verify's residual draw): slice masses
 * (positive values, a block tree), the slices' starts in order by one
 * thread, the last slice with mass starting at or below u * total; in it
 * each thread's 4 contiguous tokens' mass, their starts in order, the last
 * such run at or below the target, scanned token by token as the host
 * does (first cumulative above the target; the last positive token where
 * rounding left the target past the run). Against the host's one
 * sequential chain the drawn token can differ only where u * total lies
 * within rounding of a CDF step (the tests' DRAW_EPS).
 *
 * top_k > SAMPLE_CAND or V > DIST_MAX_V keep the block-per-row kernels
 * above (ds_cu_dist_fast). */
#define DIST_THREADS 256
#define DIST_WARPS (DIST_THREADS / 32)
#define DIST_PER 4 /* tokens a thread of a slice: i = slice start + t + DIST_THREADS * j */
#define DIST_CHUNK (DIST_THREADS * DIST_PER)
#define DIST_MAX_BLOCKS 1024 /* slices of a row: V <= 1M */
#define DIST_MAX_V ((int64_t)DIST_MAX_BLOCKS * DIST_CHUNK)
#define DIST_FIT 1024 /* contenders the finish sorts, unless top_k needs more (then SAMPLE_CAND) */

/* A row's state between launches (zeroed before the first: ds_cu_dist_reset). */
typedef struct {
    unsigned ticket; /* blocks of the launch done with this row; the last re-arms it */
    int fit;         /* 1: the passes stop (top-k: the tokens with key >= prefix fit on chip; top-p: the
                      * contenders do); 2 (top-p): the threshold thr is decided */
    int si;          /* the radix pass next (dist_shift) */
    int ncand;       /* tokens compacted by finish */
    unsigned above_c;
    float mx;        /* max of x / T */
    double sum;      /* sum of exp(x / T - mx) */
    u64 prefix, mask;
    u64 thr;         /* the last kept key */
    double mass;     /* what the kept tokens are divided by */
    u64 above_m;     /* top-p: the fixed-point mass ranked above the contenders */
    u64 need;        /* top-p: fixed-point top_p * total, the mass the kept tokens must reach */
    unsigned hist[256];
    u64 hmass[256];  /* top-p: the digits' fixed-point mass */
} dist_row;

/* The workspace of `rows` rows of nb slices (carved from one device buffer). */
typedef struct {
    dist_row *st;
    float *pmax;   /* [rows][nb] */
    double *psum;  /* [rows][nb] */
    double *pdraw; /* [rows][2 nb]: slice masses of the row drawn from (verify: the residual, then the plain row) */
    u64 *cand;     /* [rows][SAMPLE_CAND] */
    int nb;
} dist_ws;

typedef struct {
    unsigned cnt[256];
    u64 mass[256]; /* find_digit reads it: zeros (counts only here) */
    u64 dig_above_m;
    unsigned dig_above_c, dig_cnt;
    int digit;
    double rd[DIST_WARPS];
    float rf[DIST_WARPS];
    int ri[DIST_WARPS];
    int result;
    double total;
    bool last;
    double start[DIST_MAX_BLOCKS]; /* slice starts (the draw) */
    double tpart[DIST_THREADS];    /* each thread's run mass, then its start */
} dist_shared; /* ~13 KiB: eight blocks of DIST_THREADS an SM */

__device__ float dist_block_max(float v, dist_shared &sh) { return warps_max<DIST_WARPS>(v, sh.rf); }
__device__ double dist_block_sum(double v, dist_shared &sh) { return warps_sum<DIST_WARPS>(v, sh.rd); }
__device__ int dist_block_max_int(int v, dist_shared &sh) { return warps_max_int<DIST_WARPS>(v, sh.ri); }

/* Whether this block is the last of its row in this launch (every thread
 * gets the answer). Each thread's global writes and atomics are fenced
 * before the ticket, and the last block fences after it (acquire), so it
 * sees every other block's partials (read them with __ldcg: L2). */
__device__ bool dist_last(dist_row *st, dist_shared &sh) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sh.last = atomicAdd(&st->ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    const bool last = sh.last;
    if (last) __threadfence();
    return last;
}

/* Radix pass si's shift (-1: none left) and the constant ones of the id
 * complement's high bits, as select_top lays the digits out. */
__device__ __host__ inline int dist_id_bits(int64_t V) {
    int idb = 1;
    while (idb < 32 && ((int64_t)1 << idb) < V) idb++;
    return idb;
}
__device__ int dist_shift(int si, int64_t V, u64 *ones) {
    const int idb = dist_id_bits(V);
    *ones = idb >= 32 ? 0 : (u64)(0xffffffffu << idb);
    if (si < 4) return 56 - 8 * si;
    const int s = (idb + 7) / 8 * 8 - 8 - 8 * (si - 4);
    return s >= 0 ? s : -1;
}
static int dist_passes(int64_t V) { return 4 + (dist_id_bits(V) + 7) / 8; }

/* Adds digit d (256: none) of this thread's token to the block's
 * histogram, one shared atomic per distinct digit in the warp (the first
 * passes put most of a row in a few digits). Every lane must call it. */
__device__ __forceinline__ void dist_hist_add(unsigned *cnt, int d) {
    const unsigned grp = __match_any_sync(0xffffffffu, d);
    if (d < 256 && (int)(threadIdx.x & 31) == __ffs(grp) - 1) atomicAdd(&cnt[d], (unsigned)__popc(grp));
}

/* The last block of a radix pass (shift s): the row's histogram to the
 * next digit, the state for the next launch. Counts (top-k: the first
 * top_k) or fixed-point mass (MASS, top-p alone: the first tokens whose
 * mass reaches st->need, as select_top<true>). */
template <bool MASS>
__device__ void dist_select_step(dist_row *st, int top_k, int s, u64 ones, dist_shared &sh) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
        sh.cnt[d] = __ldcg(&st->hist[d]);
        sh.mass[d] = MASS ? __ldcg(&st->hmass[d]) : 0;
        st->hist[d] = 0; /* ready for the next pass */
        if (MASS) st->hmass[d] = 0;
    }
    __syncthreads();
    find_digit<MASS>(sh, st->above_c, MASS ? st->above_m : 0, MASS ? st->need : (u64)top_k);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int d = sh.digit;
        const unsigned cap = top_k > DIST_FIT ? SAMPLE_CAND : DIST_FIT;
        if (d < 0) {
            /* top-k: fewer than top_k contenders, cannot happen (they always hold the k-th). top-p: only
             * at the first pass, the whole row's fixed-point mass short of need by rounding: every
             * token is kept (as select_top<true>). */
            st->fit = MASS ? 2 : 1;
            st->thr = 0;
        } else {
            u64 prefix = st->prefix, mask = st->mask;
            if (s < 32) prefix |= ones, mask |= ones;
            prefix |= (u64)d << s;
            st->prefix = prefix;
            st->mask = mask | (u64)255 << s;
            st->above_c = sh.dig_above_c;
            if (MASS) {
                st->above_m = sh.dig_above_m;
                if (sh.dig_cnt <= 1) { /* the digit's one token completes the mass: kept = keys >= prefix */
                    st->fit = 2;
                    st->thr = prefix;
                } else if (sh.dig_cnt <= DIST_FIT) {
                    st->fit = 1;
                }
            } else if ((u64)sh.dig_above_c + sh.dig_cnt <= cap || sh.dig_cnt <= 1) {
                st->fit = 1; /* keys >= prefix: the tokens above the digit and the digit's own */
            }
        }
        st->si++;
        st->ticket = 0;
    }
}

/* Sorts k[0..N) descending, N a power of two (bitonic; the block's threads). */
__device__ void dist_sort_desc(u64 *k, int N) {
    for (int size = 2; size <= N; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < N; i += blockDim.x) {
                const int l = i ^ stride;
                if (l > i) {
                    const u64 a = k[i], b = k[l];
                    if ((i & size) == 0 ? a < b : a > b) k[i] = b, k[l] = a;
                }
            }
            __syncthreads();
        }
}

/* Row value for the spread draw: draw_value through L2 (the last block
 * reads slices other blocks of the same launch may have written). */
__device__ __forceinline__ float dist_value(const float *a, const float *b, int64_t i) {
    if (!b) return __ldcg(a + i);
    const float r = __fsub_rn(__ldcg(a + i), __ldcg(b + i));
    return r > 0 ? r : 0.0f;
}

/* The last block's draw from row a (or the residual of a and b) with the
 * slice masses part[0..nb): the token, or -2 without drawing when the
 * total is <= min_total. Every thread gets the answer. */
__device__ int dist_draw(const float *a, const float *b, int64_t V, const double *part, int nb, double u,
                         double min_total, dist_shared &sh) {
    if (threadIdx.x == 0) {
        double q = 0;
        for (int c = 0; c < nb; c++) {
            const double t = __ldcg(part + c);
            sh.start[c] = q;
            q += t;
        }
        sh.total = q;
    }
    __syncthreads();
    const double total = sh.total;
    if (!(total > min_total)) {
        __syncthreads();
        return -2;
    }
    const double target = u * total;
    int c = -1;
    for (int j = threadIdx.x; j < nb; j += blockDim.x)
        if (__ldcg(part + j) > 0 && sh.start[j] <= target) c = j; /* increasing j: the last */
    c = dist_block_max_int(c, sh);
    if (c < 0) return 0; /* no mass at all: the host's answer */
    const int64_t r0 = (int64_t)c * DIST_CHUNK + DIST_PER * threadIdx.x;
    double s = 0;
    for (int j = 0; j < DIST_PER; j++) {
        if (r0 + j >= V) break;
        const float v = dist_value(a, b, r0 + j);
        if (v > 0) s += v;
    }
    sh.tpart[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double q = sh.start[c];
        for (int t = 0; t < DIST_THREADS; t++) {
            const double m = sh.tpart[t];
            sh.tpart[t] = q;
            q += m;
        }
        sh.result = c * DIST_CHUNK; /* (replaced below: the slice has mass) */
    }
    __syncthreads();
    const double start = sh.tpart[threadIdx.x];
    const int t = dist_block_max_int(s > 0 && start <= target ? (int)threadIdx.x : -1, sh);
    if ((int)threadIdx.x == t) {
        double cum = start;
        int64_t last = -1, got = -1;
        for (int j = 0; j < DIST_PER && r0 + j < V && got < 0; j++) {
            const float v = dist_value(a, b, r0 + j);
            if (v <= 0) continue;
            cum += v;
            last = r0 + j;
            if (target < cum) got = r0 + j;
        }
        sh.result = (int)(got >= 0 ? got : last); /* rounding left the target past this run */
    }
    __syncthreads();
    const int res = sh.result;
    __syncthreads();
    return res;
}

/* This block's slice mass of row a (or the residual of a and b): positive values, a fixed tree. */
__device__ double dist_slice_mass(const float *a, const float *b, int64_t V, dist_shared &sh) {
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    double s = 0;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i < V) {
            const float v = dist_value(a, b, i);
            if (v > 0) s += v;
        }
    }
    return dist_block_sum(s, sh);
}

__global__ void __launch_bounds__(DIST_THREADS) dist_max_kernel(const float *x, int64_t xs, int64_t V, float T, dist_ws ws) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    const float *xr = x + (int64_t)row * xs;
    dist_row *st = ws.st + row;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i < V) m = fmaxf(m, __fdiv_rn(xr[i], T));
    }
    m = dist_block_max(m, sh);
    if (threadIdx.x == 0) ws.pmax[(int64_t)row * ws.nb + blockIdx.x] = m;
    if (!dist_last(st, sh)) return;
    m = -INFINITY;
    for (int c = threadIdx.x; c < (int)gridDim.x; c += blockDim.x) m = fmaxf(m, __ldcg(ws.pmax + (int64_t)row * ws.nb + c));
    m = dist_block_max(m, sh); /* a max: the order is irrelevant */
    if (threadIdx.x == 0) {
        st->mx = m;
        st->ticket = 0;
    }
}

__global__ void __launch_bounds__(DIST_THREADS) dist_sum_kernel(const float *x, int64_t xs, int64_t V, float T, dist_ws ws) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    const float *xr = x + (int64_t)row * xs;
    dist_row *st = ws.st + row;
    const float mx = st->mx;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    double s = 0;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i < V) s += cpu_exp(__fsub_rn(__fdiv_rn(xr[i], T), mx));
    }
    s = dist_block_sum(s, sh);
    if (threadIdx.x == 0) ws.psum[(int64_t)row * ws.nb + blockIdx.x] = s;
    if (!dist_last(st, sh)) return;
    if (threadIdx.x == 0) { /* the slices in order */
        double q = 0;
        for (int c = 0; c < (int)gridDim.x; c++) q += __ldcg(ws.psum + (int64_t)row * ws.nb + c);
        st->sum = q;
        /* the radix select starts here (norm's pass is the first) */
        st->fit = 0;
        st->si = 0;
        st->ncand = 0;
        st->above_c = 0;
        st->above_m = 0;
        st->prefix = 0;
        st->mask = 0;
    }
    for (int d = threadIdx.x; d < 256; d += blockDim.x) st->hist[d] = 0, st->hmass[d] = 0;
    if (threadIdx.x == 0) st->ticket = 0;
}

/* Truncation modes of the spread distribution. */
#define DIST_PLAIN 0 /* none */
#define DIST_TOPK 1  /* top-k (then top-p on the kept) */
#define DIST_TOPP 2  /* top-p alone */

/* p = float(e / sum) into out; with truncation the first radix pass (top-p
 * alone: also the total mass, hence need); without, given tok, the draw
 * with u[row] into tok[row]. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_norm_kernel(const float *x, int64_t xs, float *out, int64_t os, int64_t V, float T, int mode, int top_k,
                     float top_p, dist_ws ws, sample_args args, int32_t *tok) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    const float *xr = x + (int64_t)row * xs;
    float *pr = out + (int64_t)row * os;
    dist_row *st = ws.st + row;
    const float mx = st->mx;
    const double sum = st->sum;
    if (mode != DIST_PLAIN)
        for (int d = threadIdx.x; d < 256; d += blockDim.x) sh.cnt[d] = 0, sh.mass[d] = 0;
    __syncthreads();
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    double s = 0;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        float p = 0.0f;
        if (i < V) {
            const float e = cpu_exp(__fsub_rn(__fdiv_rn(xr[i], T), mx));
            p = __double2float_rn(__ddiv_rn((double)e, sum));
            pr[i] = p;
            if (p > 0) s += p;
        }
        if (mode != DIST_PLAIN) {
            const int d = i < V ? (int)(rank_key(p, i) >> 56) : 256;
            dist_hist_add(sh.cnt, d);
            if (mode == DIST_TOPP && d < 256) atomicAdd(&sh.mass[d], fixed(p));
        }
    }
    if (mode == DIST_TOPK) {
        __syncthreads();
        for (int d = threadIdx.x; d < 256; d += blockDim.x)
            if (sh.cnt[d]) atomicAdd(&st->hist[d], sh.cnt[d]);
        if (!dist_last(st, sh)) return;
        u64 ones;
        dist_select_step<false>(st, top_k, dist_shift(0, V, &ones), ones, sh);
        return;
    }
    if (mode == DIST_TOPP) {
        __syncthreads();
        for (int d = threadIdx.x; d < 256; d += blockDim.x) {
            if (sh.cnt[d]) atomicAdd(&st->hist[d], sh.cnt[d]);
            if (sh.mass[d]) atomicAdd(&st->hmass[d], sh.mass[d]);
        }
        s = dist_block_sum(s, sh);
        double *part = ws.pdraw + (int64_t)row * 2 * ws.nb + ws.nb;
        if (threadIdx.x == 0) part[blockIdx.x] = s;
        if (!dist_last(st, sh)) return;
        if (threadIdx.x == 0) { /* the kept mass before top-p: the whole row (slices in order) */
            double total = 0;
            for (int c = 0; c < (int)gridDim.x; c++) total += __ldcg(part + c);
            const u64 need = __double2ull_ru((double)top_p * total * 0x1p62);
            st->need = need ? need : 1; /* at least one token */
        }
        __syncthreads();
        u64 ones;
        dist_select_step<true>(st, 0, dist_shift(0, V, &ones), ones, sh);
        return;
    }
    if (!tok) return;
    s = dist_block_sum(s, sh);
    double *part = ws.pdraw + (int64_t)row * 2 * ws.nb;
    if (threadIdx.x == 0) part[blockIdx.x] = s;
    if (!dist_last(st, sh)) return;
    /* (pr's other slices were written by other blocks: dist_draw reads through L2) */
    const int t = dist_draw(pr, NULL, V, part, ws.nb, args.u[row], -1.0, sh);
    if (threadIdx.x == 0) {
        tok[row] = t;
        st->ticket = 0;
    }
}

/* One radix pass (mode DIST_TOPK or DIST_TOPP) on the rows' p; nothing once they fit. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_hist_kernel(const float *out, int64_t os, int64_t V, int mode, int top_k, dist_ws ws) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    dist_row *st = ws.st + row;
    if (st->fit) return; /* the same for every block of the row */
    u64 ones;
    const int s = dist_shift(st->si, V, &ones);
    if (s < 0) return;
    u64 prefix = st->prefix, mask = st->mask;
    if (s < 32) prefix |= ones, mask |= ones;
    const float *pr = out + (int64_t)row * os;
    for (int d = threadIdx.x; d < 256; d += blockDim.x) sh.cnt[d] = 0, sh.mass[d] = 0;
    __syncthreads();
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        int d = 256;
        float p = 0.0f;
        if (i < V) {
            p = pr[i];
            const u64 k = rank_key(p, i);
            if ((k & mask) == prefix) d = (int)(k >> s) & 255;
        }
        dist_hist_add(sh.cnt, d);
        if (mode == DIST_TOPP && d < 256) atomicAdd(&sh.mass[d], fixed(p));
    }
    __syncthreads();
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
        if (sh.cnt[d]) atomicAdd(&st->hist[d], sh.cnt[d]);
        if (sh.mass[d]) atomicAdd(&st->hmass[d], sh.mass[d]);
    }
    if (!dist_last(st, sh)) return;
    if (mode == DIST_TOPP) dist_select_step<true>(st, top_k, s, ones, sh);
    else dist_select_step<false>(st, top_k, s, ones, sh);
}

/* Top-k's end (see above): the tokens with key >= prefix compacted, sorted,
 * cut by top_k and top_p as the host does; with tok, the draw. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_finish_kernel(const float *out, int64_t os, int64_t V, int top_k, float top_p, dist_ws ws, sample_args args,
                       int32_t *tok) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    __shared__ u64 key[SAMPLE_CAND]; /* the compacted tokens (32 KiB) */
    const int row = blockIdx.y;
    dist_row *st = ws.st + row;
    const float *pr = out + (int64_t)row * os;
    u64 *cand = ws.cand + (int64_t)row * SAMPLE_CAND;
    const u64 lo = st->prefix;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i >= V) continue;
        const u64 k = rank_key(pr[i], i);
        if (k >= lo) {
            const int slot = atomicAdd(&st->ncand, 1);
            if (slot < SAMPLE_CAND) cand[slot] = k; /* (the passes guarantee it fits) */
        }
    }
    if (!dist_last(st, sh)) return;
    const int n = min(__ldcg(&st->ncand), SAMPLE_CAND);
    int N = 1;
    while (N < n) N <<= 1;
    for (int i = threadIdx.x; i < N; i += blockDim.x) key[i] = i < n ? __ldcg(cand + i) : 0; /* 0: below every token */
    __syncthreads();
    dist_sort_desc(key, N);
    if (threadIdx.x == 0) {
        const int keep = top_k < n ? top_k : n;
        double kept = 0;
        for (int i = 0; i < keep; i++) kept += key_p(key[i]);
        int m = keep;
        double mass = kept;
        if (top_p > 0 && top_p < 1.0f) { /* sample/top_kp.c's loop */
            const double target = (double)top_p * kept;
            double cum = 0;
            m = 0;
            while (m < keep) {
                cum += key_p(key[m]);
                m++;
                if (cum >= target) break;
            }
            mass = cum;
        }
        if (m < 1) m = 1; /* (n >= 1: the row's top token is always a contender) */
        st->thr = key[m - 1];
        st->mass = mass;
        st->ncand = 0;
        st->ticket = 0;
        sh.result = m;
        sh.total = mass;
    }
    __syncthreads();
    if (!tok) return;
    /* The kept tokens' values, ordered by id (the complement's bits lead), for the host's draw. */
    const int m = sh.result;
    const double mass = sh.total;
    int M = 1;
    while (M < m) M <<= 1;
    for (int i = threadIdx.x; i < M; i += blockDim.x) {
        u64 k2 = 0;
        if (i < m) {
            const u64 k = key[i];
            k2 = (k << 32) | __float_as_uint(__double2float_rn(__ddiv_rn((double)key_p(k), mass)));
        }
        key[i] = k2; /* (each thread rewrites only the slots it read) */
    }
    __syncthreads();
    dist_sort_desc(key, M);
    if (threadIdx.x == 0) {
        double total = 0;
        for (int i = 0; i < m; i++) total += __uint_as_float((unsigned)key[i]);
        const double target = args.u[row] * total;
        double cum = 0;
        int last = 0, got = -1;
        for (int i = 0; i < m && got < 0; i++) {
            const float q = __uint_as_float((unsigned)key[i]);
            if (q <= 0) continue;
            const int id = (int)(0xffffffffu - (unsigned)(key[i] >> 32));
            cum += q;
            last = id;
            if (target < cum) got = id;
        }
        tok[row] = got >= 0 ? got : last;
    }
}

/* Top-p alone, once the passes stop: unless the threshold is decided, the
 * contenders (keys matching the digits chosen) are compacted and the last
 * block sorts them and walks them in rank order from the mass above them
 * until the fixed-point mass reaches need (the same integers the
 * histograms summed: the digit search guaranteed it is reached among
 * them): the last kept key. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_finish_p_kernel(const float *out, int64_t os, int64_t V, dist_ws ws) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    __shared__ u64 key[SAMPLE_CAND];
    const int row = blockIdx.y;
    dist_row *st = ws.st + row;
    if (st->fit == 2) return; /* decided by the passes (the same for every block of the row) */
    const float *pr = out + (int64_t)row * os;
    u64 *cand = ws.cand + (int64_t)row * SAMPLE_CAND;
    const u64 prefix = st->prefix, mask = st->mask;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i >= V) continue;
        const u64 k = rank_key(pr[i], i);
        if ((k & mask) == prefix) {
            const int slot = atomicAdd(&st->ncand, 1);
            if (slot < SAMPLE_CAND) cand[slot] = k; /* (at most DIST_FIT: the passes stopped there) */
        }
    }
    if (!dist_last(st, sh)) return;
    const int n = min(__ldcg(&st->ncand), SAMPLE_CAND);
    int N = 1;
    while (N < n) N <<= 1;
    for (int i = threadIdx.x; i < N; i += blockDim.x) key[i] = i < n ? __ldcg(cand + i) : 0;
    __syncthreads();
    dist_sort_desc(key, N);
    if (threadIdx.x == 0) {
        const u64 need = st->need;
        u64 cum = st->above_m, thr = n > 0 ? key[n - 1] : prefix;
        for (int i = 0; i < n; i++) {
            cum += fixed(key_p(key[i]));
            if (cum >= need) {
                thr = key[i];
                break;
            }
        }
        st->thr = thr;
        st->fit = 2;
        st->ncand = 0;
        st->ticket = 0;
    }
}

/* Top-p alone: the kept mass, the p of the tokens with key >= thr (slices
 * a fixed tree each, then in order), into st->mass. */
__global__ void __launch_bounds__(DIST_THREADS) dist_kept_mass_kernel(const float *out, int64_t os, int64_t V, dist_ws ws) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    dist_row *st = ws.st + row;
    const u64 thr = st->thr;
    const float *pr = out + (int64_t)row * os;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    double s = 0;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i >= V) continue;
        const float p = pr[i];
        if (rank_key(p, i) >= thr) s += p;
    }
    s = dist_block_sum(s, sh);
    double *part = ws.psum + (int64_t)row * ws.nb;
    if (threadIdx.x == 0) part[blockIdx.x] = s;
    if (!dist_last(st, sh)) return;
    if (threadIdx.x == 0) {
        double q = 0;
        for (int c = 0; c < (int)gridDim.x; c++) q += __ldcg(part + c);
        st->mass = q;
        st->ticket = 0;
    }
}

/* A block's mass s of its slice of row `row` (pr) into the row's partials;
 * the last block of the row draws with u over them into *tok and re-arms
 * the row's ticket. */
__device__ void dist_slice_then_draw(const float *pr, int64_t V, double s, const dist_ws &ws, int row, double u,
                                     dist_shared &sh, int32_t *tok) {
    dist_row *st = ws.st + row;
    double *part = ws.pdraw + (int64_t)row * 2 * ws.nb;
    if (threadIdx.x == 0) part[blockIdx.x] = s;
    if (!dist_last(st, sh)) return;
    const int t = dist_draw(pr, NULL, V, part, ws.nb, u, -1.0, sh);
    if (threadIdx.x == 0) {
        *tok = t;
        st->ticket = 0;
    }
}

/* The truncated output row: the kept tokens renormalised, the rest 0 (in
 * place); with tok (top-p alone) the draw with u[row] into tok[row]. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_apply_kernel(float *out, int64_t os, int64_t V, dist_ws ws, sample_args args, int32_t *tok) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    dist_row *st = ws.st + row;
    const u64 thr = st->thr;
    const double mass = st->mass;
    float *pr = out + (int64_t)row * os;
    const int64_t i0 = (int64_t)blockIdx.x * DIST_CHUNK + threadIdx.x;
    double s = 0;
#pragma unroll
    for (int j = 0; j < DIST_PER; j++) {
        const int64_t i = i0 + (int64_t)j * DIST_THREADS;
        if (i >= V) continue;
        const float p = pr[i];
        const float q = rank_key(p, i) >= thr ? __double2float_rn(__ddiv_rn((double)p, mass)) : 0.0f;
        pr[i] = q;
        if (q > 0) s += q;
    }
    if (!tok) return;
    dist_slice_then_draw(pr, V, dist_block_sum(s, sh), ws, row, args.u[row], sh, tok + row);
}

/* ds_sample_probs_u on rows of p, u[row] into tok[row * ts]. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_draw_kernel(const float *p, int64_t ps, int64_t V, dist_ws ws, sample_args args, int32_t *tok, int ts) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    const int row = blockIdx.y;
    const float *pr = p + (int64_t)row * ps;
    dist_slice_then_draw(pr, V, dist_slice_mass(pr, NULL, V, sh), ws, row, args.u[row], sh, tok + row * ts);
}

/* ds_verify_uniforms' decision on the processed target rows pt[n+1][V] and
 * the draft rows pd: every block finds the accepted count a itself (thread
 * i < n tests draft i's ratio, as the host's loop does; a = the first that
 * fails, else n), adds its slices of the residual of row a and of row a
 * itself, and the last block draws: out[0] = a, out[1] = next. */
__global__ void __launch_bounds__(DIST_THREADS)
    dist_verify_kernel(const float *pt, int64_t V, const float *pd, int64_t pds, int n, dist_ws ws, sample_args args,
                       int32_t *out) {
    ds_cu_grid_wait();
    __shared__ dist_shared sh;
    int fail = n;
    if ((int)threadIdx.x < n) {
        const int i = threadIdx.x;
        const int32_t x = args.draft[i];
        const double q = pd[(int64_t)i * pds + x];
        const double ratio = (double)pt[(int64_t)i * V + x] / (q > 1e-8 ? q : 1e-8);
        if (!(args.u[i] < ratio)) fail = i;
    }
    const int a = -dist_block_max_int(-fail, sh); /* the first rejected draft */
    const float *row = pt + (int64_t)a * V, *drow = a < n ? pd + (int64_t)a * pds : NULL;
    double *part = ws.pdraw; /* row 0's: [nb] residual, [nb] plain */
    const double sr = drow ? dist_slice_mass(row, drow, V, sh) : 0.0;
    const double sp = dist_slice_mass(row, NULL, V, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sr, part[ws.nb + blockIdx.x] = sp;
    if (!dist_last(ws.st, sh)) return;
    int next = -2;
    if (drow) next = dist_draw(row, drow, V, part, ws.nb, args.u[n], 1e-8, sh); /* the residual */
    if (next == -2) next = dist_draw(row, NULL, V, part + ws.nb, ws.nb, args.u[n], -1.0, sh); /* the bonus, or no residual mass */
    if (threadIdx.x == 0) {
        out[0] = a;
        out[1] = next;
        ws.st->ticket = 0;
    }
}

/* ---- host side of the spread distribution ---- */

static int dist_nb(int64_t V) { return (int)((V + DIST_CHUNK - 1) / DIST_CHUNK); }
static size_t dist_align(size_t b) { return (b + 255) & ~(size_t)255; }
static size_t dist_state_bytes(int rows) { return dist_align((size_t)rows * sizeof(dist_row)); }

size_t ds_cu_dist_bytes(int rows, int64_t V) {
    const size_t nb = (size_t)dist_nb(V), R = (size_t)rows;
    return dist_state_bytes(rows) + dist_align(R * nb * sizeof(float)) + dist_align(R * nb * sizeof(double)) +
           dist_align(2 * R * nb * sizeof(double)) + R * SAMPLE_CAND * sizeof(u64);
}

/* ws (rows of V) from ws_base, shifted to start at row r. */
static dist_ws dist_carve(void *base, int rows, int64_t V, int r) {
    const size_t nb = (size_t)dist_nb(V), R = (size_t)rows;
    char *p = (char *)base;
    dist_ws w;
    w.nb = (int)nb;
    w.st = (dist_row *)p + r;
    p += dist_state_bytes(rows);
    w.pmax = (float *)p + (size_t)r * nb;
    p += dist_align(R * nb * sizeof(float));
    w.psum = (double *)p + (size_t)r * nb;
    p += dist_align(R * nb * sizeof(double));
    w.pdraw = (double *)p + (size_t)r * 2 * nb;
    p += dist_align(2 * R * nb * sizeof(double));
    w.cand = (u64 *)p + (size_t)r * SAMPLE_CAND;
    return w;
}

/* Top-p alone (fixed-point mass histograms: DIST_TOPP) spread too; 0 sends it to the block-per-row kernels. */
#define DIST_SPREAD_TOP_P 1

bool ds_cu_dist_fast(int64_t V, const ds_sampling *s) {
    const bool use_k = s->top_k > 0 && s->top_k < V, use_p = s->top_p > 0 && s->top_p < 1.0f;
    return V >= 1 && V <= DIST_MAX_V && (use_k ? s->top_k <= SAMPLE_CAND : !use_p || DIST_SPREAD_TOP_P);
}

bool ds_cu_dist_reset(ds_cuda_backend *cb, const char *op, void *ws, int rows) {
    return ds_cu_ok(cb, op, cudaMemsetAsync(ws, 0, dist_state_bytes(rows), cb->stream));
}

float *ds_cu_dist_max_slot(void *ws, int rows, int64_t V, int row) { return &dist_carve(ws, rows, V, row).st->mx; }

bool ds_cu_dist_run(ds_cuda_backend *cb, const char *op, void *ws, int ws_rows, int ws_row, const float *x,
                    int64_t xs, float *out, int64_t os, int rows, int64_t V, const ds_sampling *s, const double *u,
                    int32_t *d_tok, bool max_ready) {
    if (rows < 1 || rows > SAMPLE_MAX_ROWS || ws_row + rows > ws_rows || !ds_cu_dist_fast(V, s)) {
        ds_cu_fail(cb, op, "spread distribution of %d rows of %lld (workspace rows %d at %d)", rows, (long long)V,
                   ws_rows, ws_row);
        return false;
    }
    const dist_ws w = dist_carve(ws, ws_rows, V, ws_row);
    const dim3 grid((unsigned)w.nb, (unsigned)rows);
    const float T = s->temperature;
    const int top_k = s->top_k > 0 && s->top_k < V ? s->top_k : 0;
    const int mode = top_k ? DIST_TOPK : s->top_p > 0 && s->top_p < 1.0f ? DIST_TOPP : DIST_PLAIN;
    sample_args args;
    memset(&args, 0, sizeof args);
    if (u)
        for (int r = 0; r < rows; r++) args.u[r] = u[r];
    if (!max_ready) {
        ds_cu_launch(dist_max_kernel, grid, DIST_THREADS, cb->stream, x, xs, V, T, w);
        if (!ds_cu_launched(cb, op)) return false;
    }
    ds_cu_launch(dist_sum_kernel, grid, DIST_THREADS, cb->stream, x, xs, V, T, w);
    if (!ds_cu_launched(cb, op)) return false;
    ds_cu_launch(dist_norm_kernel, grid, DIST_THREADS, cb->stream, x, xs, out, os, V, T, mode, top_k, s->top_p, w,
                 args, mode == DIST_PLAIN ? d_tok : (int32_t *)NULL);
    if (!ds_cu_launched(cb, op)) return false;
    if (mode == DIST_PLAIN) return true;
    for (int si = 1; si < dist_passes(V); si++) {
        ds_cu_launch(dist_hist_kernel, grid, DIST_THREADS, cb->stream, (const float *)out, os, V, mode, top_k, w);
        if (!ds_cu_launched(cb, op)) return false;
    }
    if (mode == DIST_TOPK) {
        ds_cu_launch(dist_finish_kernel, grid, DIST_THREADS, cb->stream, (const float *)out, os, V, top_k, s->top_p,
                     w, args, d_tok);
        if (!ds_cu_launched(cb, op)) return false;
        ds_cu_launch(dist_apply_kernel, grid, DIST_THREADS, cb->stream, out, os, V, w, args, (int32_t *)NULL);
        return ds_cu_launched(cb, op);
    }
    ds_cu_launch(dist_finish_p_kernel, grid, DIST_THREADS, cb->stream, (const float *)out, os, V, w);
    if (!ds_cu_launched(cb, op)) return false;
    ds_cu_launch(dist_kept_mass_kernel, grid, DIST_THREADS, cb->stream, (const float *)out, os, V, w);
    if (!ds_cu_launched(cb, op)) return false;
    ds_cu_launch(dist_apply_kernel, grid, DIST_THREADS, cb->stream, out, os, V, w, args, d_tok);
    return ds_cu_launched(cb, op);
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
    if (ds_cu_dist_fast(logits.cols, s)) { /* spread over blocks, SAMPLE_MAX_ROWS rows a launch */
        const int R = logits.rows < SAMPLE_MAX_ROWS ? (int)logits.rows : SAMPLE_MAX_ROWS;
        void *ws = ds_cu_scratch(cb, "probs", ds_cu_dist_bytes(R, logits.cols));
        if (!ws || !ds_cu_dist_reset(cb, "probs", ws, R)) return;
        for (int64_t r0 = 0; r0 < logits.rows; r0 += SAMPLE_MAX_ROWS) {
            const int m = logits.rows - r0 < SAMPLE_MAX_ROWS ? (int)(logits.rows - r0) : SAMPLE_MAX_ROWS;
            if (!ds_cu_dist_run(cb, "probs", ws, R, 0, (const float *)ds_rows(logits, r0, 1).data, logits.stride,
                                (float *)ds_rows(out, r0, 1).data, out.stride, m, logits.cols, s, NULL, NULL, false))
                return;
        }
        return;
    }
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
    const bool spread = probs.cols <= DIST_MAX_V; /* slices of the row over blocks */
    const int R = probs.rows < SAMPLE_MAX_ROWS ? (int)probs.rows : SAMPLE_MAX_ROWS;
    void *ws = spread ? ds_cu_scratch(cb, "sample", ds_cu_dist_bytes(R, probs.cols)) : NULL;
    if (spread && (!ws || !ds_cu_dist_reset(cb, "sample", ws, R))) return;
    for (int64_t r0 = 0; r0 < probs.rows; r0 += SAMPLE_MAX_ROWS) {
        const int64_t m = probs.rows - r0 < SAMPLE_MAX_ROWS ? probs.rows - r0 : SAMPLE_MAX_ROWS;
        sample_args args;
        memset(&args, 0, sizeof args);
        for (int64_t r = 0; r < m; r++) args.u[r] = u[r0 + r];
        if (spread)
            ds_cu_launch(dist_draw_kernel, dim3((unsigned)dist_nb(probs.cols), (unsigned)m), DIST_THREADS, cb->stream,
                         (const float *)ds_rows(probs, r0, 1).data, probs.stride, probs.cols,
                         dist_carve(ws, R, probs.cols, 0), args, d + r0, 1);
        else
            ds_cu_launch(draw_kernel, (unsigned)m, SAMPLE_THREADS, cb->stream,
                         (const float *)ds_rows(probs, r0, 1).data, probs.stride, probs.cols, args, d + r0);
        if (!ds_cu_launched(cb, "sample")) return;
    }
    if (ds_cu_ok(cb, "sample",
                 cudaMemcpyAsync(out, d, (size_t)probs.rows * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "sample", cudaStreamSynchronize(cb->stream));
}

/* verify_sample's work queued, its two results into d (device); false with a recorded failure. */
static bool verify_queue(ds_cuda_backend *cb, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                         const ds_sampling *s, const double *u, int32_t *d) {
    const int64_t V = logits.cols;
    if (!sampling_ok(cb, "verify_sample", s, V)) return false;
    if (n < 0 || n > SAMPLE_MAX_ROWS || logits.rows < n + 1 ||
        (n > 0 && (draft_probs.rows < n || draft_probs.cols != V || draft_probs.dtype != DS_F32))) {
        ds_cu_fail(cb, "verify_sample", "%d drafts (at most %d) for logits %lldx%lld and draft probs %lldx%lld", n,
                   SAMPLE_MAX_ROWS, (long long)logits.rows, (long long)V, (long long)draft_probs.rows,
                   (long long)draft_probs.cols);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (draft[i] < 0 || draft[i] >= V) {
            ds_cu_fail(cb, "verify_sample", "draft token %d at %d is outside the vocabulary", draft[i], i);
            return false;
        }
    /* The n + 1 target distributions (spread: rows x slices; else one
     * block each), then the decision (spread: slices of row a). */
    const bool spread = ds_cu_dist_fast(V, s);
    const size_t pt_bytes = dist_align((size_t)(n + 1) * (size_t)V * sizeof(float));
    char *buf = (char *)ds_cu_scratch(cb, "verify_sample", pt_bytes + (spread ? ds_cu_dist_bytes(n + 1, V) : 0));
    if (!buf) return false;
    float *pt = (float *)buf;
    void *ws = buf + pt_bytes;
    sample_args args;
    memset(&args, 0, sizeof args);
    for (int i = 0; i <= n; i++) args.u[i] = u[i];
    for (int i = 0; i < n; i++) args.draft[i] = draft[i];
    const float *dp = n > 0 ? (const float *)draft_probs.data : (const float *)NULL;
    const int64_t dps = n > 0 ? draft_probs.stride : 0;
    if (spread) {
        if (!ds_cu_dist_reset(cb, "verify_sample", ws, n + 1) ||
            !ds_cu_dist_run(cb, "verify_sample", ws, n + 1, 0, (const float *)logits.data, logits.stride, pt, V,
                            n + 1, V, s, NULL, NULL, false))
            return false;
        ds_cu_launch(dist_verify_kernel, (unsigned)dist_nb(V), DIST_THREADS, cb->stream, (const float *)pt, V, dp,
                     dps, n, dist_carve(ws, n + 1, V, 0), args, d);
    } else {
        ds_cu_launch(probs_kernel, (unsigned)(n + 1), SAMPLE_THREADS, cb->stream, (const float *)logits.data,
                     logits.stride, pt, V, V, s->temperature, s->top_k, s->top_p);
        if (!ds_cu_launched(cb, "verify_sample")) return false;
        ds_cu_launch(accept_kernel, 1, SAMPLE_THREADS, cb->stream, (const float *)pt, V, dp, dps, n, args, d);
    }
    return ds_cu_launched(cb, "verify_sample");
}

/* The m pairs at d to out, one wait. */
static void verify_results(ds_cuda_backend *cb, const char *op, const int32_t *d, int m, int32_t *out) {
    ds_cu_ok(cb, op, cudaMemcpyAsync(out, d, (size_t)(2 * m) * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)) &&
        ds_cu_ok(cb, op, cudaStreamSynchronize(cb->stream));
}

void ds_cu_verify_sample(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                         const ds_sampling *s, const double *u, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    out[0] = 0;
    out[1] = 0;
    int32_t *d = ds_cu_indices(cb, "verify_sample", 2);
    if (d && verify_queue(cb, logits, draft, n, draft_probs, s, u, d)) verify_results(cb, "verify_sample", d, 1, out);
}

/* How many jobs from i on verify_sample's spread path takes as one batch of rows: jobs without drafts (a
 * sequence that did not draft: its next token drawn from its one target row), one sampling rule, rows of one
 * logits tensor at one stride. */
static int plain_run(const ds_verify_job *jobs, int i, int m, int64_t *stride) {
    const ds_verify_job *a = &jobs[i];
    const int64_t V = a->logits.cols;
    *stride = 0;
    if (a->n != 0 || a->logits.dtype != DS_F32 || !ds_cu_dist_fast(V, a->s) || ds_sampling_greedy(a->s)) return 1;
    int j = i + 1;
    const int64_t st = j < m ? (const float *)jobs[j].logits.data - (const float *)a->logits.data : 0;
    for (; j < m && j - i < SAMPLE_MAX_ROWS; j++) {
        const ds_verify_job *b = &jobs[j];
        if (b->n != 0 || b->logits.cols != V || b->logits.dtype != DS_F32 || b->s->temperature != a->s->temperature ||
            b->s->top_k != a->s->top_k || b->s->top_p != a->s->top_p || st <= 0 ||
            (const float *)b->logits.data != (const float *)a->logits.data + (j - i) * st)
            break;
    }
    *stride = st;
    return j - i;
}

/* Jobs i .. i+r-1 (plain_run's, their rows xs floats apart) as verify_queue's spread path would take each
 * (its distribution, then the draw dist_verify_kernel makes without drafts: the same slice sums and draw), r
 * rows a launch; the tokens to d[1], d[3], ... (the accepted counts stay 0). */
static bool plain_queue(ds_cuda_backend *cb, const ds_verify_job *jobs, int r, int64_t xs, int32_t *d) {
    const char *op = "verify_sample";
    const int64_t V = jobs[0].logits.cols;
    const size_t pt_bytes = dist_align((size_t)r * (size_t)V * sizeof(float));
    char *buf = (char *)ds_cu_scratch(cb, op, pt_bytes + ds_cu_dist_bytes(r, V));
    if (!buf) return false;
    float *pt = (float *)buf;
    void *ws = buf + pt_bytes;
    if (!ds_cu_dist_reset(cb, op, ws, r) ||
        !ds_cu_dist_run(cb, op, ws, r, 0, (const float *)jobs[0].logits.data, xs, pt, V, r, V, jobs[0].s, NULL, NULL,
                        false) ||
        !ds_cu_dist_reset(cb, op, ws, r))
        return false;
    sample_args args;
    memset(&args, 0, sizeof args);
    for (int i = 0; i < r; i++) args.u[i] = jobs[i].u[0];
    ds_cu_launch(dist_draw_kernel, dim3((unsigned)dist_nb(V), (unsigned)r), DIST_THREADS, cb->stream, (const float *)pt,
                 V, V, dist_carve(ws, r, V, 0), args, d + 1, 2);
    return ds_cu_launched(cb, op);
}

/* Each job queued in turn (the scratch they share is reused in stream order; runs of jobs without drafts as
 * one, plain_run), the pairs into one device array, one wait. */
void ds_cu_verify_sample_many(ds_backend *be, int m, const ds_verify_job *jobs, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    memset(out, 0, (size_t)(2 * m) * sizeof *out);
    if (m <= 0) return;
    int32_t *d = ds_cu_indices(cb, "verify_sample_many", 2 * m);
    if (!d || !ds_cu_ok(cb, "verify_sample_many", cudaMemsetAsync(d, 0, (size_t)(2 * m) * sizeof *d, cb->stream)))
        return;
    for (int i = 0; i < m;) {
        int64_t xs;
        const int r = plain_run(jobs, i, m, &xs);
        if (r > 1 ? !plain_queue(cb, jobs + i, r, xs, d + 2 * i)
                  : !verify_queue(cb, jobs[i].logits, jobs[i].draft, jobs[i].n, jobs[i].draft_probs, jobs[i].s,
                                  jobs[i].u, d + 2 * i))
            return;
        i += r;
    }
    verify_results(cb, "verify_sample_many", d, m, out);
}
