/* Attention over a KV cache on the CPU: one (query row, head) pair per
 * task, scores and softmax in fp32, keys visited in position order so the
 * result for a row never depends on the other rows of the call. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p) {
    const int64_t M = q.rows;
    const int H = p->n_heads, group = p->n_heads / p->n_kv_heads, D = p->head_dim, Dv = p->v_head_dim;
#pragma omp parallel num_threads(be->n_threads)
    {
        float *scores = malloc((size_t)(p->n_keys > 0 ? p->n_keys : 1) * sizeof *scores);
#pragma omp for schedule(static) collapse(2)
        for (int64_t m = 0; m < M; m++) {
            for (int h = 0; h < H; h++) {
                const float *qv = (const float *)q.data + m * q.stride + (int64_t)h * D;
                float *o = (float *)out.data + m * out.stride + (int64_t)h * Dv;
                const int kvh = h / group;
                int64_t lo = 0, hi = p->n_keys; /* keys [lo, hi) */
                if (p->causal) {
                    if (p->q_pos[m] + 1 < hi) hi = p->q_pos[m] + 1;
                    if (p->window > 0 && p->q_pos[m] - p->window + 1 > lo) lo = p->q_pos[m] - p->window + 1;
                }
                for (int d = 0; d < Dv; d++) o[d] = 0;
                if (hi <= lo) continue;
                float mx = -FLT_MAX;
                for (int64_t j = lo; j < hi; j++) {
                    int64_t row = p->ring_size > 0 ? j % p->ring_size : j;
                    const float *kv = (const float *)k.data + row * k.stride + (int64_t)kvh * D;
                    float s = 0;
                    for (int d = 0; d < D; d++) s += qv[d] * kv[d];
                    s *= p->scale;
                    scores[j - lo] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0;
                for (int64_t j = lo; j < hi; j++) {
                    float e = expf(scores[j - lo] - mx);
                    scores[j - lo] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int64_t j = lo; j < hi; j++) {
                    int64_t row = p->ring_size > 0 ? j % p->ring_size : j;
                    const float *vv = (const float *)v.data + row * v.stride + (int64_t)kvh * Dv;
                    float w = scores[j - lo] * inv;
                    for (int d = 0; d < Dv; d++) o[d] += w * vv[d];
                }
            }
        }
        free(scores);
    }
}
