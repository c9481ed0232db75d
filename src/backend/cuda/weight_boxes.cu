/* Box-contiguous copies of bf16 weights, which the ring matmul streams
 * (DS_CUDA_RING_BOXES: auto by default, 1 always, 0 never).
 *
 * The ring streams a weight in boxes of 16 rows x 256 k (matmul_ring.cu):
 * from the row-major weight, by a 2-D tensor map, each box is 16 runs of
 * 512 B a weight row apart. bench_boundary's ring streamed 4.52 TB/s on the
 * H200 in 8 KB runs against 4.34 in dspark's 16 x 512 B boxes (session 23),
 * and the AR step at the Qwen3-8B shape ran 4.8 % faster from box copies
 * (4.056 against 4.261 ms, same call). So each bf16 weight whose shape fits
 * (rows % 16 == 0, cols % 256 == 0, rows contiguous) gets a second copy on
 * the device in which box (r, b) -- rows 16r .. 16r + 15, k 256b .. 256b +
 * 255, in the same order within the box as the tensor copy lays it into
 * shared memory -- is one 8 KB run at element (r * cols / 256 + b) * 4096,
 * so the ring's producer fetches a box with one 1-D bulk copy. The consumers
 * see the same bytes either way.
 *
 * The copy costs the weight's memory again. The row-major weight stays: the
 * prefill GEMMs (cuBLAS), the per-tile kernel and the Markov walk read it.
 * In auto mode a copy is made only while a quarter of the device's memory
 * stays free after it (for the KV cache and scratch); the weights past that
 * stream by tensor map, as with DS_CUDA_RING_BOXES=0. An 8B model on the
 * H200 gets copies of every weight (16 GB more); a 32B one, about two
 * thirds. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define BOX_ROWS 16
#define BOX_K 256
#define BOXES_CAP 4096 /* weights with a copy (open addressing; Qwen3-8B + its drafter: ~300) */

typedef struct {
    const void *w; /* the weight's row-major data (NULL: a free slot) */
    int64_t rows, cols;
    uint16_t *boxes;
} box_entry;

struct ds_cu_boxes {
    box_entry e[BOXES_CAP];
    int n;
    int64_t bytes; /* held by the copies */
};

enum { BOXES_BAD = -2, BOXES_UNREAD = -1, BOXES_NEVER = 0, BOXES_ALWAYS = 1, BOXES_AUTO = 2 };

static int boxes_mode(void) {
    static int mode = BOXES_UNREAD;
    if (mode == BOXES_UNREAD) {
        const char *v = getenv("DS_CUDA_RING_BOXES");
        mode = !v || !*v || !strcmp(v, "auto") ? BOXES_AUTO
               : !strcmp(v, "1")                ? BOXES_ALWAYS
               : !strcmp(v, "0")                ? BOXES_NEVER
                                                : BOXES_BAD;
    }
    return mode;
}

bool ds_cu_boxes_on(void) { return boxes_mode() > 0; }

void ds_cu_boxes_stats(const ds_cuda_backend *cb, int64_t *tensors, int64_t *bytes) {
    *tensors = cb->boxes ? cb->boxes->n : 0;
    *bytes = cb->boxes ? cb->boxes->bytes : 0;
}

static size_t slot_of(const void *w) { return ((uintptr_t)w >> 8) * 0x9e3779b97f4a7c15ull >> 52 & (BOXES_CAP - 1); }

/* One thread a 16-byte piece: piece q of box i (8 bf16 of row q / 32 of the box). */
__global__ void boxes_kernel(uint16_t *dst, const uint16_t *src, int64_t cols, int64_t pieces) {
    const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= pieces) return;
    const int64_t box = q / (BOX_ROWS * BOX_K / 8), in = q % (BOX_ROWS * BOX_K / 8);
    const int64_t per_row = cols / BOX_K, r = box / per_row, b = box % per_row;
    const int64_t row = r * BOX_ROWS + in / (BOX_K / 8), k = b * BOX_K + in % (BOX_K / 8) * 8;
    *(uint4 *)(dst + q * 8) = *(const uint4 *)(src + row * cols + k);
}

