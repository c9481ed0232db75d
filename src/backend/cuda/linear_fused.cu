/* The fused linear ops (backend.h): several projections of one input, a
 * projection added to the residual stream, and the SwiGLU pair. With bf16
 * weights they are one tensor-core launch each (matmul_mma.cu), which is
 * where they pay: a decode step is 7 launches per layer instead of 17.
 * Otherwise (fp32/f16 weights, prefill-sized M) they run the unfused
 * sequence, so every weight type and size still works. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/matmul_invariant.h"
#include "backend/cuda/matmul_mma.h"
#include "backend/cuda/matmul_mma_frag.cuh"

static ds_mma_seg seg_of(ds_tensor out, ds_tensor w, ds_tensor bias) {
    ds_mma_seg s = {};
    s.w = (const uint16_t *)w.data;
    s.ws = w.stride;
    s.out = (float *)out.data;
    s.os = out.stride;
    s.bias = bias.data;
    s.bias_dtype = (int)bias.dtype;
    s.n = (int)w.rows;
    return s;
}

/* Checks n projections of x; true (and a's segments filled) when one
 * tensor-core launch can compute them all. */
static bool multi_plan(ds_cuda_backend *cb, const char *op, int n, const ds_tensor *outs, ds_tensor x,
                       const ds_tensor *ws, const ds_tensor *biases, bool *ok, ds_mma_args *a) {
    *ok = false;
    if (n < 1 || n > DS_MMA_MAX_SEG) {
        ds_cu_fail(cb, op, "%d projections (1..%d supported)", n, DS_MMA_MAX_SEG);
        return false;
    }
    bool fused = true;
    for (int i = 0; i < n; i++) {
        if (!ds_cu_linear_ok(cb, op, outs[i], x, ws[i], biases[i])) return false;
        fused &= ds_cu_mma_eligible(cb, ws[i], x.rows) && ws[i].rows > 0;
    }
    *ok = true;
    *a = ds_mma_args{};
    a->nseg = n;
    for (int i = 0; i < n; i++) a->seg[i] = seg_of(outs[i], ws[i], biases[i]);
    return fused;
}

/* Whether every one of the n weights takes the row-invariant wide product (DS_CU_SLABS's WIDE_OK). */
static bool wide_inv(ds_cuda_backend *cb, int n, const ds_tensor *ws) {
    for (int i = 0; i < n; i++)
        if (!ds_cu_wide_invariant_ok(cb, ws[i])) return false;
    return n > 0;
}
static bool wide_inv2(ds_cuda_backend *cb, ds_tensor a, ds_tensor b) {
    return ds_cu_wide_invariant_ok(cb, a) && ds_cu_wide_invariant_ok(cb, b);
}

/* outs[i] rows [r0, r0 + n), for the slabs of cfg.invariant. */
static void rows_of(int k, const ds_tensor *outs, int64_t r0, int64_t n, ds_tensor *dst) {
    for (int i = 0; i < k; i++) dst[i] = ds_rows(outs[i], r0, n);
}

void ds_cu_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                        const ds_tensor *biases) {
    ds_cuda_backend *cb = ds_cu(be);
    ds_tensor so[DS_LINEAR_MULTI_MAX];
    DS_CU_SLABS(cb, x.rows, wide_inv(cb, n, ws), r0, m,
                (rows_of(n, outs, r0, m, so), ds_cu_linear_multi(be, n, so, ds_rows(x, r0, m), ws, biases)));
    bool ok;
    ds_mma_args a;
    if (multi_plan(cb, "linear_multi", n, outs, x, ws, biases, &ok, &a)) {
        ds_cu_mma_launch(cb, "linear_multi", DS_MMA_PLAIN, &a, x);
        return;
    }
    if (ok)
        for (int i = 0; i < n; i++) ds_cu_linear(be, outs[i], x, ws[i], biases[i]);
}

