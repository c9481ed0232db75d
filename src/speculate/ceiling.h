/* The speculation ceiling at a concurrency: the most any choice of which
 * drafts to verify could gain over plain decoding, given the target's step
 * cost (step_cost.h), the drafts' acceptance and the draft pass's cost.
 * What Algorithm 1 measures against: where the ceiling itself is below a
 * goal, no scheduler reaches the goal on that machine and shape.
 *
 * Acceptance comes from a simulated profile (sim_acceptance.h), drawn as the
 * batched engine draws it: each of `draws` steps gives every request gamma
 * confidences, whose running products are the drafts' survivals (the
 * probability that a draft and all before it are accepted). Taking drafts by
 * survival, highest first (a prefix of each request's, as Algorithm 1 does),
 * the step's best count B over every B (no early stop: a bound, not a
 * policy) gives tokens R + the admitted survivals in one step of
 * T(R + B) seconds (+ the draft pass), against R tokens in T(R) for plain
 * decoding. The ceiling is the mean over the draws of each step's best
 * ratio; B = 0 (not drafting: ratio 1) is always allowed, so it is at
 * least 1. */
#ifndef DS_CEILING_H
#define DS_CEILING_H

#include <stdint.h>

#include "base/error.h"
#include "speculate/sim_acceptance.h"
#include "speculate/step_cost.h"

typedef struct {
    double free_x_ar;          /* tokens/s over AR at the best B, with a drafter that costs nothing */
    double free_verify_tokens; /* mean R + B at that best */
    double cost_x_ar;          /* the same with draft_seconds added to every drafting step */
    double cost_verify_tokens; /* mean R + B there (R: not drafting) */
} ds_spec_ceiling;

/* requests >= 1, gamma 1..the profile's positions, draft_seconds >= 0,
 * draws >= 1; seed fixes the confidences drawn. */
ds_error *ds_spec_ceiling_estimate(const ds_step_cost *sps, const ds_sim_profile *sim, int requests, int gamma,
                                   double draft_seconds, int draws, uint64_t seed, ds_spec_ceiling *out);

#endif
