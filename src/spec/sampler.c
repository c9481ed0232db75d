#include "spec/sampler.h"

#include <math.h>
#include <stdlib.h>

int32_t ds_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct {
    float p;
    int32_t id;
} cand;

/* Descending probability; equal probabilities keep the lower id first. */
static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id > y->id ? 1 : -1;
}

void ds_probs_from_logits(const float *logits, int V, const ds_sampling *s, float *probs) {
    if (ds_sampling_greedy(s)) {
        for (int i = 0; i < V; i++) probs[i] = 0;
        probs[ds_argmax(logits, V)] = 1.0f;
        return;
    }
    /* softmax(logits / T) in fp32, as the reference. */
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, logits[i] / s->temperature);
    double sum = 0;
    for (int i = 0; i < V; i++) {
        probs[i] = expf(logits[i] / s->temperature - mx);
        sum += probs[i];
    }
    for (int i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
    bool use_k = s->top_k > 0 && s->top_k < V, use_p = s->top_p > 0 && s->top_p < 1.0f;
    if (!use_k && !use_p) return;
    /* Rank the tokens, keep the top-k, then the smallest prefix whose mass
     * reaches top_p (always at least one token), renormalise. */
    cand *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) c[i] = (cand){probs[i], i};
    qsort(c, (size_t)V, sizeof *c, cand_desc);
    int keep = use_k ? s->top_k : V;
    double kept_mass = 0;
    for (int i = 0; i < keep; i++) kept_mass += c[i].p;
    if (use_p) {
        double cum = 0, target = s->top_p * kept_mass;
        int n = 0;
        while (n < keep) {
            cum += c[n].p;
            n++;
            if (cum >= target) break;
        }
        keep = n;
        kept_mass = cum;
    }
    for (int i = 0; i < V; i++) probs[i] = 0;
    for (int i = 0; i < keep; i++) probs[c[i].id] = (float)(c[i].p / kept_mass);
    free(c);
}

int32_t ds_sample_probs(const float *probs, int V, ds_rng *rng) {
    double total = 0;
    for (int i = 0; i < V; i++) total += probs[i];
    double u = ds_rng_uniform(rng) * total, cum = 0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    return last; /* rounding left u at the very top */
}
