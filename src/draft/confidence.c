#include "draft/confidence.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

bool ds_conf_below(float c, float t) { return 1.0f / (1.0f + expf(-c)) < t; }

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

float ds_conf_cutoff(float t) {
    /* ds_conf_below(., t) holds at -inf (sigmoid 0 < t) and not at +inf
     * (sigmoid 1 >= t), and never holds again once it has stopped holding
     * (1 + expf(-c) only falls as c grows): bisect over the floats. */
    uint32_t lo = fkey(-INFINITY), hi = fkey(INFINITY);
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (ds_conf_below(fval(mid), t)) lo = mid;
        else hi = mid;
    }
    return fval(hi);
}

int ds_conf_keep(const float *conf_logit, int gamma, float threshold) {
    if (threshold > 0)
        for (int k = 0; k < gamma; k++)
            if (ds_conf_below(conf_logit[k], threshold)) return k;
    return gamma;
}
