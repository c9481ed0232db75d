/* How many drafted positions each request of a batch verifies this step:
 * SPEC §6's Algorithm 1 (hardware-aware prefix scheduling), and a fixed-γ
 * policy to compare it with.
 *
 * Algorithm 1: survival a_{r,j} = prod_{i<=j} c_{r,i} (fp64) for request r's
 * drafted position j; every (r, j) with a > 0 sorted by a descending, then j
 * ascending, then r ascending (deterministic). Start from B = R verify tokens
 * (each request's anchor), tau* = R, Theta_best = R * SPS(R); admit candidates
 * in order, each adding 1 to B and a to tau*, while Theta = tau* * SPS(B) is
 * strictly greater than Theta_best, and STOP at the first one that is not.
 * The early stop is part of the algorithm (it is what the paper's losslessness
 * argument covers), not a search for the global maximum: a later candidate
 * that would have raised Theta again is never reached. Survival never rises
 * along a request and ties go to the smaller j, so what a request is admitted
 * is always a prefix of its draft. The order is produced by merging the
 * requests' lists rather than sorting them all (the same sequence): O(N) for
 * the survivals of the N drafts, then O(log R) per candidate looked at.
 *
 * From vLLM's confidence-scheduled verification (PR #47808 and its blog)
 * these are offered, each off by default; bench/bench_schedule.c measures
 * them (bench/journal/schedule-sim.md):
 *  - draft cost by request count: Theta = tau* / (t_draft(R) + t_verify(B)),
 *    the whole round's time, instead of tau* * SPS(B) (opts.draft_seconds;
 *    0 is SPEC §6 exactly). The early stop is kept. It never measured worse
 *    and gains most where verification is compute-bound: callers should pass
 *    it (a drafter curve by request count, a ds_step_cost too).
 *  - a budget from one-step-old confidences with the current per-request
 *    allocation (ds_schedule_confidence_stale): Algorithm 1 on the previous
 *    step's confidences fixes how many drafts are verified, so the host can
 *    size the step before this step's confidences reach it; the current
 *    survivals pick which drafts, by the same order. It never measured
 *    better, and it saves vLLM a device sync that this engine's round, which
 *    copies its confidences back anyway, does not make: off.
 * Not taken: vLLM's global argmax over budgets (SPEC §6 forbids replacing the
 * early stop) and its EMA smoothing of confidences (an estimator change that
 * calibration, STS, is responsible for here). Its step-function cost below
 * the CUDA-graph capture limit is step_cost.h's PADDED interpolation. */
#ifndef DS_SCHEDULE_H
#define DS_SCHEDULE_H

#include <stdbool.h>

#include "base/error.h"
#include "speculate/step_cost.h"

/* One step's drafts: R requests, each with up to gamma drafted positions.
 * Exactly one of conf / survival is given, row-major R x gamma (row stride
 * gamma); only the first n_drafts[r] entries of row r are read. */
typedef struct {
    int n_requests;        /* R (0 is an empty step) */
    int gamma;             /* positions per request, the row stride (0: nothing drafted) */
    const int *n_drafts;   /* drafts request r proposed, 0..gamma; NULL: gamma for every request */
    const float *conf;     /* calibrated confidences c_{r,j} in [0, 1] */
    const double *survival; /* survivals a_{r,j} in [0, 1], non-increasing in j */
} ds_schedule_input;

typedef struct {
    double draft_seconds; /* vLLM's refinement: this step's draft cost at this request count
                             (>= 0); 0: Theta = tau* * SPS(B) exactly as SPEC §6 */
} ds_schedule_opts;

typedef struct {
    int verify_tokens; /* B = R + the admitted drafts */
    int drafts;        /* admitted drafts, B - R */
    double tau;        /* tau*: the tokens the step is expected to emit */
    double theta;      /* predicted tokens per second, tau* / (draft_seconds + 1 / SPS(B)) */
} ds_schedule_result;

/* Algorithm 1. len (R entries, the caller's) gets each request's admitted
 * prefix length; opts may be NULL (defaults). */
ds_error *ds_schedule_confidence(const ds_schedule_input *in, const ds_step_cost *sps,
                                 const ds_schedule_opts *opts, int *len, ds_schedule_result *out);

/* Every request verifies min(gamma, n_drafts[r]) drafts. tau and theta are
 * predicted where the input has values and sps is given, NAN otherwise (a
 * drafter without a confidence head). */
ds_error *ds_schedule_fixed(const ds_schedule_input *in, int gamma, const ds_step_cost *sps,
                            const ds_schedule_opts *opts, int *len, ds_schedule_result *out);

/* Admits the first `drafts` candidates in Algorithm 1's order (fewer where
 * fewer have a > 0), without the throughput test: a budget decided elsewhere,
 * allocated by survival. */
ds_error *ds_schedule_allocate(const ds_schedule_input *in, int drafts, int *len, ds_schedule_result *out);

/* vLLM's split: the draft budget from Algorithm 1 on `stale` (the previous
 * step's confidences, row r for the same request as current's row r; a
 * request new this step has no stale row: give it all ones, as vLLM does),
 * allocated over `current`'s survivals. tau and theta are predicted from
 * current. */
ds_error *ds_schedule_confidence_stale(const ds_schedule_input *stale, const ds_schedule_input *current,
                                       const ds_step_cost *sps, const ds_schedule_opts *opts, int *len,
                                       ds_schedule_result *out);

/* Whether drafting is predicted to pay this step: Algorithm 1 on `in` (with
 * opts' draft cost, which belongs here) beats a plain AR step's R * SPS(R).
 * Before a step drafts, its confidences do not exist yet, so `in` is the
 * previous step's (as for the stale budget); a caller that stops drafting
 * gets no new ones and must still draft now and then to see whether it pays
 * again (bench/bench_schedule.c drafts every 16th step). At high concurrency
 * the draft pass alone can cost more than Algorithm 1 wins back, and this is
 * the only way to stay at or above AR there. predicted (may be NULL) gets
 * Algorithm 1's result. */
ds_error *ds_schedule_draft_pays(const ds_schedule_input *in, const ds_step_cost *sps, const ds_schedule_opts *opts,
                                 bool *pays, ds_schedule_result *predicted);

/* tau and theta of a given allocation (len[r] drafts for request r). */
ds_error *ds_schedule_predict(const ds_schedule_input *in, const int *len, const ds_step_cost *sps,
                              const ds_schedule_opts *opts, ds_schedule_result *out);

#endif
