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

/* out = base + bias, or round(base + round(bias)) in bf16 mode. */
__global__ void markov_add_kernel(float *out, const float *base, const float *bias, int64_t V, int bf16) {
    ds_cu_grid_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= V) return;
    out[i] = bf16 ? ds_cu_rbf16(base[i] + ds_cu_rbf16(bias[i])) : base[i] + bias[i];
}

void ds_cu_markov_greedy(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor w1, ds_tensor w2, bool bf16,
                         int32_t anchor, ds_tensor emb, int32_t *tokens) {
    ds_cuda_backend *cb = ds_cu(be);
    const int G = (int)base.rows;
    const int64_t V = base.cols;
    if (G <= 0 || V <= 0) return;
    const bool markov = w1.data != NULL;
    if (out.rows != G || out.cols != V ||
        (markov && (w2.rows != V || w2.cols != w1.cols || emb.rows < G || emb.cols != w1.cols))) {
        ds_cu_fail(cb, "markov_greedy", "shapes do not match: base %lldx%lld, out %lldx%lld, w1 %lldx%lld, "
                   "w2 %lldx%lld, emb %lldx%lld", (long long)base.rows, (long long)V, (long long)out.rows,
                   (long long)out.cols, (long long)w1.rows, (long long)w1.cols, (long long)w2.rows,
                   (long long)w2.cols, (long long)emb.rows, (long long)emb.cols);
        return;
    }
    if (markov && !ds_cu_float_dtype(cb, "markov_greedy", w1.dtype)) return;
    int32_t *idx = ds_cu_indices(cb, "markov_greedy", G + 1);
    float *bias = markov ? (float *)ds_cu_tmp(cb, "markov_greedy", (size_t)V * sizeof(float)) : NULL;
    if (!idx || (markov && !bias)) return;
    if (!ds_cu_ok(cb, "markov_greedy", cudaMemcpyAsync(idx, &anchor, sizeof anchor, cudaMemcpyHostToDevice, cb->stream)))
        return;
    const int r = (int)w1.cols;
    for (int k = 0; k < G; k++) {
        ds_tensor ok = ds_rows(out, k, 1);
        if (markov) {
            ds_tensor ek = ds_rows(emb, k, 1);
            ds_cu_launch(gather_row_kernel, 1, 256, cb->stream, (float *)ek.data, w1.data, w1.dtype, w1.stride, r,
                         idx + k);
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
    if (ds_cu_ok(cb, "markov_greedy",
                 cudaMemcpyAsync(tokens, idx + 1, (size_t)G * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "markov_greedy", cudaStreamSynchronize(cb->stream));
}
