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
#define NB 4 /* weight rows per micro-kernel call */

/* 8 floats; aligned(4) allows unaligned loads through it. */
typedef float v8f __attribute__((vector_size(32), aligned(4)));

static inline v8f load8(const float *p) { return *(const v8f *)p; }


typedef uint16_t v8u16 __attribute__((vector_size(16), aligned(2)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* 8 bf16 weights widened to fp32 (exact: bf16 is the top half of an fp32). */
static inline v8f load8_bf16(const uint16_t *p) {
    v8u32 u = __builtin_convertvector(*(const v8u16 *)p, v8u32) << 16;
    return (v8f)u;
}

/* The micro-kernels. Every output element (m, n) is computed the same way
 * in all of them: one 8-lane fused multiply-add accumulator over k in steps
 * of 8, a fixed reduction tree, then the scalar tail. So results do not
 * depend on which kernel (how many rows share the call, fp32 or bf16 weight
 * reads) produced them: the matmul is row-invariant, bit for bit. */
#define DEFINE_KERNELS(sfx, wtype, load, widen1)                                                      \
    /* 4 weight rows x 2 input rows */                                                                \
    static inline void k4x2_##sfx(const float *x0, const float *x1, const wtype *w, int64_t ldw,      \
                                  int64_t k, float *o0, float *o1) {                                  \
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};           \
        int64_t i = 0;                                                                                \
        for (; i + 8 <= k; i += 8) {                                                                  \
            v8f u = load8(x0 + i), v = load8(x1 + i), w0 = load(w + i), w1 = load(w + ldw + i);       \
            a0 += u * w0;                                                                             \
            b0 += v * w0;                                                                             \
            a1 += u * w1;                                                                             \
            b1 += v * w1;                                                                             \
            v8f w2 = load(w + 2 * ldw + i), w3 = load(w + 3 * ldw + i);                               \
            a2 += u * w2;                                                                             \
            b2 += v * w2;                                                                             \
            a3 += u * w3;                                                                             \
            b3 += v * w3;                                                                             \
        }                                                                                             \
        float ta[4] = {0}, tb[4] = {0};                                                               \
        for (; i < k; i++)                                                                            \
            for (int r = 0; r < 4; r++) {                                                             \
                ta[r] += x0[i] * widen1(w[r * ldw + i]);                                              \
                tb[r] += x1[i] * widen1(w[r * ldw + i]);                                              \
            }                                                                                         \
        o0[0] = hsum8(a0) + ta[0], o0[1] = hsum8(a1) + ta[1], o0[2] = hsum8(a2) + ta[2];              \
        o0[3] = hsum8(a3) + ta[3];                                                                    \
        o1[0] = hsum8(b0) + tb[0], o1[1] = hsum8(b1) + tb[1], o1[2] = hsum8(b2) + tb[2];              \
        o1[3] = hsum8(b3) + tb[3];                                                                    \
    }                                                                                                 \
    /* nb <= 4 weight rows x 1 input row */                                                           \
    static inline void kNx1_##sfx(const float *x0, const wtype *w, int64_t ldw, int64_t k, int nb,    \
                                  float *o0) {                                                        \
        v8f a[4] = {{0}, {0}, {0}, {0}};                                                              \
        int64_t i = 0;                                                                                \
        if (nb == 4) {                                                                                \
            for (; i + 8 <= k; i += 8) {                                                              \
                v8f u = load8(x0 + i);                                                                \
                a[0] += u * load(w + i);                                                              \
                a[1] += u * load(w + ldw + i);                                                        \
                a[2] += u * load(w + 2 * ldw + i);                                                    \
                a[3] += u * load(w + 3 * ldw + i);                                                    \
            }                                                                                         \
        } else {                                                                                      \
            for (; i + 8 <= k; i += 8) {                                                              \
                v8f u = load8(x0 + i);                                                                \
                for (int r = 0; r < nb; r++) a[r] += u * load(w + r * ldw + i);                       \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < nb; r++) {                                                                \
            float t = 0;                                                                              \
            for (int64_t j = i; j < k; j++) t += x0[j] * widen1(w[r * ldw + j]);                      \
            o0[r] = hsum8(a[r]) + t;                                                                  \
        }                                                                                             \
    }

static inline float hsum8(v8f s) {
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}
static inline float widen_f32(float v) { return v; }
DEFINE_KERNELS(f32, float, load8, widen_f32)
DEFINE_KERNELS(bf16, uint16_t, load8_bf16, ds_bf16_to_f32)

typedef struct {
    ds_tensor out, x, w;
    const float *bias;
    ds_backend *be;
    float **tiles; /* per thread, wide path only */
} linear_job;

static inline void store_rows(const linear_job *j, int64_t m, int64_t n, int nb, const float *res) {
    float *o = (float *)j->out.data + m * j->out.stride + n;
    for (int r = 0; r < nb; r++) o[r] = j->bias ? res[r] + j->bias[n + r] : res[r];
}

/* All input rows against NB weight rows w (fp32 or bf16 reads). */
#define DEFINE_BLOCK(sfx, wtype)                                                                   \
    static void block_##sfx(const linear_job *j, const wtype *w, int64_t ldw, int64_t n, int nb) {   \
        const int64_t M = j->x.rows, K = j->x.cols;                                                \
        const float *x = j->x.data;                                                                \
        float r0[NB], r1[NB];                                                                      \
        int64_t m = 0;                                                                             \
        if (nb == NB)                                                                              \
            for (; m + 2 <= M; m += 2) {                                                           \
                k4x2_##sfx(x + m * j->x.stride, x + (m + 1) * j->x.stride, w, ldw, K, r0, r1);     \
                store_rows(j, m, n, nb, r0);                                                       \
                store_rows(j, m + 1, n, nb, r1);                                                   \
            }                                                                                      \
        for (; m < M; m++) {                                                                       \
            kNx1_##sfx(x + m * j->x.stride, w, ldw, K, nb, r0);                                    \
            store_rows(j, m, n, nb, r0);                                                           \
        }                                                                                          \
    }
