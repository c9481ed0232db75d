/* y = x W^T on the CPU, for every row count (decode, verify, drafter
 * blocks and prefill alike).
 *
 * Our own outer-product micro-kernels run over weight panels (cpu_panel.c):
 * x[m][k] is broadcast against 16 output features at a time, and every
 * output element (m, n) is one fused multiply-add chain over k = 0..K-1 in
 * order, whatever kernel shape, row count, vector width or thread computed
 * it. So a row's result does not depend on how many rows share the call
 * (the row invariance that lossless greedy verification needs: a prefill of
 * n tokens gives the last row that n single steps give), nor on the host:
 * the order is fixed by this code, not by a BLAS library's blocking, the
 * CPU's kernel choice or the thread count. The extra rows of a call reuse
 * each weight load instead of re-reading it; wide calls go in slabs of
 * DS_CPU_SLAB_ROWS rows, each panel staying in L1 across a slab's rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__FMA__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_kernels.h"
#include "base/vmath.h"

#define GROUP 4        /* panels per work item: 64 output features */
#define MAX_MR 6       /* input rows per micro-kernel call */
#define MIN_CHUNK_MACS 32768 /* below this a chunk is not worth a thread hand-off */
#define PREFETCH_K 96  /* k steps ahead: 3 KB of a bf16 panel */

typedef ds_v8f v8f;
typedef uint32_t v8u __attribute__((vector_size(32), aligned(4)));

/* An explicit fused multiply-add, so that every kernel shape rounds the
 * same way whatever the optimizer contracts; without the instruction, fmaf
 * lane by lane: slow, but the same single rounding, so the same bits. */
