/* Verification of a proposal against the target's logits (SPEC §5): the
 * math of acceptance, below the backend, whose verify op follows it. */
#ifndef DS_VERIFY_H
#define DS_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"
#include "sample/sampling.h"

/* target_logits: [n+1, V] for the verify rows [anchor, x0..x_{n-1}];
 * draft: tokens x[n]; draft_probs: [n, V] processed draft distributions
 * (unused when greedy). Returns the accepted count; *next = the bonus /
 * correction token. probs_scratch: 2*V floats. */
typedef int (*ds_verify_fn)(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
                            const ds_sampling *s, ds_rng *rng, float *probs_scratch, int32_t *next);
int ds_verify(const float *target_logits, int V, const int32_t *draft, int n, const float *draft_probs,
              const ds_sampling *s, ds_rng *rng, float *probs_scratch, int32_t *next);

/* The most drafts one verification takes (the drafter's DS_MAX_GAMMA fits). */
#define DS_VERIFY_MAX_DRAFT 64
/* ds_verify's sampling rule (T > 0) with its n + 1 uniforms given, in the
 * order ds_verify draws them: u[0..n) for the ratios, u[n] for the residual
 * or bonus draw. Rows are t_stride / d_stride floats apart. ds_verify and
 * the backends' verify_sample op (the CPU's calls this) share it. */
int ds_verify_uniforms(const float *target_logits, size_t t_stride, int V, const int32_t *draft, int n,
                       const float *draft_probs, size_t d_stride, const ds_sampling *s, const double *u,
                       float *probs_scratch, int32_t *next);

#endif
