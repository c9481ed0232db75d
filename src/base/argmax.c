#include "base/argmax.h"

#include <math.h>

#include "base/vmath.h"

/* Two passes instead of one: the maximum (a lane-wise running "strictly
 * larger" max, so NaNs never enter it), then the first index holding a
 * value equal to it. The scalar pass's loop-carried compare-and-branch on
 * the best index is what made greedy decoding's argmax over a 150k (or
 * even 8k) vocabulary cost as much as a small matmul. */
int64_t ds_argmax_f32(const float *x, int64_t n) {
    if (n <= 0 || isnan(x[0])) return 0;
    float m = x[0];
    int64_t i = 0;
    if (n >= 8) {
        ds_v8f acc = ds_v8f_set1(m); /* not x[0..7]: a NaN lane would stick */
        for (; i + 8 <= n; i += 8) {
            const ds_v8f v = *(const ds_v8f *)(x + i);
            acc = ds_v8f_select(v > acc, v, acc);
        }
        for (int l = 0; l < 8; l++)
            if (acc[l] > m) m = acc[l];
    }
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    /* m is x[0] or a non-NaN value that some x[j] equals; the first such j
     * is the scalar pass's answer (values equal as floats, +0 and -0
     * included, tie). */
    for (i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}
