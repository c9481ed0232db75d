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
 * change); quantized weights (ds_quant) keep their codes (ds_cpu_pan_kind),
 * and become fp32 panels of their dequantized values where packed per call.
 * They are packed on their first use (embedding tables that
 * are never multiplied cost nothing) and dropped on release(). Other
 * operands are packed per call into scratch, to the same values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* Quantized panels (ds_cpu_pan_kind): per group, 16 fp32 scales, 16 fp32
 * biases (zero past N: those lanes dequantize to 0), then the codes k-major:
 * Q8 a byte per lane and k; Q4 a byte per lane and pair of k (k even in the
 * low nibble), so one widening load serves two k steps. */
static void pack_quant(ds_tensor w, uint8_t *dst, ds_cpu_pan_kind kind) {
    const int64_t K = w.cols, N = w.rows, P = ds_cpu_panels(N), gs = w.q.group, G = K / gs;
    const int bits = w.q.bits;
    const size_t es = ds_dtype_size(w.dtype), qk = kind == DS_PAN_Q8 ? DS_PANEL : DS_PANEL / 2,
                 gbytes = 2 * DS_PANEL * 4 + (size_t)gs * qk, pbytes = ds_cpu_panel_bytes(w, kind);
    memset(dst, 0, (size_t)P * pbytes);
    for (int64_t p = 0; p < P; p++)
        for (int64_t g = 0; g < G; g++) {
            uint8_t *gp = dst + (size_t)p * pbytes + (size_t)g * gbytes;
            float sb[2 * DS_PANEL] = {0};
            uint8_t *q = gp + sizeof sb;
            for (int j = 0; j < DS_PANEL; j++) {
                const int64_t n = p * DS_PANEL + j;
                if (n >= N) continue;
                ds_to_f32(w.dtype, (const char *)w.q.scales + (size_t)(n * G + g) * es, &sb[j], 1);
                ds_to_f32(w.dtype, (const char *)w.q.biases + (size_t)(n * G + g) * es, &sb[DS_PANEL + j], 1);
                const uint32_t *row = (const uint32_t *)w.data + n * w.stride;
                for (int64_t k = 0; k < gs; k++) {
                    const uint32_t v = ds_quant_get(row, bits, g * gs + k);
                    if (kind == DS_PAN_Q8) q[k * DS_PANEL + j] = (uint8_t)v;
                    else q[(k / 2) * DS_PANEL + j] |= (uint8_t)(v << (k % 2 ? 4 : 0));
                }
            }
            memcpy(gp, sb, sizeof sb);
        }
}

const void *ds_cpu_pack_get(ds_cpu_pack_cache *c, ds_tensor w, ds_cpu_pan_kind *kind) {
    ds_cpu_packed *e = find(c, w);
    if (!e) return NULL;
    const ds_cpu_pan_kind k = w.q.bits == 8   ? DS_PAN_Q8
                              : w.q.bits == 4 ? DS_PAN_Q4
                              : w.dtype == DS_BF16 ? DS_PAN_BF16
                                                   : DS_PAN_F32;
    if (!e->panels) {
        const size_t bytes = (size_t)ds_cpu_panels(w.rows) * ds_cpu_panel_bytes(w, k);
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0) return NULL; /* packed per call instead */
        if (k == DS_PAN_BF16) pack_bf16(w, p);
        else if (k == DS_PAN_F32) ds_cpu_pack_f32(w, 0, ds_cpu_panels(w.rows), p);
        else pack_quant(w, p, k);
        e->panels = p;
    }
    *kind = k;
    return e->panels;
}
