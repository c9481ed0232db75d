/* Box-contiguous copies of bf16 weights, which the ring matmul streams
 * (DS_CUDA_RING_BOXES: auto by default, 1 always, 0 never).
 *
 * The ring streams a weight in boxes of 16 rows x 256 k (matmul_ring.cu):
 * from the row-major weight, by a 2-D tensor map, each box is 16 runs of
 * 512 B a weight row apart, and HBM streams one 8 KB run faster than 16
 * short ones (the AR step ~5 % faster at the Qwen3-8B shape: bench/RESULTS.md).
 * So each bf16 weight whose shape fits
 * (rows % 16 == 0, cols % 256 == 0, rows contiguous) gets a second copy on
 * the device in which box (r, b) -- rows 16r .. 16r + 15, k 256b .. 256b +
 * 255, in the same order within the box as the tensor copy lays it into
 * shared memory -- is one 8 KB run at element (r * cols / 256 + b) * 4096,
 * so the ring's producer fetches a box with one 1-D bulk copy. The consumers
 * see the same bytes either way.
 *
 * The copy costs the weight's memory again. The row-major weight stays: the
 * prefill GEMMs (cuBLAS), the per-tile kernel and the Markov walk read it.
 * In auto mode an upload only registers the weight; its copy is made at its
 * first use by the ring outside a recording (a step's first run is op by
 * op), once the model, its drafter and their caches have their memory, and
 * only while a quarter of the device's memory stays free after it. Copies
 * made at upload would not know the later weights' needs: a model that fits
 * without copies could then fail to load. Weights that get no copy stream
 * by tensor map, as with DS_CUDA_RING_BOXES=0 (an 8B model and its drafter
 * on a 141 GB GPU: all copied, 21 GB more). DS_CUDA_RING_BOXES=1 copies
 * every weight as it is uploaded, and fails the upload where it cannot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define BOX_ROWS 16
#define BOX_K 256
#define BOXES_CAP 4096 /* weights with a copy (open addressing; Qwen3-8B + its drafter: ~300) */

typedef struct {
    const void *w; /* the weight's row-major data (NULL: a free slot) */
    int64_t rows, cols;
    uint16_t *boxes; /* NULL: not made (yet: auto mode, until its first use; or declined) */
    bool declined;   /* auto mode: there was not the memory for it at its first use */
} box_entry;

struct ds_cu_boxes {
    box_entry e[BOXES_CAP];
    int n;         /* entries */
    int made;      /* copies */
    int64_t bytes; /* held by the copies */
};

bool ds_cu_boxes_on(const ds_cuda_backend *cb) { return cb->cfg.ring_boxes != DS_CU_BOXES_NEVER; }

void ds_cu_boxes_stats(const ds_cuda_backend *cb, int64_t *tensors, int64_t *bytes) {
    *tensors = cb->boxes ? cb->boxes->made : 0;
    *bytes = cb->boxes ? cb->boxes->bytes : 0;
}

static size_t slot_of(const void *w) { return ((uintptr_t)w >> 8) * 0x9e3779b97f4a7c15ull >> 52 & (BOXES_CAP - 1); }

/* The slot holding w's entry, or the free slot where its probe ends (the table is kept at most half full). */
static size_t probe(const ds_cu_boxes *t, const void *w) {
    size_t i = slot_of(w);
    while (t->e[i].w && t->e[i].w != w) i = (i + 1) & (BOXES_CAP - 1);
    return i;
}

/* One thread a 16-byte piece: piece q of box i (8 bf16 of row q / 32 of the box). */
__global__ void boxes_kernel(uint16_t *dst, const uint16_t *src, int64_t cols, int64_t pieces) {
    const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= pieces) return;
    const int64_t box = q / (BOX_ROWS * BOX_K / 8), in = q % (BOX_ROWS * BOX_K / 8);
    const int64_t per_row = cols / BOX_K, r = box / per_row, b = box % per_row;
    const int64_t row = r * BOX_ROWS + in / (BOX_K / 8), k = b * BOX_K + in % (BOX_K / 8) * 8;
    *(uint4 *)(dst + q * 8) = *(const uint4 *)(src + row * cols + k);
}

