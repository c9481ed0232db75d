/* The principal-directions bound of the Markov bias (draft/markov_bound.c).
 * What the device walk relies on: for any e, the bias the GPU computes in
 * fp32 lies within radius[n] |e| (inflated as the kernel inflates it) of
 * coef[n] . (proj e) as the GPU computes that. Checked here with fp32 sums
 * in a worse order than the GPU's (one long chain), on a low-rank + noise
 * matrix, on an exactly low-rank one (where the radius must be tiny), and
 * on the bundled pico drafter's trained head with its own w1 rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/markov_bound.h"
#include "io/checkpoint.h"
#include "testlib.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* The worst ratio (computed |bias - c|) / (allowed radius) over the rows,
 * for e: > 1 means the bound failed. fp32 as on the device; *mean_rel gets
 * the mean radius[n] / |w2[n]|. */
static double worst_ratio(const ds_markov_bound_host *b, const float *w2, int64_t V, const float *e,
                          double *mean_rel) {
    const int r = b->r, k = b->k;
    float p[DS_MARKOV_BOUND_K], ss = 0;
    for (int j = 0; j < k; j++) {
        float s = 0;
        for (int i = 0; i < r; i++) s = fmaf(b->proj[(size_t)j * r + i], e[i], s);
        p[j] = s;
    }
    for (int i = 0; i < r; i++) ss = fmaf(e[i], e[i], ss);
    const float ne = sqrtf(ss) * (1.0f + 1.0f / 1024.0f);
    double worst = 0, rel = 0;
    for (int64_t n = 0; n < V; n++) {
        const float *w = w2 + (size_t)n * r;
        float bias = 0, c = 0;
        double wn = 0;
        for (int i = 0; i < r; i++) bias = fmaf(w[i], e[i], bias), wn += (double)w[i] * w[i];
        for (int j = 0; j < k; j++) c = fmaf(b->coef[(size_t)n * k + j], p[j], c);
        const float rad = fmaf(b->radius[n], ne, fabsf(c) * 0x1p-22f);
        const double ratio = rad > 0 ? fabs((double)bias - c) / rad : (bias == c ? 0 : INFINITY);
        if (ratio > worst) worst = ratio;
        rel += wn > 0 ? b->radius[n] / sqrt(wn) : 0;
    }
    if (mean_rel) *mean_rel = rel / (double)V;
    return worst;
}

static float bf16_round(float x) { return ds_bf16_to_f32(ds_f32_to_bf16(x)); }

static void test_low_rank_plus_noise(void) {
    const int64_t V = 4000;
    const int r = 64, rank = 5;
    float *w2 = malloc((size_t)V * r * sizeof *w2), basis[5][64];
    for (int q = 0; q < rank; q++)
        for (int i = 0; i < r; i++) basis[q][i] = (float)(frand() * 2 - 1);
    for (int64_t n = 0; n < V; n++) {
        double a[5];
        for (int q = 0; q < rank; q++) a[q] = (frand() * 2 - 1) / (q + 1);
        for (int i = 0; i < r; i++) {
            double v = 0.02 * (frand() * 2 - 1);
            for (int q = 0; q < rank; q++) v += a[q] * basis[q][i];
            w2[(size_t)n * r + i] = bf16_round((float)v);
        }
    }
    ds_markov_bound_host b;
    CHECK_OK(ds_markov_bound_build(w2, DS_F32, V, r, DS_MARKOV_BOUND_K, &b));
    CHECK(b.k == DS_MARKOV_BOUND_K && b.r == r && b.vocab == V, "shape k %d r %d V %lld", b.k, b.r,
          (long long)b.vocab);
    double worst = 0, rel = 0;
    float e[64];
    for (int t = 0; t < 200; t++) {
        const double scale = t < 100 ? 1.0 : 1000.0 * frand();
        for (int i = 0; i < r; i++) e[i] = (float)((frand() * 2 - 1) * scale);
        if (t == 199) /* along a row's own rest: the radius must hold with equality in spirit */
            for (int i = 0; i < r; i++) {
                double v = w2[i];
                for (int j = 0; j < b.k; j++) v -= (double)b.coef[j] * b.proj[(size_t)j * r + i];
                e[i] = (float)v;
            }
        const double w = worst_ratio(&b, w2, V, e, &rel);
        if (w > worst) worst = w;
    }
    printf("  low rank 5 + noise (V %lld, r %d, k %d): worst |bias - c| / radius %.3f, mean radius / |w2[n]| %.4f\n",
           (long long)V, r, b.k, worst, rel);
    CHECK(worst <= 1.0, "the bound fails: |bias - c| reaches %.3f of the radius", worst);
    CHECK(rel < 0.05, "directions not found: mean radius / |w2| %.4f (noise level ~0.02)", rel);
    ds_markov_bound_free(&b);
    free(w2);
}

