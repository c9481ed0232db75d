/* The speculation ceiling (ceiling.h). */
#include "speculate/ceiling.h"

#include <stdlib.h>

static int by_survival_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

ds_error *ds_spec_ceiling_estimate(const ds_step_cost *sps, const ds_sim_profile *sim, int requests, int gamma,
                                   double draft_seconds, int draws, uint64_t seed, ds_spec_ceiling *out) {
    *out = (ds_spec_ceiling){0};
    if (!sps || !sim) return ds_errorf("speculation ceiling: no %s", !sps ? "step-cost curve" : "acceptance profile");
    if (requests < 1 || gamma < 1 || gamma > ds_sim_profile_positions(sim) || draws < 1 || !(draft_seconds >= 0))
        return ds_errorf("speculation ceiling: %d requests, gamma %d (profile %s has %d positions), %d draws, "
                         "draft pass %g s",
                         requests, gamma, ds_sim_profile_name(sim), ds_sim_profile_positions(sim), draws, draft_seconds);
    const int R = requests, N = R * gamma;
    const double plain = ds_step_cost_seconds(sps, R);
    if (!(plain > 0)) return ds_errorf("speculation ceiling: the step-cost curve gives %g s for %d tokens", plain, R);
    double *a = malloc((size_t)N * sizeof *a);
    float *conf = malloc((size_t)gamma * sizeof *conf);
    ds_error *e = !a || !conf ? ds_errorf("out of memory") : NULL;
    for (int d = 0; d < draws && !e; d++) {
        ds_rng rng;
        ds_sim_stream_seed(&rng, seed, (uint64_t)d);
        for (int r = 0; r < R && !e; r++) {
            int first_reject;
            e = ds_sim_round(sim, &rng, gamma, conf, &first_reject);
            double s = 1;
            for (int j = 0; j < gamma && !e; j++) a[r * gamma + j] = s *= conf[j];
        }
        if (e) break;
        /* Survival never rises along a request, so the highest-first order admits a prefix of each. */
        qsort(a, (size_t)N, sizeof *a, by_survival_desc);
        double tokens = R, best_free = 1, best_cost = 1;
        int b_free = 0, b_cost = 0;
        for (int B = 1; B <= N; B++) {
            tokens += a[B - 1];
            const double t = ds_step_cost_seconds(sps, R + B);
            const double free = tokens / t * plain / R, cost = tokens / (draft_seconds + t) * plain / R;
            if (free > best_free) best_free = free, b_free = B;
            if (cost > best_cost) best_cost = cost, b_cost = B;
        }
        out->free_x_ar += best_free / draws;
        out->free_verify_tokens += (double)(R + b_free) / draws;
        out->cost_x_ar += best_cost / draws;
        out->cost_verify_tokens += (double)(R + b_cost) / draws;
    }
    free(a);
    free(conf);
    if (e) *out = (ds_spec_ceiling){0};
    return e;
}
