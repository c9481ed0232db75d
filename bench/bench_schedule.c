/* Algorithm 1 and vLLM's refinements on simulated acceptance and a synthetic
 * cost model: which policy emits the most tokens per second at each
 * concurrency. No model runs here; this decides the schedule's defaults, and
 * the batched engine's `dspark bench --sim-acceptance` measures the real thing.
 *
 *   bench_schedule [--steps N] [--context C] [--coarse] [--seed S] [--profile FILE]...
 *
 * Cost model: an H100 (3.0 TB/s reached, about 600 TFLOP/s of bf16 reached)
 * at Qwen3-8B's shape with R requests of C tokens of context (default 1024);
 * synthetic, stated so that the numbers can be redone:
 *   verify of B tokens: max(5.3 ms + 4 us * B + R * C * 144 KiB / 3.0 TB/s,
 *                           B * 2 * 8.2 GFLOP / 600 TFLOP/s)
 *     (weights and every request's KV cache stream once a step, however many
 *     rows a request verifies; the matmuls' compute takes over past some B)
 *   draft for R requests: max(1.1 ms + R * C * 20 KiB / 3.0 TB/s,
 *                             R * 7 * 2 GFLOP / 600 TFLOP/s)
 *     (a DSpark drafter reads its context cache; its LM head and layers run
 *     on all 7 positions of every request)
 * At each concurrency the scheduler gets the verify curve at that R through
 * ds_step_cost_profile (its default buckets; --coarse: powers of two, to see
 * what coarse buckets cost), as the engine would profile one per concurrency
 * bucket. AR pays no draft; every drafting step pays the draft in full.
 *
 * Policies, paired (every policy replays the same per-request streams):
 *   AR         B = R, R tokens
 *   fixed-7    B = 8R
 *   alg1       SPEC §6 as written: Theta = tau* * SPS(B)
 *   +draft     Theta = tau* / (t_draft(R) + t_verify(B))
 *   +stale     alg1 with the budget from the previous step's confidences,
 *              allocated by the current ones
 *   +gate      +draft, and a plain AR step whenever drafting is predicted
 *              not to pay: ds_schedule_draft_pays's Theta over AR's on each
 *              drafted step's confidences, averaged (EMA, weight 0.25 on the
 *              newest), below 1; drafts every 16th step regardless, to see
 *              again. (Per step, on the last step's confidences alone, it
 *              lost 5 % at R = 1: one step's confidences say little about
 *              the next's.) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "speculate/schedule.h"
#include "speculate/sim_acceptance.h"
#include "speculate/step_cost.h"

#define G 7
#define MAX_R 256
#define PROBE_EVERY 16
#define GAIN_EMA 0.25

static double context = 1024;

static double verify_s(int b, int r) {
    double bw = 5.3e-3 + 4e-6 * b + r * context * 144.0 * 1024 / 3.0e12, compute = b * 2 * 8.2e9 / 600e12;
    return bw > compute ? bw : compute;
}

static double draft_s(int r) {
    double bw = 1.1e-3 + r * context * 20.0 * 1024 / 3.0e12, compute = r * G * 2 * 2e9 / 600e12;
    return bw > compute ? bw : compute;
}

static ds_error *synthetic_step(void *ctx, int tokens, double *seconds) {
    *seconds = verify_s(tokens, *(const int *)ctx);
    return NULL;
}

enum { AR, FIXED, ALG1, DRAFT, STALE, GATE, N_POLICIES };
static const char *policy_names[] = {"AR", "fixed-7", "alg1", "+draft", "+stale", "+gate"};

/* Tokens per second of one policy at R requests over `steps` steps. */
static ds_error *run_policy(int policy, int R, int steps, uint64_t seed, const ds_sim_profile *p,
                            const ds_step_cost *sps, double *tokens_per_s, double *mean_b) {
    static ds_rng rng[MAX_R];
    static float conf[MAX_R * G], prev[MAX_R * G];
    int fr[MAX_R], len[MAX_R];
    for (int r = 0; r < R; r++) ds_sim_stream_seed(&rng[r], seed, (uint64_t)r);
    for (int i = 0; i < R * G; i++) prev[i] = 1.0f; /* no confidences seen yet: all ones, as vLLM */
    double tokens = 0, seconds = 0, b_sum = 0, gain = 2;
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < R; r++) DS_TRY(ds_sim_round(p, &rng[r], G, conf + r * G, &fr[r]));
        ds_schedule_input in = {.n_requests = R, .gamma = G, .conf = conf};
        ds_schedule_input stale = {.n_requests = R, .gamma = G, .conf = prev};
        ds_schedule_opts o = {.draft_seconds = policy == DRAFT || policy == GATE ? draft_s(R) : 0};
        ds_schedule_result res;
        bool drafts = policy != AR;
        if (policy == GATE && s % PROBE_EVERY) drafts = gain > 1;
        switch (drafts ? policy : AR) {
        case AR: DS_TRY(ds_schedule_fixed(&in, 0, sps, &o, len, &res)); break;
        case FIXED: DS_TRY(ds_schedule_fixed(&in, G, sps, &o, len, &res)); break;
        case STALE: DS_TRY(ds_schedule_confidence_stale(&stale, &in, sps, &o, len, &res)); break;
        default: DS_TRY(ds_schedule_confidence(&in, sps, &o, len, &res)); break;
        }
        if (drafts) memcpy(prev, conf, (size_t)(R * G) * sizeof *conf); /* an AR step sees no confidences */
        if (policy == GATE && drafts) { /* what drafting was predicted to gain over AR, smoothed */
            bool pays;
            ds_schedule_result pred;
            DS_TRY(ds_schedule_draft_pays(&in, sps, &o, &pays, &pred));
            gain = (1 - GAIN_EMA) * gain + GAIN_EMA * pred.theta * ds_step_cost_seconds(sps, R) / R;
        }
        for (int r = 0; r < R; r++) tokens += (len[r] < fr[r] ? len[r] : fr[r]) + 1;
        seconds += verify_s(res.verify_tokens, R) + (drafts ? draft_s(R) : 0);
        b_sum += res.verify_tokens;
    }
    *tokens_per_s = tokens / seconds;
    *mean_b = b_sum / steps;
    return NULL;
}

