/* RMSNorm and rotate-half RoPE on the GPU, fp32 throughout. One block
 * normalizes one (row, group) with a reduction order fixed by `dim` alone,
 * so a row's result never depends on the rows beside it. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/norm_rope_math.cuh"
#include "backend/cuda/ring_trace.h"
#include "backend/norm_order.h"

#define NORM_THREADS NR_THREADS /* the per-head norm's order (norm_rope_math.cuh) */
static_assert(NORM_THREADS == DS_NORM_THREADS, "narrow rows' norm order: norm_order.h");

/* Block b normalizes group b % groups of row b / groups with T threads. */
template <int T>
__global__ void __launch_bounds__(T)
    rmsnorm_kernel(float *out, int64_t os, const float *x, int64_t xs, const void *w, int wdtype, int64_t groups,
                   int dim, float eps) {
    ds_cu_grid_wait();
    __shared__ float part[T / 32];
    const int64_t r = blockIdx.x / groups, g = blockIdx.x % groups;
    const float *xr = x + r * xs + g * dim;
    float *orow = out + r * os + g * dim;
    const float rs = nr_block_inv_rms<T>(xr, dim, eps, part);
    if (w)
        for (int i = threadIdx.x; i < dim; i += T) orow[i] = xr[i] * rs * ds_cu_load(w, wdtype, i);
    else
        for (int i = threadIdx.x; i < dim; i += T) orow[i] = xr[i] * rs;
}

void ds_cu_rmsnorm(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, int dim, float eps) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    if (dim <= 0 || x.cols % dim) {
        ds_cu_fail(cb, "rmsnorm", "%lld columns are not a whole number of %d-wide groups", (long long)x.cols, dim);
        return;
    }
    if (w.data && !ds_cu_float_dtype(cb, "rmsnorm", w.dtype)) return;
    const int64_t groups = x.cols / dim;
    /* The thread count, and so the order, by dim alone (norm_order.h). */
    if (ds_norm_threads(dim) == DS_NORM_WIDE_THREADS)
        ds_cu_launch(rmsnorm_kernel<DS_NORM_WIDE_THREADS>, (unsigned)(x.rows * groups), DS_NORM_WIDE_THREADS,
                     cb->stream, (float *)out.data, out.stride, (const float *)x.data, x.stride, w.data, w.dtype,
                     groups, dim, eps);
    else
        ds_cu_launch(rmsnorm_kernel<NORM_THREADS>, (unsigned)(x.rows * groups), NORM_THREADS, cb->stream,
                     (float *)out.data, out.stride, (const float *)x.data, x.stride, w.data, w.dtype, groups, dim, eps);
    ds_cu_launched(cb, "rmsnorm");
}

/* out = (res + rmsnorm(x, w)) * scale, one block a row: rmsnorm_kernel's
 * reduction (the same T for the same dim) and its product, then the add and
 * the scale rounded as the separate kernels round them (no contraction into
 * an FMA), so the bits are those of the three launches it replaces. */
