/* Every op of the CUDA backend against the CPU backend (the oracle) on
 * random inputs, with a normalized error bound per op: max |gpu - cpu| /
 * max |cpu| over the output. Bounds: fp32 reductions in another order
 * (linear, attention, rmsnorm) 2e-5; transcendental element-wise ops and
 * RoPE 2e-6; data movement, add, scale, bf16 rounding exact.
 * Row invariance, bit for bit on the GPU: a row of linear / attention
 * computed in an M-row call equals the same row computed alone (decode vs
 * verify), across the kernel's row tiers, aligned and unaligned inputs, and
 * attention rows whose keys span several chunks, windows and rings.
 * Skips (exit 77) where no CUDA device can be used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_config.h"
#include "base/rng.h"
#include "draft/markov_bound.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "sample/verify.h"
#include "testlib.h"

static ds_backend *gpu, *cpu;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rand_vec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

/* One tensor on each backend holding the same values. */
typedef struct {
    ds_tensor g, c;
    void *host; /* weight bytes the CPU tensor may point into */
} pair;

static pair act(int64_t rows, int64_t cols, const float *v) {
    pair p = {0};
    ds_error *e = gpu->ops->alloc(gpu, DS_F32, rows, cols, &p.g);
    if (!e) e = cpu->ops->alloc(cpu, DS_F32, rows, cols, &p.c);
    if (e) {
        CHECK(0, "alloc: %s", ds_error_message(e));
        ds_error_free(e);
        return p;
    }
    if (v) {
        gpu->ops->upload(gpu, p.g, v);
        cpu->ops->upload(cpu, p.c, v);
    }
    return p;
}

static pair act_rand(int64_t rows, int64_t cols, float scale) {
    float *v = rand_vec((size_t)(rows * cols), scale);
    pair p = act(rows, cols, v);
    free(v);
    return p;
}

/* f16 bits of a value exactly representable as a normal f16 (or zero). */
static uint16_t f16_exact(float f) {
    if (f == 0) return 0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    return (uint16_t)(sign | ((exp - 112) << 10) | (man >> 13));
}

/* p->host (rows x cols of dt) as a weight on both backends. */
static void weight_load(pair *p, ds_dtype dt, int64_t rows, int64_t cols) {
    const size_t nbytes = (size_t)(rows * cols) * ds_dtype_size(dt);
    ds_st_tensor st = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = p->host, .nbytes = nbytes};
    ds_error *e = gpu->ops->weight(gpu, &st, rows, cols, &p->g);
    if (!e) e = cpu->ops->weight(cpu, &st, rows, cols, &p->c);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
}

/* A [rows, cols] weight of dtype dt. Values are multiples of 2^-10 in
 * (-1, 1): exact in fp32, bf16 (up to its 8 bits) and f16. */
static pair weight(ds_dtype dt, int64_t rows, int64_t cols) {
    pair p = {0};
    size_t n = (size_t)(rows * cols), es = ds_dtype_size(dt);
    p.host = malloc(n * es + 16);
    for (size_t i = 0; i < n; i++) {
        float f = (float)((int)(frand() * 1023.0f)) / 1024.0f;
        if (dt == DS_BF16) {
            uint16_t b = ds_f32_to_bf16(f);
            memcpy((char *)p.host + i * 2, &b, 2);
        } else if (dt == DS_F16) {
            uint16_t h = f16_exact(f);
            memcpy((char *)p.host + i * 2, &h, 2);
        } else {
            memcpy((char *)p.host + i * 4, &f, 4);
        }
    }
    weight_load(&p, dt, rows, cols);
    return p;
}

static void release(pair *p) {
    gpu->ops->release(gpu, &p->g);
    cpu->ops->release(cpu, &p->c);
    free(p->host);
    p->host = NULL;
}

static float *fetch(ds_backend *be, ds_tensor t) {
    size_t n = (size_t)(t.rows * t.cols);
    float *v = malloc((n ? n : 1) * sizeof *v);
    be->ops->download(be, t, v);
    return v;
}

static void check_gpu_ok(const char *what) {
    ds_error *e = ds_backend_check(gpu);
    if (e) {
        CHECK(0, "%s: %s", what, ds_error_message(e));
        ds_error_free(e);
    }
}

/* Normalized error of the GPU result against the CPU's; fails above tol. */
static double compare(ds_tensor g, ds_tensor c, double tol, const char *what) {
    check_gpu_ok(what);
    float *a = fetch(gpu, g), *b = fetch(cpu, c);
    double err = rel_err_max(a, b, (size_t)(g.rows * g.cols));
    printf("  %-44s err %.2e (bound %.0e)\n", what, err, tol);
    CHECK(err <= tol, "%s: normalized error %.3g over %.3g", what, err, tol);
    free(a);
    free(b);
    return err;
}

/* ---- data movement ------------------------------------------------------ */

static void test_memory(void) {
    const int64_t R = 37, C = 129;
    float *v = rand_vec((size_t)(R * C), 3.0f);
    pair a = act(R, C, v);
    float *back = fetch(gpu, a.g);
    CHECK(!memcmp(back, v, (size_t)(R * C) * 4), "upload/download round trip differs");
    /* Strided views: copy a column window between two row ranges. */
    pair b = act(R, 2 * C, NULL);
    ds_tensor src = ds_cols(ds_rows(a.g, 3, 20), 5, 100), dst = ds_cols(ds_rows(b.g, 10, 20), 77, 100);
    gpu->ops->copy(gpu, dst, src);
    cpu->ops->copy(cpu, ds_cols(ds_rows(b.c, 10, 20), 77, 100), ds_cols(ds_rows(a.c, 3, 20), 5, 100));
    compare(b.g, b.c, 0, "copy (strided views)");
    /* alloc zero-fills. */
    float *z = fetch(gpu, b.g);
    CHECK(z[0] == 0 && z[2 * C * R - 1] == 0, "alloc did not zero-fill");
    free(z);
    free(back);
    free(v);
    release(&a);
    release(&b);
}

static void test_embed(void) {
    const ds_dtype dts[] = {DS_F32, DS_BF16, DS_F16};
    for (int t = 0; t < 3; t++) {
        pair table = weight(dts[t], 1000, 200);
        int32_t ids[70];
        for (int i = 0; i < 70; i++) ids[i] = (int32_t)((frand() + 1.0f) * 499.0f);
        pair out = act(70, 200, NULL);
        const float scale = t == 1 ? 7.5f : 1.0f;
        gpu->ops->embed(gpu, out.g, table.g, ids, scale);
        cpu->ops->embed(cpu, out.c, table.c, ids, scale);
        char what[64];
        snprintf(what, sizeof what, "embed %s x%.1f (70 rows)", ds_dtype_name(dts[t]), scale);
        compare(out.g, out.c, 0, what);
        release(&table);
        release(&out);
    }
}

/* ---- linear ------------------------------------------------------------- */

static void linear_case(ds_dtype dt, int64_t M, int64_t N, int64_t K, bool bias, bool odd_stride) {
    pair w = weight(dt, N, K), b = {0};
    if (bias) b = weight(DS_F32, 1, N);
    /* odd_stride: x is a column window of a wider buffer (no 16-byte loads). */
    pair xb = act_rand(M, K + (odd_stride ? 3 : 0), 1.0f);
    ds_tensor xg = ds_cols(xb.g, odd_stride ? 1 : 0, K), xc = ds_cols(xb.c, odd_stride ? 1 : 0, K);
    pair out = act(M, N, NULL);
    gpu->ops->linear(gpu, out.g, xg, w.g, bias ? b.g : ds_no_tensor());
    cpu->ops->linear(cpu, out.c, xc, w.c, bias ? b.c : ds_no_tensor());
    char what[96];
    snprintf(what, sizeof what, "linear %s M=%lld N=%lld K=%lld%s%s", ds_dtype_name(dt), (long long)M, (long long)N,
             (long long)K, bias ? " +bias" : "", odd_stride ? " unaligned" : "");
    compare(out.g, out.c, 2e-5, what);
    release(&w);
    if (bias) release(&b);
    release(&xb);
    release(&out);
}

static void test_linear_vs_cpu(void) {
    const ds_dtype dts[] = {DS_BF16, DS_F32, DS_F16};
    const int64_t Ms[] = {1, 2, 3, 5, 8, 13, 32, 33, 100};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) linear_case(dts[t], Ms[i], 300, 1024, i % 2, false);
    linear_case(DS_BF16, 4, 257, 300, true, false);   /* K not a multiple of 8 */
    linear_case(DS_BF16, 5, 130, 1000, false, true);  /* unaligned x */
    linear_case(DS_F32, 7, 64, 4096, true, true);
    linear_case(DS_BF16, 64, 1500, 4096, true, false); /* cuBLAS with widened tiles */
    linear_case(DS_F32, 40, 96, 33, false, true);      /* cuBLAS, odd shapes */
}

/* Row i of an M-row call == row i computed alone, bit for bit, for every
 * narrow row count and for aligned and unaligned inputs. */
static void test_linear_row_invariance(void) {
    /* bf16 with K % 32 == 0 takes the tensor-core kernel, the rest the CUDA-core one. */
    /* bf16 rows of at most 8 take the persistent ring kernel, more rows the
     * one-block-per-tile one: the same sums in the same order. K = 1120 ends
     * on a partial ring stage, and 4000 rows make more tiles than SMs. */
    const ds_dtype dts[] = {DS_BF16, DS_BF16, DS_BF16, DS_F32, DS_F16};
    const int64_t Ks[] = {2048, 1120, 2056, 2056, 2056}, Ns[] = {515, 4000, 515, 515, 515};
    const int64_t MAXM = 32;
    for (int t = 0; t < 5; t++) {
        const int64_t K = Ks[t], N = Ns[t];
        pair w = weight(dts[t], N, K), b = weight(DS_BF16, 1, N);
        pair x = act_rand(MAXM, K, 1.0f);
        pair xu = act(MAXM, K + 1, NULL); /* the same rows at an odd stride */
        gpu->ops->copy(gpu, ds_cols(xu.g, 0, K), x.g);
        pair ref = act(MAXM, N, NULL), out = act(MAXM, N, NULL);
        for (int64_t i = 0; i < MAXM; i++)
            gpu->ops->linear(gpu, ds_rows(ref.g, i, 1), ds_rows(x.g, i, 1), w.g, b.g);
        float *want = fetch(gpu, ref.g);
        const int64_t Ms[] = {2, 3, 4, 5, 8, 9, 17, 32};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int u = 0; u < 2; u++) {
                const int64_t M = Ms[mi];
                ds_tensor xin = u ? ds_cols(ds_rows(xu.g, 0, M), 0, K) : ds_rows(x.g, 0, M);
                gpu->ops->linear(gpu, ds_rows(out.g, 0, M), xin, w.g, b.g);
                float *got = fetch(gpu, ds_rows(out.g, 0, M));
                int bad = -1;
                for (int64_t i = 0; i < M && bad < 0; i++)
                    if (memcmp(got + i * N, want + i * N, (size_t)N * 4)) bad = (int)i;
                CHECK(bad < 0, "linear %s: row %d of an M=%lld%s call differs from the 1-row call",
                      ds_dtype_name(dts[t]), bad, (long long)M, u ? " unaligned" : "");
                free(got);
            }
        printf("  linear %s N=%lld K=%lld: rows of M=2..32 calls (aligned and not) == 1-row calls, bitwise\n",
               ds_dtype_name(dts[t]), (long long)N, (long long)K);
        check_gpu_ok("linear row invariance");
        free(want);
        release(&w);
        release(&b);
        release(&x);
        release(&xu);
        release(&ref);
        release(&out);
    }
}

/* ---- fused linear ops ----------------------------------------------------- */

/* The GPU's fused ops against the CPU's unfused sequence (the CPU backend
 * has no fused ops, so the ds_* helpers run linear + add / swiglu there). */
