/* Scheduling for batched speculation (SPEC §6, issue 39): Algorithm 1 on
 * hand-made cases whose admissions are worked out in the comments (the early
 * stop, ties, the strict test, empty and degenerate steps, vLLM's options),
 * against a slow re-implementation on random batches; the step-cost curve
 * (monotone forcing, interpolation, profiling, the cache and its staleness);
 * simulated acceptance (the profile's conditional acceptance, calibration of
 * confidences and survivals, the bundled profiles' tau); and the three
 * together: Algorithm 1's predicted tokens match what the simulator emits and
 * it never falls below AR. Values are chosen as binary fractions so that the
 * expected Theta values are exact. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "speculate/ceiling.h"
#include "speculate/schedule.h"
#include "speculate/sim_acceptance.h"
#include "speculate/step_cost.h"
#include "testlib.h"

#define PROFILES DS_MODELS "/../bench/profiles"

static ds_step_cost *curve(const int *tokens, const double *seconds, int n, ds_step_cost_interp interp) {
    ds_step_cost *c = NULL;
    ds_error *e = ds_step_cost_new(tokens, seconds, n, interp, &c);
    CHECK(!e, "curve: %s", ds_error_message(e));
    ds_error_free(e);
    return c;
}

static void check_lens(const int *got, const int *want, int n, const char *what) {
    for (int r = 0; r < n; r++) CHECK(got[r] == want[r], "%s: request %d admitted %d, expected %d", what, r, got[r], want[r]);
}

/* ---- Algorithm 1 ---------------------------------------------------------- */

/* R = 1, survivals 0.875 then 0.25 flat; steps cost 1 s up to 2 tokens and
 * 1.25 s from 3 on. Theta: B=1: 1; B=2: 1.875/1 = 1.875 (admit); B=3:
 * 2.125/1.25 = 1.7 (not better: STOP). Admitting all 7 would reach
 * 3.375/1.25 = 2.7, but the early stop never gets there. */
