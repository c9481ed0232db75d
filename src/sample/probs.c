/* softmax(logits / T) in fp32, then the truncation (top_kp.c). */
#include "sample/probs.h"

#include "base/argmax.h"
#include "base/vmath.h"
#include "sample/top_kp.h"

#include <math.h>

int32_t ds_argmax(const float *x, int n) { return (int32_t)ds_argmax_f32(x, n); }

void ds_probs_from_logits(const float *logits, int V, const ds_sampling *s, float *probs) {
    if (ds_sampling_greedy(s)) {
        for (int i = 0; i < V; i++) probs[i] = 0;
        probs[ds_argmax(logits, V)] = 1.0f;
        return;
    }
    /* softmax(logits / T) in fp32, as the reference; max and exp 8 lanes at
     * a time (a scalar expf per vocabulary entry made this cost as much as
     * a forward pass on small models), the sum one left-to-right chain. */
    const float T = s->temperature;
    ds_v8f vmx = ds_v8f_set1(-INFINITY);
    int i = 0;
    for (; i + 8 <= V; i += 8) {
        const ds_v8f v = *(const ds_v8f *)(logits + i) / ds_v8f_set1(T);
        vmx = ds_v8f_select(v > vmx, v, vmx); /* a NaN never wins, as with fmaxf */
    }
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++) mx = fmaxf(mx, vmx[l]);
    for (; i < V; i++) mx = fmaxf(mx, logits[i] / T);
    for (i = 0; i + 8 <= V; i += 8)
        *(ds_v8f *)(probs + i) = ds_v8f_exp(*(const ds_v8f *)(logits + i) / ds_v8f_set1(T) - ds_v8f_set1(mx));
    for (; i < V; i++) probs[i] = ds_v8f_exp(ds_v8f_set1(logits[i] / T - mx))[0];
    double sum = 0;
    for (i = 0; i < V; i++) sum += probs[i];
    for (int i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
    ds_top_kp(probs, V, s);
}