static void fused_case(ds_dtype dt, int64_t M, int64_t K) {
    const int64_t N = 300, NK = 64;
    pair wq = weight(dt, N, K), wk = weight(dt, NK, K), wv = weight(dt, NK, K), bq = weight(DS_F32, 1, N);
    pair wo = weight(dt, K, N), wg = weight(dt, N, K), wu = weight(dt, N, K);
    pair x = act_rand(M, K, 1.0f), att = act_rand(M, N, 1.0f), res = act_rand(M, K, 1.0f);
    pair q = act(M, N, NULL), k = act(M, NK, NULL), v = act(M, NK, NULL), h = act(M, N, NULL), tmp = act(M, N, NULL);
    pair tmpk = act(M, K, NULL);
    char what[96];
    const ds_tensor og[3] = {q.g, k.g, v.g}, wgs[3] = {wq.g, wk.g, wv.g}, bg[3] = {bq.g, ds_no_tensor(), ds_no_tensor()};
    const ds_tensor oc[3] = {q.c, k.c, v.c}, wcs[3] = {wq.c, wk.c, wv.c}, bc[3] = {bq.c, ds_no_tensor(), ds_no_tensor()};
    ds_linear_multi(gpu, 3, og, x.g, wgs, bg);
    ds_linear_multi(cpu, 3, oc, x.c, wcs, bc);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "linear_multi %s M=%lld K=%lld, output %d", ds_dtype_name(dt), (long long)M,
                 (long long)K, i);
        compare(og[i], oc[i], 2e-5, what);
    }
    /* Residual in place, as the model uses it. */
    ds_linear_residual(gpu, res.g, att.g, wo.g, ds_no_tensor(), res.g, tmpk.g);
    ds_linear_residual(cpu, res.c, att.c, wo.c, ds_no_tensor(), res.c, tmpk.c);
    snprintf(what, sizeof what, "linear_residual %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(res.g, res.c, 2e-5, what);
    ds_linear_swiglu(gpu, h.g, x.g, wg.g, wu.g, tmp.g);
    ds_linear_swiglu(cpu, h.c, x.c, wg.c, wu.c, tmp.c);
    snprintf(what, sizeof what, "linear_swiglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    /* The input RMSNorm fused in front (the GPU recomputes each row's rms in the matmul). */
    pair nw = weight(M % 2 ? DS_F32 : DS_BF16, 1, K), xn = act(M, K, NULL); /* both norm dtypes */
    ds_rmsnorm_linear_multi(gpu, 3, og, x.g, nw.g, 1e-6f, wgs, bg, xn.g);
    ds_rmsnorm_linear_multi(cpu, 3, oc, x.c, nw.c, 1e-6f, wcs, bc, xn.c);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "rmsnorm_linear_multi %s M=%lld, output %d", ds_dtype_name(dt), (long long)M, i);
        compare(og[i], oc[i], 2e-5, what);
    }
    ds_rmsnorm_linear_swiglu(gpu, h.g, x.g, nw.g, 1e-6f, wg.g, wu.g, xn.g, tmp.g);
    ds_rmsnorm_linear_swiglu(cpu, h.c, x.c, nw.c, 1e-6f, wg.c, wu.c, xn.c, tmp.c);
    snprintf(what, sizeof what, "rmsnorm_linear_swiglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    /* Gemma's MLP: the GELU-tanh epilogue (the CPU: rmsnorm, two linears, geglu_tanh) */
    ds_rmsnorm_linear_geglu(gpu, h.g, x.g, nw.g, 1e-6f, wg.g, wu.g, xn.g, tmp.g);
    ds_rmsnorm_linear_geglu(cpu, h.c, x.c, nw.c, 1e-6f, wg.c, wu.c, xn.c, tmp.c);
    snprintf(what, sizeof what, "rmsnorm_linear_geglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    pair *all[] = {&wq, &wk, &wv, &bq, &wo, &wg, &wu, &x, &att, &res, &q, &k, &v, &h, &tmp, &tmpk, &nw, &xn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
}

static void test_fused_linear(void) {
    const int64_t Ms[] = {1, 3, 8, 9, 32, 40};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        fused_case(DS_BF16, Ms[i], 1024); /* tensor cores up to M = 32 */
        fused_case(DS_F32, Ms[i], 520);   /* the unfused fallback */
    }
    fused_case(DS_BF16, 4, 1000); /* K % 32 != 0: fallback for bf16 too */
}