ds_error *ds_cu_boxes_add(ds_cuda_backend *cb, const char *name, const void *w, int64_t rows, int64_t cols) {
    const int mode = boxes_mode();
    if (mode == BOXES_BAD)
        return ds_errorf("cuda backend: DS_CUDA_RING_BOXES must be auto, 0 or 1, not '%s'",
                         getenv("DS_CUDA_RING_BOXES"));
    if (mode == BOXES_NEVER || rows % BOX_ROWS || cols % BOX_K || rows <= 0) return NULL;
    if (!cb->boxes && !(cb->boxes = (ds_cu_boxes *)calloc(1, sizeof *cb->boxes)))
        return ds_errorf("cuda backend: out of memory (the weights' box table)");
    if (cb->boxes->n >= BOXES_CAP / 2) return NULL; /* the table kept sparse: later weights stream by tensor map */
    uint16_t *p = NULL;
    const size_t bytes = (size_t)(rows * cols) * 2;
    if (mode == BOXES_AUTO) { /* a quarter of the device kept free */
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + total_b / 4) {
            (void)cudaGetLastError();
            return NULL;
        }
    }
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess && mode == BOXES_AUTO) { /* the row-major weight serves */
        (void)cudaGetLastError();
        return NULL;
    }
    if (e != cudaSuccess)
        return ds_errorf("cuda backend: tensor %s: cannot allocate %zu bytes for its box copy (DS_CUDA_RING_BOXES=1): %s",
                         name, bytes, cudaGetErrorString(e));
    const int64_t pieces = rows * cols / 8;
    boxes_kernel<<<(unsigned)((pieces + 255) / 256), 256, 0, cb->stream>>>(p, (const uint16_t *)w, cols, pieces);
    if ((e = cudaGetLastError()) != cudaSuccess) {
        cudaFree(p);
        return ds_errorf("cuda backend: tensor %s: its box copy failed: %s", name, cudaGetErrorString(e));
    }
    size_t i = slot_of(w);
    while (cb->boxes->e[i].w) i = (i + 1) & (BOXES_CAP - 1);
    cb->boxes->e[i] = box_entry{w, rows, cols, p};
    cb->boxes->n++;
    cb->boxes->bytes += (int64_t)bytes;
    return NULL;
}

const uint16_t *ds_cu_boxes_of(const ds_cuda_backend *cb, const void *w, int64_t rows, int64_t cols,
                               int64_t stride) {
    if (!cb->boxes || stride != cols) return NULL;
    for (size_t i = slot_of(w);; i = (i + 1) & (BOXES_CAP - 1)) {
        const box_entry *b = &cb->boxes->e[i];
        if (!b->w) return NULL;
        if (b->w == w) return b->rows == rows && b->cols == cols ? b->boxes : NULL;
    }
}

void ds_cu_boxes_drop(ds_cuda_backend *cb, const void *w) {
    if (!cb->boxes) return;
    size_t i = slot_of(w);
    while (cb->boxes->e[i].w && cb->boxes->e[i].w != w) i = (i + 1) & (BOXES_CAP - 1);
    if (!cb->boxes->e[i].w) return;
    cudaFree(cb->boxes->e[i].boxes);
    cb->boxes->bytes -= cb->boxes->e[i].rows * cb->boxes->e[i].cols * 2;
    /* Backward-shift deletion: the entries after it that probed past this slot move up. */
    size_t hole = i;
    for (size_t j = (i + 1) & (BOXES_CAP - 1); cb->boxes->e[j].w; j = (j + 1) & (BOXES_CAP - 1)) {
        const size_t home = slot_of(cb->boxes->e[j].w);
        if (((j - home) & (BOXES_CAP - 1)) >= ((j - hole) & (BOXES_CAP - 1))) {
            cb->boxes->e[hole] = cb->boxes->e[j];
            hole = j;
        }
    }
    cb->boxes->e[hole] = box_entry{};
    cb->boxes->n--;
}

void ds_cu_boxes_free(ds_cuda_backend *cb) {
    if (!cb->boxes) return;
    for (int i = 0; i < BOXES_CAP; i++)
        if (cb->boxes->e[i].w) cudaFree(cb->boxes->e[i].boxes);
    free(cb->boxes);
    cb->boxes = NULL;
}