template <int T>
__global__ void __launch_bounds__(T)
    rmsnorm_add_kernel(float *out, int64_t os, const float *res, int64_t rs, const float *x, int64_t xs, const void *w,
                       int wdtype, int dim, float eps, float scale) {
    ds_cu_grid_wait();
    __shared__ float part[T / 32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * xs, *rr = res + r * rs;
    float *orow = out + r * os;
    const float inv = nr_block_inv_rms<T>(xr, dim, eps, part);
    for (int i = threadIdx.x; i < dim; i += T) {
        const float y = w ? __fmul_rn(__fmul_rn(xr[i], inv), ds_cu_load(w, wdtype, i)) : __fmul_rn(xr[i], inv);
        const float o = __fadd_rn(rr[i], y);
        orow[i] = scale != 1.0f ? __fmul_rn(o, scale) : o;
    }
}

void ds_cu_rmsnorm_add(ds_backend *be, ds_tensor out, ds_tensor res, ds_tensor x, ds_tensor w, float eps,
                       float scale) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    if (res.rows != x.rows || res.cols != x.cols || out.rows != x.rows || out.cols != x.cols) {
        ds_cu_fail(cb, "rmsnorm_add", "shapes differ: out %lldx%lld, res %lldx%lld, x %lldx%lld", (long long)out.rows,
                   (long long)out.cols, (long long)res.rows, (long long)res.cols, (long long)x.rows,
                   (long long)x.cols);
        return;
    }
    if (w.data && !ds_cu_float_dtype(cb, "rmsnorm_add", w.dtype)) return;
    const int dim = (int)x.cols;
    if (ds_norm_threads(dim) == DS_NORM_WIDE_THREADS) /* as ds_cu_rmsnorm */
        ds_cu_launch(rmsnorm_add_kernel<DS_NORM_WIDE_THREADS>, (unsigned)x.rows, DS_NORM_WIDE_THREADS, cb->stream,
                     (float *)out.data, out.stride, (const float *)res.data, res.stride, (const float *)x.data,
                     x.stride, w.data, w.dtype, dim, eps, scale);
    else
        ds_cu_launch(rmsnorm_add_kernel<NORM_THREADS>, (unsigned)x.rows, NORM_THREADS, cb->stream, (float *)out.data,
                     out.stride, (const float *)res.data, res.stride, (const float *)x.data, x.stride, w.data, w.dtype,
                     dim, eps, scale);
    ds_cu_launched(cb, "rmsnorm_add");
}

/* Positions and frequencies of one launch, by value. */
typedef struct {
    int32_t pos[DS_CU_ROWS];
    float inv_freq[DS_CU_MAX_HALF];
} rope_arg;

/* Row r's position: by value, or from the device (a step region's). */
__device__ __forceinline__ int row_pos(const rope_arg &a, const int32_t *dpos, int r) {
    return dpos ? dpos[r] : a.pos[r];
}

/* blockIdx.x = row of the launch; thread i < half rotates pair (i, i+half)
 * of every head: angle = pos * inv_freq[i] in fp32, then cos/sin (as the
 * reference). */
__global__ void rope_kernel(float *x, int64_t xs, int64_t heads, int head_dim, rope_arg a, const int32_t *dpos) {
    ds_cu_grid_wait();
    const int half = head_dim / 2, r = blockIdx.x;
    float *row = x + (int64_t)r * xs;
    const int pos = row_pos(a, dpos, r);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float ang = (float)pos * a.inv_freq[i];
        const float c = cosf(ang), s = sinf(ang);
        for (int64_t h = 0; h < heads; h++) {
            float *v = row + h * head_dim;
            const float p = v[i], q = v[i + half];
            v[i] = p * c - q * s;
            v[i + half] = q * c + p * s;
        }
    }
}

void ds_cu_rope(ds_backend *be, ds_tensor x, int head_dim, const int32_t *pos, const float *inv_freq) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    const int half = head_dim / 2;
    if (head_dim <= 0 || head_dim % 2 || x.cols % head_dim) {
        ds_cu_fail(cb, "rope", "%lld columns are not whole heads of even size %d", (long long)x.cols, head_dim);
        return;
    }
    if (half > DS_CU_MAX_HALF) {
        ds_cu_fail(cb, "rope", "head_dim %d is over the supported %d", head_dim, 2 * DS_CU_MAX_HALF);
        return;
    }
    const int32_t *dpos = NULL;
    if (cb->reg.active && !(dpos = ds_cu_step_ptr(cb, "rope", pos, x.rows))) return;
    rope_arg a;
    for (int i = 0; i < half; i++) a.inv_freq[i] = inv_freq[i];
    const int threads = half < 32 ? 32 : (half + 31) / 32 * 32;
    for (int64_t r0 = 0; r0 < x.rows; r0 += DS_CU_ROWS) {
        int n = (int)(x.rows - r0 < DS_CU_ROWS ? x.rows - r0 : DS_CU_ROWS);
        for (int i = 0; i < n; i++) a.pos[i] = dpos ? 0 : pos[r0 + i];
        ds_cu_launch(rope_kernel, (unsigned)n, threads, cb->stream, (float *)x.data + r0 * x.stride, x.stride,
                     x.cols / head_dim, head_dim, a, dpos ? dpos + r0 : NULL);
        if (!ds_cu_launched(cb, "rope")) return;
    }
}

