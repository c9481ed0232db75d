/* The ring matmul's per-block timeline (ring_trace.cu): DS_CUDA_RING_TRACE. */
#ifndef DS_CUDA_RING_TRACE_H
#define DS_CUDA_RING_TRACE_H

#include "backend/cuda/cuda_internal.h"

/* Timestamps per block and launch: entry, wait returned, first stage, end,
 * producer's last request, tiles done, each of the first RING_TRACE_TILES
 * tiles' last stage, then the split-once prologue's steps as thread 0 saw
 * them: the norm weight landed (RT_NW), its x loaded and split (RT_XDONE),
 * every consumer's too (RT_SYNCED); then the producer's: the ring's last slot
 * requested the first time (RT_ISSUED) and, where x is split once per
 * block, landed (RT_LANDED: the producer waits for it when tracing, before
 * requesting more); then thread 0's: ns spent waiting for its first
 * RING_TRACE_STAGES stages to land (RT_WAITED) and when it had each
 * (RT_SEEN0 ..: whether consuming a landed ring is fast); 0 where a kernel
 * has no such step. */
#define RING_TRACE_TILES 10
#define RING_TRACE_STAGES 10
#define RING_TRACE_FIELDS (12 + RING_TRACE_TILES + RING_TRACE_STAGES)
enum { RT_ENTRY, RT_WAIT, RT_FIRST, RT_END, RT_PRODUCED, RT_TILES, RT_TILE0,
       RT_NW = RT_TILE0 + RING_TRACE_TILES, RT_XDONE, RT_SYNCED, RT_ISSUED, RT_LANDED, RT_WAITED, RT_SEEN0 };

/* Kernels between the ring launches are traced too, in the same slots, with
 * K set to their kind (the ring's K is the matmul's, > 0). Attention: entry,
 * wait returned, prologue done (RT_FIRST: its keys' loop starts), end, keys
 * done (RT_PRODUCED: it lets the next kernel in), 0 tiles; a fused launch
 * (q/k norm + RoPE inside) also its prologue's steps: positions known
 * (RT_TILE0), rows in (RT_NW), warp 0's heads normed (RT_XDONE), all
 * synced (RT_SYNCED). The q/k norm +
 * RoPE (+ K/V store) kernel: entry, wait returned, end. */
enum { RT_KIND_ATTENTION = -1, RT_KIND_NORM_ROPE = -2, RT_KIND_HEAD_WALK = -3, RT_KIND_HEAD_BOUNDS = -4 };
/* The greedy draft's head (markov.cu, head_bound.cu; M: the rows). The
 * bounds kernel: entry, wait returned, end. The walk: entry, wait returned,
 * prologue done (RT_FIRST: the best lower bounds merged, x in), end, and per
 * step s (< 8) at RT_TILE0 + 3 s: the candidates listed (e gathered, proj e,
 * the block's bounds), the block's best posted (the candidates' exact head
 * and w2 rows, the scan), the step's token known (the grid barrier, the
 * merge of every block's best). */
#define RT_WALK_STEP(s, i) (RT_TILE0 + 3 * (s) + (i))

/* Starts tracing into a device buffer; the file is written at close. */
ds_error *ds_cu_ring_trace_open(ds_cuda_backend *cb, const char *path);
/* The next launch's slot, grid blocks of RING_TRACE_FIELDS (NULL: not
 * tracing, or the trace is full). K: the matmul's, or an RT_KIND_. */
unsigned long long *ds_cu_ring_trace_slot(ds_cuda_backend *cb, int M, int K, int tiles, int grid);
/* Where block (bx, by) of a traced launch writes (NULL: not traced). */
__device__ __forceinline__ unsigned long long *ds_cu_trace_block(unsigned long long *slot) {
    return slot ? slot + (size_t)RING_TRACE_FIELDS * (blockIdx.y * gridDim.x + blockIdx.x) : NULL;
}
/* Writes the file and frees the buffer (waits for the device). */
void ds_cu_ring_trace_close(ds_cuda_backend *cb);

__device__ __forceinline__ unsigned long long ds_cu_gtimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#endif
