/* Verification of a proposal against the target's logits (SPEC §5). */
#ifndef DS_VERIFY_H
#define DS_VERIFY_H

#include "base/rng.h"
#include "spec/sampler.h"

/* target_logits: [n+1, V] for the verify rows [anchor, x0..x_{n-1}];
 * draft: tokens x[n]; draft_probs: [n, V] processed draft distributions
 * (unused when greedy). Returns the accepted count; *next = the bonus /
 * correction token. probs_scratch: 2*V floats. */
typedef int (*ds_verify_fn)(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
                            const ds_sampling *s, ds_rng *rng, float *probs_scratch, int32_t *next);
int ds_verify(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
              const ds_sampling *s, ds_rng *rng, float *probs_scratch, int32_t *next);

#endif
