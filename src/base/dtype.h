/* Element types of stored tensors and their conversions. */
#ifndef DS_DTYPE_H
#define DS_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* DS_U32: the packed words of quantized weights (base/affine_quant.h). */
typedef enum { DS_F32 = 0, DS_BF16, DS_F16, DS_I64, DS_I32, DS_U32, DS_DTYPE_COUNT } ds_dtype;

size_t ds_dtype_size(ds_dtype t);
const char *ds_dtype_name(ds_dtype t);
/* Parses a safetensors dtype string ("F32", "BF16", ...); -1 if unknown. */
int ds_dtype_parse(const char *s);

static inline float ds_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as PyTorch does. */
static inline uint16_t ds_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float ds_f16_to_f32(uint16_t h);
/* Round to nearest even (numpy's astype(float16), MLX's float16_t): overflow to inf, subnormals kept. */
uint16_t ds_f32_to_f16(float f);

/* x[i] = the bf16 nearest x[i] (ds_f32_to_bf16, NaN handling included),
 * widened back to fp32, for n values: branch-free, so it vectorises. */
void ds_round_bf16_n(float *x, size_t n);

/* The build option DS_X_BF16 (on by default; cmake -DDS_X_BF16=OFF for
 * the earlier numerics): every matmul with bf16 weights multiplies x
 * rounded to bf16, as the reference computes for bf16 checkpoints, instead
 * of x's ~16 mantissa bits (bf16 hi + lo on the GPU, fp32 on the CPU):
 * half of x's shared memory and half the products on the GPU, one prefill
 * GEMM instead of two. Where a norm comes first the rounded value is
 * bf16((x / rms) * w) on both backends, with 1 / rms taken in one order on
 * every path (rounding bf16(x * w) and scaling the sums by 1 / rms after
 * drifted from the reference). A build
 * option, not a setting, so that each build's kernels carry one form. */
#ifdef DS_X_BF16
#define DS_X_BF16_ON 1
#else
#define DS_X_BF16_ON 0
#endif

/* Converts n elements of type t at src to fp32. */
void ds_to_f32(ds_dtype t, const void *src, float *dst, size_t n);

#endif
