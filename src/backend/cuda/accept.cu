/* The greedy round's two small decisions on the GPU (spec_ops.h conf_cut,
 * accept_prefix): where the confidence head cuts the proposal, and how
 * many drafts the target's argmaxes accept. Inside a step region both read
 * and write the device step (graphs.cu), so the drafter's walk, the cut,
 * the verify forward, its argmaxes and the acceptance run without the host,
 * and the round's results come back in one copy at the verify's end.
 * Outside a region they take host arrays like argmax: conf_cut then waits
 * for its one int; accept_prefix's inputs are on the host already. */
#include "backend/cuda/cuda_internal.h"

/* out[0] = first r with x[r * stride] < cut[r * cstride], else rows. One
 * thread: at most DS_MAX_GAMMA rows. */
__global__ void conf_cut_kernel(const float *x, int64_t stride, int rows, const float *cut, int64_t cstride,
                                int32_t *out) {
    ds_cu_grid_wait();
    int n = rows;
    for (int r = 0; r < rows; r++)
        if (x[(int64_t)r * stride] < cut[(int64_t)r * cstride]) {
            n = r;
            break;
        }
    *out = n;
}

/* m = min(n, max(*limit, 0)); out = [m, first a < m with best[a] != draft[a], else m]. */
__global__ void accept_prefix_kernel(const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                                     int32_t *out) {
    ds_cu_grid_wait();
    const int l = *limit, m = n < l ? n : l > 0 ? l : 0;
    int a = 0;
    while (a < m && best[a] == draft[a]) a++;
    out[0] = m;
    out[1] = a;
}

void ds_cu_conf_cut(ds_backend *be, ds_tensor x, ds_tensor cut, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows < 0 || x.cols < 1 || x.dtype != DS_F32 || cut.dtype != DS_F32 || cut.rows < x.rows || cut.cols < 1) {
        ds_cu_fail(cb, "conf_cut", "needs an fp32 column (%lldx%lld) and an fp32 cut a row (%lldx%lld)",
                   (long long)x.rows, (long long)x.cols, (long long)cut.rows, (long long)cut.cols);
        return;
    }
    int32_t *d;
    if (cb->reg.active) {
        if (!(d = (int32_t *)ds_cu_step_ptr(cb, "conf_cut", out, 1))) return;
    } else if (!(d = ds_cu_indices(cb, "conf_cut", 1))) {
        return;
    }
    ds_cu_launch(conf_cut_kernel, 1, 1, cb->stream, (const float *)x.data, x.stride, (int)x.rows,
                 (const float *)cut.data, cut.stride, d);
    if (!ds_cu_launched(cb, "conf_cut") || cb->reg.active) return;
    cb->stats.d2h++;
    if (ds_cu_ok(cb, "conf_cut", cudaMemcpyAsync(out, d, sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "conf_cut", cudaStreamSynchronize(cb->stream));
}

void ds_cu_accept_prefix(ds_backend *be, const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                         int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (n < 0) n = 0;
    if (!cb->reg.active) { /* host arrays: the argmaxes came back already */
        ds_accept_prefix_host(draft, best, n, limit, out);
        return;
    }
    const int32_t *dd = n ? ds_cu_step_ptr(cb, "accept_prefix", draft, n) : cb->d_step;
    const int32_t *db = n ? ds_cu_step_ptr(cb, "accept_prefix", best, n) : cb->d_step;
    const int32_t *dl = ds_cu_step_ptr(cb, "accept_prefix", limit, 1);
    int32_t *dout = (int32_t *)ds_cu_step_ptr(cb, "accept_prefix", out, 2);
    if (!dd || !db || !dl || !dout) return;
    ds_cu_launch(accept_prefix_kernel, 1, 1, cb->stream, dd, db, n, dl, dout);
    ds_cu_launched(cb, "accept_prefix");
}