static void test_early_stop(void) {
    const int tok[] = {1, 2, 3, 8};
    const double sec[] = {1, 1, 1.25, 1.25};
    ds_step_cost *sps = curve(tok, sec, 4, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double surv[] = {0.875, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    ds_schedule_input in = {.n_requests = 1, .gamma = 7, .survival = surv};
    int len[1];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    CHECK(len[0] == 1, "admitted %d, expected 1", len[0]);
    CHECK(res.verify_tokens == 2 && res.drafts == 1, "B %d drafts %d", res.verify_tokens, res.drafts);
    CHECK(res.tau == 1.875 && res.theta == 1.875, "tau %.17g theta %.17g", res.tau, res.theta);
    /* the global maximum lies past the stop */
    int all[1] = {7};
    ds_schedule_result full;
    CHECK_OK(ds_schedule_predict(&in, all, sps, NULL, &full));
    CHECK(full.verify_tokens == 8 && full.tau == 3.375 && full.theta == 3.375 / 1.25 && full.theta > res.theta,
          "all seven: B %d tau %.17g theta %.17g", full.verify_tokens, full.tau, full.theta);
    ds_step_cost_free(sps);
}

/* Three requests from confidences (products exact in binary):
 *   r0 c = .75 .5 .5 -> a = .75 .375 .1875
 *   r1 c = .5 .5 1   -> a = .5 .25 .25
 *   r2 c = .25 (one draft; its row's other entries are never read)
 * Order: (.75,r0,j0) (.5,r1,j0) (.375,r0,j1) (.25,r2,j0) (.25,r1,j1)
 * (.25,r1,j2) (.1875,r0,j2). With t(B) = 1 + (B-3)/16: Theta 3, 3.529,
 * 3.778, 3.895, 3.9, 3.905, 3.909, then 5.5625/1.4375 = 3.870: stops before
 * the last. With t(B) = 1 + (B-3)/8: 3, 3.333, 3.4, then 4.625/1.375 = 3.364:
 * stops after two. */
static void test_three_requests(void) {
    const float conf[] = {0.75f, 0.5f, 0.5f, 0.5f, 0.5f, 1.0f, 0.25f, -7.0f, NAN};
    const int n_drafts[] = {3, 3, 1};
    ds_schedule_input in = {.n_requests = 3, .gamma = 3, .n_drafts = n_drafts, .conf = conf};
    int len[3];
    ds_schedule_result res;

    const int tok[] = {3, 11};
    const double gentle[] = {1, 1.5}, steep[] = {1, 2};
    ds_step_cost *sps = curve(tok, gentle, 2, DS_STEP_COST_LINEAR);
    if (!sps) return;
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    check_lens(len, (int[]){2, 3, 1}, 3, "gentle");
    CHECK(res.verify_tokens == 9 && res.tau == 5.375 && res.theta == 5.375 / 1.375, "gentle: B %d tau %.17g theta %.17g",
          res.verify_tokens, res.tau, res.theta);
    ds_step_cost_free(sps);

    sps = curve(tok, steep, 2, DS_STEP_COST_LINEAR);
    if (!sps) return;
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    check_lens(len, (int[]){1, 1, 0}, 3, "steep");
    CHECK(res.verify_tokens == 5 && res.tau == 4.25 && res.theta == 4.25 / 1.25, "steep: B %d tau %.17g theta %.17g",
          res.verify_tokens, res.tau, res.theta);

    /* the same step from survivals gives the same admissions */
    const double surv[] = {0.75, 0.375, 0.1875, 0.5, 0.25, 0.25, 0.25, 0, 0};
    ds_schedule_input in_s = {.n_requests = 3, .gamma = 3, .n_drafts = n_drafts, .survival = surv};
    CHECK_OK(ds_schedule_confidence(&in_s, sps, NULL, len, &res));
    check_lens(len, (int[]){1, 1, 0}, 3, "steep from survivals");
    ds_step_cost_free(sps);
}

/* Ties. r0 a = .5 .25, r1 a = .25: (.25, r1, j0) goes before (.25, r0, j1)
 * (smaller j first). Costs 1 s up to 4 tokens, 2 s at 5: Theta 2, 2.5,
 * 2.75, then 3/2: r1 gets the tied slot, not r0. Equal (a, j): r0 before r1. */
static void test_ties(void) {
    const int tok[] = {2, 4, 5};
    const double sec[] = {1, 1, 2};
    ds_step_cost *sps = curve(tok, sec, 3, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double surv[] = {0.5, 0.25, 0.25, 0.0};
    ds_schedule_input in = {.n_requests = 2, .gamma = 2, .survival = surv};
    int len[2];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    check_lens(len, (int[]){1, 1}, 2, "j before r");
    CHECK(res.verify_tokens == 4 && res.tau == 2.75 && res.theta == 2.75, "B %d tau %g theta %g", res.verify_tokens,
          res.tau, res.theta);
    ds_step_cost_free(sps);

    /* both a = .5 at j = 0; 1 s up to 3 tokens, 2 s at 4: Theta 2, 2.5, then 3/2 */
    const int tok2[] = {2, 3, 4};
    sps = curve(tok2, sec, 3, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double same[] = {0.5, 0.5};
    ds_schedule_input in2 = {.n_requests = 2, .gamma = 1, .survival = same};
    CHECK_OK(ds_schedule_confidence(&in2, sps, NULL, len, &res));
    check_lens(len, (int[]){1, 0}, 2, "r ascending");
    ds_step_cost_free(sps);
}

/* Theta equal to the best is not an improvement: R = 2 (Theta 2 at 1 s),
 * a = .5 at B = 3 costing 1.25 s gives 2.5 / 1.25 = 2 exactly: not admitted. */
static void test_strictly_better(void) {
    const int tok[] = {2, 3};
    const double sec[] = {1, 1.25};
    ds_step_cost *sps = curve(tok, sec, 2, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double surv[] = {0.5, 0.0};
    ds_schedule_input in = {.n_requests = 2, .gamma = 1, .survival = surv};
    int len[2];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    check_lens(len, (int[]){0, 0}, 2, "equal Theta");
    CHECK(res.verify_tokens == 2 && res.tau == 2 && res.theta == 2, "B %d tau %g theta %g", res.verify_tokens, res.tau,
          res.theta);
    ds_step_cost_free(sps);
}

/* Nothing to admit: all-zero survival, gamma 0, no drafts, no requests. A
 * flat curve would admit anything with a > 0, so only a = 0 keeps them out. */
static void test_nothing_to_admit(void) {
    const int tok[] = {1};
    const double sec[] = {0.5};
    ds_step_cost *sps = curve(tok, sec, 1, DS_STEP_COST_LINEAR);
    if (!sps) return;
    int len[3] = {9, 9, 9};
    ds_schedule_result res;
    /* a zero first confidence zeroes the whole row */
    const float zeros[] = {0, 0.5f, 0, 0, 0, 0.25f};
    ds_schedule_input in = {.n_requests = 3, .gamma = 2, .conf = zeros};
    CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
    check_lens(len, (int[]){0, 0, 0}, 3, "all-zero survival");
    CHECK(res.verify_tokens == 3 && res.tau == 3 && res.theta == 6, "B %d tau %g theta %g", res.verify_tokens, res.tau,
          res.theta);

    ds_schedule_input g0 = {.n_requests = 3, .gamma = 0};
    CHECK_OK(ds_schedule_confidence(&g0, sps, NULL, len, &res));
    check_lens(len, (int[]){0, 0, 0}, 3, "gamma 0");
    CHECK(res.verify_tokens == 3 && res.theta == 6, "gamma 0: B %d theta %g", res.verify_tokens, res.theta);

    const int none[] = {0, 0, 0};
    ds_schedule_input nd = {.n_requests = 3, .gamma = 2, .n_drafts = none};
    CHECK_OK(ds_schedule_confidence(&nd, sps, NULL, len, &res));
    CHECK(res.verify_tokens == 3, "no drafts: B %d", res.verify_tokens);

    ds_schedule_input r0 = {.n_requests = 0, .gamma = 7, .conf = zeros};
    CHECK_OK(ds_schedule_confidence(&r0, sps, NULL, len, &res));
    CHECK(res.verify_tokens == 0 && res.tau == 0 && res.theta == 0, "R 0: B %d tau %g theta %g", res.verify_tokens,
          res.tau, res.theta);

    /* R = 1 on a flat curve: every draft with a > 0 */
    ds_schedule_input one = {.n_requests = 1, .gamma = 3, .conf = (const float[]){0.5f, 0.5f, 0}};
    CHECK_OK(ds_schedule_confidence(&one, sps, NULL, len, &res));
    CHECK(len[0] == 2 && res.tau == 1.75 && res.theta == 3.5, "R 1: %d %g %g", len[0], res.tau, res.theta);
    ds_step_cost_free(sps);
}

/* vLLM's draft cost: R = 1, a = .375, t(1) = 1, t(2) = 1.5. Alone: 1 vs
 * 1.375/1.5: not admitted. With a 1 s draft: 1/2 vs 1.375/2.5 = .55: admitted. */
static void test_draft_cost(void) {
    const int tok[] = {1, 2};
    const double sec[] = {1, 1.5};
    ds_step_cost *sps = curve(tok, sec, 2, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double surv[] = {0.375};
    ds_schedule_input in = {.n_requests = 1, .gamma = 1, .survival = surv};
    int len[1];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_confidence(&in, sps, &(ds_schedule_opts){0}, len, &res));
    CHECK(len[0] == 0 && res.theta == 1, "no draft cost: %d %g", len[0], res.theta);
    CHECK_OK(ds_schedule_confidence(&in, sps, &(ds_schedule_opts){.draft_seconds = 1}, len, &res));
    CHECK(len[0] == 1 && res.theta == 1.375 / 2.5, "draft cost 1 s: %d %.17g", len[0], res.theta);
    CHECK_ERR(ds_schedule_confidence(&in, sps, &(ds_schedule_opts){.draft_seconds = -1}, len, &res), "draft_seconds");
    ds_step_cost_free(sps);
}

/* vLLM's split: the stale step (r0 confident, r1 not) buys two drafts; the
 * current survivals (r1 confident now) decide who gets them. */
static void test_stale_budget(void) {
    const int tok[] = {2, 4, 5};
    const double sec[] = {1, 1, 4};
    ds_step_cost *sps = curve(tok, sec, 3, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const double stale_s[] = {0.75, 0.5, 0.25, 0.125, 0, 0};
    const double cur_s[] = {0.25, 0.125, 0.0625, 0.875, 0.75, 0.5};
    ds_schedule_input stale = {.n_requests = 2, .gamma = 3, .survival = stale_s};
    ds_schedule_input cur = {.n_requests = 2, .gamma = 3, .survival = cur_s};
    int len[2];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_confidence(&stale, sps, NULL, len, &res));
    check_lens(len, (int[]){2, 0}, 2, "stale alone");
    CHECK_OK(ds_schedule_confidence_stale(&stale, &cur, sps, NULL, len, &res));
    check_lens(len, (int[]){0, 2}, 2, "stale budget, current allocation");
    CHECK(res.verify_tokens == 4 && res.tau == 2 + 0.875 + 0.75 && res.theta == res.tau, "B %d tau %.17g theta %.17g",
          res.verify_tokens, res.tau, res.theta);
    /* a budget larger than the candidates admits them all; zero admits none */
    CHECK_OK(ds_schedule_allocate(&cur, 100, len, &res));
    check_lens(len, (int[]){3, 3}, 2, "allocate all");
    CHECK(res.drafts == 6, "allocated %d", res.drafts);
    CHECK_OK(ds_schedule_allocate(&cur, 0, len, &res));
    check_lens(len, (int[]){0, 0}, 2, "allocate none");
    ds_schedule_input three = {.n_requests = 3, .gamma = 3, .survival = cur_s};
    CHECK_ERR(ds_schedule_confidence_stale(&stale, &three, sps, NULL, len, &res), "stale rows");
    ds_step_cost_free(sps);
}

static void test_fixed(void) {
    const int tok[] = {1, 16};
    const double sec[] = {1, 2};
    ds_step_cost *sps = curve(tok, sec, 2, DS_STEP_COST_LINEAR);
    if (!sps) return;
    const float conf[] = {0.5f, 0.5f, 0.5f, 1, 1, 1};
    const int n_drafts[] = {3, 1};
    ds_schedule_input in = {.n_requests = 2, .gamma = 3, .n_drafts = n_drafts, .conf = conf};
    int len[2];
    ds_schedule_result res;
    CHECK_OK(ds_schedule_fixed(&in, 2, sps, NULL, len, &res));
    check_lens(len, (int[]){2, 1}, 2, "fixed 2");
    /* B = 5: t = 1 + 4/15; tau = 2 + .5 + .25 + 1 */
    CHECK(res.verify_tokens == 5 && res.tau == 3.75 && fabs(res.theta - 3.75 / (1 + 4.0 / 15)) < 1e-15,
          "B %d tau %.17g theta %.17g", res.verify_tokens, res.tau, res.theta);
    /* no confidences (a DFlash drafter): lengths, no prediction */
    ds_schedule_input bare = {.n_requests = 2, .gamma = 3};
    CHECK_OK(ds_schedule_fixed(&bare, 7, sps, NULL, len, &res));
    check_lens(len, (int[]){3, 3}, 2, "fixed without values");
    CHECK(res.verify_tokens == 8 && isnan(res.tau) && isnan(res.theta), "B %d tau %g theta %g", res.verify_tokens,
          res.tau, res.theta);
    CHECK_ERR(ds_schedule_fixed(&bare, -1, sps, NULL, len, &res), "fixed gamma -1");
    ds_step_cost_free(sps);
}

static void test_bad_input(void) {
    const int tok[] = {1};
    const double sec[] = {1};
    ds_step_cost *sps = curve(tok, sec, 1, DS_STEP_COST_LINEAR);
    if (!sps) return;
    int len[2];
    ds_schedule_result res;
    ds_schedule_input in = {.n_requests = 2, .gamma = 2, .conf = (const float[]){0.5f, 1.5f, 0.5f, 0.5f}};
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "request 0 position 1: confidence 1.5");
    in.conf = (const float[]){0.5f, 0.5f, NAN, 0.5f};
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "request 1 position 0");
    in.conf = NULL;
    in.survival = (const double[]){0.5, 0.25, 0.25, 0.5};
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "request 1 position 1: survival 0.5");
    CHECK_ERR(ds_schedule_confidence(&in, NULL, NULL, len, &res), "no step-cost curve");
    in.conf = (const float[]){0.5f, 0.5f, 0.5f, 0.5f};
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "both");
    in.conf = NULL;
    in.survival = NULL;
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "neither");
    in.survival = (const double[]){0.5, 0.25, 0.25, 0.125};
    in.n_drafts = (const int[]){2, 3};
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "request 1 has 3 drafts");
    in.n_drafts = NULL;
    in.gamma = -1;
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "gamma -1");
    in.gamma = 2;
    in.n_requests = -3;
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, len, &res), "-3 requests");
    in.n_requests = 2;
    CHECK_ERR(ds_schedule_predict(&in, (const int[]){3, 0}, sps, NULL, &res), "request 0 verifies 3");
    CHECK_ERR(ds_schedule_allocate(&in, -1, len, &res), "budget of -1");
    CHECK_ERR(ds_schedule_confidence(&in, sps, NULL, NULL, &res), "no output");
    CHECK_ERR(ds_schedule_fixed(&in, 1, sps, NULL, len, NULL), "no output");
    ds_step_cost_free(sps);
}

