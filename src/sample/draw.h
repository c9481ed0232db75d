/* One draw from a processed distribution. */
#ifndef DS_DRAW_H
#define DS_DRAW_H

#include <stdint.h>

#include "base/rng.h"

/* One draw from a distribution (sums to ~1; renormalised on the fly). */
int32_t ds_sample_probs(const float *probs, int V, ds_rng *rng);
/* The same draw for a given uniform u in [0, 1) (ds_sample_probs uses one
 * ds_rng_uniform): the first id, in id order and skipping zeros, whose
 * cumulative probability (a double sum) exceeds u times the row's total;
 * the last nonzero id when rounding leaves u * total at the very top. The
 * backends' sampling ops take uniforms drawn on the host and follow this. */
int32_t ds_sample_probs_u(const float *probs, int V, double u);

#endif