void ds_cu_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res) {
    ds_cuda_backend *cb = ds_cu(be);
    DS_CU_SLABS(cb, x.rows, ds_cu_wide_invariant_ok(cb, w), r0, n,
                ds_cu_linear_residual(be, ds_rows(out, r0, n), ds_rows(x, r0, n), w, bias, ds_rows(res, r0, n)));
    if (x.rows <= 0 || w.rows <= 0) return;
    if (!ds_cu_linear_ok(cb, "linear_residual", out, x, w, bias)) return;
    if (res.rows != out.rows || res.cols != out.cols) {
        ds_cu_fail(cb, "linear_residual", "residual %lldx%lld does not match the output %lldx%lld",
                   (long long)res.rows, (long long)res.cols, (long long)out.rows, (long long)out.cols);
        return;
    }
    if (ds_cu_mma_eligible(cb, w, x.rows)) {
        ds_mma_args a = {};
        a.nseg = 1;
        a.seg[0] = seg_of(out, w, bias);
        a.seg[0].res = (const float *)res.data;
        a.seg[0].rs = res.stride;
        ds_cu_mma_launch(cb, "linear_residual", DS_MMA_RESIDUAL, &a, x);
        return;
    }
    if (out.data == res.data && out.stride == res.stride && !bias.data &&
        ds_cu_linear_accumulate(cb, "linear_residual", out, x, w))
        return; /* the residual stream updated in place by the GEMM */
    float *t = (float *)ds_cu_tmp(cb, "linear_residual", (size_t)(out.rows * out.cols) * sizeof(float));
    if (!t) return;
    ds_tensor tmp = {DS_F32, t, out.rows, out.cols, out.cols, false, {0, 0, NULL, NULL}};
    ds_cu_linear(be, tmp, x, w, bias);
    ds_cu_add(be, out, res, tmp);
}

/* The unfused GLU's two products: x @ wg^T into out, x @ wu^T into a temporary, returned (no data: failed). */
static ds_tensor glu_products(ds_backend *be, const char *op, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu) {
    float *t = (float *)ds_cu_tmp(ds_cu(be), op, (size_t)(out.rows * out.cols) * sizeof(float));
    if (!t) return ds_no_tensor();
    ds_tensor up = {DS_F32, t, out.rows, out.cols, out.cols, false, {0, 0, NULL, NULL}};
    ds_cu_linear(be, out, x, wg, ds_no_tensor());
    ds_cu_linear(be, up, x, wu, ds_no_tensor());
    return up;
}

/* out = act(x @ wg^T) * (x @ wu^T), act SiLU or GELU-tanh: the gated
 * epilogue of the tensor-core launch, or two projections and the
 * element-wise op (which rounds as the epilogue does). */
static void linear_glu(ds_backend *be, const char *op, int act, ds_tensor out, ds_tensor x, ds_tensor wg,
                       ds_tensor wu) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || wg.rows <= 0) return;
    if (!ds_cu_linear_ok(cb, op, out, x, wg, ds_no_tensor()) || !ds_cu_linear_ok(cb, op, out, x, wu, ds_no_tensor()))
        return;
    if (ds_cu_mma_eligible(cb, wg, x.rows) && ds_cu_mma_eligible(cb, wu, x.rows) && wg.stride == wu.stride) {
        ds_mma_args a = {};
        a.nseg = 1;
        a.seg[0] = seg_of(out, wg, ds_no_tensor());
        a.seg[0].w2 = (const uint16_t *)wu.data;
        a.seg[0].act = act;
        ds_cu_mma_launch(cb, op, DS_MMA_SWIGLU, &a, x);
        return;
    }
    const ds_tensor up = glu_products(be, op, out, x, wg, wu);
    if (!up.data) return;
    if (act == DS_GLU_GELU_TANH) ds_cu_geglu_tanh(be, out, out, up);
    else ds_cu_swiglu(be, out, out, up);
}

void ds_cu_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu) {
    DS_CU_SLABS(ds_cu(be), x.rows, wide_inv2(ds_cu(be), wg, wu), r0, n,
                ds_cu_linear_swiglu(be, ds_rows(out, r0, n), ds_rows(x, r0, n), wg, wu));
    linear_glu(be, "linear_swiglu", DS_GLU_SILU, out, x, wg, wu);
}

/* The input norm in front of the projections: fused into the tensor-core
 * launch (each block recomputes the rows' rms from the x it loads anyway),
 * or rmsnorm into a buffer of its own and the unfused projection. */
static bool norm_ok(ds_cuda_backend *cb, const char *op, ds_tensor x, ds_tensor nw) {
    if (nw.rows != 1 || nw.cols != x.cols || !ds_cu_float_dtype(cb, op, nw.dtype)) {
        ds_cu_fail(cb, op, "norm weight %lldx%lld does not match %lld columns", (long long)nw.rows,
                   (long long)nw.cols, (long long)x.cols);
        return false;
    }
    return true;
}

