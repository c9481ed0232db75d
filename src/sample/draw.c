/* Inverse-CDF draws in id order with a double running sum: the order the
 * backends' draw ops reproduce. */
#include "sample/draw.h"

int32_t ds_sample_probs(const float *probs, int V, ds_rng *rng) { return ds_sample_probs_u(probs, V, ds_rng_uniform(rng)); }

int32_t ds_sample_probs_u(const float *probs, int V, double uniform) {
    double total = 0;
    for (int i = 0; i < V; i++) total += probs[i];
    double u = uniform * total, cum = 0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    return last; /* rounding left u at the very top */
}
