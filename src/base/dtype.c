#include "base/dtype.h"

#include <math.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[DS_DTYPE_COUNT] = {
    [DS_F32] = {"F32", 4}, [DS_BF16] = {"BF16", 2}, [DS_F16] = {"F16", 2},
    [DS_I64] = {"I64", 8}, [DS_I32] = {"I32", 4}, [DS_U32] = {"U32", 4},
};

size_t ds_dtype_size(ds_dtype t) { return (unsigned)t < DS_DTYPE_COUNT ? dtypes[t].size : 0; }
const char *ds_dtype_name(ds_dtype t) { return (unsigned)t < DS_DTYPE_COUNT ? dtypes[t].name : "?"; }

int ds_dtype_parse(const char *s) {
    for (int i = 0; i < DS_DTYPE_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

float ds_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* zero or subnormal */
        return sign ? -f : f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ds_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN stays NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                        /* >= 65520: inf */
    if (a < 0x38800000u) { /* below 2^-14: a subnormal step of 2^-24 (the scaling is exact), ties to even */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint32_t)rintf(v * 16777216.0f));
    }
    const uint32_t r = a - 0x38000000u; /* exponent rebased from 127 to 15 */
    return (uint16_t)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
}

void ds_round_bf16_n(float *x, size_t n) {
    uint32_t *u = (uint32_t *)(void *)x;
    for (size_t i = 0; i < n; i++) {
        const uint32_t v = u[i];
        const uint32_t rounded = (v + 0x7fff + ((v >> 16) & 1)) & 0xffff0000u;
        const uint32_t quiet = (v & 0xffff0000u) | 0x00400000u; /* NaN stays NaN */
        const uint32_t is_nan = -(uint32_t)((v & 0x7fffffffu) > 0x7f800000u);
        u[i] = (rounded & ~is_nan) | (quiet & is_nan);
    }
}

void ds_to_f32(ds_dtype t, const void *src, float *dst, size_t n) {
    switch (t) {
    case DS_F32: memcpy(dst, src, n * 4); break;
    case DS_BF16: {
        /* bf16 is the top half of an fp32: widen by a shift (vectorises). */
        const uint16_t *s = src;
        uint32_t *d = (uint32_t *)(void *)dst;
        for (size_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
        break;
    }
    case DS_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ds_f16_to_f32(s[i]);
        break;
    }
    case DS_I64: {
        const int64_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    case DS_I32: {
        const int32_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    default: break;
    }
}