/* One tensor of heads for rmsnorm_rope_kernel: x rows of `heads` heads
 * (heads 0: none), normed and rotated in place, or into row pos (mod ring)
 * of dst when dst is set (K into its cache, of dtype ddt: a bf16 / f16
 * cache gets each value rounded, ds_cu_to16; ds: its stride in elements). */
typedef struct {
    float *x;
    int64_t xs;
    const void *w;
    int wdtype, heads;
    float *dst;
    int64_t ds;
    int ddt;
} rope_part;

/* Rows of v copied to rows pos (mod ring) of dst (V into its cache, of dtype
 * ddt, rounded as K); cols 0: none. */
typedef struct {
    const float *v;
    int64_t vs;
    float *dst;
    int64_t ds;
    int cols, ddt;
} copy_part;

/* Row r of a cache written at position pos: pos % ring for a ring; -1 past
 * the cache's rows (never, for positions the model checked). */
__device__ __forceinline__ int64_t cache_row(int pos, int ring, int64_t rows) {
    const int64_t r = ring > 0 ? pos % ring : pos;
    return r >= 0 && r < rows ? r : -1;
}

/* Per-head RMSNorm then RoPE in one pass (Qwen3's q/k path), over one or
 * two tensors that share the positions (q and k in one launch), and V rows
 * copied to their cache rows: block b takes head b % heads of row b / heads
 * of part 0, the blocks after those part 1, then one block per row of the
 * V copy. The sum of squares has rmsnorm_kernel's order; thread i < half
 * then rotates the normed pair (i, i + half). Where the result goes (in
 * place or a cache row) changes no value.
 *
 * A thread's first pair's norm weights and frequency are read before the
 * grid wait (never written by a kernel: rope_pre), so the head's values are
 * the only round trip to memory after it (the kernel sits between QKV and
 * attention on every layer's critical path). */
typedef struct {
    float wi, wh, f; /* pair threadIdx.x's weights (1 without any) and frequency, where threadIdx.x < half */
} rope_pre;

/* Block b's part (0 or 1, b made relative to it), or -1: a V copy block. */
__device__ __forceinline__ int block_part(const rope_part &p0, const rope_part &p1, int rows, int *b) {
    const int n0 = rows * p0.heads, n1 = rows * p1.heads;
    if (*b >= n0 + n1) return -1;
    if (*b < n0) return 0;
    *b -= n0;
    return 1;
}

/* b0: the block's index among the launch's blocks of these parts (blockIdx.x, or within its layer). */
__device__ __forceinline__ rope_pre rope_pre_load(const rope_part &p0, const rope_part &p1, int rows, int head_dim,
                                                  const rope_arg &a, int b0) {
    rope_pre r = {1.0f, 1.0f, 0.0f};
    int b = b0;
    const int k = block_part(p0, p1, rows, &b), i = threadIdx.x, half = head_dim / 2;
    const void *w = k == 1 ? p1.w : p0.w;
    const int wdt = k == 1 ? p1.wdtype : p0.wdtype;
    if (k >= 0 && i < half) {
        if (w) {
            r.wi = ds_cu_load(w, wdt, i);
            r.wh = ds_cu_load(w, wdt, i + half);
        }
        r.f = a.inv_freq[i];
    }
    return r;
}

