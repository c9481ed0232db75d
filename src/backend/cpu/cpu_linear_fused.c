/* The fused linear ops on the CPU do the whole thing in one pass over the
 * weight panels (a slab of rows at a time): one thread hand-off instead of
 * two or three, and the SiLU or residual applied to each tile while it is
 * in registers' reach. They compute exactly what the unfused sequence
 * computes (same kernels, same epilogue arithmetic), so a row's result
 * still does not depend on the rows around it. */
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

/* A [like.rows, like.cols] fp32 intermediate in the backend's temp buffer
 * (grown on demand, kept: prefill calls would otherwise allocate and fault
 * in tens of MB per op). false (and a recorded failure) when out of memory. */
static bool temp_like(ds_backend *be, const char *op, ds_tensor like, ds_tensor *t) {
    ds_cpu_backend *cb = (ds_cpu_backend *)be;
    const size_t n = (size_t)like.rows * (size_t)like.cols;
    if (cb->temp_cap < n) {
        free(cb->temp);
        cb->temp = malloc(n * sizeof(float));
        cb->temp_cap = cb->temp ? n : 0;
        if (!cb->temp) {
            ds_cpu_fail(be, op, "out of memory for a %lldx%lld intermediate", (long long)like.rows,
                        (long long)like.cols);
            return false;
        }
    }
    *t = (ds_tensor){DS_F32, cb->temp, like.rows, like.cols, like.cols, false, {0, 0, NULL, NULL}};
    return true;
}

void ds_cpu_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res) {
    ds_cpu_linear_panels(be, 1, &out, x, &w, &bias, DS_EPI_RESIDUAL, res);
}

void ds_cpu_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu) {
    const ds_tensor outs[2] = {out, out}, ws[2] = {wg, wu};
    ds_cpu_linear_panels(be, 2, outs, x, ws, NULL, DS_EPI_SWIGLU, ds_no_tensor());
}

void ds_cpu_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                         const ds_tensor *biases) {
    if (n <= 3) {
        ds_cpu_linear_panels(be, n, outs, x, ws, biases, DS_EPI_STORE, ds_no_tensor());
        return;
    }
    for (int i = 0; i < n; i++) ds_cpu_linear(be, outs[i], x, ws[i], biases ? biases[i] : ds_no_tensor());
}

#if DS_X_BF16_ON
/* DS_X_BF16: the fused norms as the GPU computes them (linear_fused.cu,
 * matmul_mma_frag.cuh): n = x * w (rounded to bf16 where the weights are
 * bf16, by the linear), each row's 1 / rms in the tile order applied to the
 * products' sums, then the bias; a row whose width is not a multiple of 32
 * is normed whole first, (x * rms) * w, as the GPU does there. All three
 * intermediates sit in the backend's temp buffer. */
typedef struct {
    ds_tensor xn; /* x * w, or the whole norm (scaled false) */
    float *rs;    /* each row's 1 / rms */
    float *extra; /* room for the caller: `extra` floats */
    bool scaled;  /* rs still to be applied */
} fused_norm;

static bool fused_norm_of(ds_backend *be, const char *op, ds_tensor x, ds_tensor nw, float eps, int64_t extra,
                          fused_norm *f) {
    const int64_t n = x.rows * x.cols;
    ds_tensor all;
    if (!temp_like(be, op, (ds_tensor){DS_F32, NULL, 1, n + x.rows + extra, 0, false, {0, 0, NULL, NULL}}, &all)) return false;
    float *p = (float *)all.data;
    f->xn = (ds_tensor){DS_F32, p, x.rows, x.cols, x.cols, false, {0, 0, NULL, NULL}};
    f->rs = p + n;
    f->extra = p + n + x.rows;
    f->scaled = x.cols % 32 == 0;
    if (!f->scaled) {
        be->ops->rmsnorm(be, f->xn, x, nw, (int)x.cols, eps);
        return true;
    }
    float *wf = ds_cpu_scratch(be, op, 0, DS_SCRATCH_NORM, (size_t)x.cols);
    if (!wf) return false;
    ds_to_f32(nw.dtype, nw.data, wf, (size_t)x.cols);
    for (int64_t r = 0; r < x.rows; r++) {
        const float *xr = (const float *)x.data + r * x.stride;
        float *o = p + r * x.cols;
        f->rs[r] = ds_cpu_rms_inv_tiles(xr, (int)x.cols, eps);
        for (int64_t c = 0; c < x.cols; c++) o[c] = xr[c] * wf[c];
    }
    return true;
}

/* y = y * rs, then + bias, row by row: the panel kernels' epilogue order, two roundings (two passes: no fma). */
static void scale_rows(ds_tensor y, const float *rs, ds_tensor bias, float *bf) {
    if (bias.data) ds_to_f32(bias.dtype, bias.data, bf, (size_t)y.cols);
    for (int64_t r = 0; r < y.rows; r++) {
        float *row = (float *)y.data + r * y.stride;
        for (int64_t c = 0; c < y.cols; c++) row[c] *= rs[r];
        if (bias.data)
            for (int64_t c = 0; c < y.cols; c++) row[c] += bf[c];
    }
}

void ds_cpu_rmsnorm_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, ds_tensor norm_w,
                                 float eps, const ds_tensor *ws, const ds_tensor *biases) {
    int64_t widest = 0;
    for (int i = 0; i < n; i++) widest = outs[i].cols > widest ? outs[i].cols : widest;
    fused_norm f;
    if (x.rows <= 0 || !fused_norm_of(be, "rmsnorm_linear_multi", x, norm_w, eps, widest, &f)) return;
    if (!f.scaled) {
        ds_cpu_linear_multi(be, n, outs, f.xn, ws, biases);
        return;
    }
    ds_tensor none[DS_LINEAR_MULTI_MAX];
    for (int i = 0; i < n && i < DS_LINEAR_MULTI_MAX; i++) none[i] = ds_no_tensor();
    ds_cpu_linear_multi(be, n, outs, f.xn, ws, none);
    for (int i = 0; i < n; i++) scale_rows(outs[i], f.rs, biases ? biases[i] : ds_no_tensor(), f.extra);
}

static void fused_glu(ds_backend *be, const char *op, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                      ds_tensor wg, ds_tensor wu, bool gelu) {
    fused_norm f;
    if (x.rows <= 0 || !fused_norm_of(be, op, x, norm_w, eps, out.rows * out.cols, &f)) return;
    ds_tensor up = {DS_F32, f.extra, out.rows, out.cols, out.cols, false, {0, 0, NULL, NULL}};
    const ds_tensor outs[2] = {out, up}, ws[2] = {wg, wu}, none[2] = {ds_no_tensor(), ds_no_tensor()};
    ds_cpu_linear_multi(be, 2, outs, f.xn, ws, none); /* (the fused SwiGLU's epilogue rounds as these do) */
    if (f.scaled) {
        scale_rows(out, f.rs, ds_no_tensor(), NULL);
        scale_rows(up, f.rs, ds_no_tensor(), NULL);
    }
    if (gelu) be->ops->geglu_tanh(be, out, out, up);
    else ds_cpu_swiglu(be, out, out, up);
}

void ds_cpu_rmsnorm_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                  ds_tensor wg, ds_tensor wu) {
    fused_glu(be, "rmsnorm_linear_swiglu", out, x, norm_w, eps, wg, wu, false);
}

void ds_cpu_rmsnorm_linear_geglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                 ds_tensor wg, ds_tensor wu) {
    fused_glu(be, "rmsnorm_linear_geglu", out, x, norm_w, eps, wg, wu, true);
}
#endif
