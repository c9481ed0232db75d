/* y = x W^T on the CPU.
 *
 * Narrow calls (decode, verify, drafter blocks: M <= DS_CPU_NARROW_M rows)
 * use our own dot-product kernel: memory-bound on the weights, threads split
 * the output columns, and every output element is one dot product in a fixed
 * order, so a row's result does not depend on how many rows share the call
 * (the row invariance that lossless greedy verification needs).
 * Wide calls (prefill) widen a tile of weight rows to fp32 and hand it to
 * OpenBLAS sgemm: bf16 weights never exist as a whole fp32 copy. */
#include <cblas.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

#define DS_CPU_NARROW_M 32
#define WIDE_TILE_ROWS 512
#define LANES 16

/* Fixed-order dot product: LANES independent partial sums (vectorised by
 * the compiler), then a fixed reduction tree. */
#define DEFINE_DOT(name, wtype, widen)                                       \
    static inline float name(const float *x, const wtype *w, int64_t k) {   \
        float acc[LANES] = {0};                                              \
        int64_t i = 0;                                                       \
        for (; i + LANES <= k; i += LANES)                                   \
            for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * widen(w[i + j]); \
        for (int j = 0; i < k; i++, j++) acc[j] += x[i] * widen(w[i]);       \
        for (int s = LANES / 2; s > 0; s /= 2)                               \
            for (int j = 0; j < s; j++) acc[j] += acc[j + s];                \
        return acc[0];                                                       \
    }

#define AS_F32(v) (v)
DEFINE_DOT(dot_f32, float, AS_F32)
DEFINE_DOT(dot_bf16, uint16_t, ds_bf16_to_f32)
DEFINE_DOT(dot_f16, uint16_t, ds_f16_to_f32)

static float dot_any(ds_dtype t, const float *x, const void *w, int64_t k) {
    switch (t) {
    case DS_BF16: return dot_bf16(x, w, k);
    case DS_F16: return dot_f16(x, w, k);
    default: return dot_f32(x, w, k);
    }
}

static void linear_narrow(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, const float *bias) {
    const int64_t M = x.rows, K = x.cols, N = w.rows;
    const size_t es = ds_dtype_size(w.dtype);
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const void *wr = (const char *)w.data + (size_t)(n * w.stride) * es;
        for (int64_t m = 0; m < M; m++) {
            float v = dot_any(w.dtype, (const float *)x.data + m * x.stride, wr, K);
            ((float *)out.data)[m * out.stride + n] = bias ? v + bias[n] : v;
        }
    }
}

static void linear_wide(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, const float *bias) {
    const int64_t M = x.rows, K = x.cols, N = w.rows;
    float *tile = NULL;
    if (w.dtype != DS_F32) tile = malloc((size_t)(WIDE_TILE_ROWS * K) * sizeof(float));
    for (int64_t n0 = 0; n0 < N; n0 += WIDE_TILE_ROWS) {
        int64_t tn = N - n0 < WIDE_TILE_ROWS ? N - n0 : WIDE_TILE_ROWS;
        const float *wt;
        int64_t ldw;
        if (tile) {
            size_t es = ds_dtype_size(w.dtype);
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
            for (int64_t r = 0; r < tn; r++)
                ds_to_f32(w.dtype, (const char *)w.data + (size_t)((n0 + r) * w.stride) * es, tile + r * K,
                          (size_t)K);
            wt = tile;
            ldw = K;
        } else {
            wt = (const float *)w.data + n0 * w.stride;
            ldw = w.stride;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)tn, (int)K, 1.0f, x.data,
                    (int)x.stride, wt, (int)ldw, 0.0f, (float *)out.data + n0, (int)out.stride);
    }
    free(tile);
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) ((float *)out.data)[m * out.stride + n] += bias[n];
}

void ds_cpu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    float *b = NULL;
    if (bias.data) {
        b = malloc((size_t)w.rows * sizeof *b);
        ds_to_f32(bias.dtype, bias.data, b, (size_t)w.rows);
    }
    if (x.rows <= DS_CPU_NARROW_M) linear_narrow(be, out, x, w, b);
    else linear_wide(be, out, x, w, b);
    free(b);
}