__device__ __forceinline__ void norm_rope_block(const rope_part &p0, const rope_part &p1, const copy_part &pv,
                                                int rows, int head_dim, float eps, int ring, int64_t cache_rows,
                                                const rope_arg &a, const int32_t *dpos, const rope_pre &pre, int b0) {
    __shared__ float part[NORM_THREADS / 32];
    int b = b0;
    const int k = block_part(p0, p1, rows, &b);
    if (k < 0) {
        const int r = b - rows * (p0.heads + p1.heads);
        const int64_t dr = cache_row(row_pos(a, dpos, r), ring, cache_rows);
        if (dr < 0) return;
        const float *src = pv.v + (int64_t)r * pv.vs;
        if (pv.ddt != DS_F32) { /* a bf16 / f16 cache */
            uint16_t *d16 = (uint16_t *)(void *)pv.dst + dr * pv.ds;
            for (int i = threadIdx.x; i < pv.cols; i += NORM_THREADS) d16[i] = ds_cu_to16(src[i], pv.ddt == DS_F16);
            return;
        }
        float *d = pv.dst + dr * pv.ds;
        for (int i = threadIdx.x; i < pv.cols; i += NORM_THREADS) d[i] = src[i];
        return;
    }
    /* the part's fields selected by value: a reference to either parameter would copy both to local memory */
    float *x = k ? p1.x : p0.x, *dst = k ? p1.dst : p0.dst;
    const int64_t xs = k ? p1.xs : p0.xs, ds = k ? p1.ds : p0.ds;
    const void *w = k ? p1.w : p0.w;
    const int wdtype = k ? p1.wdtype : p0.wdtype, heads = k ? p1.heads : p0.heads;
    const int r = b / heads, h = b % heads, half = head_dim / 2;
    float *v = x + (int64_t)r * xs + (int64_t)h * head_dim;
    const float rs = nr_block_inv_rms<NORM_THREADS>(v, head_dim, eps, part);
    const int pos = row_pos(a, dpos, r);
    float *o = v;
    if (dst) {
        const int64_t dr = cache_row(pos, ring, cache_rows);
        if (dr < 0) return;
        const int ddt = k ? p1.ddt : p0.ddt;
        if (ddt != DS_F32) { /* a bf16 / f16 cache: the same values, each rounded as it is stored */
            uint16_t *o16 = (uint16_t *)(void *)dst + dr * ds + (int64_t)h * head_dim;
            for (int i = threadIdx.x; i < half; i += NORM_THREADS) {
                float oi, oh;
                if (i == threadIdx.x)
                    nr_rotate_wv(v[i], v[i + half], rs, w != NULL, pre.wi, pre.wh, pos, pre.f, &oi, &oh);
                else nr_rotate(v[i], v[i + half], rs, w, wdtype, i, half, pos, a.inv_freq[i], &oi, &oh);
                o16[i] = ds_cu_to16(oi, ddt == DS_F16);
                o16[i + half] = ds_cu_to16(oh, ddt == DS_F16);
            }
            return;
        }
        o = dst + dr * ds + (int64_t)h * head_dim;
    }
    for (int i = threadIdx.x; i < half; i += NORM_THREADS) {
        float oi, oh;
        if (i == threadIdx.x) nr_rotate_wv(v[i], v[i + half], rs, w != NULL, pre.wi, pre.wh, pos, pre.f, &oi, &oh);
        else nr_rotate(v[i], v[i + half], rs, w, wdtype, i, half, pos, a.inv_freq[i], &oi, &oh);
        o[i] = oi;
        o[i + half] = oh;
    }
}

__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_rope_kernel(rope_part p0, rope_part p1, copy_part pv, int rows, int head_dim, float eps, int ring,
                        int64_t cache_rows, rope_arg a, const int32_t *dpos, unsigned long long *trace) {
    unsigned long long *tr = threadIdx.x == 0 ? ds_cu_trace_block(trace) : NULL; /* DS_CUDA_RING_TRACE */
    if (tr) tr[RT_ENTRY] = ds_cu_gtimer();
    const rope_pre pre = rope_pre_load(p0, p1, rows, head_dim, a, (int)blockIdx.x);
    ds_cu_grid_wait();
    if (tr) tr[RT_WAIT] = ds_cu_gtimer();
    norm_rope_block(p0, p1, pv, rows, head_dim, eps, ring, cache_rows, a, dpos, pre, (int)blockIdx.x);
    if (tr) tr[RT_END] = ds_cu_gtimer();
}

/* key_norm_rope_store_layers: layers' keys and values at the same rows and positions (no q, no ring), block b
 * of layer b / per_layer taking that layer's block b % per_layer as rmsnorm_rope_kernel's part 1 and V copy. */
#define KEY_LAYERS_MAX 8
typedef struct {
    rope_part k[KEY_LAYERS_MAX];
    copy_part v[KEY_LAYERS_MAX];
} key_layers;

