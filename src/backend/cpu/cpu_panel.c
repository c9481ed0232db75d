/* Weights repacked into column panels for the matmul (cpu_matmul.c),
 * cached per weight tensor.
 *
 * A panel holds 16 consecutive output features (weight rows) k-major: for
 * each k, the 16 weights w[n0..n0+15][k] side by side, so the micro-kernel
 * reads one contiguous 32-byte (bf16) or 64-byte (fp32) line per k and
 * broadcasts x[m][k] against it. bf16 panels keep bf16: each 32-bit lane i
 * holds w[n0+i][k] in its low half and w[n0+8+i][k] in its high half, so a
 * shift and a mask widen them to fp32 exactly. f32 and f16 weights become
 * fp32 panels. Rows past N are zero.
 *
 * Only tensors that came from weight() are cached (their contents never
 * change); quantized weights (ds_quant) become fp32 panels of their
 * dequantized values. They are packed on their first use (embedding tables that
 * are never multiplied cost nothing) and dropped on release(). Other
 * operands are packed per call into scratch, to the same values. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/affine_quant.h"

/* Hash slots: open addressing, linear probing; a forgotten slot keeps
 * probing chains intact as a tombstone. */
#define TOMBSTONE ((const void *)1)

static size_t slot_of(const void *key, size_t cap) {
    return (size_t)(((uintptr_t)key >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & (cap - 1);
}

static bool same_view(const ds_cpu_packed *e, ds_tensor w) {
    return e->data == w.data && e->rows == w.rows && e->cols == w.cols && e->stride == w.stride &&
           e->dtype == w.dtype;
}

static ds_cpu_packed *find(ds_cpu_pack_cache *c, ds_tensor w) {
    if (!c->cap) return NULL;
    for (size_t i = slot_of(w.data, c->cap), n = 0; n < c->cap; i = (i + 1) & (c->cap - 1), n++) {
        ds_cpu_packed *e = &c->slots[i];
        if (!e->data) return NULL;
        if (same_view(e, w)) return e;
    }
    return NULL;
}

static bool grow(ds_cpu_pack_cache *c) {
    size_t cap = c->cap ? c->cap * 2 : 256;
    ds_cpu_packed *s = calloc(cap, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < c->cap; i++) {
        ds_cpu_packed *e = &c->slots[i];
        if (!e->data || e->data == TOMBSTONE) continue;
        size_t j = slot_of(e->data, cap);
        while (s[j].data) j = (j + 1) & (cap - 1);
        s[j] = *e;
    }
    free(c->slots);
    c->slots = s;
    c->cap = cap;
    c->used = 0;
    for (size_t i = 0; i < cap; i++) c->used += s[i].data != NULL;
    return true;
}

void ds_cpu_pack_register(ds_cpu_pack_cache *c, ds_tensor w) {
    if (!w.data || w.rows < 1 || w.cols < 1 || find(c, w)) return;
    if ((c->used + 1) * 2 > c->cap && !grow(c)) return; /* uncached: packed per call instead */
    size_t i = slot_of(w.data, c->cap);
    while (c->slots[i].data && c->slots[i].data != TOMBSTONE) i = (i + 1) & (c->cap - 1);
    if (!c->slots[i].data) c->used++;
    c->slots[i] = (ds_cpu_packed){.data = w.data, .rows = w.rows, .cols = w.cols, .stride = w.stride,
                                  .dtype = w.dtype};
}

/* Every cached view of this data (a weight and its aliases) goes: the
 * memory may hold another tensor next. */
void ds_cpu_pack_forget(ds_cpu_pack_cache *c, const void *data) {
    for (size_t i = 0; data && i < c->cap; i++) {
        ds_cpu_packed *e = &c->slots[i];
        if (e->data != data) continue;
        free(e->panels);
        *e = (ds_cpu_packed){.data = TOMBSTONE};
    }
}

void ds_cpu_pack_free(ds_cpu_pack_cache *c) {
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i].data != TOMBSTONE) free(c->slots[i].panels);
    free(c->slots);
    *c = (ds_cpu_pack_cache){0};
}

void ds_cpu_pack_f32(ds_tensor w, int64_t p0, int64_t p1, float *dst) {
    const int64_t K = w.cols, N = w.rows;
    const size_t es = ds_dtype_size(w.dtype);
    for (int64_t p = p0; p < p1; p++, dst += DS_PANEL * K) {
        for (int j = 0; j < DS_PANEL; j++) {
            const int64_t n = p * DS_PANEL + j;
            if (n >= N) {
                for (int64_t k = 0; k < K; k++) dst[k * DS_PANEL + j] = 0;
                continue;
            }
            if (w.q.bits) { /* quantized: the dequantized values (the weight's stride counts words) */
                const uint32_t *q = (const uint32_t *)w.data + n * w.stride;
                const char *sc = (const char *)w.q.scales + (size_t)(n * (K / w.q.group)) * es;
                const char *bi = (const char *)w.q.biases + (size_t)(n * (K / w.q.group)) * es;
                for (int64_t g = 0; g < K / w.q.group; g++) {
                    float s, b;
                    ds_to_f32(w.dtype, sc + (size_t)g * es, &s, 1);
                    ds_to_f32(w.dtype, bi + (size_t)g * es, &b, 1);
                    for (int64_t k = g * w.q.group; k < (g + 1) * w.q.group; k++)
                        dst[k * DS_PANEL + j] = fmaf(s, (float)ds_quant_get(q, w.q.bits, k), b);
                }
                continue;
            }
            const char *row = (const char *)w.data + (size_t)(n * w.stride) * es;
            for (int64_t k = 0; k < K; k++) {
                float v;
                ds_to_f32(w.dtype, row + (size_t)k * es, &v, 1);
                dst[k * DS_PANEL + j] = v;
            }
        }
    }
}

static void pack_bf16(ds_tensor w, uint32_t *dst) {
    const int64_t K = w.cols, N = w.rows, P = ds_cpu_panels(N);
    const uint16_t *src = w.data;
    for (int64_t p = 0; p < P; p++, dst += (DS_PANEL / 2) * K)
        for (int i = 0; i < DS_PANEL / 2; i++) {
            const int64_t lo = p * DS_PANEL + i, hi = lo + DS_PANEL / 2;
            for (int64_t k = 0; k < K; k++) {
                uint32_t a = lo < N ? src[lo * w.stride + k] : 0, b = hi < N ? src[hi * w.stride + k] : 0;
                dst[k * (DS_PANEL / 2) + i] = a | b << 16;
            }
        }
}

const void *ds_cpu_pack_get(ds_cpu_pack_cache *c, ds_tensor w, bool *bf16) {
    ds_cpu_packed *e = find(c, w);
    if (!e) return NULL;
    if (!e->panels) {
        const bool b = w.dtype == DS_BF16 && !w.q.bits; /* quantized: fp32 panels of the dequantized values */
        const size_t bytes = (size_t)(ds_cpu_panels(w.rows) * DS_PANEL * w.cols) * (b ? 2 : 4);
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0) return NULL; /* packed per call instead */
        if (b) pack_bf16(w, p);
        else ds_cpu_pack_f32(w, 0, ds_cpu_panels(w.rows), p);
        e->panels = p;
    }
    *bf16 = e->dtype == DS_BF16 && !w.q.bits;
    return e->panels;
}