/* The verify curve at R requests, as start-up profiling would measure it. */
static ds_error *curve_at(int R, bool coarse, ds_step_cost **out) {
    ds_step_cost_opts o = {.max_tokens = R * (G + 1), .warmup = 0, .reps = 3, .interp = DS_STEP_COST_LINEAR};
    int buckets[DS_STEP_COST_MAX_BUCKETS], n = 0;
    if (coarse) {
        for (int t = 1; t < R * (G + 1); t *= 2) buckets[n++] = t;
        buckets[n++] = R * (G + 1);
        o.buckets = buckets;
        o.n_buckets = n;
    }
    return ds_step_cost_profile(&o, synthetic_step, &R, out);
}

static ds_error *bench_profile(const char *path, int steps, uint64_t seed, bool coarse) {
    ds_sim_profile *p;
    DS_TRY(ds_sim_profile_load(path, &p));
    printf("\n%s: tau %.3f at gamma %d; SIMULATED acceptance, synthetic costs, context %.0f\n",
           ds_sim_profile_name(p), ds_sim_profile_tau(p, G), G, context);
    printf("%5s", "R");
    for (int k = 0; k < N_POLICIES; k++) printf(" %16s", policy_names[k]);
    printf("   (output tokens/s, mean B)\n");
    static const int conc[] = {1, 8, 32, 64, 128, 256};
    ds_error *e = NULL;
    for (size_t c = 0; c < sizeof conc / sizeof conc[0] && !e; c++) {
        ds_step_cost *sps;
        e = curve_at(conc[c], coarse, &sps);
        printf("%5d", conc[c]);
        for (int k = 0; k < N_POLICIES && !e; k++) {
            double tps, b;
            e = run_policy(k, conc[c], steps, seed, p, sps, &tps, &b);
            if (!e) printf(" %9.0f %6.0f", tps, b);
        }
        printf("\n");
        if (!e) ds_step_cost_free(sps);
    }
    ds_sim_profile_free(p);
    return e;
}

/* What one Algorithm 1 call costs the host at R = 256, gamma = 7. */
static ds_error *time_scheduler(const char *profile) {
    ds_sim_profile *p;
    DS_TRY(ds_sim_profile_load(profile, &p));
    ds_step_cost *sps;
    DS_TRY(curve_at(MAX_R, false, &sps));
    static float conf[MAX_R * G];
    ds_rng rng;
    ds_sim_stream_seed(&rng, 1, 0);
    int fr, len[MAX_R];
    for (int r = 0; r < MAX_R; r++) DS_TRY(ds_sim_round(p, &rng, G, conf + r * G, &fr));
    ds_schedule_input in = {.n_requests = MAX_R, .gamma = G, .conf = conf};
    ds_schedule_result res;
    const int reps = 2000;
    for (int with_draft = 0; with_draft < 2; with_draft++) {
        ds_schedule_opts o = {.draft_seconds = with_draft ? draft_s(MAX_R) : 0};
        double t0 = ds_now_s();
        for (int i = 0; i < reps; i++) DS_TRY(ds_schedule_confidence(&in, sps, &o, len, &res));
        double us = (ds_now_s() - t0) / reps * 1e6;
        printf("ds_schedule_confidence at R = %d, gamma = %d%s: %.1f us a call (admits %d drafts)\n", MAX_R, G,
               with_draft ? ", draft cost" : "", us, res.drafts);
    }
    ds_step_cost_free(sps);
    ds_sim_profile_free(p);
    return NULL;
}

int main(int argc, char **argv) {
    int steps = 2000;
    uint64_t seed = 39;
    bool coarse = false;
    const char *profiles[8];
    int n_profiles = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--context") && i + 1 < argc) context = atof(argv[++i]);
        else if (!strcmp(argv[i], "--coarse")) coarse = true;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc && n_profiles < 8) profiles[n_profiles++] = argv[++i];
        else {
            fprintf(stderr, "usage: bench_schedule [--steps N] [--context C] [--coarse] [--seed S] [--profile FILE]...\n");
            return 2;
        }
    }
    if (steps < 1 || !(context >= 0)) {
        fprintf(stderr, "bench_schedule: --steps must be at least 1 and --context at least 0\n");
        return 2;
    }
    if (!n_profiles) {
        profiles[n_profiles++] = DS_MODELS "/../bench/profiles/pico-dspark.json";
        profiles[n_profiles++] = DS_MODELS "/../bench/profiles/mtbench-t1.json";
    }
    ds_error *e = NULL;
    for (int i = 0; i < n_profiles && !e; i++) e = bench_profile(profiles[i], steps, seed, coarse);
    if (!e) {
        printf("\n");
        e = time_scheduler(profiles[0]);
    }
    if (e) {
        fprintf(stderr, "bench_schedule: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    return 0;
}