__global__ void __launch_bounds__(NORM_THREADS)
    key_layers_kernel(const __grid_constant__ key_layers L, int per_layer, int rows, int head_dim, float eps,
                      int64_t cache_rows, rope_arg a, const int32_t *dpos, unsigned long long *trace) {
    unsigned long long *tr = threadIdx.x == 0 ? ds_cu_trace_block(trace) : NULL; /* DS_CUDA_RING_TRACE */
    if (tr) tr[RT_ENTRY] = ds_cu_gtimer();
    const int layer = (int)blockIdx.x / per_layer, b = (int)blockIdx.x % per_layer;
    const rope_part none = {NULL, 0, NULL, 0, 0, NULL, 0, DS_F32}, kp = L.k[layer];
    const copy_part vp = L.v[layer];
    const rope_pre pre = rope_pre_load(none, kp, rows, head_dim, a, b);
    ds_cu_grid_wait();
    if (tr) tr[RT_WAIT] = ds_cu_gtimer();
    norm_rope_block(none, kp, vp, rows, head_dim, eps, 0, cache_rows, a, dpos, pre, b);
    if (tr) tr[RT_END] = ds_cu_gtimer();
}

static bool rope_heads_ok(ds_cuda_backend *cb, const char *op, ds_tensor x, ds_tensor w, int head_dim) {
    if (head_dim <= 0 || head_dim % 2 || x.cols % head_dim) {
        ds_cu_fail(cb, op, "%lld columns are not whole heads of even size %d", (long long)x.cols, head_dim);
        return false;
    }
    if (head_dim / 2 > DS_CU_MAX_HALF) {
        ds_cu_fail(cb, op, "head_dim %d is over the supported %d", head_dim, 2 * DS_CU_MAX_HALF);
        return false;
    }
    return !w.data || ds_cu_float_dtype(cb, op, w.dtype);
}

/* The rows' positions: in a step region the device's (*dpos; the model checked them), else the host's, which
 * must fall in a cache of cache_rows rows (mod ring where ring > 0; cache_rows < 0: nothing stored, no check).
 * False (the failure recorded) where they do not. */
static bool step_positions(ds_cuda_backend *cb, const char *op, const int32_t *pos, int64_t rows, int ring,
                           int64_t cache_rows, const int32_t **dpos) {
    *dpos = NULL;
    if (cb->reg.active) return (*dpos = ds_cu_step_ptr(cb, op, pos, rows)) != NULL;
    for (int64_t i = 0; cache_rows >= 0 && i < rows; i++) {
        const int64_t r = ring > 0 ? pos[i] % ring : pos[i];
        if (pos[i] < 0 || r >= cache_rows) {
            ds_cu_fail(cb, op, "position %d is outside the cache's %lld rows", pos[i], (long long)cache_rows);
            return false;
        }
    }
    return true;
}

/* x2 may be empty (rows 0): one tensor. Otherwise both have x's rows.
 * With kc set, x2 (k) goes to rows pos (mod ring) of kc and v to those of
 * vc; x may then be empty (rows 0: k and v only). */
