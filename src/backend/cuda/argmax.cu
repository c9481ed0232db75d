/* Row-wise argmax on the GPU: blocks scan slices of a row with a tree
 * reduction in shared memory, a second kernel combines the slices. Ties go to the lowest
 * index and a NaN is never preferred, exactly as the CPU backend's scan
 * (which keeps the first strict maximum). Only the indices cross to the
 * host. */
#include "backend/cuda/cuda_internal.h"

#define ARGMAX_THREADS 256

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

/* Rows are cut into slices of ARGMAX_SLICE columns so that a 151936-wide
 * vocabulary row is read by ~40 blocks at once instead of one. Every thread
 * starts from (row[0], 0) as a single scan would, so NaNs lose everywhere
 * and the slices' winners combine, in slice order, to the same index. */
#define ARGMAX_SLICE 4096

__global__ void argmax_slice_kernel(const float *__restrict__ x, int64_t stride, int64_t cols, float *pv, int *pi) {
    ds_cu_grid_wait();
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    const float *row = x + (int64_t)blockIdx.y * stride;
    const int64_t c0 = (int64_t)blockIdx.x * ARGMAX_SLICE, c1 = min(cols, c0 + ARGMAX_SLICE);
    float bv = row[0];
    int bi = 0;
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        if (better(row[c], (int)c, bv, bi)) bv = row[c], bi = (int)c;
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        pv[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = sv[0];
        pi[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = si[0];
    }
}

__global__ void argmax_combine_kernel(const float *pv, const int *pi, int slices, int32_t *out) {
    ds_cu_grid_wait();
    const int r = blockIdx.x;
    float bv = pv[(int64_t)r * slices];
    int bi = pi[(int64_t)r * slices];
    for (int s = 1; s < slices; s++)
        if (better(pv[(int64_t)r * slices + s], pi[(int64_t)r * slices + s], bv, bi))
            bv = pv[(int64_t)r * slices + s], bi = pi[(int64_t)r * slices + s];
    out[r] = bi;
}

bool ds_cu_argmax_dev(ds_cuda_backend *cb, ds_tensor x, int32_t *d_out) {
    const int slices = (int)((x.cols + ARGMAX_SLICE - 1) / ARGMAX_SLICE);
    const size_t np = (size_t)x.rows * (size_t)slices;
    char *buf = (char *)ds_cu_scratch(cb, "argmax", np * (sizeof(float) + sizeof(int)));
    if (!buf) return false;
    float *pv = (float *)buf;
    int *pi = (int *)(buf + np * sizeof(float));
    ds_cu_launch(argmax_slice_kernel, dim3((unsigned)slices, (unsigned)x.rows), ARGMAX_THREADS, cb->stream,
                 (const float *)x.data, x.stride, x.cols, pv, pi);
    if (!ds_cu_launched(cb, "argmax")) return false;
    ds_cu_launch(argmax_combine_kernel, (unsigned)x.rows, 1, cb->stream, pv, pi, slices, d_out);
    return ds_cu_launched(cb, "argmax");
}

void ds_cu_argmax(ds_backend *be, ds_tensor x, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    if (cb->reg.active) { /* into the step's outputs, which come back at the region's end */
        int32_t *d = (int32_t *)ds_cu_step_ptr(cb, "argmax", out, x.rows);
        if (d) ds_cu_argmax_dev(cb, x, d);
        return;
    }
    int32_t *d = ds_cu_indices(cb, "argmax", (int)x.rows);
    if (!d || !ds_cu_argmax_dev(cb, x, d)) return;
    cb->stats.d2h++;
    if (ds_cu_ok(cb, "argmax",
                 cudaMemcpyAsync(out, d, (size_t)x.rows * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "argmax", cudaStreamSynchronize(cb->stream));
}
