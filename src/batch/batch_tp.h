/* The batched engine under tensor parallelism (issue 43): one ds_batch a
 * rank, over that rank's shard of the target and its copy of the drafter,
 * stepped together, SPMD: every rank runs the same step over the same rows,
 * and the shards meet in the target's collectives.
 *
 * Why this design: a batch's decisions (admission, preemption, the rows of
 * a step, Algorithm 1's lengths) are functions of state every rank holds
 * alike: the requests, their tokens (from all-reduced logits), the pages,
 * the drafter's confidences (from the same taps). Only clocks differ between
 * ranks, and the batch takes those from rank 0 (batch.c: the draft pass's
 * cost; ds_batch_profile: the step-cost curve, which every rank's opts.sps
 * points to). So there is no plan to broadcast: each rank's engine computes
 * the same plan. What arrives from outside between steps (submit, cancel,
 * release) is host work only, applied to every rank's engine in the
 * caller's thread in the same order. A step runs one thread a rank (rank 0
 * in the caller's, the others kept for the engine's life); afterwards the
 * ranks' hashes of every committed token
 * are compared, so a rank that went its own way is an error, not a wrong
 * answer.
 *
 * One rank (world 1) is the plain engine, stepped in the caller's thread.
 * Queries (results, states, stats) read rank 0's engine: ds_batch_tp_lead. */
#ifndef DS_BATCH_TP_H
#define DS_BATCH_TP_H

#include "batch/batch.h"

typedef struct ds_batch_tp ds_batch_tp;

/* Engines over t[r] and d[r] (d NULL, or d[r] NULL: autoregressive) for r in 0..world-1, each with opts
 * (ds_batch_new's rules); t[r]'s comm is rank r of one group (world > 1). */
ds_error *ds_batch_tp_new(int world, ds_target *const *t, ds_drafter *const *d, const ds_batch_opts *opts,
                          ds_batch_tp **out);
void ds_batch_tp_free(ds_batch_tp *g);
/* Rank 0's engine: for ds_batch_result, ds_batch_state, ds_batch_get_stats (not for stepping). */
ds_batch *ds_batch_tp_lead(const ds_batch_tp *g);

/* ds_batch_submit / cancel / release on every rank's engine (they must agree on the id). */
ds_error *ds_batch_tp_submit(ds_batch_tp *g, const ds_batch_request *req, int64_t *id);
ds_error *ds_batch_tp_cancel(ds_batch_tp *g, int64_t id);
ds_error *ds_batch_tp_release(ds_batch_tp *g, int64_t id);
/* One step on every rank at once; an error names a rank whose tokens differ from rank 0's. */
ds_error *ds_batch_tp_step(ds_batch_tp *g, int *active);
ds_error *ds_batch_tp_run(ds_batch_tp *g);
/* ds_batch_profile on every rank at once (before any submit); *out is rank 0's curve. */
ds_error *ds_batch_tp_profile(ds_batch_tp *g, const ds_step_cost_key *key, const char *cache_path, FILE *log,
                              ds_step_cost **out);

#endif