/* The kernel reads the norm weight 8 values at a time with 16-byte loads. */
static bool norm_aligned(ds_tensor nw) { return (uintptr_t)nw.data % 16 == 0; }

/* DS_X_BF16: a fused norm too wide for the narrow kernels (or with weights they do not take) computes what they
 * do: x * w, rounded where the product takes bf16, each row's 1 / rms in the tile order (matmul_mma_frag.cuh),
 * and the 1 / rms applied to the products' sums, so that a row's result is the same bits whichever path
 * multiplies it: the prompt's rows here, a verify's in the ring (the CPU's fused norms too: cpu_norm.c). One block
 * a row: warp 0's lane l sums slot l's tiles, the warp adds the slots (slots_rs). */
#define NORM_ORDER_THREADS 256
__device__ __forceinline__ void store_as(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_as(uint16_t *p, float v) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
/* T: float, or uint16_t for bf16 x * w (what the products take anyway: wide_bf16). */
template <typename T>
__global__ void __launch_bounds__(NORM_ORDER_THREADS)
    norm_unscaled_kernel(T *out, int64_t os, float *rs, const float *x, int64_t xs, const void *w, int wdtype, int K,
                         float eps) {
    ds_cu_grid_wait();
    __shared__ float slots[SS_SLOTS];
    const float *xr = x + (int64_t)blockIdx.x * xs;
    if (threadIdx.x < SS_SLOTS) {
        float slot = 0.0f;
        for (int j = threadIdx.x; j < K / 16; j += SS_SLOTS) {
            float f[8], h[8];
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = xr[16 * j + i], h[i] = xr[16 * j + 8 + i];
            slot = __fadd_rn(slot, __fadd_rn(sq_tree8(f), sq_tree8(h)));
        }
        slots[threadIdx.x] = slot;
        __syncwarp();
        const float r = slots_rs(slots, 1, 0, K, eps);
        if (threadIdx.x == 0) rs[blockIdx.x] = r;
    }
    T *orow = out + (int64_t)blockIdx.x * os;
    for (int k = threadIdx.x; k < K; k += NORM_ORDER_THREADS) /* x * w, as split_x8 and the CPU round it */
        store_as(orow + k, w ? __fmul_rn(xr[k], ds_cu_load(w, wdtype, k)) : xr[k]);
}

/* Whether ws[0..n) are rows of one matrix (the backend's weights_join made them so): *w gets it, so that a
 * prompt's or a batch's rows meet them all in one GEMM instead of n narrower ones. */
static bool joined(int n, const ds_tensor *ws, ds_tensor *w) {
    if (n < 2) return false;
    int64_t rows = ws[0].rows;
    for (int i = 1; i < n; i++) {
        if (!ds_weights_adjacent(ws[i - 1], ws[i])) return false;
        rows += ws[i].rows;
    }
    *w = ws[0];
    w->rows = rows;
    w->owned = false;
    return true;
}

/* The 1 / rms after the products, for up to DS_MMA_MAX_SEG outputs in one launch (blockIdx.z picks one):
 * y[r] = src[r] * rs[r] (+ bias), as the narrow kernels' epilogue; src is y, or y's columns of a joined product. */
struct scale_set {
    float *y[DS_MMA_MAX_SEG];
    const float *src[DS_MMA_MAX_SEG];
    int64_t ys[DS_MMA_MAX_SEG], ss[DS_MMA_MAX_SEG], cols[DS_MMA_MAX_SEG];
    const void *bias[DS_MMA_MAX_SEG];
    int bdtype[DS_MMA_MAX_SEG];
};

__global__ void scale_rows_kernel(scale_set set, int64_t rows, const float *rs) {
    ds_cu_grid_wait();
    const int i = (int)blockIdx.z;
    float *y = set.y[i];
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < set.cols[i];
             c += (int64_t)gridDim.x * blockDim.x) {
            float v = __fmul_rn(set.src[i][r * set.ss[i] + c], rs[r]);
            if (set.bias[i]) v = __fadd_rn(v, ds_cu_load(set.bias[i], set.bdtype[i], c));
            y[r * set.ys[i] + c] = v;
        }
}

