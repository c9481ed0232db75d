/* The CPU backend's narrow matmul, its fused forms and attention, bit for
 * bit:
 * - row invariance: every row of an M-row call (M = 1..32, x rows at an odd
 *   stride) equals the same row computed alone;
 * - weights that came through weight() (cached, repacked panels) give the
 *   same bits as the same values in a plain allocated tensor (packed per
 *   call), for bf16, f16 and f32 weights, N and K not multiples of 16 or 8;
 * - linear_multi / linear_residual / linear_swiglu equal the unfused
 *   sequence (linear, add, swiglu);
 * - accuracy against a double-precision reference (the kernels sum in fp32);
 * - a released weight's cached panels are gone: a new tensor at the same
 *   address is not served stale panels;
 * - attention (GQA groups 1..8, head sizes not multiples of 8, Dv != D,
 *   causal with and without a sliding window over a ring cache, and the
 *   drafter's non-causal mode): every row of an M-row call equals the row
 *   computed alone (with decode's n_keys = pos + 1 when causal);
 * - a scratch buffer that cannot be had is reported by check(), once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "testlib.h"

static ds_backend *be;
static uint64_t seed = 0x9E3779B97F4A7C15ull;

/* CHECK_OK for helpers that return a value. */
static void must(ds_error *e) { CHECK_OK(e); }

static float rnd(void) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint16_t f32_to_f16(float f) { /* test data only: normal range, truncating */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = (u >> 13) & 0x3ff;
    if (e < 113) return (uint16_t)s;
    return (uint16_t)(s | ((e - 112) << 10) | m);
}

/* A weight of N x K values in dtype: via weight() (from host bytes) and as a
 * plain allocated tensor with the same bytes. */
typedef struct {
    void *host;
    ds_tensor cached, plain;
} weight;

static weight make_weight(ds_dtype dt, int N, int K) {
    weight w = {0};
    size_t es = ds_dtype_size(dt), bytes = (size_t)N * K * es;
    w.host = malloc(bytes);
    for (int i = 0; i < N * K; i++) {
        float v = rnd() * 0.5f;
        if (dt == DS_BF16) ((uint16_t *)w.host)[i] = ds_f32_to_bf16(v);
        else if (dt == DS_F16) ((uint16_t *)w.host)[i] = f32_to_f16(v);
        else ((float *)w.host)[i] = v;
    }
    ds_st_tensor st = {.name = "w", .dtype = dt, .ndim = 2, .shape = {N, K}, .data = w.host, .nbytes = bytes};
    must(be->ops->weight(be, &st, N, K, &w.cached));
    must(be->ops->alloc(be, dt, N, K, &w.plain));
    memcpy(w.plain.data, w.host, bytes);
    return w;
}

static void free_weight(weight *w) {
    be->ops->release(be, &w->cached);
    be->ops->release(be, &w->plain);
    free(w->host);
}

static ds_tensor filled(int rows, int cols, int stride) {
    ds_tensor t;
    must(be->ops->alloc(be, DS_F32, rows, stride, &t));
    for (int i = 0; i < rows * stride; i++) ((float *)t.data)[i] = rnd();
    t.cols = cols;
    return t;
}

static bool same_rows(ds_tensor a, int ra, ds_tensor b, int rb) {
    return !memcmp((const float *)a.data + ra * a.stride, (const float *)b.data + rb * b.stride,
                   (size_t)a.cols * sizeof(float));
}

static void test_row_invariance_and_caching(void) {
    const ds_dtype dts[] = {DS_BF16, DS_F16, DS_F32};
    const int shapes[][2] = {{1, 8}, {13, 7}, {64, 256}, {100, 72}, {300, 33}};
    int bad = 0, checked = 0;
    double worst = 0;
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int N = shapes[s][0], K = shapes[s][1];
            weight w = make_weight(dts[d], N, K);
            ds_tensor x = filled(32, K, K + 3), one, all, plain;
            CHECK_OK(be->ops->alloc(be, DS_F32, 1, N, &one));
            CHECK_OK(be->ops->alloc(be, DS_F32, 32, N, &all));
            CHECK_OK(be->ops->alloc(be, DS_F32, 32, N, &plain));
            ds_tensor bias;
            CHECK_OK(be->ops->alloc(be, DS_F32, 1, N, &bias));
            for (int i = 0; i < N; i++) ((float *)bias.data)[i] = rnd();
            for (int M = 1; M <= 32; M++) {
                be->ops->linear(be, ds_rows(all, 0, M), ds_rows(x, 0, M), w.cached, bias);
                be->ops->linear(be, ds_rows(plain, 0, M), ds_rows(x, 0, M), w.plain, bias);
                for (int r = 0; r < M; r++) {
                    be->ops->linear(be, one, ds_rows(x, r, 1), w.cached, bias);
                    bad += !same_rows(all, r, one, 0) || !same_rows(plain, r, one, 0);
                    checked++;
                }
            }
            /* accuracy of the last call's rows (M = 32) */
            float wf[1];
            for (int r = 0; r < 32; r++)
                for (int n = 0; n < N; n++) {
                    double ref = ((float *)bias.data)[n], mag = fabs(ref);
                    for (int k = 0; k < K; k++) {
                        ds_to_f32(dts[d], (const char *)w.host + ((size_t)n * K + k) * ds_dtype_size(dts[d]), wf, 1);
                        float xv = ((float *)x.data)[r * x.stride + k];
                        if (DS_X_BF16_ON && dts[d] == DS_BF16) ds_round_bf16_n(&xv, 1); /* the DS_X_BF16 build */
                        double p = (double)xv * wf[0];
                        ref += p;
                        mag += fabs(p);
                    }
                    double err = fabs(((float *)all.data)[r * all.stride + n] - ref) / (mag + 1e-30);
                    if (err > worst) worst = err;
                }
            be->ops->release(be, &x);
            be->ops->release(be, &one);
            be->ops->release(be, &all);
            be->ops->release(be, &plain);
            be->ops->release(be, &bias);
            free_weight(&w);
        }
    printf("  %d rows compared bitwise (M = 1..32, cached and per-call panels), worst error %.2g of sum |x w|\n",
           checked, worst);
    CHECK(bad == 0, "%d of %d rows differ from the row computed alone", bad, checked);
    CHECK(worst < 1e-6, "error %.3g of sum |x w| against a double reference", worst);
}

