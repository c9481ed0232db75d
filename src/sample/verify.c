/* Greedy: the longest prefix on which the target's argmax agrees, then the
 * target's argmax. Sampling: the lossless rejection rule of the reference
 * (ratio p_t/p_d against uniforms drawn for every position at once, the
 * residual max(0, p_t - p_d) on the first rejection, a bonus from p_t when
 * everything is accepted), on the processed distributions. */
#include "sample/verify.h"

#include <stddef.h>

#include "sample/draw.h"
#include "sample/probs.h"

int ds_verify(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
              const ds_sampling *s, ds_rng *rng, float *scratch, int32_t *next) {
    if (ds_sampling_greedy(s)) {
        int a = 0;
        while (a < n && ds_argmax(target_logits + (size_t)a * V, V) == draft[a]) a++;
        *next = ds_argmax(target_logits + (size_t)a * V, V);
        return a;
    }
    /* n uniforms for the ratios, then one for the residual or bonus draw. */
    double u[DS_VERIFY_MAX_DRAFT + 1];
    for (int i = 0; i <= n; i++) u[i] = ds_rng_uniform(rng);
    return ds_verify_uniforms(target_logits, (size_t)V, V, draft, n, draft_probs, (size_t)V, s, u, scratch, next);
}

int ds_verify_uniforms(const float *target_logits, size_t t_stride, int V, const int32_t *draft, int n,
                       const float *draft_probs, size_t d_stride, const ds_sampling *s, const double *u,
                       float *scratch, int32_t *next) {
    float *pt = scratch, *res = scratch + V;
    int a = 0;
    for (; a < n; a++) {
        ds_probs_from_logits(target_logits + (size_t)a * t_stride, V, s, pt);
        double pd = draft_probs[(size_t)a * d_stride + draft[a]];
        double ratio = (double)pt[draft[a]] / (pd > 1e-8 ? pd : 1e-8);
        if (!(u[a] < ratio)) break;
    }
    if (a < n) { /* pt holds row a's target distribution */
        const float *pd = draft_probs + (size_t)a * d_stride;
        double mass = 0;
        for (int i = 0; i < V; i++) {
            float r = pt[i] - pd[i];
            res[i] = r > 0 ? r : 0;
            mass += res[i];
        }
        *next = ds_sample_probs_u(mass > 1e-8 ? res : pt, V, u[n]);
    } else {
        ds_probs_from_logits(target_logits + (size_t)n * t_stride, V, s, pt);
        *next = ds_sample_probs_u(pt, V, u[n]);
    }
    return a;
}