/* srcs: NULL (in place), or each output's products. */
static void scale_rows(ds_cuda_backend *cb, const char *op, int n, const ds_tensor *ys, const ds_tensor *srcs,
                       const float *rs, const ds_tensor *biases) {
    if (n <= 0 || ys[0].rows <= 0) return;
    scale_set set = {};
    int64_t widest = 0;
    for (int i = 0; i < n; i++) {
        set.y[i] = (float *)ys[i].data;
        set.ys[i] = ys[i].stride;
        set.src[i] = (const float *)(srcs ? srcs[i] : ys[i]).data;
        set.ss[i] = (srcs ? srcs[i] : ys[i]).stride;
        set.cols[i] = ys[i].cols;
        set.bias[i] = biases[i].data;
        set.bdtype[i] = (int)biases[i].dtype;
        if (ys[i].cols > widest) widest = ys[i].cols;
    }
    const unsigned bx = (unsigned)((widest + 255) / 256 < 64 ? (widest + 255) / 256 : 64);
    ds_cu_launch(scale_rows_kernel, dim3(bx, ds_cu_rows_grid(ys[0].rows), (unsigned)n), 256, cb->stream, set,
                 ys[0].rows, rs);
    ds_cu_launched(cb, op);
}

/* out = act(gate * rs[r]) * (up * rs[r]): the 1 / rms after the products and the GLU in one launch, rounding as
 * the narrow kernels' epilogue does (silu_mul, ds_cu_gelu_tanh_mul). */
__global__ void glu_scaled_kernel(float *out, int64_t os, const float *gate, int64_t gs, const float *up, int64_t us,
                                  int64_t rows, int64_t cols, const float *rs, int act) {
    ds_cu_grid_wait();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float g = __fmul_rn(gate[r * gs + c], rs[r]), u = __fmul_rn(up[r * us + c], rs[r]);
        out[r * os + c] = act == DS_GLU_GELU_TANH ? ds_cu_gelu_tanh_mul(g, u) : silu_mul(g, u);
    }
}

/* The normed copy: DS_X_BF16 with K % 32 == 0, x * w and each row's 1 / rms into *rs (applied after the products:
 * scaled true); otherwise the norm whole, (x * rs) * w. */
static ds_tensor normed_copy(ds_cuda_backend *cb, const char *op, ds_tensor x, ds_tensor nw, float eps,
                             const float **rs, bool *scaled) {
    ds_tensor xn = ds_no_tensor();
    *rs = NULL;
    *scaled = DS_X_BF16_ON && x.cols % 32 == 0 && x.rows <= INT32_MAX;
    float *p = (float *)ds_cu_tmp2(cb, op, (size_t)(x.rows * x.cols + x.rows) * sizeof(float));
    if (!p) return xn;
    xn = ds_tensor{DS_F32, p, x.rows, x.cols, x.cols, false, {0, 0, NULL, NULL}};
    if (*scaled) {
        float *r = p + x.rows * x.cols;
        ds_cu_launch(norm_unscaled_kernel<float>, (unsigned)x.rows, NORM_ORDER_THREADS, cb->stream, (float *)xn.data,
                     xn.stride, r, (const float *)x.data, x.stride, nw.data, (int)nw.dtype, (int)x.cols, eps);
        ds_cu_launched(cb, op);
        *rs = r;
    } else {
        ds_cu_rmsnorm(&cb->base, xn, x, nw, (int)x.cols, eps);
    }
    return xn;
}

/* DS_X_BF16, a prompt's rows (past the narrow kernels) and bf16 weights: the normed copy can be the bf16 values
 * the products take, so that cuBLAS reads it as it is (ds_cu_linear_wide_bf16x): no split launch per weight. */
static bool wide_bf16(const ds_cuda_backend *cb, ds_tensor x, int n, const ds_tensor *ws) {
    if (!DS_X_BF16_ON || x.cols % 32 || x.rows <= ds_cu_narrow_rows(cb) || x.rows > INT32_MAX) return false;
    for (int i = 0; i < n; i++)
        if (ws[i].dtype != DS_BF16 || ws[i].q.bits) return false; /* (a quantized weight's dtype is its scales') */
    return true;
}