/* The copy of a rows x cols weight at w into *out, launched on the stream; auto: NULL where the memory is short
 * (a quarter of the device kept free) or the allocation fails, else an error naming the tensor. */
static ds_error *make_copy(ds_cuda_backend *cb, const char *name, const void *w, int64_t rows, int64_t cols,
                           bool auto_mode, uint16_t **out) {
    *out = NULL;
    const size_t bytes = (size_t)(rows * cols) * 2;
    if (auto_mode) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + total_b / 4) {
            (void)cudaGetLastError();
            return NULL;
        }
    }
    uint16_t *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return auto_mode ? NULL
                         : ds_errorf("cuda backend: tensor %s: cannot allocate %zu bytes for its box copy "
                                     "(DS_CUDA_RING_BOXES=1): %s",
                                     name, bytes, cudaGetErrorString(e));
    }
    const int64_t pieces = rows * cols / 8;
    boxes_kernel<<<(unsigned)((pieces + 255) / 256), 256, 0, cb->stream>>>(p, (const uint16_t *)w, cols, pieces);
    if ((e = cudaGetLastError()) != cudaSuccess) {
        cudaFree(p);
        return ds_errorf("cuda backend: tensor %s: its box copy failed: %s", name, cudaGetErrorString(e));
    }
    *out = p;
    cb->boxes->made++;
    cb->boxes->bytes += (int64_t)bytes;
    return NULL;
}

ds_error *ds_cu_boxes_add(ds_cuda_backend *cb, const char *name, const void *w, int64_t rows, int64_t cols) {
    const int mode = cb->cfg.ring_boxes;
    if (mode == DS_CU_BOXES_NEVER || rows % BOX_ROWS || cols % BOX_K || rows <= 0) return NULL;
    if (!cb->boxes && !(cb->boxes = (ds_cu_boxes *)calloc(1, sizeof *cb->boxes)))
        return ds_errorf("cuda backend: out of memory (the weights' box table)");
    if (cb->boxes->n >= BOXES_CAP / 2) return NULL; /* the table kept sparse: later weights stream by tensor map */
    uint16_t *p = NULL;
    if (mode == DS_CU_BOXES_ALWAYS) DS_TRY(make_copy(cb, name, w, rows, cols, false, &p));
    const size_t i = probe(cb->boxes, w); /* (free: a released weight's entry went with it) */
    cb->boxes->e[i] = box_entry{w, rows, cols, p, false};
    cb->boxes->n++;
    return NULL;
}

const uint16_t *ds_cu_boxes_of(ds_cuda_backend *cb, const void *w, int64_t rows, int64_t cols, int64_t stride) {
    if (!cb->boxes || stride != cols) return NULL;
    box_entry *b = &cb->boxes->e[probe(cb->boxes, w)];
    if (!b->w || b->rows != rows || b->cols != cols) return NULL;
    if (!b->boxes && !b->declined) { /* auto mode's first use: made now, unless the stream is being recorded */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cb->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            (void)cudaGetLastError();
            return NULL;
        }
        char name[64];
        snprintf(name, sizeof name, "(a %lld x %lld weight)", (long long)rows, (long long)cols);
        ds_error *e = make_copy(cb, name, w, rows, cols, true, &b->boxes);
        if (e) {
            ds_cu_fail(cb, "weight boxes", "%s", ds_error_message(e));
            ds_error_free(e);
        }
        b->declined = !b->boxes;
        /* The ring's producer reads a weight before its grid wait (a weight is written by uploads only), and a
         * programmatic launch may begin before the copy's writes are visible: the copy is waited for here, once,
         * in the step's first (op by op) run. */
        if (b->boxes && !ds_cu_ok(cb, "weight boxes", cudaStreamSynchronize(cb->stream))) return NULL;
    }
    return b->boxes;
}

void ds_cu_boxes_drop(ds_cuda_backend *cb, const void *w) {
    if (!cb->boxes) return;
    const size_t i = probe(cb->boxes, w);
    if (!cb->boxes->e[i].w) return;
    if (cb->boxes->e[i].boxes) {
        cudaFree(cb->boxes->e[i].boxes);
        cb->boxes->made--;
        cb->boxes->bytes -= cb->boxes->e[i].rows * cb->boxes->e[i].cols * 2;
    }
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