static void norm_rope_launch(ds_cuda_backend *cb, const char *op, ds_tensor x, ds_tensor w, ds_tensor x2,
                             ds_tensor w2, ds_tensor v, ds_tensor kc, ds_tensor vc, int ring, int head_dim, float eps,
                             const int32_t *pos, const float *inv_freq) {
    const bool store = kc.data != NULL;
    const int64_t rows = x.rows > 0 ? x.rows : x2.rows;
    if (rows <= 0 || (x.rows > 0 && x.cols <= 0)) return;
    if ((x.rows > 0 && !rope_heads_ok(cb, op, x, w, head_dim)) ||
        (x2.rows > 0 && !rope_heads_ok(cb, op, x2, w2, head_dim)))
        return;
    if (x.rows > 0 && x2.rows > 0 && x2.rows != x.rows) {
        ds_cu_fail(cb, op, "q has %lld rows, k %lld", (long long)x.rows, (long long)x2.rows);
        return;
    }
    if (store && (x2.rows != rows || v.rows != rows || kc.cols != x2.cols || vc.cols != v.cols || kc.rows != vc.rows ||
                  !ds_cu_kv_dtype_ok(kc.dtype) || vc.dtype != kc.dtype || v.dtype != DS_F32)) {
        ds_cu_fail(cb, op, "k %lldx%lld, v %lldx%lld do not fit the caches %lldx%lld, %lldx%lld (fp32 / bf16 / f16)",
                   (long long)x2.rows, (long long)x2.cols, (long long)v.rows, (long long)v.cols, (long long)kc.rows,
                   (long long)kc.cols, (long long)vc.rows, (long long)vc.cols);
        return;
    }
    const int32_t *dpos = NULL;
    if (!step_positions(cb, op, pos, rows, ring, store ? kc.rows : -1, &dpos)) return;
    const int half = head_dim / 2;
    rope_arg a;
    for (int i = 0; i < half; i++) a.inv_freq[i] = inv_freq[i];
    for (int64_t r0 = 0; r0 < rows; r0 += DS_CU_ROWS) {
        int n = (int)(rows - r0 < DS_CU_ROWS ? rows - r0 : DS_CU_ROWS);
        for (int i = 0; i < n; i++) a.pos[i] = dpos ? 0 : pos[r0 + i];
        rope_part p0 = {NULL, 0, NULL, 0, 0, NULL, 0, DS_F32}, p1 = {NULL, 0, NULL, 0, 0, NULL, 0, DS_F32};
        copy_part pv = {NULL, 0, NULL, 0, 0, DS_F32};
        if (x.rows > 0)
            p0 = {(float *)x.data + r0 * x.stride, x.stride, w.data, w.dtype, (int)(x.cols / head_dim), NULL, 0,
                  DS_F32};
        if (x2.rows > 0)
            p1 = {(float *)x2.data + r0 * x2.stride, x2.stride, w2.data, w2.dtype, (int)(x2.cols / head_dim),
                  store ? (float *)kc.data : NULL, kc.stride, store ? (int)kc.dtype : DS_F32};
        if (store)
            pv = {(const float *)v.data + r0 * v.stride, v.stride, (float *)vc.data, vc.stride, (int)v.cols,
                  (int)vc.dtype};
        const unsigned blocks = (unsigned)(n * p0.heads + n * p1.heads + (store ? n : 0));
        ds_cu_launch(rmsnorm_rope_kernel, blocks, NORM_THREADS, cb->stream, p0, p1, pv, n, head_dim, eps, ring,
                     store ? kc.rows : (int64_t)0, a, dpos ? dpos + r0 : NULL,
                     ds_cu_ring_trace_slot(cb, n, RT_KIND_NORM_ROPE, 0, (int)blocks));
        if (!ds_cu_launched(cb, op)) return;
    }
}

void ds_cu_rmsnorm_rope(ds_backend *be, ds_tensor x, ds_tensor w, int head_dim, float eps, const int32_t *pos,
                        const float *inv_freq) {
    norm_rope_launch(ds_cu(be), "rmsnorm_rope", x, w, ds_no_tensor(), ds_no_tensor(), ds_no_tensor(), ds_no_tensor(),
                     ds_no_tensor(), 0, head_dim, eps, pos, inv_freq);
}

void ds_cu_qk_norm_rope(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, int head_dim,
                        float eps, const int32_t *pos, const float *inv_freq) {
    norm_rope_launch(ds_cu(be), "qk_norm_rope", q, qw, k, kw, ds_no_tensor(), ds_no_tensor(), ds_no_tensor(), 0,
                     head_dim, eps, pos, inv_freq);
}

void ds_cu_qk_norm_rope_store(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, ds_tensor v,
                              ds_tensor k_cache, ds_tensor v_cache, int ring_size, int head_dim, float eps,
                              const int32_t *pos, const float *inv_freq) {
    ds_cuda_backend *cb = ds_cu(be);
    if (k.rows <= 0) return;
    if (!k_cache.data || !v_cache.data) {
        ds_cu_fail(cb, "qk_norm_rope_store", "no cache to store into");
        return;
    }
    norm_rope_launch(cb, "qk_norm_rope_store", q, qw, k, kw, v, k_cache, v_cache, ring_size, head_dim, eps, pos,
                     inv_freq);
}