/* wide_bf16's copy: bf16(x * w) [rows, K] contiguous, each row's 1 / rms into *rs; NULL (recorded) on failure. */
static const uint16_t *normed_bf16(ds_cuda_backend *cb, const char *op, ds_tensor x, ds_tensor nw, float eps,
                                   const float **rs) {
    const size_t xh_bytes = (size_t)(x.rows * x.cols) * 2;
    char *p = (char *)ds_cu_tmp2(cb, op, xh_bytes + (size_t)x.rows * sizeof(float));
    if (!p) return NULL;
    float *r = (float *)(p + xh_bytes); /* (K % 32 == 0: 4-byte aligned) */
    ds_cu_launch(norm_unscaled_kernel<uint16_t>, (unsigned)x.rows, NORM_ORDER_THREADS, cb->stream, (uint16_t *)p,
                 x.cols, r, (const float *)x.data, x.stride, nw.data, (int)nw.dtype, (int)x.cols, eps);
    if (!ds_cu_launched(cb, op)) return NULL;
    *rs = r;
    return (const uint16_t *)p;
}

static void glu_scaled(ds_cuda_backend *cb, const char *op, int act, ds_tensor out, ds_tensor gate, ds_tensor up,
                       const float *rs) {
    ds_cu_launch(glu_scaled_kernel, dim3((unsigned)((out.cols + 255) / 256), ds_cu_rows_grid(out.rows)), 256,
                 cb->stream, (float *)out.data, out.stride, (const float *)gate.data, gate.stride,
                 (const float *)up.data, up.stride, out.rows, out.cols, rs, act);
    ds_cu_launched(cb, op);
}

void ds_cu_rmsnorm_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, ds_tensor nw, float eps,
                                const ds_tensor *ws, const ds_tensor *biases) {
    ds_cuda_backend *cb = ds_cu(be);
    ds_tensor so[DS_LINEAR_MULTI_MAX];
    DS_CU_SLABS(cb, x.rows, wide_inv(cb, n, ws), r0, m,
                (rows_of(n, outs, r0, m, so), ds_cu_rmsnorm_linear_multi(be, n, so, ds_rows(x, r0, m), nw, eps, ws,
                                                                         biases)));
    if (x.rows <= 0 || !norm_ok(cb, "rmsnorm_linear_multi", x, nw)) return;
    bool ok;
    ds_mma_args a;
    if (multi_plan(cb, "rmsnorm_linear_multi", n, outs, x, ws, biases, &ok, &a) && norm_aligned(nw)) {
        a.norm_w = nw.data;
        a.norm_dtype = (int)nw.dtype;
        a.eps = eps;
        ds_cu_mma_launch(cb, "rmsnorm_linear_multi", DS_MMA_PLAIN, &a, x);
        return;
    }
    if (!ok) return;
    const float *rs;
    if (wide_bf16(cb, x, n, ws)) {
        const uint16_t *xh = normed_bf16(cb, "rmsnorm_linear_multi", x, nw, eps, &rs);
        if (!xh) return;
        ds_tensor wj;
        if (joined(n, ws, &wj)) { /* one GEMM, then each output's columns scaled out of it */
            float *t = (float *)ds_cu_tmp(cb, "rmsnorm_linear_multi", (size_t)(x.rows * wj.rows) * sizeof(float));
            if (!t) return;
            const ds_tensor all = {DS_F32, t, x.rows, wj.rows, wj.rows, false, {0, 0, NULL, NULL}};
            if (!ds_cu_linear_wide_bf16x(cb, "rmsnorm_linear_multi", all, xh, x.rows, wj, ds_no_tensor())) return;
            ds_tensor src[DS_MMA_MAX_SEG];
            for (int i = 0, c = 0; i < n; c += (int)ws[i].rows, i++) src[i] = ds_cols(all, c, ws[i].rows);
            scale_rows(cb, "rmsnorm_linear_multi", n, outs, src, rs, biases);
            return;
        }
        for (int i = 0; i < n; i++)
            if (!ds_cu_linear_wide_bf16x(cb, "rmsnorm_linear_multi", outs[i], xh, x.rows, ws[i], ds_no_tensor()))
                return;
        scale_rows(cb, "rmsnorm_linear_multi", n, outs, NULL, rs, biases);
        return;
    }
    bool scaled;
    ds_tensor xn = normed_copy(cb, "rmsnorm_linear_multi", x, nw, eps, &rs, &scaled);
    if (!xn.data) return;
    if (!scaled) {
        ds_cu_linear_multi(be, n, outs, xn, ws, biases);
        return;
    }
    for (int i = 0; i < n; i++) ds_cu_linear(be, outs[i], xn, ws[i], ds_no_tensor());
    scale_rows(cb, "rmsnorm_linear_multi", n, outs, NULL, rs, biases);
}

