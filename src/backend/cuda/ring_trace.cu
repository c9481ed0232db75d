/* A per-block timeline of the ring matmul (DS_CUDA_RING_TRACE=file): each
 * launch gets a slot, and every block of it writes GPU timestamps
 * (%globaltimer, ns) into the slot — entry, when the consumers' wait for the
 * previous kernel returns, the first stage, the producer's last request,
 * each tile's last stage (the first RING_TRACE_TILES), the end — which are
 * written to the file when the backend is destroyed, one line per block:
 *   slot M K tiles block t_entry t_wait t_first t_end t_produced tiles_done t_tile0 ...
 * The attention, q/k norm + RoPE and draft head (bounds, walk) kernels are
 * traced too (K < 0: ring_trace.h), so the attention window of a layer and
 * the walk's steps can be read.
 * bench/ring_timeline.py turns the last decode step into a table.
 *
 * Why: the kernels of a decode step overlap (programmatic dependent launch)
 * and their blocks start and finish at different times, so per-op times
 * (DS_CUDA_PROFILE) cannot show where HBM idles; this found the norm
 * weight queued behind the weight stream. Off by default; when on, a
 * decode step runs ~13 % slower, so the times come out a little stretched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/ring_trace.h"

#define TRACE_SLOTS 16384      /* launches traced (a bench through verify of 8 rows: ~9000); later ones are not */
#define TRACE_BLOCKS (1 << 21) /* block records in all (256 MB): each launch takes its grid's */

struct ds_cu_ring_trace {
    char *path;
    unsigned long long *dev; /* [TRACE_BLOCKS][RING_TRACE_FIELDS] */
    int n;
    size_t used;               /* block records handed out */
    int meta[TRACE_SLOTS][4];  /* M, K, tiles, grid */
    size_t first[TRACE_SLOTS]; /* the slot's first block record */
};

ds_error *ds_cu_ring_trace_open(ds_cuda_backend *cb, const char *path) {
    ds_cu_ring_trace *t = (ds_cu_ring_trace *)calloc(1, sizeof *t);
    if (!t) return ds_errorf("out of memory (ring trace)");
    t->path = (char *)malloc(strlen(path) + 1);
    const size_t bytes = (size_t)TRACE_BLOCKS * RING_TRACE_FIELDS * sizeof *t->dev;
    cudaError_t e = cudaMalloc((void **)&t->dev, bytes);
    if (e == cudaSuccess) e = cudaMemset(t->dev, 0, bytes);
    if (!t->path || e != cudaSuccess) {
        if (t->dev) cudaFree(t->dev);
        free(t->path);
        free(t);
        return ds_errorf("DS_CUDA_RING_TRACE: cannot allocate the trace (%zu bytes of device memory): %s", bytes,
                         e != cudaSuccess ? cudaGetErrorString(e) : "out of host memory");
    }
    strcpy(t->path, path);
    cb->ring_trace = t;
    return NULL;
}

unsigned long long *ds_cu_ring_trace_slot(ds_cuda_backend *cb, int M, int K, int tiles, int grid) {
    ds_cu_ring_trace *t = cb->ring_trace;
    if (!t || t->n == TRACE_SLOTS || grid <= 0 || t->used + (size_t)grid > TRACE_BLOCKS) return NULL;
    const int s = t->n++;
    t->meta[s][0] = M, t->meta[s][1] = K, t->meta[s][2] = tiles, t->meta[s][3] = grid;
    t->first[s] = t->used;
    t->used += (size_t)grid;
    return t->dev + t->first[s] * RING_TRACE_FIELDS;
}

void ds_cu_ring_trace_close(ds_cuda_backend *cb) {
    ds_cu_ring_trace *t = cb->ring_trace;
    if (!t) return;
    cb->ring_trace = NULL;
    const size_t n = t->used * RING_TRACE_FIELDS;
    unsigned long long *h = (unsigned long long *)malloc(n ? n * sizeof *h : 1);
    FILE *f = h ? fopen(t->path, "w") : NULL;
    cudaError_t e = h ? cudaMemcpy(h, t->dev, n * sizeof *h, cudaMemcpyDeviceToHost) : cudaSuccess;
    if (!f || e != cudaSuccess) {
        fprintf(stderr, "dspark: DS_CUDA_RING_TRACE: cannot write %s (%s)\n", t->path,
                e != cudaSuccess ? cudaGetErrorString(e) : "cannot open the file");
    } else {
        for (int s = 0; s < t->n; s++)
            for (int b = 0; b < t->meta[s][3]; b++) {
                const unsigned long long *v = h + (t->first[s] + (size_t)b) * RING_TRACE_FIELDS;
                fprintf(f, "%d %d %d %d %d", s, t->meta[s][0], t->meta[s][1], t->meta[s][2], b);
                for (int i = 0; i < RING_TRACE_FIELDS; i++) fprintf(f, " %llu", v[i]);
                fputc('\n', f);
            }
    }
    if (f) fclose(f);
    free(h);
    cudaFree(t->dev);
    free(t->path);
    free(t);
}
