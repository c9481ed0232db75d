/* The greedy round's decisions as ops (backend.h conf_cut, accept_prefix)
 * and the fp32 cutoff a backend cuts proposals by (drafter.h
 * ds_conf_cutoff):
 * - c < ds_conf_cutoff(t) exactly when ds_conf_below(c, t) (sigmoid(c) < t
 *   in fp32, the reference's decision), for thresholds across (0, 1], at
 *   every float within 4096 steps of the cutoff, at random floats, at
 *   +-0, +-inf; a NaN never cuts;
 * - the CPU backend's conf_cut over a strided column, and the host helper
 *   a backend without the op falls back to, agree with the host loop;
 * - accept_prefix: the longest agreeing prefix, limited by n and *limit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "testlib.h"

static uint64_t rs = 0x853c49e6748fea9bull;
static uint32_t rand32(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_cutoff_matches_sigmoid(void) {
    const float ts[] = {1e-30f, 1e-6f, 0.01f, 0.1f, 0.25f, 0.3f, 0.5f, 0.6f, 0.7f, 0.75f, 0.9f, 0.99f, 0.999999f, 1.0f};
    int bad = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        const float t = ts[i], cut = ds_conf_cutoff(t);
        CHECK(isfinite(cut), "threshold %g: cutoff %g", t, cut);
        /* every float within 4096 steps either side of the cutoff */
        float lo = cut, hi = cut;
        for (int k = 0; k < 4096; k++) lo = nextafterf(lo, -INFINITY), hi = nextafterf(hi, INFINITY);
        for (float c = lo; c <= hi && bad < 10; c = nextafterf(c, INFINITY))
            if (ds_conf_below(c, t) != (c < cut)) {
                CHECK(0, "threshold %.9g: c = %.9g is %s by the sigmoid, %s by the cutoff %.9g", t, c,
                      ds_conf_below(c, t) ? "cut" : "kept", c < cut ? "cut" : "kept", cut);
                bad++;
            }
        for (int k = 0; k < 200000 && bad < 10; k++) {
            const float c = bits_float(rand32());
            if (isnan(c)) continue;
            if (ds_conf_below(c, t) != (c < cut)) {
                CHECK(0, "threshold %.9g: random c = %.9g decided differently", t, c);
                bad++;
            }
        }
        const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-30f, -1e-30f, 88.0f, -88.0f, 104.0f, -104.0f};
        for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++)
            CHECK(ds_conf_below(edge[k], t) == (edge[k] < cut), "threshold %g: c = %g decided differently", t,
                  edge[k]);
        CHECK(!ds_conf_below(NAN, t) && !(NAN < cut), "threshold %g: a NaN cuts", t);
    }
    printf("  cutoff: %zu thresholds, 8193 floats around each cutoff and 200000 random ones agree\n",
           sizeof ts / sizeof ts[0]);
}

static void test_conf_cut_op(void) {
    ds_backend *be;
    CHECK_OK(ds_backend_cpu_new(1, &be));
    enum { G = 7, W = 5 };
    ds_tensor x, cut;
    CHECK_OK(be->ops->alloc(be, DS_F32, G, W, &x));
    /* one cutoff a position (a calibrated drafter's thresholds differ by position) */
    CHECK_OK(be->ops->alloc(be, DS_F32, G, 1, &cut));
    float t[G], c[G];
    for (int r = 0; r < G; r++) c[r] = ds_conf_cutoff(t[r] = 0.3f + 0.07f * (float)r);
    be->ops->upload(be, cut, c);
    const ds_tensor col = ds_cols(x, 2, 1); /* strided: one column of five */
    float v[G * W];
    for (int trial = 0; trial < 400; trial++) {
        for (int i = 0; i < G * W; i++) v[i] = (float)((int)(rand32() % 2001) - 1000) / 250.0f;
        if (trial % 7 == 3) v[(trial % G) * W + 2] = NAN;
        if (trial % 5 == 1) v[(trial % G) * W + 2] = nextafterf(c[trial % G], -INFINITY);
        if (trial % 5 == 2) v[(trial % G) * W + 2] = c[trial % G];
        be->ops->upload(be, x, v);
        int want = G;
        for (int r = 0; r < G; r++)
            if (ds_conf_below(v[r * W + 2], t[r])) {
                want = r;
                break;
            }
        int32_t got = -1, fb = -1;
        ds_spec(be)->conf_cut(be, col, cut, &got);
        /* the helper's host version, as for a backend without the op */
        const ds_backend_ops *ops = be->ops;
        ds_backend_ops none = *ops;
        none.spec = NULL;
        be->ops = &none;
        ds_conf_cut(be, col, cut, &fb);
        be->ops = ops;
        if (got != want || fb != want) {
            CHECK(0, "trial %d: conf_cut %d, host helper %d, sigmoid loop %d", trial, got, fb, want);
            break;
        }
    }
    be->ops->release(be, &x);
    be->ops->release(be, &cut);
    CHECK_OK(ds_backend_check(be));
    be->ops->destroy(be);
}

static void test_accept_prefix(void) {
    ds_backend *be;
    CHECK_OK(ds_backend_cpu_new(1, &be));
    const int32_t draft[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    const int32_t best[9] = {5, 6, 7, 0, 9, 10, 11, 12, 13};
    struct {
        int n, limit, m, a;
    } cases[] = {{8, 8, 8, 3}, {8, 2, 2, 2}, {8, 3, 3, 3}, {8, 0, 0, 0}, {8, -4, 0, 0}, {2, 8, 2, 2},
                 {0, 5, 0, 0}, {3, 100, 3, 3}, {4, 4, 4, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t out[2] = {-1, -1}, host[2] = {-1, -1};
        ds_spec(be)->accept_prefix(be, draft, best, cases[i].n, &cases[i].limit, out);
        ds_accept_prefix_host(draft, best, cases[i].n, &cases[i].limit, host);
        CHECK(out[0] == cases[i].m && out[1] == cases[i].a && !memcmp(out, host, sizeof out),
              "n %d limit %d: m %d a %d (host helper m %d a %d), want m %d a %d", cases[i].n, cases[i].limit, out[0],
              out[1], host[0], host[1], cases[i].m, cases[i].a);
    }
    const int32_t all[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    int32_t out[2];
    const int lim = 8;
    ds_spec(be)->accept_prefix(be, draft, all, 8, &lim, out);
    CHECK(out[0] == 8 && out[1] == 8, "all agree: m %d a %d", out[0], out[1]);
    be->ops->destroy(be);
}

RUN_TESTS("round_ops", test_cutoff_matches_sigmoid, test_conf_cut_op, test_accept_prefix)