/* Algorithm 1 as SPEC §6 words it, slowly: repeatedly take the best
 * remaining (r, j) by (a desc, j asc, r asc), O(N^2). */
static void slow_algorithm1(int R, int gamma, const double *a, const ds_step_cost *sps, int *len, int *b_out) {
    char *taken = calloc((size_t)(R * gamma), 1);
    for (int r = 0; r < R; r++) len[r] = 0;
    int b = R;
    double tau = R, best = tau / ds_step_cost_seconds(sps, b);
    for (;;) {
        int pick = -1;
        for (int i = 0; i < R * gamma; i++) {
            if (taken[i] || !(a[i] > 0)) continue;
            if (pick < 0) {
                pick = i;
                continue;
            }
            int r = i / gamma, j = i % gamma, pr = pick / gamma, pj = pick % gamma;
            if (a[i] > a[pick] || (a[i] == a[pick] && (j < pj || (j == pj && r < pr)))) pick = i;
        }
        if (pick < 0) break;
        double theta = (tau + a[pick]) / ds_step_cost_seconds(sps, b + 1);
        if (!(theta > best)) break;
        taken[pick] = 1;
        tau += a[pick];
        best = theta;
        b++;
        len[pick / gamma] = pick % gamma + 1;
    }
    free(taken);
    *b_out = b;
}

/* Random batches (confidences on a coarse grid, so survivals tie often)
 * against the slow version; every admission is a prefix. */
static void test_random_vs_slow(void) {
    const int tok[] = {1, 8, 32, 128, 512};
    const double sec[] = {1.0, 1.05, 1.3, 2.4, 8.0};
    ds_step_cost *sps = curve(tok, sec, 5, DS_STEP_COST_LINEAR);
    if (!sps) return;
    ds_rng rng;
    ds_rng_seed(&rng, 39);
    enum { MAXR = 64, G = 7 };
    float conf[MAXR * G];
    double a[MAXR * G];
    int len[MAXR], slow[MAXR], mismatches = 0, admitted_total = 0;
    for (int trial = 0; trial < 300; trial++) {
        int R = 1 + (int)(ds_rng_uniform(&rng) * MAXR);
        for (int r = 0; r < R; r++) {
            double s = 1;
            for (int j = 0; j < G; j++) {
                conf[r * G + j] = (float)((int)(ds_rng_uniform(&rng) * 9) / 8.0); /* 0, 1/8, ..., 1 */
                a[r * G + j] = s *= conf[r * G + j];
            }
        }
        ds_schedule_input in = {.n_requests = R, .gamma = G, .conf = conf};
        ds_schedule_result res;
        CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
        int b_slow;
        slow_algorithm1(R, G, a, sps, slow, &b_slow);
        int b = R;
        for (int r = 0; r < R; r++) {
            b += len[r];
            mismatches += len[r] != slow[r];
        }
        admitted_total += res.drafts;
        CHECK(b == res.verify_tokens && b == b_slow, "trial %d: B %d / %d / slow %d", trial, b, res.verify_tokens, b_slow);
    }
    CHECK(mismatches == 0, "%d requests admitted differently from the slow version", mismatches);
    CHECK(admitted_total > 300, "only %d drafts admitted over all trials: the cases test little", admitted_total);
    ds_step_cost_free(sps);
}

/* ---- step cost -------------------------------------------------------------- */

