/* The CPU backend's heavier kernels (one family per file). */
#ifndef DS_CPU_KERNELS_H
#define DS_CPU_KERNELS_H

#include "backend/backend.h"
#include "base/threadpool.h"

/* The CPU backend: the generic part plus its thread pool. */
#define DS_CPU_MAX_THREADS 64

/* Per-thread scratch slots, grown on demand by the thread that owns the tid. */
enum { DS_SCRATCH_WEIGHTS, DS_SCRATCH_SCORES, DS_SCRATCH_NORM, DS_SCRATCH_SLOTS };

typedef struct {
    ds_backend base;
    ds_pool *pool;
    float *scratch[DS_CPU_MAX_THREADS][DS_SCRATCH_SLOTS];
    size_t scratch_cap[DS_CPU_MAX_THREADS][DS_SCRATCH_SLOTS];
} ds_cpu_backend;

static inline ds_pool *ds_cpu_pool(ds_backend *be) { return ((ds_cpu_backend *)be)->pool; }
/* Scratch of n floats for thread tid (NULL when out of memory). */
float *ds_cpu_scratch(ds_backend *be, int tid, int slot, size_t n);

void ds_cpu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);
void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p);
void ds_cpu_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps);

#endif