/* Fused ops keep rows invariant too: rows of an M-row call == 1-row calls. */
static void test_fused_row_invariance(void) {
    /* N = 288: as o_proj's K, at least one ring box (256) and a partial ring stage (288 of 512). */
    const int64_t N = 288, K = 4096, MAXM = 17;
    pair wg = weight(DS_BF16, N, K), wu = weight(DS_BF16, N, K), wo = weight(DS_BF16, K, N);
    pair x = act_rand(MAXM, K, 1.0f), att = act_rand(MAXM, N, 1.0f);
    pair h1 = act(MAXM, N, NULL), hm = act(MAXM, N, NULL), r1 = act_rand(MAXM, K, 1.0f), rm = act(MAXM, K, NULL);
    gpu->ops->copy(gpu, rm.g, r1.g);
    pair r8 = act(MAXM, K, NULL); /* rows 0-7 as one ring call, 8-12 as another (o_proj's 32-row tiles) */
    gpu->ops->copy(gpu, r8.g, r1.g);
    for (int64_t i = 0; i < MAXM; i++) {
        gpu->ops->linear_swiglu(gpu, ds_rows(h1.g, i, 1), ds_rows(x.g, i, 1), wg.g, wu.g);
        gpu->ops->linear_residual(gpu, ds_rows(r1.g, i, 1), ds_rows(att.g, i, 1), wo.g, ds_no_tensor(),
                                  ds_rows(r1.g, i, 1));
    }
    gpu->ops->linear_swiglu(gpu, hm.g, x.g, wg.g, wu.g);
    gpu->ops->linear_residual(gpu, rm.g, att.g, wo.g, ds_no_tensor(), rm.g);
    gpu->ops->linear_residual(gpu, ds_rows(r8.g, 0, 8), ds_rows(att.g, 0, 8), wo.g, ds_no_tensor(), ds_rows(r8.g, 0, 8));
    gpu->ops->linear_residual(gpu, ds_rows(r8.g, 8, 5), ds_rows(att.g, 8, 5), wo.g, ds_no_tensor(), ds_rows(r8.g, 8, 5));
    /* The fused-norm variant too: each row's rms must not depend on the others. */
    pair nw = weight(DS_BF16, 1, K), n1 = act(MAXM, N, NULL), nm = act(MAXM, N, NULL);
    for (int64_t i = 0; i < MAXM; i++)
        gpu->ops->rmsnorm_linear_swiglu(gpu, ds_rows(n1.g, i, 1), ds_rows(x.g, i, 1), nw.g, 1e-6f, wg.g, wu.g);
    gpu->ops->rmsnorm_linear_swiglu(gpu, nm.g, x.g, nw.g, 1e-6f, wg.g, wu.g);
    float *e1 = fetch(gpu, n1.g), *em = fetch(gpu, nm.g);
    CHECK(!memcmp(e1, em, (size_t)(MAXM * N) * 4), "rmsnorm_linear_swiglu: rows of a 17-row call differ from 1-row calls");
    free(e1), free(em);
    for (int64_t i = 0; i < MAXM; i++)
        gpu->ops->rmsnorm_linear_geglu(gpu, ds_rows(n1.g, i, 1), ds_rows(x.g, i, 1), nw.g, 1e-6f, wg.g, wu.g);
    gpu->ops->rmsnorm_linear_geglu(gpu, nm.g, x.g, nw.g, 1e-6f, wg.g, wu.g);
    e1 = fetch(gpu, n1.g), em = fetch(gpu, nm.g);
    CHECK(!memcmp(e1, em, (size_t)(MAXM * N) * 4),
          "rmsnorm_linear_geglu: rows of a 17-row call differ from 1-row calls");
    free(e1), free(em);
    float *a = fetch(gpu, h1.g), *b = fetch(gpu, hm.g), *c = fetch(gpu, r1.g), *d = fetch(gpu, rm.g);
    CHECK(!memcmp(a, b, (size_t)(MAXM * N) * 4), "linear_swiglu: rows of a 17-row call differ from 1-row calls");
    CHECK(!memcmp(c, d, (size_t)(MAXM * K) * 4), "linear_residual: rows of a 17-row call differ from 1-row calls");
    float *e8 = fetch(gpu, r8.g);
    CHECK(!memcmp(c, e8, (size_t)(13 * K) * 4), "linear_residual: rows of 8- and 5-row calls differ from 1-row calls");
    free(e8);
    release(&r8);
    /* rmsnorm_linear_multi (QKV) the same way: two projections of one normed x (into n1 / h1, nm / hm). */
    const ds_tensor w2[2] = {wg.g, wu.g}, b2[2] = {ds_no_tensor(), ds_no_tensor()}, om[2] = {nm.g, hm.g};
    for (int64_t i = 0; i < MAXM; i++) {
        const ds_tensor o1[2] = {ds_rows(n1.g, i, 1), ds_rows(h1.g, i, 1)};
        gpu->ops->rmsnorm_linear_multi(gpu, 2, o1, ds_rows(x.g, i, 1), nw.g, 1e-6f, w2, b2);
    }
    gpu->ops->rmsnorm_linear_multi(gpu, 2, om, x.g, nw.g, 1e-6f, w2, b2);
    float *q1[2] = {fetch(gpu, n1.g), fetch(gpu, h1.g)}, *qm[2] = {fetch(gpu, nm.g), fetch(gpu, hm.g)};
    for (int o = 0; o < 2; o++) {
        CHECK(!memcmp(q1[o], qm[o], (size_t)(MAXM * N) * 4),
              "rmsnorm_linear_multi output %d: rows of a 17-row call differ from 1-row calls", o);
        free(q1[o]), free(qm[o]);
    }
    release(&nw), release(&n1), release(&nm);
    printf("  linear_swiglu, linear_residual, rmsnorm_linear_swiglu / _geglu, rmsnorm_linear_multi bf16: rows of a "
           "17-row call == 1-row calls, bitwise (linear_residual: of 8- and 5-row calls too)\n");
    free(a), free(b), free(c), free(d);
    check_gpu_ok("fused row invariance");
    pair *all[] = {&wg, &wu, &wo, &x, &att, &h1, &hm, &r1, &rm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
}

/* DS_X_BF16: a fused norm computes the same bits on every path (the ring at 1 and 8 rows, the per-tile kernel at
 * 20, the wide path at 64, the CPU): x * w rounds to the same bf16 values, and each row's 1 / rms, taken in the
 * tile order everywhere, scales the products' sums. Through an identity weight the output is 1 / rms times x * w's
 * rounded value (one exact product a sum), so the rows must agree bit for bit; an rms one ulp apart moves them. */
static void test_normed_x_paths(void) {
    if (!DS_X_BF16_ON) {
        printf("  (the fp32-x build: x is not rounded, nothing to check)\n");
        return;
    }
    const int64_t K = 2048, MAXM = 64;
    pair eye = {0};
    eye.host = calloc((size_t)(K * K), 2);
    for (int64_t i = 0; i < K; i++) ((uint16_t *)eye.host)[i * K + i] = ds_f32_to_bf16(1.0f);
    weight_load(&eye, DS_BF16, K, K);
    pair nw = weight(DS_BF16, 1, K), x = act_rand(MAXM, K, 3.0f), out = act(MAXM, K, NULL), xn = act(MAXM, K, NULL);
    const ds_tensor b1[1] = {ds_no_tensor()};
    ds_rmsnorm_linear_multi(cpu, 1, &out.c, x.c, nw.c, 1e-6f, &eye.c, b1, xn.c); /* (the CPU: norm, then linear) */
    float *want = fetch(cpu, out.c);
    const int64_t Ms[] = {1, 8, 20, MAXM};
    for (size_t c = 0; c < sizeof Ms / sizeof Ms[0]; c++) {
        for (int64_t r0 = 0; r0 + Ms[c] <= MAXM; r0 += Ms[c] == 1 ? 21 : Ms[c]) {
            const ds_tensor o = ds_rows(out.g, r0, Ms[c]);
            gpu->ops->rmsnorm_linear_multi(gpu, 1, &o, ds_rows(x.g, r0, Ms[c]), nw.g, 1e-6f, &eye.g, b1);
        }
        check_gpu_ok("rmsnorm_linear_multi through the identity");
        float *got = fetch(gpu, out.g);
        int64_t bad = -1, nbad = 0;
        for (int64_t r = 0; r < MAXM; r++) {
            if (Ms[c] == 1 && r % 21) continue;
            for (int64_t k = 0; k < K; k++)
                if (memcmp(&got[r * K + k], &want[r * K + k], 4)) bad = bad < 0 ? r * K + k : bad, nbad++;
        }
        printf("  rmsnorm_linear_multi bf16 through the identity, %2lld-row calls: %lld values differ from the CPU's\n",
               (long long)Ms[c], (long long)nbad);
        CHECK(nbad == 0, "%lld-row calls: %lld rounded values differ from the CPU's (first: row %lld, k %lld: %.9g vs %.9g)",
              (long long)Ms[c], (long long)nbad, (long long)(bad / K), (long long)(bad % K), got[bad], want[bad]);
        free(got);
    }
    free(want);
    release(&eye), release(&nw), release(&x), release(&out), release(&xn);
}

/* ---- attention ---------------------------------------------------------- */

typedef struct {
    const char *name;
    int H, KVH, D, Dv;
    bool causal;
    int window, ring;
    int p0, M; /* query rows at positions p0..p0+M-1 */
    int n_keys; /* non-causal: keys visible to every row */
} attn_case;

static void attention_case(const attn_case *ac) {
    const int cache_rows = ac->ring ? ac->ring : (ac->causal ? ac->p0 + ac->M : ac->n_keys);
    const int n_keys = ac->causal ? ac->p0 + ac->M : ac->n_keys;
    pair q = act_rand(ac->M, (int64_t)ac->H * ac->D, 1.0f);
    pair k = act_rand(cache_rows, (int64_t)ac->KVH * ac->D, 1.0f);
    pair v = act_rand(cache_rows, (int64_t)ac->KVH * ac->Dv, 1.0f);
    pair out = act(ac->M, (int64_t)ac->H * ac->Dv, NULL);
    int32_t *pos = malloc((size_t)ac->M * sizeof *pos);
    for (int i = 0; i < ac->M; i++) pos[i] = ac->p0 + i;
    ds_attn_params p = {.n_heads = ac->H, .n_kv_heads = ac->KVH, .head_dim = ac->D, .v_head_dim = ac->Dv,
                        .n_keys = n_keys, .causal = ac->causal, .window = ac->window, .ring_size = ac->ring,
                        .scale = 1.0f / sqrtf((float)ac->D), .q_pos = pos};
    gpu->ops->attention(gpu, out.g, q.g, k.g, v.g, &p);
    cpu->ops->attention(cpu, out.c, q.c, k.c, v.c, &p);
    char what[96];
    snprintf(what, sizeof what, "attention %s", ac->name);
    compare(out.g, out.c, 2e-5, what);
    /* Each row alone, as decode sees it: n_keys = its position + 1 when causal. Calls of DS_CU_PREFILL_ROWS
     * (33) rows or more (prefill chunks: more than any verify's gamma + 1) run the tiled kernel and are held to
     * the CPU only. */
    float *all = fetch(gpu, out.g);
    pair one = act(1, (int64_t)ac->H * ac->Dv, NULL);
    int bad = -1;
    for (int i = 0; i < ac->M && ac->M <= 32 && bad < 0; i++) {
        ds_attn_params p1 = p;
        p1.q_pos = pos + i;
        if (ac->causal) p1.n_keys = pos[i] + 1;
        gpu->ops->attention(gpu, one.g, ds_rows(q.g, i, 1), k.g, v.g, &p1);
        float *r = fetch(gpu, one.g);
        if (memcmp(r, all + (size_t)i * ac->H * ac->Dv, (size_t)ac->H * ac->Dv * 4)) bad = i;
        free(r);
    }
    CHECK(bad < 0, "attention %s: row %d of the %d-row call differs from the row alone", ac->name, bad, ac->M);
    check_gpu_ok(what);
    free(all);
    free(pos);
    release(&q);
    release(&k);
    release(&v);
    release(&out);
    release(&one);
}

static void attention_packed_cases(void);

static void test_attention(void) {
    const attn_case cases[] = {
        {"decode-like D=64 GQA 4/2, 1 row at 40", 4, 2, 64, 64, true, 0, 0, 40, 1, 0},
        {"verify D=64 GQA 4/2, 8 rows at 3", 4, 2, 64, 64, true, 0, 0, 3, 8, 0},
        {"verify D=128 16/8 across chunk 256", 16, 8, 128, 128, true, 0, 0, 250, 9, 0},
        {"verify D=128 8/1 rows at 700 (3 chunks)", 8, 1, 128, 128, true, 0, 0, 700, 5, 0},
        {"prefill D=16 4/2, 70 rows at 0", 4, 2, 16, 16, true, 0, 0, 0, 70, 0},
        {"prefill D=128 GQA 8/2, 150 rows at 100 (key tiles past 256)", 8, 2, 128, 128, true, 0, 0, 100, 150, 0},
        {"prefill D=64 window 40, 70 rows at 30", 4, 2, 64, 64, true, 40, 0, 30, 70, 0},
        {"prefill D=128 window 100 ring 192, 40 rows at 300", 4, 1, 128, 128, true, 100, 192, 300, 40, 0},
        {"prefill non-causal D=64 Dv=32, 40 rows, 90 keys", 4, 2, 64, 32, false, 0, 0, 0, 40, 90},
        {"prefill D=256 GQA 8/4, 100 rows at 20 (2 row blocks)", 8, 4, 256, 256, true, 0, 0, 20, 100, 0},
        {"prefill D=256 window 100 ring 192, 40 rows at 300", 4, 2, 256, 256, true, 100, 192, 300, 40, 0},
        {"prefill D=512 GQA 4/1, 50 rows at 10 (4 row blocks)", 4, 1, 512, 512, true, 0, 0, 10, 50, 0},
        {"prefill D=512 window 60 ring 128, 36 rows at 500", 2, 1, 512, 512, true, 60, 128, 500, 36, 0},
        {"prefill non-causal D=512 Dv=256, 34 rows, 70 keys", 2, 1, 512, 256, false, 0, 0, 0, 34, 70},
        {"D=256 sliding window 100, ring 128", 2, 1, 256, 256, true, 100, 128, 300, 6, 0},
        {"D=512 window 300 ring 512 at 1000", 2, 2, 512, 512, true, 300, 512, 1000, 4, 0},
        {"drafter non-causal D=64, 7 rows, 300 keys", 4, 2, 64, 64, false, 0, 0, 293, 7, 300},
        {"non-causal D=128 Dv=64, 5 rows, 20 keys", 4, 4, 128, 64, false, 0, 0, 15, 5, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(&cases[i]);
    attention_packed_cases();
}

/* A block packs the R query heads of a kv head it can (R = 4 at GQA 4 and
 * 8, 2 at GQA 2; heads up to 128): each head's result must be the same
 * bits as that head computed alone (one head, one kv head: R = 1; its grid
 * of M blocks also loads keys two groups ahead), so neither the packing nor
 * the loads' depth can change what a row gets. */
static void packed_case(const char *name, int H, int KVH, int D, int p0, int M) {
    const int n_keys = p0 + M;
    pair q = act_rand(M, (int64_t)H * D, 1.0f), k = act_rand(n_keys, (int64_t)KVH * D, 1.0f);
    pair v = act_rand(n_keys, (int64_t)KVH * D, 1.0f), out = act(M, (int64_t)H * D, NULL), one = act(M, D, NULL);
    int32_t *pos = malloc((size_t)M * sizeof *pos);
    for (int i = 0; i < M; i++) pos[i] = p0 + i;
    ds_attn_params p = {.n_heads = H, .n_kv_heads = KVH, .head_dim = D, .v_head_dim = D, .n_keys = n_keys,
                        .causal = true, .scale = 1.0f / sqrtf((float)D), .q_pos = pos};
    gpu->ops->attention(gpu, out.g, q.g, k.g, v.g, &p);
    float *all = fetch(gpu, out.g);
    int bad = -1;
    for (int h = 0; h < H && bad < 0; h++) { /* head h alone: column views of its q and its kv head */
        const int kvh = h / (H / KVH);
        ds_tensor qh = q.g, kh = k.g, vh = v.g;
        qh.data = (float *)qh.data + (int64_t)h * D, qh.cols = D;
        kh.data = (float *)kh.data + (int64_t)kvh * D, kh.cols = D;
        vh.data = (float *)vh.data + (int64_t)kvh * D, vh.cols = D;
        ds_attn_params p1 = p;
        p1.n_heads = p1.n_kv_heads = 1;
        gpu->ops->attention(gpu, one.g, qh, kh, vh, &p1);
        float *r = fetch(gpu, one.g);
        for (int i = 0; i < M && bad < 0; i++)
            if (memcmp(r + (size_t)i * D, all + ((size_t)i * H + h) * D, (size_t)D * 4)) bad = h;
        free(r);
    }
    CHECK(bad < 0, "attention packed %s: head %d differs from the head computed alone", name, bad);
    check_gpu_ok(name);
    free(all);
    free(pos);
    pair *ps[] = {&q, &k, &v, &out, &one};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) release(ps[i]);
}

static void attention_packed_cases(void) {
    packed_case("decode GQA 8/2 D=128, 1 row at 40", 8, 2, 128, 40, 1);
    packed_case("verify GQA 8/2 D=128, 8 rows at 700 (3 chunks)", 8, 2, 128, 700, 8);
    packed_case("verify GQA 6/3 D=64, 5 rows at 250 (across chunk 256)", 6, 3, 64, 250, 5);
    packed_case("GQA 4/1 D=32, 3 rows at 10", 4, 1, 32, 10, 3);
    packed_case("GQA 16/2 D=128, 2 rows at 300", 16, 2, 128, 300, 2);
}

/* The step's q/k norms, RoPE, K/V store and attention in one launch
 * (qk_norm_rope_attention) against the two ops on the GPU, bit for bit
 * (output and both caches), against the CPU's two ops within attention's
 * bound, and each causal row decoded alone against its row of the call. */
typedef struct {
    const char *name;
    int H, KVH, D, p0, n, n_keys; /* n_keys 0: causal (p0 + n) */
} nra_case;

static void norm_rope_attention_case(const nra_case *c) {
    const bool causal = c->n_keys == 0;
    const int n_keys = causal ? c->p0 + c->n : c->n_keys, rows = n_keys + 3;
    const int64_t qc = (int64_t)c->H * c->D, kc = (int64_t)c->KVH * c->D;
    float *kv0 = rand_vec((size_t)(rows * kc), 1.0f), *vv0 = rand_vec((size_t)(rows * kc), 1.0f);
    float *qv = rand_vec((size_t)(c->n * qc), 3.0f);
    pair q = act(c->n, qc, qv), q2 = act(c->n, qc, qv), k = act_rand(c->n, kc, 2.0f), v = act_rand(c->n, kc, 1.0f);
    pair ka = act(rows, kc, kv0), va = act(rows, kc, vv0), kb = act(rows, kc, kv0), vb = act(rows, kc, vv0);
    pair qw = weight(DS_BF16, 1, c->D), kw = weight(DS_F32, 1, c->D);
    pair outa = act(c->n, qc, NULL), outb = act(c->n, qc, NULL);
    float *inv = malloc((size_t)(c->D / 2) * sizeof *inv);
    for (int i = 0; i < c->D / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / c->D));
    int32_t *pos = malloc((size_t)c->n * sizeof *pos);
    for (int i = 0; i < c->n; i++) pos[i] = c->p0 + i;
    ds_attn_params p = {.n_heads = c->H, .n_kv_heads = c->KVH, .head_dim = c->D, .v_head_dim = c->D,
                        .n_keys = n_keys, .causal = causal, .scale = 1.0f / sqrtf((float)c->D), .q_pos = pos};
    /* The two ops (a), the fused op (b); the CPU's two ops on (a)'s CPU side. */
    gpu->ops->qk_norm_rope_store(gpu, q.g, qw.g, k.g, kw.g, v.g, ka.g, va.g, 0, c->D, 1e-6f, pos, inv);
    gpu->ops->attention(gpu, outa.g, q.g, ka.g, va.g, &p);
    gpu->ops->qk_norm_rope_attention(gpu, outb.g, q2.g, qw.g, k.g, kw.g, v.g, kb.g, vb.g, c->D, 1e-6f, inv, &p);
    ds_qk_norm_rope_attention(cpu, outa.c, q.c, qw.c, k.c, kw.c, v.c, ka.c, va.c, c->D, 1e-6f, inv, &p);
    char what[128];
    snprintf(what, sizeof what, "qk_norm_rope_attention %s", c->name);
    compare(outb.g, outa.c, 2e-5, what);
    const ds_tensor ga[3] = {outa.g, ka.g, va.g}, gb[3] = {outb.g, kb.g, vb.g};
    const char *names[3] = {"output", "K cache", "V cache"};
    for (int t = 0; t < 3; t++) {
        float *a = fetch(gpu, ga[t]), *b = fetch(gpu, gb[t]);
        CHECK(!memcmp(a, b, (size_t)(ga[t].rows * ga[t].cols) * 4), "%s: %s differs from the two ops'", what,
              names[t]);
        free(a), free(b);
    }
    if (causal) { /* each row alone (decode), its keys before it in the cache the call wrote */
        float *all = fetch(gpu, outb.g);
        pair one = act(1, qc, NULL), q1 = act(c->n, qc, qv);
        int bad = -1;
        for (int i = 0; i < c->n && bad < 0; i++) {
            ds_attn_params p1 = p;
            p1.q_pos = pos + i;
            p1.n_keys = pos[i] + 1;
            gpu->ops->qk_norm_rope_attention(gpu, one.g, ds_rows(q1.g, i, 1), qw.g, ds_rows(k.g, i, 1), kw.g,
                                             ds_rows(v.g, i, 1), kb.g, vb.g, c->D, 1e-6f, inv, &p1);
            float *r = fetch(gpu, one.g);
            if (memcmp(r, all + (size_t)i * qc, (size_t)qc * 4)) bad = i;
            free(r);
        }
        CHECK(bad < 0, "%s: row %d of the %d-row call differs from the row alone", what, bad, c->n);
        free(all);
        release(&one), release(&q1);
    }
    check_gpu_ok(what);
    pair *all[] = {&q, &q2, &k, &v, &ka, &va, &kb, &vb, &qw, &kw, &outa, &outb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
    free(kv0), free(vv0), free(qv), free(inv), free(pos);
}

static void test_norm_rope_attention(void) {
    const nra_case cases[] = {
        {"decode D=128 32/8, 1 row at 40", 32, 8, 128, 40, 1, 0},
        {"verify D=128 32/8, 8 rows at 3", 32, 8, 128, 3, 8, 0},
        {"verify D=128 16/4, 8 rows at 250 (fresh keys across chunk 256)", 16, 4, 128, 250, 8, 0},
        {"verify D=128 8/1, 5 rows at 700 (3 chunks)", 8, 1, 128, 700, 5, 0},
        {"verify D=64 4/2, 3 rows at 0", 4, 2, 64, 0, 3, 0},
        {"drafter non-causal D=128 32/8, 7 rows, 300 keys", 32, 8, 128, 293, 7, 300},
        {"9 rows (the two ops)", 8, 2, 128, 20, 9, 0},
        {"D=256 (the two ops)", 4, 2, 256, 30, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) norm_rope_attention_case(&cases[i]);
}

/* ---- norms, RoPE, element-wise ------------------------------------------ */

/* rmsnorm_add (Gemma's post-norms, the layer scalar with the last add):
 * the same bits as rmsnorm, add and scale on the GPU, in place (out = res)
 * as the model calls it; against the CPU's unfused sequence within 2e-5. */
static void rmsnorm_add_cases(void) {
    struct {
        int64_t rows, cols;
        ds_dtype wdt;
        float scale;
    } cs[] = {{5, 3840, DS_BF16, 1.0f}, {8, 3840, DS_BF16, 0.37f}, {3, 1000, DS_F32, 1.0f}, {1, 640, DS_F16, 2.5f}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int64_t R = cs[i].rows, C = cs[i].cols;
        pair x = act_rand(R, C, 4.0f), res = act_rand(R, C, 1.0f), w = weight(cs[i].wdt, 1, C);
        float *r0 = fetch(gpu, res.g);
        pair ref = act(R, C, r0), tmp = act(R, C, NULL);
        free(r0);
        gpu->ops->rmsnorm_add(gpu, res.g, res.g, x.g, w.g, 1e-6f, cs[i].scale);
        gpu->ops->rmsnorm(gpu, tmp.g, x.g, w.g, (int)C, 1e-6f); /* the three ops it replaces */
        gpu->ops->add(gpu, ref.g, ref.g, tmp.g);
        if (cs[i].scale != 1.0f) gpu->ops->scale(gpu, ref.g, cs[i].scale);
        ds_rmsnorm_add(cpu, res.c, res.c, x.c, w.c, 1e-6f, cs[i].scale); /* the CPU: the unfused sequence */
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_add %lldx%lld %s scale %g", (long long)R, (long long)C,
                 ds_dtype_name(cs[i].wdt), cs[i].scale);
        compare(res.g, res.c, 2e-5, what);
        float *a = fetch(gpu, res.g), *b = fetch(gpu, ref.g);
        CHECK(!memcmp(a, b, (size_t)(R * C) * 4), "%s: differs from rmsnorm, add, scale", what);
        free(a);
        free(b);
        check_gpu_ok(what);
        release(&x);
        release(&res);
        release(&w);
        release(&ref);
        release(&tmp);
    }
}

static void test_rmsnorm(void) {
    struct {
        int64_t rows, cols;
        int dim;
        ds_dtype wdt; /* DS_DTYPE_COUNT: no weight */
    } cs[] = {{5, 1000, 1000, DS_BF16}, {3, 4096, 4096, DS_F32}, {7, 16 * 64, 64, DS_F32},
              {2, 8 * 128, 128, DS_DTYPE_COUNT}, {40, 256, 256, DS_F16}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        pair x = act_rand(cs[i].rows, cs[i].cols, 4.0f), out = act(cs[i].rows, cs[i].cols, NULL), w = {0};
        bool hw = cs[i].wdt != DS_DTYPE_COUNT;
        if (hw) w = weight(cs[i].wdt, 1, cs[i].dim);
        gpu->ops->rmsnorm(gpu, out.g, x.g, hw ? w.g : ds_no_tensor(), cs[i].dim, 1e-6f);
        cpu->ops->rmsnorm(cpu, out.c, x.c, hw ? w.c : ds_no_tensor(), cs[i].dim, 1e-6f);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm %lldx%lld dim %d %s", (long long)cs[i].rows, (long long)cs[i].cols,
                 cs[i].dim, hw ? ds_dtype_name(cs[i].wdt) : "no weight");
        compare(out.g, out.c, 2e-5, what);
        if (DS_X_BF16_ON) { /* the CPU takes the GPU's order (cpu_norm.c): the same bits */
            float *g = fetch(gpu, out.g), *c = fetch(cpu, out.c);
            CHECK(!memcmp(g, c, (size_t)(cs[i].rows * cs[i].cols) * 4), "%s: the GPU's bits differ from the CPU's",
                  what);
            free(g);
            free(c);
        }
        /* In place, as the model does for q/k norms: the same bits as out of place. */
        gpu->ops->rmsnorm(gpu, x.g, x.g, hw ? w.g : ds_no_tensor(), cs[i].dim, 1e-6f);
        float *a = fetch(gpu, x.g), *b = fetch(gpu, out.g);
        CHECK(!memcmp(a, b, (size_t)(cs[i].rows * cs[i].cols) * 4), "%s: in place differs from out of place", what);
        free(a);
        free(b);
        release(&x);
        release(&out);
        if (hw) release(&w);
    }
    rmsnorm_add_cases();
}

static void test_rope(void) {
    const int hds[] = {64, 128, 512};
    for (int t = 0; t < 3; t++) {
        const int hd = hds[t], heads = 4, rows = 70;
        float *inv = malloc((size_t)(hd / 2) * sizeof *inv);
        for (int i = 0; i < hd / 2; i++) /* proportional RoPE: a zero tail */
            inv[i] = i < hd / 3 ? (float)(1.0 / pow(1e6, (double)(2 * i) / hd)) : 0.0f;
        int32_t *pos = malloc(rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (int32_t)((frand() + 1.0f) * 4000.0f);
        pair x = act_rand(rows, (int64_t)heads * hd, 2.0f);
        gpu->ops->rope(gpu, x.g, hd, pos, inv);
        cpu->ops->rope(cpu, x.c, hd, pos, inv);
        char what[64];
        snprintf(what, sizeof what, "rope head_dim %d, 70 rows, pos < 8000", hd);
        compare(x.g, x.c, 2e-6, what);
        release(&x);
        free(inv);
        free(pos);
    }
}

/* The fused per-head norm + RoPE against the CPU's rmsnorm then rope. */
static void test_rmsnorm_rope(void) {
    const int hds[] = {64, 128, 256};
    for (int t = 0; t < 3; t++) {
        const int hd = hds[t], heads = 3, rows = 70;
        float *inv = malloc((size_t)(hd / 2) * sizeof *inv);
        for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / hd));
        int32_t *pos = malloc(rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (int32_t)((frand() + 1.0f) * 4000.0f);
        pair x = act_rand(rows, (int64_t)heads * hd, 3.0f), w = weight(t == 1 ? DS_F32 : DS_BF16, 1, hd);
        gpu->ops->rmsnorm_rope(gpu, x.g, w.g, hd, 1e-6f, pos, inv);
        ds_rmsnorm_rope(cpu, x.c, w.c, hd, 1e-6f, pos, inv);
        char what[64];
        snprintf(what, sizeof what, "rmsnorm_rope head_dim %d, 70 rows", hd);
        compare(x.g, x.c, 2e-6, what);
        /* q (4 heads) and k (2 heads) in one launch against two CPU passes. */
        pair q = act_rand(rows, (int64_t)4 * hd, 3.0f), k = act_rand(rows, (int64_t)2 * hd, 2.0f);
        pair kw = weight(t == 2 ? DS_F32 : DS_BF16, 1, hd);
        gpu->ops->qk_norm_rope(gpu, q.g, w.g, k.g, kw.g, hd, 1e-6f, pos, inv);
        ds_qk_norm_rope(cpu, q.c, w.c, k.c, kw.c, hd, 1e-6f, pos, inv);
        snprintf(what, sizeof what, "qk_norm_rope q, head_dim %d, 70 rows", hd);
        compare(q.g, q.c, 2e-6, what);
        snprintf(what, sizeof what, "qk_norm_rope k, head_dim %d, 70 rows", hd);
        compare(k.g, k.c, 2e-6, what);
        release(&q);
        release(&k);
        release(&kw);
        release(&x);
        release(&w);
        free(inv);
        free(pos);
    }
}

/* key_norm_rope_store_layers (a drafter's context keys of every layer in one launch) against qk_norm_rope_store
 * a layer on the GPU, bit for bit, and the CPU's: 10 layers (two launches of at most 8) at 5 rows and 70 (two
 * row chunks), positions scattered in the caches. */
static void test_key_layers(void) {
    enum { L = 10, HEADS = 2, D = 128, CACHE = 200 };
    const int rows_cases[] = {5, 70};
    float *inv = malloc((D / 2) * sizeof *inv);
    for (int i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / D));
    for (int rc = 0; rc < 2; rc++) {
        const int rows = rows_cases[rc];
        int32_t *pos = malloc((size_t)rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (i * 37 + 11) % CACHE; /* distinct: 37 and 200 are coprime */
        pair k[L], v[L], kw[L], ka[L], va[L], kb[L], vb[L];
        ds_tensor gk[L], gkw[L], gv[L], gka[L], gva[L], ck[L], ckw[L], cv[L], cka[L], cva[L];
        for (int l = 0; l < L; l++) {
            k[l] = act_rand(rows, HEADS * D, 2.0f), v[l] = act_rand(rows, HEADS * D, 1.0f);
            kw[l] = weight(l % 2 ? DS_BF16 : DS_F32, 1, D);
            float *z = calloc((size_t)CACHE * HEADS * D, sizeof *z);
            ka[l] = act(CACHE, HEADS * D, z), va[l] = act(CACHE, HEADS * D, z);
            kb[l] = act(CACHE, HEADS * D, z), vb[l] = act(CACHE, HEADS * D, z);
            free(z);
            gk[l] = k[l].g, gkw[l] = kw[l].g, gv[l] = v[l].g, gka[l] = ka[l].g, gva[l] = va[l].g;
            ck[l] = k[l].c, ckw[l] = kw[l].c, cv[l] = v[l].c, cka[l] = ka[l].c, cva[l] = va[l].c;
        }
        /* per layer into (b) first: the op normalizes k in place, so the one-launch op (a) runs on fresh copies */
        pair k2[L];
        for (int l = 0; l < L; l++) {
            float *kv = fetch(gpu, k[l].g);
            k2[l] = act(rows, HEADS * D, kv);
            free(kv);
            gpu->ops->qk_norm_rope_store(gpu, ds_rows(k2[l].g, 0, 0), ds_no_tensor(), k2[l].g, kw[l].g, v[l].g,
                                         kb[l].g, vb[l].g, 0, D, 1e-6f, pos, inv);
        }
        gpu->ops->key_norm_rope_store_layers(gpu, L, gk, gkw, gv, gka, gva, D, 1e-6f, pos, inv);
        ds_key_norm_rope_store_layers(cpu, L, ck, ckw, cv, cka, cva, D, 1e-6f, pos, inv);
        check_gpu_ok("key_norm_rope_store_layers");
        int differ = 0;
        for (int l = 0; l < L; l++) {
            const size_t bytes = (size_t)CACHE * HEADS * D * 4;
            float *a = fetch(gpu, ka[l].g), *b = fetch(gpu, kb[l].g);
            float *c = fetch(gpu, va[l].g), *d = fetch(gpu, vb[l].g);
            differ += memcmp(a, b, bytes) != 0 || memcmp(c, d, bytes) != 0;
            free(a), free(b), free(c), free(d);
        }
        CHECK(differ == 0, "key_norm_rope_store_layers, %d rows: %d of %d layers' caches differ from "
                           "qk_norm_rope_store's", rows, differ, L);
        char what[96];
        snprintf(what, sizeof what, "key_norm_rope_store_layers %d rows, K of layer 9", rows);
        compare(ka[L - 1].g, ka[L - 1].c, 2e-6, what);
        snprintf(what, sizeof what, "key_norm_rope_store_layers %d rows, V of layer 0", rows);
        compare(va[0].g, va[0].c, 0, what);
        for (int l = 0; l < L; l++) {
            release(&k[l]), release(&v[l]), release(&kw[l]), release(&k2[l]);
            release(&ka[l]), release(&va[l]), release(&kb[l]), release(&vb[l]);
        }
        free(pos);
    }
    free(inv);
}

static void test_elementwise(void) {
    const int64_t R = 9, C = 1537;
    pair a = act_rand(R, C, 6.0f), b = act_rand(R, C, 3.0f), out = act(R, C, NULL);
    gpu->ops->add(gpu, out.g, a.g, b.g);
    cpu->ops->add(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 0, "add");
    gpu->ops->swiglu(gpu, out.g, a.g, b.g);
    cpu->ops->swiglu(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 2e-6, "swiglu");
    gpu->ops->geglu_tanh(gpu, out.g, a.g, b.g);
    cpu->ops->geglu_tanh(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 2e-6, "geglu_tanh");
    /* In place on column views (the model's gemma PLE path). */
    gpu->ops->swiglu(gpu, ds_cols(a.g, 7, 600), ds_cols(a.g, 7, 600), ds_cols(b.g, 100, 600));
    cpu->ops->swiglu(cpu, ds_cols(a.c, 7, 600), ds_cols(a.c, 7, 600), ds_cols(b.c, 100, 600));
    compare(a.g, a.c, 2e-6, "swiglu in place on column views");
    gpu->ops->scale(gpu, b.g, 0.7071f);
    cpu->ops->scale(cpu, b.c, 0.7071f);
    compare(b.g, b.c, 0, "scale");
    gpu->ops->softcap(gpu, b.g, 1.5f);
    cpu->ops->softcap(cpu, b.c, 1.5f);
    compare(b.g, b.c, 2e-6, "softcap");
    pair l = act_rand(R, C, 30.0f);
    gpu->ops->round_bf16(gpu, l.g);
    cpu->ops->round_bf16(cpu, l.c);
    compare(l.g, l.c, 0, "round_bf16");
    release(&a);
    release(&b);
    release(&out);
    release(&l);
}

/* ---- errors are values -------------------------------------------------- */

/* Row argmax, ties to the lowest index: coarse values make many exact ties,
 * including across the GPU's threads; a vocabulary-sized row too. */
static void test_argmax(void) {
    const int64_t R = 9, C = 151936;
    float *v = rand_vec((size_t)(R * C), 1.0f);
    for (int64_t i = 0; i < R * C; i++) v[i] = (float)(int)(v[i] * 8); /* 17 levels: ties everywhere */
    v[3 * C + 151935] = 100; /* maximum at the very end of row 3 */
    v[5 * C + 0] = 100;      /* and at the very start of row 5 */
    pair x = act(R, C, v);
    int32_t g[16], c[16];
    gpu->ops->argmax(gpu, x.g, g);
    cpu->ops->argmax(cpu, x.c, c);
    check_gpu_ok("argmax");
    int same = 0;
    for (int r = 0; r < R; r++) same += g[r] == c[r];
    printf("  argmax %lldx%lld with ties: %d/%lld rows equal the CPU's\n", (long long)R, (long long)C, same, (long long)R);
    CHECK(same == R, "argmax differs from the CPU on %lld rows", (long long)R - same);
    CHECK(c[3] == 151935 && c[5] == 0, "planted maxima at %d, %d", c[3], c[5]);
    release(&x);
    free(v);
}

/* A GPU-only bf16 weight [rows, cols] from the first rows x cols values of host. */
static ds_tensor bw_weight(const uint16_t *host, int64_t rows, int64_t cols) {
    ds_st_tensor st = {.name = "w", .dtype = DS_BF16, .ndim = 2, .shape = {rows, cols}, .data = host,
                       .nbytes = (size_t)(rows * cols) * 2};
    ds_tensor t = ds_no_tensor();
    ds_error *e = gpu->ops->weight(gpu, &st, rows, cols, &t);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
    return t;
}

/* A bf16 weight from given values (each exactly representable in bf16). */
static ds_tensor gpu_bf16_weight(const float *v, int64_t rows, int64_t cols, uint16_t *buf) {
    for (int64_t i = 0; i < rows * cols; i++) buf[i] = ds_f32_to_bf16(v[i]);
    return bw_weight(buf, rows, cols);
}

/* The greedy Markov walk done by hand on the host: corrected logits want
 * [G, V] and tokens (argmax starting at column 0, first strict maximum). */
static void host_markov_walk(const float *base, const float *w1, const float *w2, int G, int V, int r, bool bf16,
                             int32_t anchor, float *want, int32_t *tok) {
    int32_t prev = anchor;
    for (int k = 0; k < G; k++) {
        const float *e = w1 + (size_t)prev * r;
        float *row = want + (size_t)k * V;
        for (int j = 0; j < V; j++) {
            float b = 0;
            for (int i = 0; i < r; i++) b += e[i] * w2[(size_t)j * r + i];
            const float x = base[(size_t)k * V + j];
            row[j] = bf16 ? ds_bf16_to_f32(ds_f32_to_bf16(x + ds_bf16_to_f32(ds_f32_to_bf16(b)))) : x + b;
        }
        int32_t best = 0;
        for (int j = 1; j < V; j++)
            if (row[j] > row[best]) best = j;
        tok[k] = prev = best;
    }
}

/* The principal-directions bound of w2 (V x r, fp32) as the drafter builds
 * it (host), and on both backends (b: the GPU's tensors). */
typedef struct {
    ds_markov_bound_host host;
    pair proj, coef, radius;
    ds_markov_bound b;
} test_bound;
static bool test_bound_make(test_bound *tb, const float *w2, int V, int r) {
    ds_error *e = ds_markov_bound_build(w2, DS_F32, V, r, DS_MARKOV_BOUND_K, &tb->host);
    CHECK(!e, "markov bound: %s", e ? ds_error_message(e) : "");
    if (e) {
        ds_error_free(e);
        return false;
    }
    tb->proj = act(tb->host.k, r, tb->host.proj);
    tb->coef = act(V, tb->host.k, tb->host.coef);
    tb->radius = act(1, V, tb->host.radius);
    tb->b = (ds_markov_bound){tb->proj.g, tb->coef.g, tb->radius.g};
    return true;
}
static void test_bound_free(test_bound *tb) {
    release(&tb->proj);
    release(&tb->coef);
    release(&tb->radius);
    ds_markov_bound_free(&tb->host);
}

/* The device Markov walk against the host walk. The values are small
 * multiples of powers of two, so every product and sum is exact in fp32
 * whatever the order: both sides must agree to the bit, in the corrected
 * logits and in every drawn token (ties included). Without the logits
 * (tokens only) the device skips rows that the principal-directions bound
 * (draft/markov_bound.c, as the drafter builds it) says cannot win: the
 * tokens must still be the same, for a random w2 (loose bound) and a
 * low-rank one plus noise (tight bound, as trained heads), with the base
 * logits as close as the bias (many candidates, ties), spread wide (few
 * candidates), and with a NaN at column 0 (no pruning; the host scan
 * returns 0). */
static void test_markov_greedy(void) {
    const int G = 7, V = 3000, r = 64;
    float *base = malloc((size_t)G * V * sizeof *base), *w1 = malloc((size_t)V * r * sizeof *w1);
    float *w2 = malloc((size_t)V * r * sizeof *w2), *want = malloc((size_t)G * V * sizeof *want);
    float *got = malloc((size_t)G * V * sizeof *got);
    uint16_t *b1 = malloc((size_t)V * r * 2), *b2 = malloc((size_t)V * r * 2);
    for (int i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
    ds_tensor tw1 = gpu_bf16_weight(w1, V, r, b1);
    const char *wnames[] = {"random w2", "low-rank w2"}, *names[] = {"close", "spread", "NaN at column 0"};
    for (int wk = 0; wk < 2; wk++) {
        if (wk == 0) {
            for (int i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 256.0f;
        } else { /* (a_n u + b_n v + sparse noise) / 256, integers up to 33: exact in bf16 */
            int u[64], v[64];
            for (int i = 0; i < r; i++) u[i] = (int)(frand() * 9) - 4, v[i] = (int)(frand() * 7) - 3;
            for (int n = 0; n < V; n++) {
                const int a = (int)(frand() * 5) - 2, b = (int)(frand() * 5) - 2;
                for (int i = 0; i < r; i++)
                    w2[(size_t)n * r + i] = (float)(a * u[i] + b * v[i] + (frand() < 0.1 ? 1 : 0)) / 256.0f;
            }
        }
        ds_tensor tw2 = gpu_bf16_weight(w2, V, r, b2);
        test_bound tb;
        if (!test_bound_make(&tb, w2, V, r)) break;
        const ds_markov_bound bound = tb.b;
        for (int data = 0; data < 3; data++) {
            for (int i = 0; i < G * V; i++) base[i] = (float)(int)(frand() * 96) / (data == 1 ? 4.0f : 64.0f);
            if (data == 2) base[(size_t)3 * V] = NAN;
            for (int mode = 0; mode < 8; mode++) { /* bit 0: bf16; bit 1: tokens only (pruned); bit 2: per step */
                const bool bf16 = mode & 1, pruned = mode & 2, fused = !(mode & 4);
                if (!pruned && !fused) continue; /* only the pruned walk has the one-launch form */
                /* The pruned walk in one launch / a launch a step, whatever the vocabulary (markov.cu reads
                 * it at each call; by size, V = 3000 would take a launch a step) */
                ds_cuda_config_of(gpu)->markov_fused = fused;
                if ((data > 0 || wk > 0) && !pruned) continue; /* the full walk: the first data set */
                pair pb = act(G, V, base), po = act(G, V, NULL), pe = act(G, r + 3, NULL);
                ds_tensor emb = ds_cols(pe.g, 2, r); /* a column window, as the drafter passes it */
                const int32_t anchor = 1234;
                int32_t tok[8] = {0}, want_tok[8] = {0};
                gpu->ops->markov_greedy(gpu, pb.g, pruned ? ds_no_tensor() : po.g, tw1, tw2, pruned ? &bound : NULL,
                                        bf16, anchor, emb, tok);
                check_gpu_ok("markov_greedy");
                host_markov_walk(base, w1, w2, G, V, r, bf16, anchor, want, want_tok);
                int same = 0;
                for (int k = 0; k < G; k++) same += tok[k] == want_tok[k];
                bool logits_ok = true;
                if (!pruned) {
                    gpu->ops->download(gpu, po.g, got);
                    logits_ok = !memcmp(got, want, (size_t)G * V * 4);
                }
                printf("  markov_greedy (%s, %s, %s, %s%s): %d/%d tokens equal the host walk's%s\n", wnames[wk],
                       names[data], bf16 ? "bf16" : "fp32", pruned ? "tokens only" : "with logits",
                       pruned ? fused ? ", one launch" : ", a launch a step" : "", same, G,
                       pruned ? "" : logits_ok ? ", logits bit-identical" : ", logits DIFFER");
                CHECK(same == G, "markov_greedy (%s, %s): %d of %d tokens differ", wnames[wk], names[data], G - same,
                      G);
                CHECK(logits_ok, "markov_greedy: corrected logits differ");
                /* emb (the confidence head's input): row k = w1[the token before position k] */
                float *ge = malloc((size_t)G * (r + 3) * sizeof *ge);
                gpu->ops->download(gpu, pe.g, ge);
                int emb_bad = -1;
                for (int k = 0; k < G && emb_bad < 0; k++) {
                    const int prev = k ? want_tok[k - 1] : anchor;
                    if (memcmp(ge + (size_t)k * (r + 3) + 2, w1 + (size_t)prev * r, (size_t)r * sizeof *ge)) emb_bad = k;
                }
                CHECK(emb_bad < 0, "markov_greedy (%s, %s, %s): emb row %d is not w1[previous token]", wnames[wk],
                      names[data], fused ? "one launch" : "a launch a step", emb_bad);
                free(ge);
                release(&pb);
                release(&po);
                release(&pe);
            }
            ds_cuda_config_of(gpu)->markov_fused = -1;
        }
        test_bound_free(&tb);
        gpu->ops->release(gpu, &tw2);
    }
    gpu->ops->release(gpu, &tw1);
    free(base), free(w1), free(w2), free(want), free(got), free(b1), free(b2);
}

/* markov_greedy_head (the LM head's int8 bounds and the walk computing only
 * the rows in contention, head_bound.cu) against the full head on the GPU
 * (linear, round_bf16, the pruned markov_greedy): the same tokens, which
 * needs the bounds to hold and the candidates' logits to have the full
 * head's bits. Heads: random (few candidates); a third of the rows one
 * vector and the rest half of it (hundreds of exact ties in the base
 * logits: many candidates, the bias and then the lowest id decide); a NaN
 * in x (infinite bounds: every row computed; all logits NaN, token 0 as the
 * host scan). The int8 copy must be made (one more weight copy in the
 * region stats at the first call), and the head bound off (the full head)
 * must agree too. */
static void test_markov_greedy_head(void) {
    const int G = 7, V = 3000, K = 4096, r = 64; /* K: the 8B head's, 8 chunks an emulated warp */
    float *w1 = malloc((size_t)V * r * sizeof *w1), *w2 = malloc((size_t)V * r * sizeof *w2);
    float *hw = malloc((size_t)V * K * sizeof *hw), *x = malloc((size_t)G * K * sizeof *x);
    uint16_t *b1 = malloc((size_t)V * r * 2), *b2 = malloc((size_t)V * r * 2), *bh = malloc((size_t)V * K * 2);
    for (int i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
    for (int i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 1024.0f;
    ds_tensor tw1 = gpu_bf16_weight(w1, V, r, b1), tw2 = gpu_bf16_weight(w2, V, r, b2);
    test_bound tb;
    if (!test_bound_make(&tb, w2, V, r)) return;
    const ds_markov_bound bound = tb.b;
    const char *names[] = {"random head", "tied rows", "NaN in x"};
    ds_cuda_config *cfg = ds_cuda_config_of(gpu);
    cfg->markov_fused = 1; /* V = 3000 would otherwise take a launch a step */
    for (int data = 0; data < 3; data++) {
        for (int i = 0; i < V * K; i++) hw[i] = ds_bf16_to_f32(ds_f32_to_bf16(frand() * 0.02f));
        if (data == 1)
            for (int n = 0; n < V; n++)
                for (int i = 0; i < K; i++) hw[(size_t)n * K + i] = n % 3 ? 0.5f * hw[i] : hw[i];
        for (int i = 0; i < G * K; i++) x[i] = frand() * 2.0f;
        if (data == 2) x[3 * K + 17] = NAN;
        ds_tensor th = gpu_bf16_weight(hw, V, K, bh);
        pair px = act(G, K, x), pb = act(G, V, NULL), pe = act(G, r, NULL);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int32_t anchor = 77;
            int32_t want[8] = {0}, got[8] = {0}, full[8] = {0};
            gpu->ops->linear(gpu, pb.g, px.g, th, ds_no_tensor());
            if (bf16) gpu->ops->round_bf16(gpu, pb.g);
            gpu->ops->markov_greedy(gpu, pb.g, ds_no_tensor(), tw1, tw2, &bound, bf16, anchor, pe.g, want);
            ds_region_stats s0, s1;
            gpu->ops->region_stats(gpu, &s0);
            gpu->ops->markov_greedy_head(gpu, px.g, th, pb.g, bf16, tw1, tw2, &bound, anchor, pe.g, got);
            check_gpu_ok("markov_greedy_head");
            gpu->ops->region_stats(gpu, &s1);
            cfg->head_bound = false;
            gpu->ops->markov_greedy_head(gpu, px.g, th, pb.g, bf16, tw1, tw2, &bound, anchor, pe.g, full);
            cfg->head_bound = true;
            check_gpu_ok("markov_greedy_head (full head)");
            int same = 0, same_full = 0;
            for (int k = 0; k < G; k++) same += got[k] == want[k], same_full += full[k] == want[k];
            /* a new head (a new tensor each data set): its copy is made at the first call */
            const bool copied = bf16 || s1.weight_copy_bytes - s0.weight_copy_bytes >= (int64_t)V * K;
            printf("  markov_greedy_head (%s, %s): %d/%d tokens equal the full head's (%d without the bound), "
                   "int8 copy %s; tokens %d %d %d ...\n",
                   names[data], bf16 ? "bf16" : "fp32", same, G, same_full, copied ? "made" : "MISSING", got[0],
                   got[1], got[2]);
            CHECK(same == G && same_full == G, "markov_greedy_head (%s, %s): %d / %d of %d tokens differ",
                  names[data], bf16 ? "bf16" : "fp32", G - same, G - same_full, G);
            CHECK(copied, "markov_greedy_head: no int8 copy of the head was made");
            if (data == 2) CHECK(got[3] == 0, "markov_greedy_head: a NaN row's token is %d, not 0", got[3]);
        }
        release(&px);
        release(&pb);
        release(&pe);
        gpu->ops->release(gpu, &th);
    }
    cfg->markov_fused = -1;
    test_bound_free(&tb);
    gpu->ops->release(gpu, &tw1);
    gpu->ops->release(gpu, &tw2);
    free(w1), free(w2), free(hw), free(x), free(b1), free(b2), free(bh);
}

static void test_errors(void) {
    pair x = act_rand(2, 64, 1.0f);
    int32_t pos[2] = {0, 1};
    ds_attn_params p = {.n_heads = 1, .n_kv_heads = 1, .head_dim = 1024, .v_head_dim = 1024, .n_keys = 2,
                        .causal = true, .scale = 1, .q_pos = pos};
    pair big = act(2, 1024, NULL);
    gpu->ops->attention(gpu, big.g, big.g, big.g, big.g, &p);
    CHECK_ERR(ds_backend_check(gpu), "cuda attention");
    CHECK(ds_backend_check(gpu) == NULL, "check() did not clear the error");
    pair w = weight(DS_BF16, 8, 32);
    gpu->ops->linear(gpu, ds_rows(x.g, 0, 1), x.g, w.g, ds_no_tensor()); /* shapes disagree */
    CHECK_ERR(ds_backend_check(gpu), "cuda linear");
    release(&x);
    release(&big);
    release(&w);
}

/* ---- informational timing ----------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Narrow matmul bandwidth on a bf16 weight much larger than L2 (reported, not checked). */
static void test_linear_bandwidth(void) {
    const int64_t N = 16384, K = 8192; /* 256 MiB of bf16 */
    pair w[2] = {weight(DS_BF16, N, K), weight(DS_BF16, N, K)};
    pair x = act_rand(64, K, 1.0f), out = act(64, N, NULL);
    const int64_t Ms[] = {1, 4, 8, 16, 32, 64};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        const int64_t M = Ms[i];
        for (int r = 0; r < 2; r++) gpu->ops->linear(gpu, ds_rows(out.g, 0, M), ds_rows(x.g, 0, M), w[r].g, ds_no_tensor());
        check_gpu_ok("bandwidth warm-up");
        const int reps = 20;
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            gpu->ops->linear(gpu, ds_rows(out.g, 0, M), ds_rows(x.g, 0, M), w[r % 2].g, ds_no_tensor());
        check_gpu_ok("bandwidth");
        double dt = (now_s() - t0) / reps;
        printf("  linear bf16 %lldx%lld, M=%-2lld (%s): %7.1f us  %6.0f GB/s of weights  %6.1f TFLOP/s\n",
               (long long)N, (long long)K, (long long)M, M > 32 ? "cuBLAS" : "narrow", dt * 1e6,
               (double)(N * K * 2) / dt / 1e9, 2.0 * (double)(M * N * K) / dt / 1e12);
    }
    release(&w[0]);
    release(&w[1]);
    release(&x);
    release(&out);
}

/* The Qwen3-8B decode projections as the model calls them (fused ops, M = 1
 * and 8), each alternating two copies of its weights so that L2 (50 MB)
 * does not hold them (reported, not checked): where the in-model matmul
 * time goes, shape by shape. */
static void test_model_shapes_bandwidth(void) {
    const int64_t H = 4096, F = 12288, KV = 1024;
    uint16_t *host = malloc((size_t)(F * H) * 2); /* random bf16, shared by every weight */
    for (int64_t i = 0; i < F * H; i++) host[i] = ds_f32_to_bf16((float)((int)(frand() * 1023.0f)) / 1024.0f);
    ds_tensor q[2], k[2], v[2], o[2], g[2], u[2], d[2];
    for (int c = 0; c < 2; c++) {
        q[c] = bw_weight(host, H, H), k[c] = bw_weight(host, KV, H), v[c] = bw_weight(host, KV, H);
        o[c] = bw_weight(host, H, H), g[c] = bw_weight(host, F, H), u[c] = bw_weight(host, F, H);
        d[c] = bw_weight(host, H, F);
    }
    free(host);
    pair nw = weight(DS_BF16, 1, H), xs = act_rand(8, F, 1.0f), hs = act_rand(8, F, 1.0f);
    pair oq = act(8, H, NULL), ok = act(8, KV, NULL), ov = act(8, KV, NULL), res = act_rand(8, H, 1.0f);
    /* The last: o_proj on one copy of its weights (32 MB, held by L2 after the warm-up): how fast an SM takes
     * weights that do not come from HBM (session 18: a ring landed before the first product was not consumed
     * faster than a streamed one). Session 19, H200: 16.0 us vs 16.2 from HBM at one row, 10.2 vs 12.4 at 8:
     * the one-row kernel is not bound by HBM alone (ncu: its consumer warps' chain per stage, and its tiles'
     * epilogues). */
    const char *what[5] = {"qkv: rmsnorm_linear_multi (4096+1024+1024) x 4096", "o_proj: linear_residual 4096 x 4096",
                           "gate/up: rmsnorm_linear_swiglu 2 x 12288 x 4096", "down: linear_residual 4096 x 12288",
                           "o_proj, one copy of the weights (from L2)"};
    const double bytes[5] = {2.0 * (H + 2 * KV) * H, 2.0 * H * H, 4.0 * F * H, 2.0 * H * F, 2.0 * H * H};
    for (int mi = 0; mi < 2; mi++) {
        const int64_t M = mi ? 8 : 1;
        ds_tensor xh = ds_cols(ds_rows(xs.g, 0, M), 0, H), xf = ds_rows(xs.g, 0, M), hh = ds_rows(hs.g, 0, M);
        for (int op = 0; op < 5; op++) {
            const int reps = 40;
            double t0 = 0;
            for (int r = -2; r < reps; r++) { /* two warm-up calls */
                if (r == 0) {
                    check_gpu_ok("bandwidth warm-up");
                    t0 = now_s();
                }
                const int c = op == 4 ? 0 : r & 1;
                if (op == 0) {
                    const ds_tensor outs[3] = {ds_rows(oq.g, 0, M), ds_rows(ok.g, 0, M), ds_rows(ov.g, 0, M)};
                    const ds_tensor ws[3] = {q[c], k[c], v[c]};
                    const ds_tensor bs[3] = {ds_no_tensor(), ds_no_tensor(), ds_no_tensor()};
                    gpu->ops->rmsnorm_linear_multi(gpu, 3, outs, xh, nw.g, 1e-6f, ws, bs);
                } else if (op == 1 || op == 4) {
                    gpu->ops->linear_residual(gpu, ds_rows(res.g, 0, M), xh, o[c], ds_no_tensor(),
                                              ds_rows(res.g, 0, M));
                } else if (op == 2) {
                    gpu->ops->rmsnorm_linear_swiglu(gpu, hh, xh, nw.g, 1e-6f, g[c], u[c]);
                } else {
                    gpu->ops->linear_residual(gpu, ds_rows(res.g, 0, M), xf, d[c], ds_no_tensor(),
                                              ds_rows(res.g, 0, M));
                }
            }
            check_gpu_ok("bandwidth");
            const double dt = (now_s() - t0) / reps;
            printf("  %-52s M=%lld: %7.1f us  %5.2f TB/s of weights\n", what[op], (long long)M, dt * 1e6,
                   bytes[op] / dt / 1e12);
        }
    }
    for (int c = 0; c < 2; c++) {
        ds_tensor *all[] = {&q[c], &k[c], &v[c], &o[c], &g[c], &u[c], &d[c]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->ops->release(gpu, all[i]);
    }
    pair *ps[] = {&nw, &xs, &hs, &oq, &ok, &ov, &res};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) release(ps[i]);
}

/* ---- sampling at T > 0 (probs, sample, verify_sample, markov_sample) ------ */

/* The GPU's sampling ops against the CPU's (which equal src/sample/'s probs, draw and
 * verify bit for bit: test_sample_ops). The GPU computes exp the
 * CPU's way and sums in double in another (fixed) order, so its
 * distributions are expected to match to the last bit or so: bound 1e-6
 * normalized (max |gpu - cpu| / max |cpu| per call; ~16 ulp of the
 * largest probability). Kept sets (top-k / top-p) must be identical, except
 * where the cut is borderline at that tolerance: the k-th and (k+1)-th
 * ranked probabilities within 1e-6 (relative) of each other, or the
 * rank-order cumulative mass within 1e-6 of top_p * kept mass, where
 * probabilities that differ in the last bits may decide either way (counted
 * and printed as "borderline"; with the exp and divisions matching the
 * CPU's bit for bit, expect none). Draws and
 * rejection decisions must be identical, except where a uniform lies within
 * DRAW_EPS (relative) of a CDF step or of an acceptance ratio, or where
 * the host rule applied to the GPU's and to the CPU's distributions
 * disagrees (rounding moved a boundary): counted and printed as "excluded",
 * and there must be few (< 2 %). */
#define SAMPLE_PROB_TOL 1e-6
#define DRAW_EPS 1e-9

typedef struct {
    float T;
    int k;
    float p;
} samp_setting;

static const samp_setting SAMP[] = {{1.0f, 0, 1.0f},   {0.7f, 20, 1.0f},   {1.0f, 0, 0.8f},  {0.8f, 50, 0.9f},
                                    {1.3f, 1, 1.0f},   {0.6f, 0, 0.05f},   {1.0f, 5000, 1.0f}, {0.9f, 0, 0.97f},
                                    {1.5f, 100, 0.5f}, {1.0f, 6000, 0.99f}};
#define N_SAMP (int)(sizeof SAMP / sizeof SAMP[0])

static ds_sampling samp(const samp_setting *st) {
    ds_sampling s = {.temperature = st->T, .top_k = st->k, .top_p = st->p};
    return s;
}

static ds_rng urng; /* the host's uniforms */

/* Logits of one of four shapes: 0 spread, 1 coarse (many exact ties), 2 peaked, 3 nearly flat. */
static void shaped_logits(float *x, int64_t V, int kind) {
    for (int64_t i = 0; i < V; i++) {
        const float f = frand();
        x[i] = kind == 0 ? 4.0f * f : kind == 1 ? (float)(int)(f * 8) / 2.0f : kind == 2 ? 16.0f * f : 0.05f * f;
    }
}

typedef struct {
    float p;
    int32_t id;
} ranked;

static int rank_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id > y->id ? 1 : -1;
}

/* How close the cuts of the unprocessed distribution plain[V] are to
 * deciding otherwise, relative: the gap between the k-th and (k+1)-th
 * probabilities (top-k) and between the cumulative mass and its target
 * (top-p); infinite without truncation. From a full ranking. */
static double cut_margin(const float *plain, int64_t V, const ds_sampling *s) {
    ranked *c = malloc((size_t)V * sizeof *c);
    for (int64_t i = 0; i < V; i++) c[i] = (ranked){plain[i], (int32_t)i};
    qsort(c, (size_t)V, sizeof *c, rank_desc);
    const int64_t keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mass = 0, cum = 0, margin = INFINITY;
    /* (an exact tie is no excuse: equal logits give equal probabilities on both sides, and the lower id wins) */
    if (keep < V && c[keep - 1].p != c[keep].p) margin = (c[keep - 1].p - c[keep].p) / c[keep - 1].p;
    if (!(s->top_p > 0 && s->top_p < 1.0f)) {
        free(c);
        return margin;
    }
    for (int64_t i = 0; i < keep; i++) mass += c[i].p;
    const double target = s->top_p * mass;
    for (int64_t i = 0; i < keep; i++) {
        cum += c[i].p;
        margin = fmin(margin, fabs(cum - target) / target);
        if (cum >= target) break;
    }
    free(c);
    return margin;
}

/* Distance of u * total to the nearest CDF step of row p[V] (the host's
 * sequential sum), relative to the total. */
static double draw_margin(const float *p, int64_t V, double u) {
    double total = 0, cum = 0, m = INFINITY;
    for (int64_t i = 0; i < V; i++) total += p[i];
    const double t = u * total;
    for (int64_t i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        cum += p[i];
        m = fmin(m, fabs(cum - t));
    }
    return total > 0 ? m / total : INFINITY;
}

/* Processed distributions on both backends, compared. */
static void test_sample_probs(void) {
    const int64_t Vs[] = {151936, 3000, 7};
    const int R = 4;
    double worst = 0;
    int rows = 0, kept_differ = 0, borderline = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        float *l = malloc((size_t)(R * V) * sizeof *l), *g = malloc((size_t)(R * V) * sizeof *g);
        float *c = malloc((size_t)(R * V) * sizeof *c), *plain = malloc((size_t)V * sizeof *plain);
        for (int si = 0; si < N_SAMP; si++) {
            const ds_sampling s = samp(&SAMP[si]), sp = {.temperature = s.temperature, .top_p = 1.0f};
            for (int r = 0; r < R; r++) shaped_logits(l + (size_t)r * V, V, r);
            pair x = act(R, V, l), pg = act(R, V, NULL);
            gpu->ops->probs(gpu, pg.g, x.g, &s);
            cpu->ops->probs(cpu, pg.c, x.c, &s);
            check_gpu_ok("probs");
            gpu->ops->download(gpu, pg.g, g);
            cpu->ops->download(cpu, pg.c, c);
            const double err = rel_err_max(g, c, (size_t)(R * V));
            worst = fmax(worst, err);
            CHECK(err <= SAMPLE_PROB_TOL, "probs V=%lld T=%g k=%d p=%g: normalized error %.3g over %.0e", (long long)V,
                  (double)s.temperature, s.top_k, (double)s.top_p, err, SAMPLE_PROB_TOL);
            for (int r = 0; r < R; r++) {
                int64_t diff = 0;
                for (int64_t i = 0; i < V; i++) diff += (g[(size_t)r * V + i] > 0) != (c[(size_t)r * V + i] > 0);
                rows++;
                if (!diff) continue;
                ds_probs_from_logits(l + (size_t)r * V, (int)V, &sp, plain);
                const double m = cut_margin(plain, V, &s);
                if (m < SAMPLE_PROB_TOL) {
                    borderline++;
                } else {
                    kept_differ++;
                    CHECK(0, "probs V=%lld T=%g k=%d p=%g row %d (shape %d): %lld tokens kept by one side only "
                          "(cut margin %.3g)", (long long)V, (double)s.temperature, s.top_k, (double)s.top_p, r, r,
                          (long long)diff, m);
                }
            }
            release(&x);
            release(&pg);
        }
        free(l), free(g), free(c), free(plain);
    }
    printf("  probs (V 151936 / 3000 / 7, %d settings, 4 shapes): worst err %.2e (bound %.0e); kept sets equal in "
           "%d of %d rows, %d borderline cuts\n", N_SAMP, worst, SAMPLE_PROB_TOL, rows - kept_differ - borderline,
           rows, borderline);
}

/* Draws from the same rows (uploaded identically) with the same uniforms. */
static void test_sample_draw(void) {
    const int64_t Vs[] = {151936, 7};
    int draws = 0, differ = 0, excluded = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        const int R = 24;
        float *l = malloc((size_t)V * sizeof *l), *p = malloc((size_t)(R * V) * sizeof *p);
        for (int r = 0; r < R; r++) {
            float *row = p + (size_t)r * V;
            if (r == R - 2) { /* one-hot */
                memset(row, 0, (size_t)V * sizeof *row);
                row[V / 2] = 1.0f;
            } else if (r == R - 1) { /* nothing: the host returns 0 */
                memset(row, 0, (size_t)V * sizeof *row);
            } else {
                shaped_logits(l, V, r % 4);
                const ds_sampling s = samp(&SAMP[r % N_SAMP]);
                ds_probs_from_logits(l, (int)V, &s, row);
            }
        }
        pair pp = act(R, V, p);
        for (int trial = 0; trial < 8; trial++) {
            double u[24];
            for (int r = 0; r < R; r++) u[r] = trial == 0 ? 0.0 : trial == 1 ? 0.9999999999999999 : ds_rng_uniform(&urng);
            int32_t g[24], c[24];
            gpu->ops->sample(gpu, pp.g, u, g);
            cpu->ops->sample(cpu, pp.c, u, c);
            check_gpu_ok("sample");
            for (int r = 0; r < R; r++) {
                draws++;
                if (g[r] == c[r]) continue;
                if (draw_margin(p + (size_t)r * V, V, u[r]) < DRAW_EPS) {
                    excluded++;
                    continue;
                }
                differ++;
                CHECK(0, "sample V=%lld row %d u=%.17g: gpu %d, cpu %d", (long long)V, r, u[r], g[r], c[r]);
            }
        }
        release(&pp);
        free(l), free(p);
    }
    printf("  sample: %d draws, %d differ, %d excluded (u within %.0e of a CDF step)\n", draws, differ, excluded,
           DRAW_EPS);
    CHECK(excluded * 50 <= draws, "%d of %d draws excluded", excluded, draws);
}