static void test_monotone_and_interpolation(void) {
    const int tok[] = {1, 2, 4, 8, 16};
    const double sec[] = {1.0, 0.75, 1.5, 1.25, 2.0};
    ds_step_cost *lin = curve(tok, sec, 5, DS_STEP_COST_LINEAR), *pad = curve(tok, sec, 5, DS_STEP_COST_PADDED);
    if (!lin || !pad) return;
    const double forced[] = {1.0, 1.0, 1.5, 1.5, 2.0};
    for (int i = 0; i < 5; i++) {
        int t;
        double s, m;
        ds_step_cost_bucket(lin, i, &t, &s, &m);
        CHECK(t == tok[i] && s == forced[i] && m == sec[i], "bucket %d: %d tokens %g s (measured %g)", i, t, s, m);
    }
    const struct {
        int tokens;
        double linear, padded;
    } at[] = {{0, 1, 1},      {1, 1, 1},       {2, 1, 1},     {3, 1.25, 1.5}, {6, 1.5, 1.5},
              {12, 1.75, 2},  {16, 2, 2},      {32, 3, 3},    {24, 2.5, 2.5}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        double l = ds_step_cost_seconds(lin, at[i].tokens), p = ds_step_cost_seconds(pad, at[i].tokens);
        CHECK(l == at[i].linear && p == at[i].padded, "%d tokens: linear %.17g (want %g), padded %.17g (want %g)",
              at[i].tokens, l, at[i].linear, p, at[i].padded);
    }
    CHECK(ds_step_cost_sps(lin, 16) == 0.5, "SPS at 16: %g", ds_step_cost_sps(lin, 16));
    ds_step_cost_free(lin);
    ds_step_cost_free(pad);

    /* past the end: flat when the last two buckets are (forced) equal; one bucket: constant */
    const double flat_end[] = {1, 2, 1.5};
    ds_step_cost *fe = curve((const int[]){1, 2, 4}, flat_end, 3, DS_STEP_COST_LINEAR);
    if (fe) CHECK(ds_step_cost_seconds(fe, 100) == 2, "flat end: %g", ds_step_cost_seconds(fe, 100));
    ds_step_cost_free(fe);
    ds_step_cost *one = curve((const int[]){4}, (const double[]){0.25}, 1, DS_STEP_COST_LINEAR);
    if (one) CHECK(ds_step_cost_seconds(one, 1) == 0.25 && ds_step_cost_seconds(one, 1000) == 0.25, "one bucket");
    ds_step_cost_free(one);

    ds_step_cost *bad = NULL;
    CHECK_ERR(ds_step_cost_new((const int[]){1, 1}, (const double[]){1, 1}, 2, DS_STEP_COST_LINEAR, &bad), "increasing");
    CHECK_ERR(ds_step_cost_new((const int[]){0}, (const double[]){1}, 1, DS_STEP_COST_LINEAR, &bad), "at least 1");
    CHECK_ERR(ds_step_cost_new((const int[]){1, 2}, (const double[]){1, NAN}, 2, DS_STEP_COST_LINEAR, &bad),
              "bucket 1 (2 tokens)");
    CHECK_ERR(ds_step_cost_new((const int[]){1}, (const double[]){0}, 1, DS_STEP_COST_LINEAR, &bad), "> 0");
    CHECK_ERR(ds_step_cost_new((const int[]){1}, (const double[]){1}, 0, DS_STEP_COST_LINEAR, &bad), "0 buckets");
    CHECK(!bad, "a curve came back with an error");
}

static void test_default_buckets(void) {
    int b[64];
    int n = ds_step_cost_default_buckets(100, b, 64);
    const int want[] = {1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100};
    CHECK(n == 18, "%d buckets for 100", n);
    for (int i = 0; i < n && i < 18; i++) CHECK(b[i] == want[i], "bucket %d: %d, expected %d", i, b[i], want[i]);
    CHECK(ds_step_cost_default_buckets(5, b, 64) == 5 && b[4] == 5, "max 5");
    n = ds_step_cost_default_buckets(2048, b, 64);
    CHECK(n == 43 && b[n - 1] == 2048 && b[n - 2] == 1792 && b[38] == 1024 && b[26] == 256,
          "max 2048: %d buckets, last %d", n, b[n - 1]);
    CHECK(ds_step_cost_default_buckets(100, b, 3) == 3, "capped");
}

/* A fake step timer: each bucket's warm-up steps take 100x (they must be
 * dropped), its timed ones cycle through factors whose median is 1.1, times
 * tokens / 1024 s; every bucket's first warm-up step must come before any
 * bucket's timed one (warm-up rounds first). */
typedef struct {
    int calls, fail_at_tokens, per_tokens[32];
    int last_warmup_start, first_timed; /* call numbers: the last bucket's first warm-up, the first timed step */
    double bad_value;
} fake_timer;

static ds_error *fake_time_step(void *ctx, int tokens, double *seconds) {
    fake_timer *f = ctx;
    static const double factors[] = {1.3, 0.9, 1.0, 5.0, 1.1};
    f->calls++;
    int k = f->per_tokens[tokens % 32]++ % 7; /* 2 warm-up + 5 timed per bucket */
    if (k == 0) f->last_warmup_start = f->calls;
    if (k == 2 && !f->first_timed) f->first_timed = f->calls;
    if (tokens == f->fail_at_tokens) {
        if (f->bad_value != 0) {
            *seconds = f->bad_value;
            return NULL;
        }
        return ds_errorf("the device went away");
    }
    *seconds = (k < 2 ? 100.0 : factors[k - 2]) * tokens / 1024.0;
    return NULL;
}

static const int prof_buckets[] = {1, 2, 4, 8};
static const ds_step_cost_opts prof_opts = {
    .buckets = prof_buckets, .n_buckets = 4, .warmup = 2, .reps = 5, .interp = DS_STEP_COST_LINEAR};

static void test_profile(void) {
    fake_timer f = {0};
    ds_step_cost *c = NULL;
    CHECK_OK(ds_step_cost_profile(&prof_opts, fake_time_step, &f, &c));
    CHECK(f.calls == 4 * 7, "%d calls", f.calls);
    CHECK(f.last_warmup_start < f.first_timed, "a bucket was timed (call %d) before the last one warmed up (call %d)",
          f.first_timed, f.last_warmup_start);
    for (int i = 0; i < 4; i++) {
        double s;
        ds_step_cost_bucket(c, i, NULL, &s, NULL);
        double want = 1.1 * prof_buckets[i] / 1024.0;
        CHECK(fabs(s - want) <= 1e-15 * want, "bucket %d: %.17g s, expected the median %.17g", i, s, want);
    }
    ds_step_cost_free(c);

    fake_timer broken = {.fail_at_tokens = 4};
    CHECK_ERR(ds_step_cost_profile(&prof_opts, fake_time_step, &broken, &c), "at 4 tokens: the device went away");
    fake_timer zero = {.fail_at_tokens = 2, .bad_value = -1};
    CHECK_ERR(ds_step_cost_profile(&prof_opts, fake_time_step, &zero, &c), "at 2 tokens: a step timed -1");
    fake_timer nan = {.fail_at_tokens = 8, .bad_value = NAN};
    CHECK_ERR(ds_step_cost_profile(&prof_opts, fake_time_step, &nan, &c), "at 8 tokens");
    ds_step_cost_opts no_reps = prof_opts;
    no_reps.reps = 0;
    CHECK_ERR(ds_step_cost_profile(&no_reps, fake_time_step, &f, &c), "reps 0");
    ds_step_cost_opts defaults = {.max_tokens = 20, .warmup = 2, .reps = 5};
    f = (fake_timer){0};
    CHECK_OK(ds_step_cost_profile(&defaults, fake_time_step, &f, &c));
    CHECK(ds_step_cost_n(c) == 10 && f.calls == 10 * 7, "default buckets to 20: %d buckets, %d calls",
          ds_step_cost_n(c), f.calls);
    ds_step_cost_free(c);
}

