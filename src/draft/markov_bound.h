/* An exact bound of DSpark's Markov bias, so a device walk can skip the
 * vocabulary rows that provably cannot win a greedy step.
 *
 * The bias of row n after token m is w2[n] . e with e = w1[m]. Split w2
 * along its k principal directions (the rows of proj, orthonormal):
 * w2[n] = coef[n] proj + rest[n]. Then, for every e,
 *     |w2[n] . e - coef[n] . (proj e)| <= |rest[n]| |e|,
 * and trained heads keep most of their energy in a few directions, so the
 * radius is small next to the spread of the logits: on the pico drafter's
 * walks, k = 8 leaves ~200 of 8192 rows in contention per step where the
 * plain |w2[n]| max|w1| bound leaves ~5600 (bench/RESULTS.md). radius[n]
 * also covers the fp32 rounding of the device's three dot products (the
 * bias itself, proj e, coef[n] . (proj e)), so the test "upper bound of
 * row n < lower bound of some row" is exact whatever the GPU computes. */
#ifndef DS_MARKOV_BOUND_H
#define DS_MARKOV_BOUND_H

#include <stdint.h>

#include "backend/spec_ops.h" /* DS_MARKOV_BOUND_K: 8 directions, measured best per byte on pico */
#include "base/dtype.h"
#include "base/error.h"


typedef struct {
    int k, r;
    int64_t vocab;
    float *proj;   /* [k, r] orthonormal directions (rows) */
    float *coef;   /* [vocab, k] coef[n] = proj w2[n] (rounded; any value would keep the bound exact) */
    float *radius; /* [vocab] >= |rest[n]| + the rounding allowance, rounded up; inf for non-finite rows */
} ds_markov_bound_host;

/* Builds the bound of w2 ([vocab, r] rows of dtype dt, row stride r) with
 * min(k, r, DS_MARKOV_BOUND_K) directions. The directions come from a
 * subsample of rows (they only need to be good, not exact); coef and radius
 * from every row, in double. */
ds_error *ds_markov_bound_build(const void *w2, ds_dtype dt, int64_t vocab, int r, int k, ds_markov_bound_host *out);
void ds_markov_bound_free(ds_markov_bound_host *b);

/* The rounding allowance in units of 2^-24 (one fp32 ulp, relative) that
 * radius includes per unit of |w2[n]| + sum_j |coef[n][j]| |proj[j]|:
 * 2 (r + k), double the textbook gamma of an (r + k)-term dot product. */
static inline double ds_markov_bound_slack(int r, int k) { return 2.0 * (r + k) * 0x1p-24; }

#endif
