/* 8-lane fp32 math for the CPU kernels and the samplers (GCC vector
 * extensions, so any target builds; with AVX2 + FMA each op is one
 * instruction). */
#ifndef DS_VMATH_H
#define DS_VMATH_H

#include <stdint.h>

typedef float ds_v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t ds_v8i __attribute__((vector_size(32), aligned(4)));

static inline ds_v8f ds_v8f_set1(float x) { return (ds_v8f){x, x, x, x, x, x, x, x}; }

static inline ds_v8f ds_v8f_select(ds_v8i mask, ds_v8f a, ds_v8f b) {
    return (ds_v8f)((mask & (ds_v8i)a) | (~mask & (ds_v8i)b));
}

/* e^x, 8 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, so r is
 * exact), e^r by its degree-6 Taylor-Horner polynomial (Cephes expf's
 * coefficients, about 1 ulp), times 2^n as two exact power-of-two factors
 * built in the exponent bits (one would overflow at n = 128 or underflow
 * below n = -126). Below -104 the result is 0, above 88.72 +inf; NaN
 * stays NaN. The softmaxes (attention, sampling) and SiLU use it: glibc's
 * scalar expf was most of their time. */
static inline ds_v8f ds_v8f_exp(ds_v8f x) {
    const ds_v8f hi = ds_v8f_set1(88.7228f), lo = ds_v8f_set1(-104.0f);
    const ds_v8i over = x > hi, under = x < lo, nan = x != x;
    ds_v8f xc = ds_v8f_select(over, hi, ds_v8f_select(under, lo, x));
    xc = ds_v8f_select(nan, ds_v8f_set1(0.0f), xc);
    /* n = round(x / ln2) */
    ds_v8f fn = xc * ds_v8f_set1(1.44269504088896341f) + ds_v8f_set1(12582912.0f); /* 1.5 * 2^23 */
    const ds_v8i n = (ds_v8i)fn - (ds_v8i)ds_v8f_set1(12582912.0f);
    fn -= ds_v8f_set1(12582912.0f);
    ds_v8f r = xc - fn * ds_v8f_set1(0.693359375f);
    r = r - fn * ds_v8f_set1(-2.12194440e-4f);
    ds_v8f p = ds_v8f_set1(1.9875691500e-4f);
    p = p * r + ds_v8f_set1(1.3981999507e-3f);
    p = p * r + ds_v8f_set1(8.3334519073e-3f);
    p = p * r + ds_v8f_set1(4.1665795894e-2f);
    p = p * r + ds_v8f_set1(1.6666665459e-1f);
    p = p * r + ds_v8f_set1(5.0000001201e-1f);
    p = p * (r * r) + r + ds_v8f_set1(1.0f);
    /* n in [-150, 128] (the clamps): 2^(n/2) * 2^(n - n/2), both normal. */
    const ds_v8i n1 = n >> 1, n2 = n - n1;
    ds_v8f res = p * (ds_v8f)((n1 + 127) << 23) * (ds_v8f)((n2 + 127) << 23);
    res = ds_v8f_select(under, ds_v8f_set1(0.0f), res);
    res = ds_v8f_select(over, ds_v8f_set1(__builtin_inff()), res);
    return ds_v8f_select(nan, x, res);
}

#endif