/* ds_verify_uniforms' rule on processed rows pt[n+1][V], pd[n][V]; *margin:
 * the closest any uniform came to its boundary (relative). */
static int host_rule(const float *pt, const float *pd, const int32_t *x, int n, int64_t V, const double *u,
                     float *res, int32_t *next, double *margin) {
    int a = 0;
    *margin = INFINITY;
    for (; a < n; a++) {
        const double q = pd[(size_t)a * V + x[a]];
        const double ratio = (double)pt[(size_t)a * V + x[a]] / (q > 1e-8 ? q : 1e-8);
        *margin = fmin(*margin, fabs(u[a] - ratio) / fmax(ratio, 1e-300));
        if (!(u[a] < ratio)) break;
    }
    const float *row = pt + (size_t)a * V;
    if (a < n) {
        double mass = 0;
        for (int64_t i = 0; i < V; i++) {
            const float r = row[i] - pd[(size_t)a * V + i];
            res[i] = r > 0 ? r : 0;
            mass += res[i];
        }
        if (mass > 1e-8) row = res;
    }
    *next = ds_sample_probs_u(row, (int)V, u[n]);
    *margin = fmin(*margin, draw_margin(row, V, u[n]));
    return a;
}

/* Rejection sampling rounds on both backends: the same (accepted, next). */
static void test_sample_verify(void) {
    const int64_t Vs[] = {151936, 3000};
    const int NS[] = {0, 1, 3, 8};
    int rounds = 0, differ = 0, excluded = 0, none = 0, partial = 0, all = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        const int64_t V = Vs[vi];
        const int NMAX = 8;
        float *tl = malloc((size_t)((NMAX + 1) * V) * sizeof *tl), *dl = malloc((size_t)V * sizeof *dl);
        float *dp = malloc((size_t)(NMAX * V) * sizeof *dp), *ptc = malloc((size_t)((NMAX + 1) * V) * sizeof *ptc);
        float *ptg = malloc((size_t)((NMAX + 1) * V) * sizeof *ptg), *res = malloc((size_t)V * sizeof *res);
        for (int si = 0; si < N_SAMP; si++) {
            const ds_sampling s = samp(&SAMP[si]);
            for (int trial = 0; trial < (V > 100000 ? 4 : 12); trial++) {
                const int n = NS[trial % 4];
                int32_t x[8];
                for (int r = 0; r <= n; r++) shaped_logits(tl + (size_t)r * V, V, (trial / 4 + r) % 3);
                for (int i = 0; i < n; i++) {
                    const float noise = trial % 2 ? 0.2f : 2.0f;
                    for (int64_t j = 0; j < V; j++) dl[j] = tl[(size_t)i * V + j] + noise * frand();
                    ds_probs_from_logits(dl, (int)V, &s, dp + (size_t)i * V);
                    x[i] = ds_sample_probs(dp + (size_t)i * V, (int)V, &urng);
                }
                double u[9];
                for (int i = 0; i <= n; i++) u[i] = ds_rng_uniform(&urng);
                pair lt = act(n + 1, V, tl), pd = act(n > 0 ? n : 1, V, n > 0 ? dp : NULL), pt = act(n + 1, V, NULL);
                const ds_tensor dg = n > 0 ? pd.g : ds_no_tensor(), dc = n > 0 ? pd.c : ds_no_tensor();
                int32_t g[2], c[2];
                gpu->ops->verify_sample(gpu, lt.g, x, n, dg, &s, u, g);
                cpu->ops->verify_sample(cpu, lt.c, x, n, dc, &s, u, c);
                gpu->ops->probs(gpu, pt.g, lt.g, &s); /* for the borderline analysis */
                cpu->ops->probs(cpu, pt.c, lt.c, &s);
                check_gpu_ok("verify_sample");
                gpu->ops->download(gpu, pt.g, ptg);
                cpu->ops->download(cpu, pt.c, ptc);
                int32_t want_c, want_g;
                double mc, mg;
                const int ac = host_rule(ptc, dp, x, n, V, u, res, &want_c, &mc);
                const int ag = host_rule(ptg, dp, x, n, V, u, res, &want_g, &mg);
                CHECK(c[0] == ac && c[1] == want_c, "cpu verify_sample (%d, %d) vs the host rule (%d, %d)", c[0], c[1],
                      ac, want_c);
                rounds++;
                if (n > 0) none += ac == 0, partial += ac > 0 && ac < n, all += ac == n;
                if (g[0] != c[0] || g[1] != c[1]) {
                    if (ac != ag || want_c != want_g || fmin(mc, mg) < DRAW_EPS) {
                        excluded++;
                    } else {
                        differ++;
                        CHECK(0, "verify_sample V=%lld T=%g k=%d p=%g n=%d: gpu (%d, %d), cpu (%d, %d)", (long long)V,
                              (double)s.temperature, s.top_k, (double)s.top_p, n, g[0], g[1], c[0], c[1]);
                    }
                }
                release(&lt), release(&pd), release(&pt);
            }
        }
        free(tl), free(dl), free(dp), free(ptc), free(ptg), free(res);
    }
    printf("  verify_sample: %d rounds (%d reject the first draft, %d accept part, %d accept all), %d differ, "
           "%d excluded (borderline)\n", rounds, none, partial, all, differ, excluded);
    CHECK(excluded * 50 <= rounds, "%d of %d rounds excluded", excluded, rounds);
    CHECK(none > 0 && partial > 0 && all > 0, "every acceptance path is exercised");
    /* Greedy is argmax's business; more drafts than a launch takes are refused. */
    pair l = act_rand(2, 16, 1.0f);
    const ds_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f}, t1 = {.temperature = 1.0f, .top_p = 1.0f};
    const double u[2] = {0.5, 0.5};
    int32_t out[2];
    gpu->ops->verify_sample(gpu, l.g, NULL, 0, ds_no_tensor(), &greedy, u, out);
    CHECK_ERR(ds_backend_check(gpu), "greedy");
    int32_t many[65] = {0};
    gpu->ops->verify_sample(gpu, l.g, many, 65, l.g, &t1, u, out);
    CHECK_ERR(ds_backend_check(gpu), "cuda verify_sample");
    release(&l);
}

