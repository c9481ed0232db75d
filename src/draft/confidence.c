#include "draft/confidence.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

float ds_conf_prob(float c, float s) { return 1.0f / (1.0f + expf(-(c / s))); }

bool ds_conf_below(float c, float t) { return ds_conf_prob(c, 1.0f) < t; }

bool ds_conf_below_at(float c, float s, float t) { return ds_conf_prob(c, s) < t; }

/* Floats in their order as unsigned keys (NaNs fall outside [-inf, +inf]). */
static uint32_t fkey(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u >> 31 ? ~u : u | 0x80000000u;
}
static float fval(uint32_t k) {
    const uint32_t u = k >> 31 ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ds_conf_cutoff_at(float t, float s) {
    /* ds_conf_below_at(., s, t) holds at -inf (sigmoid 0 < t) and not at
     * +inf (sigmoid 1 >= t), and never holds again once it has stopped
     * holding (c / s, s > 0, and 1 + expf(-c / s) are monotone in c):
     * bisect over the floats. */
    uint32_t lo = fkey(-INFINITY), hi = fkey(INFINITY);
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (ds_conf_below_at(fval(mid), s, t)) lo = mid;
        else hi = mid;
    }
    return fval(hi);
}

float ds_conf_cutoff(float t) { return ds_conf_cutoff_at(t, 1.0f); }

int ds_conf_keep(const float *conf_logit, const float *temp, int gamma, float threshold) {
    if (threshold > 0)
        for (int k = 0; k < gamma; k++)
            if (ds_conf_below_at(conf_logit[k], temp ? temp[k] : 1.0f, threshold)) return k;
    return gamma;
}
