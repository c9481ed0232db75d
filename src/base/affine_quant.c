#include "base/affine_quant.h"

#include <math.h>

/* MLX's `quantize` (CPU) for one group: the scale spans [min, max] in
 * 2^bits - 1 steps, signed so that the edge of larger magnitude maps
 * exactly to an integer q0 (and so to itself when dequantized), the bias
 * is that edge; values are rint((w - bias) / scale) clamped to the range.
 * Every step in fp32, in this order; rintf rounds ties to even as
 * std::rint does. */
void ds_quant_group(const float *w, int group, int bits, uint32_t *packed, float *scale, float *bias) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < group; j++) {
        w_max = fmaxf(w_max, w[j]);
        w_min = fminf(w_min, w[j]);
    }
    const bool mask = fabsf(w_min) > fabsf(w_max);
    float s = fmaxf((w_max - w_min) / n_bins, eps);
    s = mask ? s : -s;
    const float edge = mask ? w_min : w_max;
    const float q0 = rintf(edge / s);
    float b = 0;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    const int per = 32 / bits;
    for (int i = 0; i < group / per; i++) {
        uint32_t word = 0;
        for (int k = 0; k < per; k++) {
            float v = rintf((w[i * per + k] - b) / s);
            v = fminf(fmaxf(v, 0.0f), n_bins);
            word |= (uint32_t)v << (k * bits);
        }
        packed[i] = word;
    }
    *scale = s;
    *bias = b;
}

static float sb_at(const void *p, ds_dtype t, int64_t i) {
    float v;
    ds_to_f32(t, (const char *)p + (size_t)i * ds_dtype_size(t), &v, 1);
    return v;
}

void ds_dequant_row(const uint32_t *q, const void *scales, const void *biases, ds_dtype sb, int bits, int group,
                    int64_t K, float *out) {
    for (int64_t g = 0; g < K / group; g++) {
        const float s = sb_at(scales, sb, g), b = sb_at(biases, sb, g);
        for (int64_t k = g * group; k < (g + 1) * group; k++) out[k] = fmaf(s, (float)ds_quant_get(q, bits, k), b);
    }
}
