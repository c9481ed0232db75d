/* The target's verify step cost as a function of the verify tokens in the
 * step (SPEC §6's SPS curve, steps per second = 1 / seconds): what
 * Algorithm 1 (speculate/schedule.h) weighs every admitted draft against.
 *
 * Profiled on the running machine: per bucket of verify tokens, `warmup`
 * untimed steps, then the median of `reps` timed ones (a median ignores the
 * odd step a clock ramp or another process slowed). The curve is then forced
 * monotone, step time non-decreasing in tokens: more tokens never cost less,
 * and a bucket that measured faster than a smaller one (noise, or a kernel
 * shape that happens to fit) would otherwise lure the scheduler into admitting
 * drafts for a saving that is not there. The raw medians are kept and cached;
 * forcing is redone on every load.
 *
 * Between buckets: linear in step time (LINEAR) or, where the engine pads a
 * step up to its bucket (CUDA graphs recorded per bucket), the next bucket's
 * time (PADDED). Below the first bucket: the first bucket's time. Past the
 * last: the line through the last two buckets (slope at least 0), since a
 * step past the profiled range is compute-bound and grows linearly; with one
 * bucket, its time.
 *
 * The cache is a JSON file keyed by what makes a profile valid: the device,
 * the model (identity and shape) and the build, as the caller spells them,
 * plus the bucket list. A cache whose key differs (stale) or that does not
 * parse or check (malformed) is named in a message and profiled again: never
 * trusted silently. The same type serves a draft-cost curve keyed by request
 * count (vLLM's refinement, schedule.h). */
#ifndef DS_STEP_COST_H
#define DS_STEP_COST_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"

#define DS_STEP_COST_MAX_BUCKETS 256

typedef enum { DS_STEP_COST_LINEAR, DS_STEP_COST_PADDED } ds_step_cost_interp;

typedef struct ds_step_cost ds_step_cost;

/* Times one step of `tokens` verify tokens into *seconds (> 0). */
typedef ds_error *(*ds_time_step_fn)(void *ctx, int tokens, double *seconds);

typedef struct {
    const int *buckets; /* strictly increasing, >= 1; NULL: ds_step_cost_default_buckets(max_tokens) */
    int n_buckets;
    int max_tokens;     /* the largest step the engine runs (default buckets only) */
    int warmup;         /* untimed steps per bucket before the timed ones (>= 0) */
    int reps;           /* timed steps per bucket, the median kept (>= 1) */
    ds_step_cost_interp interp;
} ds_step_cost_opts;

/* What a cached profile is valid for; each a non-empty string. */
typedef struct {
    const char *device; /* e.g. "NVIDIA H100 80GB HBM3" or "cpu x86-64 16 threads" */
    const char *model;  /* identity and shape, e.g. "qwen3-8b bf16 L36 H4096 V151936" */
    const char *build;  /* the engine's build, e.g. git hash + options */
} ds_step_cost_key;

/* Every count 1..8 (the narrow verify kernels change shape row by row), then
 * every 8 to 64, every 16 to 256, every 64 to 1024 and every 256 beyond, then
 * max_tokens itself: fine enough where a step turns from bandwidth-bound to
 * compute-bound that the interpolation there is close (bench/bench_schedule.c
 * --coarse compares power-of-two buckets).
 * Writes at most cap values; returns how many. */
int ds_step_cost_default_buckets(int max_tokens, int *out, int cap);

/* A curve from given measurements (seconds[i] for tokens[i]); forced monotone. */
ds_error *ds_step_cost_new(const int *tokens, const double *seconds, int n, ds_step_cost_interp interp,
                           ds_step_cost **out);
void ds_step_cost_free(ds_step_cost *c);

/* Profiles every bucket through time_step (see the top comment). */
ds_error *ds_step_cost_profile(const ds_step_cost_opts *o, ds_time_step_fn time_step, void *ctx,
                               ds_step_cost **out);

/* Seconds of one step of `tokens` (>= 0) tokens; steps per second is its inverse. */
double ds_step_cost_seconds(const ds_step_cost *c, int tokens);
double ds_step_cost_sps(const ds_step_cost *c, int tokens);

int ds_step_cost_n(const ds_step_cost *c);
/* Bucket i: its tokens, the forced-monotone seconds and the measured median. */
void ds_step_cost_bucket(const ds_step_cost *c, int i, int *tokens, double *seconds, double *measured);

ds_error *ds_step_cost_save(const ds_step_cost *c, const ds_step_cost_key *key, const char *path);
/* Loads a cache written for `key` and o's buckets (interpolated as o says);
 * an error says why it is stale or malformed, naming the file and field. */
ds_error *ds_step_cost_load(const char *path, const ds_step_cost_key *key, const ds_step_cost_opts *o,
                            ds_step_cost **out);
/* The cached curve when the cache at path is valid; otherwise a line on log
 * saying why (absent, stale, malformed), a profile, and a new cache (a cache
 * that cannot be written is reported on log, not fatal). *profiled (may be
 * NULL) says which happened. */
ds_error *ds_step_cost_cached(const char *path, const ds_step_cost_key *key, const ds_step_cost_opts *o,
                              ds_time_step_fn time_step, void *ctx, FILE *log, ds_step_cost **out,
                              bool *profiled);

#endif
