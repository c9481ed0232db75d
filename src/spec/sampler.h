/* Token distributions and draws. The same processing (temperature, top-k,
 * top-p) is applied to the target's and the drafter's logits, so that
 * speculative sampling reproduces exactly the target's processed
 * distribution. Temperatures below 1e-5 mean greedy (one-hot argmax), as in
 * the reference. */
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature; /* < 1e-5: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* >= 1: off */
} ds_sampling;

static inline bool ds_sampling_greedy(const ds_sampling *s) { return s->temperature < 1e-5f; }

/* Index of the largest value; ties go to the lowest index. */
int32_t ds_argmax(const float *x, int n);
/* probs[V] = processed distribution of logits[V]. scratch: V (int32) entries or NULL. */
void ds_probs_from_logits(const float *logits, int V, const ds_sampling *s, float *probs);
/* One draw from a distribution (sums to ~1; renormalised on the fly). */
int32_t ds_sample_probs(const float *probs, int V, ds_rng *rng);

#endif
