/* Row-wise argmax on the GPU: one block per row, each thread scans a strided
 * slice, then a tree reduction in shared memory. Ties go to the lowest
 * index and a NaN is never preferred, exactly as the CPU backend's scan
 * (which keeps the first strict maximum). Only the indices cross to the
 * host. */
#include "backend/cuda/cuda_internal.h"

#define ARGMAX_THREADS 256

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__global__ void argmax_kernel(const float *__restrict__ x, int64_t stride, int64_t cols, int32_t *out) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    const float *row = x + (int64_t)blockIdx.x * stride;
    float bv = row[0];
    int bi = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
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
    if (threadIdx.x == 0) out[blockIdx.x] = si[0];
}

void ds_cu_argmax(ds_backend *be, ds_tensor x, int32_t *out) {
    ds_cuda_backend *cb = ds_cu(be);
    if (x.rows <= 0 || x.cols <= 0) return;
    int32_t *d = (int32_t *)ds_cu_scratch(cb, "argmax", (size_t)x.rows * sizeof(int32_t));
    if (!d) return;
    argmax_kernel<<<(unsigned)x.rows, ARGMAX_THREADS, 0, cb->stream>>>((const float *)x.data, x.stride, x.cols, d);
    if (!ds_cu_launched(cb, "argmax")) return;
    if (ds_cu_ok(cb, "argmax",
                 cudaMemcpyAsync(out, d, (size_t)x.rows * sizeof(int32_t), cudaMemcpyDeviceToHost, cb->stream)))
        ds_cu_ok(cb, "argmax", cudaStreamSynchronize(cb->stream));
}