static void test_fused_equal_unfused(void) {
    const int K = 72, N = 200, N2 = 96;
    weight a = make_weight(DS_BF16, N, K), b = make_weight(DS_BF16, N, K), c = make_weight(DS_BF16, N2, K);
    int bad = 0;
    /* Narrow sizes, then wide ones (prefill: the unfused sequence through
     * the backend's temp buffer, grown, then reused at a smaller size). */
    const int Ms[] = {1, 8, 15, 22, 29, 40, 70, 40};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int M = Ms[mi];
        ds_tensor x = filled(M, K, K), res = filled(M, N, N), r1 = filled(M, N, N), r2, t1, t2, t3, u1, u2, u3;
        memcpy(r1.data, res.data, (size_t)M * N * sizeof(float));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N, &r2));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N, &t1));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N, &t2));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N2, &t3));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N, &u1));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N, &u2));
        CHECK_OK(be->ops->alloc(be, DS_F32, M, N2, &u3));
        /* residual, in place (out = res) as the models use it */
        be->ops->linear_residual(be, r1, x, a.cached, ds_no_tensor(), r1);
        be->ops->linear(be, t1, x, a.cached, ds_no_tensor());
        be->ops->add(be, r2, res, t1);
        bad += memcmp(r1.data, r2.data, (size_t)M * N * sizeof(float)) != 0;
        /* swiglu */
        be->ops->linear_swiglu(be, u1, x, a.cached, b.cached);
        be->ops->linear(be, t1, x, a.cached, ds_no_tensor());
        be->ops->linear(be, t2, x, b.cached, ds_no_tensor());
        be->ops->swiglu(be, t1, t1, t2);
        bad += memcmp(u1.data, t1.data, (size_t)M * N * sizeof(float)) != 0;
        /* multi: three projections of different widths */
        const ds_tensor outs[3] = {u1, u2, u3}, ws[3] = {a.cached, b.cached, c.cached};
        be->ops->linear_multi(be, 3, outs, x, ws, NULL);
        be->ops->linear(be, t1, x, a.cached, ds_no_tensor());
        be->ops->linear(be, t2, x, b.cached, ds_no_tensor());
        be->ops->linear(be, t3, x, c.cached, ds_no_tensor());
        bad += memcmp(u1.data, t1.data, (size_t)M * N * sizeof(float)) != 0;
        bad += memcmp(u2.data, t2.data, (size_t)M * N * sizeof(float)) != 0;
        bad += memcmp(u3.data, t3.data, (size_t)M * N2 * sizeof(float)) != 0;
        ds_tensor *all[] = {&x, &res, &r1, &r2, &t1, &t2, &t3, &u1, &u2, &u3};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
    }
    CHECK(bad == 0, "%d fused results differ from the unfused sequence", bad);
    free_weight(&a);
    free_weight(&b);
    free_weight(&c);
}

/* A weight released and another registered at the same address (as when
 * one checkpoint is closed and the next mapped there): the second must not
 * be served the first one's cached panels. */