DEFINE_BLOCK(f32, float)
DEFINE_BLOCK(bf16, uint16_t)

/* Rows [n0, n1) of W, NB at a time. bf16 weights are read directly when a
 * block serves one or two input rows, and widened once into a buffer when
 * it serves more (exact either way, so the results are the same). */
static void narrow_chunk(void *ctx, int64_t n0, int64_t n1, int tid) {
    const linear_job *j = ctx;
    const int64_t M = j->x.rows, K = j->x.cols;
    const size_t es = ds_dtype_size(j->w.dtype);
    const bool direct = j->w.dtype == DS_BF16 && M <= 2;
    float *buf = j->w.dtype == DS_F32 || direct ? NULL
                                               : ds_cpu_scratch(j->be, tid, DS_SCRATCH_WEIGHTS, (size_t)(NB * K));
    for (int64_t n = n0; n < n1; n += NB) {
        int nb = n1 - n < NB ? (int)(n1 - n) : NB;
        if (direct) {
            block_bf16(j, (const uint16_t *)j->w.data + n * j->w.stride, j->w.stride, n, nb);
        } else if (buf) {
            for (int r = 0; r < nb; r++)
                ds_to_f32(j->w.dtype, (const char *)j->w.data + (size_t)((n + r) * j->w.stride) * es, buf + r * K,
                          (size_t)K);
            block_f32(j, buf, K, n, nb);
        } else {
            block_f32(j, (const float *)j->w.data + n * j->w.stride, j->w.stride, n, nb);
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
    linear_job j = {.out = out, .x = x, .w = w, .bias = b, .be = be};
    ds_pool *pool = ds_cpu_pool(be);
    if (x.rows <= DS_CPU_NARROW_M) {
        /* ~32 KB of weights per chunk (a multiple of NB rows): enough work to amortise a claim. */
        int64_t grain = (32768 / (int64_t)(w.cols * ds_dtype_size(w.dtype) + 1)) + 1;
        grain = (grain + NB - 1) / NB * NB;
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