static inline __attribute__((always_inline)) v8f fma8(v8f a, v8f b, v8f c) {
#if defined(__FMA__)
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    v8f r;
    for (int i = 0; i < 8; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

/* The 16 weights of panel column k as fp32, lanes 0-7 and 8-15. */
static inline __attribute__((always_inline)) void panel_k(const void *pan, bool bf16, int64_t k, v8f *lo,
                                                         v8f *hi) {
    if (bf16) {
        v8u u = *(const v8u *)((const uint32_t *)pan + k * (DS_PANEL / 2));
        *lo = (v8f)(u << 16);
        *hi = (v8f)(u & 0xffff0000u);
    } else {
        *lo = *(const v8f *)((const float *)pan + k * DS_PANEL);
        *hi = *(const v8f *)((const float *)pan + k * DS_PANEL + 8);
    }
}

/* MR input rows x NP panels; res[r][p*16 + c]. pbytes: bytes from one
 * panel to the next. MR * NP * 2 accumulators stay in registers (at most 12
 * of the 16). */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, const void *pan, size_t pbytes,
                                                      bool bf16, int64_t K, int MR, int NP,
                                                      float res[MAX_MR][GROUP * DS_PANEL]) {
    v8f acc[MAX_MR][GROUP][2];
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) acc[r][p][0] = acc[r][p][1] = (v8f){0};
    const size_t es = bf16 ? 2 : 4;
    for (int64_t k = 0; k < K; k++) {
        v8f lo[GROUP], hi[GROUP];
        for (int p = 0; p < NP; p++) {
            const char *pp = (const char *)pan + (size_t)p * pbytes;
            /* Weights come from L3 (a model's layers do not fit in L2):
             * ask for them PREFETCH_K steps ahead. */
            __builtin_prefetch(pp + (size_t)(k + PREFETCH_K) * DS_PANEL * es);
            panel_k(pp, bf16, k, &lo[p], &hi[p]);
        }
        for (int r = 0; r < MR; r++) {
            const float xv = x[r * ldx + k];
            const v8f xb = {xv, xv, xv, xv, xv, xv, xv, xv};
            for (int p = 0; p < NP; p++) {
                acc[r][p][0] = fma8(xb, lo[p], acc[r][p][0]);
                acc[r][p][1] = fma8(xb, hi[p], acc[r][p][1]);
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) {
            memcpy(&res[r][p * DS_PANEL], &acc[r][p][0], sizeof(v8f));
            memcpy(&res[r][p * DS_PANEL + 8], &acc[r][p][1], sizeof(v8f));
        }
}

typedef uint8_t v8b __attribute__((vector_size(8), aligned(1)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* 8 bytes at p widened to 32-bit lanes (GCC scalarizes the generic form: one instruction with AVX2). */
static inline __attribute__((always_inline)) v8i bytes8(const uint8_t *p) {
#if defined(__AVX2__)
    __m128i b;
    memcpy(&b, p, 8);
    return (v8i)_mm256_cvtepu8_epi32(b);
#else
    v8b b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, v8i);
#endif
}
static inline __attribute__((always_inline)) v8f lanes_f32(v8i v) {
#if defined(__AVX2__)
    return (v8f)_mm256_cvtepi32_ps((__m256i)v);
#else
    return __builtin_convertvector(v, v8f);
#endif
}

/* tile() over quantized panels (ds_cpu_pan_kind Q8 / Q4, cpu_panel.c): each
 * weight is fma(code, scale, bias), the fp32 value the dequantized weight
 * has, then the same chain of fused multiply-adds over k as tile()'s: the
 * bits of an fp32 weight holding the dequantized values, from a quarter
 * (Q8) or an eighth (Q4) of its bytes plus the groups' scales and biases. */
#if defined(__AVX512F__)
/* With AVX-512 a panel column is one register: half the instructions of the
 * two-halves form below, lane for lane the same fused multiply-adds (the
 * same bits on either host). */
static inline __attribute__((always_inline)) void tile_q(const float *x, int64_t ldx, const void *pan, size_t pbytes,
                                                        int bits, int gs, int64_t K, int MR, int NP,
                                                        float res[MAX_MR][GROUP * DS_PANEL]) {
    __m512 acc[MAX_MR][GROUP];
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
    const size_t qk = bits == 8 ? DS_PANEL : DS_PANEL / 2, gbytes = 2 * DS_PANEL * 4 + (size_t)gs * qk; /* qk: bytes a k step */
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t g0 = 0; g0 < K; g0 += gs) {
        __m512 sc[GROUP], bi[GROUP];
        const uint8_t *qp[GROUP];
        for (int p = 0; p < NP; p++) {
            const uint8_t *gp = (const uint8_t *)pan + (size_t)p * pbytes + (size_t)(g0 / gs) * gbytes;
            sc[p] = _mm512_loadu_ps(gp);
            bi[p] = _mm512_loadu_ps(gp + 64);
            qp[p] = gp + 128;
        }
        /* Q8: one k step a 16-byte load; Q4: two (the even k in the low nibbles). */
        for (int64_t k = 0; k < gs; k += 8 / bits) {
            __m512i c[GROUP];
            for (int p = 0; p < NP; p++) {
                const uint8_t *q = qp[p] + (size_t)k * qk;
                __builtin_prefetch(q + (size_t)PREFETCH_K * qk);
                __m128i b;
                memcpy(&b, q, 16);
                c[p] = _mm512_cvtepu8_epi32(b);
            }
            for (int h = 0; h < 8 / bits; h++) {
                __m512 w[GROUP];
                for (int p = 0; p < NP; p++) {
                    const __m512i code = bits == 8 ? c[p] : h ? _mm512_srli_epi32(c[p], 4) : _mm512_and_si512(c[p], low4);
                    w[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(code), sc[p], bi[p]);
                }
                for (int r = 0; r < MR; r++) {
                    const __m512 xb = _mm512_set1_ps(x[r * ldx + g0 + k + h]);
                    for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(xb, w[p], acc[r][p]);
                }
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) _mm512_storeu_ps(&res[r][p * DS_PANEL], acc[r][p]);
}
#else
static inline __attribute__((always_inline)) void tile_q(const float *x, int64_t ldx, const void *pan, size_t pbytes,
                                                        int bits, int gs, int64_t K, int MR, int NP,
                                                        float res[MAX_MR][GROUP * DS_PANEL]) {
    v8f acc[MAX_MR][GROUP][2];
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) acc[r][p][0] = acc[r][p][1] = (v8f){0};
    const size_t qk = bits == 8 ? DS_PANEL : DS_PANEL / 2, gbytes = 2 * DS_PANEL * 4 + (size_t)gs * qk;
    for (int64_t g0 = 0; g0 < K; g0 += gs) {
        v8f sc[GROUP][2], bi[GROUP][2];
        const uint8_t *qp[GROUP];
        for (int p = 0; p < NP; p++) {
            const uint8_t *gp = (const uint8_t *)pan + (size_t)p * pbytes + (size_t)(g0 / gs) * gbytes;
            memcpy(sc[p], gp, sizeof sc[p]);
            memcpy(bi[p], gp + sizeof sc[p], sizeof bi[p]);
            qp[p] = gp + sizeof sc[p] + sizeof bi[p];
        }
        /* Q8: one k step a 16-byte load; Q4: two (the even k in the low nibbles). */
        for (int64_t k = 0; k < gs; k += 8 / bits) {
            v8i cl[GROUP], ch[GROUP];
            for (int p = 0; p < NP; p++) {
                const uint8_t *q = qp[p] + (size_t)k * qk;
                __builtin_prefetch(q + (size_t)PREFETCH_K * qk);
                cl[p] = bytes8(q);
                ch[p] = bytes8(q + 8);
            }
            for (int h = 0; h < 8 / bits; h++) {
                v8f lo[GROUP], hi[GROUP];
                for (int p = 0; p < NP; p++) {
                    const v8i a = bits == 8 ? cl[p] : h ? cl[p] >> 4 : cl[p] & 15;
                    const v8i b = bits == 8 ? ch[p] : h ? ch[p] >> 4 : ch[p] & 15;
                    lo[p] = fma8(lanes_f32(a), sc[p][0], bi[p][0]);
                    hi[p] = fma8(lanes_f32(b), sc[p][1], bi[p][1]);
                }
                for (int r = 0; r < MR; r++) {
                    const float xv = x[r * ldx + g0 + k + h];
                    const v8f xb = {xv, xv, xv, xv, xv, xv, xv, xv};
                    for (int p = 0; p < NP; p++) {
                        acc[r][p][0] = fma8(xb, lo[p], acc[r][p][0]);
                        acc[r][p][1] = fma8(xb, hi[p], acc[r][p][1]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++) {
            memcpy(&res[r][p * DS_PANEL], &acc[r][p][0], sizeof(v8f));
            memcpy(&res[r][p * DS_PANEL + 8], &acc[r][p][1], sizeof(v8f));
        }
}
#endif

/* gs: the group size of quantized panels (unused by the others). */
typedef void tile_fn(const float *x, int64_t ldx, const void *pan, size_t pbytes, int gs, int64_t K,
                     float res[MAX_MR][GROUP * DS_PANEL]);

#define TILE(MR, NP)                                                                                               \
    static void tile_bf16_##MR##x##NP(const float *x, int64_t ldx, const void *pan, size_t pbytes, int gs,         \
                                      int64_t K, float res[MAX_MR][GROUP * DS_PANEL]) {                            \
        tile(x, ldx, pan, pbytes, true, K, MR, NP, res);                                                           \
    }                                                                                                              \
    static void tile_f32_##MR##x##NP(const float *x, int64_t ldx, const void *pan, size_t pbytes, int gs,          \
                                     int64_t K, float res[MAX_MR][GROUP * DS_PANEL]) {                             \
        tile(x, ldx, pan, pbytes, false, K, MR, NP, res);                                                          \
    }                                                                                                              \
    static void tile_q8_##MR##x##NP(const float *x, int64_t ldx, const void *pan, size_t pbytes, int gs,           \
                                    int64_t K, float res[MAX_MR][GROUP * DS_PANEL]) {                              \
        tile_q(x, ldx, pan, pbytes, 8, gs, K, MR, NP, res);                                                        \
    }                                                                                                              \
    static void tile_q4_##MR##x##NP(const float *x, int64_t ldx, const void *pan, size_t pbytes, int gs,           \
                                    int64_t K, float res[MAX_MR][GROUP * DS_PANEL]) {                              \
        tile_q(x, ldx, pan, pbytes, 4, gs, K, MR, NP, res);                                                        \
    }
/* Shapes with enough independent chains (>= 8 where possible) to hide the
 * FMA latency without spilling accumulators. */
TILE(1, 4)
TILE(1, 2)
TILE(1, 1)
TILE(2, 2)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)

/* Panels per call for MR rows, and the kernel for (MR, NP). */
static int panels_for(int mr) { return mr == 1 ? 4 : mr == 2 ? 2 : 1; }
/* Quantized panels hold a group's scales and biases in registers too (4 a panel in 8 lanes, 2 in 16): with
 * 8-lane registers, fewer panels a call. */
static int panels_for_kind(ds_cpu_pan_kind k, int mr) {
#if defined(__AVX512F__)
    (void)k;
    return panels_for(mr);
#else
    return k == DS_PAN_Q8 || k == DS_PAN_Q4 ? (mr == 1 ? 2 : 1) : panels_for(mr);
#endif
}

static tile_fn *kernel_for(ds_cpu_pan_kind kind, int mr, int np) {
#define PICK(MR, NP)                                                                                               \
    return kind == DS_PAN_BF16 ? tile_bf16_##MR##x##NP                                                             \
           : kind == DS_PAN_Q8 ? tile_q8_##MR##x##NP                                                               \
           : kind == DS_PAN_Q4 ? tile_q4_##MR##x##NP                                                               \
                               : tile_f32_##MR##x##NP
    switch (mr * 8 + np) {
    case 1 * 8 + 4: PICK(1, 4);
    case 1 * 8 + 2: PICK(1, 2);
    case 1 * 8 + 1: PICK(1, 1);
    case 2 * 8 + 2: PICK(2, 2);
    case 2 * 8 + 1: PICK(2, 1);
    case 3 * 8 + 1: PICK(3, 1);
    case 4 * 8 + 1: PICK(4, 1);
    case 5 * 8 + 1: PICK(5, 1);
    default: PICK(6, 1);
    }
#undef PICK
}

/* One weight of a call and what its results go to. */
typedef struct {
    ds_tensor out, w;
    float *bias;        /* fp32 copy, or NULL */
    const void *packed; /* cached panels, or NULL: packed per call into scratch (fp32) */
    ds_cpu_pan_kind kind; /* of packed */
    int64_t groups;     /* of GROUP panels */
} panel_part;

/* A call: up to 3 weights against the same x (q/k/v), or gate and up
 * combined by SiLU, or one weight added to a residual. */
typedef struct {
    ds_tensor x;
    ds_backend *be;
    int n;
    panel_part part[3];
    ds_cpu_epilogue epi;
    ds_tensor res; /* DS_EPI_RESIDUAL: out = res + x W^T (+ bias); may be out */
} panel_job;

typedef float tile_res[MAX_MR][GROUP * DS_PANEL];

/* silu(g) * u as cpu_swiglu computes it (the same exp, the same order). */
static inline void silu_mul(float *o, const float *g, const float *u, int64_t n) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const ds_v8f gv = *(const ds_v8f *)(g + c);
        *(ds_v8f *)(o + c) = gv / (ds_v8f_set1(1.0f) + ds_v8f_exp(-gv)) * *(const ds_v8f *)(u + c);
    }
    for (; c < n; c++) o[c] = g[c] / (1.0f + ds_v8f_exp(-ds_v8f_set1(g[c]))[0]) * u[c];
}

/* Rows [m0, m0+mr) x features [n0, n0+nc) of part pt's result. */
static void store(const panel_job *j, const panel_part *pt, int64_t m0, int mr, int64_t n0, int64_t nc,
                  tile_res res, tile_res res2) {
    for (int r = 0; r < mr; r++) {
        float *o = (float *)pt->out.data + (m0 + r) * pt->out.stride + n0;
        float *v = res[r];
        if (pt->bias)
            for (int64_t c = 0; c < nc; c++) v[c] += pt->bias[n0 + c];
        switch (j->epi) {
        case DS_EPI_STORE: memcpy(o, v, (size_t)nc * sizeof *o); break;
        case DS_EPI_RESIDUAL: {
            const float *rr = (const float *)j->res.data + (m0 + r) * j->res.stride + n0;
            for (int64_t c = 0; c < nc; c++) o[c] = rr[c] + v[c]; /* as cpu_add(res, tmp) */
            break;
        }
        case DS_EPI_SWIGLU: silu_mul(o, v, res2[r], nc); break;
        }
    }
}

/* The panels [p0, p0 + np) of a part: cached, or packed now (fp32); their kind. */
static const void *part_panels(const panel_job *j, const panel_part *pt, int64_t p0, int64_t np, float *buf,
                               ds_cpu_pan_kind *kind) {
    *kind = pt->kind;
    if (pt->packed) return (const char *)pt->packed + (size_t)p0 * ds_cpu_panel_bytes(pt->w, pt->kind);
    ds_cpu_pack_f32(pt->w, p0, p0 + np, buf);
    *kind = DS_PAN_F32;
    return buf;
}

/* Work items are groups of GROUP panels, numbered across the parts (under
 * DS_EPI_SWIGLU an item is a group of gate and the same group of up). The
 * input rows go in blocks of at most MAX_MR, as even as possible (8 rows:
 * 4 + 4). */
static void panel_chunk(void *ctx, int64_t g0, int64_t g1, int tid) {
    const panel_job *j = ctx;
    const int64_t M = j->x.rows, K = j->x.cols, pstep = DS_PANEL * K;
    const int nblk = (int)((M + MAX_MR - 1) / MAX_MR);
    float *buf = NULL;
    tile_res res, res2;
    for (int64_t g = g0; g < g1; g++) {
        int pi = 0;
        int64_t lg = g;
        while (j->epi != DS_EPI_SWIGLU && lg >= j->part[pi].groups) lg -= j->part[pi++].groups;
        const panel_part *pt = &j->part[pi], *up = j->epi == DS_EPI_SWIGLU ? &j->part[1] : NULL;
        const int64_t N = pt->w.rows, P = ds_cpu_panels(N), p0 = lg * GROUP;
        const int64_t np_all = P - p0 < GROUP ? P - p0 : GROUP;
        if ((!pt->packed || (up && !up->packed)) && !buf) {
            buf = ds_cpu_scratch(j->be, "linear", tid, DS_SCRATCH_WEIGHTS, (size_t)(2 * GROUP * pstep));
            if (!buf) return; /* recorded: check() reports it */
        }
        ds_cpu_pan_kind kind, kindu = DS_PAN_F32;
        const void *pan = part_panels(j, pt, p0, np_all, buf, &kind);
        const void *panu = up ? part_panels(j, up, p0, np_all, buf + GROUP * pstep, &kindu) : NULL;
        const size_t pb = ds_cpu_panel_bytes(pt->w, kind), pbu = up ? ds_cpu_panel_bytes(up->w, kindu) : 0;
        int np_max = panels_for_kind(kind, (int)(M / nblk));
        if (up && panels_for_kind(kindu, (int)(M / nblk)) < np_max) np_max = panels_for_kind(kindu, (int)(M / nblk));
        /* Several row blocks (M > MAX_MR) take one panel at a time, so that
         * the panel is still in L1 for the next block. */
        for (int64_t p = 0; p < np_all;) {
            const int np = np_max <= np_all - p ? np_max : 1;
            const int64_t n0 = (p0 + p) * DS_PANEL, nc = N - n0 < np * DS_PANEL ? N - n0 : np * DS_PANEL;
            for (int64_t b = 0, m0 = 0; b < nblk; b++) {
                const int mr = (int)(M / nblk + (b < M % nblk));
                const float *x = (const float *)j->x.data + m0 * j->x.stride;
                kernel_for(kind, mr, np)(x, j->x.stride, (const char *)pan + (size_t)p * pb, pb, pt->w.q.group, K,
                                         res);
                if (up)
                    kernel_for(kindu, mr, np)(x, j->x.stride, (const char *)panu + (size_t)p * pbu, pbu, up->w.q.group,
                                              K, res2);
                store(j, pt, m0, mr, n0, nc, res, res2);
                m0 += mr;
            }
            p += np;
        }
    }
}

static float *bias_f32(ds_tensor bias, int64_t n) {
    if (!bias.data) return NULL;
    float *b = malloc((size_t)n * sizeof *b);
    if (b) ds_to_f32(bias.dtype, bias.data, b, (size_t)n);
    return b;
}

/* DS_X_BF16 (src/base/dtype.h): x rounded to bf16 where w is bf16, in a new [rows, cols] buffer (*copy, the
 * caller frees it) that *x then describes; *copy = NULL and x untouched otherwise (always in the fp32-x build). A
 * norm before the matmul has already run (cpu_rmsnorm), so the rounded value is bf16((x / rms) * w), as on the
 * GPU. False (reported to the backend) when the copy cannot be allocated: x is never multiplied unrounded. */
static bool x_bf16(ds_backend *be, const char *op, ds_tensor *x, ds_tensor w, float **copy) {
    *copy = NULL;
    if (!DS_X_BF16_ON || w.dtype != DS_BF16) return true;
    float *c = malloc((size_t)(x->rows * x->cols) * sizeof(float));
    if (!c) {
        ds_cpu_fail(be, op, "out of memory for x rounded to bf16 (%lldx%lld)", (long long)x->rows,
                    (long long)x->cols);
        return false;
    }
    for (int64_t r = 0; r < x->rows; r++)
        memcpy(c + r * x->cols, (const float *)x->data + r * x->stride, (size_t)x->cols * sizeof(float));
    ds_round_bf16_n(c, (size_t)(x->rows * x->cols));
    x->data = c;
    x->stride = x->cols;
    *copy = c;
    return true;
}

void ds_cpu_linear_panels(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                          const ds_tensor *biases, ds_cpu_epilogue epi, ds_tensor res) {
    if (x.rows <= 0) return;
    float *xr;
    if (!x_bf16(be, "linear", &x, ws[0], &xr)) return; /* (the weights of one call share a dtype) */
    ds_pool *pool = ds_cpu_pool(be);
    panel_job j = {.be = be, .n = n, .epi = epi};
    const int64_t slab = x.rows < DS_CPU_SLAB_ROWS ? x.rows : DS_CPU_SLAB_ROWS;
    int64_t groups = 0, macs = 0;
    for (int i = 0; i < n; i++) {
        panel_part *pt = &j.part[i];
        *pt = (panel_part){.w = ws[i], .bias = biases ? bias_f32(biases[i], ws[i].rows) : NULL};
        pt->packed = ds_cpu_pack_get(&((ds_cpu_backend *)be)->packs, ws[i], &pt->kind);
        pt->groups = (ds_cpu_panels(ws[i].rows) + GROUP - 1) / GROUP;
        if (epi != DS_EPI_SWIGLU || i == 0) groups += pt->groups;
        macs += slab * pt->groups * GROUP * DS_PANEL * x.cols;
    }
    /* A few chunks per thread (a late thread does not hold the others up),
     * none smaller than MIN_CHUNK_MACS. */
    const int64_t item_macs = macs / (groups ? groups : 1) + 1;
    int64_t grain = groups / (4 * ds_pool_threads(pool));
    if (grain * item_macs < MIN_CHUNK_MACS) grain = (MIN_CHUNK_MACS + item_macs - 1) / item_macs;
    /* Wide calls (prefill) slab by slab: a slab's rows share each panel load
     * (one pass over the weights per slab), and a row's result is the same
     * in any slab. */
    for (int64_t m0 = 0; m0 < x.rows; m0 += slab) {
        const int64_t ms = x.rows - m0 < slab ? x.rows - m0 : slab;
        j.x = ds_rows(x, m0, ms);
        for (int i = 0; i < n; i++) j.part[i].out = ds_rows(outs[i], m0, ms);
        j.res = res.data ? ds_rows(res, m0, ms) : res;
        ds_pool_run(pool, groups, grain, panel_chunk, &j);
    }
    for (int i = 0; i < n; i++) free(j.part[i].bias);
    free(xr);
}

void ds_cpu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias) {
    ds_cpu_linear_panels(be, 1, &out, x, &w, &bias, DS_EPI_STORE, ds_no_tensor());
}