static void test_release_forgets_panels(void) {
    const int N = 48, K = 40;
    uint16_t *host = malloc((size_t)N * K * 2);
    for (int i = 0; i < N * K; i++) host[i] = ds_f32_to_bf16(rnd());
    ds_st_tensor st = {.name = "w", .dtype = DS_BF16, .ndim = 2, .shape = {N, K}, .data = host, .nbytes = (size_t)N * K * 2};
    ds_tensor w, x = filled(2, K, K), y1, y2;
    CHECK_OK(be->ops->alloc(be, DS_F32, 2, N, &y1));
    CHECK_OK(be->ops->alloc(be, DS_F32, 2, N, &y2));
    CHECK_OK(be->ops->weight(be, &st, N, K, &w));
    be->ops->linear(be, y1, x, w, ds_no_tensor());
    be->ops->release(be, &w);
    for (int i = 0; i < N * K; i++) host[i] = ds_f32_to_bf16(rnd()); /* new contents, same address */
    CHECK_OK(be->ops->weight(be, &st, N, K, &w));
    be->ops->linear(be, y1, x, w, ds_no_tensor());
    ds_tensor plain;
    CHECK_OK(be->ops->alloc(be, DS_BF16, N, K, &plain));
    memcpy(plain.data, host, (size_t)N * K * 2);
    be->ops->linear(be, y2, x, plain, ds_no_tensor());
    CHECK(!memcmp(y1.data, y2.data, (size_t)2 * N * sizeof(float)), "stale panels after release");
    ds_tensor *all[] = {&w, &x, &y1, &y2, &plain};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->release(be, all[i]);
    free(host);
}

static void test_attention_row_invariance(void) {
    typedef struct {
        int heads, kv, D, Dv, window, ring;
        bool causal;
    } cfg;
    const cfg cs[] = {{4, 2, 64, 64, 0, 0, true}, {4, 4, 20, 20, 0, 0, true},  {8, 1, 64, 72, 0, 0, true},
                      {6, 3, 16, 16, 5, 8, true}, {4, 2, 64, 64, 0, 0, false}, {32, 4, 8, 8, 0, 0, true}};
    int bad = 0, checked = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const cfg *f = &cs[c];
        const int pos0 = 37, cache = f->ring ? f->ring : 80;
        const int Ms[] = {1, 2, 3, 8, 13, 19};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi]; /* the cache is fixed: every row reads the same keys as when alone */
            ds_tensor q = filled(M, f->heads * f->D, f->heads * f->D + 1), k = filled(cache, f->kv * f->D, f->kv * f->D);
            ds_tensor v = filled(cache, f->kv * f->Dv, f->kv * f->Dv), all, one;
            must(be->ops->alloc(be, DS_F32, M, f->heads * f->Dv, &all));
            must(be->ops->alloc(be, DS_F32, 1, f->heads * f->Dv, &one));
            int32_t pos[32];
            for (int i = 0; i < M; i++) pos[i] = pos0 + i;
            ds_attn_params ap = {.n_heads = f->heads, .n_kv_heads = f->kv, .head_dim = f->D, .v_head_dim = f->Dv,
                                 .n_keys = f->causal ? pos0 + M : pos0 + 7, .causal = f->causal, .window = f->window,
                                 .ring_size = f->ring, .scale = 0.3f, .q_pos = pos};
            be->ops->attention(be, all, q, k, v, &ap);
            for (int r = 0; r < M; r++) {
                ds_attn_params a1 = ap;
                a1.q_pos = pos + r;
                if (f->causal) a1.n_keys = pos[r] + 1;
                be->ops->attention(be, one, ds_rows(q, r, 1), k, v, &a1);
                bad += !same_rows(all, r, one, 0);
                checked++;
            }
            ds_tensor *ts[] = {&q, &k, &v, &all, &one};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) be->ops->release(be, ts[i]);
        }
    }
    CHECK(bad == 0, "%d of %d attention rows differ from the row computed alone", bad, checked);
}

static void setup(void) { CHECK_OK(ds_backend_cpu_new(2, &be)); }
static void teardown(void) { be->ops->destroy(be); }

/* Ops have no error return: a buffer the backend cannot get is recorded and
 * check() reports it once, naming the op (a size no allocator can give,
 * refused before asking, so the test runs the same under sanitizers). */
static void test_failure_reported(void) {
    CHECK(ds_backend_check(be) == NULL, "a failure was pending before the test");
    CHECK(ds_cpu_scratch(be, "attention", 0, DS_SCRATCH_SCORES, SIZE_MAX / 2) == NULL,
          "an impossible scratch was granted");
    ds_error *e = ds_backend_check(be);
    CHECK(e != NULL, "check() did not report the failed scratch");
    if (e) {
        printf("  reported: %s\n", ds_error_message(e));
        CHECK(strstr(ds_error_message(e), "cpu attention: out of memory") != NULL, "message: %s",
              ds_error_message(e));
        ds_error_free(e);
    }
    CHECK(ds_backend_check(be) == NULL, "check() did not clear the failure");
    /* The slot still works at a sane size afterwards. */
    CHECK(ds_cpu_scratch(be, "attention", 0, DS_SCRATCH_SCORES, 1024) != NULL, "scratch after a failure");
    CHECK(ds_backend_check(be) == NULL, "a sane scratch recorded a failure");
}

RUN_TESTS("cpu_matmul", setup, test_row_invariance_and_caching, test_fused_equal_unfused, test_release_forgets_panels,
          test_attention_row_invariance, test_failure_reported, teardown)