static void rmsnorm_linear_glu(ds_backend *be, const char *op, int act, ds_tensor out, ds_tensor x, ds_tensor nw,
                               float eps, ds_tensor wg, ds_tensor wu) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || !norm_ok(cb, op, x, nw)) return;
    if (!ds_cu_linear_ok(cb, op, out, x, wg, ds_no_tensor()) || !ds_cu_linear_ok(cb, op, out, x, wu, ds_no_tensor()))
        return;
    if (ds_cu_mma_eligible(cb, wg, x.rows) && ds_cu_mma_eligible(cb, wu, x.rows) && wg.stride == wu.stride &&
        norm_aligned(nw)) {
        ds_mma_args a = {};
        a.nseg = 1;
        a.seg[0] = seg_of(out, wg, ds_no_tensor());
        a.seg[0].w2 = (const uint16_t *)wu.data;
        a.seg[0].act = act;
        a.norm_w = nw.data;
        a.norm_dtype = (int)nw.dtype;
        a.eps = eps;
        ds_cu_mma_launch(cb, op, DS_MMA_SWIGLU, &a, x);
        return;
    }
    const float *rs;
    const ds_tensor gu[2] = {wg, wu};
    if (wide_bf16(cb, x, 2, gu)) {
        const uint16_t *xh = normed_bf16(cb, op, x, nw, eps, &rs);
        ds_tensor wj;
        if (xh && wg.rows == wu.rows && joined(2, gu, &wj)) { /* gate and up in one GEMM */
            const int64_t F = wg.rows;
            float *t = (float *)ds_cu_tmp(cb, op, (size_t)(out.rows * 2 * F) * sizeof(float));
            if (!t) return;
            const ds_tensor both = {DS_F32, t, out.rows, 2 * F, 2 * F, false, {0, 0, NULL, NULL}};
            if (ds_cu_linear_wide_bf16x(cb, op, both, xh, x.rows, wj, ds_no_tensor()))
                glu_scaled(cb, op, act, out, ds_cols(both, 0, F), ds_cols(both, F, F), rs);
            return;
        }
        float *t = xh ? (float *)ds_cu_tmp(cb, op, (size_t)(out.rows * out.cols) * sizeof(float)) : NULL;
        if (!t) return;
        const ds_tensor up = {DS_F32, t, out.rows, out.cols, out.cols, false, {0, 0, NULL, NULL}};
        if (ds_cu_linear_wide_bf16x(cb, op, out, xh, x.rows, wg, ds_no_tensor()) &&
            ds_cu_linear_wide_bf16x(cb, op, up, xh, x.rows, wu, ds_no_tensor()))
            glu_scaled(cb, op, act, out, out, up, rs);
        return;
    }
    bool scaled;
    ds_tensor xn = normed_copy(cb, op, x, nw, eps, &rs, &scaled);
    if (!xn.data) return;
    if (!scaled) {
        linear_glu(be, op, act, out, xn, wg, wu);
        return;
    }
    const ds_tensor up = glu_products(be, op, out, xn, wg, wu);
    if (up.data) glu_scaled(cb, op, act, out, out, up, rs);
}

void ds_cu_rmsnorm_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor nw, float eps, ds_tensor wg,
                                 ds_tensor wu) {
    DS_CU_SLABS(ds_cu(be), x.rows, wide_inv2(ds_cu(be), wg, wu), r0, n,
                ds_cu_rmsnorm_linear_swiglu(be, ds_rows(out, r0, n), ds_rows(x, r0, n), nw, eps, wg, wu));
    rmsnorm_linear_glu(be, "rmsnorm_linear_swiglu", DS_GLU_SILU, out, x, nw, eps, wg, wu);
}

void ds_cu_rmsnorm_linear_geglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor nw, float eps, ds_tensor wg,
                                ds_tensor wu) {
    DS_CU_SLABS(ds_cu(be), x.rows, wide_inv2(ds_cu(be), wg, wu), r0, n,
                ds_cu_rmsnorm_linear_geglu(be, ds_rows(out, r0, n), ds_rows(x, r0, n), nw, eps, wg, wu));
    rmsnorm_linear_glu(be, "rmsnorm_linear_geglu", DS_GLU_GELU_TANH, out, x, nw, eps, wg, wu);
}
