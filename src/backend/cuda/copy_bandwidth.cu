/* The CUDA backend's memory bandwidth probe (ds_backend_ops.bandwidth): a
 * device-to-device copy between two large buffers on the backend's stream,
 * timed with events, best of the repetitions, counting the bytes read and
 * the bytes written (2 x the buffer). A decode step streams its weights from
 * the same memory, so this is the floor dspark bench measures a step
 * against: what this card moves, not its datasheet (an H100's copy reached
 * 3.03 TB/s where 3.35 is printed, and 4.3 was assumed before). */
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"

/* The probe halves its buffers until they fit, down to this size (still far
 * past the L2 of any current GPU: 50 MB on an H100). */
#define MIN_BYTES ((size_t)256 << 20)

ds_error *ds_cu_bandwidth(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out) {
    ds_cuda_backend *cb = ds_cu(be);
    memset(out, 0, sizeof *out);
    if (reps < 1) return ds_errorf("cuda bandwidth probe: %d repetitions (at least 1)", reps);
    if (cb->reg.active) return ds_errorf("cuda bandwidth probe: called inside a step region");
    /* Queued ops first, so that only the copies are timed (and their failure is not taken for the probe's). */
    cudaError_t ce = cudaStreamSynchronize(cb->stream);
    if (ce != cudaSuccess)
        return ds_errorf("cuda bandwidth probe: waiting for queued work: %s", cudaGetErrorString(ce));
    if (bytes < MIN_BYTES) bytes = MIN_BYTES;
    bytes -= bytes % 256;
    const size_t asked = bytes;
    void *src = NULL, *dst = NULL;
    for (; bytes >= MIN_BYTES; bytes /= 2) {
        if (cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess) break;
        cudaFree(src);
        src = dst = NULL;
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
    }
    if (!src) return ds_errorf("cuda bandwidth probe: cannot allocate 2 x %zu bytes (nor 2 x %zu)", asked, MIN_BYTES);
    cudaEvent_t ev[2] = {NULL, NULL};
    double best = 0;
    ce = cudaMemsetAsync(src, 1, bytes, cb->stream);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(dst, 0, bytes, cb->stream);
    if (ce == cudaSuccess) ce = cudaEventCreate(&ev[0]);
    if (ce == cudaSuccess) ce = cudaEventCreate(&ev[1]);
    for (int r = -1; r < reps && ce == cudaSuccess; r++) { /* r = -1: warm-up (clocks up, pages mapped) */
        ce = cudaEventRecord(ev[0], cb->stream);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream);
        if (ce == cudaSuccess) ce = cudaEventRecord(ev[1], cb->stream);
        if (ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
        float ms = 0;
        if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (ce == cudaSuccess && r >= 0 && ms > 0 && 2.0 * (double)bytes / (ms * 1e-3) > best)
            best = 2.0 * (double)bytes / (ms * 1e-3);
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    cudaFree(src);
    cudaFree(dst);
    if (ce != cudaSuccess) return ds_errorf("cuda bandwidth probe: copying 2 x %zu bytes: %s", bytes, cudaGetErrorString(ce));
    out->bytes_per_s = best;
    out->buffer_bytes = (double)bytes;
    out->method = "device-to-device copy, read + write bytes counted";
    /* The datasheet figure: the memory clock (kHz, double data rate) times the bus width. */
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, cb->device) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, cb->device) == cudaSuccess)
        out->peak_bytes_per_s = 2.0 * khz * 1e3 * bits / 8;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, cb->device) == cudaSuccess)
        snprintf(out->device, sizeof out->device, "%.95s", prop.name); /* names are short; cut at 95 */
    cudaGetLastError(); /* a device without the attributes leaves them 0: not an error of the probe */
    return NULL;
}
