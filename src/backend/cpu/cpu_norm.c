/* RMSNorm of one row in fp32 (the reference normalizes in fp32 too). */
#include <math.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/norm_order.h"
#include "base/vmath.h"

/* DS_X_BF16: 1 / rms of a row in the order of the GPU's standalone norms
 * (norm_order.h's T threads; norm_rope_math.cuh's nr_block_inv_rms, whose
 * per-head warp form is the same order): thread i chains fmaf over
 * elements i, i + T, ...; each warp's 32 sums are butterflied (lane l adds
 * lane l ^ off's, off = 16 .. 1; lane 0's total), and the warps' totals are
 * added in order. So the CPU and the GPU norm the same rows to the same
 * bits. */
static float rms_inv_block_order(const float *x, int dim, float eps) {
    const int T = ds_norm_threads(dim);
    float total = 0.0f;
    for (int w = 0; w < T / 32; w++) {
        float v[32], u[32];
        for (int l = 0; l < 32; l++) {
            v[l] = 0.0f;
            for (int i = 32 * w + l; i < dim; i += T) v[l] = fmaf(x[i], x[i], v[l]);
        }
        for (int off = 16; off > 0; off >>= 1) {
            for (int l = 0; l < 32; l++) u[l] = v[l] + v[l ^ off];
            for (int l = 0; l < 32; l++) v[l] = u[l];
        }
        total = w ? total + v[0] : v[0];
    }
    return 1.0f / sqrtf(total / (float)dim + eps);
}

/* DS_X_BF16: 1 / rms of a row for a fused norm, in the tile order of the GPU's
 * (matmul_mma_frag.cuh, dim a multiple of 16): tile j (x[16j .. 16j + 16))
 * sums each half as ((x0^2 + x1^2) + (x2^2 + x3^2)) + (...), a pair one fma,
 * and adds the halves; slot l of 32 adds tiles l, l + 32, ... in order; the
 * slots are added in a butterfly (slot l + off into slot l, off = 16 .. 1). */
static float sq_tree8(const float *f) {
    const float a = fmaf(f[1], f[1], f[0] * f[0]), b = fmaf(f[3], f[3], f[2] * f[2]);
    const float c = fmaf(f[5], f[5], f[4] * f[4]), d = fmaf(f[7], f[7], f[6] * f[6]);
    return (a + b) + (c + d);
}

float ds_cpu_rms_inv_tiles(const float *x, int dim, float eps) {
    float slot[32] = {0};
    for (int j = 0; j < dim / 16; j++) slot[j % 32] += sq_tree8(x + 16 * j) + sq_tree8(x + 16 * j + 8);
    for (int off = 16; off >= 1; off /= 2)
        for (int l = 0; l < off; l++) slot[l] += slot[l + off];
    return 1.0f / sqrtf(slot[0] / (float)dim + eps);
}

static float rms_inv(const float *x, int dim, float eps) {
    /* Sum of squares in 8 lanes, a fixed reduction tree, then the tail: a
     * fixed order for every row (a scalar chain was most of the op). */
    ds_v8f acc = {0};
    int i = 0;
    for (; i + 8 <= dim; i += 8) {
        const ds_v8f v = *(const ds_v8f *)(x + i);
        acc += v * v;
    }
    float ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < dim; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)dim + eps);
}

void ds_cpu_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps) {
    const float r = DS_X_BF16_ON ? rms_inv_block_order(x, dim, eps) : rms_inv(x, dim, eps);
    if (w)
        for (int i = 0; i < dim; i++) out[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < dim; i++) out[i] = x[i] * r;
}