void ds_cu_key_norm_rope_store_layers(ds_backend *be, int n, const ds_tensor *k, const ds_tensor *kw,
                                      const ds_tensor *v, const ds_tensor *kc, const ds_tensor *vc, int head_dim,
                                      float eps, const int32_t *pos, const float *inv_freq) {
    ds_cuda_backend *cb = ds_cu(be);
    const char *op = "key_norm_rope_store_layers";
    if (n <= 0 || k[0].rows <= 0) return;
    const int64_t rows = k[0].rows;
    /* every layer's shapes as layer 0's (one grid of equal parts), each checked as qk_norm_rope_store would */
    for (int i = 0; i < n; i++) {
        if (!rope_heads_ok(cb, op, k[i], kw[i], head_dim)) return;
        if (!kc[i].data || !vc[i].data) {
            ds_cu_fail(cb, op, "layer %d: no cache to store into", i);
            return;
        }
        if (k[i].rows != rows || v[i].rows != rows || k[i].cols != k[0].cols || v[i].cols != v[0].cols ||
            kc[i].cols != k[i].cols || vc[i].cols != v[i].cols || kc[i].rows != kc[0].rows ||
            vc[i].rows != kc[0].rows || k[i].dtype != DS_F32 || v[i].dtype != DS_F32 ||
            !ds_cu_kv_dtype_ok(kc[i].dtype) || vc[i].dtype != kc[i].dtype) {
            ds_cu_fail(cb, op,
                       "layer %d: k %lldx%lld, v %lldx%lld, caches %lldx%lld, %lldx%lld do not match layer 0's "
                       "(k %lldx%lld, v %lldx%lld, caches of %lld rows; fp32 k, v; caches fp32 / bf16 / f16)",
                       i, (long long)k[i].rows, (long long)k[i].cols, (long long)v[i].rows, (long long)v[i].cols,
                       (long long)kc[i].rows, (long long)kc[i].cols, (long long)vc[i].rows, (long long)vc[i].cols,
                       (long long)rows, (long long)k[0].cols, (long long)rows, (long long)v[0].cols,
                       (long long)kc[0].rows);
            return;
        }
    }
    const int32_t *dpos = NULL;
    if (!step_positions(cb, op, pos, rows, 0, kc[0].rows, &dpos)) return;
    const int half = head_dim / 2, heads = (int)(k[0].cols / head_dim);
    rope_arg a;
    for (int i = 0; i < half; i++) a.inv_freq[i] = inv_freq[i];
    for (int64_t r0 = 0; r0 < rows; r0 += DS_CU_ROWS) {
        const int nr = (int)(rows - r0 < DS_CU_ROWS ? rows - r0 : DS_CU_ROWS), per_layer = nr * heads + nr;
        for (int i = 0; i < nr; i++) a.pos[i] = dpos ? 0 : pos[r0 + i];
        for (int l0 = 0; l0 < n; l0 += KEY_LAYERS_MAX) {
            const int nl = n - l0 < KEY_LAYERS_MAX ? n - l0 : KEY_LAYERS_MAX;
            key_layers L;
            memset(&L, 0, sizeof L);
            for (int i = 0; i < nl; i++) {
                const ds_tensor &ki = k[l0 + i], &vi = v[l0 + i];
                L.k[i] = {(float *)ki.data + r0 * ki.stride, ki.stride, kw[l0 + i].data, kw[l0 + i].dtype, heads,
                          (float *)kc[l0 + i].data, kc[l0 + i].stride, (int)kc[l0 + i].dtype};
                L.v[i] = {(const float *)vi.data + r0 * vi.stride, vi.stride, (float *)vc[l0 + i].data,
                          vc[l0 + i].stride, (int)vi.cols, (int)vc[l0 + i].dtype};
            }
            const unsigned blocks = (unsigned)(nl * per_layer);
            ds_cu_launch(key_layers_kernel, blocks, NORM_THREADS, cb->stream, L, per_layer, nr, head_dim, eps,
                         kc[0].rows, a, dpos ? dpos + r0 : NULL,
                         ds_cu_ring_trace_slot(cb, nr, RT_KIND_NORM_ROPE, 0, (int)blocks));
            if (!ds_cu_launched(cb, op)) return;
        }
    }
}
