/* The CPU backend's memory bandwidth probe (ds_backend_ops.bandwidth): the
 * backend's own thread pool reads a buffer much larger than the caches, as
 * a decode step reads its weights. A read, not a copy: decoding streams
 * weights in and writes almost nothing, and a copy's bytes on a CPU depend
 * on whether its stores fetch the line first (write-allocate) or bypass the
 * cache, which would make the figure a property of memcpy, not of memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/clock.h"

/* Each pool task reads one chunk: large enough that claiming it costs
 * nothing, small enough that two threads share the work evenly. */
#define CHUNK_BYTES ((size_t)4 << 20)
/* A buffer the probe will not shrink below: still well past an L2, and past
 * most L3s; the caller asks for more (dspark bench: 1 GiB). */
#define MIN_BYTES ((size_t)64 << 20)

typedef struct {
    unsigned char *buf;
    size_t bytes;
    uint64_t sink[DS_CPU_MAX_THREADS]; /* per-thread sums, stored where the pool's caller sees them: the reads stay */
} probe;

/* 32-byte lanes (the project's vector types, as cpu_matmul.c's): the loop is then bound by the loads. */
typedef uint64_t v4u __attribute__((vector_size(32)));

/* Writes every page (by the threads that will read it): untouched pages all
 * map the one zero page, which a read would find in the cache. */
static void fill_chunks(void *ctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    probe *p = ctx;
    for (int64_t c = begin; c < end; c++) memset(p->buf + (size_t)c * CHUNK_BYTES, (int)(c & 0x7f) + 1, CHUNK_BYTES);
}

/* Four independent vector sums, 128 bytes an iteration: bound by the loads. */
static void read_chunks(void *ctx, int64_t begin, int64_t end, int tid) {
    probe *p = ctx;
    v4u a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t c = begin; c < end; c++) {
        const v4u *w = (const v4u *)(p->buf + (size_t)c * CHUNK_BYTES);
        for (size_t i = 0; i < CHUNK_BYTES / sizeof *w; i += 4) {
            a0 += w[i];
            a1 += w[i + 1];
            a2 += w[i + 2];
            a3 += w[i + 3];
        }
    }
    const v4u a = a0 ^ a1 ^ a2 ^ a3;
    p->sink[tid] += a[0] ^ a[1] ^ a[2] ^ a[3];
}

ds_error *ds_cpu_bandwidth(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out) {
    memset(out, 0, sizeof *out);
    if (reps < 1) return ds_errorf("cpu backend: bandwidth probe: %d repetitions (at least 1)", reps);
    if (bytes < MIN_BYTES) bytes = MIN_BYTES;
    bytes -= bytes % CHUNK_BYTES; /* whole chunks (MIN_BYTES is 16 of them) */
    probe p = {0};
    const size_t asked = bytes;
    for (void *mem = NULL; !p.buf && bytes >= MIN_BYTES; bytes = bytes / 2 - bytes / 2 % CHUNK_BYTES)
        if (!posix_memalign(&mem, 64, bytes)) {
            p.buf = mem;
            break;
        }
    if (!p.buf)
        return ds_errorf("cpu backend: bandwidth probe: cannot allocate a buffer of %zu bytes (nor of %zu)", asked,
                         (size_t)MIN_BYTES);
    p.bytes = bytes;
    ds_pool *pool = ds_cpu_pool(be);
    const int64_t chunks = (int64_t)(bytes / CHUNK_BYTES);
    ds_pool_run(pool, chunks, 1, fill_chunks, &p);
    double best = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (threads awake, TLB and page tables settled) */
        const double t0 = ds_now_s();
        ds_pool_run(pool, chunks, 1, read_chunks, &p);
        const double s = ds_now_s() - t0;
        if (r >= 0 && s > 0 && (double)bytes / s > best) best = (double)bytes / s;
    }
    free(p.buf);
    out->bytes_per_s = best;
    out->buffer_bytes = (double)bytes;
    out->method = "read by the backend's thread pool, bytes read counted";
    return NULL;
}