static char scratch_dir[64];

static void make_scratch(void) {
    snprintf(scratch_dir, sizeof scratch_dir, "/tmp/ds_test_schedule_XXXXXX");
    CHECK(mkdtemp(scratch_dir), "mkdtemp");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* What a log FILE received, as a string (the caller frees it). */
static char *log_text(FILE *log) {
    long n = ftell(log);
    char *s = calloc((size_t)n + 1, 1);
    rewind(log);
    if (s && fread(s, 1, (size_t)n, log) != (size_t)n) s[0] = 0;
    fseek(log, 0, SEEK_END);
    return s;
}

static void test_cache(void) {
    make_scratch();
    char path[128];
    snprintf(path, sizeof path, "%s/sps.json", scratch_dir);
    const ds_step_cost_key key = {.device = "NVIDIA H100 80GB HBM3", .model = "qwen3-8b bf16", .build = "0.1 abc"};
    const int tok[] = {1, 2, 4, 8};
    const double sec[] = {0.1, 0.3 / 3, 0.2 + 1e-17, 1.0 / 3}; /* 1/3 and friends: only %.17g gets them back */
    ds_step_cost *c = curve(tok, sec, 4, DS_STEP_COST_LINEAR), *back = NULL;
    if (!c) return;
    CHECK_OK(ds_step_cost_save(c, &key, path));
    CHECK_OK(ds_step_cost_load(path, &key, &prof_opts, &back));
    for (int i = 0; i < 4; i++) {
        int t;
        double s, m;
        ds_step_cost_bucket(back, i, &t, &s, &m);
        CHECK(t == tok[i] && m == sec[i], "bucket %d: %d tokens, %.17g s, saved %.17g", i, t, m, sec[i]);
    }
    ds_step_cost_free(back);

    ds_step_cost_key other = key;
    other.device = "NVIDIA H200";
    CHECK_ERR(ds_step_cost_load(path, &other, &prof_opts, &back), "stale: device is \"NVIDIA H100 80GB HBM3\"");
    other = key;
    other.model = "qwen3-4b bf16";
    CHECK_ERR(ds_step_cost_load(path, &other, &prof_opts, &back), "stale: model");
    other = key;
    other.build = "0.2";
    CHECK_ERR(ds_step_cost_load(path, &other, &prof_opts, &back), "stale: build");
    ds_step_cost_opts more = prof_opts;
    more.buckets = (const int[]){1, 2, 4, 8, 16};
    more.n_buckets = 5;
    CHECK_ERR(ds_step_cost_load(path, &key, &more, &back), "stale: its 4 buckets");
    other.build = "";
    CHECK_ERR(ds_step_cost_load(path, &other, &prof_opts, &back), "non-empty");

    static const struct {
        const char *text, *needle;
    } broken[] = {
        {"{\"format\": \"dspark step cost\", \"version\": 1,", "not JSON"},
        {"[1, 2]", "malformed: not a step-cost cache"},
        {"{\"format\": \"dspark step cost\", \"version\": 2}", "stale: cache version"},
        {"{\"format\": \"dspark step cost\", \"version\": 1, \"device\": 7}", "device is missing or not a string"},
        {"{\"format\": \"dspark step cost\", \"version\": 1, \"device\": \"NVIDIA H100 80GB HBM3\", \"model\": "
         "\"qwen3-8b bf16\", \"build\": \"0.1 abc\", \"buckets\": {}}",
         "buckets is not an array"},
        {"{\"format\": \"dspark step cost\", \"version\": 1, \"device\": \"NVIDIA H100 80GB HBM3\", \"model\": "
         "\"qwen3-8b bf16\", \"build\": \"0.1 abc\", \"buckets\": [{\"tokens\": 1.5, \"seconds\": 1}]}",
         "buckets[0].tokens"},
        {"{\"format\": \"dspark step cost\", \"version\": 1, \"device\": \"NVIDIA H100 80GB HBM3\", \"model\": "
         "\"qwen3-8b bf16\", \"build\": \"0.1 abc\", \"buckets\": [{\"tokens\": 1, \"seconds\": 1}, "
         "{\"tokens\": 2, \"seconds\": -1}]}",
         "buckets[1].seconds"},
        {"{\"format\": \"dspark step cost\", \"version\": 1, \"device\": \"NVIDIA H100 80GB HBM3\", \"model\": "
         "\"qwen3-8b bf16\", \"build\": \"0.1 abc\", \"buckets\": [{\"tokens\": 2, \"seconds\": 1}, "
         "{\"tokens\": 1, \"seconds\": 1}, {\"tokens\": 4, \"seconds\": 1}, {\"tokens\": 8, \"seconds\": 1}]}",
         "stale: its 4 buckets (2..8 tokens)"},
    };
    char bad[128];
    snprintf(bad, sizeof bad, "%s/bad.json", scratch_dir);
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        write_text(bad, broken[i].text);
        CHECK_ERR(ds_step_cost_load(bad, &key, &prof_opts, &back), broken[i].needle);
    }
    CHECK_ERR(ds_step_cost_load("/nonexistent/sps.json", &key, &prof_opts, &back), "/nonexistent/sps.json: cannot open");
    unlink(bad);
    unlink(path);
    ds_step_cost_free(c);
}

/* The start-up path: profile once, then trust the cache while its key holds;
 * a stale or malformed cache is said so on the log and profiled again. */
