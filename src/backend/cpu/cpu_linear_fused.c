/* The fused linear ops on the CPU. Narrow calls (decode, verify, drafter
 * blocks) do the whole thing in one pass over the weight panels: one thread
 * hand-off instead of two or three, and the SiLU or residual applied to
 * each tile while it is in registers' reach. They compute exactly what the
 * unfused sequence computes (same kernels, same epilogue arithmetic), so a
 * row's result still does not depend on the rows around it. Wide calls
 * (prefill) run the unfused sequence through the backend's temp buffer. */
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

#define NARROW(x) ((x).rows <= DS_CPU_NARROW_M)

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
    *t = (ds_tensor){DS_F32, cb->temp, like.rows, like.cols, like.cols, false};
    return true;
}

void ds_cpu_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res) {
    if (NARROW(x)) {
        ds_cpu_linear_narrow(be, 1, &out, x, &w, &bias, DS_EPI_RESIDUAL, res);
        return;
    }
    ds_tensor tmp;
    if (!temp_like(be, "linear_residual", out, &tmp)) return;
    ds_cpu_linear(be, tmp, x, w, bias);
    ds_cpu_add(be, out, res, tmp);
}

void ds_cpu_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu) {
    if (NARROW(x)) {
        const ds_tensor outs[2] = {out, out}, ws[2] = {wg, wu};
        ds_cpu_linear_narrow(be, 2, outs, x, ws, NULL, DS_EPI_SWIGLU, ds_no_tensor());
        return;
    }
    ds_tensor tmp;
    if (!temp_like(be, "linear_swiglu", out, &tmp)) return;
    ds_cpu_linear(be, out, x, wg, ds_no_tensor());
    ds_cpu_linear(be, tmp, x, wu, ds_no_tensor());
    ds_cpu_swiglu(be, out, out, tmp);
}

void ds_cpu_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                         const ds_tensor *biases) {
    if (NARROW(x) && n <= 3) {
        ds_cpu_linear_narrow(be, n, outs, x, ws, biases, DS_EPI_STORE, ds_no_tensor());
        return;
    }
    for (int i = 0; i < n; i++) ds_cpu_linear(be, outs[i], x, ws[i], biases ? biases[i] : ds_no_tensor());
}
