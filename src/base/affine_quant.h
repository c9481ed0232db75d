/* Affine group quantization as MLX stores it (mx.quantize, mode "affine"):
 * a [N, K] weight becomes
 *   <name>.weight  uint32 [N, K * bits / 32]: 32 / bits values a word, the
 *                  first value in the lowest bits (value j of a row sits at
 *                  bit (j * bits) % 32 of word j * bits / 32),
 *   <name>.scales, <name>.biases  [N, K / group_size] in the weight's float
 *                  dtype,
 * and w[n][k] = scales[n][g] * q[n][k] + biases[n][g], g = k / group_size.
 *
 * The quantizer is MLX's CPU kernel (mlx/backend/cpu/quantized.cpp,
 * `quantize`), step for step in fp32, so a checkpoint quantized here is
 * bit-identical to mx.quantize on the CPU (its Metal kernel rounds ties away
 * from zero and may differ on rare ties). Dequantized values are one fp32
 * rounding of scale * q + bias (fmaf): with bf16 or f16 scales the product
 * is exact, so this equals MLX's dequantize (multiply, then add). */
#ifndef DS_AFFINE_QUANT_H
#define DS_AFFINE_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

/* The layouts this engine reads and writes: bits 4 or 8, groups of 32, 64 or 128. */
static inline bool ds_quant_bits_ok(int bits) { return bits == 4 || bits == 8; }
static inline bool ds_quant_group_ok(int g) { return g == 32 || g == 64 || g == 128; }

/* Value j of a packed row. */
static inline uint32_t ds_quant_get(const uint32_t *row, int bits, int64_t j) {
    const int per = 32 / bits;
    return (row[j / per] >> ((j % per) * bits)) & ((1u << bits) - 1u);
}

/* One group of `group` weights (fp32 values of the source dtype) to packed
 * words (group * bits / 32 of them), its scale and bias in fp32 (the caller
 * rounds them to the stored dtype, as MLX casts them). */
void ds_quant_group(const float *w, int group, int bits, uint32_t *packed, float *scale, float *bias);

/* Row n of a quantized weight (K values) to fp32: packed row `q`, its
 * K / group scales and biases of dtype sb (bf16, f16, f32). */
void ds_dequant_row(const uint32_t *q, const void *scales, const void *biases, ds_dtype sb, int bits, int group,
                    int64_t K, float *out);

#endif
