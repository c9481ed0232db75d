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
#include "draft/markov_bound.h"
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
    ds_st_tensor st = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = p.host, .nbytes = n * es};
    ds_error *e = gpu->ops->weight(gpu, &st, rows, cols, &p.g);
    if (!e) e = cpu->ops->weight(cpu, &st, rows, cols, &p.c);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
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
    for (int64_t i = 0; i < MAXM; i++) {
        gpu->ops->linear_swiglu(gpu, ds_rows(h1.g, i, 1), ds_rows(x.g, i, 1), wg.g, wu.g);
        gpu->ops->linear_residual(gpu, ds_rows(r1.g, i, 1), ds_rows(att.g, i, 1), wo.g, ds_no_tensor(),
                                  ds_rows(r1.g, i, 1));
    }
    gpu->ops->linear_swiglu(gpu, hm.g, x.g, wg.g, wu.g);
    gpu->ops->linear_residual(gpu, rm.g, att.g, wo.g, ds_no_tensor(), rm.g);
    /* The fused-norm variant too: each row's rms must not depend on the others. */
    pair nw = weight(DS_BF16, 1, K), n1 = act(MAXM, N, NULL), nm = act(MAXM, N, NULL);
    for (int64_t i = 0; i < MAXM; i++)
        gpu->ops->rmsnorm_linear_swiglu(gpu, ds_rows(n1.g, i, 1), ds_rows(x.g, i, 1), nw.g, 1e-6f, wg.g, wu.g);
    gpu->ops->rmsnorm_linear_swiglu(gpu, nm.g, x.g, nw.g, 1e-6f, wg.g, wu.g);
    float *e1 = fetch(gpu, n1.g), *em = fetch(gpu, nm.g);
    CHECK(!memcmp(e1, em, (size_t)(MAXM * N) * 4), "rmsnorm_linear_swiglu: rows of a 17-row call differ from 1-row calls");
    free(e1), free(em);
    float *a = fetch(gpu, h1.g), *b = fetch(gpu, hm.g), *c = fetch(gpu, r1.g), *d = fetch(gpu, rm.g);
    CHECK(!memcmp(a, b, (size_t)(MAXM * N) * 4), "linear_swiglu: rows of a 17-row call differ from 1-row calls");
    CHECK(!memcmp(c, d, (size_t)(MAXM * K) * 4), "linear_residual: rows of a 17-row call differ from 1-row calls");
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
    printf("  linear_swiglu, linear_residual, rmsnorm_linear_swiglu, rmsnorm_linear_multi bf16: rows of a 17-row call "
           "== 1-row calls, bitwise\n");
    free(a), free(b), free(c), free(d);
    check_gpu_ok("fused row invariance");
    pair *all[] = {&wg, &wu, &wo, &x, &att, &h1, &hm, &r1, &rm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
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
    /* Each row alone, as decode sees it: n_keys = its position + 1 when causal. */
    float *all = fetch(gpu, out.g);
    pair one = act(1, (int64_t)ac->H * ac->Dv, NULL);
    int bad = -1;
    for (int i = 0; i < ac->M && bad < 0; i++) {
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

static void test_attention(void) {
    const attn_case cases[] = {
        {"decode-like D=64 GQA 4/2, 1 row at 40", 4, 2, 64, 64, true, 0, 0, 40, 1, 0},
        {"verify D=64 GQA 4/2, 8 rows at 3", 4, 2, 64, 64, true, 0, 0, 3, 8, 0},
        {"verify D=128 16/8 across chunk 256", 16, 8, 128, 128, true, 0, 0, 250, 9, 0},
        {"verify D=128 8/1 rows at 700 (3 chunks)", 8, 1, 128, 128, true, 0, 0, 700, 5, 0},
        {"prefill D=16 4/2, 70 rows at 0", 4, 2, 16, 16, true, 0, 0, 0, 70, 0},
        {"D=256 sliding window 100, ring 128", 2, 1, 256, 256, true, 100, 128, 300, 6, 0},
        {"D=512 window 300 ring 512 at 1000", 2, 2, 512, 512, true, 300, 512, 1000, 4, 0},
        {"drafter non-causal D=64, 7 rows, 300 keys", 4, 2, 64, 64, false, 0, 0, 293, 7, 300},
        {"non-causal D=128 Dv=64, 5 rows, 20 keys", 4, 4, 128, 64, false, 0, 0, 15, 5, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(&cases[i]);
}

/* ---- norms, RoPE, element-wise ------------------------------------------ */

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
        ds_markov_bound_host hb;
        ds_error *e = ds_markov_bound_build(w2, DS_F32, V, r, DS_MARKOV_BOUND_K, &hb);
        CHECK(!e, "markov bound: %s", e ? ds_error_message(e) : "");
        if (e) {
            ds_error_free(e);
            break;
        }
        pair pp = act(hb.k, r, hb.proj), pc = act(V, hb.k, hb.coef), pr = act(1, V, hb.radius);
        const ds_markov_bound bound = {pp.g, pc.g, pr.g};
        for (int data = 0; data < 3; data++) {
            for (int i = 0; i < G * V; i++) base[i] = (float)(int)(frand() * 96) / (data == 1 ? 4.0f : 64.0f);
            if (data == 2) base[(size_t)3 * V] = NAN;
            for (int mode = 0; mode < 4; mode++) { /* bit 0: bf16; bit 1: tokens only (pruned) */
                const bool bf16 = mode & 1, pruned = mode & 2;
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
                printf("  markov_greedy (%s, %s, %s, %s): %d/%d tokens equal the host walk's%s\n", wnames[wk],
                       names[data], bf16 ? "bf16" : "fp32", pruned ? "tokens only" : "with logits", same, G,
                       pruned ? "" : logits_ok ? ", logits bit-identical" : ", logits DIFFER");
                CHECK(same == G, "markov_greedy (%s, %s): %d of %d tokens differ", wnames[wk], names[data], G - same,
                      G);
                CHECK(logits_ok, "markov_greedy: corrected logits differ");
                release(&pb);
                release(&po);
                release(&pe);
            }
        }
        release(&pp);
        release(&pc);
        release(&pr);
        ds_markov_bound_free(&hb);
        gpu->ops->release(gpu, &tw2);
    }
    gpu->ops->release(gpu, &tw1);
    free(base), free(w1), free(w2), free(want), free(got), free(b1), free(b2);
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
    const char *what[4] = {"qkv: rmsnorm_linear_multi (4096+1024+1024) x 4096", "o_proj: linear_residual 4096 x 4096",
                           "gate/up: rmsnorm_linear_swiglu 2 x 12288 x 4096", "down: linear_residual 4096 x 12288"};
    const double bytes[4] = {2.0 * (H + 2 * KV) * H, 2.0 * H * H, 4.0 * F * H, 2.0 * H * F};
    for (int mi = 0; mi < 2; mi++) {
        const int64_t M = mi ? 8 : 1;
        ds_tensor xh = ds_cols(ds_rows(xs.g, 0, M), 0, H), xf = ds_rows(xs.g, 0, M), hh = ds_rows(hs.g, 0, M);
        for (int op = 0; op < 4; op++) {
            const int reps = 40;
            double t0 = 0;
            for (int r = -2; r < reps; r++) { /* two warm-up calls */
                if (r == 0) {
                    check_gpu_ok("bandwidth warm-up");
                    t0 = now_s();
                }
                const int c = r & 1;
                if (op == 0) {
                    const ds_tensor outs[3] = {ds_rows(oq.g, 0, M), ds_rows(ok.g, 0, M), ds_rows(ov.g, 0, M)};
                    const ds_tensor ws[3] = {q[c], k[c], v[c]};
                    const ds_tensor bs[3] = {ds_no_tensor(), ds_no_tensor(), ds_no_tensor()};
                    gpu->ops->rmsnorm_linear_multi(gpu, 3, outs, xh, nw.g, 1e-6f, ws, bs);
                } else if (op == 1) {
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

static void setup(void) { CHECK_OK(ds_backend_cpu_new(2, &cpu)); }
static void teardown(void) {
    check_gpu_ok("teardown");
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
}

#define CUDA_TESTS                                                                                           \
    setup, test_memory, test_embed, test_linear_vs_cpu, test_linear_row_invariance, test_fused_linear,          \
        test_fused_row_invariance, test_attention, test_rmsnorm, test_rope, test_rmsnorm_rope, test_elementwise,  \
        test_argmax, test_markov_greedy, test_errors, test_linear_bandwidth, test_model_shapes_bandwidth, teardown

int main(void) {
    /* Every shape of these tests through the ring matmul where it applies (M <= 8), however few its tiles:
     * the engine sends small projections to the per-tile kernel, which the M > 8 calls check against it. */
    setenv("DS_CUDA_RING_MIN_TILES", "1", 0);
    const char *dev = getenv("DS_CUDA_DEVICE");
    ds_error *e = ds_backend_cuda_new(dev ? atoi(dev) : 0, &gpu);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        ds_error_free(e);
        return 77;
    }
    test_fn fns[] = {CUDA_TESTS};
    const char *names[] = {DS_STRINGS_(CUDA_TESTS)};
    return run_tests("cuda_ops", fns, names, (int)(sizeof fns / sizeof fns[0]));
}