/* A weight on both backends from values exact in dt. */
static pair weight_of(ds_dtype dt, const float *v, int64_t rows, int64_t cols) {
    pair p = {0};
    const size_t n = (size_t)(rows * cols), es = ds_dtype_size(dt);
    p.host = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == DS_BF16) ((uint16_t *)p.host)[i] = ds_f32_to_bf16(v[i]);
        else ((float *)p.host)[i] = v[i];
    }
    weight_load(&p, dt, rows, cols);
    return p;
}

/* The sampled Markov walk on both backends. Values are small multiples of
 * powers of two (as test_markov_greedy's), so the corrected logits are
 * exact on both and must agree to the bit, and so must the Markov inputs
 * (emb); the distributions within SAMPLE_PROB_TOL; the drawn tokens
 * exactly, up to the first step whose uniform is borderline (excluded:
 * the walks may part there, so the rest of that walk is not compared). */
static void test_sample_markov(void) {
    /* r = 60: w2's rows miss the one-launch step's alignment (gather, linear, add instead). */
    const struct {
        int64_t V;
        int r;
    } cfg[] = {{3000, 64}, {3000, 60}, {151936, 64}};
    int walks = 0, steps = 0, differ = 0, excluded = 0, logits_differ = 0, emb_differ = 0;
    double worst = 0;
    for (size_t vi = 0; vi < sizeof cfg / sizeof cfg[0]; vi++) {
        const int64_t V = cfg[vi].V;
        const int r = cfg[vi].r;
        const int G = V > 100000 ? 4 : 7;
        float *w1 = malloc((size_t)(V * r) * sizeof *w1), *w2 = malloc((size_t)(V * r) * sizeof *w2);
        float *base = malloc((size_t)(G * V) * sizeof *base), *pg = malloc((size_t)(G * V) * sizeof *pg);
        float *pc = malloc((size_t)(G * V) * sizeof *pc), *og = malloc((size_t)(G * V) * sizeof *og);
        float *oc = malloc((size_t)(G * V) * sizeof *oc);
        float eg[8 * 64], ec[8 * 64];
        for (int64_t i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
        for (int64_t i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 256.0f;
        for (int head = 0; head < 3; head++) { /* bf16 head, fp32 head, none */
            const bool markov = head < 2, bf16 = head == 0;
            const ds_dtype dt = bf16 ? DS_BF16 : DS_F32;
            pair pw1 = markov ? weight_of(dt, w1, V, r) : (pair){0}, pw2 = markov ? weight_of(dt, w2, V, r) : (pair){0};
            for (int si = 0; si < N_SAMP; si += (V > 100000 ? 3 : 1)) {
                const ds_sampling s = samp(&SAMP[si]);
                for (int64_t i = 0; i < G * V; i++) base[i] = (float)(int)(frand() * 96) / (si % 2 ? 4.0f : 64.0f);
                pair pb = act(G, V, base), po = act(G, V, NULL), pp = act(G, V, NULL), pe = act(G, r + 3, NULL);
                const bool keep = si % 2 == 0;
                double u[8];
                for (int k = 0; k < G; k++) u[k] = ds_rng_uniform(&urng);
                const int32_t anchor = (int32_t)(V / 3 + si);
                int32_t tg[8], tc[8];
                gpu->ops->markov_sample(gpu, pb.g, keep ? po.g : ds_no_tensor(), pp.g, markov ? pw1.g : ds_no_tensor(),
                                        markov ? pw2.g : ds_no_tensor(), bf16, anchor, &s, u,
                                        markov ? ds_cols(pe.g, 2, r) : ds_no_tensor(), tg);
                cpu->ops->markov_sample(cpu, pb.c, keep ? po.c : ds_no_tensor(), pp.c, markov ? pw1.c : ds_no_tensor(),
                                        markov ? pw2.c : ds_no_tensor(), bf16, anchor, &s, u,
                                        markov ? ds_cols(pe.c, 2, r) : ds_no_tensor(), tc);
                check_gpu_ok("markov_sample");
                gpu->ops->download(gpu, pp.g, pg);
                cpu->ops->download(cpu, pp.c, pc);
                if (keep) {
                    gpu->ops->download(gpu, po.g, og);
                    cpu->ops->download(cpu, po.c, oc);
                }
                if (markov) {
                    gpu->ops->download(gpu, ds_cols(pe.g, 2, r), eg);
                    cpu->ops->download(cpu, ds_cols(pe.c, 2, r), ec);
                }
                walks++;
                for (int k = 0; k < G; k++) {
                    const size_t o = (size_t)k * V;
                    if (keep) logits_differ += memcmp(og + o, oc + o, (size_t)V * sizeof *og) != 0;
                    if (markov) emb_differ += memcmp(eg + k * r, ec + k * r, (size_t)r * sizeof *eg) != 0;
                    worst = fmax(worst, rel_err_max(pg + o, pc + o, (size_t)V));
                    steps++;
                    if (tg[k] == tc[k]) continue;
                    if (ds_sample_probs_u(pg + o, (int)V, u[k]) != ds_sample_probs_u(pc + o, (int)V, u[k]) ||
                        draw_margin(pc + o, V, u[k]) < DRAW_EPS) {
                        excluded++;
                    } else {
                        differ++;
                        CHECK(0, "markov_sample V=%lld head %d T=%g k=%d p=%g step %d: gpu %d, cpu %d", (long long)V,
                              head, (double)s.temperature, s.top_k, (double)s.top_p, k, tg[k], tc[k]);
                    }
                    break; /* the walks part here */
                }
                release(&pb), release(&po), release(&pp), release(&pe);
            }
            if (markov) release(&pw1), release(&pw2);
        }
        free(w1), free(w2), free(base), free(pg), free(pc), free(og), free(oc);
    }
    printf("  markov_sample (V 3000 r 64 / 60, V 151936 r 64; bf16, fp32, no head): %d walks, %d steps: %d tokens differ, %d excluded "
           "(borderline); distributions worst err %.2e (bound %.0e); corrected logits differ in %d rows, Markov "
           "inputs in %d\n", walks, steps, differ, excluded, worst, SAMPLE_PROB_TOL, logits_differ, emb_differ);
    CHECK(worst <= SAMPLE_PROB_TOL, "markov_sample distributions: normalized error %.3g", worst);
    CHECK(logits_differ == 0 && emb_differ == 0, "corrected logits / Markov inputs differ");
}

/* What a verification round and a drafted block cost on the GPU at Qwen3's
 * vocabulary (reported, not checked): verify_sample of 17 rows (16 drafts)
 * and a 16-position sampled walk (vanilla head, r = 256, bf16), with
 * top-k 20 and top-p 0.95, and without truncation. */
static void test_sample_speed(void) {
    const int64_t V = 151936, G = 16, r = 256;
    float *l = malloc((size_t)((G + 1) * V) * sizeof *l);
    for (int64_t i = 0; i < (G + 1) * V; i++) l[i] = 4.0f * frand();
    float *w = malloc((size_t)(V * r) * sizeof *w);
    for (int64_t i = 0; i < V * r; i++) w[i] = (float)(int)(frand() * 16) / 256.0f;
    pair lt = act(G + 1, V, l), pd = act(G, V, NULL), pb = act(G, V, l), pe = act(G, r, NULL);
    pair pw1 = weight_of(DS_BF16, w, V, r), pw2 = weight_of(DS_BF16, w, V, r);
    const ds_sampling sets[2] = {{.temperature = 0.8f, .top_k = 20, .top_p = 0.95f}, {.temperature = 1.0f, .top_p = 1.0f}};
    for (int si = 0; si < 2; si++) {
        const ds_sampling *s = &sets[si];
        gpu->ops->probs(gpu, pd.g, ds_rows(lt.g, 0, G), s);
        int32_t x[16], out[2], tok[16];
        for (int i = 0; i < G; i++) x[i] = (int32_t)(i * 1000);
        double u[17];
        for (int i = 0; i <= G; i++) u[i] = ds_rng_uniform(&urng);
        const int reps = 10;
        double tv = 0, tv8 = 0, tm = 0, tp = 0;
        for (int rep = -1; rep < reps; rep++) { /* one warm-up */
            double t0 = now_s();
            gpu->ops->verify_sample(gpu, lt.g, x, (int)G, pd.g, s, u, out);
            double t1 = now_s();
            gpu->ops->markov_sample(gpu, pb.g, ds_no_tensor(), pd.g, pw1.g, pw2.g, true, 5, s, u, pe.g, tok);
            double t2 = now_s();
            gpu->ops->verify_sample(gpu, ds_rows(lt.g, 0, 9), x, 8, pd.g, s, u, out);
            double t3 = now_s();
            gpu->ops->probs(gpu, pd.g, ds_rows(lt.g, 0, G), s);
            check_gpu_ok("sampling speed");
            double t4 = now_s();
            if (rep >= 0) tv += t1 - t0, tm += t2 - t1, tv8 += t3 - t2, tp += t4 - t3;
        }
        check_gpu_ok("sampling speed");
        printf("  V=151936 T=%.1f top_k=%d top_p=%.2f: verify_sample (16 drafts) %.1f us, (8 drafts) %.1f us, "
               "markov_sample (16 steps, r=256 bf16) %.1f us (%.1f us a step), probs of 16 rows %.1f us\n",
               (double)s->temperature, s->top_k, (double)s->top_p, 1e6 * tv / reps, 1e6 * tv8 / reps,
               1e6 * tm / reps, 1e6 * tm / reps / G, 1e6 * tp / reps);
    }
    release(&lt), release(&pd), release(&pb), release(&pe), release(&pw1), release(&pw2);
    free(l), free(w);
}

static void setup(void) {
    CHECK_OK(ds_backend_cpu_new(2, &cpu));
    ds_rng_seed(&urng, 31337);
}
static void teardown(void) {
    check_gpu_ok("teardown");
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
}

#define CUDA_TESTS                                                                                             \
    setup, test_memory, test_embed, test_linear_vs_cpu, test_linear_row_invariance, test_fused_linear,         \
        test_fused_row_invariance, test_normed_x_paths, test_attention, test_norm_rope_attention,              \
        test_rmsnorm, test_rope, test_rmsnorm_rope, test_key_layers, test_elementwise, test_argmax, test_markov_greedy, test_markov_greedy_head,         \
        test_sample_probs, test_sample_draw, test_sample_verify, test_sample_markov, test_errors,              \
        test_linear_bandwidth, test_model_shapes_bandwidth, test_sample_speed, teardown

int main(void) {
    ds_cuda_config cfg;
    ds_error *e = ds_cuda_config_from_env(&cfg);
    if (e) {
        printf("FAIL: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    /* Every shape of these tests through the ring matmul where it applies (M <= 8), however few its tiles:
     * the engine sends small projections to the per-tile kernel, which the M > 8 calls check against it. */
    cfg.ring_min_tiles = 1;
    /* The fused norm + attention launch from one row on (the engine keeps decode's one row on the two ops). */
    cfg.fused_attn_min_rows = 1;
    /* Attention packs a kv head's query heads into one block however small the grid (the engine only packs
     * grids of DS_CU_ATT_PACK_MIN_BLOCKS blocks on), so the packed path is what every attention case here
     * checks. */
    cfg.att_pack_min_blocks = 1;
    const char *dev = getenv("DS_CUDA_DEVICE");
    e = ds_backend_cuda_new_with(dev ? atoi(dev) : 0, &cfg, &gpu);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        ds_error_free(e);
        return 77;
    }
    test_fn fns[] = {CUDA_TESTS};
    const char *names[] = {DS_STRINGS_(CUDA_TESTS)};
    return run_tests("cuda_ops", fns, names, (int)(sizeof fns / sizeof fns[0]));
}
