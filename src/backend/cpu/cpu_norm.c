/* RMSNorm of one row in fp32 (the reference normalizes in fp32 too). */
#include <math.h>

#include "backend/cpu/cpu_kernels.h"

void ds_cpu_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps) {
    float ss = 0;
    for (int i = 0; i < dim; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    if (w)
        for (int i = 0; i < dim; i++) out[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < dim; i++) out[i] = x[i] * r;
}
