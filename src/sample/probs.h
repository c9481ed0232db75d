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
/* The same draw for a given uniform u in [0, 1) (ds_sample_probs uses one
 * ds_rng_uniform): the first id, in id order and skipping zeros, whose
 * cumulative probability (a double sum) exceeds u times the row's total;
 * the last nonzero id when rounding leaves u * total at the very top. The
 * backends' sampling ops take uniforms drawn on the host and follow this. */
int32_t ds_sample_probs_u(const float *probs, int V, double u);

#endif
