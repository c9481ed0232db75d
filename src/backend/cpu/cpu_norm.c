/* RMSNorm of one row in fp32 (the reference normalizes in fp32 too). */
#include <math.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/vmath.h"

void ds_cpu_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps) {
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
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    if (w)
        for (i = 0; i < dim; i++) out[i] = x[i] * r * w[i];
    else
        for (i = 0; i < dim; i++) out[i] = x[i] * r;
}
