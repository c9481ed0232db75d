/* A small fork-join pool for the CPU backend. The calling thread works too
 * and chunks are claimed dynamically, so a worker that the OS has not
 * scheduled yet never holds up a call: the caller simply does its share.
 * (OpenMP's end-of-region barrier waits for every thread and collapses when
 * the machine is busy; this pool does not.) Idle workers spin briefly, then
 * sleep. */
#ifndef DS_THREADPOOL_H
#define DS_THREADPOOL_H

#include <stdint.h>

typedef struct ds_pool ds_pool;
/* Runs fn(ctx, begin, end) over [0, n) in chunks of `grain`; tid in [0, n_threads). */
typedef void (*ds_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

ds_pool *ds_pool_new(int n_threads);
void ds_pool_free(ds_pool *p);
int ds_pool_threads(const ds_pool *p);
void ds_pool_run(ds_pool *p, int64_t n, int64_t grain, ds_pool_fn fn, void *ctx);

#endif