/* Exactly rank 3 in bf16-exact values: the rest is rounding only. */
static void test_exact_low_rank(void) {
    const int64_t V = 1000;
    const int r = 32;
    float *w2 = malloc((size_t)V * r * sizeof *w2);
    int u[3][32];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < r; i++) u[q][i] = (int)(frand() * 9) - 4;
    for (int64_t n = 0; n < V; n++) {
        const int a = (int)(frand() * 7) - 3, b = (int)(frand() * 7) - 3, c = (int)(frand() * 7) - 3;
        for (int i = 0; i < r; i++) w2[(size_t)n * r + i] = (float)(a * u[0][i] + b * u[1][i] + c * u[2][i]) / 64.0f;
    }
    ds_markov_bound_host b;
    CHECK_OK(ds_markov_bound_build(w2, DS_F32, V, r, 2, &b)); /* fewer directions than the rank: loose */
    double rel2;
    float e[32];
    for (int i = 0; i < r; i++) e[i] = (float)(frand() * 2 - 1);
    const double w2r = worst_ratio(&b, w2, V, e, &rel2);
    ds_markov_bound_free(&b);
    CHECK_OK(ds_markov_bound_build(w2, DS_F32, V, r, DS_MARKOV_BOUND_K, &b));
    double rel8;
    const double w8 = worst_ratio(&b, w2, V, e, &rel8);
    printf("  exact rank 3: k 2 mean radius / |w2[n]| %.4f (worst ratio %.3f), k 8 %.2e (worst %.3f)\n", rel2, w2r,
           rel8, w8);
    CHECK(w2r <= 1.0 && w8 <= 1.0, "the bound fails: %.3f / %.3f", w2r, w8);
    CHECK(rel8 < 1e-4, "rank 3 with 8 directions should leave only rounding: %.2e", rel8);
    CHECK(rel2 > 0.01, "2 directions cannot hold rank 3: %.4f", rel2);
    ds_markov_bound_free(&b);
    free(w2);
}

/* The trained pico head: the bound holds for every previous token tried
 * (its own w1 rows) and is far tighter than |w2[n]| |e|. */
static void test_pico_head(void) {
    ds_checkpoint *ck;
    CHECK_OK(ds_checkpoint_open(DS_MODELS "/pico-qwen3-dspark", &ck));
    const ds_st_tensor *t1 = ds_checkpoint_find(ck, "markov_head.markov_w1.weight");
    const ds_st_tensor *t2 = ds_checkpoint_find(ck, "markov_head.markov_w2.weight");
    CHECK(t1 && t2, "pico drafter: markov tensors missing");
    if (t1 && t2) {
        const int64_t V = t2->shape[0];
        const int r = (int)t2->shape[1];
        float *w1 = malloc((size_t)V * r * sizeof *w1), *w2 = malloc((size_t)V * r * sizeof *w2);
        ds_to_f32(t1->dtype, t1->data, w1, (size_t)V * r);
        ds_to_f32(t2->dtype, t2->data, w2, (size_t)V * r);
        ds_markov_bound_host b;
        ds_error *e = ds_markov_bound_build(t2->data, t2->dtype, V, r, DS_MARKOV_BOUND_K, &b);
        CHECK(!e, "build: %s", e ? ds_error_message(e) : "");
        if (!e) {
            double worst = 0, rel = 0;
            for (int t = 0; t < 48; t++) {
                const int64_t m = (int64_t)(frand() * (double)V);
                const double w = worst_ratio(&b, w2, V, w1 + (size_t)m * r, &rel);
                if (w > worst) worst = w;
            }
            printf("  pico drafter (V %lld, r %d, k %d): worst |bias - c| / radius %.3f over 48 previous tokens, "
                   "mean radius / |w2[n]| %.3f\n", (long long)V, r, b.k, worst, rel);
            CHECK(worst <= 1.0, "the bound fails on the pico head: %.3f", worst);
            CHECK(rel < 0.75, "the pico head's rest should be well under |w2| with 8 directions: %.3f", rel);
            ds_markov_bound_free(&b);
        }
        ds_error_free(e);
        free(w1), free(w2);
    }
    ds_checkpoint_close(ck);
}

static void test_bad_input(void) {
    ds_markov_bound_host b;
    float w[4] = {1, 2, 3, 4};
    CHECK_ERR(ds_markov_bound_build(w, DS_I32, 2, 2, 8, &b), "I32");
    CHECK_ERR(ds_markov_bound_build(w, DS_F32, 0, 2, 8, &b), "empty");
    /* A non-finite row gets an infinite radius (the device then computes its block in full). */
    float nan_w[6] = {1, 0, NAN, 1, 0, 1};
    CHECK_OK(ds_markov_bound_build(nan_w, DS_F32, 3, 2, 8, &b));
    CHECK(b.k == 2, "k clamps to r: %d", b.k);
    CHECK(isinf(b.radius[1]) && isfinite(b.radius[0]) && isfinite(b.radius[2]), "radius %g %g %g", b.radius[0],
          b.radius[1], b.radius[2]);
    ds_markov_bound_free(&b);
}

RUN_TESTS("markov_bound", test_low_rank_plus_noise, test_exact_low_rank, test_pico_head, test_bad_input)