static void test_cached_startup(void) {
    if (!scratch_dir[0]) make_scratch();
    char path[128];
    snprintf(path, sizeof path, "%s/startup.json", scratch_dir);
    const ds_step_cost_key key = {.device = "cpu test", .model = "pico", .build = "1"};
    FILE *log = tmpfile();
    if (!log) return;
    fake_timer f = {0};
    ds_step_cost *c = NULL;
    bool profiled = false;
    CHECK_OK(ds_step_cost_cached(path, &key, &prof_opts, fake_time_step, &f, log, &c, &profiled));
    char *said = log_text(log);
    CHECK(profiled && f.calls == 28 && strstr(said, "no cache at"), "first start: profiled %d, %d calls, log \"%s\"",
          profiled, f.calls, said);
    free(said);
    ds_step_cost_free(c);

    long before = ftell(log);
    CHECK_OK(ds_step_cost_cached(path, &key, &prof_opts, fake_time_step, &f, log, &c, &profiled));
    CHECK(!profiled && f.calls == 28 && ftell(log) == before, "second start: profiled %d, %d calls", profiled, f.calls);
    double s;
    ds_step_cost_bucket(c, 3, NULL, &s, NULL);
    CHECK(fabs(s - 1.1 * 8 / 1024) < 1e-15, "cached bucket 3: %.17g", s);
    ds_step_cost_free(c);

    ds_step_cost_key moved = key;
    moved.device = "cpu other";
    CHECK_OK(ds_step_cost_cached(path, &moved, &prof_opts, fake_time_step, &f, log, &c, &profiled));
    said = log_text(log);
    CHECK(profiled && f.calls == 56 && strstr(said, "stale: device is \"cpu test\", this run's is \"cpu other\"; profiling again"),
          "new device: profiled %d, log \"%s\"", profiled, said);
    free(said);
    ds_step_cost_free(c);

    write_text(path, "{\"format\": \"dspark step cost\"");
    CHECK_OK(ds_step_cost_cached(path, &key, &prof_opts, fake_time_step, &f, log, &c, &profiled));
    said = log_text(log);
    CHECK(profiled && strstr(said, "not JSON"), "malformed: profiled %d, log \"%s\"", profiled, said);
    free(said);
    ds_step_cost_free(c);
    CHECK_OK(ds_step_cost_load(path, &key, &prof_opts, &c)); /* rewritten whole */
    ds_step_cost_free(c);

    /* a cache that cannot be written: reported, not fatal */
    CHECK_OK(ds_step_cost_cached("/nonexistent-dir/sps.json", &key, &prof_opts, fake_time_step, &f, log, &c, &profiled));
    said = log_text(log);
    CHECK(profiled && c && strstr(said, "not cached: cannot write /nonexistent-dir/sps.json"), "log \"%s\"", said);
    free(said);
    ds_step_cost_free(c);
    fake_timer broken = {.fail_at_tokens = 2};
    CHECK_ERR(ds_step_cost_cached("/nonexistent-dir/sps.json", &key, &prof_opts, fake_time_step, &broken, log, &c,
                                  &profiled),
              "the device went away");
    fclose(log);
    unlink(path);
    rmdir(scratch_dir);
}

/* ---- simulated acceptance -------------------------------------------------- */

static ds_sim_profile *load_profile(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", PROFILES, name);
    ds_sim_profile *p = NULL;
    ds_error *e = ds_sim_profile_load(path, &p);
    CHECK(!e, "%s", ds_error_message(e));
    ds_error_free(e);
    return p;
}

/* The bundled profiles' tau at gamma = 7: pico's from models/REFERENCE.md
 * (survivals .64 .43 .27 .16 .10 .05 .03: 2.68; the reference measured
 * 2.672), MT-Bench's the paper's 3.7. */
static void test_profile_tau(void) {
    ds_sim_profile *pico = load_profile("pico-dspark.json"), *mt = load_profile("mtbench-t1.json");
    if (!pico || !mt) return;
    CHECK(ds_sim_profile_positions(pico) == 7 && ds_sim_profile_positions(mt) == 7, "positions");
    double tp = ds_sim_profile_tau(pico, 7), tm = ds_sim_profile_tau(mt, 7);
    CHECK(fabs(tp - 2.68) < 1e-6 && fabs(tp - 2.672) < 0.01, "pico tau %.9f", tp);
    CHECK(fabs(tm - 3.7) < 1e-3, "mtbench tau %.9f", tm);
    CHECK(fabs(ds_sim_profile_tau(pico, 2) - 2.07) < 1e-6 && ds_sim_profile_tau(pico, 0) == 1, "pico tau at 2: %.9f",
          ds_sim_profile_tau(pico, 2));
    const double survival[] = {0.64, 0.43, 0.27, 0.16, 0.10, 0.05, 0.03};
    double s = 1;
    for (int k = 0; k < 7; k++) {
        s *= ds_sim_profile_accept(pico, k);
        CHECK(fabs(s - survival[k]) < 1e-6, "pico survival at %d: %.9f, REFERENCE.md %.2f", k, s, survival[k]);
    }
    CHECK(!strcmp(ds_sim_profile_name(mt), "mtbench-t1"), "name %s", ds_sim_profile_name(mt));
    ds_sim_profile_free(pico);
    ds_sim_profile_free(mt);
}

/* 20k rounds of each profile: per position, the rate of acceptance among the
 * rounds that reached it is p_k within 4.5 binomial standard deviations;
 * mean tokens per round (first rejection + 1) is tau within 4.5 sigma. */
static void test_sim_statistics(void) {
    const char *names[] = {"pico-dspark.json", "mtbench-t1.json"};
    for (int pi = 0; pi < 2; pi++) {
        ds_sim_profile *p = load_profile(names[pi]);
        if (!p) return;
        enum { ROUNDS = 20000, G = 7 };
        long reached[G] = {0}, accepted[G] = {0};
        double sum = 0, sum2 = 0;
        for (int req = 0; req < 20; req++) {
            ds_rng rng;
            ds_sim_stream_seed(&rng, 1234, (uint64_t)req);
            for (int i = 0; i < ROUNDS / 20; i++) {
                float conf[G];
                int fr;
                CHECK_OK(ds_sim_round(p, &rng, G, conf, &fr));
                for (int k = 0; k < G && k <= fr; k++) {
                    reached[k]++;
                    accepted[k] += fr > k;
                }
                sum += fr + 1;
                sum2 += (double)(fr + 1) * (fr + 1);
            }
        }
        for (int k = 0; k < G; k++) {
            double pk = ds_sim_profile_accept(p, k), rate = (double)accepted[k] / reached[k];
            double sigma = sqrt(pk * (1 - pk) / reached[k]);
            CHECK(fabs(rate - pk) <= 4.5 * sigma, "%s position %d: %.4f accepted of %ld reached, p_k %.4f (sigma %.4f)",
                  names[pi], k, rate, reached[k], pk, sigma);
        }
        double mean = sum / ROUNDS, sd = sqrt(sum2 / ROUNDS - mean * mean) / sqrt(ROUNDS), tau = ds_sim_profile_tau(p, G);
        CHECK(fabs(mean - tau) <= 4.5 * sd, "%s: %.4f tokens a round, tau %.4f (sigma %.4f)", names[pi], mean, tau, sd);
        printf("  %s: %.4f tokens a round over %d rounds (tau %.4f)\n", names[pi], mean, ROUNDS, tau);
        ds_sim_profile_free(p);
    }
}

/* Calibration: among rounds that reached position k, P(accept | c in a bin)
 * is the bin's mean confidence; and P(drafts 0..j all accepted | survival in
 * a bin) is the bin's mean survival (what Algorithm 1 relies on). 10 bins,
 * those with at least 300 samples, within 4.5 binomial sigma. */
