/* The ring matmul's per-block timeline (ring_trace.cu): DS_CUDA_RING_TRACE. */
#ifndef DS_CUDA_RING_TRACE_H
#define DS_CUDA_RING_TRACE_H

#include "backend/cuda/cuda_internal.h"

/* Timestamps per block and launch: entry, wait returned, first stage, end,
 * producer's last request, tiles done, then each of the first
 * RING_TRACE_TILES tiles' last stage. */
#define RING_TRACE_TILES 10
#define RING_TRACE_FIELDS (6 + RING_TRACE_TILES)
enum { RT_ENTRY, RT_WAIT, RT_FIRST, RT_END, RT_PRODUCED, RT_TILES, RT_TILE0 };

/* Starts tracing into a device buffer; the file is written at close. */
ds_error *ds_cu_ring_trace_open(ds_cuda_backend *cb, const char *path);
/* The next launch's slot (NULL: not tracing, or the slots are used up). */
unsigned long long *ds_cu_ring_trace_slot(ds_cuda_backend *cb, int M, int K, int tiles, int grid);
/* Writes the file and frees the buffer (waits for the device). */
void ds_cu_ring_trace_close(ds_cuda_backend *cb);

__device__ __forceinline__ unsigned long long ds_cu_gtimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#endif
