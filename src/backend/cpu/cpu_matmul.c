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
#define WIDE_TILE_ROWS 128
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

typedef struct {
    ds_tensor out, x, w;
    const float *bias;
    float **tiles; /* per thread, wide path only */
} linear_job;

static void narrow_chunk(void *ctx, int64_t n0, int64_t n1, int tid) {
    const linear_job *j = ctx;
    const int64_t M = j->x.rows, K = j->x.cols;
    const size_t es = ds_dtype_size(j->w.dtype);
    for (int64_t n = n0; n < n1; n++) {
        const void *wr = (const char *)j->w.data + (size_t)(n * j->w.stride) * es;
        for (int64_t m = 0; m < M; m++) {
            float v = dot_any(j->w.dtype, (const float *)j->x.data + m * j->x.stride, wr, K);
            ((float *)j->out.data)[m * j->out.stride + n] = j->bias ? v + j->bias[n] : v;
        }
    }
}

/* Each thread widens its own tiles of weight rows and runs a
 * single-threaded sgemm on them. */
static void wide_chunk(void *ctx, int64_t t0, int64_t t1, int tid) {
    const linear_job *j = ctx;
    const int64_t M = j->x.rows, K = j->x.cols, N = j->w.rows;
    const size_t es = ds_dtype_size(j->w.dtype);
    for (int64_t t = t0; t < t1; t++) {
        int64_t n0 = t * WIDE_TILE_ROWS, tn = N - n0 < WIDE_TILE_ROWS ? N - n0 : WIDE_TILE_ROWS;
        const float *wt = (const float *)j->w.data + n0 * j->w.stride;
        int64_t ldw = j->w.stride;
        if (j->w.dtype != DS_F32) {
            float *tile = j->tiles[tid];
            for (int64_t r = 0; r < tn; r++)
                ds_to_f32(j->w.dtype, (const char *)j->w.data + (size_t)((n0 + r) * j->w.stride) * es, tile + r * K,
                          (size_t)K);
            wt = tile;
            ldw = K;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)tn, (int)K, 1.0f, j->x.data,
                    (int)j->x.stride, wt, (int)ldw, 0.0f, (float *)j->out.data + n0, (int)j->out.stride);
        if (j->bias)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = n0; n < n0 + tn; n++) ((float *)j->out.data)[m * j->out.stride + n] += j->bias[n];
    }
}

void ds_cpu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    float *b = NULL;
    if (bias.data) {
        b = malloc((size_t)w.rows * sizeof *b);
        ds_to_f32(bias.dtype, bias.data, b, (size_t)w.rows);
    }
    linear_job j = {.out = out, .x = x, .w = w, .bias = b};
    ds_pool *pool = ds_cpu_pool(be);
    if (x.rows <= DS_CPU_NARROW_M) {
        /* ~32 KB of weights per chunk: enough work to amortise a claim. */
        int64_t grain = (32768 / (int64_t)(w.cols * ds_dtype_size(w.dtype) + 1)) + 1;
        ds_pool_run(pool, w.rows, grain, narrow_chunk, &j);
    } else {
        int nt = ds_pool_threads(pool);
        float *tiles[64] = {0};
        if (w.dtype != DS_F32)
            for (int t = 0; t < nt && t < 64; t++) tiles[t] = malloc((size_t)(WIDE_TILE_ROWS * x.cols) * sizeof(float));
        j.tiles = tiles;
        ds_pool_run(pool, (w.rows + WIDE_TILE_ROWS - 1) / WIDE_TILE_ROWS, 1, wide_chunk, &j);
        for (int t = 0; t < nt && t < 64; t++) free(tiles[t]);
    }
    free(b);
}