static void test_sim_calibration(void) {
    ds_sim_profile *p = load_profile("pico-dspark.json");
    if (!p) return;
    enum { BINS = 10, G = 7 };
    double c_sum[BINS] = {0}, a_sum[BINS] = {0};
    long c_n[BINS] = {0}, c_acc[BINS] = {0}, a_n[BINS] = {0}, a_acc[BINS] = {0};
    ds_rng rng;
    ds_sim_stream_seed(&rng, 7, 0);
    for (int i = 0; i < 20000; i++) {
        float conf[G];
        int fr;
        CHECK_OK(ds_sim_round(p, &rng, G, conf, &fr));
        double a = 1;
        for (int k = 0; k < G; k++) {
            CHECK(conf[k] >= 0 && conf[k] <= 1, "confidence %g", conf[k]);
            a *= conf[k];
            int ab = a >= 1 ? BINS - 1 : (int)(a * BINS);
            a_n[ab]++;
            a_sum[ab] += a;
            a_acc[ab] += fr > k;
            if (k > fr) continue;
            int cb = conf[k] >= 1 ? BINS - 1 : (int)(conf[k] * BINS);
            c_n[cb]++;
            c_sum[cb] += conf[k];
            c_acc[cb] += fr > k;
        }
    }
    int checked = 0;
    for (int b = 0; b < BINS; b++) {
        if (c_n[b] >= 300) {
            double m = c_sum[b] / c_n[b], rate = (double)c_acc[b] / c_n[b], sigma = sqrt(m * (1 - m) / c_n[b]);
            CHECK(fabs(rate - m) <= 4.5 * sigma + 1e-12, "confidence bin %d: accepted %.4f, mean confidence %.4f (n %ld)",
                  b, rate, m, c_n[b]);
            CHECK(m >= b / 10.0 && m <= (b + 1) / 10.0, "bin %d mean %g", b, m);
            checked++;
        }
        if (a_n[b] >= 300) {
            double m = a_sum[b] / a_n[b], rate = (double)a_acc[b] / a_n[b], sigma = sqrt(m * (1 - m) / a_n[b]);
            CHECK(fabs(rate - m) <= 4.5 * sigma + 1e-12, "survival bin %d: prefix accepted %.4f, mean survival %.4f (n %ld)",
                  b, rate, m, a_n[b]);
            checked++;
        }
    }
    CHECK(checked >= 15, "only %d bins had enough samples", checked);
    ds_sim_profile_free(p);
}

/* A request's stream is its own: the same (seed, request) gives the same
 * rounds whatever else ran; another request or seed gives others. p = 0 and
 * p = 1 positions are certain. */
static void test_sim_streams(void) {
    ds_sim_profile *p = NULL;
    CHECK_OK(ds_sim_profile_new("edge", (const double[]){1, 0.5, 0}, 3, NULL, 3, &p));
    ds_rng a, b, other, noise;
    ds_sim_stream_seed(&a, 5, 17);
    ds_sim_stream_seed(&noise, 5, 3);
    ds_sim_stream_seed(&b, 5, 17);
    ds_sim_stream_seed(&other, 5, 18);
    int same = 1, differ = 0;
    for (int i = 0; i < 100; i++) {
        float ca[3], cb[3], co[3], cn[3];
        int fa, fb, fo, fn;
        CHECK_OK(ds_sim_round(p, &noise, 3, cn, &fn)); /* another request drawing in between */
        CHECK_OK(ds_sim_round(p, &a, 3, ca, &fa));
        CHECK_OK(ds_sim_round(p, &b, 3, cb, &fb));
        CHECK_OK(ds_sim_round(p, &other, 3, co, &fo));
        same &= fa == fb && !memcmp(ca, cb, sizeof ca);
        differ += ca[1] != co[1];
        CHECK(ca[0] == 1 && ca[2] == 0 && fa >= 1 && fa <= 2, "edge round: c %g %g %g, first reject %d", ca[0], ca[1],
              ca[2], fa);
    }
    CHECK(same, "one (seed, request) gave two streams");
    CHECK(differ > 90, "requests 17 and 18 agreed on %d of 100 rounds", 100 - differ);
    float c[4];
    int fr;
    CHECK_ERR(ds_sim_round(p, &a, 4, c, &fr), "a round of 4 drafts, but the profile has 3 positions");
    CHECK_ERR(ds_sim_round(p, &a, 0, c, &fr), "a round of 0 drafts");
    ds_sim_profile_free(p);
}

static void test_sim_bad_profiles(void) {
    make_scratch();
    char path[128];
    snprintf(path, sizeof path, "%s/profile.json", scratch_dir);
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {"{\"kappa\": 3, \"acceptance\": [0.5, 1.5]}", "acceptance[1] = 1.5 outside [0, 1]"},
        {"{\"kappa\": 0, \"acceptance\": [0.5]}", "kappa at position 0 = 0"},
        {"{\"kappa\": [1, 2], \"acceptance\": [0.5]}", "field kappa is not a number or an array of one per position"},
        {"{\"kappa\": 3}", "missing field acceptance"},
        {"{\"acceptance\": [0.5]}", "missing field kappa"},
        {"{\"kappa\": 3, \"acceptance\": []}", "field acceptance is not an array of 1 to 64"},
        {"{\"kappa\": 3, \"acceptance\": [0.5, \"x\"]}", "acceptance[1] is not a number"},
        {"{\"name\": 5, \"kappa\": 3, \"acceptance\": [0.5]}", "field name is not a string"},
        {"{\"kappa\": 3, \"acceptance\": [0.5]", "not JSON"},
        {"[0.5]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(path, cases[i].text);
        ds_sim_profile *p = NULL;
        CHECK_ERR(ds_sim_profile_load(path, &p), cases[i].needle);
        CHECK(!p, "case %zu gave a profile", i);
    }
    write_text(path, "{\"kappa\": [2, 4], \"acceptance\": [0.5, 0.25], \"note\": \"ignored\"}");
    ds_sim_profile *p = NULL;
    CHECK_OK(ds_sim_profile_load(path, &p));
    CHECK(ds_sim_profile_tau(p, 2) == 1.625 && !strcmp(ds_sim_profile_name(p), path), "tau %g name %s",
          ds_sim_profile_tau(p, 2), ds_sim_profile_name(p));
    ds_sim_profile_free(p);
    ds_sim_profile *none = NULL;
    CHECK_ERR(ds_sim_profile_load("/nonexistent/profile.json", &none), "/nonexistent/profile.json: cannot open");
    unlink(path);
    rmdir(scratch_dir);
}

/* ---- together ---------------------------------------------------------------- */

/* 64 requests of the MT-Bench profile for 400 steps on a curve that is flat
 * to 64 tokens and then grows (bandwidth-bound, then compute-bound).
 * Algorithm 1's predicted tau* (sum over steps) matches the tokens the
 * simulator emits within 2 % (sigma is about 0.3 %): the survivals it
 * schedules by are the true probabilities. And it emits tokens at least as
 * fast as AR (B = R each step, R tokens), which it provably beats in
 * expectation at every step where it admits anything. */
static void test_simulated_batch(void) {
    ds_sim_profile *p = load_profile("mtbench-t1.json");
    const int tok[] = {1, 64, 256, 1024};
    const double sec[] = {0.005, 0.0052, 0.008, 0.03};
    ds_step_cost *sps = curve(tok, sec, 4, DS_STEP_COST_LINEAR);
    if (!p || !sps) return;
    enum { R = 64, G = 7, STEPS = 400 };
    ds_rng rng[R];
    for (int r = 0; r < R; r++) ds_sim_stream_seed(&rng[r], 99, (uint64_t)r);
    float conf[R * G];
    int fr[R], len[R];
    double predicted = 0, emitted = 0, seconds = 0, fixed_tokens = 0;
    for (int s = 0; s < STEPS; s++) {
        for (int r = 0; r < R; r++) CHECK_OK(ds_sim_round(p, &rng[r], G, conf + r * G, &fr[r]));
        ds_schedule_input in = {.n_requests = R, .gamma = G, .conf = conf};
        ds_schedule_result res;
        CHECK_OK(ds_schedule_confidence(&in, sps, NULL, len, &res));
        predicted += res.tau;
        seconds += ds_step_cost_seconds(sps, res.verify_tokens);
        for (int r = 0; r < R; r++) {
            emitted += (len[r] < fr[r] ? len[r] : fr[r]) + 1;
            fixed_tokens += fr[r] + 1;
        }
    }
    double alg1 = emitted / seconds, ar = R / ds_step_cost_seconds(sps, R);
    double fixed = fixed_tokens / (STEPS * ds_step_cost_seconds(sps, R * (G + 1)));
    printf("  64 requests, mtbench-t1: Algorithm 1 %.0f tokens/s (%.3f tokens a request a step), AR %.0f, fixed 7 %.0f\n",
           alg1, emitted / (STEPS * R), ar, fixed);
    CHECK(fabs(emitted - predicted) <= 0.02 * predicted, "emitted %.0f tokens, Algorithm 1 predicted %.0f", emitted,
          predicted);
    CHECK(alg1 >= ar, "Algorithm 1 %.1f tokens/s below AR %.1f", alg1, ar);
    CHECK(alg1 > fixed, "Algorithm 1 %.1f tokens/s below fixed gamma 7 %.1f", alg1, fixed);
    ds_step_cost_free(sps);
    ds_sim_profile_free(p);
}

/* ---- the speculation ceiling (ceiling.h) ----------------------------------- */

/* Acceptance 1, 1, 0 (no draws: every confidence is exactly its p), R = 2,
 * gamma 3. Flat steps of 1 s: the best B is 4 (survivals 1, 1, 1, 1; the
 * zeros add nothing, and a tie keeps the smaller B), 6 tokens a step
 * against AR's 2: 3x, at 6 verify tokens; with a 1 s draft pass, 6 / 2 s
 * against 2 / 1 s: 1.5x. Steps of `tokens` seconds (compute-bound): any B
 * gives (2 + B) / (2 + B) / (2 / 2) = 1, never more, so the ceiling is AR
 * itself at B = 0. Bad arguments are named. */
static void test_ceiling(void) {
    ds_sim_profile *p = NULL;
    CHECK_OK(ds_sim_profile_new("sure", (const double[]){1, 1, 0}, 3, NULL, 3, &p));
    const int tk[] = {1, 2, 3, 4, 5, 6, 7, 8};
    ds_step_cost *flat = curve(tk, (const double[]){1, 1, 1, 1, 1, 1, 1, 1}, 8, DS_STEP_COST_LINEAR);
    ds_step_cost *lin = curve(tk, (const double[]){1, 2, 3, 4, 5, 6, 7, 8}, 8, DS_STEP_COST_LINEAR);
    ds_spec_ceiling c;
    CHECK_OK(ds_spec_ceiling_estimate(flat, p, 2, 3, 0, 4, 1, &c));
    CHECK(c.free_x_ar == 3 && c.free_verify_tokens == 6, "flat, free drafter: %gx at %g tokens (3x at 6)", c.free_x_ar,
          c.free_verify_tokens);
    CHECK(c.cost_x_ar == 3 && c.cost_verify_tokens == 6, "flat, no draft cost: %gx at %g", c.cost_x_ar,
          c.cost_verify_tokens);
    CHECK_OK(ds_spec_ceiling_estimate(flat, p, 2, 3, 1, 4, 1, &c));
    CHECK(c.free_x_ar == 3 && c.cost_x_ar == 1.5 && c.cost_verify_tokens == 6, "flat, 1 s draft: %gx / %gx at %g",
          c.free_x_ar, c.cost_x_ar, c.cost_verify_tokens);
    CHECK_OK(ds_spec_ceiling_estimate(lin, p, 2, 3, 0, 4, 1, &c));
    CHECK(c.free_x_ar == 1 && c.free_verify_tokens == 2, "compute-bound: %gx at %g tokens (1x at 2)", c.free_x_ar,
          c.free_verify_tokens);
    /* A profile with spread confidences: the ceiling never falls below AR, and not below a uniform allocation's
     * expected gain on a flat curve (Algorithm 1 with a free drafter on a flat curve verifies everything). */
    ds_sim_profile *t1 = NULL;
    CHECK_OK(ds_sim_profile_load(PROFILES "/mtbench-t1.json", &t1));
    CHECK_OK(ds_spec_ceiling_estimate(flat, t1, 1, 7, 0, 2000, 7, &c));
    CHECK(fabs(c.free_x_ar - ds_sim_profile_tau(t1, 7)) < 0.05, "flat curve, mtbench-t1: %gx (tau %g)", c.free_x_ar,
          ds_sim_profile_tau(t1, 7));
    CHECK(fabs(c.free_verify_tokens - 8) < 1e-9, "flat curve: every draft verified (%g tokens)", c.free_verify_tokens);
    ds_error *e = ds_spec_ceiling_estimate(flat, p, 2, 4, 0, 1, 1, &c);
    CHECK(e && strstr(ds_error_message(e), "gamma 4") && strstr(ds_error_message(e), "3 positions"),
          "gamma past the profile: %s", e ? ds_error_message(e) : "no error");
    ds_error_free(e);
    e = ds_spec_ceiling_estimate(flat, p, 0, 3, 0, 1, 1, &c);
    CHECK(e && strstr(ds_error_message(e), "0 requests"), "no requests: %s", e ? ds_error_message(e) : "no error");
    ds_error_free(e);
    ds_step_cost_free(flat);
    ds_step_cost_free(lin);
    ds_sim_profile_free(p);
    ds_sim_profile_free(t1);
}

RUN_TESTS("schedule", test_early_stop, test_three_requests, test_ties, test_strictly_better, test_nothing_to_admit,
          test_draft_cost, test_stale_budget, test_fixed, test_bad_input, test_random_vs_slow,
          test_monotone_and_interpolation, test_default_buckets, test_profile, test_cache, test_cached_startup,
          test_profile_tau, test_sim_statistics, test_sim_calibration, test_sim_streams, test_sim_bad_profiles,
          test_simulated_batch, test_ceiling)
